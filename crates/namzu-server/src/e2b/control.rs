//! The E2B control plane the SDK calls (`/v2/sandboxes`, `/sandboxes/{id}`,
//! and the older `POST /sandboxes`), on namzu's registry: the same keys
//! (`X-API-KEY`), the same per-key ownership, the same reaper for
//! `timeout`. Bodies and status codes are E2B's: errors are
//! `{"code": <int>, "message"}` and every success code is the exact one
//! the SDK's generated parsers accept.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use namzu::egress::{EgressConfig, EgressPolicy};
use namzu::SandboxSpec;
use serde::Deserialize;

use super::shared::{new_token, ENVD_VERSION};
use crate::error::ApiError;
use crate::registry::{now_ms, Record};
use crate::state::{check_id, AppState, Owner};

/// An E2B control-plane error: `{"code": <status>, "message"}`.
#[derive(Debug)]
pub struct E2bError(pub StatusCode, pub String);

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.0.as_u16(), "message": self.1});
        (self.0, axum::Json(body)).into_response()
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        Self(e.status, e.message)
    }
}

impl From<namzu::Error> for E2bError {
    fn from(e: namzu::Error) -> Self {
        ApiError::from(e).into()
    }
}

type E2bResult<T> = Result<T, E2bError>;

fn owner(o: Result<Owner, ApiError>) -> E2bResult<String> {
    o.map(|o| o.0).map_err(E2bError::from)
}

/// `POST /v2/sandboxes` and `POST /sandboxes`. Unknown fields are kept
/// out of serde's way so that newer SDKs still parse; the ones namzu cannot
/// honour are refused by name.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    #[serde(default)]
    auto_pause: bool,
    auto_pause_memory: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    volume_mounts: Vec<serde_json::Value>,
    mcp: Option<serde_json::Value>,
    network: Option<serde_json::Value>,
    auto_resume: Option<serde_json::Value>,
    iam: Option<serde_json::Value>,
}

fn iso(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// ISO-8601 of Unix seconds.
pub(crate) fn iso_secs(secs: u64) -> String {
    iso(secs * 1000)
}

fn sandbox_json(r: &Record) -> serde_json::Value {
    serde_json::json!({
        "templateID": r.template.clone().unwrap_or_else(|| "base".into()),
        "sandboxID": r.id,
        "clientID": "namzu",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": r.envd_token,
        "trafficAccessToken": r.envd_token,
    })
}

fn detail_json(r: &Record) -> serde_json::Value {
    let mut v = sandbox_json(r);
    let extra = serde_json::json!({
        "startedAt": iso(r.created_at_ms),
        "endAt": iso(r.expires_at_ms),
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": if asleep(r) { "paused" } else { "running" },
        "metadata": r.metadata,
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

/// Create a sandbox from a template (201 + Sandbox).
pub async fn create(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let owner = owner(o)?;
    let req: NewSandbox = serde_json::from_slice(&body)
        .map_err(|e| E2bError(StatusCode::BAD_REQUEST, format!("bad request body: {e}")))?;
    let refuse = |what: &str, why: &str| {
        E2bError(
            StatusCode::BAD_REQUEST,
            format!("{what} is not supported by namzu: {why}"),
        )
    };
    if !req.volume_mounts.is_empty() {
        return Err(refuse("volumeMounts", "volumes are not built yet"));
    }
    if req.mcp.is_some() {
        return Err(refuse("mcp", "no MCP gateway"));
    }
    if req.auto_pause_memory == Some(false) {
        return Err(refuse(
            "autoPauseMemory: false",
            "a pause keeps every process in memory; there is no filesystem-only pause",
        ));
    }
    let auto_resume = req
        .auto_resume
        .as_ref()
        .and_then(|v| v.get("enabled"))
        .and_then(|e| e.as_bool())
        == Some(true);
    if auto_resume && !req.auto_pause {
        return Err(E2bError(
            StatusCode::BAD_REQUEST,
            "autoResume resumes a sandbox its timeout paused: it needs autoPause".into(),
        ));
    }
    if req.iam.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(refuse("iam", "namzu issues no cloud identities"));
    }
    if req.network.is_some() {
        return Err(refuse(
            "network",
            "use namzu's PUT /v1/sandboxes/{id}/network for egress rules",
        ));
    }
    let template = st.config.e2b_templates.get(&req.template_id).cloned().ok_or_else(|| {
        E2bError(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown template {:?}; this server maps: {}",
                req.template_id,
                st.config.e2b_templates.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let limits = &st.config.limits;
    let timeout = Duration::from_secs(req.timeout.unwrap_or(300));
    if timeout.is_zero() || timeout > limits.max_timeout {
        return Err(E2bError(
            StatusCode::BAD_REQUEST,
            format!("timeout must be 1..={} seconds", limits.max_timeout.as_secs()),
        ));
    }
    // namzu's default is no network; E2B's SDK asks for the internet by
    // sending allow_internet_access, and gets public addresses only.
    let mut egress = EgressConfig::default();
    if req.allow_internet_access == Some(true) {
        egress.policy = EgressPolicy::PublicInternet {
            except_cidrs: Vec::new(),
        };
    }
    let spec = SandboxSpec {
        image: template.image.clone(),
        env: req.env_vars.clone().into_iter().collect(),
        egress,
        ..Default::default()
    };
    let pending = st.registry.reserve(&owner, limits.max_sandboxes_per_key)?;
    let now = now_ms();
    let record = Record {
        id: String::new(),
        tier: template.tier,
        runtime: template.runtime.clone(),
        image: template.image.clone(),
        owner,
        metadata: req.metadata.clone(),
        created_at_ms: now,
        expires_at_ms: now + timeout.as_millis() as u64,
        pause_on_timeout: req.auto_pause,
        suspend_on_timeout: false,
        auto_resume,
        timeout_ms: timeout.as_millis() as u64,
        state: "running".into(),
        template: Some(req.template_id.clone()),
        envd_token: Some(new_token()),
    };
    let r = st.create_counted(pending, spec, record).await?;
    Ok((StatusCode::CREATED, axum::Json(sandbox_json(&r))).into_response())
}

/// `GET /sandboxes/{id}` (200 + SandboxDetail).
pub async fn get(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let owner = owner(o)?;
    check_id("id", &id)?;
    Ok(axum::Json(detail_json(&st.registry.get(&owner, &id)?)).into_response())
}

/// `DELETE /sandboxes/{id}` (204).
pub async fn kill(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let owner = owner(o)?;
    check_id("id", &id)?;
    let rec = st.registry.get(&owner, &id)?;
    st.registry.destroy(&rec).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `{"timeout": seconds}`; a resume's and a connect's may also name
/// `autoPause` and `memory`.
#[derive(Debug, Deserialize)]
pub struct Timeout {
    timeout: Option<u64>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
    memory: Option<bool>,
}

impl Timeout {
    /// A resume's or a connect's body, which may be empty (no timeout
    /// named).
    fn optional(body: &[u8]) -> E2bResult<Self> {
        if body.is_empty() {
            return Ok(Self {
                timeout: None,
                auto_pause: None,
                memory: None,
            });
        }
        Self::parse(body)
    }

    /// The body; what namzu cannot honour is refused by name: `autoPause`
    /// (set at create), `memory: false` (a filesystem-only snapshot).
    fn parse(body: &[u8]) -> E2bResult<Self> {
        let t: Self = serde_json::from_slice(body).map_err(|e| E2bError(StatusCode::BAD_REQUEST, e.to_string()))?;
        let refuse = |what: &str, why: &str| {
            E2bError(
                StatusCode::BAD_REQUEST,
                format!("{what} is not supported by namzu: {why}"),
            )
        };
        if t.auto_pause.is_some() {
            return Err(refuse("autoPause on resume", "it is set when the sandbox is created"));
        }
        if t.memory == Some(false) {
            return Err(refuse(
                "memory: false",
                "a pause keeps every process in memory; there is no filesystem-only snapshot",
            ));
        }
        Ok(t)
    }
}

fn extend(st: &AppState, owner: &str, id: &str, secs: Option<u64>) -> E2bResult<Record> {
    check_id("id", id)?;
    let secs = secs.unwrap_or(300);
    if secs == 0 || secs > st.config.limits.max_timeout.as_secs() {
        return Err(E2bError(
            StatusCode::BAD_REQUEST,
            format!("timeout must be 1..={}", st.config.limits.max_timeout.as_secs()),
        ));
    }
    Ok(st.registry.extend(owner, id, Duration::from_secs(secs))?)
}

/// `POST /sandboxes/{id}/timeout` (204).
pub async fn set_timeout(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<StatusCode> {
    let owner = owner(o)?;
    let t = Timeout::parse(&body)?;
    extend(&st, &owner, &id, t.timeout)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v2/sandboxes/{id}/connect` (200 + Sandbox): the sandbox —
/// resumed if it was paused — its timeout moved to `timeout` from now.
pub async fn connect(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let owner = owner(o)?;
    let t = Timeout::optional(&body)?;
    // A sandbox this server paused is resumed first, as E2B's connect does.
    wake(&st, &owner, &id).await?;
    let r = extend(&st, &owner, &id, t.timeout)?;
    Ok(axum::Json(sandbox_json(&r)).into_response())
}

/// Resumes the paused sandbox of `rec` for a request that reached it
/// (autoResume), its timeout set again to the one it was made with.
pub(super) async fn auto_resume(st: &AppState, rec: &Record) -> E2bResult<Record> {
    wake(st, &rec.owner, &rec.id).await?;
    let timeout = rec.timeout(st.config.limits.default_timeout);
    tracing::info!(id = %rec.id, "a request resumed the paused sandbox (autoResume)");
    Ok(st.registry.extend(&rec.owner, &rec.id, timeout)?)
}

/// Paused or suspended through this server: what E2B calls `paused`.
fn asleep(r: &Record) -> bool {
    r.state == "paused" || r.state == "suspended"
}

/// Resumes `owner`'s sandbox `id` if this server paused or suspended it;
/// its record.
async fn wake(st: &AppState, owner: &str, id: &str) -> E2bResult<Record> {
    check_id("id", id)?;
    let rec = st.registry.get(owner, id)?;
    match rec.state.as_str() {
        "paused" => {
            st.registry.resume_paused(owner, id).await?;
        }
        "suspended" => {
            st.registry.resume_suspended(owner, id).await?;
        }
        _ => return Ok(rec),
    }
    Ok(st.registry.get(owner, id)?)
}

/// `GET /v2/sandboxes` query.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /v2/sandboxes` (200 + list; `x-next-token` pages).
pub async fn list(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Query(q): Query<ListQuery>,
) -> E2bResult<Response> {
    let owner = owner(o)?;
    let states: Option<Vec<&str>> = q.state.as_deref().map(|s| s.split(',').collect());
    let labels = match &q.metadata {
        None => Vec::new(),
        Some(m) => crate::urlenc::pairs(m)
            .ok_or_else(|| E2bError(StatusCode::BAD_REQUEST, "metadata: bad percent-encoding".into()))?,
    };
    let max = st.config.limits.max_page_size;
    let limit = q.limit.unwrap_or(100).clamp(1, max);
    let (mut page, more) = st.registry.list(&owner, &labels, q.next_token.as_deref(), limit)?;
    if let Some(states) = &states {
        let shown = |r: &Record| states.contains(&if asleep(r) { "paused" } else { "running" });
        page.retain(shown);
    }
    let mut headers = HeaderMap::new();
    if more {
        if let Some(last) = page.last().and_then(|r| HeaderValue::from_str(&r.id).ok()) {
            headers.insert("x-next-token", last);
        }
    }
    let body: Vec<serde_json::Value> = page.iter().map(detail_json).collect();
    Ok((headers, axum::Json(body)).into_response())
}

/// `POST /sandboxes/{id}/pause` (204; 409 when paused already): every
/// process in the sandbox stopped in place, its timeout stopped with it.
pub async fn pause(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let owner = owner(o)?;
    check_id("id", &id)?;
    if asleep(&st.registry.get(&owner, &id)?) {
        return Err(E2bError(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    sb.pause().await.map_err(ApiError::from)?;
    st.registry.set_state(&id, "paused");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (older SDKs; 201 + Sandbox; 409 when it
/// is not paused): resumed where it was, its timeout set from now.
pub async fn resume(
    State(st): State<AppState>,
    o: Result<Owner, ApiError>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let owner = owner(o)?;
    let t = Timeout::optional(&body)?;
    if !asleep(&st.registry.get(&owner, &id)?) {
        return Err(E2bError(StatusCode::CONFLICT, format!("sandbox {id} is not paused")));
    }
    wake(&st, &owner, &id).await?;
    let r = extend(&st, &owner, &id, t.timeout)?;
    Ok((StatusCode::CREATED, axum::Json(sandbox_json(&r))).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn iso_dates() {
        assert_eq!(super::iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::iso(1_796_071_792_740), "2026-11-30T20:49:52.740Z");
        assert_eq!(super::iso(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
