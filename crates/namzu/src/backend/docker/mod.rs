//! The `docker` tier: one container per sandbox, through the Docker Engine
//! API (bollard; the local socket or `DOCKER_HOST`).
//!
//! Any image works unchanged: the static `namzu-agent` is bind-mounted
//! read-only at `link::AGENT_PATH` and runs as the container's PID 1, so
//! it reaps every orphan. The host reaches it one of three ways, chosen by
//! [`Transport::Auto`]:
//!
//! * **socket** (runc): the agent listens on a unix socket in a per-sandbox
//!   host directory bind-mounted at `/.namzu/run`, and the host connects to
//!   the socket file directly;
//! * **back** (runsc): gVisor keeps a socket made inside the sandbox out of
//!   the host's view, but (with `--host-uds=open`) lets it connect to a host
//!   socket bind-mounted into it. Each host process binds one in
//!   `/.namzu/run/b/`; the agent dials it and keeps standbys there, and
//!   every stream proves the token before the host offers it
//!   (`namzu_proto::back`). Where the runtime forbids the connect, the
//!   agent says so in that directory and the sandbox falls back to
//! * **exec**: every link a `docker exec` of `namzu-agent --relay` whose
//!   hijacked stdio carries the link (`link`), some 15× slower.
//!
//! Hardening, applied to every container here in [`DockerProvider::create`]
//! and nowhere else:
//! * every capability dropped (`CapDrop: ALL`) but the five the agent needs
//!   at start ([`AGENT_CAPS`]), and `no-new-privileges`. The container runs
//!   as root so that the agent gets those; it first makes every mount
//!   nosuid,nodev and detaches /sys (CAP_SYS_ADMIN, then dropped), then
//!   takes a uid of its own and runs commands as the image's `User` with no
//!   capability at all (`namzu_agent::identity`): a command and the agent
//!   never share a uid, so a command cannot open the agent's /proc entries,
//!   signal it or trace it;
//! * a private IPC namespace (`IpcMode: private`);
//! * a read-only root filesystem with a named writable tmpfs set
//!   ([`DEFAULT_WRITABLE_PATHS`], extended by
//!   [`DockerOptions::writable_rootfs_paths`]; off with
//!   `read_only_rootfs: Some(false)`, and setting both is refused);
//! * a pids limit (always), a file-size limit (RLIMIT_FSIZE, always),
//!   memory and CPU limits from the spec;
//! * network `none`;
//! * seccomp: namzu's own filter (the `local` tier's), installed by the
//!   agent on itself and so on every command, stacked on the daemon's
//!   default profile under runc. Under gVisor it is the only one inside
//!   the Sentry: gVisor loads OCI profiles only with `--oci-seccomp`, and
//!   with that flag Debian's runsc (20221219) answers the profile's clone3
//!   rule with EPERM, so glibc cannot start threads; without any filter a
//!   command could make a user namespace and hold every capability in it;
//! * `/.namzu/run` (token, socket) belongs to the agent's uid, mode 0700,
//!   and under runc it and the agent binary are detached from the
//!   container once the agent serves (`--hide`): the host reaches the
//!   socket through its own path.
//!
//! Then the privilege probe of the `local` tier runs before the sandbox is
//! handed out. Every container carries `io.namzu.*` labels naming its
//! sandbox and the host instance (this state directory) that made it, so
//! [`DockerProvider::gc`] finds containers whose host is gone. A create that
//! fails part-way removes what it made.

mod container;
mod error;
pub mod gc;
mod link;
mod options;
mod suspend;

pub use error::DockerError;
pub use options::*;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::container::{CreateContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions};
use bollard::image::CreateImageOptions;
use bollard::Docker;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::backend::state::{now_unix, Meta, StateDir, StateSandbox, START_TIMEOUT};
use crate::backend::{check_spec, find_agent_binary, privilege_probe};
use crate::client::{AgentClient, BackListener, ClientOptions};
use crate::error::{Error, Result};
use crate::handle::Sandbox;
use crate::provider::Provider;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};

/// Bound on one container removal: long enough for gVisor to tear down a
/// sandbox that has just had its descriptors exhausted by 80 tunnels (one
/// such forced removal took over 30 s here), short enough to name a
/// wedged runtime instead of hanging on it.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(90);
/// The run directory's folder of host listeners a [`Transport::Back`] agent
/// dials (`--dial-back`). Names there are short (`b/PID-N`, both hex): a
/// socket's path must fit `sun_path` (108 bytes) wherever the state
/// directory is, and this one is no longer than `agent.sock` beside it.
const BACK_DIR: &str = "b";
/// How long a dial waits for the agent to dial back: a few of its scans.
const BACK_WAIT: Duration = Duration::from_secs(2);

/// What the state directory records about a docker sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerMeta {
    /// The container's id.
    pub container_id: String,
    /// How the host reaches the agent.
    pub transport: Transport,
    /// The runtime asked for.
    pub runtime: Option<String>,
}

/// Makes docker sandboxes: one container per sandbox, through dockerd.
#[derive(Clone)]
pub struct DockerProvider {
    docker: Docker,
    state: StateDir,
    state_root: PathBuf,
    agent_bin: PathBuf,
    opts: DockerOptions,
    instance: String,
    client: ClientOptions,
    /// This process's dial-back listener per sandbox ([`Transport::Back`]).
    back: Arc<std::sync::Mutex<HashMap<String, Arc<BackListener>>>>,
}

impl std::fmt::Debug for DockerProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerProvider")
            .field("state", &self.state)
            .field("instance", &self.instance)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

fn daemon_err(op: &str) -> impl Fn(bollard::errors::Error) -> Error + '_ {
    move |e| {
        DockerError::Daemon {
            op: op.into(),
            message: e.to_string(),
        }
        .into()
    }
}

fn is_404(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

impl DockerProvider {
    /// Connects to the daemon (`DOCKER_HOST`, else the local socket), checks
    /// the runtime is registered, and uses `<state_dir>/docker/`.
    pub async fn new(state_dir: impl Into<PathBuf>, opts: DockerOptions) -> Result<Self> {
        Self::with_agent(state_dir, find_agent_binary()?, opts).await
    }

    /// A provider using this agent binary (bind-mounted read-only into every container).
    pub async fn with_agent(
        state_dir: impl Into<PathBuf>,
        agent_bin: impl Into<PathBuf>,
        opts: DockerOptions,
    ) -> Result<Self> {
        opts.validate()?;
        let unavailable = |reason: String| Error::TierUnavailable {
            tier: Tier::Docker,
            reason,
        };
        let docker = Docker::connect_with_defaults()
            .map_err(|e| unavailable(format!("no docker daemon: {e}")))?
            .negotiate_version()
            .await
            .map_err(|e| unavailable(format!("the docker daemon does not answer: {e}")))?;
        let info = docker
            .info()
            .await
            .map_err(|e| unavailable(format!("the docker daemon does not answer: {e}")))?;
        if let Some(rt) = &opts.runtime {
            let available: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
            if !available.iter().any(|a| a == rt) {
                let mut available = available;
                available.sort();
                return Err(DockerError::RuntimeUnavailable {
                    runtime: rt.clone(),
                    available,
                }
                .into());
            }
        }
        let state_root: PathBuf = state_dir.into();
        let state = StateDir::new(&state_root, Tier::Docker);
        let instance = instance_id(state.root())?;
        let state_root = std::fs::canonicalize(&state_root).unwrap_or(state_root);
        Ok(Self {
            docker,
            state,
            state_root,
            agent_bin: agent_bin.into(),
            opts,
            instance,
            client: ClientOptions::default(),
            back: Arc::default(),
        })
    }

    /// The Engine API client, for tests and tools.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// This host instance's id, carried by every container it makes.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn transport(&self) -> Transport {
        match self.opts.transport {
            Transport::Auto if is_gvisor(self.opts.runtime.as_deref()) => Transport::Back,
            Transport::Auto => Transport::Socket,
            t => t,
        }
    }

    /// Makes sure `reference` is on the daemon, pulling it if not.
    async fn ensure_image(&self, reference: &str) -> Result<String> {
        match self.docker.inspect_image(reference).await {
            Ok(img) => return Ok(img.config.and_then(|c| c.user).unwrap_or_default()),
            Err(e) if is_404(&e) => {}
            Err(e) => return Err(daemon_err("inspect image")(e)),
        }
        let mut pull = self.docker.create_image(
            Some(CreateImageOptions {
                from_image: reference,
                ..Default::default()
            }),
            None,
            None,
        );
        while let Some(step) = pull.next().await {
            let info = step.map_err(|e| DockerError::ImagePull {
                reference: reference.into(),
                message: e.to_string(),
            })?;
            if let Some(cb) = &self.opts.on_pull {
                let detail = info.progress_detail.unwrap_or_default();
                cb(&PullProgress {
                    layer: info.id,
                    status: info.status.unwrap_or_default(),
                    current: detail.current.and_then(|c| u64::try_from(c).ok()),
                    total: detail.total.and_then(|t| u64::try_from(t).ok()),
                });
            }
        }
        let img = self
            .docker
            .inspect_image(reference)
            .await
            .map_err(|e| DockerError::ImagePull {
                reference: reference.into(),
                message: e.to_string(),
            })?;
        Ok(img.config.and_then(|c| c.user).unwrap_or_default())
    }

    /// Connects to a container's agent over `transport`.
    async fn dial(&self, id: &str, dir: &Path, meta: &ContainerMeta, token: Vec<u8>) -> Result<AgentClient> {
        match meta.transport {
            Transport::Exec => {
                let docker = self.docker.clone();
                let container = meta.container_id.clone();
                let endpoint = format!("docker exec {} (relay)", short(&container));
                AgentClient::connect(id, &endpoint, token, self.client.clone(), move || {
                    let docker = docker.clone();
                    let container = container.clone();
                    async move { link::dial(&docker, &container).await }
                })
                .await
            }
            Transport::Back => {
                let listener = self.back_listener(id, dir, &token)?;
                AgentClient::connect_back(id, listener, token, self.client.clone()).await
            }
            _ => AgentClient::connect_unix(id, &dir.join("run").join("agent.sock"), token, self.client.clone()).await,
        }
    }

    /// This process's listener for sandbox `id`'s agent to dial, bound on
    /// first use in the run directory's `b/`.
    fn back_listener(&self, id: &str, dir: &Path, token: &[u8]) -> Result<Arc<BackListener>> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut map = self.back.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = map.get(id) {
            return Ok(l.clone());
        }
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir
            .join("run")
            .join(BACK_DIR)
            .join(format!("{:x}-{n:x}", std::process::id()));
        let io = |source| Error::LocalIo {
            op: "dial-back listener".into(),
            source,
        };
        // The agent's uid must be able to connect: the socket is given to
        // it (only it can traverse the directory anyway); a host that
        // cannot give files away opens it to all, and the challenge keeps
        // anyone without the token out.
        let agent = Some(namzu_proto::CONTAINER_AGENT_UID);
        let l = BackListener::bind(&path, 0o600, token.to_vec(), BACK_WAIT).map_err(io)?;
        if let Err(e) = std::os::unix::fs::chown(&path, agent, agent) {
            if e.kind() != std::io::ErrorKind::PermissionDenied {
                return Err(io(e));
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
        }
        map.insert(id.to_owned(), l.clone());
        Ok(l)
    }

    /// The agent found it may not dial back (runsc without
    /// `--host-uds=open`): from now on this sandbox is reached by exec relay.
    fn fall_back_to_exec(&self, id: &str, meta: &mut ContainerMeta) -> Result<()> {
        let (dir, mut m) = self.state.read_meta(id)?;
        let why = std::fs::read_to_string(dir.join("run").join(BACK_DIR).join(namzu_proto::back::UNSUPPORTED))
            .unwrap_or_default();
        tracing::info!(%id, why = why.trim(), "the agent cannot dial back; using the exec relay");
        meta.transport = Transport::Exec;
        m.record = serde_json::to_value(&*meta).unwrap_or_default();
        self.state.write_meta(&dir, &m)?;
        if let Some(l) = self.back.lock().unwrap_or_else(|p| p.into_inner()).remove(id) {
            drop(l);
        }
        Ok(())
    }

    /// Waits for the agent to answer, or the container to stop (its log
    /// then says why), or the start timeout.
    async fn wait_for_agent(
        &self,
        id: &str,
        dir: &Path,
        meta: &mut ContainerMeta,
        token: &[u8],
    ) -> Result<AgentClient> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let unsupported = dir.join("run").join(BACK_DIR).join(namzu_proto::back::UNSUPPORTED);
            if meta.transport == Transport::Back && unsupported.exists() {
                self.fall_back_to_exec(id, meta)?;
            }
            match self.dial(id, dir, meta, token.to_vec()).await {
                Ok(c) => return Ok(c),
                Err(e @ (Error::Connect { .. } | Error::Preface { .. } | Error::LinkLost { .. })) => {
                    if !self.running(&meta.container_id).await? {
                        return Err(Error::AgentStart {
                            id: id.into(),
                            reason: format!("the container stopped: {}", self.logs(&meta.container_id).await),
                        });
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::AgentStart {
                            id: id.into(),
                            reason: format!("no answer within {START_TIMEOUT:?}: {e}"),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn running(&self, container: &str) -> Result<bool> {
        match self.docker.inspect_container(container, None).await {
            Ok(c) => Ok(c.state.and_then(|s| s.running).unwrap_or(false)),
            Err(e) if is_404(&e) => Ok(false),
            Err(e) => Err(daemon_err("inspect container")(e)),
        }
    }

    async fn logs(&self, container: &str) -> String {
        let mut s = self.docker.logs::<String>(
            container,
            Some(LogsOptions {
                stdout: true,
                stderr: true,
                tail: "20".into(),
                ..Default::default()
            }),
        );
        let mut out = String::new();
        while let Some(Ok(line)) = s.next().await {
            out.push_str(&line.to_string());
        }
        out.trim().to_owned()
    }

    async fn remove_container(&self, container: &str) -> Result<()> {
        let opts = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        // A wedged runtime can hang a removal forever; give up by name.
        let removal = tokio::time::timeout(REMOVE_TIMEOUT, self.docker.remove_container(container, Some(opts)));
        let Ok(result) = removal.await else {
            return Err(DockerError::Daemon {
                op: "remove container".into(),
                message: format!("{} not removed within {REMOVE_TIMEOUT:?}", short(container)),
            }
            .into());
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_404(&e) => Ok(()),
            // Removal already in progress (a concurrent destroy).
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
            Err(e) => Err(daemon_err("remove container")(e)),
        }
    }

    /// Makes (or, for a resume, makes again) the run directory the agent
    /// reads its token from and listens in: the token copied in afresh (the
    /// agent consumes it at every start).
    fn prepare_run(&self, dir: &Path) -> Result<()> {
        let io = |source| Error::LocalIo {
            op: "create".into(),
            source,
        };
        let run = dir.join("run");
        std::fs::create_dir_all(&run).map_err(io)?;
        let _ = std::fs::remove_file(run.join("token"));
        std::fs::copy(dir.join("token"), run.join("token")).map_err(io)?;
        // The run directory (token, socket) is the agent's uid's alone: a
        // command, whoever it runs as, can neither read nor replace them.
        // A host that cannot give files away (not root) makes it sticky
        // instead (01777): the agent can make its socket there and no
        // command can unlink or rename it; the token is writable so the
        // agent can empty it before any command runs; and relays refuse a
        // socket whose peer is not the agent's uid. On runc the directory
        // is hidden from commands as well.
        let agent = Some(namzu_proto::CONTAINER_AGENT_UID);
        let modes = match std::os::unix::fs::chown(&run, agent, agent) {
            Ok(()) => {
                std::os::unix::fs::chown(run.join("token"), agent, agent).map_err(io)?;
                [0o700, 0o600]
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => [0o1777, 0o666],
            Err(e) => return Err(io(e)),
        };
        for (p, mode) in [(run.clone(), modes[0]), (run.join("token"), modes[1])] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(io)?;
        }
        if self.transport() == Transport::Back {
            // Where host processes put the sockets the agent dials: the
            // agent's own, like the run directory, so it can clear what a
            // dead host left there.
            let back = run.join(BACK_DIR);
            std::fs::create_dir_all(&back).map_err(io)?;
            if modes[0] == 0o700 {
                std::os::unix::fs::chown(&back, agent, agent).map_err(io)?;
            }
            std::fs::set_permissions(&back, std::fs::Permissions::from_mode(modes[0])).map_err(io)?;
        }
        Ok(())
    }

    /// The part of create that leaves a container behind; the caller removes
    /// it if this fails.
    async fn start(
        &self,
        id: &str,
        dir: &Path,
        spec: &SandboxSpec,
        container: &mut Option<String>,
    ) -> Result<AgentClient> {
        let Some(image) = spec.image.as_deref() else {
            return Err(Error::OptionRefused {
                tier: Tier::Docker,
                option: "image".into(),
                reason: "the docker tier needs an image (a reference the daemon has or can pull)".into(),
            });
        };
        let user = self.ensure_image(image).await?;
        let io = |source| Error::LocalIo {
            op: "create".into(),
            source,
        };
        self.prepare_run(dir)?;
        if let Some(bytes) = spec.resources.disk_bytes {
            crate::backend::disk::check(Tier::Docker, bytes)?;
            crate::backend::disk::make(dir, bytes, 0)?;
        }
        // An image that runs as someone else must still write its
        // workspace.
        let as_root = matches!(user.split(':').next().unwrap_or(""), "" | "0" | "root");
        if !as_root {
            std::fs::set_permissions(dir.join("workspace"), std::fs::Permissions::from_mode(0o777)).map_err(io)?;
        }
        let config = self.container_config(id, dir, spec, image, &user);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: format!("namzu-{id}"),
                    platform: None,
                }),
                config,
            )
            .await
            .map_err(daemon_err("create container"))?;
        *container = Some(created.id.clone());
        let mut meta = ContainerMeta {
            container_id: created.id.clone(),
            transport: self.transport(),
            runtime: self.opts.runtime.clone(),
        };
        self.state.write_meta(
            dir,
            &Meta {
                id: id.into(),
                tier: Tier::Docker,
                pid: 0,
                created_unix: now_unix(),
                agent_bin: self.agent_bin.clone(),
                record: serde_json::to_value(&meta).unwrap_or_default(),
                procs: Vec::new(),
                suspended_unix: None,
            },
        )?;
        self.docker
            .start_container::<String>(&created.id, None)
            .await
            .map_err(daemon_err("start container"))?;
        let token = std::fs::read(dir.join("token")).map_err(io)?;
        let client = self.wait_for_agent(id, dir, &mut meta, &token).await?;
        privilege_probe(id, &client).await?;
        // Nor one whose egress nobody decides: the policy is in force
        // before the caller gets the handle.
        self.state
            .supervisor(id, dir, &self.agent_bin)
            .start(&spec.egress)
            .await?;
        Ok(client)
    }

    fn sandbox(&self, id: &str, client: AgentClient) -> Sandbox {
        Sandbox::new(StateSandbox {
            id: id.into(),
            tier: Tier::Docker,
            provider: Arc::new(self.clone()),
            client,
            _child: None,
            anchor: None,
            egress: self
                .state
                .dir(id)
                .ok()
                .map(|dir| self.state.supervisor(id, &dir, &self.agent_bin)),
            whole: None,
        })
    }

    /// Containers carrying a namzu sandbox label, from any host instance.
    async fn namzu_containers(&self) -> Result<Vec<bollard::models::ContainerSummary>> {
        let filters = HashMap::from([("label".to_owned(), vec![labels::SANDBOX.to_owned()])]);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters,
                ..Default::default()
            }))
            .await
            .map_err(daemon_err("list containers"))
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// This state directory's host instance id, made on first use.
fn instance_id(root: &Path) -> Result<String> {
    let io = |source| Error::LocalIo {
        op: "docker instance id".into(),
        source,
    };
    let file = root.join(".instance");
    if let Ok(s) = std::fs::read_to_string(&file) {
        let s = s.trim();
        if !s.is_empty() {
            return Ok(s.to_owned());
        }
    }
    std::fs::create_dir_all(root).map_err(io)?;
    let id = format!("{:032x}", rand::random::<u128>());
    let tmp = root.join(format!(".instance.{}", std::process::id()));
    std::fs::write(&tmp, &id).map_err(io)?;
    // Two first uses racing: the first rename wins and both read it back.
    if std::fs::hard_link(&tmp, &file).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return std::fs::read_to_string(&file).map(|s| s.trim().to_owned()).map_err(io);
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(id)
}

#[async_trait]
impl Provider for DockerProvider {
    fn tier(&self) -> Tier {
        Tier::Docker
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        check_spec(Tier::Docker, &spec)?;
        let (id, dir, _token, made) = self.state.create(None)?;
        let mut container = None;
        match self.start(&id, &dir, &spec, &mut container).await {
            Ok(client) => {
                made.keep();
                Ok(self.sandbox(&id, client))
            }
            Err(e) => {
                if let Some(c) = container {
                    if let Err(rm) = self.remove_container(&c).await {
                        tracing::warn!(%id, error = %rm, "could not remove the container of a failed create");
                    }
                }
                Err(e)
            }
        }
    }

    async fn connect(&self, id: &str) -> Result<Sandbox> {
        let client = self.agent_link(id).await?;
        let dir = self.state.dir(id)?;
        self.state.supervisor(id, &dir, &self.agent_bin).ensure().await?;
        Ok(self.sandbox(id, client))
    }

    async fn agent_link(&self, id: &str) -> Result<AgentClient> {
        let (dir, meta) = self.state.read_meta(id)?;
        if meta.suspended_unix.is_some() {
            return Err(Error::SandboxSuspended { id: id.into() });
        }
        let Some(cm) = meta.record::<ContainerMeta>() else {
            return Err(Error::State {
                id: id.into(),
                message: "no container recorded".into(),
            });
        };
        if !self.running(&cm.container_id).await? {
            return Err(Error::SandboxDead { id: id.into() });
        }
        let token = std::fs::read(dir.join("token")).map_err(|e| Error::State {
            id: id.into(),
            message: format!("token: {e}"),
        })?;
        let client = match self.dial(id, &dir, &cm, token).await {
            Err(Error::Connect { .. }) => return Err(Error::SandboxDead { id: id.into() }),
            other => other?,
        };
        Ok(client)
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let running: std::collections::HashSet<String> = self
            .namzu_containers()
            .await?
            .into_iter()
            .filter(|c| c.state.as_deref() == Some("running"))
            .filter_map(|c| c.id)
            .collect();
        let mut out = Vec::new();
        for s in self.state.list()? {
            let alive = self
                .state
                .read_meta(&s.id)
                .ok()
                .and_then(|(_, m)| m.record::<ContainerMeta>())
                .is_some_and(|c| running.contains(&c.container_id));
            out.push(SandboxInfo { alive, ..s });
        }
        Ok(out)
    }

    async fn suspend(&self, id: &str) -> Result<()> {
        self.suspend_sandbox(id).await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.resume_sandbox(id).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let (dir, meta) = match self.state.read_meta(id) {
            Ok(x) => x,
            Err(Error::SandboxNotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        crate::egress::supervisor::stop(&dir);
        self.back.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        if let Some(c) = meta.record::<ContainerMeta>() {
            self.remove_container(&c.container_id).await?;
        }
        crate::backend::disk::unmount(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::LocalIo {
                op: "destroy".into(),
                source,
            }),
        }
    }

    /// Removes sandboxes whose container stopped, and containers proven
    /// orphans (see [`gc`]); anything unproven is logged and left running.
    async fn gc(&self) -> Result<Vec<String>> {
        let mut removed = self.remove_dead().await?;
        removed.extend(self.remove_orphans().await?);
        Ok(removed)
    }
}
