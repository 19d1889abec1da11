//! The `microvm` tier: one virtual machine per sandbox, on qemu's
//! `microvm` machine (see [`vmm`]), the static agent as the guest's init
//! (`namzu_agent::guest`).
//!
//! `create` finds the kernel ([`boot::Kernel`]), builds or reuses the
//! initramfs ([`boot::initramfs`]) and the image's read-only base disk
//! ([`disk::base`]), makes the sandbox's writable disk holding the guest's
//! spec (token, user, environment, limits), and starts the anchor
//! (`namzu-vmm`, [`anchor`]) that runs the VMM, confined ([`jail`]), and
//! serves `agent.sock` in the state directory once the guest's agent
//! answers. From there the sandbox is reached as every single-host tier's
//! is: by id, from any process, through that socket and the token.
//! `destroy` stops the anchor (and so the VMM) and removes the state
//! directory with the writable disk; the base disk stays for the next VM.
//!
//! The guest has no NIC: egress goes through the agent's proxy and
//! resolver, each decision the host's egress supervisor's, over the link.

mod accel;
pub mod anchor;
pub mod boot;
pub mod disk;
mod error;
mod hold;
pub mod jail;
pub mod qmp;
pub mod run_state;
mod snapshot;
mod suspend;
pub mod vmm;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
pub use error::MicroVmError;
use namzu_proto::launch::{GuestSpec, Rlimit};

use crate::backend::state::{now_unix, spawn_anchor, Meta, StateDir, StateSandbox};
use crate::backend::uid_slots::{UidSlots, UID_SLOTS};
use crate::backend::{check_spec, find_agent_binary, privilege_probe};
use crate::client::ClientOptions;
use crate::error::{Error, Result};
use crate::handle::{Sandbox, SandboxBackend};
use crate::provider::Provider;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};
use vmm::{AccelChoice, Qemu, VmConfig, Vmm};

/// The anchor binary, found beside the agent.
pub const ANCHOR_BINARY: &str = "namzu-vmm";
/// The name of the link's virtio-serial port.
pub const PORT_NAME: &str = "namzu.link";

/// Told what a create is doing while it takes long (building an image's
/// base disk, the initramfs) and which accelerator it chose; the CLI draws
/// it as a progress line. `done` is true on a step's last word.
#[derive(Clone)]
pub struct Progress(pub ProgressFn);

/// What [`Progress`] calls: the step's words, and whether it is its last.
pub type ProgressFn = Arc<dyn Fn(&str, bool) + Send + Sync>;

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}

/// Tunables of the `microvm` tier, each with a safe default.
#[derive(Debug, Clone)]
pub struct MicroVmOptions {
    /// Where create's long steps are reported (none by default).
    pub on_progress: Option<Progress>,
    /// The guest kernel (a `vmlinuz`, or an unpacked kernel package);
    /// default: `NAMZU_MICROVM_KERNEL`, else `<state>/microvm/kernel`.
    pub kernel: Option<PathBuf>,
    /// The accelerator.
    pub accel: AccelChoice,
    /// The VMM.
    pub vmm: Arc<dyn Vmm>,
    /// The image a spec naming none boots (a VM has no host view to show).
    pub default_image: Option<String>,
    /// Guest memory when the spec sets none, in MiB.
    pub memory_mib: u64,
    /// vCPUs when the spec sets none.
    pub vcpus: u32,
    /// Size of each sandbox's writable disk: its disk limit.
    pub disk_bytes: u64,
    /// From start to the agent answering, beyond which create fails with
    /// the console's tail.
    pub boot_budget: Duration,
    /// Console kept per VM (rotated once).
    pub console_max_bytes: u64,
    /// Host links open at once into one VM.
    pub max_links: usize,
    /// A link's keepalive: it pings the agent this often (never while the
    /// VM is paused), and a ping unanswered for two of them outside a
    /// pause drops the connection. Long, as the guest agent's own: every
    /// link shares one port, so an answer may queue behind another stream.
    pub link_keepalive: Duration,
    /// Open files per process in the guest (RLIMIT_NOFILE).
    pub max_open_files: u64,
    /// Largest file a process may write in the guest (RLIMIT_FSIZE).
    pub max_file_bytes: u64,
    /// Processes of the commands' user in the guest when the spec sets no
    /// `pids` (RLIMIT_NPROC).
    pub max_processes: u64,
}

impl Default for MicroVmOptions {
    fn default() -> Self {
        Self {
            on_progress: None,
            kernel: None,
            accel: AccelChoice::Auto,
            vmm: Arc::new(Qemu::default()),
            default_image: None,
            memory_mib: 512,
            vcpus: 1,
            disk_bytes: 2 << 30,
            // Emulation boots in seconds, a loaded CI machine in more.
            boot_budget: Duration::from_secs(90),
            console_max_bytes: 1 << 20,
            max_links: 64,
            link_keepalive: Duration::from_secs(60),
            max_open_files: 65_536,
            max_file_bytes: 16 << 30,
            max_processes: 4096,
        }
    }
}

/// The guest's spec, kept in the sandbox's directory (mode 0600) for a
/// boot after a suspend and for snapshots.
const GUEST_SPEC: &str = "guest.json";
/// The memory file of a sandbox suspended with its memory.
const MEMORY_FILE: &str = "memory.snap";
/// How long the guest has to make its disk durable before a suspend ends it.
const FLUSH_BOUND: Duration = Duration::from_secs(60);

/// The smallest guest that boots the kernel and the agent.
pub const MIN_MEMORY_MIB: u64 = 128;

/// What the microvm tier keeps in a sandbox's state record.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct VmRecord {
    /// The host uid range slot the VMM runs in, if any.
    uid_slot: Option<u32>,
    /// The accelerator it runs with.
    accel: Option<vmm::Accel>,
    /// Its files and sizes, to boot it again after a suspend.
    #[serde(default)]
    parts: Option<VmParts>,
}

/// Makes microVM sandboxes.
#[derive(Debug, Clone)]
pub struct MicroVmProvider {
    state: StateDir,
    images: crate::image::ImageStore,
    agent_bin: PathBuf,
    client: ClientOptions,
    opts: MicroVmOptions,
}

fn refuse(option: &str, reason: impl Into<String>) -> Error {
    Error::OptionRefused {
        tier: Tier::MicroVm,
        option: option.into(),
        reason: reason.into(),
    }
}

fn tier_err(e: MicroVmError) -> Error {
    Error::tier(Tier::MicroVm, e)
}

fn io(op: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::LocalIo { op: op.into(), source }
}

impl MicroVmProvider {
    /// A provider with its state in `state_dir`, the agent found with [`find_agent_binary`].
    pub fn new(state_dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self::with_agent(state_dir, find_agent_binary()?))
    }

    /// A provider using this agent binary (`namzu-vmm` beside it).
    pub fn with_agent(state_dir: impl Into<PathBuf>, agent_bin: impl Into<PathBuf>) -> Self {
        let state_dir = state_dir.into();
        Self {
            images: crate::image::ImageStore::new(&state_dir),
            state: StateDir::new(state_dir, Tier::MicroVm),
            agent_bin: agent_bin.into(),
            client: link_options(&MicroVmOptions::default()),
            opts: MicroVmOptions::default(),
        }
    }

    /// How images missing from the cache are pulled.
    pub fn pull_options(mut self, opts: crate::image::PullOptions) -> Self {
        self.images = self.images.with_pull_options(opts);
        self
    }

    /// Replaces the tier's options.
    pub fn options(mut self, opts: MicroVmOptions) -> Self {
        self.client = link_options(&opts);
        self.opts = opts;
        self
    }

    /// Where this provider's sandboxes' state directories are
    /// (`<state>/microvm`; one directory per sandbox id).
    pub fn state_root(&self) -> &Path {
        self.state.root()
    }

    fn cache(&self) -> PathBuf {
        self.state.root().join(".cache")
    }

    fn slots(&self) -> UidSlots {
        // Shared with the local tier: one host id range is never given to
        // a sandbox and a VMM at once.
        UidSlots::new(
            self.state
                .root()
                .parent()
                .unwrap_or(self.state.root())
                .join("local/.uids"),
        )
    }

    /// The writable disk's size for `spec`: its disk limit, else the
    /// tier's default.
    fn disk_size(&self, spec: &SandboxSpec) -> Result<u64> {
        match spec.resources.disk_bytes {
            Some(b) if b < crate::backend::disk::MIN_DISK_BYTES => Err(refuse(
                "resources.disk_bytes",
                format!(
                    "{b} bytes is below the smallest disk, {} bytes",
                    crate::backend::disk::MIN_DISK_BYTES
                ),
            )),
            Some(b) => Ok(b),
            None => Ok(self.opts.disk_bytes),
        }
    }

    /// The VMM's configuration for `spec`, or the option it cannot honour.
    fn sizes(&self, spec: &SandboxSpec) -> Result<(u64, u32)> {
        let memory_mib = match spec.resources.memory_bytes {
            Some(b) => {
                let mib = b.div_ceil(1 << 20);
                if mib < MIN_MEMORY_MIB {
                    return Err(refuse(
                        "resources.memory_bytes",
                        format!("{mib} MiB: a guest needs at least {MIN_MEMORY_MIB} MiB"),
                    ));
                }
                mib
            }
            None => self.opts.memory_mib,
        };
        let vcpus = match spec.resources.cpus {
            Some(c) if c >= 1.0 && c.fract() == 0.0 && c <= 64.0 => c as u32,
            Some(c) => {
                return Err(refuse(
                    "resources.cpus",
                    format!("{c}: a VM gets whole vCPUs (1 to 64), not a share of one"),
                ))
            }
            None => self.opts.vcpus,
        };
        Ok((memory_mib, vcpus))
    }
}

impl MicroVmProvider {
    async fn create_vm(&self, spec: SandboxSpec) -> Result<Sandbox> {
        const OP: &str = "create";
        check_spec(Tier::MicroVm, &spec)?;
        if !spec.binds.is_empty() {
            return Err(refuse("binds", "a VM shares no host path (no virtiofs here)"));
        }
        let (memory_mib, vcpus) = self.sizes(&spec)?;
        let disk_bytes = self.disk_size(&spec)?;
        let image = spec
            .image
            .clone()
            .or_else(|| self.opts.default_image.clone())
            .ok_or_else(|| refuse("image", "a VM boots an image: name one (namzu image import)"))?;
        let rootfs = self.images.ensure(&image, &|_| {}).await?;
        let kernel = boot::Kernel::find(
            self.opts.kernel.as_deref(),
            self.state.root().parent().unwrap_or(self.state.root()),
        )
        .map_err(tier_err)?;
        self.opts.vmm.binary().map_err(tier_err)?;
        // The anchor carries the link over a virtio-serial port; a VMM that
        // offers none (vsock only) is refused until the anchor speaks vsock.
        if !self.opts.vmm.transports().contains(&vmm::Transport::VirtioSerial) {
            return Err(tier_err(MicroVmError::TransportUnavailable {
                vmm: self.opts.vmm.name(),
                offered: format!("{:?}", self.opts.vmm.transports()),
            }));
        }
        let accel = vmm::choose_accel(self.opts.accel).map_err(tier_err)?;
        let say = |what: &str, done: bool| {
            tracing::info!("{what}");
            if let Some(p) = &self.opts.on_progress {
                (p.0)(what, done);
            }
        };
        if self.opts.accel == AccelChoice::Auto {
            let why = vmm::kvm_unusable().map_or_else(|| "KVM is usable".to_owned(), |r| format!("KVM unusable: {r}"));
            say(&format!("accel {accel} ({why})"), true);
        }
        let vmm_bin = self.agent_bin.with_file_name(ANCHOR_BINARY);
        if !vmm_bin.is_file() {
            return Err(Error::AgentBinaryNotFound {
                searched: vec![vmm_bin],
            });
        }
        let cache = self.cache();
        let initramfs = boot::initramfs(&cache.join("initramfs"), &self.agent_bin, &kernel).map_err(tier_err)?;
        let base = disk::base(&cache.join("disks"), &disk::image_key(&rootfs), &rootfs, &say).map_err(tier_err)?;
        let runtime = crate::image::ImageStore::runtime_config(&rootfs);

        let (id, dir, token, made) = self.state.create(None)?;
        let vm_dir = dir.join("vm");
        std::fs::create_dir(&vm_dir).map_err(io(OP))?;
        let mut env = runtime.env;
        for (k, v) in &spec.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let guest = GuestSpec {
            id: id.clone(),
            token: String::from_utf8_lossy(&token).into_owned(),
            port: PORT_NAME.into(),
            command_user: runtime.user,
            env,
            limits: spec.limits.clone(),
            rlimits: vec![
                Rlimit::Nofile(self.opts.max_open_files),
                Rlimit::Fsize(self.opts.max_file_bytes),
                Rlimit::Core(0),
                Rlimit::Nproc(spec.resources.pids.unwrap_or(self.opts.max_processes)),
            ],
            reports: vec![
                format!("boundary=microvm ({}, accel {accel})", self.opts.vmm.name()),
                format!("vm=memory {memory_mib} MiB, {vcpus} vCPU, disk {disk_bytes} bytes, no NIC"),
            ],
        };
        let seed = dir.join("seed");
        std::fs::create_dir_all(seed.join("namzu")).map_err(io(OP))?;
        let guest_json = serde_json::to_vec(&guest).map_err(|e| Error::State {
            id: id.clone(),
            message: e.to_string(),
        })?;
        crate::fsutil::write_private(&seed.join(namzu_proto::launch::GUEST_SPEC_PATH), &guest_json).map_err(io(OP))?;
        // Kept beside the token (the same secret), for a boot after a
        // suspend: the guest's init removes its copy once read.
        crate::fsutil::write_private(&dir.join(GUEST_SPEC), &guest_json).map_err(io(OP))?;
        let rw = vm_dir.join("rw.ext4");
        let made_disk = disk::writable(&rw, disk_bytes, &seed);
        let _ = std::fs::remove_dir_all(&seed);
        made_disk.map_err(tier_err)?;

        let slot = self.claim_slot(&id, OP)?;
        let started = self
            .start(
                &id,
                &dir,
                &vm_dir,
                slot,
                accel,
                VmParts {
                    kernel: kernel.vmlinuz.clone(),
                    initramfs,
                    base,
                    rw,
                    memory_mib,
                    vcpus,
                    backing: None,
                },
                None,
            )
            .await;
        let sandbox = match started {
            Ok(sb) => sb,
            Err(e) => {
                if let Some(s) = slot {
                    self.slots().release(s, &id);
                }
                return Err(e);
            }
        };
        made.keep();
        if let Err(e) = privilege_probe(&id, &sandbox.client).await {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        if let Err(e) = self
            .state
            .supervisor(&id, &dir, &self.agent_bin)
            .start(&spec.egress)
            .await
        {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Sandbox::new(sandbox))
    }
}

impl MicroVmProvider {
    /// A host uid range for sandbox `id`'s VMM, where the host is root.
    fn claim_slot(&self, id: &str, op: &str) -> Result<Option<u32>> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(None);
        }
        match self.slots().claim(id) {
            Ok(Some(s)) => Ok(Some(s)),
            Ok(None) => Err(Error::LimitExceeded {
                op: op.into(),
                limit: "uid_slots".into(),
                value: u64::from(UID_SLOTS),
                path: None,
            }),
            Err(e) => Err(io(op)(e)),
        }
    }
}

/// The files and sizes of one VM.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct VmParts {
    kernel: PathBuf,
    initramfs: PathBuf,
    base: PathBuf,
    rw: PathBuf,
    memory_mib: u64,
    vcpus: u32,
    /// The frozen disk a fork's qcow2 `rw` overlays (its snapshot's).
    #[serde(default)]
    backing: Option<PathBuf>,
}

impl MicroVmProvider {
    /// `sb` with its VM's pause: the handle's pause stops the whole VM, and
    /// its link knows a paused VM's silence from a dead one's.
    fn held(&self, mut sb: StateSandbox) -> StateSandbox {
        let anchor = sb.anchor.map_or(0, |p| p.pid);
        if let Some(hold) = self
            .state
            .dir(&sb.id)
            .ok()
            .and_then(|dir| hold::VmHold::of(&sb.id, dir, anchor))
        {
            sb.client.guard_with(hold.clone());
            sb.whole = Some(hold);
        }
        sb
    }

    /// The pause of the VM of `id`, where its anchor serves one.
    fn hold(&self, id: &str) -> Result<Option<Arc<hold::VmHold>>> {
        let (dir, meta) = self.state.read_meta(id)?;
        Ok(hold::VmHold::of(id, dir, meta.pid))
    }

    /// `SandboxPaused` for `op` while the VM of `id` is paused: its agent
    /// cannot answer a connect until it continues.
    fn refuse_paused(&self, id: &str, op: &str) -> Result<()> {
        match self.hold(id)?.is_some_and(|h| h.paused()) {
            true => Err(Error::SandboxPaused { op: op.into() }),
            false => Ok(()),
        }
    }

    /// Writes the anchor's spec, starts it, and waits for the agent; with
    /// `incoming`, the VM restores that memory snapshot instead of booting.
    #[allow(clippy::too_many_arguments)]
    async fn start(
        &self,
        id: &str,
        dir: &Path,
        vm_dir: &Path,
        slot: Option<u32>,
        accel: vmm::Accel,
        parts: VmParts,
        incoming: Option<PathBuf>,
    ) -> Result<StateSandbox> {
        const OP: &str = "create";
        let config = VmConfig {
            kernel: parts.kernel.clone(),
            initramfs: parts.initramfs.clone(),
            base_disk: parts.base.clone(),
            rw_disk: parts.rw.clone(),
            memory_mib: parts.memory_mib,
            vcpus: parts.vcpus,
            accel,
            control_socket: vm_dir.join("qmp.sock"),
            port_name: PORT_NAME.into(),
            tsc_khz: vmm::host_tsc_khz(),
            incoming: incoming.is_some(),
        };
        let argv = self.opts.vmm.argv(&config).map_err(tier_err)?;
        let ids = slot.map(|s| {
            let base = UidSlots::base(s);
            (base, base)
        });
        if let Some((uid, gid)) = ids {
            let own = |p: &Path| {
                nix::unistd::chown(
                    p,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .map_err(|e| io(OP)(e.into()))
            };
            own(vm_dir)?;
            own(&parts.rw)?;
        }
        let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
        // What qemu loads (its libraries, firmware, loader config).
        let mut read_only: Vec<PathBuf> = ["/usr", "/lib", "/lib64", "/etc"].map(PathBuf::from).to_vec();
        read_only.extend([parent(&parts.kernel), parent(&parts.initramfs), parent(&parts.base)]);
        // A fork's overlay names its snapshot's disk, which qemu opens too.
        read_only.extend(parts.backing.as_deref().map(parent));
        let spec = anchor::AnchorSpec {
            argv,
            dir: dir.to_path_buf(),
            console_max_bytes: self.opts.console_max_bytes,
            max_links: self.opts.max_links,
            jail: jail::JailSpec {
                ids,
                namespaces: ids.is_some(),
                read_only,
                // Its own directory, and /dev/null: nothing else of /dev.
                writable: vec![vm_dir.to_path_buf(), PathBuf::from("/dev/null")],
                root: dir.join("jail"),
            },
            incoming,
            qmp: Some(config.control_socket.clone()),
        };
        let json = serde_json::to_vec_pretty(&spec).map_err(|e| Error::State {
            id: id.into(),
            message: e.to_string(),
        })?;
        std::fs::write(dir.join("anchor.json"), json).map_err(io(OP))?;
        let vmm_bin = self.agent_bin.with_file_name(ANCHOR_BINARY);
        let mut cmd = tokio::process::Command::new(&vmm_bin);
        cmd.arg(dir.join("anchor.json"))
            .env_clear()
            .envs(std::env::var("NAMZU_AGENT_LOG").ok().map(|v| ("NAMZU_AGENT_LOG", v)));
        let mut child = spawn_anchor(cmd, dir, id, &vmm_bin)?;
        let mut meta = Meta {
            id: id.into(),
            tier: Tier::MicroVm,
            pid: child.id().unwrap_or(0),
            created_unix: now_unix(),
            agent_bin: self.agent_bin.clone(),
            record: serde_json::Value::Null,
            procs: Vec::new(),
            suspended_unix: None,
        }
        .with_record(&VmRecord {
            uid_slot: slot,
            accel: Some(accel),
            parts: Some(parts.clone()),
        });
        self.state.write_meta(dir, &meta)?;
        let attached = match self.wait_for_guest(dir, id, &mut child).await {
            Ok(client) => self.state.record_processes(dir, &mut meta).map(|()| client),
            Err(e) => Err(e),
        };
        match attached {
            Ok(client) => Ok(self.held(StateSandbox {
                id: id.into(),
                tier: Tier::MicroVm,
                provider: Arc::new(self.clone()),
                client,
                _child: Some(child),
                anchor: meta.procs.first().copied(),
                egress: Some(self.state.supervisor(id, dir, &self.agent_bin)),
                whole: None,
            })),
            Err(e) => {
                crate::backend::procid::kill_all(&crate::backend::procid::tree(meta.pid)).await;
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(e)
            }
        }
    }

    /// Waits for the anchor's `agent.sock` (it appears once the guest's
    /// agent serves) within the boot budget; a VM that ends first, or
    /// takes longer, is a typed failure carrying its console's tail.
    async fn wait_for_guest(
        &self,
        dir: &Path,
        id: &str,
        child: &mut tokio::process::Child,
    ) -> Result<crate::client::AgentClient> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(tier_err(MicroVmError::GuestExited {
                    id: id.into(),
                    status: status.to_string(),
                    console_tail: console_tail(dir),
                    anchor_log: tail(&dir.join("agent.log"), 2048) + &tail(&dir.join("vmm.log"), 2048),
                }));
            }
            if dir.join("agent.sock").exists() {
                return self.state.attach(dir, id, &self.client).await;
            }
            if start.elapsed() > self.opts.boot_budget {
                let _ = child.start_kill();
                return Err(tier_err(MicroVmError::BootTimeout {
                    id: id.into(),
                    budget: self.opts.boot_budget,
                    console_tail: console_tail(dir),
                    anchor_log: tail(&dir.join("agent.log"), 2048) + &tail(&dir.join("vmm.log"), 2048),
                }));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The last `max` bytes of a file, lossy.
fn tail(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// How this tier's links are made.
fn link_options(opts: &MicroVmOptions) -> ClientOptions {
    ClientOptions {
        keepalive: opts.link_keepalive,
        // A paused VM says nothing for as long as the pause lasts.
        holdable: true,
        ..ClientOptions::default()
    }
}

/// The last 4 KiB of a VM's console.
pub fn console_tail(dir: &Path) -> String {
    tail(&dir.join("console.log"), 4096)
}

#[async_trait]
impl Provider for MicroVmProvider {
    fn tier(&self) -> Tier {
        Tier::MicroVm
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        self.create_vm(spec).await
    }

    async fn connect(&self, id: &str) -> Result<Sandbox> {
        self.refuse_paused(id, "connect")?;
        let sb = self
            .state
            .reconnect(id, &self.client, Arc::new(self.clone()), &self.agent_bin, None)
            .await?;
        Ok(Sandbox::new(self.held(sb)))
    }

    async fn agent_link(&self, id: &str) -> Result<crate::client::AgentClient> {
        self.refuse_paused(id, "connect")?;
        let client = self.state.reattach(id, &self.client).await?.1;
        if let Some(hold) = self.hold(id)? {
            client.guard_with(hold);
        }
        Ok(client)
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        self.state.list()
    }

    async fn gc(&self) -> Result<Vec<String>> {
        crate::backend::state::gc_dead(self, &self.state).await
    }

    async fn suspend(&self, id: &str) -> Result<()> {
        self.suspend_vm(id).await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.resume_vm(id).await
    }

    async fn snapshot(&self, id: &str) -> Result<crate::spec::SnapshotInfo> {
        self.snapshot_vm(id).await
    }

    async fn fork(&self, snapshot: &str) -> Result<Sandbox> {
        self.fork_vm(snapshot).await
    }

    async fn snapshots(&self) -> Result<Vec<crate::spec::SnapshotInfo>> {
        self.list_snapshots()
    }

    async fn delete_snapshot(&self, snapshot: &str) -> Result<()> {
        self.remove_snapshot(snapshot)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        if let Some(meta) = self.state.stop(id, crate::backend::state::Stop::Graceful).await? {
            let record = meta.record::<VmRecord>().unwrap_or_default();
            if let Some(slot) = record.uid_slot {
                self.slots().release(slot, id);
            }
        }
        Ok(())
    }
}
