//! Requests and results of sandbox operations, independent of any backend.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio_util::sync::CancellationToken;

mod files;
pub use files::*;

/// Chunks fed to a command's stdin.
pub type StdinStream = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// Standard input of a command.
#[derive(Default)]
pub enum Stdin {
    /// `/dev/null`.
    #[default]
    Null,
    /// These bytes, then end of input.
    Bytes(Bytes),
    /// Chunks as they come; end of the stream closes stdin.
    Stream(StdinStream),
}

impl std::fmt::Debug for Stdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stdin::Null => f.write_str("Null"),
            Stdin::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Stdin::Stream(_) => f.write_str("Stream"),
        }
    }
}

/// A command to run in a sandbox. Arguments are bytes: nothing here
/// assumes UTF-8.
#[derive(Debug, Default)]
pub struct ExecRequest {
    /// The program run.
    pub command: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Relative to the sandbox's default working directory; `None` for it.
    pub cwd: Option<PathBuf>,
    /// Environment variables added.
    pub env: Vec<(OsString, OsString)>,
    /// Start from an empty environment instead of the sandbox's.
    pub clear_env: bool,
    /// Standard input.
    pub stdin: Stdin,
    /// `None`: the sandbox's maximum (`sandbox_max_timeout_ms`).
    pub timeout: Option<Duration>,
    /// Cancelling it kills the command's whole process group and waits for
    /// the kill to be confirmed.
    pub cancel: Option<CancellationToken>,
    /// Makes the command detachable: it outlives this call and this host
    /// process, and a lost link is followed by a reattach from the last
    /// byte received.
    pub detachable: Option<Detachable>,
}

/// Called when output asked for had already been evicted from an
/// execution's retained log.
pub type GapCallback = std::sync::Arc<dyn Fn(OutputGap) + Send + Sync>;

/// Output of a detachable execution that is lost for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputGap {
    /// Log offsets: `[from_offset, from_offset + lost_bytes)` was evicted.
    pub from_offset: u64,
    /// How many bytes were lost from `from_offset` on.
    pub lost_bytes: u64,
}

/// Default time a detachable execution's host keeps trying to reattach
/// after its link fails.
pub const DEFAULT_REATTACH_WINDOW: Duration = Duration::from_secs(30);

/// How a detachable execution is named and followed.
#[derive(Clone)]
pub struct Detachable {
    /// `None`: the host picks a fresh id (read it from the stream).
    pub execution_id: Option<String>,
    /// How long the host tries to get back after its link fails; once an
    /// attach succeeds the window starts again at the next failure.
    pub reattach_window: Duration,
    /// Called with each stretch of output evicted before it was read.
    pub on_gap: Option<GapCallback>,
}

impl Default for Detachable {
    fn default() -> Self {
        Self {
            execution_id: None,
            reattach_window: DEFAULT_REATTACH_WINDOW,
            on_gap: None,
        }
    }
}

impl std::fmt::Debug for Detachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detachable")
            .field("execution_id", &self.execution_id)
            .field("reattach_window", &self.reattach_window)
            .field("on_gap", &self.on_gap.is_some())
            .finish()
    }
}

/// How [`crate::Commands::attach`] reads.
#[derive(Clone)]
pub struct AttachOptions {
    /// Log offset to start from (0: everything still held).
    pub from_offset: u64,
    /// False: what is held now, and the exit if there is one; no waiting.
    pub follow: bool,
    /// How long the host tries to get back after its link fails.
    pub reattach_window: Duration,
    /// Called with each stretch of output evicted before it was read.
    pub on_gap: Option<GapCallback>,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self {
            from_offset: 0,
            follow: true,
            reattach_window: DEFAULT_REATTACH_WINDOW,
            on_gap: None,
        }
    }
}

impl std::fmt::Debug for AttachOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachOptions")
            .field("from_offset", &self.from_offset)
            .field("follow", &self.follow)
            .field("reattach_window", &self.reattach_window)
            .field("on_gap", &self.on_gap.is_some())
            .finish()
    }
}

impl ExecRequest {
    /// Runs `command` (looked up in `PATH`) with no arguments yet.
    pub fn new(command: impl AsRef<OsStr>) -> Self {
        Self {
            command: command.as_ref().to_owned(),
            ..Default::default()
        }
    }

    /// `sh -c SCRIPT`.
    pub fn shell(script: impl AsRef<OsStr>) -> Self {
        Self::new("sh").arg("-c").arg(script)
    }

    /// Appends an argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// Its arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Environment variables added.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env.push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }

    /// Working directory (`None`: the default one).
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Standard input.
    pub fn stdin(mut self, data: impl Into<Bytes>) -> Self {
        self.stdin = Stdin::Bytes(data.into());
        self
    }

    /// Standard input fed from a stream of chunks; its end closes stdin.
    pub fn stdin_stream(mut self, s: impl Stream<Item = Bytes> + Send + 'static) -> Self {
        self.stdin = Stdin::Stream(Box::pin(s));
        self
    }

    /// Kills the command (its whole process group) after this long.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Cancelling the token kills the command and waits for the kill to be confirmed.
    pub fn cancel_token(mut self, t: CancellationToken) -> Self {
        self.cancel = Some(t);
        self
    }

    /// Detachable under this id: starting it again while the agent retains
    /// it runs nothing and attaches.
    pub fn execution_id(mut self, id: impl Into<String>) -> Self {
        self.detachable.get_or_insert_with(Detachable::default).execution_id = Some(id.into());
        self
    }

    /// Detachable under an id the host picks.
    pub fn detachable(mut self) -> Self {
        self.detachable.get_or_insert_with(Detachable::default);
        self
    }

    /// How long the host tries to get back after its link fails.
    pub fn reattach_window(mut self, d: Duration) -> Self {
        self.detachable.get_or_insert_with(Detachable::default).reattach_window = d;
        self
    }

    /// Called with each stretch of output evicted before it was read.
    pub fn on_gap(mut self, f: impl Fn(OutputGap) + Send + Sync + 'static) -> Self {
        self.detachable.get_or_insert_with(Detachable::default).on_gap = Some(std::sync::Arc::new(f));
        self
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitStatus {
    /// Exit code when it exited on its own.
    pub code: Option<i32>,
    /// Signal that ended it, if any.
    pub signal: Option<i32>,
    /// Killed because it ran past its timeout.
    pub timed_out: bool,
    /// Killed because it was cancelled.
    pub cancelled: bool,
}

impl ExitStatus {
    /// It exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Shell convention: the code, or 128 + signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        }
    }
}

/// How a cancel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The whole process group was killed and is confirmed gone.
    Killed,
    /// Reserved but never started; it never will be.
    NotStarted,
    /// It had exited before the kill.
    AlreadyExited,
}

/// The collected result of [`crate::Commands::run`].
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// The execution's id.
    pub execution_id: String,
    /// The boot id of the agent that ran it (see
    /// [`crate::AgentClient::boot_id`]).
    pub boot_id: String,
    /// How it ended.
    pub status: ExitStatus,
    /// Standard output, up to the output limit.
    pub stdout: Bytes,
    /// Standard error, up to the output limit.
    pub stderr: Bytes,
    /// Output beyond the agent's `max_output_bytes` was dropped.
    pub stdout_truncated: bool,
    /// Output past the limit was dropped.
    pub stderr_truncated: bool,
    /// Total bytes the command wrote, including dropped ones.
    pub stdout_bytes: u64,
    /// Bytes the command wrote to stderr, kept or not.
    pub stderr_bytes: u64,
    /// Wall time from start to exit.
    pub duration: Duration,
}

/// One event of a streamed execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// A chunk of standard output.
    Stdout {
        /// The log offset to resume from.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// A chunk of standard error.
    Stderr {
        /// The log offset to resume from.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Always the last event.
    Exit(ExitSummary),
}

/// How a streamed command ended, and how much output it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitSummary {
    /// How it ended.
    pub status: ExitStatus,
    /// Output past the limit was dropped.
    pub stdout_truncated: bool,
    /// Output past the limit was dropped.
    pub stderr_truncated: bool,
    /// Bytes the command wrote to stdout, kept or not.
    pub stdout_bytes: u64,
    /// Bytes the command wrote to stderr, kept or not.
    pub stderr_bytes: u64,
    /// Wall time from start to exit.
    pub duration: Duration,
}

/// What the agent told about itself.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    /// The link protocol version the agent speaks.
    pub protocol_version: u32,
    /// The agent's version.
    pub agent_version: String,
    /// Random per agent start: a changed id means a new agent.
    pub boot_id: String,
    /// Features the agent offers (see `namzu_proto::features`).
    pub features: Vec<String>,
    /// The agent fenced itself after an unconfirmed kill.
    pub retiring: bool,
    /// The sandbox is paused ([`crate::Sandbox::pause`]).
    pub paused: bool,
    /// Its process id inside the sandbox.
    pub pid: u32,
    /// The agent's resident memory now.
    pub rss_bytes: u64,
    /// The agent's peak resident memory.
    pub peak_rss_bytes: u64,
    /// Limits in force, by name.
    pub limits: Vec<(String, u64)>,
    /// Ops other than Health the agent has served since it started.
    pub ops_served: u64,
    /// What the boundary applied (landlock ABI, seccomp, capabilities …).
    pub hardening: std::collections::BTreeMap<String, String>,
    /// Directories file operations are confined beneath.
    pub roots: Vec<PathBuf>,
    /// When each step of the agent's start ended: (stage, `CLOCK_MONOTONIC`
    /// nanoseconds), in order (see [`crate::timeline`]).
    pub startup: Vec<(String, u64)>,
    /// Egress asks the agent refused by itself, with no host deciding.
    pub egress_refused_unattended: u64,
    /// `/proc/self/status` of a child the agent forked for this answer,
    /// when asked ([`crate::ClientOptions::probe_child`]); else empty.
    pub child_status: String,
}

/// How to open a terminal.
#[derive(Debug, Clone, Default)]
pub struct TerminalOptions {
    /// `None`: a login shell.
    pub command: Option<OsString>,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Working directory (`None`: the default one).
    pub cwd: Option<PathBuf>,
    /// Environment variables added.
    pub env: Vec<(OsString, OsString)>,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
    /// Keep it in the session registry under `session_id`: losing the link
    /// only detaches, and `attach_terminal` resumes it.
    pub persistent: bool,
    /// The session's id.
    pub session_id: Option<String>,
}

/// One event of a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    /// Bytes the terminal wrote, at this offset of its output.
    Output {
        /// The log offset to resume from.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Always the last event.
    Exit(ExitStatus),
}

/// What a pause did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PauseReport {
    /// The processes it stopped (inside the sandbox); one stopped already
    /// (job control) is left as it is and not listed.
    pub stopped: Vec<u32>,
    /// Scans it took (0: the sandbox was paused already).
    pub rounds: u32,
}

/// What a resume did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResumeReport {
    /// The processes it continued: those the pause stopped still there.
    pub continued: Vec<u32>,
    /// How long the sandbox was paused (zero: it was not).
    pub paused_for: Duration,
}

/// A process quiesce stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoppedProcess {
    /// Its process id inside the sandbox.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// 15 if SIGTERM was enough, 9 if it took SIGKILL.
    pub signal: i32,
}

/// What a quiesce did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuiesceReport {
    /// Every process it stopped.
    pub stopped: Vec<StoppedProcess>,
    /// Passes until one found nothing left.
    pub rounds: u32,
}

/// Where an execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionState {
    /// Its id is reserved; the command has not started.
    Reserved,
    /// It runs.
    Running,
    /// A detachable execution that exited, still retained.
    Exited(ExitStatus),
}

/// One execution the agent holds; from [`crate::Commands::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionInfo {
    /// Its id.
    pub execution_id: String,
    /// Where it stands.
    pub state: ExecutionState,
    /// Started detachable: its output is retained and can be attached.
    pub detachable: bool,
    /// Detachable only: its pid inside the sandbox, once started.
    pub pid: Option<u32>,
    /// Detachable only: bytes of output so far (stdout and stderr): the
    /// offset an attach would reach.
    pub output_bytes: u64,
}

/// A command to run detached, in a named session.
#[derive(Debug, Clone, Default)]
pub struct SessionSpec {
    /// The session's id.
    pub session_id: String,
    /// The program run.
    pub command: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Working directory (`None`: the default one).
    pub cwd: Option<PathBuf>,
    /// Environment variables added.
    pub env: Vec<(OsString, OsString)>,
}

/// Whether a session's command still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// It runs.
    Running,
    /// It exited, so.
    Exited(ExitStatus),
}

/// What the agent knows of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// The session's id.
    pub session_id: String,
    /// Its process id inside the sandbox.
    pub pid: u32,
    /// Running, or how it exited.
    pub state: SessionState,
    /// Bytes written so far: the offset of the next byte.
    pub output_bytes: u64,
    /// Oldest offset still held; bytes before it were dropped.
    pub first_offset: u64,
}

/// One read of a session's output.
#[derive(Debug, Clone)]
pub struct SessionChunk {
    /// The bytes.
    pub data: Bytes,
    /// Where `data` starts (past `from_offset` when bytes were dropped).
    pub offset: u64,
    /// Where the next read starts.
    pub next_offset: u64,
    /// Bytes asked for that the ring had already dropped.
    pub dropped_bytes: u64,
    /// The session as of this read.
    pub info: SessionInfo,
}

/// Signals `kill_session` may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionSignal {
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGINT.
    Int,
    /// SIGHUP.
    Hup,
}

/// A shell script (`sh -c SCRIPT`), as E2B's `commands.run("…")` takes.
impl From<&str> for ExecRequest {
    fn from(script: &str) -> Self {
        ExecRequest::shell(script)
    }
}

/// A shell script (`sh -c SCRIPT`).
impl From<String> for ExecRequest {
    fn from(script: String) -> Self {
        ExecRequest::shell(script)
    }
}

impl AttachOptions {
    /// Start from this log offset (0: everything still held).
    pub fn from_offset(mut self, offset: u64) -> Self {
        self.from_offset = offset;
        self
    }

    /// False: what is held now, and the exit if there is one; no waiting.
    pub fn follow(mut self, yes: bool) -> Self {
        self.follow = yes;
        self
    }

    /// How long to keep trying to get back after the link fails.
    pub fn reattach_window(mut self, d: Duration) -> Self {
        self.reattach_window = d;
        self
    }

    /// Called with each stretch of output evicted before it was read.
    pub fn on_gap(mut self, f: impl Fn(OutputGap) + Send + Sync + 'static) -> Self {
        self.on_gap = Some(std::sync::Arc::new(f));
        self
    }
}

impl TerminalOptions {
    /// A terminal running `command` instead of a login shell.
    pub fn command(mut self, command: impl AsRef<OsStr>) -> Self {
        self.command = Some(command.as_ref().to_owned());
        self
    }

    /// Appends an argument of the command.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// Working directory.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env.push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }

    /// Columns and rows.
    pub fn size(mut self, cols: u16, rows: u16) -> Self {
        self.cols = cols;
        self.rows = rows;
        self
    }

    /// Keep it in the agent under `session_id`: losing the link only
    /// detaches it, and [`crate::Terminals::attach`] resumes it.
    pub fn persistent(mut self, session_id: impl Into<String>) -> Self {
        self.persistent = true;
        self.session_id = Some(session_id.into());
        self
    }
}

impl SessionSpec {
    /// A session named `session_id` running `command` (no shell).
    pub fn new(session_id: impl Into<String>, command: impl AsRef<OsStr>) -> Self {
        Self {
            session_id: session_id.into(),
            command: command.as_ref().to_owned(),
            ..Default::default()
        }
    }

    /// Appends an argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// Working directory.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env.push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }
}
