//! What a sandbox is made from and how it is summarised: the [`Tier`] it
//! lives in, the [`SandboxSpec`] it is created with, and the
//! [`SandboxInfo`] a provider lists. Plain data, no IO.

/// Isolation boundaries, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
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
    /// Every tier, weakest first.
    pub const ALL: [Tier; 5] = [Tier::Host, Tier::Local, Tier::Docker, Tier::MicroVm, Tier::Kubernetes];

    /// The entry name.
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

/// A tier name that names no tier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tier {0:?}; known: host, local, docker, microvm, kubernetes")]
pub struct UnknownTier(pub String);

impl std::str::FromStr for Tier {
    type Err = UnknownTier;
    fn from_str(s: &str) -> Result<Self, UnknownTier> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownTier(s.into()))
    }
}

/// Resource limits of a sandbox (memory, CPU and processes through
/// cgroups; disk through a size-limited filesystem). `None`: not limited
/// that way. A tier that cannot apply one refuses it by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU time, in CPUs (1.5 = one and a half cores).
    pub cpus: Option<f64>,
    /// Most processes at once.
    pub pids: Option<u64>,
    /// Size of the sandbox's disk — what `/workspace` (and, on tiers whose
    /// whole writable layer is one disk, everything written) may hold;
    /// filling it answers ENOSPC inside and touches nothing outside.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
}

impl Resources {
    /// Nothing is limited.
    pub fn is_empty(&self) -> bool {
        self.memory_bytes.is_none() && self.cpus.is_none() && self.pids.is_none() && self.disk_bytes.is_none()
    }
}

/// A host path shown inside the sandbox (nosuid, nodev; read-only unless
/// `writable`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bind {
    /// The underlying failure.
    pub source: std::path::PathBuf,
    /// Absolute path inside the sandbox.
    pub target: std::path::PathBuf,
    /// Writable inside (default read-only).
    pub writable: bool,
}

/// What to create. Options a tier cannot honour are refused by name.
/// Serializable, so a tier can keep it to start a suspended sandbox again.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SandboxSpec {
    /// Root filesystem: an imported image (name or `sha256:` id) or a rootfs
    /// directory. `None`: the host view (read-only host /usr and friends).
    pub image: Option<String>,
    /// Host paths to show inside.
    pub binds: Vec<Bind>,
    /// Resource limits.
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
    /// The sandbox's id.
    pub id: String,
    /// The tier that refused or failed.
    pub tier: Tier,
    /// Its agent answers.
    pub alive: bool,
    /// When it was made, in Unix seconds.
    pub created_unix: u64,
    /// Suspended: no process runs, its disk is kept, and
    /// [`Provider::resume`](crate::Provider::resume) starts it again.
    pub suspended: bool,
}

/// A saved snapshot of a running sandbox (its memory, devices and disk at
/// one instant), from which [`Provider::fork`](crate::Provider::fork)
/// starts new sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    /// The snapshot's id.
    pub id: String,
    /// The sandbox it was taken of.
    pub source: String,
    /// The tier that keeps it.
    pub tier: Tier,
    /// When it was taken, in Unix seconds.
    pub created_unix: u64,
    /// Bytes its saved memory and device state take on disk.
    pub memory_bytes: u64,
    /// Bytes its disk takes on the host (allocated, not its size).
    pub disk_bytes: u64,
}
