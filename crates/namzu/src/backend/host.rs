//! The `host` tier: the agent runs as a plain child process of the host.
//!
//! **This isolates nothing.** Commands run as the calling user with the
//! host's filesystem, network and processes in view. Only file operations
//! are confined (to the sandbox's workspace directory, by the agent's path
//! jail). It exists to develop and test the spine; use `local` or stronger
//! for anything untrusted.
//!
//! State, per sandbox, under `<state>/host/<id>/` (mode 0700): `meta.json`,
//! `token` (0600), `agent.sock`, `agent.log`, and `workspace/` — the agent's
//! jail root and default working directory. Sandboxes outlive the process
//! that made them; any later process can [`Provider::connect`] by id.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::backend::{check_spec, find_agent_binary};
use crate::client::{AgentClient, ClientOptions};
use crate::error::{Error, Result};
use crate::sandbox::{Provider, Sandbox, SandboxInfo, SandboxSpec, Tier};

/// How long a new agent has to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long destroy waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(8);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    id: String,
    tier: String,
    pid: u32,
    created_unix: u64,
    agent_bin: PathBuf,
}

/// Makes `host`-tier sandboxes. See the module docs: no isolation.
#[derive(Debug, Clone)]
pub struct HostProvider {
    state_dir: PathBuf,
    agent_bin: PathBuf,
    client: ClientOptions,
}

impl HostProvider {
    /// Uses `state_dir` (its `host/` subdirectory) and finds the agent with
    /// [`find_agent_binary`].
    pub fn new(state_dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self::with_agent(state_dir, find_agent_binary()?))
    }

    pub fn with_agent(state_dir: impl Into<PathBuf>, agent_bin: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into().join("host"),
            agent_bin: agent_bin.into(),
            client: ClientOptions::default(),
        }
    }

    fn dir(&self, id: &str) -> Result<PathBuf> {
        // Ids are ours ("sb-" + hex); anything else could walk the state dir.
        let ok = id.len() <= 64 && id.starts_with("sb-") && id[3..].bytes().all(|b| b.is_ascii_hexdigit());
        if !ok {
            return Err(Error::SandboxNotFound { id: id.into() });
        }
        Ok(self.state_dir.join(id))
    }

    fn read_meta(&self, id: &str) -> Result<(PathBuf, Meta)> {
        let dir = self.dir(id)?;
        let raw = match std::fs::read(dir.join("meta.json")) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::SandboxNotFound { id: id.into() }),
            Err(e) => {
                return Err(Error::State {
                    id: id.into(),
                    message: e.to_string(),
                })
            }
        };
        let meta = serde_json::from_slice(&raw).map_err(|e| Error::State {
            id: id.into(),
            message: e.to_string(),
        })?;
        Ok((dir, meta))
    }

    async fn attach(&self, dir: &Path, meta: &Meta) -> Result<AgentClient> {
        let token = std::fs::read(dir.join("token")).map_err(|e| Error::State {
            id: meta.id.clone(),
            message: format!("token: {e}"),
        })?;
        AgentClient::connect_unix(&meta.id, &dir.join("agent.sock"), token, self.client.clone()).await
    }
}

/// True if `pid` is a live (not zombie) agent serving `dir`'s socket. Guards
/// against signalling an unrelated process that reused the pid.
fn agent_alive(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let sock = dir.join("agent.sock");
    let sock = sock.as_os_str().as_encoded_bytes();
    let ours = cmdline.windows(sock.len()).any(|w| w == sock);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true);
    ours && !zombie
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io(op: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::LocalIo { op: op.into(), source }
}

#[async_trait]
impl Provider for HostProvider {
    fn tier(&self) -> Tier {
        Tier::Host
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Box<dyn Sandbox>> {
        const OP: &str = "create";
        check_spec(Tier::Host, &spec)?;
        let id = format!("sb-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let dir = self.dir(&id)?;
        std::fs::create_dir_all(&self.state_dir).map_err(io(OP))?;
        std::fs::create_dir(&dir).map_err(io(OP))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io(OP))?;
        let made = Cleanup(Some(dir.clone()));
        let workspace = dir.join("workspace");
        std::fs::create_dir(&workspace).map_err(io(OP))?;
        let token = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("token"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, token.as_bytes()))
            .map_err(io(OP))?;
        let log = std::fs::File::create(dir.join("agent.log")).map_err(io(OP))?;

        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        cmd.arg("--listen")
            .arg(format!("unix:{}", dir.join("agent.sock").display()))
            .arg("--token-file")
            .arg(dir.join("token"))
            .arg("--root")
            .arg(&workspace)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", &workspace)
            .env("LANG", "C.UTF-8")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(
                spec.limits
                    .iter()
                    .map(|(k, v)| (format!("NAMZU_{}", k.to_ascii_uppercase()), v.to_string())),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            // Its own process group: a Ctrl-C aimed at the CLI must not
            // reach a sandbox that is meant to outlive it.
            .process_group(0)
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(|e| Error::AgentStart {
            id: id.clone(),
            reason: format!("{}: {e}", self.agent_bin.display()),
        })?;
        let pid = child.id().unwrap_or(0);
        let meta = Meta {
            id: id.clone(),
            tier: Tier::Host.name().into(),
            pid,
            created_unix: now_unix(),
            agent_bin: self.agent_bin.clone(),
        };
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| Error::State {
            id: id.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(dir.join("meta.json"), json).map_err(io(OP))?;

        let deadline = Instant::now() + START_TIMEOUT;
        let client = loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
                return Err(Error::AgentStart {
                    id,
                    reason: format!("agent exited with {status}: {}", log.trim()),
                });
            }
            match self.attach(&dir, &meta).await {
                Ok(c) => break c,
                Err(Error::Connect { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => {
                    let _ = child.start_kill();
                    return Err(e);
                }
            }
        };
        made.keep();
        tracing::warn!(%id, "host-tier sandbox created: NOTHING is isolated");
        Ok(Box::new(HostSandbox {
            id,
            provider: self.clone(),
            client,
            _child: Some(child),
        }))
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let (dir, meta) = self.read_meta(id)?;
        if !agent_alive(meta.pid, &dir) {
            return Err(Error::SandboxDead { id: id.into() });
        }
        let client = match self.attach(&dir, &meta).await {
            Ok(c) => c,
            Err(Error::Connect { .. }) => return Err(Error::SandboxDead { id: id.into() }),
            Err(e) => return Err(e),
        };
        Ok(Box::new(HostSandbox {
            id: id.into(),
            provider: self.clone(),
            client,
            _child: None,
        }))
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(&self.state_dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => {
                return Err(Error::LocalIo {
                    op: "list".into(),
                    source,
                })
            }
        };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if let Ok((dir, meta)) = self.read_meta(&name) {
                out.push(SandboxInfo {
                    id: meta.id.clone(),
                    tier: Tier::Host,
                    alive: agent_alive(meta.pid, &dir),
                    created_unix: meta.created_unix,
                });
            }
        }
        out.sort_by(|a, b| (a.created_unix, &a.id).cmp(&(b.created_unix, &b.id)));
        Ok(out)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let (dir, meta) = match self.read_meta(id) {
            Ok(x) => x,
            Err(Error::SandboxNotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if agent_alive(meta.pid, &dir) {
            let pid = Pid::from_raw(i32::try_from(meta.pid).unwrap_or(0));
            // SIGTERM lets the agent kill its commands' process groups first.
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while agent_alive(meta.pid, &dir) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if agent_alive(meta.pid, &dir) {
                tracing::warn!(%id, "agent ignored SIGTERM; killing it");
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::LocalIo {
                op: "destroy".into(),
                source,
            }),
        }
    }
}

/// Removes a half-made sandbox directory unless told to keep it.
struct Cleanup(Option<PathBuf>);
impl Cleanup {
    fn keep(mut self) {
        self.0 = None;
    }
}
impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

struct HostSandbox {
    id: String,
    provider: HostProvider,
    client: AgentClient,
    /// Held so tokio reaps the agent when it exits while we are alive.
    _child: Option<tokio::process::Child>,
}

#[async_trait]
impl Sandbox for HostSandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn tier(&self) -> Tier {
        Tier::Host
    }
    fn agent(&self) -> &AgentClient {
        &self.client
    }
    async fn destroy(&self) -> Result<()> {
        self.client.close();
        self.provider.destroy(&self.id).await
    }
}
