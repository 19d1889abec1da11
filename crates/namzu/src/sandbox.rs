//! The one API every backend offers: [`Sandbox`] (a live sandbox) and
//! [`Provider`] (makes and finds sandboxes of one tier).
//!
//! Every operation goes through the sandbox's agent, so the trait provides
//! them all on top of [`Sandbox::agent`]; a backend supplies identity and
//! lifecycle. After [`Sandbox::destroy`] every operation fails with
//! [`Error::SandboxDestroyed`].

use std::path::Path;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::client::{AgentClient, ByteStream, CancelOutcome, ExecStream, FileInfoStream};
use crate::error::{Error, Result};
use crate::types::*;

/// Isolation boundaries, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// No isolation: the agent is a plain child process. Development only.
    Host,
    /// Linux namespaces, seccomp, landlock; no daemon.
    Local,
    /// One OCI container per sandbox through dockerd (runc or runsc).
    Docker,
    /// One KVM guest per sandbox.
    MicroVm,
    /// agent-sandbox custom resources on a cluster.
    Kubernetes,
}

impl Tier {
    pub const ALL: [Tier; 5] = [Tier::Host, Tier::Local, Tier::Docker, Tier::MicroVm, Tier::Kubernetes];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Host => "host",
            Tier::Local => "local",
            Tier::Docker => "docker",
            Tier::MicroVm => "microvm",
            Tier::Kubernetes => "kubernetes",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl std::str::FromStr for Tier {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::InvalidArgument {
                op: "tier".into(),
                message: format!("unknown tier {s:?}; known: host, local, docker, microvm, kubernetes"),
            })
    }
}

/// Resource limits of a sandbox, applied through cgroups. `None`: not
/// limited that way. A tier that cannot apply one refuses it by name.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    pub memory_bytes: Option<u64>,
    /// CPU time, in CPUs (1.5 = one and a half cores).
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
}

impl Resources {
    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.cpus.is_none() && self.pids.is_none()
    }
}

/// A host path shown inside the sandbox (nosuid, nodev; read-only unless
/// `writable`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: std::path::PathBuf,
    /// Absolute path inside the sandbox.
    pub target: std::path::PathBuf,
    pub writable: bool,
}

/// What to create. Options a tier cannot honour are refused by name.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// Root filesystem: an imported image (name or `sha256:` id) or a rootfs
    /// directory. `None`: the host view (read-only host /usr and friends).
    pub image: Option<String>,
    /// Host paths to show inside.
    pub binds: Vec<Bind>,
    pub resources: Resources,
    /// Environment every command starts with.
    pub env: Vec<(String, String)>,
    /// Agent limits to override, by their names in
    /// [`namzu_proto::limits`] (e.g. `sandbox_max_timeout_ms`).
    pub limits: Vec<(String, u64)>,
    /// What may leave the sandbox (default: nothing, names included), and
    /// names the host resolves itself. See [`crate::egress`].
    pub egress: crate::egress::EgressConfig,
}

/// A summary of a sandbox a provider knows about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub tier: Tier,
    pub alive: bool,
    pub created_unix: u64,
}

#[async_trait]
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;
    fn tier(&self) -> Tier;
    /// The link to this sandbox's agent.
    fn agent(&self) -> &AgentClient;

    /// Tears the sandbox down: every process in it is killed and its state
    /// removed. Idempotent.
    async fn destroy(&self) -> Result<()>;

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        self.agent().exec(req).await
    }
    async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream> {
        self.agent().exec_stream(req).await
    }
    async fn cancel(&self, exec_id: &str) -> Result<CancelOutcome> {
        self.agent().cancel(exec_id).await
    }
    /// Reads a detachable execution (started with [`ExecRequest::execution_id`]
    /// or [`ExecRequest::detach`]) by id, from any process; never signals it.
    async fn attach_execution(&self, execution_id: &str, opts: AttachOptions) -> Result<ExecOutput> {
        self.agent().attach_execution(execution_id, opts).await
    }
    async fn attach_execution_stream(&self, execution_id: &str, opts: AttachOptions) -> Result<ExecStream> {
        self.agent().attach_execution_stream(execution_id, opts).await
    }
    /// Kills a detachable execution by id and confirms it; an unconfirmed
    /// kill retires nothing.
    async fn cancel_execution(&self, execution_id: &str) -> Result<CancelOutcome> {
        self.agent().cancel_execution(execution_id).await
    }
    async fn write_file(&self, path: &Path, data: Bytes, opts: WriteOptions) -> Result<u64> {
        self.agent().write_file(path, data, opts).await
    }
    async fn write_file_from(
        &self,
        path: &Path,
        reader: Box<dyn AsyncRead + Send + Unpin>,
        opts: WriteOptions,
    ) -> Result<u64> {
        self.agent().write_file_from(path, reader, opts).await
    }
    async fn read_file(&self, path: &Path, range: Option<ByteRange>) -> Result<FileData> {
        self.agent().read_file(path, range).await
    }
    async fn read_file_stream(&self, path: &Path, range: Option<ByteRange>) -> Result<ByteStream> {
        self.agent().read_file_stream(path, range).await
    }
    async fn list_files(&self, path: &Path) -> Result<Vec<FileInfo>> {
        self.agent().list_files(path).await
    }
    async fn walk_files(&self, root: &Path, opts: WalkOptions) -> Result<FileInfoStream> {
        self.agent().walk_files(root, opts).await
    }
    async fn stat(&self, path: &Path) -> Result<FileInfo> {
        self.agent().stat(path).await
    }
    async fn mkdir(&self, path: &Path, parents: bool) -> Result<()> {
        self.agent().mkdir(path, parents).await
    }
    async fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        self.agent().remove(path, recursive).await
    }
    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.agent().rename(from, to).await
    }
    /// Starts a command in a named session that outlives any connection.
    async fn start_detached(&self, spec: DetachedSpec) -> Result<SessionInfo> {
        self.agent().start_detached(spec).await
    }
    async fn read_session(&self, id: &str, from_offset: u64, max_bytes: u32) -> Result<SessionChunk> {
        self.agent().read_session(id, from_offset, max_bytes).await
    }
    async fn list_sessions(&self) -> Result<Vec<SessionInfo>> {
        self.agent().list_sessions().await
    }
    async fn kill_session(&self, id: &str, signal: SessionSignal) -> Result<SessionInfo> {
        self.agent().kill_session(id, signal).await
    }
    /// Replaces the whole egress policy of the running sandbox, atomically:
    /// new connections follow it at once, and open connections to
    /// destinations it refuses are closed before this returns. Tiers
    /// without an egress boundary refuse it by name.
    async fn set_network_policy(&self, policy: crate::egress::EgressPolicy) -> Result<()> {
        let _ = policy;
        Err(crate::egress::no_boundary(self.tier()))
    }
    /// The egress configuration in force, and how many connections are open.
    async fn network_policy(&self) -> Result<(crate::egress::EgressConfig, usize)> {
        Err(crate::egress::no_boundary(self.tier()))
    }
    /// Stops every process in the sandbox but the agent.
    async fn quiesce(&self, grace: std::time::Duration) -> Result<QuiesceReport> {
        self.agent().quiesce(grace).await
    }
    /// Makes the workspace durable.
    async fn flush(&self, timeout: std::time::Duration) -> Result<std::time::Duration> {
        self.agent().flush(timeout).await
    }
    /// A terminal (pty) inside the sandbox.
    async fn open_terminal(&self, opts: TerminalOptions) -> Result<crate::client::Terminal> {
        self.agent().open_terminal(opts).await
    }
    /// Resumes a persistent terminal from an offset.
    async fn attach_terminal(&self, session_id: &str, from_offset: u64) -> Result<crate::client::Terminal> {
        self.agent().attach_terminal(session_id, from_offset).await
    }
    /// A TCP connection to 127.0.0.1:`port` inside the sandbox.
    async fn open_tcp_connection(&self, port: u16) -> Result<tokio::io::DuplexStream> {
        self.agent().open_tcp_connection(port).await
    }
}

#[async_trait]
pub trait Provider: Send + Sync {
    fn tier(&self) -> Tier;
    async fn create(&self, spec: SandboxSpec) -> Result<Box<dyn Sandbox>>;
    /// Reattaches to a sandbox made earlier, possibly by another process.
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>>;
    async fn list(&self) -> Result<Vec<SandboxInfo>>;
    /// Destroys a sandbox by id, whether or not it is still alive.
    async fn destroy(&self, id: &str) -> Result<()>;

    /// Removes every sandbox whose agent is gone, with its leftovers.
    /// Returns the ids removed.
    async fn gc(&self) -> Result<Vec<String>> {
        self.remove_dead().await
    }

    /// Destroys every listed sandbox that is not alive; returns their ids.
    async fn remove_dead(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        for s in self.list().await? {
            if !s.alive {
                self.destroy(&s.id).await?;
                removed.push(s.id);
            }
        }
        Ok(removed)
    }
}
