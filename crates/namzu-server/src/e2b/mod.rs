//! The E2B-compatible API: the wire the E2B SDKs speak, served on the same
//! listener as namzu's own, so E2B code moves to namzu by setting
//! `E2B_API_URL`, `E2B_SANDBOX_URL` (both to this server) and
//! `E2B_API_KEY` (a namzu key).
//!
//! * [`control`]: the control plane (`/v2/sandboxes`, `/sandboxes/{id}`).
//! * envd, reached with the headers `E2b-Sandbox-Id` and `E2b-Sandbox-Port`
//!   (49983): [`process`] (`process.Process`), [`filesystem`]
//!   (`filesystem.Filesystem`, `/files`), `/health`; over the Connect
//!   protocol's JSON codec ([`connect`]). Every envd call must carry the
//!   sandbox's access token (`X-Access-Token`), issued at create.
//!
//! Everything maps onto the handle API: an E2B process is a detachable
//! execution, so it outlives the SDK's stream and the server.

pub mod connect;
pub mod control;
pub mod filesystem;
pub mod process;
pub mod proxy;
pub mod pty;
pub mod shared;
pub mod signed;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use subtle::ConstantTimeEq;
use tower::ServiceExt;

use crate::state::AppState;
use connect::ConnectError;
pub use shared::{new_token, EnvdTarget, Proc, Procs, ENVD_PORT, ENVD_VERSION};

/// Routes E2B envd traffic (it names its sandbox in `E2b-Sandbox-Id`) to
/// the envd router; everything else goes on to namzu's own routes and the
/// control plane.
pub async fn dispatch(
    axum::extract::State(st): axum::extract::State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/files" && !req.headers().contains_key("e2b-sandbox-id") {
        if let Some(q) = req
            .uri()
            .query()
            .filter(|q| q.contains("signature="))
            .map(str::to_string)
        {
            return match signed::target(&st, req.method(), &q) {
                Ok(rec) => {
                    req.extensions_mut().insert(EnvdTarget(rec));
                    match envd_router(st).oneshot(req).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    }
                }
                Err(e) => e.into_response(),
            };
        }
    }
    // The sandbox and port, from E2B's headers or from a `PORT-ID.domain`
    // host name (E2B's URLs without E2B_SANDBOX_URL).
    let named = req
        .headers()
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(|id| {
            let port = req
                .headers()
                .get("e2b-sandbox-port")
                .and_then(|v| v.to_str().ok())
                .unwrap_or(ENVD_PORT);
            (id.to_string(), port.to_string())
        })
        .or_else(|| {
            let host = req.headers().get(http::header::HOST)?.to_str().ok()?;
            let first = host.split('.').next()?;
            let (port, id) = first.split_once('-')?;
            (host.contains('.') && port.parse::<u16>().is_ok() && id.starts_with("sb-"))
                .then(|| (id.to_string(), port.to_string()))
        });
    let Some((id, port)) = named else {
        return next.run(req).await;
    };
    let rec = match st.registry.get_any(&id) {
        Some(r) if crate::state::check_id("id", &id).is_ok() => r,
        // What E2B's edge answers for a sandbox that is not running: 502,
        // which the SDK reads as "not running" (`is_running()` is false).
        _ => {
            return control::E2bError(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} was not found or is not running"),
            )
            .into_response()
        }
    };
    // Ports take the traffic token header too (E2B's name for it); both
    // carry the sandbox's one token.
    let token = req
        .headers()
        .get("x-access-token")
        .or_else(|| req.headers().get("e2b-traffic-access-token"))
        .map(|v| v.as_bytes().to_vec());
    let ok = match (&rec.envd_token, token) {
        (Some(want), Some(got)) => bool::from(want.as_bytes().ct_eq(&got)),
        // A sandbox made through namzu's own API has no envd token: only
        // its owner's key opens it.
        (None, _) => {
            let (mut parts, body) = req.into_parts();
            let owner =
                <crate::state::Owner as axum::extract::FromRequestParts<AppState>>::from_request_parts(&mut parts, &st)
                    .await;
            req = Request::from_parts(parts, body);
            owner.is_ok_and(|o| o.0 == rec.owner)
        }
        _ => false,
    };
    if !ok {
        let refused =
            ConnectError::new("unauthenticated", "missing or wrong X-Access-Token for this sandbox").into_response();
        return after_body(&st, req, refused).await;
    }
    // A paused sandbox is resumed by this request when it was made to be
    // (E2B's autoResume); otherwise it answers as E2B's edge does for a
    // sandbox that is not running.
    let rec = match rec.state.as_str() {
        "paused" | "suspended" if rec.auto_resume => match control::auto_resume(&st, &rec).await {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        },
        "paused" | "suspended" => {
            return control::E2bError(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} is paused; connect to resume it"),
            )
            .into_response()
        }
        _ => rec,
    };
    if port != ENVD_PORT {
        return match port.parse::<u16>() {
            Ok(p) if p > 0 => proxy::forward(st, rec, p, req).await,
            _ => control::E2bError(
                StatusCode::BAD_REQUEST,
                format!("E2b-Sandbox-Port {port:?} is not a port"),
            )
            .into_response(),
        };
    }
    if let Some(user) = envd_user(&req).filter(|u| !KNOWN_USERS.contains(&u.as_str())) {
        let refused = ConnectError::new(
            "invalid_argument",
            format!("user {user:?}: namzu runs every command as the sandbox's one identity; only \"user\" and \"root\" name it"),
        )
        .into_response();
        return after_body(&st, req, refused).await;
    }
    req.extensions_mut().insert(EnvdTarget(rec));
    match envd_router(st).oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// Answers a refusal only after reading what is left of the request's body
/// (up to the body limit): a client still writing it would otherwise meet
/// a closed connection (EPIPE) instead of the answer, and an SDK reports
/// that as the server being unavailable.
async fn after_body(st: &AppState, req: Request, refused: Response) -> Response {
    let limit = st.config.limits.max_body_bytes;
    let _ = axum::body::to_bytes(req.into_body(), limit).await;
    refused
}

/// The user names E2B's SDKs send; both stand for the sandbox's one
/// identity (uid 0 in its namespace, no capabilities).
const KNOWN_USERS: [&str; 3] = ["", "user", "root"];

/// The OS user an envd call asks for: `Authorization: Basic
/// base64("<user>:")`, or `username=` on `/files`.
fn envd_user(req: &Request) -> Option<String> {
    use base64::Engine;
    let from_header = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
        .map(|s| s.split(':').next().unwrap_or_default().to_string());
    let from_query = req
        .uri()
        .query()
        .and_then(crate::urlenc::pairs)
        .and_then(|ps| ps.into_iter().find(|(k, _)| k == "username").map(|(_, v)| v));
    from_query.or(from_header)
}

fn envd_router(st: AppState) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        // Uploads are bounded by max_upload_bytes while streaming, not by
        // the JSON body limit (multipart goes through axum's extractor).
        .route(
            "/files",
            get(filesystem::download)
                .post(filesystem::upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/process.Process/StreamInput", post(process::stream_input))
        .route("/process.Process/:method", post(process::call))
        .route("/filesystem.Filesystem/:method", post(filesystem::call))
        .fallback(any(|| async {
            ConnectError::new("unimplemented", "no such envd route")
        }))
        .with_state(st)
}

/// The control-plane routes, merged into the server's router.
pub fn control_routes() -> Router<AppState> {
    Router::new()
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes/:id", get(control::get).delete(control::kill))
        .route("/sandboxes/:id/timeout", post(control::set_timeout))
        .route("/v2/sandboxes/:id/connect", post(control::connect))
        .route("/sandboxes/:id/connect", post(control::connect))
        .route("/sandboxes/:id/pause", post(control::pause))
        .route("/sandboxes/:id/resume", post(control::resume))
}
