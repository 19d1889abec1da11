//! The `local` tier: a daemonless Linux-namespace sandbox.
//!
//! `create` writes a launch spec and starts `namzu-agent --launch`, which
//! builds the sandbox (user, mount, pid, ipc, uts, net and cgroup
//! namespaces; a read-only view of the host's /usr and friends; a fresh
//! masked /proc; a minimal /dev; `/workspace` read-write) and serves inside
//! it as PID 1, with no_new_privs, no capabilities, a seccomp filter and a
//! landlock ruleset inherited by every command. See `namzu_agent::sandbox`.
//!
//! Sandbox root is never host root: when the host process is root, each
//! sandbox gets its own range of 65536 unprivileged host ids (from
//! [`UID_BASE`]); otherwise the caller's own uid is mapped alone (root
//! inside, the caller outside).
//!
//! Before a sandbox is handed out, a privilege probe reads a command's
//! `/proc/self/status` and refuses the sandbox ([`Error::PrivilegeProbe`])
//! unless all five capability sets are empty, no_new_privs is set and a
//! seccomp filter is on.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use namzu_proto::launch::{IdMap, LaunchSpec, Rlimit};

use crate::backend::detached::Disarm;
use crate::backend::state::{now_unix, spawn_anchor, wait_for_agent, Meta, StateDir, StateSandbox, Unanswered};
use crate::backend::{check_spec, find_agent_binary, privilege_probe, procid};
use crate::client::ClientOptions;
use crate::error::{Error, Result};
use crate::handle::{Sandbox, SandboxBackend};
use crate::provider::Provider;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};

use crate::backend::uid_slots::{UidSlots, UID_SLOTS};

mod once;
mod suspend;
pub use crate::backend::uid_slots::{UID_BASE, UID_RANGE};
pub use once::{OnceCleanup, OnceIo, OnceOutcome, OnceRequest};

/// Where the launchers keep the shared copies of the curated host /etc
/// (beneath the tier's state directory; see `namzu_agent::sandbox::etc`).
pub const ETC_CACHE: &str = ".etc";

/// The file in a sandbox's directory where its launcher writes the
/// identities of the sandbox's processes (`LaunchSpec::procs_file`).
const PROCS_FILE: &str = "procs";

/// What the local tier keeps in a sandbox's state record.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct LocalRecord {
    /// The host uid range slot this sandbox holds, if any.
    uid_slot: Option<u32>,
    /// The cgroups made for it, removed with it (and at suspend).
    cgroups: Option<crate::backend::cgroup::Cgroups>,
    /// What it was made of, to start it again after a suspend.
    #[serde(default)]
    spec: Option<SandboxSpec>,
}

/// Where a start comes from: a create, or a resume of a suspended sandbox.
struct Origin {
    /// What a suspend saved, to put back.
    restore: Option<PathBuf>,
    /// When the sandbox was first made (Unix seconds).
    begun: u64,
    /// Whether a start abandoned before its sandbox is handed out kills
    /// it (a create's: nothing of it is worth keeping), or leaves it
    /// running (a resume's: killed, its record would say running with no
    /// process, which `gc` takes for dead and removes with its disk).
    kill_if_abandoned: bool,
}

/// Tunables of the `local` tier, each with a safe default.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Size of each writable tmpfs (/tmp, /run, /home, /root, /dev/shm).
    pub tmpfs_bytes: u64,
    /// Largest file any process may write (RLIMIT_FSIZE).
    pub max_file_bytes: u64,
    /// Open files per process (RLIMIT_NOFILE), capped by the host's limit.
    pub max_open_files: u64,
    /// Processes in the sandbox (RLIMIT_NPROC, counted per user namespace).
    pub max_processes: u64,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            tmpfs_bytes: 256 << 20,
            max_file_bytes: 16 << 30,
            max_open_files: 65_536,
            max_processes: 2048,
        }
    }
}

/// Makes local sandboxes: Linux namespaces, seccomp and landlock, no daemon.
#[derive(Debug, Clone)]
pub struct LocalProvider {
    state: StateDir,
    images: crate::image::ImageStore,
    agent_bin: PathBuf,
    /// The egress supervisor, where it is not beside the agent.
    egress_bin: Option<PathBuf>,
    /// Mutual TLS on the agent's TCP port (a simulated pod's link).
    tcp_tls: Option<namzu_proto::link_tls::ServerFiles>,
    client: ClientOptions,
    opts: LocalOptions,
}

impl LocalProvider {
    /// A provider with its state in `state_dir`, the agent found with [`find_agent_binary`].
    pub fn new(state_dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self::with_agent(state_dir, find_agent_binary()?))
    }

    /// A provider using this agent binary.
    pub fn with_agent(state_dir: impl Into<PathBuf>, agent_bin: impl Into<PathBuf>) -> Self {
        let state_dir = state_dir.into();
        Self {
            images: crate::image::ImageStore::new(&state_dir),
            state: StateDir::new(state_dir, Tier::Local),
            agent_bin: agent_bin.into(),
            egress_bin: None,
            tcp_tls: None,
            client: ClientOptions::default(),
            opts: LocalOptions::default(),
        }
    }

    /// Uses this egress supervisor binary (`namzu-egress`) instead of the
    /// one beside the agent: for an agent that lives apart from the host's
    /// binaries (the simulated kubelet's pods run the agent their init
    /// container installed).
    pub fn with_egress_bin(mut self, egress_bin: impl Into<PathBuf>) -> Self {
        self.egress_bin = Some(egress_bin.into());
        self
    }

    /// Serves the TCP port of [`LocalProvider::create_with`] with mutual
    /// TLS from these files (a simulated pod's link); the host's own
    /// socket stays as it is.
    pub fn with_tcp_tls(mut self, files: Option<namzu_proto::link_tls::ServerFiles>) -> Self {
        self.tcp_tls = files;
        self
    }

    /// How `--image` references missing from the cache are pulled.
    pub fn pull_options(mut self, opts: crate::image::PullOptions) -> Self {
        self.images = self.images.with_pull_options(opts);
        self
    }

    /// Replaces the tier's options.
    pub fn options(mut self, opts: LocalOptions) -> Self {
        self.opts = opts;
        self
    }

    fn slots(&self) -> UidSlots {
        UidSlots::new(self.state.root().join(".uids"))
    }

    /// Claims a free id range (see [`UidSlots`]).
    fn claim_slot(&self, id: &str) -> Result<u32> {
        match self.slots().claim(id) {
            Ok(Some(slot)) => Ok(slot),
            Ok(None) => Err(Error::LimitExceeded {
                op: "create".into(),
                limit: "uid_slots".into(),
                value: u64::from(UID_SLOTS),
                path: None,
            }),
            Err(source) => Err(Error::LocalIo {
                op: "create".into(),
                source,
            }),
        }
    }

    fn release_slot(&self, slot: u32, id: &str) {
        self.slots().release(slot, id);
    }
}

impl LocalProvider {
    /// Writes the launch spec, starts the launcher and waits for the agent.
    async fn start(
        &self,
        id: &str,
        dir: &Path,
        spec: &SandboxSpec,
        slot: Option<u32>,
        tcp_listen: Option<String>,
        origin: Origin,
    ) -> Result<(StateSandbox, Unanswered)> {
        let Origin {
            restore,
            begun,
            kill_if_abandoned,
        } = origin;
        let (mut launch, cgroups) = self.launch_spec(id, dir, spec, slot, tcp_listen)?;
        launch.restore = restore.as_deref().map(path_string);
        let record = LocalRecord {
            uid_slot: slot,
            cgroups: cgroups.clone(),
            spec: Some(spec.clone()),
        };
        let started = self.launch(id, dir, &launch, record, begun, kill_if_abandoned).await;
        if started.is_err() {
            if let Some(cg) = &cgroups {
                cg.remove();
            }
        }
        started
    }

    /// The launch spec of sandbox `id` (its directory `dir`, its id range
    /// `slot`), with the cgroups made for its limits; the workspace given
    /// to the sandbox's root.
    fn launch_spec(
        &self,
        id: &str,
        dir: &Path,
        spec: &SandboxSpec,
        slot: Option<u32>,
        tcp_listen: Option<String>,
    ) -> Result<(LaunchSpec, Option<crate::backend::cgroup::Cgroups>)> {
        const OP: &str = "create";
        let workspace = dir.join("workspace");
        let (uid_map, gid_map, deny_setgroups, map_helpers) = match slot {
            Some(slot) => {
                let base = UidSlots::base(slot);
                // The sandbox's root owns its workspace; nothing else of the host.
                nix::unistd::chown(
                    &workspace,
                    Some(nix::unistd::Uid::from_raw(base)),
                    Some(nix::unistd::Gid::from_raw(base)),
                )
                .map_err(|e| Error::LocalIo {
                    op: OP.into(),
                    source: e.into(),
                })?;
                let m = vec![IdMap {
                    inside: 0,
                    outside: base,
                    count: UID_RANGE,
                }];
                (m.clone(), m, false, None)
            }
            None => ordinary_user_maps(),
        };
        // An image's own environment (its config's `Env`) under the spec's.
        let mut env = Vec::new();
        let rootfs = match &spec.image {
            Some(reference) => {
                let rootfs = self.images.resolve(reference)?;
                env = crate::image::ImageStore::runtime_config(&rootfs).env;
                Some(path_string(&rootfs))
            }
            None => None,
        };
        for (k, v) in &spec.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let (_, hard_nofile) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_err(|e| Error::LocalIo {
                op: OP.into(),
                source: e.into(),
            })?;
        let mut launch = LaunchSpec {
            id: id.into(),
            socket: path_string(&dir.join("agent.sock")),
            token_file: path_string(&dir.join("token")),
            workspace: path_string(&workspace),
            rootfs,
            binds: spec
                .binds
                .iter()
                .map(|b| namzu_proto::launch::BindSpec {
                    source: path_string(&b.source),
                    target: path_string(&b.target),
                    writable: b.writable,
                })
                .collect(),
            uid_map,
            gid_map,
            deny_setgroups,
            map_helpers,
            hostname: "namzu".into(),
            env,
            rlimits: vec![
                Rlimit::Nofile(self.opts.max_open_files.min(hard_nofile)),
                Rlimit::Fsize(self.opts.max_file_bytes),
                Rlimit::Core(0),
                Rlimit::Nproc(self.opts.max_processes),
            ],
            tmpfs_bytes: self.opts.tmpfs_bytes,
            limits: spec.limits.clone(),
            cgroup_procs: Vec::new(),
            notes: Vec::new(),
            tcp_tls: tcp_listen.as_ref().and(self.tcp_tls.clone()),
            tcp_listen,
            etc_cache: Some(path_string(&self.state.root().join(ETC_CACHE))),
            restore: None,
            procs_file: Some(path_string(&dir.join(PROCS_FILE))),
        };
        let cgroups = crate::backend::cgroup::create(id, &spec.resources)?;
        crate::timeline::mark("create.cgroups");
        if let Some(cg) = &cgroups {
            launch.cgroup_procs = cg.procs_files().iter().map(|p| path_string(p)).collect();
            launch.notes.push(("cgroups".into(), cg.report.clone()));
        }
        Ok((launch, cgroups))
    }

    /// Starts the launcher on a written-out spec and waits for the agent.
    async fn launch(
        &self,
        id: &str,
        dir: &Path,
        launch: &LaunchSpec,
        record: LocalRecord,
        begun: u64,
        kill_if_abandoned: bool,
    ) -> Result<(StateSandbox, Unanswered)> {
        const OP: &str = "create";
        let json = serde_json::to_vec_pretty(launch).map_err(|e| Error::State {
            id: id.into(),
            message: e.to_string(),
        })?;
        std::fs::write(dir.join("spec.json"), json).map_err(io(OP))?;
        // A resume launches again in the same directory: the last launch's
        // identities must not stand in for this one's.
        match std::fs::remove_file(dir.join(PROCS_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(OP)(e)),
            _ => {}
        }
        crate::timeline::mark("create.spec-written");
        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        cmd.arg("--launch")
            .arg(dir.join("spec.json"))
            .env_clear()
            .envs(std::env::var("NAMZU_AGENT_LOG").ok().map(|v| ("NAMZU_AGENT_LOG", v)));
        let mut child = spawn_anchor(cmd, dir, id, &self.agent_bin)?;
        let unanswered = Unanswered::new(&child, kill_if_abandoned);
        crate::timeline::mark("create.launcher-spawned");
        let mut meta = Meta {
            id: id.into(),
            tier: Tier::Local,
            pid: child.id().unwrap_or(0),
            created_unix: begun,
            agent_bin: self.agent_bin.clone(),
            record: serde_json::Value::Null,
            procs: Vec::new(),
            suspended_unix: None,
        }
        .with_record(&record);
        self.state.write_meta(dir, &meta)?;
        // The privilege probe rides the connect's Health.
        let opts = ClientOptions {
            probe_child: true,
            ..self.client.clone()
        };
        let attached = match wait_for_agent(&self.state, dir, id, &mut child, &opts).await {
            Ok(client) => {
                crate::timeline::replay(&client.info().startup);
                // As the launcher wrote them while the init built the
                // sandbox; from /proc where it did not.
                meta.procs =
                    procid::from_launcher(&dir.join(PROCS_FILE), meta.pid).unwrap_or_else(|| procid::tree(meta.pid));
                let recorded = self.state.write_meta(dir, &meta).map(|()| client);
                crate::timeline::mark("create.processes-recorded");
                recorded
            }
            Err(e) => Err(e),
        };
        match attached {
            Ok(client) => Ok((
                StateSandbox {
                    id: id.into(),
                    tier: Tier::Local,
                    provider: std::sync::Arc::new(self.clone()),
                    client,
                    _child: Some(child),
                    anchor: meta.procs.first().copied(),
                    egress: Some(
                        self.state
                            .supervisor(id, dir, &self.agent_bin)
                            .with_binary(self.egress_bin.clone()),
                    ),
                    whole: None,
                },
                unanswered,
            )),
            Err(e) => {
                unanswered.disarm();
                // The launcher's descendants first: the sandbox's init
                // would outlive a launcher killed alone.
                crate::backend::procid::kill_all(&crate::backend::procid::tree(meta.pid)).await;
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(e)
            }
        }
    }
}

fn io(op: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::LocalIo { op: op.into(), source }
}

impl LocalProvider {
    /// Runs one command in a fresh sandbox of `spec` and removes the
    /// sandbox (its processes, workspace, id range and cgroups) once the
    /// command has ended, however it ends.
    ///
    /// The sandbox is the tier's in every respect a command sees (the same
    /// namespaces, id range, root filesystem, limits and defences, checked
    /// by the same privilege probe before the command starts), but no
    /// agent serves in it: nothing listens inside, nothing may leave, and
    /// the command's output goes straight to `io`'s writers.
    ///
    /// The calling process must have no other thread (the sandbox is
    /// forked from it): call it before any runtime starts. Refused with
    /// [`Error::InvalidArgument`] otherwise, and with
    /// [`Error::OptionRefused`] for what needs an agent: an egress policy
    /// other than `NoNetwork`, agent `limits`, a TCP link.
    pub fn run_once(&self, spec: SandboxSpec, req: OnceRequest, io: OnceIo<'_>) -> Result<OnceOutcome> {
        const OP: &str = "run_once";
        crate::timeline::mark("create.begin");
        check_spec(Tier::Local, &spec)?;
        let refuse = |option: &str, reason: &str| Error::OptionRefused {
            tier: Tier::Local,
            option: option.into(),
            reason: reason.into(),
        };
        if spec.egress != crate::egress::EgressConfig::default() {
            return Err(refuse(
                "egress",
                "a one-command sandbox has no egress supervisor; create a sandbox to let anything leave",
            ));
        }
        if !spec.limits.is_empty() {
            return Err(refuse(
                "limits",
                "agent limits apply to a served sandbox; none serves here",
            ));
        }
        if self.tcp_tls.is_some() {
            return Err(refuse("tcp_tls", "a one-command sandbox listens on nothing"));
        }
        if spec.resources.disk_bytes.is_some() {
            return Err(refuse(
                "resources.disk_bytes",
                "a one-command sandbox's workspace goes with it; create a sandbox for a disk of its own",
            ));
        }
        if req.command.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP.into(),
                message: "no command given".into(),
            });
        }
        if once::threads() != Some(1) {
            return Err(Error::InvalidArgument {
                op: OP.into(),
                message: "the calling process has other threads; run_once forks, so call it before any start".into(),
            });
        }
        let (id, dir, made) = self.state.create_bare()?;
        let lock = once::hold_lock(&dir)?;
        crate::timeline::mark("create.state-dir");
        let slot = match nix::unistd::geteuid().is_root() {
            true => Some((self.slots(), self.claim_slot(&id)?)),
            false => None,
        };
        made.keep();
        let mut leftovers = once::Leftovers {
            id: id.clone(),
            dir: dir.clone(),
            _lock: lock,
            armed: true,
            slot,
            cgroups: None,
        };
        crate::timeline::mark("create.uid-slot");
        let (launch, cgroups) = self.launch_spec(&id, &dir, &spec, leftovers.slot.as_ref().map(|(_, s)| *s), None)?;
        leftovers.cgroups = cgroups;
        once::execute(&launch, leftovers, req, io)
    }

    /// Every process recorded for this provider's sandboxes, by identity:
    /// what a caller that must leave none behind (a test harness that
    /// panicked) kills.
    pub fn recorded_processes(&self) -> Vec<crate::backend::procid::ProcId> {
        self.state.recorded_processes()
    }

    /// Creates a sandbox whose agent takes `token` as its bind token (a
    /// fresh random one if `None`) and, with `tcp_listen`, also serves on
    /// TCP at that address inside the sandbox's own network namespace: how
    /// a caller that names the token and the port elsewhere — the
    /// Kubernetes control-plane simulator's pods, whose token is their uid
    /// and whose agent port is 1024 — starts one. The sandbox's network
    /// stays loopback-only until the caller gives it more.
    pub async fn create_with(
        &self,
        spec: SandboxSpec,
        token: Option<Vec<u8>>,
        tcp_listen: Option<String>,
    ) -> Result<Sandbox> {
        // Dropped half way, a create leaves nothing (see `detached`).
        let this = self.clone();
        crate::backend::detached::finish(async move { this.create_owned(spec, token, tcp_listen).await }).await
    }

    /// The create itself: the sandbox, and what kills it if it is never
    /// handed out.
    async fn create_owned(
        &self,
        spec: SandboxSpec,
        token: Option<Vec<u8>>,
        tcp_listen: Option<String>,
    ) -> Result<(Sandbox, Unanswered)> {
        crate::timeline::mark("create.begin");
        check_spec(Tier::Local, &spec)?;
        if self.tcp_tls.is_some() && tcp_listen.is_none() {
            return Err(Error::OptionRefused {
                tier: Tier::Local,
                option: "tcp_tls".into(),
                reason: "TLS is served on the agent's TCP port, and none was asked for".into(),
            });
        }
        if let Some(bytes) = spec.resources.disk_bytes {
            crate::backend::disk::check(Tier::Local, bytes)?;
        }
        if let Some(reference) = &spec.image {
            // Pulled (as the store's policy says) before any state exists.
            self.images.ensure(reference, &|_| {}).await?;
        }
        let (id, dir, _token, made) = self.state.create(token)?;
        crate::timeline::mark("create.state-dir");
        let euid = nix::unistd::geteuid().as_raw();
        let slot = if euid == 0 { Some(self.claim_slot(&id)?) } else { None };
        crate::timeline::mark("create.uid-slot");
        let release = |e: Error| {
            if let Some(s) = slot {
                self.release_slot(s, &id);
            }
            e
        };
        if let Some(bytes) = spec.resources.disk_bytes {
            // `check` saw to root, so there is a slot: the disk is its root's.
            let owner = slot.map_or(euid, UidSlots::base);
            crate::backend::disk::make(&dir, bytes, owner).map_err(release)?;
            crate::timeline::mark("create.disk");
        }
        let (sandbox, unanswered) = self
            .start(
                &id,
                &dir,
                &spec,
                slot,
                tcp_listen,
                Origin {
                    restore: None,
                    begun: now_unix(),
                    kill_if_abandoned: true,
                },
            )
            .await
            .map_err(release)?;
        made.keep();
        if let Err(e) = self.arm(&id, &dir, &sandbox, &spec.egress).await {
            let _ = sandbox.destroy().await;
            unanswered.disarm();
            return Err(e);
        }
        Ok((Sandbox::new(sandbox), unanswered))
    }

    /// What stands between a started sandbox and its handle: the
    /// privilege probe (a sandbox whose commands hold any privilege is
    /// never handed out) and its egress policy put in force.
    async fn arm(
        &self,
        id: &str,
        dir: &Path,
        sandbox: &StateSandbox,
        egress: &crate::egress::EgressConfig,
    ) -> Result<()> {
        privilege_probe(id, &sandbox.client).await?;
        crate::timeline::mark("create.privilege-probe");
        self.state
            .supervisor(id, dir, &self.agent_bin)
            .with_binary(self.egress_bin.clone())
            .start(egress)
            .await?;
        crate::timeline::mark("create.egress-supervisor");
        Ok(())
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn tier(&self) -> Tier {
        Tier::Local
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        self.create_with(spec, None, None).await
    }

    async fn connect(&self, id: &str) -> Result<Sandbox> {
        let provider = std::sync::Arc::new(self.clone());
        self.state
            .reconnect(id, &self.client, provider, &self.agent_bin, self.egress_bin.clone())
            .await
            .map(Sandbox::new)
    }

    async fn agent_link(&self, id: &str) -> Result<crate::client::AgentClient> {
        Ok(self.state.reattach(id, &self.client).await?.1)
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        self.state.list()
    }

    async fn gc(&self) -> Result<Vec<String>> {
        let mut removed = once::gc_abandoned(self.state.root());
        removed.extend(crate::backend::state::gc_dead(self, &self.state).await?);
        // Copies of an /etc the host has since changed: only while no
        // sandbox runs, since a running one may have any of them mounted.
        if self.state.list()?.iter().all(|s| !s.alive) {
            prune_etc_copies(&self.state.root().join(ETC_CACHE));
        }
        Ok(removed)
    }

    async fn suspend(&self, id: &str) -> Result<()> {
        self.suspend_sandbox(id).await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        // Dropped half way, a resume still brings the sandbox back.
        let (this, id) = (self.clone(), id.to_owned());
        crate::backend::detached::keep(async move { this.resume_sandbox(&id).await }).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        if let Some(meta) = self.state.stop(id, crate::backend::state::Stop::Kill).await? {
            let record = meta.record::<LocalRecord>().unwrap_or_default();
            if let Some(slot) = record.uid_slot {
                self.release_slot(slot, id);
            }
            if let Some(cg) = record.cgroups {
                cg.remove();
            }
        }
        crate::timeline::mark("destroy.end");
        Ok(())
    }
}

/// Removes every copy beneath `cache` but the newest (the one the host's
/// /etc is likeliest still to match; the next launch remakes it if not).
fn prune_etc_copies(cache: &Path) {
    let mut copies: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    copies.sort();
    copies.pop();
    for (_, path) in copies {
        if let Err(e) = std::fs::remove_dir_all(&path) {
            tracing::warn!(path = %path.display(), "could not remove an old /etc copy: {e}");
        }
    }
}

type Maps = (Vec<IdMap>, Vec<IdMap>, bool, Option<(String, String)>);

/// Maps for an ordinary user: root inside is the user; with a subordinate
/// range in /etc/subuid and /etc/subgid and the newuidmap/newgidmap helpers
/// installed, ids 1.. map onto that range (as rootless container tools do),
/// otherwise the user's own id is mapped alone.
fn ordinary_user_maps() -> Maps {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let own_u = IdMap {
        inside: 0,
        outside: uid,
        count: 1,
    };
    let own_g = IdMap {
        inside: 0,
        outside: gid,
        count: 1,
    };
    // /etc/passwd read directly: a static binary has no NSS to ask.
    let name = std::fs::read_to_string("/etc/passwd").ok().and_then(|p| {
        p.lines().find_map(|l| {
            let mut f = l.split(':');
            let (n, _, id) = (f.next()?, f.next()?, f.next()?);
            (id == uid.to_string()).then(|| n.to_owned())
        })
    });
    let helpers = ["/usr/bin/newuidmap", "/usr/bin/newgidmap"];
    let sub = |file: &str, id: u32| -> Option<(u32, u32)> {
        let text = std::fs::read_to_string(file).ok()?;
        text.lines().find_map(|l| {
            let mut f = l.split(':');
            let (who, start, count) = (f.next()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            (Some(who) == name.as_deref() || who == id.to_string()).then_some((start, count))
        })
    };
    match (sub("/etc/subuid", uid), sub("/etc/subgid", gid)) {
        (Some((us, uc)), Some((gs, gc))) if helpers.iter().all(|h| Path::new(h).exists()) => (
            vec![
                own_u,
                IdMap {
                    inside: 1,
                    outside: us,
                    count: uc,
                },
            ],
            vec![
                own_g,
                IdMap {
                    inside: 1,
                    outside: gs,
                    count: gc,
                },
            ],
            false,
            Some((helpers[0].into(), helpers[1].into())),
        ),
        _ => (vec![own_u], vec![own_g], true, None),
    }
}

fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
