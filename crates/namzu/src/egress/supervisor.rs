//! The egress supervisor: one host process per sandbox (`namzu-egress`),
//! outside every boundary, that holds the agent's `Egress` call for the
//! sandbox's life and runs its [`Service`]. It outlives the program that
//! created the sandbox, as the sandbox does.
//!
//! Files in the sandbox's state directory, all the host's and 0600:
//! * [`CONFIG_FILE`]: the current [`EgressConfig`], rewritten atomically on
//!   every change, so a restarted supervisor resumes the same policy;
//! * [`CONTROL_SOCKET`]: one JSON request per connection ([`Request`]),
//!   one JSON [`Reply`]; how `set_network_policy` reaches it;
//! * [`PID_FILE`], and [`LOG_FILE`] (every decision, through `tracing`);
//! * [`LOCK_FILE`]: flocked by the running supervisor for its whole life,
//!   so there is never a second one for a sandbox (two would both splice,
//!   and a policy change would reach only one). A supervisor started while
//!   the lock is held prints `held` and exits; the starter then uses the
//!   one that holds it.
//!
//! Under `NoNetwork` (the default) no supervisor runs: nothing may leave, so
//! nothing needs deciding on the host, and the agent refuses every ask by
//! itself (it fails closed without a host on its `Egress` call, counting
//! and logging what it refused). The first policy change to anything else
//! starts one ([`Supervisor::set`]) before it returns; a sandbox created
//! with any other policy has its supervisor before it is handed out.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::service::{EgressConfig, Service};
use crate::client::AgentClient;
use crate::error::{Error, Result};

/// The current egress configuration, rewritten atomically on every change.
pub const CONFIG_FILE: &str = "egress.json";
/// The control socket: one JSON request, one JSON reply per connection.
pub const CONTROL_SOCKET: &str = "egress.sock";
/// The running supervisor's pid.
pub const PID_FILE: &str = "egress.pid";
/// Every decision, one line each.
pub const LOG_FILE: &str = "egress.log";
/// Held (flock) by the running supervisor for its whole life.
pub const LOCK_FILE: &str = "egress.lock";
/// The supervisor's executable, found next to the agent's.
pub const BINARY: &str = "namzu-egress";
/// How long a spawner waits for the supervisor to hold the `Egress` call.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest control request read.
const MAX_REQUEST: usize = 1 << 20;

/// A control request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Replace the whole configuration.
    Set {
        /// The new configuration.
        config: EgressConfig,
    },
    /// The configuration in force and the open connections.
    Show,
}

/// A control reply.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Why the request failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
    /// The configuration in force.
    #[serde(default)]
    pub config: Option<EgressConfig>,
    /// Open connections the change closed.
    #[serde(default)]
    pub closed: usize,
    /// Connections open now.
    #[serde(default)]
    pub open: usize,
    /// Decisions so far (in answers to `show`).
    #[serde(default)]
    pub decisions: super::Decisions,
}

/// Writes `config` to `dir` atomically (a temporary file renamed over).
pub fn write_config(dir: &Path, config: &EgressConfig) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(config).map_err(std::io::Error::other)?;
    namzu_core::fsutil::write_private(&dir.join(CONFIG_FILE), &bytes)
}

/// Reads the configuration saved in `dir`.
pub fn read_config(dir: &Path) -> std::io::Result<EgressConfig> {
    let text = std::fs::read(dir.join(CONFIG_FILE))?;
    serde_json::from_slice(&text).map_err(std::io::Error::other)
}

/// The configuration saved in `dir`; none saved is the default one.
pub fn saved_config(dir: &Path) -> std::io::Result<EgressConfig> {
    match read_config(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(EgressConfig::default()),
        other => other,
    }
}

/// The supervisor lock of one sandbox, held while this value lives.
#[derive(Debug)]
pub struct SupervisorLock(#[allow(dead_code)] std::fs::File);

/// Takes the supervisor lock of the sandbox in `dir`; `None` when another
/// process holds it.
pub fn claim(dir: &Path) -> std::io::Result<Option<SupervisorLock>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(LOCK_FILE))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(SupervisorLock(f))),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Raises this process's open-file soft limit to its hard limit: every
/// egress connection costs the supervisor a descriptor. Returns the limit
/// now in force.
pub fn raise_nofile() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// Runs the supervisor of the sandbox whose state is `dir`: serves the
/// control socket, and holds the `Egress` call of the agent `connect`
/// reaches, reconnecting while the sandbox exists. `ready` runs once the
/// first call is up. Returns when the sandbox is gone.
pub async fn run<C, F>(id: &str, dir: &Path, _lock: SupervisorLock, connect: C, ready: impl FnOnce()) -> Result<()>
where
    C: Fn() -> F,
    F: Future<Output = Result<AgentClient>>,
{
    let io = |source| Error::LocalIo {
        op: "egress supervisor".into(),
        source,
    };
    let config = read_config(dir).map_err(io)?;
    config.validate()?;
    let service = Service::new(id, config);
    let sock = dir.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock).map_err(io)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    std::fs::write(dir.join(PID_FILE), std::process::id().to_string()).map_err(io)?;
    let control = {
        let (service, dir) = (service.clone(), dir.to_path_buf());
        tokio::spawn(async move {
            while let Some((conn, _)) = namzu_proto::accept::next(|| listener.accept(), "egress control socket").await {
                let (service, dir) = (service.clone(), dir.clone());
                tokio::spawn(async move { control_conn(&service, &dir, conn).await });
            }
        })
    };
    let mut ready = Some(ready);
    let mut failures = 0u32;
    while dir.join("meta.json").is_file() {
        match connect().await {
            Ok(client) => {
                let served = service
                    .serve(&client, || {
                        if let Some(r) = ready.take() {
                            r();
                        }
                    })
                    .await;
                failures = 0;
                if let Err(e) = served {
                    tracing::warn!(sandbox = %id, "egress: {e}");
                    failures += 1;
                }
            }
            // A paused VM answers nothing until it continues: no failure.
            Err(Error::SandboxPaused { .. }) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, "egress: cannot reach the agent: {e}");
                failures += 1;
            }
        }
        if failures > 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100 * u64::from(failures.min(10)))).await;
    }
    control.abort();
    let _ = std::fs::remove_file(&sock);
    tracing::info!(sandbox = %id, "egress: the sandbox is gone; supervisor exits");
    Ok(())
}

async fn control_conn(service: &Arc<Service>, dir: &Path, conn: tokio::net::UnixStream) {
    let (rd, mut wr) = conn.into_split();
    let mut line = String::new();
    let mut rd = BufReader::new(rd).take(MAX_REQUEST as u64);
    if rd.read_line(&mut line).await.is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply {
            error: Some(format!("bad request: {e}")),
            ..Default::default()
        },
        Ok(Request::Show) => Reply {
            config: Some(service.config()),
            open: service.open_connections(),
            decisions: service.decisions(),
            ..Default::default()
        },
        Ok(Request::Set { config }) => match config.validate() {
            Err(e) => Reply {
                error: Some(e.to_string()),
                ..Default::default()
            },
            // Persisted first: a supervisor restarted after this reply
            // must not come back with the old policy.
            Ok(()) => match write_config(dir, &config) {
                Err(e) => Reply {
                    error: Some(format!("save {CONFIG_FILE}: {e}")),
                    ..Default::default()
                },
                Ok(()) => {
                    tracing::info!(policy = config.policy.kind(), "egress: policy replaced");
                    let closed = service.set(config.clone());
                    Reply {
                        config: Some(config),
                        closed,
                        open: service.open_connections(),
                        ..Default::default()
                    }
                }
            },
        },
    };
    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
    out.push(b'\n');
    let _ = wr.write_all(&out).await;
}

/// Sends one control request to the supervisor of the sandbox in `dir`.
pub async fn request(id: &str, dir: &Path, req: &Request) -> Result<Reply> {
    let unavailable = |reason: String| Error::EgressUnavailable { id: id.into(), reason };
    let conn = tokio::net::UnixStream::connect(dir.join(CONTROL_SOCKET))
        .await
        .map_err(|e| unavailable(format!("its egress supervisor does not answer: {e}")))?;
    let (rd, mut wr) = conn.into_split();
    let mut line = serde_json::to_vec(req).map_err(|e| unavailable(e.to_string()))?;
    line.push(b'\n');
    wr.write_all(&line).await.map_err(|e| unavailable(e.to_string()))?;
    let mut answer = String::new();
    BufReader::new(rd)
        .take(MAX_REQUEST as u64)
        .read_line(&mut answer)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    serde_json::from_str(&answer).map_err(|e| unavailable(format!("bad reply: {e}")))
}

/// The egress supervisor of one sandbox, seen from the host program that
/// starts it: where it lives and how to start or restart it. Providers of
/// tiers with an egress boundary hold one per sandbox; the state directory
/// only says where.
#[derive(Debug, Clone)]
pub struct Supervisor {
    id: String,
    tier: crate::Tier,
    /// The state root every tier shares (the supervisor finds the sandbox
    /// beneath it).
    state_root: PathBuf,
    /// The sandbox's own state directory.
    dir: PathBuf,
    /// The supervisor binary is looked for next to the agent's …
    agent_bin: PathBuf,
    /// … unless it is named.
    binary: Option<PathBuf>,
}

impl Supervisor {
    /// The supervisor of sandbox `id` of `tier`, whose state is in `dir`
    /// beneath `state_root`.
    pub fn new(
        id: impl Into<String>,
        tier: crate::Tier,
        state_root: impl Into<PathBuf>,
        dir: impl Into<PathBuf>,
        agent_bin: impl Into<PathBuf>,
    ) -> Self {
        Self {
            id: id.into(),
            tier,
            state_root: state_root.into(),
            dir: dir.into(),
            agent_bin: agent_bin.into(),
            binary: None,
        }
    }

    /// Starts `binary` as the supervisor (where the agent binary has none
    /// beside it: one a pod installed into its own volume, say).
    #[must_use]
    pub fn with_binary(mut self, binary: Option<PathBuf>) -> Self {
        self.binary = binary;
        self
    }

    /// Writes the sandbox's egress configuration and starts its
    /// supervisor; returns once the supervisor holds the agent's `Egress`
    /// call, so the policy is in force before anyone gets the handle.
    /// Under `NoNetwork` only the configuration is written (see the module
    /// docs): the agent alone refuses everything.
    pub async fn start(&self, config: &EgressConfig) -> Result<()> {
        // No file is the default configuration (see `saved`).
        if *config != EgressConfig::default() {
            write_config(&self.dir, config).map_err(|source| Error::LocalIo {
                op: "create".into(),
                source,
            })?;
        }
        if needs_host(config) {
            self.spawn().await
        } else {
            Ok(())
        }
    }

    /// Restarts the supervisor of a running sandbox if its configuration
    /// needs one and none answers: after a crash of the supervisor, the
    /// sandbox's egress stays closed (every ask refused) until the next
    /// connect brings it back with the saved policy.
    pub async fn ensure(&self) -> Result<()> {
        let Ok(config) = self.saved() else {
            return Ok(());
        };
        if !needs_host(&config) || request(&self.id, &self.dir, &Request::Show).await.is_ok() {
            return Ok(());
        }
        tracing::warn!(sandbox = %self.id, "egress supervisor not answering; starting one");
        self.spawn().await
    }

    /// The configuration in force and the open connections: the running
    /// supervisor's answer, or — where none needs to run — the saved
    /// configuration with nothing open.
    pub async fn show(&self) -> Result<Reply> {
        match request(&self.id, &self.dir, &Request::Show).await {
            Ok(reply) => Ok(reply),
            Err(e) => match self.saved() {
                Ok(config) if !needs_host(&config) => Ok(Reply {
                    config: Some(config),
                    ..Default::default()
                }),
                _ => Err(e),
            },
        }
    }

    /// The saved configuration; none saved is the default one.
    fn saved(&self) -> std::io::Result<EgressConfig> {
        saved_config(&self.dir)
    }

    /// Replaces the whole configuration: through the running supervisor,
    /// or by saving it and — unless it is `NoNetwork` — starting one that
    /// holds the agent's call before this returns. The change is sent to
    /// the supervisor in force even when this call started it, so two
    /// programs changing one sandbox at once end with one supervisor and
    /// the policy of whichever change came last.
    pub async fn set(&self, config: &EgressConfig) -> Result<Reply> {
        config.validate()?;
        if request(&self.id, &self.dir, &Request::Show).await.is_err() {
            write_config(&self.dir, config).map_err(|source| Error::LocalIo {
                op: "set network policy".into(),
                source,
            })?;
            if !needs_host(config) {
                return Ok(Reply {
                    config: Some(config.clone()),
                    ..Default::default()
                });
            }
            tracing::info!(sandbox = %self.id, policy = config.policy.kind(), "egress: starting the supervisor the new policy needs");
            self.spawn().await?;
        }
        request(&self.id, &self.dir, &Request::Set { config: config.clone() }).await
    }

    /// Starts the supervisor process and waits until it holds the agent's
    /// `Egress` call.
    async fn spawn(&self) -> Result<()> {
        let (id, tier, state_root, dir, agent_bin) = (
            &self.id[..],
            self.tier,
            &self.state_root,
            self.dir.as_path(),
            &self.agent_bin,
        );
        let unavailable = |reason: String| Error::EgressUnavailable { id: id.into(), reason };
        let bin = self
            .binary
            .clone()
            .filter(|b| b.is_file())
            .or_else(|| find_binary(agent_bin))
            .ok_or_else(|| {
                unavailable(format!(
                    "no {BINARY} next to {} (or in NAMZU_EGRESS_BIN)",
                    agent_bin.display()
                ))
            })?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(LOG_FILE))
            .map_err(|e| unavailable(format!("{LOG_FILE}: {e}")))?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg("--state-dir")
            .arg(state_root)
            .arg("--tier")
            .arg(tier.name())
            .arg("--id")
            .arg(id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(false);
        #[allow(unsafe_code)]
        // SAFETY: setsid is async-signal-safe and touches no memory.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| unavailable(format!("start {}: {e}", bin.display())))?;
        let out = child.stdout.take().ok_or_else(|| unavailable("no stdout".into()))?;
        let mut line = String::new();
        let got = tokio::time::timeout(START_TIMEOUT, BufReader::new(out).read_line(&mut line)).await;
        // tokio reaps it whenever it exits, while this process lives.
        let waited = tokio::spawn(async move { child.wait().await });
        match (got, line.trim()) {
            (Ok(Ok(_)), "ready") => Ok(()),
            // Another supervisor holds the lock: use it, if it answers. Never
            // `stop` here: the pid file names the one that holds it.
            (Ok(Ok(_)), "held") => match request(id, dir, &Request::Show).await {
                Ok(_) => Ok(()),
                Err(e) => Err(unavailable(format!(
                    "a supervisor holds {LOCK_FILE} but does not answer: {e}"
                ))),
            },
            _ => {
                waited.abort();
                stop(dir);
                let log = std::fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                Err(unavailable(format!(
                    "the supervisor did not attach within {START_TIMEOUT:?}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )))
            }
        }
    }
}

/// Whether `config` lets anything out, and so needs a host to decide.
pub fn needs_host(config: &EgressConfig) -> bool {
    !matches!(config.policy, super::EgressPolicy::NoNetwork)
}

fn find_binary(agent_bin: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NAMZU_EGRESS_BIN").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let near = agent_bin.parent()?.join(BINARY);
    near.is_file().then_some(near)
}

/// Stops the supervisor of the sandbox in `dir`, if its pid file names a
/// live `namzu-egress` for it.
pub fn stop(dir: &Path) {
    let Ok(pid) = std::fs::read_to_string(dir.join(PID_FILE)) else {
        return;
    };
    let Ok(pid) = pid.trim().parse::<i32>() else { return };
    // The pid might have been reused: only our binary, for this sandbox.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let ours = String::from_utf8_lossy(&cmdline).contains(BINARY)
        && dir
            .file_name()
            .is_some_and(|id| String::from_utf8_lossy(&cmdline).contains(&*id.to_string_lossy()));
    if ours {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
}
