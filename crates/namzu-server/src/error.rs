//! [`ApiError`]: every failure the API answers with, as a status and the
//! JSON body `{"code", "message", "field"?}`. The mapping from the
//! library's [`namzu::Error`] lives here and nowhere else, so one library
//! failure always gets the same status and code.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Stable, machine-readable: what a caller branches on
    /// (`not_found`, `limit_exceeded`, `path_escape`, …).
    pub code: String,
    /// For a person.
    pub message: String,
    /// The request field, query parameter or limit the error is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// A failure answered to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// See [`ErrorBody::code`].
    pub code: &'static str,
    /// See [`ErrorBody::message`].
    pub message: String,
    /// See [`ErrorBody::field`].
    pub field: Option<String>,
}

/// Handlers' result.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with no field.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    /// Names the field, parameter or limit the error is about.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 400 `invalid_argument` about `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_argument", message).field(field)
    }

    /// 404 for a sandbox that does not exist or belongs to another key;
    /// the two are never told apart.
    pub fn no_sandbox(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "sandbox_not_found", format!("no sandbox {id}"))
    }

    /// 429 or 413 naming the limit reached.
    pub fn limit(status: StatusCode, limit: &str, value: u64) -> Self {
        Self::new(
            status,
            "limit_exceeded",
            format!("the server's limit {limit} = {value} was reached"),
        )
        .field(limit)
    }

    /// 500 for what the caller cannot act on; the detail goes to the log.
    pub fn internal(message: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %message, "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message.to_string())
    }

    /// The response body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code.into(),
            message: self.message.clone(),
            field: self.field.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<namzu::Error> for ApiError {
    fn from(e: namzu::Error) -> Self {
        library_error(&e)
    }
}

/// The status and code of a library failure. The message is the error's
/// whole chain, so a tier's own cause reaches the caller.
pub fn library_error(e: &namzu::Error) -> ApiError {
    use namzu::Error as E;
    use StatusCode as S;
    let mut message = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    let (status, code, field): (S, &'static str, Option<String>) = match e {
        E::NotFound { .. } => (S::NOT_FOUND, "file_not_found", Some("path".into())),
        E::AlreadyExists { .. } => (S::CONFLICT, "already_exists", Some("path".into())),
        E::PermissionDenied { .. } => (S::FORBIDDEN, "permission_denied", Some("path".into())),
        E::PathEscape { .. } => (S::BAD_REQUEST, "path_escape", Some("path".into())),
        E::NotADirectory { .. } => (S::CONFLICT, "not_a_directory", Some("path".into())),
        E::IsADirectory { .. } => (S::CONFLICT, "is_a_directory", Some("path".into())),
        E::NotRegularFile { .. } => (S::CONFLICT, "not_a_regular_file", Some("path".into())),
        E::DirectoryNotEmpty { .. } => (S::CONFLICT, "directory_not_empty", Some("path".into())),
        E::WalkLimit { .. } => (S::UNPROCESSABLE_ENTITY, "walk_limit", Some("max_entries".into())),
        E::LimitExceeded { limit, .. } => (S::PAYLOAD_TOO_LARGE, "limit_exceeded", Some(limit.clone())),
        E::InvalidArgument { .. } => (S::BAD_REQUEST, "invalid_argument", None),
        E::SpawnFailed { .. } => (S::UNPROCESSABLE_ENTITY, "spawn_failed", Some("command".into())),
        E::UnknownExecution { .. } => (S::NOT_FOUND, "execution_not_found", Some("execution_id".into())),
        E::ExecutionNotAttachable { .. } => (S::CONFLICT, "execution_not_attachable", Some("execution_id".into())),
        E::ExecutionCancelUnconfirmed { .. } => (S::SERVICE_UNAVAILABLE, "cancel_unconfirmed", None),
        E::RemoteCancellationUnknown { .. } | E::AgentRetiring { .. } => (S::CONFLICT, "sandbox_retiring", None),
        E::SessionNotFound { .. } => (S::NOT_FOUND, "session_not_found", None),
        E::SessionExists { .. } => (S::CONFLICT, "already_exists", Some("execution_id".into())),
        E::Timeout { .. } => (S::GATEWAY_TIMEOUT, "timeout", None),
        E::ConnectionRefused { .. } => (S::BAD_GATEWAY, "connection_refused", Some("port".into())),
        E::Unsupported { .. } => (S::NOT_IMPLEMENTED, "unsupported", None),
        E::EgressPolicy(_) => (S::BAD_REQUEST, "invalid_policy", Some("network".into())),
        // The library's `egress` is the API's `network`.
        E::OptionRefused { option, .. } if option == "egress" => {
            (S::UNPROCESSABLE_ENTITY, "option_refused", Some("network".into()))
        }
        E::OptionRefused { option, .. } => (S::UNPROCESSABLE_ENTITY, "option_refused", Some(option.clone())),
        E::ConfigConflict { option, .. } => (S::UNPROCESSABLE_ENTITY, "option_refused", Some(option.clone())),
        E::ImageNotFound { .. } | E::NotAnImage { .. } => {
            (S::UNPROCESSABLE_ENTITY, "image_not_found", Some("image".into()))
        }
        E::ImageNotInRegistry { .. } => (S::UNPROCESSABLE_ENTITY, "image_not_found", Some("image".into())),
        E::ImagePlatformMissing { .. } => (S::UNPROCESSABLE_ENTITY, "image_platform_missing", Some("image".into())),
        E::RegistryAuthRefused { .. } => (S::UNPROCESSABLE_ENTITY, "registry_auth_refused", Some("image".into())),
        E::RegistryUnreachable { .. } | E::ImagePullInterrupted { .. } => {
            (S::BAD_GATEWAY, "registry_unreachable", Some("image".into()))
        }
        E::RegistryProtocol { .. } | E::ImageBlobCorrupt { .. } => {
            (S::BAD_GATEWAY, "registry_error", Some("image".into()))
        }
        E::ImageInUse { .. } => (S::CONFLICT, "image_in_use", Some("image".into())),
        E::TierUnavailable { .. } => (S::UNPROCESSABLE_ENTITY, "tier_unavailable", Some("tier".into())),
        E::SandboxDestroyed { .. } | E::SandboxNotFound { .. } | E::SandboxGone { .. } => {
            (S::NOT_FOUND, "sandbox_not_found", None)
        }
        E::SandboxDead { .. } => (S::GONE, "sandbox_dead", None),
        E::SandboxPaused { .. } => (S::CONFLICT, "sandbox_paused", None),
        E::PauseIncomplete { .. } => (S::CONFLICT, "pause_incomplete", None),
        E::SandboxSuspended { .. } => (S::CONFLICT, "sandbox_suspended", None),
        E::NotSuspended { .. } => (S::CONFLICT, "not_suspended", None),
        E::SnapshotNotFound { .. } => (S::NOT_FOUND, "snapshot_not_found", None),
        E::SnapshotInUse { .. } => (S::CONFLICT, "snapshot_in_use", None),
        _ => (S::BAD_GATEWAY, "sandbox_error", None),
    };
    let err = ApiError::new(status, code, message);
    match field {
        Some(f) => err.field(f),
        None => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_keep_their_cause_and_field() {
        let e = namzu::Error::PathEscape {
            op: "read".into(),
            path: "../etc/passwd".into(),
        };
        let a = ApiError::from(e);
        assert_eq!(
            (a.status, a.code, a.field.as_deref()),
            (StatusCode::BAD_REQUEST, "path_escape", Some("path"))
        );
        let e = namzu::Error::OptionRefused {
            tier: namzu::Tier::Host,
            option: "network".into(),
            reason: "no boundary".into(),
        };
        let a = ApiError::from(e);
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(a.field.as_deref(), Some("network"));
        assert!(a.message.contains("no boundary"), "{}", a.message);
    }
}
