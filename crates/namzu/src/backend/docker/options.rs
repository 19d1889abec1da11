//! What a docker sandbox is made with: [`DockerOptions`] and their
//! validation, the capability and path lists every container gets, and the
//! labels namzu marks its containers with.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::Tier;

/// Paths that stay writable (as tmpfs) under the read-only root filesystem:
/// what programs expect to write besides the workspace.
pub const DEFAULT_WRITABLE_PATHS: &[&str] = &["/tmp", "/var/tmp", "/run", "/home", "/root"];

/// Masked in every container: Docker's own default list, plus /sys.
pub(super) const MASKED_PATHS: &[&str] = &[
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

/// Whether `runtime` is gVisor: `runsc`, or a variant registered as
/// `runsc-…` (another platform, other flags).
pub fn is_gvisor(runtime: Option<&str>) -> bool {
    runtime.is_some_and(|r| r == "runsc" || r.starts_with("runsc-"))
}

pub(super) fn agent_caps(runtime: Option<&str>) -> Vec<String> {
    let extra = if is_gvisor(runtime) { GVISOR_FILE_CAPS } else { &[] };
    AGENT_CAPS.iter().chain(extra).map(|c| (*c).to_owned()).collect()
}

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
    /// `back` for runsc (falling back to `exec` where the runtime forbids
    /// it), `socket` otherwise.
    #[default]
    Auto,
    /// The agent's unix socket, bind-mounted from the state directory.
    Socket,
    /// A `docker exec` relay into the container (for daemons that cannot share the socket, e.g. gVisor).
    Exec,
    /// The agent dials the host's socket in the bind-mounted run directory
    /// (gVisor lets a sandbox connect to a host socket with
    /// `--host-uds=open`, never listen on one); each stream proves the token
    /// before the host offers it.
    Back,
}

/// One image pull progress report.
#[derive(Debug, Clone, Default)]
pub struct PullProgress {
    /// The layer, by digest or file name.
    pub layer: Option<String>,
    /// How it ended.
    pub status: String,
    /// Bytes of the layer done.
    pub current: Option<u64>,
    /// Bytes of the layer in all.
    pub total: Option<u64>,
}

/// Called for each progress message of an image pull.
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
    /// How the host reaches the agent (default: the socket).
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
        if self.seccomp_profile.is_some() && is_gvisor(self.runtime.as_deref()) {
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

    pub(super) fn writable_paths(&self) -> Vec<String> {
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
