//! What only the `microvm` tier promises, each shown on a real qemu guest
//! (TCG here): the VMM's confinement as the host sees it, the guest's
//! devices, the limits reaching the guest, the disk limit, flush inside
//! the guest, the lifecycle (destroy, a dead anchor, state removed behind
//! namzu's back, connect from a second provider) and every typed failure
//! (no kernel, no qemu, not an image, KVM where it is unusable, a guest
//! that ends or hangs before its agent answers, options refused by name).

#[path = "support/microvm.rs"]
mod microvm;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use namzu::backend::microvm::vmm::{self, Accel, AccelChoice, Qemu, VmConfig, Vmm};
use namzu::backend::microvm::{MicroVmError, MicroVmOptions, MicroVmProvider};
use namzu::{Error, Provider, Resources, SandboxSpec};

type R = Result<(), Box<dyn std::error::Error>>;

/// One VM test at a time: they share a state directory (one image import,
/// one base disk), some count what it holds, and two emulated guests at
/// once on two cores would only time each other out.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The provider with these options; `None` only where the tier is
/// unavailable, and then `main` has reported every test ignored already.
fn provider(opts: impl FnOnce(&mut MicroVmOptions)) -> Option<MicroVmProvider> {
    let p = microvm::provider("tier").ok()?;
    let mut o = MicroVmOptions {
        default_image: Some(microvm::IMAGE.into()),
        ..Default::default()
    };
    opts(&mut o);
    Some(p.options(o))
}

async fn sh(sb: &namzu::Sandbox, script: &str) -> Result<String, Box<dyn std::error::Error>> {
    let out = sb.commands().run(script).await?;
    if !out.status.success() {
        return Err(format!("{script}: {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The VMM process of the sandbox whose state directory is `dir`, found
/// by its command line (it names the sandbox's writable disk).
fn vmm_pid(dir: &Path) -> Option<u32> {
    let needle = dir.join("vm/rw.ext4");
    let needle = needle.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (cmd.starts_with(b"/usr/bin/qemu-system") || cmd.windows(11).any(|w| w == b"qemu-system")).then_some(())?;
        cmd.windows(needle.len()).any(|w| w == needle).then_some(pid)
    })
}

fn state_dir(p: &MicroVmProvider, id: &str) -> PathBuf {
    p.state_root().join(id)
}

fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
        .unwrap_or_default()
}

async fn gone_within(pid: u32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn the_vmm_runs_confined() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let sb = p.create(SandboxSpec::default()).await?;
    let dir = state_dir(&p, sb.id());
    let pid = vmm_pid(&dir).ok_or("no VMM process for the sandbox")?;
    // qemu's own seccomp sandbox, and no way to gain privilege by exec.
    assert_eq!(status_field(pid, "Seccomp:"), "2", "qemu runs without a seccomp filter");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    if nix::unistd::geteuid().is_root() {
        let uids = status_field(pid, "Uid:");
        assert!(
            uids.split_whitespace()
                .all(|u| u.parse::<u32>().is_ok_and(|u| u >= 1_000_000)),
            "qemu's uids are not an unprivileged range: {uids}"
        );
        assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
        assert_eq!(status_field(pid, "Groups:"), "");
        for ns in ["net", "mnt", "ipc", "uts"] {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))?;
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"))?;
            assert_ne!(theirs, ours, "qemu shares the host's {ns} namespace");
        }
        // No network: its namespace has only lo.
        let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))?;
        let ifaces: Vec<&str> = dev
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(str::trim)
            .collect();
        assert_eq!(ifaces, ["lo"], "qemu's network namespace has interfaces");
        // Its view of the filesystem: what it loads, and its own files.
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let top: Vec<String> = std::fs::read_dir(&root)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for absent in ["proc", "sys", "root", "home", "var", "run", "boot"] {
            assert!(!top.iter().any(|t| t == absent), "qemu sees /{absent}: {top:?}");
        }
        let host_dev: Vec<String> = std::fs::read_dir(root.join("dev"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(host_dev, ["null"], "qemu sees host devices");
        // Another sandbox's state, the token and the agent socket are not
        // in its view: only its own vm/ directory is.
        let in_view = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p)).exists();
        assert!(in_view(&dir.join("vm/rw.ext4")));
        assert!(!in_view(&dir.join("token")), "qemu can reach the sandbox's token");
        assert!(
            !in_view(&dir.join("agent.sock")),
            "qemu can reach the host's link socket"
        );
        // The view is read-only but for its own directory.
        let probe = format!("/proc/{pid}/root/usr/.namzu-probe");
        assert!(std::fs::write(&probe, b"x").is_err() || std::fs::remove_file(&probe).is_err());
    } else {
        eprintln!("not root: the VMM runs as the caller (no uid, namespaces or private view to check)");
    }
    sb.destroy().await?;
    Ok(())
}

async fn the_guest_has_only_the_configured_devices() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let sb = p.create(SandboxSpec::default()).await?;
    // Two disks (the image, the writable layer), no NIC, nothing on PCI.
    let parts = sh(&sb, "cat /proc/partitions").await?;
    let disks: Vec<&str> = parts
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(disks, ["vda", "vdb"], "{parts}");
    let net = sh(&sb, "cat /proc/net/dev").await?;
    let ifaces: Vec<&str> = net
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "the guest has a network interface");
    let irqs = sh(&sb, "cat /proc/interrupts").await?;
    let virtio = irqs.lines().filter(|l| l.contains("virtio")).count();
    assert_eq!(
        virtio, 3,
        "virtio devices beyond the link's port and the two disks:\n{irqs}"
    );
    let pci = sh(&sb, "cat /proc/bus/pci/devices 2>/dev/null | wc -l").await?;
    assert_eq!(pci.trim(), "0", "the guest has PCI devices");
    // The kernel is the guest's own, not the host's.
    let guest = sh(&sb, "uname -r").await?;
    assert_ne!(guest.trim(), nix::sys::utsname::uname()?.release().to_string_lossy());
    sb.destroy().await?;
    Ok(())
}

async fn resources_reach_the_guest() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else {
        return Ok(());
    };
    let spec = SandboxSpec {
        resources: Resources {
            memory_bytes: Some(256 << 20),
            cpus: Some(2.0),
            pids: Some(300),
            // The spec's disk limit, not the tier's 2 GiB default.
            disk_bytes: Some(96 << 20),
        },
        ..Default::default()
    };
    let sb = p.create(spec).await?;
    let mem_kib: u64 = sh(&sb, "awk '/MemTotal/{print $2}' /proc/meminfo")
        .await?
        .trim()
        .parse()?;
    assert!(
        (150 << 10..=256 << 10).contains(&mem_kib),
        "MemTotal {mem_kib} KiB for a 256 MiB guest"
    );
    assert_eq!(sh(&sb, "nproc").await?.trim(), "2");
    let nproc = sh(&sb, "awk '/^Max processes/{print $3, $4}' /proc/self/limits").await?;
    assert_eq!(nproc.trim(), "300 300");
    // The writable disk is the disk limit: filling it stops inside with
    // ENOSPC, and the host file never grows past its size.
    let fill = sb
        .commands()
        .run("dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1; sync")
        .await?;
    let said = String::from_utf8_lossy(&fill.stdout);
    assert!(said.contains("No space left on device"), "{said}");
    let rw = state_dir(&p, sb.id()).join("vm/rw.ext4");
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&rw)?;
    assert_eq!(md.len(), 96 << 20);
    assert!(md.blocks() * 512 <= 96 << 20, "the host file grew past the limit");
    // The sandbox still serves.
    assert_eq!(sh(&sb, "rm /workspace/fill && echo ok").await?.trim(), "ok");
    sb.destroy().await?;
    Ok(())
}

async fn options_the_tier_cannot_honour_are_refused_by_name() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let refused = |spec: SandboxSpec| {
        let p = p.clone();
        async move {
            match p.create(spec).await {
                Err(Error::OptionRefused { option, .. }) => Ok(option),
                Err(e) => Err(format!("not OptionRefused: {e}")),
                Ok(sb) => {
                    let _ = sb.destroy().await;
                    Err("accepted".into())
                }
            }
        }
    };
    let half = SandboxSpec {
        resources: Resources {
            cpus: Some(0.5),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(refused(half).await?, "resources.cpus");
    let tiny = SandboxSpec {
        resources: Resources {
            memory_bytes: Some(32 << 20),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(refused(tiny).await?, "resources.memory_bytes");
    let bind = SandboxSpec {
        binds: vec![namzu::Bind {
            source: "/etc".into(),
            target: "/host-etc".into(),
            writable: false,
        }],
        ..Default::default()
    };
    assert_eq!(refused(bind).await?, "binds");
    let no_image = p.clone().options(MicroVmOptions::default());
    match no_image.create(SandboxSpec::default()).await {
        Err(Error::OptionRefused { option, .. }) => assert_eq!(option, "image"),
        other => return Err(format!("no image: {:?}", other.map(|s| s.id().to_owned())).into()),
    }
    Ok(())
}

/// The sandboxes the provider's state holds.
async fn ids(p: &MicroVmProvider) -> Result<std::collections::BTreeSet<String>, Box<dyn std::error::Error>> {
    Ok(p.list().await?.into_iter().map(|s| s.id).collect())
}

fn tier_error(e: &Error) -> Option<&MicroVmError> {
    e.tier_error::<MicroVmError>()
}

async fn missing_parts_are_typed_errors() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let before = ids(&p).await?;
    let with = |f: &dyn Fn(&mut MicroVmOptions)| {
        let mut o = MicroVmOptions {
            default_image: Some(microvm::IMAGE.into()),
            ..Default::default()
        };
        f(&mut o);
        p.clone().options(o)
    };
    let kernel = with(&|o| o.kernel = Some("/nonexistent/vmlinuz".into()));
    let e = kernel
        .create(SandboxSpec::default())
        .await
        .err()
        .ok_or("created without a kernel")?;
    assert!(
        matches!(tier_error(&e), Some(MicroVmError::KernelNotFound { searched }) if searched == &[PathBuf::from("/nonexistent/vmlinuz")]),
        "{e:?}"
    );
    let qemu = with(&|o| {
        o.vmm = Arc::new(Qemu {
            binary: Some("/nonexistent/qemu-system-x86_64".into()),
        })
    });
    let e = qemu
        .create(SandboxSpec::default())
        .await
        .err()
        .ok_or("created without qemu")?;
    assert!(
        matches!(tier_error(&e), Some(MicroVmError::VmmNotFound { .. })),
        "{e:?}"
    );
    let not_image = SandboxSpec {
        image: Some("/etc/hostname".into()),
        ..Default::default()
    };
    let e = p.create(not_image).await.err().ok_or("booted a file")?;
    assert!(matches!(e, Error::NotAnImage { .. }), "{e:?}");
    // An id is never pulled: missing from the cache, it is missing.
    let unknown = SandboxSpec {
        image: Some(format!("sha256:{}", "0".repeat(64))),
        ..Default::default()
    };
    let e = p.create(unknown).await.err().ok_or("booted a missing image")?;
    assert!(matches!(e, Error::ImageNotFound { .. }), "{e:?}");
    // A VMM offering only a link the anchor does not speak.
    let vsock = with(&|o| o.vmm = Arc::new(vsock_only()));
    let e = vsock
        .create(SandboxSpec::default())
        .await
        .err()
        .ok_or("created over no link")?;
    assert!(
        matches!(tier_error(&e), Some(MicroVmError::TransportUnavailable { .. })),
        "{e:?}"
    );
    // KVM where it cannot work is refused by name, never tried.
    match vmm::kvm_unusable() {
        Some(_) => {
            let kvm = with(&|o| o.accel = AccelChoice::Only(Accel::Kvm));
            let e = kvm.create(SandboxSpec::default()).await.err().ok_or("KVM accepted")?;
            assert!(
                matches!(
                    tier_error(&e),
                    Some(MicroVmError::AccelUnavailable { accel: Accel::Kvm, .. })
                ),
                "{e:?}"
            );
            assert_eq!(vmm::choose_accel(AccelChoice::Auto)?, Accel::Tcg);
        }
        None => assert_eq!(vmm::choose_accel(AccelChoice::Auto)?, Accel::Kvm),
    }
    // Nothing was left behind by the refusals.
    assert_eq!(ids(&p).await?, before);
    Ok(())
}

/// qemu, reshaped: its kernel command line edited (how a guest that never
/// reaches the agent is made), or its transports replaced.
#[derive(Debug)]
struct Reshaped {
    edit: (&'static str, &'static str),
    transports: Option<Vec<vmm::Transport>>,
}

fn edited_cmdline(from: &'static str, to: &'static str) -> Reshaped {
    Reshaped {
        edit: (from, to),
        transports: None,
    }
}

fn vsock_only() -> Reshaped {
    Reshaped {
        edit: ("", ""),
        transports: Some(vec![vmm::Transport::Vsock]),
    }
}

impl Vmm for Reshaped {
    fn name(&self) -> &'static str {
        "qemu-reshaped"
    }
    fn binary(&self) -> Result<PathBuf, MicroVmError> {
        Qemu::default().binary()
    }
    fn transports(&self) -> Vec<vmm::Transport> {
        self.transports.clone().unwrap_or_else(|| Qemu::default().transports())
    }
    fn argv(&self, vm: &VmConfig) -> Result<Vec<String>, MicroVmError> {
        let argv = Qemu::default().argv(vm)?;
        if self.edit.0.is_empty() {
            return Ok(argv);
        }
        Ok(argv.into_iter().map(|a| a.replace(self.edit.0, self.edit.1)).collect())
    }
}

async fn a_guest_that_never_serves_fails_with_its_console() -> R {
    let _serial = serial().await;
    // No init: the kernel panics; with panic=-1 the VM ends at once.
    let Some(p) = provider(|o| o.vmm = Arc::new(edited_cmdline("rdinit=/init", "rdinit=/nonexistent"))) else {
        return Ok(());
    };
    let before = ids(&p).await?;
    let e = p
        .create(SandboxSpec::default())
        .await
        .err()
        .ok_or("booted without init")?;
    match tier_error(&e) {
        Some(MicroVmError::GuestExited { console_tail, .. }) => {
            assert!(console_tail.contains("Kernel panic"), "console: {console_tail}")
        }
        _ => return Err(format!("not GuestExited: {e}").into()),
    }
    // The same, made to hang (panic=0 waits forever): the boot budget.
    let Some(p) = provider(|o| {
        o.vmm = Arc::new(edited_cmdline("panic=-1 rdinit=/init", "panic=0 rdinit=/nonexistent"));
        o.boot_budget = Duration::from_secs(20);
    }) else {
        return Ok(());
    };
    let start = Instant::now();
    let e = p
        .create(SandboxSpec::default())
        .await
        .err()
        .ok_or("booted without init")?;
    match tier_error(&e) {
        Some(MicroVmError::BootTimeout {
            console_tail, budget, ..
        }) => {
            assert_eq!(*budget, Duration::from_secs(20));
            assert!(console_tail.contains("Kernel panic"), "console: {console_tail}");
        }
        _ => return Err(format!("not BootTimeout: {e}").into()),
    }
    assert!(start.elapsed() < Duration::from_secs(60));
    // Neither left a VM or a state directory behind.
    assert_eq!(ids(&p).await?, before);
    Ok(())
}

async fn destroy_stops_the_vm_and_removes_its_disk() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let sb = p.create(SandboxSpec::default()).await?;
    let id = sb.id().to_owned();
    let dir = state_dir(&p, &id);
    let pid = vmm_pid(&dir).ok_or("no VMM")?;
    assert!(dir.join("vm/rw.ext4").is_file());
    // Another process (another provider on the same state) reaches it by id.
    let other = provider(|_| {}).ok_or("provider")?;
    let again = other.connect(&id).await?;
    assert_eq!(sh(&again, "echo $((6*7))").await?.trim(), "42");
    drop(again);
    sb.destroy().await?;
    assert!(gone_within(pid, Duration::from_secs(5)).await, "qemu outlived destroy");
    assert!(!dir.exists(), "the writable disk outlived destroy");
    assert!(matches!(other.connect(&id).await, Err(Error::SandboxNotFound { .. })));
    Ok(())
}

async fn a_vm_without_its_anchor_or_its_state_does_not_run_on() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    // The anchor killed: qemu dies with it, gc removes the rest.
    let sb = p.create(SandboxSpec::default()).await?;
    let id = sb.id().to_owned();
    let dir = state_dir(&p, &id);
    let pid = vmm_pid(&dir).ok_or("no VMM")?;
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json"))?)?;
    let anchor = meta["pid"].as_i64().ok_or("no anchor pid")? as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(anchor), nix::sys::signal::Signal::SIGKILL)?;
    assert!(
        gone_within(pid, Duration::from_secs(5)).await,
        "qemu outlived its anchor"
    );
    drop(sb);
    let removed = p.gc().await?;
    assert!(removed.contains(&id), "gc removed {removed:?}");
    assert!(!dir.exists());
    // The state removed behind namzu's back: the anchor stops the VM.
    let sb = p.create(SandboxSpec::default()).await?;
    let dir = state_dir(&p, sb.id());
    let pid = vmm_pid(&dir).ok_or("no VMM")?;
    std::fs::remove_dir_all(&dir)?;
    assert!(
        gone_within(pid, Duration::from_secs(10)).await,
        "qemu outlived its state"
    );
    Ok(())
}

/// Dirty page-cache bytes inside the guest.
async fn guest_dirty(sb: &namzu::Sandbox) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(sh(sb, "awk '/^Dirty:/{print $2}' /proc/meminfo")
        .await?
        .trim()
        .parse::<u64>()?
        << 10)
}

async fn flush_writes_back_the_guests_dirty_pages() -> R {
    let _serial = serial().await;
    let Some(p) = provider(|_| {}) else { return Ok(()) };
    let sb = p.create(SandboxSpec::default()).await?;
    // Below the guest's background writeback threshold (10% of its
    // memory), so the kernel leaves it dirty on its own.
    const BIG: u64 = 24 << 20;
    sh(&sb, "head -c 25165824 /dev/zero > /workspace/durable").await?;
    let before = guest_dirty(&sb).await?;
    let took = sb.flush(Duration::from_secs(30)).await?;
    let after = guest_dirty(&sb).await?;
    assert!(took < Duration::from_secs(30));
    assert!(
        before >= BIG * 3 / 4,
        "not dirty before the flush: {} MiB",
        before >> 20
    );
    assert!(
        after + BIG * 3 / 4 <= before,
        "flush wrote nothing back: {} → {} MiB",
        before >> 20,
        after >> 20
    );
    sb.destroy().await?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let tests: Vec<(&str, microvm::Body)> = vec![
        ("the_vmm_runs_confined", || Box::pin(the_vmm_runs_confined())),
        ("the_guest_has_only_the_configured_devices", || {
            Box::pin(the_guest_has_only_the_configured_devices())
        }),
        ("resources_reach_the_guest", || Box::pin(resources_reach_the_guest())),
        ("options_the_tier_cannot_honour_are_refused_by_name", || {
            Box::pin(options_the_tier_cannot_honour_are_refused_by_name())
        }),
        ("missing_parts_are_typed_errors", || {
            Box::pin(missing_parts_are_typed_errors())
        }),
        ("a_guest_that_never_serves_fails_with_its_console", || {
            Box::pin(a_guest_that_never_serves_fails_with_its_console())
        }),
        ("destroy_stops_the_vm_and_removes_its_disk", || {
            Box::pin(destroy_stops_the_vm_and_removes_its_disk())
        }),
        ("a_vm_without_its_anchor_or_its_state_does_not_run_on", || {
            Box::pin(a_vm_without_its_anchor_or_its_state_does_not_run_on())
        }),
        ("flush_writes_back_the_guests_dirty_pages", || {
            Box::pin(flush_writes_back_the_guests_dirty_pages())
        }),
    ];
    microvm::run_trials(tests, None)
}
