//! `namzu-agent` as a microVM's init (PID 1 of the guest).
//!
//! The kernel starts the agent from the initramfs namzu built (the agent
//! and the kernel modules it lists, nothing else) as PID 1 with `--guest`. [`boot`] then does what
//! an initramfs's init does and no more: mounts /dev, /proc and /sys, loads
//! the listed modules in order, finds the two disks by their ext4 labels
//! (the image, read-only, and the sandbox's writable disk), reads and
//! removes the host's [`GuestSpec`] from the writable disk, joins the two
//! with overlayfs, moves the new root over `/` and enters it, brings up
//! `lo`, and sets the limits. It returns the agent's own command line for
//! that sandbox; `main` then serves as on every tier (the link on the
//! virtio-serial port the spec names, commands as the image's user with no
//! capability, no_new_privs, namzu's seccomp filter). When the agent exits,
//! the kernel panics and reboots, which qemu (`-no-reboot`) takes as the
//! end of the VM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use namzu_proto::launch::{GuestSpec, BASE_DISK_LABEL, GUEST_MODULES_LIST, GUEST_SPEC_PATH, RW_DISK_LABEL};
use nix::mount::{mount, MsFlags};

/// The directories commands may write (on the writable disk); the rest of
/// the image is read-only to them.
pub const WRITABLE: &[&str] = &["/workspace", "/tmp", "/var/tmp", "/run", "/home", "/root"];

/// How long the disks have to appear once their driver is loaded.
const DISK_WAIT: Duration = Duration::from_secs(10);
/// How long the control port may lag the link's (the host announces both
/// at once).
const CONTROL_WAIT: Duration = Duration::from_secs(2);

/// A step of the guest's boot that failed.
#[derive(Debug, thiserror::Error)]
#[error("guest boot: {step}: {message}")]
pub struct BootError {
    /// What was being done.
    pub step: String,
    /// Why it failed.
    pub message: String,
}

fn fail(step: impl Into<String>) -> impl FnOnce(String) -> BootError {
    let step = step.into();
    move |message| BootError { step, message }
}

fn mnt(source: &str, target: &str, fstype: &str, flags: MsFlags, data: &str) -> Result<(), BootError> {
    std::fs::create_dir_all(target).map_err(|e| fail(format!("mkdir {target}"))(e.to_string()))?;
    mount(
        Some(source),
        target,
        Some(fstype),
        flags,
        (!data.is_empty()).then_some(data),
    )
    .map_err(|e| fail(format!("mount {fstype} on {target}"))(e.to_string()))
}

/// Boots the guest as described in the module docs; returns the agent's
/// arguments (`argv[0]` first) and leaves the token in `NAMZU_AGENT_TOKEN`.
pub fn boot() -> Result<Vec<String>, BootError> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV;
    mnt(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "mode=0755",
    )?;
    console_stdio();
    mnt("proc", "/proc", "proc", nosuid, "")?;
    mnt("sysfs", "/sys", "sysfs", nosuid, "")?;
    load_modules()?;
    let base = wait_for_disk(BASE_DISK_LABEL)?;
    let rw = wait_for_disk(RW_DISK_LABEL)?;
    let path = |p: &PathBuf| p.to_string_lossy().into_owned();
    mnt(
        &path(&base),
        "/mnt/base",
        "ext4",
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
        "noload",
    )?;
    mnt(&path(&rw), "/mnt/rw", "ext4", MsFlags::MS_NODEV, "")?;
    let spec = take_spec(Path::new("/mnt/rw").join(GUEST_SPEC_PATH))?;
    for d in ["/mnt/rw/upper", "/mnt/rw/work"] {
        std::fs::create_dir_all(d).map_err(|e| fail(format!("mkdir {d}"))(e.to_string()))?;
    }
    mnt(
        "overlay",
        "/mnt/root",
        "overlay",
        MsFlags::MS_NODEV,
        "lowerdir=/mnt/base,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work",
    )?;
    // What commands may write: these directories, on the writable disk;
    // the rest of the image is read-only, as the docker tier's root is.
    for d in WRITABLE {
        let at = format!("/mnt/root{d}");
        std::fs::create_dir_all(&at).map_err(|e| fail(format!("mkdir {at}"))(e.to_string()))?;
        mount(Some(&*at), &*at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| fail(format!("bind {at}"))(e.to_string()))?;
    }
    for d in ["/mnt/root/proc", "/mnt/root/dev"] {
        std::fs::create_dir_all(d).map_err(|e| fail(format!("mkdir {d}"))(e.to_string()))?;
    }
    // /tmp and /var/tmp are the world's: sticky, as every distribution has them.
    for t in ["/mnt/root/tmp", "/mnt/root/var/tmp"] {
        let _ = std::fs::set_permissions(t, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
    }
    mount(
        None::<&str>,
        "/mnt/root",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| fail("make the image read-only")(e.to_string()))?;
    // A fresh /dev with the safe nodes only (never the disks or the link's
    // port), and a fresh /proc with the kernel's knobs masked or read-only:
    // the local tier's, built from the initramfs's devtmpfs, which stays
    // behind, unreachable, with /sys.
    let root = Path::new("/mnt/root");
    crate::sandbox::rootfs::build_dev(root, "size=64m").map_err(|e| fail("build /dev")(e.to_string()))?;
    crate::sandbox::rootfs::build_proc(root).map_err(|e| fail("build /proc")(e.to_string()))?;
    // The link's port, opened now (its node stays in the initramfs's /dev):
    // the agent serves on this descriptor.
    let port = crate::port::wait_for(&spec.port, DISK_WAIT).map_err(|e| fail("find the link's port")(e.to_string()))?;
    let port_fd = crate::port::open_fd(&port).map_err(|e| fail(format!("open {}", port.display()))(e.to_string()))?;
    // The control port, where each host starts its session
    // (crate::port_session); a VMM that offers none gets the bare link.
    let ctl_name = namzu_proto::launch::control_port_name(&spec.port);
    let listen = match crate::port::wait_for(&ctl_name, CONTROL_WAIT) {
        Ok(ctl) => {
            let ctl_fd =
                crate::port::open_fd(&ctl).map_err(|e| fail(format!("open {}", ctl.display()))(e.to_string()))?;
            format!("portfd:{port_fd},{ctl_fd}")
        }
        Err(_) => format!("portfd:{port_fd}"),
    };
    switch_root("/mnt/root")?;
    nix::unistd::sethostname("namzu").map_err(|e| fail("hostname")(e.to_string()))?;
    crate::sandbox::harden::loopback_up().map_err(|e| fail("bring up lo")(e.to_string()))?;
    let mut reports = crate::sandbox::harden::set_rlimits(&spec.rlimits).map_err(|e| fail("rlimits")(e.to_string()))?;
    // What main's --seccomp needs, and what every command inherits.
    nix::sys::prctl::set_no_new_privs().map_err(|e| fail("no_new_privs")(e.to_string()))?;
    reports.push(("no_new_privs".into(), "1".into()));
    for (k, v) in &spec.env {
        std::env::set_var(k, v);
    }
    for (name, value) in &spec.limits {
        std::env::set_var(namzu_proto::limits::env_var(name), value.to_string());
    }
    std::env::set_var("NAMZU_AGENT_TOKEN", &spec.token);
    let mut argv: Vec<String> = [
        "namzu-agent",
        "--listen",
        &listen,
        "--root",
        "/workspace",
        "--root",
        "/",
        "--egress",
        "--command-user",
        &spec.command_user,
        "--tighten-mounts",
        "--seccomp",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for r in spec
        .reports
        .iter()
        .cloned()
        .chain(reports.into_iter().map(|(k, v)| format!("{k}={v}")))
    {
        argv.extend(["--report".into(), r]);
    }
    Ok(argv)
}

/// Stdin, stdout and stderr on the console: the kernel gives init none when
/// the initramfs has no /dev/console node, and ours has no /dev at all.
fn console_stdio() {
    if let Ok(c) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/console") {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            #[allow(unsafe_code)]
            // SAFETY: dup2 onto the standard descriptors, which nothing in
            // this process has opened (init starts with none).
            unsafe {
                libc::dup2(c.as_raw_fd(), fd);
            }
        }
    }
}

/// Loads the modules the initramfs lists, in its order (dependencies
/// first); one the kernel already has is fine.
fn load_modules() -> Result<(), BootError> {
    let list = match std::fs::read_to_string(Path::new("/").join(GUEST_MODULES_LIST)) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail("read the module list")(e.to_string())),
    };
    for m in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f = std::fs::File::open(m).map_err(|e| fail(format!("open module {m}"))(e.to_string()))?;
        match nix::kmod::finit_module(&f, c"", nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(fail(format!("load module {m}"))(e.to_string())),
        }
    }
    Ok(())
}

/// The block device whose ext4 superblock carries `label`, waited for.
fn wait_for_disk(label: &str) -> Result<PathBuf, BootError> {
    let start = Instant::now();
    loop {
        if let Some(p) = disk_labelled(label) {
            return Ok(p);
        }
        if start.elapsed() > DISK_WAIT {
            return Err(fail(format!("find the disk labelled {label}"))(format!(
                "none after {DISK_WAIT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn disk_labelled(label: &str) -> Option<PathBuf> {
    use std::io::Read;
    let dir = std::fs::read_dir("/sys/block").ok()?;
    dir.flatten().find_map(|e| {
        let dev = Path::new("/dev").join(e.file_name());
        let mut sb = [0u8; 2048];
        std::fs::File::open(&dev).ok()?.read_exact(&mut sb).ok()?;
        (ext4_label(&sb)? == label).then_some(dev)
    })
}

/// The volume label of an ext2/3/4 superblock (at byte 1024 of the
/// device): `s_magic` 0xEF53 at +56, `s_volume_name[16]` at +120.
pub fn ext4_label(dev_start: &[u8]) -> Option<String> {
    let sb = dev_start.get(1024..1024 + 136)?;
    if sb[56..58] != [0x53, 0xEF] {
        return None;
    }
    let name = &sb[120..136];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Reads the host's spec and removes it, durably, before anything else
/// could read the disk.
fn take_spec(path: PathBuf) -> Result<GuestSpec, BootError> {
    let text = std::fs::read(&path).map_err(|e| fail(format!("read {}", path.display()))(e.to_string()))?;
    let spec: GuestSpec =
        serde_json::from_slice(&text).map_err(|e| fail(format!("parse {}", path.display()))(e.to_string()))?;
    std::fs::remove_file(&path).map_err(|e| fail(format!("remove {}", path.display()))(e.to_string()))?;
    nix::unistd::sync();
    Ok(spec)
}

/// Makes `new` the root: chdir there, move it over `/`, chroot into it.
/// The initramfs stays beneath, unreachable by any path.
fn switch_root(new: &str) -> Result<(), BootError> {
    std::env::set_current_dir(new).map_err(|e| fail("chdir to the new root")(e.to_string()))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(|e| fail("move the new root over /")(e.to_string()))?;
    nix::unistd::chroot(".").map_err(|e| fail("chroot")(e.to_string()))?;
    std::env::set_current_dir("/").map_err(|e| fail("chdir /")(e.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_label_of_a_real_ext4_superblock() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("d.img");
        std::fs::File::create(&img)?.set_len(4 << 20)?;
        let made = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "namzu-rw"])
            .arg(&img)
            .status();
        match made {
            Ok(s) if s.success() => {}
            other => return Err(format!("mkfs.ext4: {other:?}").into()),
        }
        let bytes = std::fs::read(&img)?;
        assert_eq!(super::ext4_label(&bytes).as_deref(), Some("namzu-rw"));
        assert_eq!(super::ext4_label(&[0u8; 4096]), None);
        Ok(())
    }
}
