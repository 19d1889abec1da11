//! The HTTP API: its routes under `/v1`, the OpenAPI document generated
//! from them ([`ApiDoc`], served at `/v1/openapi.json` and committed as
//! `crates/namzu-server/openapi.json`), `/metrics`, and the middleware
//! that counts every request by route and status.

pub mod commands;
pub mod files;
pub mod live;
pub mod model;
pub mod sandboxes;
pub mod snapshots;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::error::{ApiError, ErrorBody};
use crate::metrics::RouteStatus;
use crate::state::AppState;

/// The OpenAPI 3.1 document of the API.
#[derive(OpenApi)]
#[openapi(
    info(title = "namzu", description = "Sandboxes for AI agents: create one, run commands in it, move files, open terminals and TCP connections, change its egress live, destroy it.", license(name = "Apache-2.0")),
    paths(
        health,
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::extend, sandboxes::destroy,
        commands::start, commands::run, commands::attach, commands::list, commands::cancel,
        files::download, files::upload, files::list, files::walk, files::watch, files::stat, files::mkdir, files::remove, files::rename,
        live::terminal, live::port_forward, live::network, live::set_network, live::quiesce, live::flush, live::pause, live::resume, live::suspend,
        snapshots::create, snapshots::list, snapshots::fork, snapshots::delete,
    ),
    components(schemas(ErrorBody, model::TerminalControl)),
    modifiers(&Security),
    security(("bearer" = []), ("api_key" = [])),
    tags(
        (name = "sandboxes", description = "Make, find, extend and destroy sandboxes"),
        (name = "commands", description = "Run commands; streams carry offsets to re-attach from"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "live", description = "Terminals, TCP, egress policy, quiesce, flush, pause, suspend and resume"),
        (name = "snapshots", description = "Snapshots of running sandboxes (microvm), and sandboxes forked from them"),
        (name = "server", description = "The server itself"),
    )
)]
pub struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// The document as served and committed (pretty JSON, newline-terminated).
pub fn openapi_json() -> String {
    let mut s = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}

/// The server's health and the tiers it serves; needs no key.
#[utoipa::path(get, operation_id = "health", path = "/v1/health", tag = "server", security(()), responses((status = 200, body = model::Health)))]
pub async fn health(State(st): State<AppState>) -> axum::Json<model::Health> {
    axum::Json(model::Health {
        status: "ok".into(),
        tiers: st.config.tiers.iter().map(|t| t.name().to_string()).collect(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn openapi() -> impl IntoResponse {
    ([(http::header::CONTENT_TYPE, "application/json")], openapi_json())
}

async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    let mut counts = std::collections::HashMap::<(String, String), i64>::new();
    let mut egress = namzu::egress::Decisions::default();
    for r in st.registry.all() {
        *counts.entry((r.tier.name().to_string(), r.state.clone())).or_default() += 1;
        if r.state == "running" {
            if let Some(d) = decisions_of(&st, &r).await {
                egress.allowed += d.allowed;
                egress.refused += d.refused;
                egress.resolved += d.resolved;
                egress.failed += d.failed;
            }
        }
    }
    for (verdict, n) in [
        ("allowed", egress.allowed),
        ("refused", egress.refused),
        ("resolved", egress.resolved),
        ("failed", egress.failed),
    ] {
        st.metrics
            .egress
            .get_or_create(&crate::metrics::Verdict {
                verdict: verdict.into(),
            })
            .set(n);
    }
    st.metrics.sandboxes.clear();
    for ((tier, state), n) in counts {
        st.metrics
            .sandboxes
            .get_or_create(&crate::metrics::TierState { tier, state })
            .set(n);
    }
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.encode(),
    )
}

/// A live sandbox's egress decisions, from its tier's egress boundary;
/// `None` where it has none or does not answer within a second.
async fn decisions_of(st: &AppState, r: &crate::registry::Record) -> Option<namzu::egress::Decisions> {
    if !matches!(r.tier, namzu::Tier::Local | namzu::Tier::Docker) {
        return None;
    }
    let ask = async {
        let (_, sb) = st.registry.sandbox(&r.owner, &r.id).await.ok()?;
        sb.network().decisions().await.ok()
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
}

async fn count_requests(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| {
            m.as_str()
                .replace(":id", "{id}")
                .replace(":execution_id", "{execution_id}")
                .replace(":port", "{port}")
        })
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let route = match (route.as_str(), req.headers().get("e2b-sandbox-id")) {
        // envd calls are routed by header: name them by their (bounded) path;
        // a port's traffic by nothing but that.
        ("unmatched", Some(_)) => {
            let port = req.headers().get("e2b-sandbox-port").and_then(|v| v.to_str().ok());
            let path = req.uri().path();
            let known = ["/process.Process/", "/filesystem.Filesystem/"]
                .iter()
                .any(|p| path.starts_with(p))
                || path == "/files"
                || path == "/health";
            match port {
                Some(p) if p != crate::e2b::ENVD_PORT => "e2b-port".to_string(),
                _ if known && path.len() < 64 => format!("e2b-envd {path}"),
                _ => "e2b-envd other".to_string(),
            }
        }
        _ => route,
    };
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    st.metrics
        .http_seconds
        .get_or_create(&crate::metrics::Route { route: route.clone() })
        .observe(started.elapsed().as_secs_f64());
    st.metrics
        .http
        .get_or_create(&RouteStatus {
            route,
            method,
            status: resp.status().as_u16().to_string(),
        })
        .inc();
    resp
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route")
}

async fn method_not_allowed(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        return ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
        .into_response();
    }
    resp
}

/// Every route, with the state, body limit and request counting.
pub fn router(st: AppState) -> Router {
    let sb = "/v1/sandboxes/:id";
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(sb, get(sandboxes::get).delete(sandboxes::destroy))
        .route(&format!("{sb}/timeout"), post(sandboxes::extend))
        .route(&format!("{sb}/commands"), post(commands::start).get(commands::list))
        .route(&format!("{sb}/commands/run"), post(commands::run))
        .route(&format!("{sb}/commands/:execution_id/events"), get(commands::attach))
        .route(&format!("{sb}/commands/:execution_id/cancel"), post(commands::cancel))
        .route(&format!("{sb}/files/content"), get(files::download).put(files::upload))
        .route(&format!("{sb}/files"), axum::routing::delete(files::remove))
        .route(&format!("{sb}/files/list"), get(files::list))
        .route(&format!("{sb}/files/walk"), get(files::walk))
        .route(&format!("{sb}/files/watch"), get(files::watch))
        .route(&format!("{sb}/files/stat"), get(files::stat))
        .route(&format!("{sb}/files/mkdir"), post(files::mkdir))
        .route(&format!("{sb}/files/rename"), post(files::rename))
        .route(&format!("{sb}/terminal"), get(live::terminal))
        .route(&format!("{sb}/ports/:port"), get(live::port_forward))
        .route(&format!("{sb}/network"), get(live::network).put(live::set_network))
        .route(&format!("{sb}/quiesce"), post(live::quiesce))
        .route(&format!("{sb}/flush"), post(live::flush))
        .route(&format!("{sb}/pause"), post(live::pause))
        .route(&format!("{sb}/resume"), post(live::resume))
        .route(&format!("{sb}/suspend"), post(live::suspend))
        .route(&format!("{sb}/snapshot"), post(snapshots::create))
        .route("/v1/snapshots", get(snapshots::list))
        .route("/v1/snapshots/:snapshot", axum::routing::delete(snapshots::delete))
        .route("/v1/snapshots/:snapshot/fork", post(snapshots::fork))
        .merge(crate::e2b::control_routes())
        .fallback(not_found)
        .layer(axum::middleware::from_fn(method_not_allowed))
        .layer(DefaultBodyLimit::max(st.config.limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(st.clone(), crate::e2b::dispatch))
        .layer(axum::middleware::from_fn_with_state(st.clone(), count_requests))
        .with_state(st)
}

#[cfg(test)]
mod tests {
    /// The committed document is the generated one: the server's code and
    /// the contract clients are built from cannot drift apart. Regenerate
    /// with `NAMZU_WRITE_OPENAPI=1 cargo test -p namzu-server openapi`.
    #[test]
    fn committed_openapi_matches_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        let generated = super::openapi_json();
        if std::env::var_os("NAMZU_WRITE_OPENAPI").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "crates/namzu-server/openapi.json differs from the code's document; regenerate it with NAMZU_WRITE_OPENAPI=1 cargo test -p namzu-server openapi"
        );
        let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
        assert!(
            doc["openapi"].as_str().unwrap().starts_with("3.1"),
            "{}",
            doc["openapi"]
        );
        for p in [
            "/v1/sandboxes",
            "/v1/sandboxes/{id}/commands",
            "/v1/sandboxes/{id}/files/content",
            "/v1/sandboxes/{id}/terminal",
        ] {
            assert!(doc["paths"].get(p).is_some(), "{p} missing");
        }
    }
}
