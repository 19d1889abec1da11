//! The `docker` tier: one container per sandbox, through the Docker Engine
//! API (bollard; the local socket or `DOCKER_HOST`).
//!
//! Any image works unchanged: the static `namzu-agent` is bind-mounted
//! read-only at [`link::AGENT_PATH`] and runs as the container's PID 1, so
//! it reaps every orphan. The host reaches it one of two ways, chosen by
//! [`Transport::Auto`]:
//!
//! * **socket** (runc): the agent listens on a unix socket in a per-sandbox
//!   host directory bind-mounted at `/.namzu/run`, and the host connects to
//!   the socket file directly;
//! * **exec** (runsc): gVisor keeps a socket made inside the sandbox out of
//!   the host's view, so every link is a `docker exec` of
//!   `namzu-agent --relay` whose hijacked stdio carries the link
//!   ([`link`]).
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

mod error;
pub mod gc;
mod link;

pub use error::DockerError;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::container::{Config, CreateContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions};
use bollard::image::CreateImageOptions;
use bollard::models::HostConfig;
use bollard::Docker;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::backend::state::{now_unix, Meta, StateDir, StateSandbox, START_TIMEOUT};
use crate::backend::{check_spec, find_agent_binary, privilege_probe};
use crate::client::{AgentClient, ClientOptions};
use crate::error::{Error, Result};
use crate::handle::Sandbox;
use crate::provider::Provider;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};

/// Paths that stay writable (as tmpfs) under the read-only root filesystem:
/// what programs expect to write besides the workspace.
pub const DEFAULT_WRITABLE_PATHS: &[&str] = &["/tmp", "/var/tmp", "/run", "/home", "/root"];

/// Masked in every container: Docker's own default list, plus /sys.
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys",
];

/// Capabilities the container starts with, all for the agent: SYS_ADMIN to
/// tighten mounts and cover /etc/resolv.conf, NET_BIND_SERVICE to bind its
/// resolver on port 53 (both dropped before it serves), SETUID, SETGID and SETPCAP to
/// start commands as the image's user with an empty bounding set, KILL to
/// signal them from another uid. Commands get none.
pub const AGENT_CAPS: &[&str] = &["SYS_ADMIN", "NET_BIND_SERVICE", "SETUID", "SETGID", "SETPCAP", "KILL"];

/// gVisor's Sentry (Debian's 20221219) has no setfsuid, so its agent
/// cannot take the command user's file-system ids; it gets these instead,
/// works on files as itself and gives each file it creates to the user.
pub const GVISOR_FILE_CAPS: &[&str] = &["DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "CHOWN"];

fn agent_caps(runtime: Option<&str>) -> Vec<String> {
    let extra = if runtime == Some("runsc") {
        GVISOR_FILE_CAPS
    } else {
        &[]
    };
    AGENT_CAPS.iter().chain(extra).map(|c| (*c).to_owned()).collect()
}

/// Bound on one container removal.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Label keys, all under `io.namzu.`.
pub mod labels {
    /// The sandbox id.
    pub const SANDBOX: &str = "io.namzu.sandbox";
    /// The host instance (state directory) that made the container.
    pub const INSTANCE: &str = "io.namzu.instance";
    /// That state directory's path, so another host can tell it is gone.
    pub const STATE_DIR: &str = "io.namzu.state-dir";
    /// The machine that state directory is on (its machine id): a path on
    /// another machine sharing the daemon says nothing here.
    pub const MACHINE: &str = "io.namzu.machine";
    /// Prefix of caller labels ([`super::DockerOptions::labels`]).
    pub const USER_PREFIX: &str = "io.namzu.user.";
}

/// How the host reaches a container's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// `exec` for runsc, `socket` otherwise.
    #[default]
    Auto,
    Socket,
    Exec,
}

/// One image pull progress report.
#[derive(Debug, Clone, Default)]
pub struct PullProgress {
    pub layer: Option<String>,
    pub status: String,
    pub current: Option<u64>,
    pub total: Option<u64>,
}

pub type PullCallback = Arc<dyn Fn(&PullProgress) + Send + Sync>;

/// Tunables of the `docker` tier, each with a safe default.
#[derive(Clone, Default)]
pub struct DockerOptions {
    /// OCI runtime registered with the daemon (`runsc` for gVisor); `None`:
    /// the daemon's default.
    pub runtime: Option<String>,
    /// `None` or `Some(true)`: read-only root filesystem (the default).
    pub read_only_rootfs: Option<bool>,
    /// Paths kept writable (tmpfs) in addition to
    /// [`DEFAULT_WRITABLE_PATHS`]. Refused beside `read_only_rootfs:
    /// Some(false)`.
    pub writable_rootfs_paths: Option<Vec<String>>,
    /// Extra labels, stored under [`labels::USER_PREFIX`].
    pub labels: Vec<(String, String)>,
    pub transport: Transport,
    /// Processes per container when the spec sets none (default 4096).
    pub default_pids_limit: Option<u64>,
    /// Size of each writable tmpfs (default 256 MiB).
    pub tmpfs_bytes: Option<u64>,
    /// Largest file any process may write, RLIMIT_FSIZE (default 16 GiB):
    /// the workspace is a host directory, so this is what keeps one
    /// runaway write from filling the host's disk in one file.
    pub max_file_bytes: Option<u64>,
    /// Told about image pulls (the CLI draws a progress bar).
    pub on_pull: Option<PullCallback>,
    /// The daemon's seccomp profile under runc, as Docker's
    /// `--security-opt seccomp=VALUE`: `None` keeps the daemon's default
    /// (stacked under namzu's own filter); `unconfined` removes it, leaving
    /// namzu's filter alone. Refused with runsc, which loads no OCI profile.
    pub seccomp_profile: Option<String>,
}

impl std::fmt::Debug for DockerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerOptions")
            .field("runtime", &self.runtime)
            .field("read_only_rootfs", &self.read_only_rootfs)
            .field("writable_rootfs_paths", &self.writable_rootfs_paths)
            .field("labels", &self.labels)
            .field("transport", &self.transport)
            .field("seccomp_profile", &self.seccomp_profile)
            .finish_non_exhaustive()
    }
}

impl DockerOptions {
    /// Refuses contradictory settings by name.
    pub fn validate(&self) -> Result<()> {
        if self.seccomp_profile.is_some() && self.runtime.as_deref() == Some("runsc") {
            return Err(Error::ConfigConflict {
                tier: Tier::Docker,
                option: "seccomp_profile".into(),
                conflicts_with: "runtime: runsc".into(),
                reason: "gVisor loads no OCI seccomp profile; namzu's own filter is the only one inside".into(),
            });
        }
        if self.read_only_rootfs == Some(false) && self.writable_rootfs_paths.is_some() {
            return Err(Error::ConfigConflict {
                tier: Tier::Docker,
                option: "writable_rootfs_paths".into(),
                conflicts_with: "read_only_rootfs: false".into(),
                reason: "with a writable root filesystem the extra tmpfs mounts would add nothing".into(),
            });
        }
        for p in self.writable_rootfs_paths.iter().flatten() {
            let ok = p.starts_with('/') && !p.split('/').any(|c| c == "..") && p != "/";
            if !ok || ["/proc", "/sys", "/dev", "/.namzu"].iter().any(|r| p.starts_with(r)) {
                return Err(Error::OptionRefused {
                    tier: Tier::Docker,
                    option: "writable_rootfs_paths".into(),
                    reason: format!("{p:?} must be an absolute path outside /proc, /sys, /dev and /.namzu"),
                });
            }
        }
        for (k, _) in &self.labels {
            if k.is_empty() || k.contains('=') {
                return Err(Error::OptionRefused {
                    tier: Tier::Docker,
                    option: format!("labels.{k}"),
                    reason: "a label key must be non-empty and without '='".into(),
                });
            }
        }
        Ok(())
    }

    fn writable_paths(&self) -> Vec<String> {
        if self.read_only_rootfs == Some(false) {
            return Vec::new();
        }
        let mut v: Vec<String> = DEFAULT_WRITABLE_PATHS.iter().map(|s| (*s).to_owned()).collect();
        for p in self.writable_rootfs_paths.iter().flatten() {
            if !v.contains(p) {
                v.push(p.clone());
            }
        }
        v
    }
}

/// What the state directory records about a docker sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerMeta {
    pub container_id: String,
    pub transport: Transport,
    pub runtime: Option<String>,
}

#[derive(Clone)]
pub struct DockerProvider {
    docker: Docker,
    state: StateDir,
    state_root: PathBuf,
    agent_bin: PathBuf,
    opts: DockerOptions,
    instance: String,
    client: ClientOptions,
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
            Transport::Auto if self.opts.runtime.as_deref() == Some("runsc") => Transport::Exec,
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

    fn container_config(&self, id: &str, dir: &Path, spec: &SandboxSpec, image: &str, user: &str) -> Config<String> {
        let mut labels = HashMap::from([
            (labels::SANDBOX.to_owned(), id.to_owned()),
            (labels::INSTANCE.to_owned(), self.instance.clone()),
            (labels::STATE_DIR.to_owned(), self.state_root.display().to_string()),
            (labels::MACHINE.to_owned(), gc::machine_id()),
        ]);
        for (k, v) in &self.opts.labels {
            labels.insert(format!("{}{k}", labels::USER_PREFIX), v.clone());
        }
        let tmpfs_size = self.opts.tmpfs_bytes.unwrap_or(256 << 20);
        let tmpfs: HashMap<String, String> = self
            .opts
            .writable_paths()
            .into_iter()
            .map(|p| {
                let mode = match p.as_str() {
                    "/tmp" | "/var/tmp" => "1777",
                    "/root" => "700",
                    _ => "755",
                };
                // Docker makes a tmpfs noexec unless told: programs build and
                // run things in /tmp, as they do outside a sandbox.
                (p, format!("rw,exec,nosuid,nodev,size={tmpfs_size},mode={mode}"))
            })
            .collect();
        let mut binds = vec![
            format!("{}:{}:ro", self.agent_bin.display(), link::AGENT_PATH),
            format!("{}:/.namzu/run:rw", dir.join("run").display()),
            format!("{}:/workspace:rw", dir.join("workspace").display()),
        ];
        for b in &spec.binds {
            let mode = if b.writable { "rw" } else { "ro" };
            binds.push(format!("{}:{}:{mode}", b.source.display(), b.target.display()));
        }
        let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for (k, v) in &spec.limits {
            env.push(format!("{}={v}", namzu_proto::limits::env_var(k)));
        }
        let r = &spec.resources;
        let pids = r.pids.or(self.opts.default_pids_limit).unwrap_or(4096);
        let fsize = i64::try_from(self.opts.max_file_bytes.unwrap_or(16 << 30)).unwrap_or(i64::MAX);
        let memory = r.memory_bytes.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        let host = HostConfig {
            binds: Some(binds),
            // Hardening; see the module docs.
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(agent_caps(self.opts.runtime.as_deref())),
            security_opt: Some(
                std::iter::once("no-new-privileges:true".to_owned())
                    .chain(self.opts.seccomp_profile.as_ref().map(|p| format!("seccomp={p}")))
                    .collect(),
            ),
            ipc_mode: Some("private".into()),
            readonly_rootfs: Some(self.opts.read_only_rootfs != Some(false)),
            tmpfs: Some(tmpfs),
            network_mode: Some("none".into()),
            pids_limit: Some(i64::try_from(pids).unwrap_or(i64::MAX)),
            memory,
            // No swap beyond the memory limit.
            memory_swap: memory,
            nano_cpus: r.cpus.map(|c| (c * 1e9) as i64),
            runtime: self.opts.runtime.clone(),
            init: Some(false),
            // /sys is the host's (read-only) sysfs; nothing in a sandbox
            // needs it, so it is masked whole, with its cgroup mounts.
            masked_paths: Some(MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect()),
            ulimits: Some(vec![bollard::models::ResourcesUlimits {
                name: Some("fsize".into()),
                soft: Some(fsize),
                hard: Some(fsize),
            }]),
            ..Default::default()
        };
        let runtime = self.opts.runtime.clone().unwrap_or_else(|| "default".into());
        let mut reports = vec![
            format!("runtime={runtime}"),
            "capabilities=commands none; agent CapDrop ALL + SYS_ADMIN (start only), SETUID, SETGID, SETPCAP, KILL; no-new-privileges".into(),
            "ipc=private".into(),
            "network=none".into(),
            format!(
                "rootfs={}",
                if self.opts.read_only_rootfs == Some(false) {
                    "writable"
                } else {
                    "read-only"
                }
            ),
            format!(
                "cgroups=pids={pids}{}{}",
                memory.map_or(String::new(), |m| format!(",memory=cgroup:{m}")),
                r.cpus.map_or(String::new(), |c| format!(",cpu=cgroup:{c}")),
            ),
        ];
        reports.push(if runtime == "runsc" {
            "seccomp=namzu filter only (gVisor loads no OCI profile inside)".into()
        } else {
            match &self.opts.seccomp_profile {
                None => "seccomp=daemon default profile + namzu filter".into(),
                Some(p) => format!("seccomp=daemon profile {p} + namzu filter"),
            }
        });
        let mut entrypoint: Vec<String> = vec![
            link::AGENT_PATH.into(),
            "--listen".into(),
            format!("unix:{}", link::AGENT_SOCKET),
            "--token-file".into(),
            "/.namzu/run/token".into(),
            "--consume-token".into(),
            "--root".into(),
            "/workspace".into(),
            "--root".into(),
            "/".into(),
            "--egress".into(),
            "--command-user".into(),
            user.to_owned(),
            "--tighten-mounts".into(),
        ];
        for r in reports {
            entrypoint.push("--report".into());
            entrypoint.push(r);
        }
        // Stacked on the daemon's profile (runc): what it leaves open (like
        // io_uring) the local tier's filter closes. Under gVisor, which
        // loads no OCI profile, it is the only filter, and what keeps a
        // command from making a user namespace and holding every
        // capability in it.
        entrypoint.push("--seccomp".into());
        if self.transport() == Transport::Socket {
            // The host connects to the socket's inode through its own path,
            // and the agent already runs: commands need see neither mount.
            for p in ["/.namzu/run", link::AGENT_PATH] {
                entrypoint.extend(["--hide".into(), p.into()]);
            }
        }
        Config {
            image: Some(image.to_owned()),
            // Root, for the agent's few capabilities; commands run as the
            // image's own user (`--command-user`).
            user: Some("0:0".into()),
            entrypoint: Some(entrypoint),
            cmd: Some(Vec::new()),
            working_dir: Some("/workspace".into()),
            env: Some(env),
            labels: Some(labels),
            network_disabled: Some(true),
            stop_signal: Some("SIGTERM".into()),
            host_config: Some(host),
            ..Default::default()
        }
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
            _ => AgentClient::connect_unix(id, &dir.join("run").join("agent.sock"), token, self.client.clone()).await,
        }
    }

    /// Waits for the agent to answer, or the container to stop (its log
    /// then says why), or the start timeout.
    async fn wait_for_agent(&self, id: &str, dir: &Path, meta: &ContainerMeta, token: &[u8]) -> Result<AgentClient> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
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
        let run = dir.join("run");
        std::fs::create_dir(&run).map_err(io)?;
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
        let meta = ContainerMeta {
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
            },
        )?;
        self.docker
            .start_container::<String>(&created.id, None)
            .await
            .map_err(daemon_err("start container"))?;
        let token = std::fs::read(dir.join("token")).map_err(io)?;
        let client = self.wait_for_agent(id, dir, &meta, &token).await?;
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
            egress_dir: self.state.dir(id).ok(),
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

    async fn destroy(&self, id: &str) -> Result<()> {
        let (dir, meta) = match self.state.read_meta(id) {
            Ok(x) => x,
            Err(Error::SandboxNotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        crate::egress::supervisor::stop(&dir);
        if let Some(c) = meta.record::<ContainerMeta>() {
            self.remove_container(&c.container_id).await?;
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

    /// Removes sandboxes whose container stopped, and containers proven
    /// orphans (see [`gc`]); anything unproven is logged and left running.
    async fn gc(&self) -> Result<Vec<String>> {
        let mut removed = self.remove_dead().await?;
        removed.extend(self.remove_orphans().await?);
        Ok(removed)
    }
}
