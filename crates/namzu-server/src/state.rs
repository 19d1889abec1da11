//! [`AppState`]: what every handler shares (configuration, registry,
//! metrics, per-key stream slots), and the extractors that read the
//! caller's key ([`Owner`]) and decode bodies and queries into the API's
//! error format ([`Json`], [`Query`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::keys::ANONYMOUS;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

/// See [`AppState`].
pub struct Inner {
    /// How the server was started.
    pub config: ServerConfig,
    /// The sandboxes.
    pub registry: Registry,
    /// What `/metrics` shows.
    pub metrics: Metrics,
    streams: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// E2B processes this server started.
    pub e2b: crate::e2b::shared::Procs,
    /// E2B polling watchers (CreateWatcher).
    pub e2b_watchers: crate::e2b::shared::Watchers,
    /// Cancelled on shutdown: open streams end.
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// State for `config`, with its registry opened.
    pub fn new(config: ServerConfig) -> std::io::Result<Self> {
        let registry = Registry::open(config.state_dir.clone())?.with_warm_pool(config.limits.warm_pool);
        Ok(Self(Arc::new(Inner {
            config,
            registry,
            metrics: Metrics::default(),
            streams: Mutex::default(),
            e2b: Default::default(),
            e2b_watchers: Default::default(),
            shutdown: tokio_util::sync::CancellationToken::new(),
        })))
    }

    /// Creates through the registry and counts it by tier: a success and
    /// its latency, or a failure.
    pub async fn create_counted(
        &self,
        pending: crate::registry::Pending<'_>,
        spec: namzu::SandboxSpec,
        record: crate::registry::Record,
    ) -> Result<crate::registry::Record, ApiError> {
        let label = crate::metrics::TierLabel {
            tier: record.tier.name().into(),
        };
        let started = std::time::Instant::now();
        let r = self.registry.create(pending, spec, record).await;
        match &r {
            Ok(_) => {
                self.metrics.creates.get_or_create(&label).inc();
                self.metrics
                    .create_seconds
                    .get_or_create(&label)
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(_) => {
                self.metrics.create_failures.get_or_create(&label).inc();
            }
        }
        r
    }

    /// The live handle of the sandbox an envd call is for (its token
    /// already checked), on behalf of the sandbox's owner.
    pub async fn envd_sandbox(&self, t: &crate::e2b::shared::EnvdTarget) -> Result<namzu::Sandbox, ApiError> {
        Ok(self.registry.sandbox(&t.0.owner, &t.0.id).await?.1)
    }

    /// One of `owner`'s `max_streams_per_key` slots, held for a stream's
    /// life; 429 when all are taken.
    pub fn stream_slot(&self, owner: &str) -> Result<OwnedSemaphorePermit, ApiError> {
        let limit = self.config.limits.max_streams_per_key;
        let sem = {
            let mut map = self
                .streams
                .lock()
                .map_err(|_| ApiError::internal("stream slots poisoned"))?;
            map.entry(owner.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(limit)))
                .clone()
        };
        sem.try_acquire_owned()
            .map_err(|_| ApiError::limit(StatusCode::TOO_MANY_REQUESTS, "max_streams_per_key", limit as u64))
    }
}

/// The key name a request acts as (see [`crate::keys`]). Without
/// configured keys every request is [`ANONYMOUS`].
#[derive(Debug, Clone)]
pub struct Owner(pub String);

#[axum::async_trait]
impl FromRequestParts<AppState> for Owner {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let keys = &state.config.keys;
        if keys.is_empty() {
            return Ok(Owner(ANONYMOUS.into()));
        }
        let presented = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m).field("authorization");
        let key = presented.ok_or_else(|| unauthorized("an API key is required: Authorization: Bearer KEY"))?;
        keys.owner_of(key.trim())
            .map(|o| Owner(o.to_string()))
            .ok_or_else(|| unauthorized("the API key is not valid"))
    }
}

/// A JSON body whose rejections are API errors: malformed JSON is 400
/// `malformed_json`, a field of the wrong type or an unknown field 400
/// `invalid_argument` naming it, a missing content type 415, and a body
/// over `max_body_bytes` 413.
pub struct Json<T>(pub T);

#[axum::async_trait]
impl<T, S> FromRequest<S> for Json<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        use axum::extract::rejection::JsonRejection as R;
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(R::JsonSyntaxError(e)) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not JSON: {}", inner_message(&e)),
            )),
            Err(R::JsonDataError(e)) => Err(data_error(&e)),
            Err(R::MissingJsonContentType(_)) => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send Content-Type: application/json",
            )),
            Err(R::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "limit_exceeded",
                "the body is larger than max_body_bytes",
            )
            .field("max_body_bytes")),
            Err(e) => Err(ApiError::new(e.status(), "bad_request", e.body_text())),
        }
    }
}

/// A query string whose rejections are 400 `invalid_argument`.
pub struct Query<T>(pub T);

#[axum::async_trait]
impl<T, S> FromRequestParts<S> for Query<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(data_error(&e)),
        }
    }
}

/// 400 `invalid_argument` for a value serde refused, naming its field.
fn data_error(e: &(dyn std::error::Error + 'static)) -> ApiError {
    let m = inner_message(e);
    let err = ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", m.clone());
    match named_field(&m) {
        Some(f) => err.field(f),
        None => err,
    }
}

/// The deepest message of an error chain.
fn inner_message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

/// The field a serde message names: "unknown field `x`", "missing field
/// `x`", or a path prefix "x: invalid type".
fn named_field(m: &str) -> Option<String> {
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = m.split(marker).nth(1) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    None
}

/// A sandbox or execution id from the path: 1-128 of `[A-Za-z0-9._-]`, not
/// starting with a dot. Anything else is 400 `invalid_argument`, before
/// any lookup.
pub fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(field, format!("{field} {id:?} is not a valid id")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_before_lookup() {
        for good in ["a", "sb-0123", "x.y_z"] {
            assert!(check_id("id", good).is_ok(), "{good}");
        }
        for bad in ["", "..", ".hidden", "a/b", "a b", "é", &"x".repeat(129)] {
            let e = check_id("id", bad).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, "invalid_argument"),
                "{bad}"
            );
        }
    }

    #[test]
    fn serde_messages_name_their_field() {
        assert_eq!(
            named_field("unknown field `colour`, expected one of `tier`").as_deref(),
            Some("colour")
        );
        assert_eq!(named_field("missing field `path`").as_deref(), Some("path"));
        assert_eq!(named_field("expected a string"), None);
    }
}
