//! The VMM behind the tier: a small trait, so Firecracker or
//! cloud-hypervisor can follow qemu without touching the provider.
//!
//! A [`Vmm`] turns one [`VmConfig`] into a command line whose process
//! finds the link on fd [`LINK_FD`] and the serial
//! console on fd [`CONSOLE_FD`], and says which
//! link [`Transport`] it offers. [`Qemu`] drives qemu's `microvm` machine:
//! virtio-mmio devices only, no default devices, no NIC, no display, no
//! option ROMs, qemu's seccomp sandbox on, QMP on a host-side socket.

use std::path::{Path, PathBuf};

use super::anchor::{CONSOLE_FD, CONTROL_FD, INCOMING_FD, LINK_FD};
use super::MicroVmError;

pub use super::accel::{kvm_unusable, Accel, AccelChoice};

/// Resolves a choice against this host.
pub fn choose_accel(choice: AccelChoice) -> Result<Accel, MicroVmError> {
    match (choice, kvm_unusable()) {
        (AccelChoice::Only(Accel::Tcg), _) | (AccelChoice::Auto, Some(_)) => Ok(Accel::Tcg),
        (AccelChoice::Only(Accel::Kvm), Some(reason)) => Err(MicroVmError::AccelUnavailable {
            accel: Accel::Kvm,
            reason,
        }),
        (_, None) => Ok(Accel::Kvm),
    }
}

/// How host and guest agent are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A virtio-serial port, multiplexed (`namzu_proto::mux`).
    VirtioSerial,
    /// AF_VSOCK through /dev/vhost-vsock (each link a connection of its own).
    Vsock,
}

/// One VM, as every VMM needs it described.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The guest kernel.
    pub kernel: PathBuf,
    /// The initramfs (the agent as init, and its modules).
    pub initramfs: PathBuf,
    /// The image, read-only.
    pub base_disk: PathBuf,
    /// The sandbox's writable disk.
    pub rw_disk: PathBuf,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// The accelerator, already chosen.
    pub accel: Accel,
    /// The VMM's control socket (host side only).
    pub control_socket: PathBuf,
    /// The name of the link's port (the guest finds it by name).
    pub port_name: String,
    /// The host's TSC rate in kHz, where it is constant ([`host_tsc_khz`]).
    pub tsc_khz: Option<u64>,
    /// Restores a memory snapshot (read on fd [`INCOMING_FD`]) instead of
    /// booting.
    pub incoming: bool,
}

/// The host's TSC rate in kHz, measured once (20 ms against the monotonic
/// clock, rounded to 1 MHz), where the CPU says its TSC is constant and
/// does not stop; `None` elsewhere.
pub fn host_tsc_khz() -> Option<u64> {
    static KHZ: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if !(has("constant_tsc") && has("nonstop_tsc")) {
            return None;
        }
        measure_tsc_khz()
    })
}

#[cfg(target_arch = "x86_64")]
fn measure_tsc_khz() -> Option<u64> {
    #[allow(unsafe_code)]
    // SAFETY: rdtsc reads a counter every x86_64 CPU has; no memory is touched.
    let tsc = || unsafe { std::arch::x86_64::_rdtsc() };
    let (t0, c0) = (std::time::Instant::now(), tsc());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (c1, ns) = (tsc(), t0.elapsed().as_nanos());
    let khz = u128::from(c1.checked_sub(c0)?) * 1_000_000 / ns.max(1);
    // Rounded to 1 MHz: the guest needs the rate, not this run's jitter.
    u64::try_from((khz + 500) / 1000 * 1000).ok().filter(|k| *k > 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure_tsc_khz() -> Option<u64> {
    None
}

/// A virtual machine monitor.
pub trait Vmm: Send + Sync + std::fmt::Debug {
    /// Its name, for reports and errors.
    fn name(&self) -> &'static str;
    /// The binary it runs, found on the host.
    fn binary(&self) -> Result<PathBuf, MicroVmError>;
    /// The links it can offer here, best first.
    fn transports(&self) -> Vec<Transport>;
    /// The whole command line (binary first) for `vm`.
    fn argv(&self, vm: &VmConfig) -> Result<Vec<String>, MicroVmError>;
}

/// qemu's `microvm` machine (`qemu-system-x86_64`).
#[derive(Debug, Clone, Default)]
pub struct Qemu {
    /// The binary, if not `qemu-system-x86_64` on PATH (or in /usr/bin).
    pub binary: Option<PathBuf>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl Vmm for Qemu {
    fn name(&self) -> &'static str {
        "qemu-microvm"
    }

    fn binary(&self) -> Result<PathBuf, MicroVmError> {
        const NAME: &str = "qemu-system-x86_64";
        if let Some(b) = &self.binary {
            return if b.is_file() {
                Ok(b.clone())
            } else {
                Err(MicroVmError::VmmNotFound {
                    vmm: self.name(),
                    searched: vec![b.clone()],
                })
            };
        }
        let mut searched = Vec::new();
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
            let p = dir.join(NAME);
            if p.is_file() {
                return Ok(p);
            }
            searched.push(p);
        }
        Err(MicroVmError::VmmNotFound {
            vmm: self.name(),
            searched,
        })
    }

    fn transports(&self) -> Vec<Transport> {
        // vhost-vsock (Transport::Vsock) needs /dev/vhost-vsock on the host
        // and the guest's vsock modules; the serial port works everywhere.
        vec![Transport::VirtioSerial]
    }

    fn argv(&self, vm: &VmConfig) -> Result<Vec<String>, MicroVmError> {
        let machine = match vm.accel {
            Accel::Kvm => "microvm,accel=kvm,x-option-roms=off,pit=off,pic=off,rtc=off",
            Accel::Tcg => "microvm,accel=tcg,x-option-roms=off",
        };
        let cpu = match vm.accel {
            Accel::Kvm => "host",
            Accel::Tcg => "max",
        };
        let mut a: Vec<String> = vec![s(&self.binary()?)];
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|x| (*x).to_owned()));
        push(&["-M", machine, "-cpu", cpu]);
        push(&["-m", &format!("{}M", vm.memory_mib), "-smp", &vm.vcpus.to_string()]);
        push(&["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
        push(&[
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ]);
        push(&["-kernel", &s(&vm.kernel), "-initrd", &s(&vm.initramfs)]);
        // quiet: under emulation every console byte costs; panic=-1: the
        // agent's exit ends the VM (with -no-reboot).
        let mut cmdline = String::from("console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init");
        // Under emulation the guest's TSC runs at the host's rate, and its
        // own calibration against the emulated PIT fails whenever the host
        // is busy (then the boot hangs with no usable clocksource): it is
        // told the rate instead.
        if let (Accel::Tcg, Some(khz)) = (vm.accel, vm.tsc_khz) {
            cmdline.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
        }
        // After `--`, the init's own arguments: the agent boots the guest
        // only when told so.
        cmdline.push_str(" -- --guest");
        push(&["-append", &cmdline]);
        push(&[
            "-chardev",
            &format!("socket,id=con,fd={CONSOLE_FD}"),
            "-serial",
            "chardev:con",
        ]);
        // Port 0 is the console's, reserved: two ports need three.
        push(&["-device", "virtio-serial-device,max_ports=3"]);
        push(&["-chardev", &format!("socket,id=link,fd={LINK_FD}")]);
        push(&["-device", &format!("virtserialport,chardev=link,name={}", vm.port_name)]);
        push(&["-chardev", &format!("socket,id=ctl,fd={CONTROL_FD}")]);
        push(&[
            "-device",
            &format!(
                "virtserialport,chardev=ctl,name={}",
                namzu_proto::launch::control_port_name(&vm.port_name)
            ),
        ]);
        push(&[
            "-drive",
            &format!("id=base,file={},format=raw,if=none,readonly=on", s(&vm.base_disk)),
            "-device",
            "virtio-blk-device,drive=base",
        ]);
        push(&[
            "-drive",
            &format!(
                "id=rw,file={},format={},if=none,discard=unmap",
                s(&vm.rw_disk),
                disk_format(&vm.rw_disk)
            ),
            "-device",
            "virtio-blk-device,drive=rw",
        ]);
        push(&["-qmp", &format!("unix:{},server=on,wait=off", s(&vm.control_socket))]);
        // A memory snapshot is saved from a stopped VM; without the run
        // state in it, the VM restored from it runs at once (qemu's
        // autostart) instead of staying stopped as its source was.
        push(&["-global", "migration.store-global-state=off"]);
        if vm.incoming {
            push(&["-incoming", &format!("fd:{INCOMING_FD}")]);
        }
        Ok(a)
    }
}

/// The format of a writable disk, by its name: a fork's is a qcow2
/// overlay on its snapshot's disk, every other one raw.
pub fn disk_format(p: &Path) -> &'static str {
    if p.extension().is_some_and(|e| e == "qcow2") {
        "qcow2"
    } else {
        "raw"
    }
}
