//! The namzu wire protocol, shared by the host library and the guest agent.
//!
//! This crate owns three things and promises they stay in step on both ends:
//!
//! * the gRPC service generated from `proto/namzu/agent/v1/agent.proto`
//!   ([`v1`]), the single source of truth for messages;
//! * the link [`preface`] that authenticates a byte stream before HTTP/2
//!   starts on it;
//! * the [`features`] names and the [`PROTOCOL_VERSION`] a host checks before
//!   it calls an optional op, and the codec for the typed error carried in a
//!   gRPC status ([`status_with_error`], [`error_from_status`]);
//! * the pod link's mutual TLS ([`link_tls`]), configured alike on both ends;
//! * the microVM link's multiplexer ([`mux`]): many links over one port.

pub mod accept;
pub mod back;
pub mod handoff;
pub mod launch;
pub mod link_tls;
pub mod mux;
pub mod mux_sync;
pub mod preface;
pub mod side_read;
pub mod splice;

/// Generated messages, client and server for `namzu.agent.v1`.
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used, missing_docs)]
pub mod v1 {
    tonic::include_proto!("namzu.agent.v1");
}

use prost::Message;

/// Bumped when a message changes incompatibly. Additions are announced as
/// features instead, so a newer host keeps working with an older agent.
pub const PROTOCOL_VERSION: u32 = 1;

/// The uid (and gid) the agent takes in a container, where no user
/// namespace separates it from its commands: high enough that no image's
/// /etc/passwd uses it, inside every 32-bit id range a runtime maps. The
/// host makes the agent's run directory this uid's alone.
pub const CONTAINER_AGENT_UID: u32 = 2_147_480_000;

/// Default bound on one gRPC message, either direction. Streams carry larger
/// payloads as many messages; see [`limits`].
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// Names of the limits the agent enforces. The same names are used as the
/// `limit_name` of a `LIMIT_EXCEEDED` error, in `HealthResponse.limits`, and
/// (upper-cased, prefixed `NAMZU_`) as the environment overrides.
pub mod limits {
    /// Largest file WriteFile accepts.
    pub const MAX_WRITE_BYTES: &str = "max_write_bytes";
    /// Largest range a single ReadFile returns.
    pub const MAX_READ_RANGE_BYTES: &str = "max_read_range_bytes";
    /// Largest gRPC message, either direction.
    pub const MAX_MESSAGE_BYTES: &str = "max_message_bytes";
    /// Output kept per stream of one execution; more is counted and dropped.
    pub const MAX_OUTPUT_BYTES: &str = "max_output_bytes";
    /// Upper bound on an execution's timeout.
    pub const SANDBOX_MAX_TIMEOUT_MS: &str = "sandbox_max_timeout_ms";
    /// Time the agent waits for a killed process group to vanish.
    pub const CANCEL_CONFIRM_MS: &str = "cancel_confirm_ms";
    /// Executions reserved or running at once.
    pub const MAX_EXECS: &str = "max_execs";
    /// Records of finished executions kept (so a late cancel learns
    /// "already exited"); the oldest go first.
    pub const EXEC_RECORDS_KEPT: &str = "exec_records_kept";
    /// Time an unused reservation is held before it is released.
    pub const RESERVATION_TTL_MS: &str = "reservation_ttl_ms";
    /// Entries one ListFiles returns.
    pub const MAX_LIST_ENTRIES: &str = "max_list_entries";
    /// Default and upper bound of a walk's entry budget.
    pub const MAX_WALK_ENTRIES: &str = "max_walk_entries";
    /// Bytes of a preface's bind token.
    pub const MAX_TOKEN_BYTES: &str = "max_token_bytes";
    /// Time a peer has to send a valid preface.
    pub const PREFACE_TIMEOUT_MS: &str = "preface_timeout_ms";
    /// Connections still in their preface at once; more are closed at accept.
    pub const MAX_PENDING_LINKS: &str = "max_pending_links";
    /// Time SIGTERM gives running work before the agent kills it and exits.
    pub const SHUTDOWN_GRACE_MS: &str = "shutdown_grace_ms";
    /// Interval of per-stream heartbeats, both ways; a peer silent for three
    /// intervals is gone. 0 disables them.
    pub const HEARTBEAT_INTERVAL_MS: &str = "heartbeat_interval_ms";
    /// Sessions (detached commands) held at once, exited ones included.
    pub const MAX_SESSIONS: &str = "max_sessions";
    /// Output kept per session; older bytes are dropped, and reported.
    pub const SESSION_RING_BYTES: &str = "session_ring_bytes";
    /// How long an exited session's record (and output) is kept.
    pub const SESSION_TTL_MS: &str = "session_ttl_ms";
    /// Bound on the agent's whole SIGTERM shutdown (stop accepting,
    /// quiesce, flush, exit).
    pub const AGENT_SHUTDOWN_DEADLINE_MS: &str = "agent_shutdown_deadline_ms";
    /// Detachable executions whose logs are held at once, running or
    /// exited; the oldest exited one makes room, a full set of running ones
    /// refuses the next.
    pub const MAX_RETAINED_LOGS: &str = "max_retained_logs";
    /// Bytes one detachable execution's log holds (stdout and stderr
    /// interleaved); older bytes are dropped, and reported as a gap.
    pub const EXECUTION_LOG_BYTES: &str = "execution_log_bytes";
    /// How long an exited detachable execution's record and log are kept.
    pub const EXECUTION_RETAINED_TTL_MS: &str = "execution_retained_ttl_ms";
    /// Egress asks (connections and queries) waiting for the host at once.
    pub const EGRESS_MAX_PENDING: &str = "egress_max_pending";
    /// How long an egress ask waits for the host's answer.
    pub const EGRESS_DECISION_TIMEOUT_MS: &str = "egress_decision_timeout_ms";
    /// Longest request head the HTTP proxy reads.
    pub const EGRESS_MAX_HEAD_BYTES: &str = "egress_max_head_bytes";
    /// Streamed reads on streams of their own at once; more are refused
    /// (the host falls back to the link).
    pub const MAX_SIDE_READS: &str = "max_side_reads";
    /// Writes on streams of their own at once; more are refused (the host
    /// falls back to the link).
    pub const MAX_SIDE_WRITES: &str = "max_side_writes";
    /// How often an agent that dials its hosts back looks for new host
    /// listeners (the latency a new host process waits at most).
    pub const DIAL_BACK_SCAN_MS: &str = "dial_back_scan_ms";
    /// Host listeners an agent dials back at once.
    pub const MAX_DIAL_BACK_HOSTS: &str = "max_dial_back_hosts";

    /// The environment variable that overrides limit `name` in the agent
    /// (`NAMZU_<NAME>`): what a boundary sets, what the agent reads.
    pub fn env_var(name: &str) -> String {
        format!("NAMZU_{}", name.to_ascii_uppercase())
    }

    /// Every limit name, for validating overrides.
    pub const ALL: &[&str] = &[
        MAX_WRITE_BYTES,
        MAX_READ_RANGE_BYTES,
        MAX_MESSAGE_BYTES,
        MAX_OUTPUT_BYTES,
        SANDBOX_MAX_TIMEOUT_MS,
        CANCEL_CONFIRM_MS,
        MAX_EXECS,
        EXEC_RECORDS_KEPT,
        RESERVATION_TTL_MS,
        MAX_LIST_ENTRIES,
        MAX_WALK_ENTRIES,
        MAX_TOKEN_BYTES,
        PREFACE_TIMEOUT_MS,
        MAX_PENDING_LINKS,
        SHUTDOWN_GRACE_MS,
        AGENT_SHUTDOWN_DEADLINE_MS,
        HEARTBEAT_INTERVAL_MS,
        MAX_SESSIONS,
        SESSION_RING_BYTES,
        SESSION_TTL_MS,
        MAX_RETAINED_LOGS,
        EXECUTION_LOG_BYTES,
        EXECUTION_RETAINED_TTL_MS,
        EGRESS_MAX_PENDING,
        EGRESS_DECISION_TIMEOUT_MS,
        EGRESS_MAX_HEAD_BYTES,
        MAX_SIDE_READS,
        MAX_SIDE_WRITES,
        DIAL_BACK_SCAN_MS,
        MAX_DIAL_BACK_HOSTS,
    ];
}

/// Feature strings an agent advertises in `HealthResponse.features`.
pub mod features {
    pub const EXEC: &str = "exec";
    pub const EXEC_STDIN_STREAM: &str = "exec.stdin-stream";
    pub const EXEC_CANCEL: &str = "exec.cancel";
    /// Detachable executions: `detach`, named reservations, AttachExec.
    pub const EXEC_ATTACH: &str = "exec.attach";
    /// ListExecs: the executions the agent holds.
    pub const EXEC_LIST: &str = "exec.list";
    pub const FILES_WRITE: &str = "files.write";
    pub const FILES_READ: &str = "files.read";
    pub const FILES_READ_STREAM: &str = "files.read-stream";
    pub const FILES_LIST: &str = "files.list";
    pub const FILES_WALK: &str = "files.walk";
    pub const FILES_STAT: &str = "files.stat";
    pub const FILES_MKDIR: &str = "files.mkdir";
    pub const FILES_REMOVE: &str = "files.remove";
    pub const FILES_RENAME: &str = "files.rename";
    /// WatchDir: inotify events under a directory.
    pub const FILES_WATCH: &str = "files.watch";
    pub const TCP_CONNECT: &str = "tcp.connect";
    /// Heartbeats both ways on a `TcpConnect` call: each end notices a
    /// peer silent for three intervals while it waits to read, and closes
    /// the connection (silence while it waits to WRITE, held back by the
    /// other side's backpressure, is not counted).
    pub const TCP_HEARTBEAT: &str = "tcp.heartbeat";
    pub const TERMINAL: &str = "terminal";
    pub const QUIESCE: &str = "quiesce";
    pub const FLUSH: &str = "flush";
    /// `Pause` and `Resume`: every process but the agent stopped, and
    /// continued.
    pub const PAUSE: &str = "pause";
    pub const SESSIONS: &str = "sessions";
    /// The loopback proxy and resolver, decided by the host (`Egress`).
    pub const EGRESS: &str = "egress";
    /// An accepted egress connection may travel on a byte stream of its
    /// own (a link opened with the egress form of the preface) instead of
    /// an `EgressSplice` call on the shared link.
    pub const EGRESS_STREAM: &str = "egress.stream";
    /// On a unix egress stream opened with the handoff form of the
    /// preface, the agent may pass the client's socket to the host, which
    /// then relays it alone ([`crate::handoff`]).
    pub const EGRESS_HANDOFF: &str = "egress.handoff";
    /// A streamed read may travel on a byte stream of its own (a link
    /// opened with the read form of the preface), framed by
    /// [`crate::side_read`], the bytes sent with `sendfile(2)`.
    pub const FILES_READ_SIDE: &str = "files.read-side";
    /// A write may travel on a byte stream of its own (the write form of
    /// the preface), framed by [`crate::side_read`].
    pub const FILES_WRITE_SIDE: &str = "files.write-side";
    /// A command whose stdin does not stream may run on a byte stream of
    /// its own (the exec form of the preface), its output framed by
    /// [`crate::side_read`]: one write and one wake a message instead of
    /// HTTP/2 and gRPC framing on the shared link.
    pub const EXEC_SIDE: &str = "exec.side";

    /// Everything this version of the agent serves.
    pub const ALL: &[&str] = &[
        EXEC,
        EXEC_STDIN_STREAM,
        EXEC_CANCEL,
        EXEC_ATTACH,
        EXEC_LIST,
        EXEC_SIDE,
        FILES_WRITE,
        FILES_READ,
        FILES_READ_STREAM,
        FILES_READ_SIDE,
        FILES_WRITE_SIDE,
        FILES_LIST,
        FILES_WALK,
        FILES_STAT,
        FILES_MKDIR,
        FILES_REMOVE,
        FILES_RENAME,
        FILES_WATCH,
        TCP_CONNECT,
        TCP_HEARTBEAT,
        TERMINAL,
        QUIESCE,
        FLUSH,
        PAUSE,
        SESSIONS,
    ];
}

/// Builds a status whose details carry `err`, so the host can rebuild it.
pub fn status_with_error(code: tonic::Code, err: v1::AgentError) -> tonic::Status {
    let message = err.message.clone();
    tonic::Status::with_details(code, message, err.encode_to_vec().into())
}

/// The typed error carried by a status from the agent, if it has one.
pub fn error_from_status(status: &tonic::Status) -> Option<v1::AgentError> {
    if status.details().is_empty() {
        return None;
    }
    v1::AgentError::decode(status.details()).ok()
}
