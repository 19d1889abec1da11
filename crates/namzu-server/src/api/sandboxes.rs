//! Sandboxes: create, list, get, extend, destroy; and the expiry reaper.

use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use namzu::egress::{EgressConfig, EgressPolicy, HostRule};
use namzu::{Resources, SandboxSpec, Tier};

use super::model::{CreateSandbox, ListQuery, NetworkBody, SandboxPage, SandboxView, SetTimeout};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::metrics::DestroyLabels;
use crate::registry::{now_ms, Record};
use crate::state::{check_id, AppState, Json, Owner};

impl From<&Record> for SandboxView {
    fn from(r: &Record) -> Self {
        Self {
            id: r.id.clone(),
            tier: r.tier.name().into(),
            runtime: r.runtime.clone(),
            image: r.image.clone(),
            metadata: r.metadata.clone(),
            created_at_ms: r.created_at_ms,
            expires_at_ms: r.expires_at_ms,
            state: r.state.clone(),
            pause_on_timeout: r.pause_on_timeout,
            suspend_on_timeout: r.suspend_on_timeout,
        }
    }
}

/// The library's egress policy for a [`NetworkBody`].
pub fn policy_of(n: &NetworkBody) -> ApiResult<EgressPolicy> {
    let refuse = |what: &str| {
        ApiError::invalid(
            "network",
            format!(
                "{what} applies only to mode {}",
                match what {
                    "allow" => "allowlist",
                    _ => "public-internet",
                }
            ),
        )
    };
    if !n.allow.is_empty() && n.mode != "allowlist" {
        return Err(refuse("allow"));
    }
    if !n.except_cidrs.is_empty() && n.mode != "public-internet" {
        return Err(refuse("except_cidrs"));
    }
    let p = match n.mode.as_str() {
        "none" => EgressPolicy::NoNetwork,
        "deny-all" => EgressPolicy::DenyAll,
        "allow-all" => EgressPolicy::AllowAll,
        "allowlist" => EgressPolicy::Allowlist {
            hosts: n
                .allow
                .iter()
                .map(|r| HostRule::parse(&r.host, r.ports.clone()))
                .collect::<Result<_, _>>()
                .map_err(namzu::Error::from)?,
        },
        "public-internet" => EgressPolicy::PublicInternet {
            except_cidrs: namzu::egress::policy::parse_cidrs(&n.except_cidrs).map_err(namzu::Error::from)?,
        },
        other => {
            return Err(ApiError::invalid(
                "network.mode",
                format!("unknown mode {other:?}: none, deny-all, allow-all, allowlist or public-internet"),
            ))
        }
    };
    Ok(p)
}

/// The [`NetworkBody`] of a library policy.
pub fn body_of(p: &EgressPolicy) -> NetworkBody {
    let mut b = NetworkBody {
        mode: match p {
            EgressPolicy::NoNetwork => "none",
            other => other.kind(),
        }
        .into(),
        allow: Vec::new(),
        except_cidrs: Vec::new(),
    };
    match p {
        EgressPolicy::Allowlist { hosts } => {
            b.allow = hosts
                .iter()
                .map(|h| super::model::AllowRule {
                    host: match &h.host {
                        namzu::egress::HostPattern::Exact(s) => s.clone(),
                        namzu::egress::HostPattern::Domain(d) => format!(".{d}"),
                    },
                    ports: h.ports.as_ref().map(|ps| ps.iter().map(|p| u32::from(*p)).collect()),
                })
                .collect()
        }
        EgressPolicy::PublicInternet { except_cidrs } => {
            b.except_cidrs = except_cidrs.iter().map(|c| c.to_string()).collect()
        }
        _ => {}
    }
    b
}

pub(super) fn timeout_of(state: &AppState, secs: Option<u64>) -> ApiResult<Duration> {
    let limits = &state.config.limits;
    let Some(s) = secs else {
        return Ok(limits.default_timeout);
    };
    if s == 0 || s > limits.max_timeout.as_secs() {
        return Err(ApiError::invalid(
            "timeout_s",
            format!(
                "timeout_s must be 1..={} (the server's max_timeout)",
                limits.max_timeout.as_secs()
            ),
        ));
    }
    Ok(Duration::from_secs(s))
}

/// Create a sandbox.
#[utoipa::path(post, operation_id = "createSandbox", path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, body = SandboxView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 422, description = "an option the tier cannot honour, an unknown image or tier", body = ErrorBody),
              (status = 429, description = "max_sandboxes_per_key", body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Json(req): Json<CreateSandbox>,
) -> ApiResult<impl IntoResponse> {
    let tier = match &req.tier {
        None => st.config.tiers[0],
        Some(t) => t
            .parse::<Tier>()
            .map_err(|e| ApiError::invalid("tier", e.to_string()))?,
    };
    if !st.config.tiers.contains(&tier) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "tier_unavailable",
            format!(
                "this server does not serve tier {tier} (it serves {:?})",
                st.config.tiers.iter().map(|t| t.name()).collect::<Vec<_>>()
            ),
        )
        .field("tier"));
    }
    if req.runtime.is_some() && tier != Tier::Docker {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "option_refused",
            format!("runtime applies to tier docker, not {tier}"),
        )
        .field("runtime"));
    }
    let timeout = timeout_of(&st, req.timeout_s)?;
    let (pause_on_timeout, suspend_on_timeout) = match req.on_timeout.as_deref() {
        None | Some("destroy") => (false, false),
        Some("pause") => (true, false),
        Some("suspend") => (false, true),
        Some(other) => {
            return Err(ApiError::invalid(
                "on_timeout",
                format!("on_timeout must be \"destroy\", \"pause\" or \"suspend\", not {other:?}"),
            ))
        }
    };
    let mut egress = EgressConfig::default();
    if let Some(n) = &req.network {
        egress.policy = policy_of(n)?;
    }
    let spec = SandboxSpec {
        image: req.image.clone(),
        resources: Resources {
            memory_bytes: req.resources.memory_bytes,
            cpus: req.resources.cpus,
            pids: req.resources.pids,
            disk_bytes: req.resources.disk_bytes,
        },
        env: req.env.clone().into_iter().collect(),
        egress,
        ..Default::default()
    };
    let pending = st.registry.reserve(&owner, st.config.limits.max_sandboxes_per_key)?;
    let now = now_ms();
    let record = Record {
        id: String::new(),
        tier,
        runtime: req.runtime.clone(),
        image: req.image.clone(),
        owner,
        metadata: req.metadata.clone(),
        created_at_ms: now,
        expires_at_ms: now + timeout.as_millis() as u64,
        pause_on_timeout,
        suspend_on_timeout,
        auto_resume: false,
        timeout_ms: timeout.as_millis() as u64,
        state: "running".into(),
        template: None,
        envd_token: None,
    };
    let r = st.create_counted(pending, spec, record).await?;
    tracing::info!(id = %r.id, tier = %tier, owner = %r.owner, "sandbox created");
    Ok((StatusCode::CREATED, axum::Json(SandboxView::from(&r))))
}

/// List the caller's sandboxes, sorted by id, paged; every
/// `metadata.KEY=VALUE` query parameter filters on a label.
#[utoipa::path(get, operation_id = "listSandboxes", path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, body = SandboxPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Owner(owner): Owner,
    RawQuery(raw): RawQuery,
) -> ApiResult<axum::Json<SandboxPage>> {
    let pairs = crate::urlenc::pairs(raw.as_deref().unwrap_or(""))
        .ok_or_else(|| ApiError::invalid("query", "bad percent-encoding in the query"))?;
    let mut q = ListQuery::default();
    let mut labels = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => {
                q.limit = Some(
                    v.parse()
                        .map_err(|_| ApiError::invalid("limit", "limit is a positive integer"))?,
                )
            }
            "cursor" => q.cursor = Some(v),
            _ => match k.strip_prefix("metadata.") {
                Some(label) if !label.is_empty() => labels.push((label.to_string(), v)),
                _ => return Err(ApiError::invalid(&k, format!("unknown query parameter {k:?}"))),
            },
        }
    }
    let max = st.config.limits.max_page_size;
    let limit = q.limit.unwrap_or(max);
    if limit == 0 || limit > max {
        return Err(ApiError::invalid(
            "limit",
            format!("limit must be 1..={max} (max_page_size)"),
        ));
    }
    let (page, more) = st.registry.list(&owner, &labels, q.cursor.as_deref(), limit)?;
    let next_cursor = if more { page.last().map(|r| r.id.clone()) } else { None };
    Ok(axum::Json(SandboxPage {
        sandboxes: page.iter().map(SandboxView::from).collect(),
        next_cursor,
    }))
}

/// One of the caller's sandboxes.
#[utoipa::path(get, operation_id = "getSandbox", path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 200, body = SandboxView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<SandboxView>> {
    check_id("id", &id)?;
    Ok(axum::Json(SandboxView::from(&st.registry.get(&owner, &id)?)))
}

/// Set the sandbox's expiry to `timeout_s` from now.
#[utoipa::path(post, operation_id = "setSandboxTimeout", path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes", params(("id" = String, Path)), request_body = SetTimeout,
    responses((status = 200, body = SandboxView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn extend(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(req): Json<SetTimeout>,
) -> ApiResult<axum::Json<SandboxView>> {
    check_id("id", &id)?;
    let t = timeout_of(&st, Some(req.timeout_s))?;
    Ok(axum::Json(SandboxView::from(&st.registry.extend(&owner, &id, t)?)))
}

/// Destroy the sandbox: every process in it is killed and its state removed.
#[utoipa::path(delete, operation_id = "destroySandbox", path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn destroy(State(st): State<AppState>, Owner(owner): Owner, Path(id): Path<String>) -> ApiResult<StatusCode> {
    check_id("id", &id)?;
    let rec = st.registry.get(&owner, &id)?;
    st.registry.destroy(&rec).await?;
    count_destroy(&st, &rec, "request");
    tracing::info!(id = %id, owner = %rec.owner, "sandbox destroyed");
    Ok(StatusCode::NO_CONTENT)
}

fn count_destroy(st: &AppState, rec: &Record, reason: &str) {
    st.metrics
        .destroys
        .get_or_create(&DestroyLabels {
            tier: rec.tier.name().into(),
            reason: reason.into(),
        })
        .inc();
}

/// Destroys every sandbox past its expiry — or pauses it, when it was made
/// to pause on timeout — once a second, until shutdown; a paused one does
/// not expire (as on E2B), until it is resumed.
pub async fn reap(st: AppState) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = st.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = now_ms();
        let due = st
            .registry
            .all()
            .into_iter()
            .filter(|r| r.expires_at_ms <= now && r.state != "paused" && r.state != "suspended");
        for rec in due {
            if rec.pause_on_timeout && pause_at_timeout(&st, &rec).await {
                continue;
            }
            if rec.suspend_on_timeout {
                match st.registry.suspend(&rec.owner, &rec.id).await {
                    Ok(_) => {
                        tracing::info!(id = %rec.id, owner = %rec.owner, "sandbox reached its timeout; suspended");
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(id = %rec.id, "suspend at timeout failed, destroying instead: {}", e.message)
                    }
                }
            }
            match st.registry.destroy(&rec).await {
                Ok(()) => {
                    count_destroy(&st, &rec, "timeout");
                    tracing::info!(id = %rec.id, owner = %rec.owner, "sandbox reached its timeout; destroyed");
                }
                Err(e) => tracing::warn!(id = %rec.id, "destroy at timeout failed: {e}"),
            }
        }
    }
}

/// Pauses `rec`'s sandbox at its timeout; false (after saying why) when it
/// could not be paused, and the reaper destroys it instead: a timeout is a
/// bound on what a sandbox holds either way.
async fn pause_at_timeout(st: &AppState, rec: &Record) -> bool {
    let paused = match st.registry.sandbox(&rec.owner, &rec.id).await {
        Ok((_, sb)) => sb.pause().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.message),
    };
    match paused {
        Ok(_) => {
            st.registry.set_state(&rec.id, "paused");
            tracing::info!(id = %rec.id, owner = %rec.owner, "sandbox reached its timeout; paused");
            true
        }
        Err(e) => {
            tracing::warn!(id = %rec.id, "pause at timeout failed, destroying instead: {e}");
            false
        }
    }
}
