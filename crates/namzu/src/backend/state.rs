//! Per-sandbox state on disk, shared by the single-host tiers.
//!
//! `<state>/<tier>/<id>/` (mode 0700) holds `meta.json`, `token` (0600),
//! `agent.sock`, `agent.log` and `workspace/`, plus whatever the tier adds.
//! A sandbox outlives the process that made it; any later process finds it
//! here by id, and its agent's pid (checked against the command line, so a
//! reused pid is never signalled) says whether it is alive.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::client::{AgentClient, ClientOptions};
use crate::error::{Error, Result};
use crate::handle::SandboxBackend;
use crate::provider::Provider;
use crate::spec::{SandboxInfo, Tier};

/// How long a new agent has to start listening.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long stop waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub id: String,
    pub tier: Tier,
    /// The process that anchors the sandbox (agent or launcher).
    pub pid: u32,
    pub created_unix: u64,
    pub agent_bin: PathBuf,
    /// What the tier itself keeps (its uid slot and cgroups, its
    /// container …), opaque here: each tier reads and writes its own type
    /// with [`Meta::record`] and [`Meta::with_record`].
    #[serde(default)]
    pub record: serde_json::Value,
    /// The anchor and its descendants once the agent answered, by identity:
    /// what a dead anchor's leftovers are killed by (never by name).
    #[serde(default)]
    pub procs: Vec<crate::backend::procid::ProcId>,
    /// Set while the sandbox is suspended (when it was, Unix seconds): no
    /// process of it runs, and its directory is kept for a resume.
    #[serde(default)]
    pub suspended_unix: Option<u64>,
}

impl Meta {
    /// The tier's own record, if it holds one of type `T`.
    pub fn record<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        T::deserialize(&self.record).ok()
    }

    /// Sets the tier's own record.
    pub fn with_record<T: Serialize>(mut self, record: &T) -> Self {
        self.record = serde_json::to_value(record).unwrap_or_default();
        self
    }
}

/// The state directory of one tier.
#[derive(Debug, Clone)]
pub(crate) struct StateDir {
    root: PathBuf,
    tier: Tier,
}

impl StateDir {
    pub fn new(state_dir: impl Into<PathBuf>, tier: Tier) -> Self {
        Self {
            root: state_dir.into().join(tier.name()),
            tier,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The state directory every tier shares (this tier's is below it).
    fn base(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }

    /// The egress supervisor of sandbox `id` (state in `dir`).
    pub fn supervisor(&self, id: &str, dir: &Path, agent_bin: &Path) -> crate::egress::supervisor::Supervisor {
        crate::egress::supervisor::Supervisor::new(id, self.tier, self.base(), dir, agent_bin)
    }

    /// `connect` of the single-host tiers with an egress supervisor: the
    /// agent reached by id, its supervisor made sure of (`egress_bin`
    /// where it is not beside `agent_bin`), and a handle owned by `provider`.
    pub async fn reconnect(
        &self,
        id: &str,
        opts: &ClientOptions,
        provider: std::sync::Arc<dyn Provider>,
        agent_bin: &Path,
        egress_bin: Option<PathBuf>,
    ) -> Result<StateSandbox> {
        let (meta, client) = self.reattach(id, opts).await?;
        let dir = self.dir(id)?;
        let supervisor = self.supervisor(id, &dir, agent_bin).with_binary(egress_bin);
        supervisor.ensure().await?;
        Ok(StateSandbox {
            id: id.into(),
            tier: self.tier,
            provider,
            client,
            _child: None,
            anchor: meta.procs.first().copied(),
            egress: Some(supervisor),
            whole: None,
        })
    }

    pub fn dir(&self, id: &str) -> Result<PathBuf> {
        // Ids are ours ("sb-" + hex); anything else could walk the state dir.
        let ok = id.len() <= 64 && id.starts_with("sb-") && id[3..].bytes().all(|b| b.is_ascii_hexdigit());
        if !ok {
            return Err(Error::SandboxNotFound { id: id.into() });
        }
        Ok(self.root.join(id))
    }

    /// Makes a fresh sandbox directory with its workspace and token (a
    /// fresh random one unless the caller chose it).
    /// Returns (id, dir, token, guard that removes the directory unless kept).
    pub fn create(&self, token: Option<Vec<u8>>) -> Result<(String, PathBuf, Vec<u8>, Cleanup)> {
        const OP: &str = "create";
        let io = |source| Error::LocalIo { op: OP.into(), source };
        let (id, dir, guard) = self.create_bare()?;
        let token = token
            .unwrap_or_else(|| format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>()).into_bytes());
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("token"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, &token))
            .map_err(io)?;
        Ok((id, dir, token, guard))
    }

    /// Makes a fresh sandbox directory (mode 0700) with its workspace and
    /// nothing else. Returns (id, dir, guard that removes the directory
    /// unless kept).
    pub fn create_bare(&self) -> Result<(String, PathBuf, Cleanup)> {
        let io = |source| Error::LocalIo {
            op: "create".into(),
            source,
        };
        let id = format!("sb-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let dir = self.dir(&id)?;
        if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(io(e));
            }
            std::fs::create_dir_all(&self.root).map_err(io)?;
            std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(io)?;
        }
        let guard = Cleanup(Some(dir.clone()));
        // The mode asked for, whatever the umask took away.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        std::fs::create_dir(dir.join("workspace")).map_err(io)?;
        Ok((id, dir, guard))
    }

    /// Every process recorded for the sandboxes of this tier, by identity.
    pub fn recorded_processes(&self) -> Vec<crate::backend::procid::ProcId> {
        std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("meta.json")).ok())
            .filter_map(|raw| serde_json::from_slice::<Meta>(&raw).ok())
            .flat_map(|m| m.procs)
            .collect()
    }

    /// Records the anchor's process tree in `meta` once the agent answers.
    pub fn record_processes(&self, dir: &Path, meta: &mut Meta) -> Result<()> {
        meta.procs = crate::backend::procid::tree(meta.pid);
        self.write_meta(dir, meta)
    }

    /// Replaces `meta.json` by a rename, so a reader in any process (`list`,
    /// `gc`, an attach) sees the old record or the new one, never a
    /// truncated file; a failed write leaves the old record.
    pub fn write_meta(&self, dir: &Path, meta: &Meta) -> Result<()> {
        let json = serde_json::to_vec_pretty(meta).map_err(|e| Error::State {
            id: meta.id.clone(),
            message: e.to_string(),
        })?;
        crate::fsutil::write_replacing(&dir.join("meta.json"), &json).map_err(|source| Error::LocalIo {
            op: "create".into(),
            source,
        })
    }

    pub fn read_meta(&self, id: &str) -> Result<(PathBuf, Meta)> {
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

    /// Connects to a sandbox's agent.
    pub async fn attach(&self, dir: &Path, id: &str, opts: &ClientOptions) -> Result<AgentClient> {
        let token = std::fs::read(dir.join("token")).map_err(|e| Error::State {
            id: id.into(),
            message: format!("token: {e}"),
        })?;
        AgentClient::connect_unix(id, &dir.join("agent.sock"), token, opts.clone()).await
    }

    /// Connects to a live sandbox made earlier.
    pub async fn reattach(&self, id: &str, opts: &ClientOptions) -> Result<(Meta, AgentClient)> {
        let (dir, meta) = self.read_meta(id)?;
        if meta.suspended_unix.is_some() {
            return Err(Error::SandboxSuspended { id: id.into() });
        }
        if !alive(meta.pid, &dir) {
            return Err(Error::SandboxDead { id: id.into() });
        }
        match self.attach(&dir, id, opts).await {
            Ok(c) => Ok((meta, c)),
            Err(Error::Connect { .. }) => Err(Error::SandboxDead { id: id.into() }),
            Err(e) => Err(e),
        }
    }

    pub fn list(&self) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        let rd = match std::fs::read_dir(&self.root) {
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
                    tier: self.tier,
                    alive: alive(meta.pid, &dir),
                    created_unix: meta.created_unix,
                    suspended: meta.suspended_unix.is_some(),
                });
            }
        }
        out.sort_by(|a, b| (a.created_unix, &a.id).cmp(&(b.created_unix, &b.id)));
        Ok(out)
    }

    /// Stops the anchor process and removes the directory. Idempotent.
    /// Returns the meta it found, if any. [`Stop::Graceful`]: SIGTERM, so
    /// the agent stops its commands and syncs, then SIGKILL after
    /// [`STOP_TIMEOUT`]; [`Stop::Kill`]: SIGKILL to every process recorded
    /// for the sandbox at once, waiting on pidfds until they are gone (a
    /// tier whose sandbox lives in a pid namespace of its own, which dies
    /// with its init, and whose disk goes with it).
    pub async fn stop(&self, id: &str, how: Stop) -> Result<Option<Meta>> {
        let Some((dir, meta)) = self.halt(id, how).await? else {
            return Ok(None);
        };
        crate::backend::disk::unmount(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(Some(meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(meta)),
            Err(source) => Err(Error::LocalIo {
                op: "destroy".into(),
                source,
            }),
        }
    }

    /// Ends every process of sandbox `id` (its egress supervisor, its
    /// anchor, and whatever was recorded for it) as [`StateDir::stop`]
    /// does, keeping its directory. `None`: there is no such sandbox.
    pub async fn halt(&self, id: &str, how: Stop) -> Result<Option<(PathBuf, Meta)>> {
        let (dir, meta) = match self.read_meta(id) {
            Ok(x) => x,
            Err(Error::SandboxNotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        crate::timeline::mark("destroy.begin");
        crate::egress::supervisor::stop(&dir);
        if how == Stop::Kill && !meta.procs.is_empty() {
            crate::backend::procid::kill_and_wait(&meta.procs, STOP_TIMEOUT).await;
            crate::timeline::mark("destroy.anchor-exited");
        }
        if alive(meta.pid, &dir) {
            let pid = Pid::from_raw(i32::try_from(meta.pid).unwrap_or(0));
            // SIGTERM lets the agent kill its commands' process groups first.
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while alive(meta.pid, &dir) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if alive(meta.pid, &dir) {
                tracing::warn!(%id, "sandbox ignored SIGTERM; killing it");
                let _ = kill(pid, Signal::SIGKILL);
            }
            crate::timeline::mark("destroy.anchor-exited");
        }
        // An anchor killed behind namzu's back leaves the sandbox's own
        // processes orphaned, still running: those recorded at create are
        // killed by identity (on local, the init takes its pid namespace).
        let found = crate::backend::procid::kill_all(&meta.procs).await;
        crate::timeline::mark("destroy.leftovers-killed");
        if found > 0 {
            tracing::warn!(%id, found, "killed processes left behind by a dead anchor");
        }
        Ok(Some((dir, meta)))
    }
}

/// How [`StateDir::stop`] ends a sandbox's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGTERM to the anchor, SIGKILL after a timeout.
    Graceful,
    /// SIGKILL to every recorded process at once.
    Kill,
}

/// `gc` of the single-host tiers that claim host id ranges: destroys every
/// sandbox of `p` whose anchor is dead (a suspended one is not dead), then releases the claims whose
/// sandbox directory is gone (a host that died mid-create).
pub(crate) async fn gc_dead(p: &dyn Provider, state: &StateDir) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for s in state.list()? {
        if !s.alive && !s.suspended {
            p.destroy(&s.id).await?;
            removed.push(s.id);
        }
    }
    let base = state.base().to_path_buf();
    crate::backend::uid_slots::UidSlots::new(base.join("local/.uids"))
        .sweep(|owner| crate::backend::uid_slots::claim_owner_exists(&base, owner));
    Ok(removed)
}

/// True if `pid` is a live (not zombie) process whose command line names
/// `dir` — ours, not an unrelated process that reused the pid.
pub(crate) fn alive(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = dir.as_os_str().as_encoded_bytes();
    let ours = cmdline.windows(needle.len()).any(|w| w == needle);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true);
    ours && !zombie
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Starts the process that anchors a sandbox, detached from the caller: no
/// stdin or stdout, stderr to `agent.log`, and its own process group, so a
/// Ctrl-C aimed at the CLI never reaches a sandbox meant to outlive it.
pub(crate) fn spawn_anchor(
    mut cmd: tokio::process::Command,
    dir: &Path,
    id: &str,
    agent_bin: &Path,
) -> Result<tokio::process::Child> {
    let log = std::fs::File::create(dir.join("agent.log")).map_err(|source| Error::LocalIo {
        op: "create".into(),
        source,
    })?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    cmd.spawn().map_err(|e| Error::AgentStart {
        id: id.into(),
        reason: format!("{}: {e}", agent_bin.display()),
    })
}

/// A started sandbox not yet handed out: dropped armed (its create
/// abandoned, as when the runtime shuts down under it), it SIGKILLs
/// the launcher's whole process group — the launcher, its namespace child
/// and the sandbox's init, which [`spawn_anchor`] put in one group and
/// which never leave it (only commands, inside the sandbox, start
/// sessions). The group's id is the launcher's pid, which no other process
/// can take while the launcher's `Child` is unreaped: hold this no longer
/// than that `Child`.
pub(crate) struct Unanswered(Option<nix::unistd::Pid>);

impl Unanswered {
    /// The guard of `child`'s group; with `armed` false, one that never
    /// fires.
    pub fn new(child: &tokio::process::Child, armed: bool) -> Self {
        let group = child.id().and_then(|p| i32::try_from(p).ok());
        Self(group.filter(|_| armed).map(nix::unistd::Pid::from_raw))
    }
}

impl crate::backend::detached::Disarm for Unanswered {
    /// The sandbox was handed out, or an error path killed it already.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            tracing::debug!(
                group = group.as_raw(),
                "start abandoned: killing the launcher's process group"
            );
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Waits until the agent in `dir` accepts a link, or `child` exits (then the
/// agent's log explains why), or the start timeout passes.
pub(crate) async fn wait_for_agent(
    state: &StateDir,
    dir: &Path,
    id: &str,
    child: &mut tokio::process::Child,
    opts: &ClientOptions,
) -> Result<AgentClient> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
            return Err(Error::AgentStart {
                id: id.into(),
                reason: format!("exited with {status}: {}", log.trim()),
            });
        }
        match state.attach(dir, id, opts).await {
            Ok(c) => return Ok(c),
            Err(Error::Connect { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(1)).await
            }
            Err(e) => {
                let _ = child.start_kill();
                return Err(e);
            }
        }
    }
}

/// Removes a half-made sandbox directory unless told to keep it.
pub(crate) struct Cleanup(Option<PathBuf>);

impl Cleanup {
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            crate::backend::disk::unmount(&d);
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A live sandbox of a state-directory tier: its link, and the provider
/// that destroys it.
pub(crate) struct StateSandbox {
    pub id: String,
    pub tier: Tier,
    pub provider: std::sync::Arc<dyn Provider>,
    pub client: AgentClient,
    /// Held so tokio reaps the anchor process when it exits while we live.
    pub _child: Option<tokio::process::Child>,
    /// The anchor process by identity, where it was recorded: whether it
    /// runs is [`SandboxBackend::alive`].
    pub anchor: Option<crate::backend::procid::ProcId>,
    /// The sandbox's egress supervisor (started when its policy needs
    /// one); `None` on tiers without an egress boundary.
    pub egress: Option<crate::egress::supervisor::Supervisor>,
    /// Where the tier pauses the whole sandbox itself (a VM's vCPUs);
    /// `None`: its agent pauses the processes.
    pub whole: Option<std::sync::Arc<dyn WholePause>>,
}

/// A pause of the whole sandbox, by its tier instead of its agent.
#[async_trait::async_trait]
pub(crate) trait WholePause: Send + Sync {
    async fn pause(&self) -> Result<crate::types::PauseReport>;
    async fn resume(&self) -> Result<crate::types::ResumeReport>;
    fn is_paused(&self) -> bool;
}

impl StateSandbox {
    fn egress(&self) -> Result<&crate::egress::supervisor::Supervisor> {
        self.egress
            .as_ref()
            .ok_or_else(|| crate::egress::no_boundary(self.tier))
    }
}

#[async_trait::async_trait]
impl SandboxBackend for StateSandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn tier(&self) -> Tier {
        self.tier
    }
    fn agent(&self) -> &AgentClient {
        &self.client
    }
    async fn destroy(&self) -> Result<()> {
        self.client.close();
        self.provider.destroy(&self.id).await
    }
    async fn suspend(&self) -> Result<()> {
        self.provider.suspend(&self.id).await?;
        self.client.close();
        Ok(())
    }
    fn alive(&self) -> Option<bool> {
        self.anchor.map(|p| p.is_live())
    }
    async fn pause(&self) -> Result<crate::types::PauseReport> {
        match &self.whole {
            Some(w) => w.pause().await,
            None => self.client.pause().await,
        }
    }
    async fn resume(&self) -> Result<crate::types::ResumeReport> {
        match &self.whole {
            Some(w) => w.resume().await,
            None => self.client.resume().await,
        }
    }
    async fn is_paused(&self) -> Result<bool> {
        match &self.whole {
            Some(w) => Ok(w.is_paused()),
            None => Ok(self.client.health().await?.paused),
        }
    }
    async fn set_network_policy(&self, policy: crate::egress::EgressPolicy) -> Result<()> {
        let supervisor = self.egress()?;
        policy.validate()?;
        let mut config = supervisor.show().await?.config.unwrap_or_default();
        config.policy = policy;
        match supervisor.set(&config).await?.error {
            None => Ok(()),
            Some(reason) => Err(Error::EgressUnavailable {
                id: self.id.clone(),
                reason,
            }),
        }
    }
    async fn network_policy(&self) -> Result<(crate::egress::EgressConfig, usize)> {
        let reply = self.egress()?.show().await?;
        Ok((reply.config.unwrap_or_default(), reply.open))
    }
    async fn egress_decisions(&self) -> Result<crate::egress::Decisions> {
        let mut decisions = self.egress()?.show().await?.decisions;
        // What the agent refused by itself, with no supervisor on its call.
        decisions.refused += self.client.health().await?.egress_refused_unattended;
        Ok(decisions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record read while another thread rewrites it is always whole.
    #[test]
    fn a_record_read_during_a_rewrite_is_whole() {
        let root = tempfile::tempdir().unwrap();
        let state = StateDir::new(root.path(), Tier::Local);
        let (id, dir, guard) = state.create_bare().unwrap();
        let meta = |pid: u32| Meta {
            id: id.clone(),
            tier: Tier::Local,
            pid,
            created_unix: 0,
            agent_bin: "/x".repeat(4000).into(),
            record: serde_json::Value::Null,
            procs: Vec::new(),
            suspended_unix: None,
        };
        state.write_meta(&dir, &meta(1)).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (state, dir, stop, m) = (state.clone(), dir.clone(), stop.clone(), meta(2));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    state.write_meta(&dir, &m).unwrap();
                }
            })
        };
        let mut bad = 0;
        for _ in 0..5000 {
            if state.read_meta(&id).is_err() {
                bad += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(bad, 0, "reads that saw a partial or missing record");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with(".meta.json"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        drop(guard);
    }
}
