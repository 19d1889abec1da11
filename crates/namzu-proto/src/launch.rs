//! The launch spec: what a host tells `namzu-agent launch` to build for a
//! `local` sandbox. Written by the host library as JSON into the sandbox's
//! state directory, read by the agent's launcher before anything else runs.

use serde::{Deserialize, Serialize};

/// One line of a `uid_map` / `gid_map`: `count` ids from `inside` map to
/// host ids from `outside`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// A resource limit for every process in the sandbox (soft = hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rlimit {
    /// Open files.
    Nofile(u64),
    /// Largest file a process may write, in bytes.
    Fsize(u64),
    /// Core dumps, in bytes (0: none).
    Core(u64),
    /// Processes of the sandbox's user. The kernel counts them per user
    /// namespace, so this bounds one sandbox, fork bombs included.
    Nproc(u64),
}

/// A host path shown inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindSpec {
    pub source: String,
    /// Absolute, validated by the host: no `..`, not under /proc, /dev, /sys.
    pub target: String,
    pub writable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub id: String,
    /// Host path of the unix socket the agent serves; the launcher binds it.
    pub socket: String,
    /// Host path of the bind-token file.
    pub token_file: String,
    /// Host directory bound read-write at `/workspace`.
    pub workspace: String,
    /// Host directory whose entries form the root (an image's rootfs),
    /// shown read-only. `None`: the host view.
    #[serde(default)]
    pub rootfs: Option<String>,
    /// Host paths shown inside, mounted in order after the standard layout.
    #[serde(default)]
    pub binds: Vec<BindSpec>,
    pub uid_map: Vec<IdMap>,
    pub gid_map: Vec<IdMap>,
    /// Write "deny" to `setgroups` (required for a single-id map made by an
    /// unprivileged user).
    pub deny_setgroups: bool,
    /// Set the maps through these setuid helpers (`newuidmap`, `newgidmap`)
    /// instead of writing them: how an ordinary user maps a subordinate
    /// range from /etc/subuid and /etc/subgid.
    #[serde(default)]
    pub map_helpers: Option<(String, String)>,
    pub hostname: String,
    /// Environment of every command, on top of PATH, HOME and LANG.
    pub env: Vec<(String, String)>,
    pub rlimits: Vec<Rlimit>,
    /// Size of each writable tmpfs (`/tmp`, `/run`, `/home`, `/root`,
    /// `/dev/shm`), in bytes.
    pub tmpfs_bytes: u64,
    /// Agent limits, by name, as `NAMZU_<NAME>` overrides.
    pub limits: Vec<(String, u64)>,
    /// `cgroup.procs` files the launcher moves the sandbox into, before it
    /// enters its own cgroup namespace.
    #[serde(default)]
    pub cgroup_procs: Vec<String>,
    /// Facts the host applied, reported with the agent's hardening (e.g.
    /// `cgroups` → `memory=cgroupv1 pids=cgroupv1`).
    #[serde(default)]
    pub notes: Vec<(String, String)>,
    /// Also serve on TCP at this address inside the sandbox's network
    /// namespace (`0.0.0.0:1024`: a pod's agent port), same token.
    #[serde(default)]
    pub tcp_listen: Option<String>,
    /// Serve that TCP port (only it) with mutual TLS from these files (a
    /// pod's link; see [`crate::link_tls`]).
    #[serde(default)]
    pub tcp_tls: Option<crate::link_tls::ServerFiles>,
    /// Host directory holding shared read-only copies of the curated
    /// host `/etc`, one per state of the host's files (made by the
    /// launcher); `None`: each sandbox copies its own.
    #[serde(default)]
    pub etc_cache: Option<String>,
    /// A tar archive of what a suspend saved of the sandbox's writable
    /// tmpfs's (`tmp/`, `home/`, `root/`, owners as the sandbox sees
    /// them), put back before anything is served; `None`: they start empty.
    #[serde(default)]
    pub restore: Option<String>,
    /// Where the launcher writes the identities of the sandbox's processes
    /// (itself, its namespace child, the sandbox's init: a `pid start` line
    /// each, start in clock ticks after boot) as soon as it knows them,
    /// while the init is still building the sandbox; `None`: not written,
    /// and the host reads them from `/proc` itself.
    #[serde(default)]
    pub procs_file: Option<String>,
}

/// The text of a [`LaunchSpec::procs_file`]: one `pid start` line per
/// process, in order from the launcher down.
pub fn procs_to_text(procs: &[(u32, u64)]) -> String {
    procs.iter().map(|(pid, start)| format!("{pid} {start}\n")).collect()
}

/// Reads [`procs_to_text`]'s text back; `None` if any line is not two
/// numbers, or there is none.
pub fn procs_from_text(text: &str) -> Option<Vec<(u32, u64)>> {
    let procs = text
        .lines()
        .map(|line| {
            let (pid, start) = line.split_once(' ')?;
            Some((pid.parse().ok()?, start.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    (!procs.is_empty()).then_some(procs)
}

/// The sandbox's writable tmpfs's that a suspend saves and a resume puts
/// back ([`LaunchSpec::restore`]), as paths beneath its root. `/run` and
/// `/dev/shm` are not among them: runtime state starts empty, as after a
/// reboot.
pub const SAVED_DIRS: &[&str] = &["tmp", "home", "root"];

/// What a microVM's agent, booting as the guest's init, is told by the
/// host: written as `namzu/guest.json` on the sandbox's writable disk (not
/// the shared initramfs, which holds no secret), read and removed by the
/// agent before any command runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestSpec {
    /// The sandbox's id (its hostname is "namzu").
    pub id: String,
    /// The bind token every link must present.
    pub token: String,
    /// The name of the virtio-serial port the link travels on.
    pub port: String,
    /// The image's user commands run as (`uid`, `name`, `uid:gid` …).
    pub command_user: String,
    /// Environment every command starts with (the image's, then the spec's).
    pub env: Vec<(String, String)>,
    /// Agent limit overrides, by name.
    pub limits: Vec<(String, u64)>,
    /// Resource limits the agent applies to every process in the guest.
    pub rlimits: Vec<Rlimit>,
    /// KEY=VALUE lines for Health's hardening map (what the host applied).
    pub reports: Vec<String>,
}

/// Where [`GuestSpec`] lives on the writable disk.
pub const GUEST_SPEC_PATH: &str = "namzu/guest.json";

/// The name of the VM's control port beside the link's port `link`
/// (`namzu_proto::mux_sync`).
pub fn control_port_name(link: &str) -> String {
    format!("{link}.ctl")
}
/// The label of a microVM's read-only base disk (the image).
pub const BASE_DISK_LABEL: &str = "namzu-base";
/// The label of its writable disk (overlay upper layer, the guest spec).
pub const RW_DISK_LABEL: &str = "namzu-rw";
/// The list of kernel modules to load, in order, inside the initramfs.
pub const GUEST_MODULES_LIST: &str = "etc/namzu/modules";

#[cfg(test)]
mod procs_text_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identities_round_trip_and_a_torn_or_empty_file_is_refused() {
        let procs = [(41, 7_000_001), (42, 7_000_002), (43, 7_000_002)];
        let text = procs_to_text(&procs);
        assert_eq!(procs_from_text(&text).unwrap(), procs);
        for bad in ["", "41\n", "41 7000001\n42 ", "41 x\n", "-1 5\n", "41 7000001 9\n"] {
            assert_eq!(procs_from_text(bad), None, "{bad:?}");
        }
    }
}
