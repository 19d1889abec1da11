//! The API's request and response bodies: plain serde types with their
//! OpenAPI schemas, and the conversions from the library's types. Every
//! request body refuses unknown fields. Bytes that need not be UTF-8
//! (command output, stdin) travel as base64.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Resource limits of a new sandbox.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesBody {
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU limit in CPUs (0.5 = half a core).
    pub cpus: Option<f64>,
    /// Most processes at once.
    pub pids: Option<u64>,
    /// Disk limit in bytes: what `/workspace` may hold (ENOSPC inside
    /// when full).
    pub disk_bytes: Option<u64>,
}

/// One allowlist entry.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AllowRule {
    /// `api.example.com`, or `.example.com` for a domain and every name
    /// under it.
    pub host: String,
    /// Ports allowed; absent: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u32>>,
}

/// What may leave a sandbox.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetworkBody {
    /// `none` (the default: no network, no names), `deny-all` (names
    /// resolve, nothing connects), `allow-all` (anything but the host
    /// itself), `allowlist` (the hosts in `allow`), `public-internet`
    /// (public addresses but `except_cidrs`).
    pub mode: String,
    /// For `allowlist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<AllowRule>,
    /// For `public-internet`: ranges refused besides the non-public ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except_cidrs: Vec<String>,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// A tier the server serves (`--tiers`); absent: its first.
    pub tier: Option<String>,
    /// local: an imported image or rootfs directory; docker: an image
    /// reference (required there).
    pub image: Option<String>,
    /// docker only: `runc` or `runsc`.
    pub runtime: Option<String>,
    /// Resource limits.
    #[serde(default)]
    pub resources: ResourcesBody,
    /// Environment every command starts with.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels for the caller's own bookkeeping; list filters on them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Egress (default: none).
    pub network: Option<NetworkBody>,
    /// Seconds until the server destroys the sandbox unless extended
    /// (default: the server's `default_timeout`).
    pub timeout_s: Option<u64>,
    /// What reaching the timeout does: `destroy` (the default), `pause`
    /// (every process stopped in place) or `suspend` (processes ended, the
    /// disk kept); a paused or suspended sandbox does not expire until
    /// resumed.
    pub on_timeout: Option<String>,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxView {
    /// Its id.
    pub id: String,
    /// Its tier.
    pub tier: String,
    /// docker: the runtime it was made with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The image it was made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The caller's labels.
    pub metadata: BTreeMap<String, String>,
    /// Made at, Unix milliseconds.
    pub created_at_ms: u64,
    /// Destroyed at, Unix milliseconds, unless extended.
    pub expires_at_ms: u64,
    /// `running`, `paused`, `suspended`, or `dead` once an operation found
    /// its agent gone.
    pub state: String,
    /// Reaching the timeout pauses it instead of destroying it.
    pub pause_on_timeout: bool,
    /// Reaching the timeout suspends it to disk instead of destroying it.
    pub suspend_on_timeout: bool,
}

/// One page of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxPage {
    /// Sorted by id.
    pub sandboxes: Vec<SandboxView>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/sandboxes` query. Besides these, every `metadata.KEY=VALUE`
/// parameter keeps only sandboxes with that label.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Most sandboxes on the page (default and most: `max_page_size`).
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before.
    pub cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeout {
    /// Seconds from now until the sandbox is destroyed.
    pub timeout_s: u64,
}

/// A command to run.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRequest {
    /// The program and its arguments; give this or `script`.
    #[serde(default)]
    pub argv: Vec<String>,
    /// A shell script run with `sh -c`; give this or `argv`.
    pub script: Option<String>,
    /// Working directory (relative: to the sandbox's workspace).
    pub cwd: Option<String>,
    /// Environment added.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Standard input, base64; absent: /dev/null.
    pub stdin_b64: Option<String>,
    /// Kill it after this many milliseconds (default: the sandbox's
    /// maximum).
    pub timeout_ms: Option<u64>,
    /// Its execution id (a name); absent: the server picks one.
    pub execution_id: Option<String>,
    /// Start it and answer at once with its id, without streaming.
    #[serde(default)]
    pub detached: bool,
}

/// How a command ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ExitView {
    /// Exit code, if it exited.
    pub code: Option<i32>,
    /// Signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Killed by its timeout.
    pub timed_out: bool,
    /// Killed by a cancel.
    pub cancelled: bool,
}

impl From<&namzu::ExitStatus> for ExitView {
    fn from(s: &namzu::ExitStatus) -> Self {
        Self {
            code: s.code,
            signal: s.signal,
            timed_out: s.timed_out,
            cancelled: s.cancelled,
        }
    }
}

/// One event of a command's output stream: one NDJSON line, or one SSE
/// `data:` (with the type as the SSE `event`). Resume a stream with
/// `offset` = the `next_offset` of the last event received.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CommandEvent {
    /// First: which execution this is.
    Start {
        /// Its id.
        execution_id: String,
        /// Pid inside the sandbox.
        pid: Option<u32>,
        /// The offset the stream starts from.
        next_offset: u64,
    },
    /// A chunk of standard output.
    Stdout {
        /// Where the chunk starts within standard output.
        offset: u64,
        /// The bytes, base64.
        data: String,
        /// Where to resume after this event.
        next_offset: u64,
    },
    /// A chunk of standard error.
    Stderr {
        /// Where the chunk starts within standard error.
        offset: u64,
        /// The bytes, base64.
        data: String,
        /// Where to resume after this event.
        next_offset: u64,
    },
    /// Last: how it ended.
    Exit {
        /// How it ended.
        status: ExitView,
        /// Bytes written to stdout, kept or not.
        stdout_bytes: u64,
        /// Bytes written to stderr, kept or not.
        stderr_bytes: u64,
        /// Milliseconds from start to exit.
        duration_ms: u64,
        /// Where the log ends.
        next_offset: u64,
    },
    /// Last, instead of `exit`, when the stream broke: re-attach from
    /// `next_offset`.
    Error {
        /// See the error codes.
        code: String,
        /// For a person.
        message: String,
        /// Where to resume.
        next_offset: u64,
    },
}

/// `POST /v1/sandboxes/{id}/commands` with `detached`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Started {
    /// Its id: attach and cancel by it.
    pub execution_id: String,
    /// Pid inside the sandbox.
    pub pid: Option<u32>,
}

/// `POST /v1/sandboxes/{id}/commands/run`: the collected result.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CommandResult {
    /// Its id.
    pub execution_id: String,
    /// How it ended.
    pub status: ExitView,
    /// Standard output, in `encoding`.
    pub stdout: String,
    /// Standard error, in `encoding`.
    pub stderr: String,
    /// `utf8` when both outputs are valid UTF-8, else `base64`.
    pub encoding: String,
    /// Output past the agent's limit was dropped.
    pub stdout_truncated: bool,
    /// Output past the agent's limit was dropped.
    pub stderr_truncated: bool,
    /// Milliseconds from start to exit.
    pub duration_ms: u64,
}

/// Re-attach query.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AttachQuery {
    /// The `next_offset` of the last event received (default 0).
    #[serde(default)]
    pub offset: u64,
    /// false: what is held now and no waiting (default true).
    pub follow: Option<bool>,
}

/// One execution the sandbox holds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecutionView {
    /// Its id.
    pub execution_id: String,
    /// `reserved`, `running` or `exited`.
    pub state: String,
    /// When exited: how.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ExitView>,
    /// Pid inside the sandbox.
    pub pid: Option<u32>,
    /// Output logged so far, both streams.
    pub output_bytes: u64,
}

/// `POST …/commands/{execution_id}/cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelView {
    /// `killed`, `not_started` or `already_exited`.
    pub outcome: String,
}

/// A file-system entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileView {
    /// Its path inside the sandbox.
    pub path: String,
    /// Its name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modified at, Unix milliseconds.
    pub mtime_ms: u64,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Depth below the walk's root (0 in lists).
    pub depth: u32,
}

impl From<&namzu::FileInfo> for FileView {
    fn from(f: &namzu::FileInfo) -> Self {
        Self {
            path: f.path.to_string_lossy().into_owned(),
            name: f.name.to_string_lossy().into_owned(),
            kind: match f.kind {
                namzu::FileKind::File => "file",
                namzu::FileKind::Dir => "dir",
                namzu::FileKind::Symlink => "symlink",
                _ => "other",
            }
            .into(),
            size: f.size,
            mode: f.mode,
            mtime_ms: f
                .mtime
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            symlink_target: f.symlink_target.as_ref().map(|p| p.to_string_lossy().into_owned()),
            depth: f.depth,
        }
    }
}

/// A path parameter.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    /// Path inside the sandbox (relative: to its workspace).
    pub path: String,
}

/// Upload query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// Path inside the sandbox.
    pub path: String,
    /// Mode of a new file, octal digits (default 644).
    pub mode: Option<String>,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_parents: bool,
}

/// Remove query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// Path inside the sandbox.
    pub path: String,
    /// A directory and everything beneath it.
    #[serde(default)]
    pub recursive: bool,
}

/// Walk query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WalkQuery {
    /// The root of the walk.
    pub path: String,
    /// Deepest level (default: the agent's).
    pub max_depth: Option<u32>,
    /// Most entries; past it the walk is refused (`walk_limit`).
    pub max_entries: Option<u32>,
    /// Include names starting with a dot.
    #[serde(default)]
    pub include_hidden: bool,
}

/// Watch query.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// The directory.
    pub path: String,
    /// Its subdirectories too.
    #[serde(default)]
    pub recursive: bool,
}

/// One line of a watch stream. The first is `started` (the watches are in
/// place); then `create`, `write`, `remove`, `rename` (moved away),
/// `chmod`, or `overflow` (events were lost).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WatchEventView {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: String,
    /// The entry, relative to the watched directory.
    pub name: String,
    /// The entry is a directory.
    pub is_dir: bool,
}

/// `POST …/files/mkdir`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirBody {
    /// The directory.
    pub path: String,
    /// Create missing parents; an existing directory is fine.
    #[serde(default)]
    pub parents: bool,
}

/// `POST …/files/rename`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameBody {
    /// From.
    pub from: String,
    /// To (replaced atomically).
    pub to: String,
}

/// `POST …/files/content` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Written {
    /// Bytes written.
    pub bytes: u64,
}

/// `GET …/network` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NetworkView {
    /// The policy in force.
    pub policy: NetworkBody,
    /// Egress connections open now.
    pub open_connections: usize,
}

/// `POST …/quiesce`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuiesceBody {
    /// Milliseconds between SIGTERM and SIGKILL (default 2000).
    pub grace_ms: Option<u64>,
}

/// A process quiesce stopped.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StoppedView {
    /// Its pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// The signal that stopped it.
    pub signal: i32,
}

/// `POST …/quiesce` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuiesceView {
    /// What was stopped.
    pub stopped: Vec<StoppedView>,
    /// Passes made.
    pub rounds: u32,
}

/// `POST …/flush`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlushBody {
    /// Give up after this many milliseconds (default 30000).
    pub timeout_ms: Option<u64>,
}

/// `POST …/flush` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FlushView {
    /// Milliseconds the sync took.
    pub took_ms: u64,
}

/// `POST …/pause` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PauseView {
    /// Pids the pause stopped.
    pub stopped: Vec<u32>,
    /// Scans it took (0: it was paused already).
    pub rounds: u32,
}

/// `POST …/resume` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResumeView {
    /// Pids continued.
    pub continued: Vec<u32>,
    /// Milliseconds it was paused (0: it was not).
    pub paused_ms: u64,
    /// It was suspended, and started again on its disk (its processes
    /// afresh; `continued` is empty).
    pub from_disk: bool,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// Tiers served; the first is the default.
    pub tiers: Vec<String>,
    /// The server's version.
    pub version: String,
}

/// Terminal WebSocket query.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TerminalQuery {
    /// Columns (default 80).
    pub cols: Option<u16>,
    /// Rows (default 24).
    pub rows: Option<u16>,
    /// Program (default: a login shell).
    pub command: Option<String>,
}

/// A control message on a terminal WebSocket (a text frame); data travels
/// in binary frames both ways. The server's last text frame is
/// `{"type":"exit", …}` with the exit status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TerminalControl {
    /// The client's window changed size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
}
