//! The errors of the host library. Every failure a caller may act on is a
//! variant carrying what it needs (operation, path, id, limit); the free-form
//! `message` fields are for humans only.

use std::path::PathBuf;

use namzu_proto::preface::PrefaceError;
use namzu_proto::v1::agent_error::Kind;

use crate::spec::Tier;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- paths and files
    #[error("{op}: {}: no such file or directory", path.display())]
    NotFound { op: String, path: PathBuf },
    #[error("{op}: {}: already exists", path.display())]
    AlreadyExists { op: String, path: PathBuf },
    #[error("{op}: {}: permission denied", path.display())]
    PermissionDenied { op: String, path: PathBuf },
    #[error("{op}: {}: path escapes the sandbox", path.display())]
    PathEscape { op: String, path: PathBuf },
    #[error("{op}: {}: not a directory", path.display())]
    NotADirectory { op: String, path: PathBuf },
    #[error("{op}: {}: is a directory", path.display())]
    IsADirectory { op: String, path: PathBuf },
    #[error("{op}: {}: not a regular file", path.display())]
    NotRegularFile { op: String, path: PathBuf },
    #[error("{op}: {}: directory not empty", path.display())]
    DirectoryNotEmpty { op: String, path: PathBuf },
    #[error("walk of {}: more than {limit} entries", root.display())]
    WalkLimit { root: PathBuf, limit: u64 },
    #[error("{op}: {}: i/o error (errno {errno}): {message}", path.display())]
    Io {
        op: String,
        path: PathBuf,
        errno: i32,
        message: String,
    },

    // ---- limits and arguments
    #[error("{op}: exceeds the limit {limit} = {value}")]
    LimitExceeded {
        op: String,
        limit: String,
        value: u64,
        path: Option<PathBuf>,
    },
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument { op: String, message: String },

    // ---- executions
    #[error("cannot start {}: {message} (errno {errno})", command.display())]
    SpawnFailed {
        command: PathBuf,
        errno: i32,
        message: String,
    },
    #[error("cancellation of execution {execution_id} could not be confirmed; the sandbox is retired and the command must not be retried automatically")]
    RemoteCancellationUnknown { execution_id: String },
    #[error("{op}: the agent is retiring after an unconfirmed kill and serves nothing but health")]
    AgentRetiring { op: String },
    #[error("{op}: unknown execution {execution_id}")]
    UnknownExecution { op: String, execution_id: String },
    #[error("lost the link to execution {execution_id} and could not get back within the reattach window; it may still run: attach again from offset {offset}")]
    ExecutionLinkLost { execution_id: String, offset: u64 },
    #[error("execution {execution_id} cannot be attached: {reason}")]
    ExecutionNotAttachable {
        execution_id: String,
        /// `Reserved` when the command never started (nothing runs).
        state: AttachRefusal,
        reason: String,
    },
    #[error("cancellation of execution {execution_id} could not be confirmed; nothing was retired, it may still run and the cancel may be retried")]
    ExecutionCancelUnconfirmed { execution_id: String },

    // ---- sessions
    #[error("no session {id:?}")]
    SessionNotFound { id: String },
    #[error("a session {id:?} exists already")]
    SessionExists { id: String },
    #[error("another attachment took terminal {session_id:?} over (this one had read to offset {offset})")]
    AttachmentReplaced { session_id: String, offset: u64 },
    #[error("detached from terminal {session_id:?} while it still runs; attach again from offset {offset}")]
    TerminalLinkLost { session_id: String, offset: u64 },

    // ---- quiesce and flush
    #[error("process {pid} survived SIGKILL during quiesce")]
    QuiesceSurvivor { pid: u32 },
    #[error("{op} did not finish within {limit_ms} ms")]
    Timeout { op: String, limit_ms: u64 },

    // ---- network
    #[error("nothing listens on port {port} inside the sandbox")]
    ConnectionRefused { port: u16 },

    // ---- capabilities
    #[error("{op}: the agent does not offer feature {feature:?}")]
    Unsupported { op: String, feature: String },
    #[error(transparent)]
    EgressPolicy(#[from] crate::egress::PolicyError),
    #[error("sandbox {id}: its egress supervisor is unavailable: {reason}")]
    EgressUnavailable { id: String, reason: String },
    #[error("tier {tier} cannot honour option {option}: {reason}")]
    OptionRefused { tier: Tier, option: String, reason: String },
    #[error("{}: not an image: {reason}", path.display())]
    NotAnImage { path: PathBuf, reason: String },
    /// An entry of an image layer would have reached outside the rootfs
    /// (or could not be placed beneath it safely); nothing was published.
    #[error("{}: layer {layer}: {reason} (entry {entry:?})", path.display())]
    ImageEntryRefused {
        path: PathBuf,
        layer: String,
        entry: String,
        reason: crate::image::Refusal,
    },
    #[error("no image {reference:?} (import it with `namzu image import FILE`)")]
    ImageNotFound { reference: String },
    #[error("tier {tier} is not available: {reason}")]
    TierUnavailable { tier: Tier, reason: String },
    #[error("tier {tier}: option {option} cannot be combined with {conflicts_with}: {reason}")]
    ConfigConflict {
        tier: Tier,
        option: String,
        conflicts_with: String,
        reason: String,
    },
    // ---- sandboxes and links
    #[error("sandbox {id} has been destroyed")]
    SandboxDestroyed { id: String },
    #[error("no sandbox with id {id}")]
    SandboxNotFound { id: String },
    #[error("sandbox {id} is not running (its agent is gone)")]
    SandboxDead { id: String },
    /// A tier's own failure, typed by that tier: match it with
    /// [`Error::tier_error`] (e.g. `namzu::kubernetes::KubernetesError`,
    /// `namzu::backend::docker::DockerError`).
    #[error("{tier} tier")]
    Tier {
        tier: Tier,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("sandbox {id} is gone: its lease found the object deleted or expired")]
    SandboxGone { id: String },
    #[error("cannot find the namzu-agent binary; looked in: {searched:?} (set NAMZU_AGENT_BIN)")]
    AgentBinaryNotFound { searched: Vec<PathBuf> },
    #[error("sandbox {id} refused: its commands are not unprivileged ({field} is {value:?})")]
    PrivilegeProbe { id: String, field: String, value: String },
    #[error("agent of sandbox {id} did not come up: {reason}")]
    AgentStart { id: String, reason: String },
    #[error("cannot connect to {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("link to {endpoint} refused during the preface")]
    Preface {
        endpoint: String,
        #[source]
        source: PrefaceError,
    },
    #[error("agent speaks protocol {agent}, this host speaks {host}")]
    ProtocolVersion { agent: u32, host: u32 },
    #[error("{op}: the link to the agent failed: {message}")]
    LinkLost { op: String, message: String },
    #[error("{op}: the agent broke the protocol: {message}")]
    Protocol { op: String, message: String },
    #[error("{op}: the agent is shutting down")]
    ShuttingDown { op: String },
    #[error("{op}: local i/o")]
    LocalIo {
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state of sandbox {id} is unreadable: {message}")]
    State { id: String, message: String },
}

/// The bound of a message refused for its size (tonic's codec answers
/// `OutOfRange`, "decoded message length too large: found N bytes, the
/// limit is: M bytes", on whichever side refused it): M.
fn message_limit(status: &tonic::Status) -> Option<u64> {
    if status.code() != tonic::Code::OutOfRange || !status.message().contains("message length too large") {
        return None;
    }
    let tail = status.message().rsplit("limit is:").next()?;
    tail.split_whitespace().next()?.parse().ok()
}

impl Error {
    /// Wraps a tier's own typed error.
    pub fn tier(tier: Tier, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Tier {
            tier,
            source: Box::new(source),
        }
    }

    /// The tier's own error of type `E`, if this is one.
    pub fn tier_error<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Tier { source, .. } => source.downcast_ref::<E>(),
            _ => None,
        }
    }

    /// The tier's own error of type `E`, by value; `Err(self)` if this is
    /// not one.
    pub fn into_tier_error<E: std::error::Error + 'static>(self) -> std::result::Result<E, Self> {
        match self {
            Self::Tier { tier, source } => match source.downcast::<E>() {
                Ok(e) => Ok(*e),
                Err(source) => Err(Self::Tier { tier, source }),
            },
            other => Err(other),
        }
    }

    /// Rebuilds the typed error of `op` from an agent status.
    pub(crate) fn from_status(op: &str, status: tonic::Status) -> Self {
        let Some(e) = namzu_proto::error_from_status(&status) else {
            if let Some(limit) = message_limit(&status) {
                return Error::LimitExceeded {
                    op: op.into(),
                    limit: "max_message_bytes".into(),
                    value: limit,
                    path: None,
                };
            }
            return match status.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal => {
                    Error::LinkLost {
                        op: op.into(),
                        message: status.message().into(),
                    }
                }
                _ => Error::Protocol {
                    op: op.into(),
                    message: format!("{:?}: {}", status.code(), status.message()),
                },
            };
        };
        let op = if e.op.is_empty() { op.to_owned() } else { e.op.clone() };
        let path = bytes_path(&e.path);
        match e.kind() {
            Kind::NotFound if !e.execution_id.is_empty() => Error::SessionNotFound { id: e.execution_id },
            Kind::AlreadyExists if !e.execution_id.is_empty() => Error::SessionExists { id: e.execution_id },
            Kind::NotFound => Error::NotFound { op, path },
            Kind::AlreadyExists => Error::AlreadyExists { op, path },
            Kind::PermissionDenied => Error::PermissionDenied { op, path },
            Kind::PathEscape => Error::PathEscape { op, path },
            Kind::NotADirectory => Error::NotADirectory { op, path },
            Kind::IsADirectory => Error::IsADirectory { op, path },
            Kind::NotRegularFile => Error::NotRegularFile { op, path },
            Kind::DirectoryNotEmpty => Error::DirectoryNotEmpty { op, path },
            Kind::WalkLimit => Error::WalkLimit {
                root: path,
                limit: e.limit,
            },
            Kind::LimitExceeded => Error::LimitExceeded {
                op,
                limit: e.limit_name,
                value: e.limit,
                path: (!e.path.is_empty()).then_some(path),
            },
            Kind::InvalidArgument => Error::InvalidArgument { op, message: e.message },
            Kind::SpawnFailed => Error::SpawnFailed {
                command: path,
                errno: e.errno,
                message: e.message,
            },
            Kind::Retiring if !e.execution_id.is_empty() => Error::RemoteCancellationUnknown {
                execution_id: e.execution_id,
            },
            Kind::Retiring => Error::AgentRetiring { op },
            Kind::UnknownExec => Error::UnknownExecution {
                op,
                execution_id: e.execution_id,
            },
            Kind::ShuttingDown => Error::ShuttingDown { op },
            Kind::Io => Error::Io {
                op,
                path,
                errno: e.errno,
                message: e.message,
            },
            Kind::FeatureDisabled => Error::Unsupported { op, feature: e.feature },
            Kind::Survivor => Error::QuiesceSurvivor { pid: e.pid },
            Kind::AttachReplaced => Error::AttachmentReplaced {
                session_id: e.execution_id,
                offset: e.limit,
            },
            Kind::Timeout => Error::Timeout { op, limit_ms: e.limit },
            Kind::ConnectionRefused => Error::ConnectionRefused {
                port: u16::try_from(e.port).unwrap_or(0),
            },
            Kind::NotAttachable => Error::ExecutionNotAttachable {
                execution_id: e.execution_id,
                state: if e.exec_state == "reserved" {
                    AttachRefusal::Reserved
                } else {
                    AttachRefusal::NotDetachable
                },
                reason: e.message,
            },
            Kind::ExecState | Kind::Protocol | Kind::Unspecified => Error::Protocol { op, message: e.message },
        }
    }
}

/// Why an execution could not be attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachRefusal {
    /// Reserved, never started: nothing runs under this id.
    Reserved,
    /// It runs, but was not started detachable, so nothing retains its output.
    NotDetachable,
    /// The agent holds no record: never started, past retention, or the
    /// agent restarted.
    Unknown,
}

pub(crate) fn bytes_path(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}
