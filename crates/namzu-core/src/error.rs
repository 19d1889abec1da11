//! The errors of the host library. Every failure a caller may act on is a
//! variant carrying what it needs (operation, path, id, limit); the free-form
//! `message` fields are for humans only.

use std::path::PathBuf;

use namzu_proto::preface::PrefaceError;
use namzu_proto::v1::agent_error::Kind;

use crate::spec::Tier;

/// A result whose error is namzu's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the host library. Match on the variant; the
/// `message`/`reason` strings are for humans. A tier's own failures are
/// [`Error::Tier`], typed by that tier.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- paths and files
    /// No such file or directory.
    #[error("{op}: {}: no such file or directory", path.display())]
    NotFound {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Already exists.
    #[error("{op}: {}: already exists", path.display())]
    AlreadyExists {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Permission denied.
    #[error("{op}: {}: permission denied", path.display())]
    PermissionDenied {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Path escapes the sandbox.
    #[error("{op}: {}: path escapes the sandbox", path.display())]
    PathEscape {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Not a directory.
    #[error("{op}: {}: not a directory", path.display())]
    NotADirectory {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Is a directory.
    #[error("{op}: {}: is a directory", path.display())]
    IsADirectory {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Not a regular file.
    #[error("{op}: {}: not a regular file", path.display())]
    NotRegularFile {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// Directory not empty.
    #[error("{op}: {}: directory not empty", path.display())]
    DirectoryNotEmpty {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
    },
    /// A walk found more entries than its budget allowed.
    #[error("walk of {}: more than {limit} entries", root.display())]
    WalkLimit {
        /// The walk root.
        root: PathBuf,
        /// The limit in force.
        limit: u64,
    },
    /// An i/o error inside the sandbox, with its errno.
    #[error("{op}: {}: i/o error (errno {errno}): {message}", path.display())]
    Io {
        /// The operation that failed.
        op: String,
        /// The path as the caller gave it.
        path: PathBuf,
        /// The errno the agent saw.
        errno: i32,
        /// What went wrong, for humans.
        message: String,
    },

    // ---- limits and arguments
    /// A named agent limit was exceeded.
    #[error("{op}: exceeds the limit {limit} = {value}")]
    LimitExceeded {
        /// The operation that failed.
        op: String,
        /// The limit in force.
        limit: String,
        /// The value that exceeded it.
        value: u64,
        /// The path as the caller gave it.
        path: Option<PathBuf>,
    },
    /// An argument was refused before anything ran.
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument {
        /// The operation that failed.
        op: String,
        /// What went wrong, for humans.
        message: String,
    },

    // ---- executions
    /// The command could not be started (no such program, not executable …).
    #[error("cannot start {}: {message} (errno {errno})", command.display())]
    SpawnFailed {
        /// The program run.
        command: PathBuf,
        /// The errno the agent saw.
        errno: i32,
        /// What went wrong, for humans.
        message: String,
    },
    /// A kill could not be confirmed: the sandbox is retired and the command
    /// must not be retried automatically.
    #[error("cancellation of execution {execution_id} could not be confirmed; the sandbox is retired{}, and the command must not be retried automatically",
        retirement.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    RemoteCancellationUnknown {
        /// The execution's id.
        execution_id: String,
        /// What the tier did with the retired sandbox, where it did more
        /// than fence its agent (the kubernetes tier releases its claim).
        retirement: Option<String>,
    },
    /// The agent is retiring after an unconfirmed kill and serves nothing but health.
    #[error("{op}: the agent is retiring after an unconfirmed kill and serves nothing but health")]
    AgentRetiring {
        /// The operation that failed.
        op: String,
    },
    /// No execution with this id.
    #[error("{op}: unknown execution {execution_id}")]
    UnknownExecution {
        /// The operation that failed.
        op: String,
        /// The execution's id.
        execution_id: String,
    },
    /// The link to a detachable execution was lost past the reattach window;
    /// it may still run: attach again from `offset`.
    #[error("lost the link to execution {execution_id} and could not get back within the reattach window; it may still run: attach again from offset {offset}")]
    ExecutionLinkLost {
        /// The execution's id.
        execution_id: String,
        /// The log offset to resume from.
        offset: u64,
    },
    /// The execution cannot be attached (see `state`).
    #[error("execution {execution_id} cannot be attached: {reason}")]
    ExecutionNotAttachable {
        /// The execution's id.
        execution_id: String,
        /// `Reserved` when the command never started (nothing runs).
        state: AttachRefusal,
        /// Why, for humans.
        reason: String,
    },
    /// A detachable execution's kill could not be confirmed; nothing was
    /// retired, and the cancel may be retried.
    #[error("cancellation of execution {execution_id} could not be confirmed; nothing was retired, it may still run and the cancel may be retried")]
    ExecutionCancelUnconfirmed {
        /// The execution's id.
        execution_id: String,
    },

    // ---- sessions
    /// No session with this id.
    #[error("no session {id:?}")]
    SessionNotFound {
        /// The session's id.
        id: String,
    },
    /// A session with this id exists already.
    #[error("a session {id:?} exists already")]
    SessionExists {
        /// The session's id.
        id: String,
    },
    /// Another attachment took the terminal over.
    #[error("another attachment took terminal {session_id:?} over (this one had read to offset {offset})")]
    AttachmentReplaced {
        /// The session's id.
        session_id: String,
        /// How far this attachment had read.
        offset: u64,
    },
    /// The link to a persistent terminal was lost while it runs: attach again
    /// from `offset`.
    #[error("detached from terminal {session_id:?} while it still runs; attach again from offset {offset}")]
    TerminalLinkLost {
        /// The session's id.
        session_id: String,
        /// The log offset to resume from.
        offset: u64,
    },

    // ---- pause
    /// The sandbox is paused: nothing starts in it (commands, terminals,
    /// sessions, TCP connections) until it is resumed.
    #[error("{op}: the sandbox is paused; nothing starts in it until it is resumed")]
    SandboxPaused {
        /// The operation refused.
        op: String,
    },
    /// A pause could not stop every process (one would not stop, or the
    /// tree kept forking); what it had stopped runs again.
    #[error("pause: process {pid}: {message}; nothing was left paused")]
    PauseIncomplete {
        /// The process it could not stop, inside the sandbox.
        pid: u32,
        /// What went wrong.
        message: String,
    },

    // ---- quiesce and flush
    /// A process survived SIGKILL during quiesce.
    #[error("process {pid} survived SIGKILL during quiesce")]
    QuiesceSurvivor {
        /// Its process id inside the sandbox.
        pid: u32,
    },
    /// The operation did not finish within its bound.
    #[error("{op} did not finish within {limit_ms} ms")]
    Timeout {
        /// The operation that failed.
        op: String,
        /// The bound, in milliseconds.
        limit_ms: u64,
    },

    // ---- network
    /// Nothing listens on that port inside the sandbox.
    #[error("nothing listens on port {port} inside the sandbox")]
    ConnectionRefused {
        /// The port inside the sandbox.
        port: u16,
    },

    // ---- capabilities
    /// The agent does not offer the feature this operation needs.
    #[error("{op}: the agent does not offer feature {feature:?}")]
    Unsupported {
        /// The operation that failed.
        op: String,
        /// The feature the agent lacks.
        feature: String,
    },
    /// An egress policy entry refused when the policy was given.
    #[error(transparent)]
    EgressPolicy(#[from] crate::egress::PolicyError),
    /// The sandbox's egress supervisor does not answer.
    #[error("sandbox {id}: its egress supervisor is unavailable: {reason}")]
    EgressUnavailable {
        /// The sandbox's id.
        id: String,
        /// Why, for humans.
        reason: String,
    },
    /// The tier cannot honour a spec option; nothing was created.
    #[error("tier {tier} cannot honour option {option}: {reason}")]
    OptionRefused {
        /// The tier that refused or failed.
        tier: Tier,
        /// The spec option, by its path (e.g. `resources.pids`).
        option: String,
        /// Why, for humans.
        reason: String,
    },
    /// The file is not an image this store can import.
    #[error("{}: not an image: {reason}", path.display())]
    NotAnImage {
        /// The path as the caller gave it.
        path: PathBuf,
        /// Why, for humans.
        reason: String,
    },
    /// An entry of an image layer would have reached outside the rootfs
    /// (or could not be placed beneath it safely); nothing was published.
    #[error("{}: layer {layer}: {reason} (entry {entry:?})", path.display())]
    ImageEntryRefused {
        /// The path as the caller gave it.
        path: PathBuf,
        /// The layer, by digest or file name.
        layer: String,
        /// The entry as the layer names it.
        entry: String,
        /// Why, for humans.
        reason: crate::image::Refusal,
    },
    /// No imported image by that name or id.
    #[error(
        "no image {reference:?} (pull it with `namzu image pull REF` or import it with `namzu image import FILE`)"
    )]
    ImageNotFound {
        /// The image reference.
        reference: String,
    },
    /// The registry has no image by that name and tag (or digest).
    #[error("registry {registry} has no image {reference}")]
    ImageNotInRegistry {
        /// The image reference, as pulled.
        reference: String,
        /// The registry asked.
        registry: String,
    },
    /// The registry refused access: the credentials found were refused, or
    /// it asked for credentials and none were configured.
    #[error("registry {registry} refused to let {} pull {reference}: {reason}", user.as_deref().map_or("an anonymous client".to_owned(), |u| format!("user {u:?}")))]
    RegistryAuthRefused {
        /// The image reference, as pulled.
        reference: String,
        /// The registry asked.
        registry: String,
        /// The user whose credentials were sent, `None` when anonymous.
        user: Option<String>,
        /// What the registry said, for humans.
        reason: String,
    },
    /// The registry could not be reached (no route, refused, TLS, timeout).
    #[error("registry {registry} is unreachable: {reason}")]
    RegistryUnreachable {
        /// The registry asked.
        registry: String,
        /// Why, for humans.
        reason: String,
    },
    /// The registry answered something that is not a valid image.
    #[error("registry {registry}: {reason}")]
    RegistryProtocol {
        /// The registry asked.
        registry: String,
        /// What was wrong, for humans.
        reason: String,
    },
    /// A blob's content did not hash to its digest (or ran past its size);
    /// nothing of it was kept.
    #[error("{reference}: blob {digest} is corrupt: {reason}")]
    ImageBlobCorrupt {
        /// The image reference, as pulled.
        reference: String,
        /// The digest the manifest names.
        digest: String,
        /// What arrived instead, for humans.
        reason: String,
    },
    /// A blob's download broke off; what arrived is kept and the next pull
    /// resumes from it.
    #[error("{reference}: the download of blob {digest} broke off after {received} of {size} bytes (pull again to resume): {reason}")]
    ImagePullInterrupted {
        /// The image reference, as pulled.
        reference: String,
        /// The blob's digest.
        digest: String,
        /// Bytes of it now kept.
        received: u64,
        /// Its size, as the manifest gives it.
        size: u64,
        /// Why, for humans.
        reason: String,
    },
    /// A multi-platform image has no manifest for this platform.
    #[error("{reference} has no image for {platform} (it has {})", if available.is_empty() { "none".to_owned() } else { available.join(", ") })]
    ImagePlatformMissing {
        /// The image reference, as pulled.
        reference: String,
        /// The platform wanted (`linux/amd64`).
        platform: String,
        /// The platforms the index lists.
        available: Vec<String>,
    },
    /// The image is used by sandboxes; it was not removed.
    #[error("image {reference} is in use by sandbox(es) {}", sandboxes.join(", "))]
    ImageInUse {
        /// The image reference.
        reference: String,
        /// The sandboxes using it.
        sandboxes: Vec<String>,
    },
    /// The tier cannot be used here (its daemon is down, or it is not built).
    #[error("tier {tier} is not available: {reason}")]
    TierUnavailable {
        /// The tier that refused or failed.
        tier: Tier,
        /// Why, for humans.
        reason: String,
    },
    /// Two options of a tier conflict.
    #[error("tier {tier}: option {option} cannot be combined with {conflicts_with}: {reason}")]
    ConfigConflict {
        /// The tier that refused or failed.
        tier: Tier,
        /// The spec option, by its path (e.g. `resources.pids`).
        option: String,
        /// The option it conflicts with.
        conflicts_with: String,
        /// Why, for humans.
        reason: String,
    },
    // ---- sandboxes and links
    /// This handle's sandbox has been destroyed.
    #[error("sandbox {id} has been destroyed")]
    SandboxDestroyed {
        /// The sandbox's id.
        id: String,
    },
    /// No sandbox with this id.
    #[error("no sandbox with id {id}")]
    SandboxNotFound {
        /// The sandbox's id.
        id: String,
    },
    /// The sandbox exists but its agent is gone.
    #[error("sandbox {id} is not running (its agent is gone)")]
    SandboxDead {
        /// The sandbox's id.
        id: String,
    },
    /// The sandbox is suspended: nothing runs in it and nothing reaches it
    /// until [`Provider::resume`](crate::Provider::resume) starts it again.
    #[error("sandbox {id} is suspended; resume it first")]
    SandboxSuspended {
        /// The sandbox's id.
        id: String,
    },
    /// No snapshot has this id.
    #[error("snapshot {snapshot} not found")]
    SnapshotNotFound {
        /// The snapshot's id.
        snapshot: String,
    },
    /// The snapshot still backs sandboxes forked from it; destroy them first.
    #[error("snapshot {snapshot} backs the disks of {forks:?}; destroy them first")]
    SnapshotInUse {
        /// The snapshot's id.
        snapshot: String,
        /// The sandboxes whose disks overlay it.
        forks: Vec<String>,
    },
    /// The sandbox is not suspended, so there is nothing to resume from disk.
    #[error("sandbox {id} is not suspended")]
    NotSuspended {
        /// The sandbox's id.
        id: String,
    },
    /// A tier's own failure, typed by that tier: match it with
    /// [`Error::tier_error`] (e.g. `namzu::kubernetes::KubernetesError`,
    /// `namzu::backend::docker::DockerError`).
    #[error("{tier} tier")]
    Tier {
        /// The tier that refused or failed.
        tier: Tier,
        /// The underlying failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The sandbox's lease found the object behind it deleted or expired.
    #[error("sandbox {id} is gone: its lease found the object deleted or expired")]
    SandboxGone {
        /// The sandbox's id.
        id: String,
    },
    /// The `namzu-agent` binary was not found (set `NAMZU_AGENT_BIN`).
    #[error("cannot find the namzu-agent binary; looked in: {searched:?} (set NAMZU_AGENT_BIN)")]
    AgentBinaryNotFound {
        /// Where the binary was looked for.
        searched: Vec<PathBuf>,
    },
    /// The privilege probe found a command inside with some privilege; the
    /// sandbox was refused.
    #[error("sandbox {id} refused: its commands are not unprivileged ({field} is {value:?})")]
    PrivilegeProbe {
        /// The sandbox's id.
        id: String,
        /// The status field that showed privilege.
        field: String,
        /// The value that exceeded it.
        value: String,
    },
    /// The sandbox's agent did not come up.
    #[error("agent of sandbox {id} did not come up: {reason}")]
    AgentStart {
        /// The sandbox's id.
        id: String,
        /// Why, for humans.
        reason: String,
    },
    /// The link could not be dialed.
    #[error("cannot connect to {endpoint}")]
    Connect {
        /// The address dialed.
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// The link was refused during its authenticating preface.
    #[error("link to {endpoint} refused during the preface")]
    Preface {
        /// The address dialed.
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: PrefaceError,
    },
    /// The agent speaks another link protocol version.
    #[error("agent speaks protocol {agent}, this host speaks {host}")]
    ProtocolVersion {
        /// The protocol version the agent speaks.
        agent: u32,
        /// The protocol version this host speaks.
        host: u32,
    },
    /// The link to the agent failed.
    #[error("{op}: the link to the agent failed: {message}")]
    LinkLost {
        /// The operation that failed.
        op: String,
        /// What went wrong, for humans.
        message: String,
    },
    /// The agent broke the protocol.
    #[error("{op}: the agent broke the protocol: {message}")]
    Protocol {
        /// The operation that failed.
        op: String,
        /// What went wrong, for humans.
        message: String,
    },
    /// The agent is shutting down.
    #[error("{op}: the agent is shutting down")]
    ShuttingDown {
        /// The operation that failed.
        op: String,
    },
    /// An i/o failure on this host.
    #[error("{op}: local i/o")]
    LocalIo {
        /// The operation that failed.
        op: String,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// A sandbox's state directory could not be read.
    #[error("state of sandbox {id} is unreadable: {message}")]
    State {
        /// The sandbox's id.
        id: String,
        /// What went wrong, for humans.
        message: String,
    },
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
    /// The refusal of `op` (suspend or resume) by a tier that cannot keep
    /// a sandbox's disk without its processes.
    pub fn cannot_suspend(tier: Tier, op: &str) -> Self {
        Self::OptionRefused {
            tier,
            option: op.into(),
            reason: "this tier cannot keep a sandbox's disk without its processes".into(),
        }
    }

    /// A tier that keeps no memory snapshots refusing `op`.
    pub fn cannot_snapshot(tier: Tier, op: &str) -> Self {
        Self::OptionRefused {
            tier,
            option: op.into(),
            reason: "this tier cannot save a running sandbox's memory".into(),
        }
    }

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
                retirement: None,
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
            Kind::Survivor if op == "pause" => Error::PauseIncomplete {
                pid: e.pid,
                message: e.message,
            },
            Kind::Survivor => Error::QuiesceSurvivor { pid: e.pid },
            Kind::Paused => Error::SandboxPaused { op },
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

impl From<crate::spec::UnknownTier> for Error {
    fn from(e: crate::spec::UnknownTier) -> Self {
        Error::InvalidArgument {
            op: "tier".into(),
            message: e.to_string(),
        }
    }
}
