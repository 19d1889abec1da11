//! The VMM behind the tier: a small trait, so Firecracker or
//! cloud-hypervisor can follow qemu without touching the provider.
//!
//! A [`Vmm`] turns one [`VmConfig`] into a command line whose process
//! finds the link on fd [`LINK_FD`](super::anchor::LINK_FD) and the serial
//! console on fd [`CONSOLE_FD`](super::anchor::CONSOLE_FD), and says which
//! link [`Transport`] it offers. [`Qemu`] drives qemu's `microvm` machine:
//! virtio-mmio devices only, no default devices, no NIC, no display, no
//! option ROMs, qemu's seccomp sandbox on, QMP on a host-side socket.

use std::path::{Path, PathBuf};

use super::anchor::{CONSOLE_FD, LINK_FD};
use super::MicroVmError;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Accel {
    /// Hardware virtualisation (needs a usable /dev/kvm with VMX or SVM).
    Kvm,
    /// qemu's software emulation: works anywhere, much slower.
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// What the caller asked for: one accelerator, or whichever works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM where it is usable, else TCG (the choice is reported).
    #[default]
    Auto,
    /// This one, or a typed refusal.
    Only(Accel),
}

impl std::str::FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Only(Accel::Kvm)),
            "tcg" => Ok(Self::Only(Accel::Tcg)),
            _ => Err(format!("accel {s:?}: expected auto, kvm or tcg")),
        }
    }
}

/// Why KVM cannot be used here, or `None` when it can: /dev/kvm must open
/// read-write and the CPU must offer VMX or SVM (a guest of a PVM host has
/// /dev/kvm but no VMX, and stock kernels hang under it).
pub fn kvm_unusable() -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Some(format!("/dev/kvm: {e}"));
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>();
    if !flags.contains(&"vmx") && !flags.contains(&"svm") {
        return Some(
            "the CPU offers neither VMX nor SVM (/dev/kvm exists, but a stock guest kernel would hang)".into(),
        );
    }
    None
}

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
        push(&["-append", "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init"]);
        push(&[
            "-chardev",
            &format!("socket,id=con,fd={CONSOLE_FD}"),
            "-serial",
            "chardev:con",
        ]);
        push(&["-device", "virtio-serial-device,max_ports=2"]);
        push(&["-chardev", &format!("socket,id=link,fd={LINK_FD}")]);
        push(&["-device", &format!("virtserialport,chardev=link,name={}", vm.port_name)]);
        push(&[
            "-drive",
            &format!("id=base,file={},format=raw,if=none,readonly=on", s(&vm.base_disk)),
            "-device",
            "virtio-blk-device,drive=base",
        ]);
        push(&[
            "-drive",
            &format!("id=rw,file={},format=raw,if=none,discard=unmap", s(&vm.rw_disk)),
            "-device",
            "virtio-blk-device,drive=rw",
        ]);
        push(&["-qmp", &format!("unix:{},server=on,wait=off", s(&vm.control_socket))]);
        Ok(a)
    }
}
