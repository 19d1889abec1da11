//! The sandbox's root filesystem, built by G inside its own mount namespace
//! and entered with `pivot_root`.
//!
//! Layout (the `host` view):
//!
//! | path | what | flags |
//! |---|---|---|
//! | `/` | tmpfs, read-only once built | nosuid, nodev |
//! | `/usr /bin /sbin /lib* /opt` | host directories (or the same symlinks) | ro, nosuid, nodev |
//! | `/etc` | a curated copy: no shadow, gshadow, sudoers, ssh keys, machine-id | ro (part of `/`) |
//! | `/tmp /run /home /root /dev/shm` | fresh tmpfs, `tmpfs_bytes` each | nosuid, nodev |
//! | `/workspace` | the sandbox's host directory | rw, nosuid, nodev |
//! | `/proc` | a new procfs for the new pid namespace, masked like Docker | nosuid, nodev, noexec |
//! | `/dev` | tmpfs with null, zero, full, random, urandom, tty bound in; devpts; shm | nosuid, noexec |
//!
//! No host mount survives: the old root is detached after the pivot.

use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use namzu_proto::launch::LaunchSpec;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The new root is assembled here, on a tmpfs mounted in the sandbox's own
/// mount namespace (the host's /tmp is untouched).
const NEW_ROOT: &str = "/tmp";

/// A failed mount step: which, where, and the kernel's answer.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("{step} {target}: {source}")]
    Mount {
        step: &'static str,
        target: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("{step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn m<'a>(step: &'static str, target: &'a Path) -> impl Fn(nix::errno::Errno) -> RootfsError + 'a {
    move |source| RootfsError::Mount {
        step,
        target: target.to_path_buf(),
        source,
    }
}

fn fsio<'a>(step: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

const NONE: Option<&str> = None;

/// Host directories shown read-only, when the host has them.
const HOST_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"];

/// The sandbox's resolver is the agent's, on loopback (`crate::egress`).
use super::weaken;
use crate::egress::RESOLV_CONF;

use super::etc::{ETC_DIRS, ETC_FILES};

/// Device nodes bound in from the host (no mknod in a user namespace).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// procfs entries hidden behind /dev/null, as Docker does.
const PROC_NULLED: &[&str] = &[
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "timer_stats",
];
/// procfs directories hidden behind an empty read-only tmpfs.
const PROC_EMPTIED: &[&str] = &["acpi", "scsi"];
/// procfs entries made read-only.
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs", "asound"];

/// Entries of an image's root that the sandbox provides itself.
const OWN_ENTRIES: &[&str] = &["proc", "dev", "sys", "tmp", "run", "home", "root", "workspace"];

/// Builds the root and pivots into it. `etc`: the shared curated copy
/// ([`super::etc::cached`]) to bind at `/etc`; without one (or in a test
/// build told to remove that layer) /etc is made here, file by file.
pub fn build(
    spec: &LaunchSpec,
    workspace: BorrowedFd<'_>,
    image: Option<BorrowedFd<'_>>,
    etc: Option<BorrowedFd<'_>>,
    binds: &[BorrowedFd<'_>],
) -> Result<(), RootfsError> {
    let root = Path::new(NEW_ROOT);
    // Always read-only, but in a test build told to remove that layer.
    let ro = if weaken::in_spec(spec, "readonly") {
        MsFlags::empty()
    } else {
        MsFlags::MS_RDONLY
    };
    // Nothing done from here on propagates back to the host.
    mount(NONE, "/", NONE, MsFlags::MS_REC | MsFlags::MS_PRIVATE, NONE).map_err(m("make / private", Path::new("/")))?;
    tmpfs(root, "mode=0755,size=16m", MsFlags::empty())?;
    crate::timeline::mark("rootfs.private");

    match image {
        // The image view: every top-level entry of the image, read-only,
        // its own /etc included. The fd's magic link is the source, so the
        // host path of the image cache need not be reachable from here.
        Some(fd) => {
            let base = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            let entries = fs::read_dir(&base).map_err(fsio("read image root", &base))?;
            for e in entries.flatten() {
                let name = e.file_name();
                if OWN_ENTRIES.iter().any(|own| name == *own) {
                    continue;
                }
                show_host_path(&base.join(&name), &root.join(&name), ro)?;
            }
        }
        // The host view: host binaries and libraries, and a curated /etc.
        None => {
            for d in HOST_DIRS {
                show_host_path(&Path::new("/").join(d), &root.join(d), ro)?;
            }
            crate::timeline::mark("rootfs.host-dirs");
            if weaken::in_spec(spec, "etc") {
                show_host_path(Path::new("/etc"), &root.join("etc"), ro)?;
            } else if let Some(fd) = etc {
                bind_etc(root, fd, ro)?;
            } else {
                build_etc(root, ro)?;
            }
        }
    }
    crate::timeline::mark("rootfs.image-or-etc");
    let size = format!("size={}", spec.tmpfs_bytes);
    for (d, mode) in [("tmp", "1777"), ("run", "0755"), ("home", "0755"), ("root", "0700")] {
        tmpfs(&root.join(d), &format!("mode={mode},{size}"), MsFlags::empty())?;
    }
    if image.is_none() && etc.is_some() {
        // A fresh identity, so nothing keyed on the host's machine-id leaks
        // in; the shared /etc links to it.
        let id = root.join(super::etc::MACHINE_ID.trim_start_matches('/'));
        fs::write(&id, format!("{:032x}\n", rand::random::<u128>())).map_err(fsio("write", &id))?;
    }

    // An image's own /etc/resolv.conf would name resolvers the sandbox
    // cannot reach; the agent's goes over it. (Without the file, libc
    // resolvers default to loopback anyway.)
    let image_resolv = root.join("etc/resolv.conf");
    if image.is_some() && image_resolv.is_file() {
        let ours = root.join("run/namzu-resolv.conf");
        fs::write(&ours, RESOLV_CONF).map_err(fsio("write", &ours))?;
        mount(Some(&ours), &image_resolv, NONE, MsFlags::MS_BIND, NONE).map_err(m("bind", &image_resolv))?;
        remount(
            &image_resolv,
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        )?;
    }

    let ws = root.join("workspace");
    mkdir(&ws)?;
    // The fd was opened by the launcher with host credentials; its magic
    // link is the bind source, so no host path is resolved from in here.
    let src = PathBuf::from(format!("/proc/self/fd/{}", workspace.as_raw_fd()));
    mount(Some(&src), &ws, NONE, MsFlags::MS_BIND, NONE).map_err(m("bind workspace", &ws))?;
    remount(&ws, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;

    // Requested binds go last, so they may sit on top of /tmp or /workspace.
    for (b, fd) in spec.binds.iter().zip(binds) {
        let target = root.join(b.target.trim_start_matches('/'));
        let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let is_dir = fs::metadata(&src).map_err(fsio("stat bind source", &src))?.is_dir();
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(fsio("mkdir", parent))?;
        }
        if is_dir {
            mkdir(&target)?;
        } else if !target.exists() {
            fs::write(&target, b"").map_err(fsio("create", &target))?;
        }
        mount(Some(&src), &target, NONE, MsFlags::MS_BIND | MsFlags::MS_REC, NONE).map_err(m("bind", &target))?;
        let flags = if b.writable { MsFlags::empty() } else { ro };
        remount(&target, flags | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    }

    crate::timeline::mark("rootfs.binds");
    build_dev(root, &size)?;
    crate::timeline::mark("rootfs.dev");
    build_proc(root)?;
    crate::timeline::mark("rootfs.proc");

    // Enter it: pivot_root(".", ".") stacks the old root under the new one,
    // and the lazy unmount takes every host mount away with it.
    let step = |s| m(s, root);
    nix::unistd::chdir(root).map_err(step("chdir new root"))?;
    nix::unistd::pivot_root(".", ".").map_err(step("pivot_root"))?;
    crate::timeline::mark("rootfs.pivot");
    umount2(".", MntFlags::MNT_DETACH).map_err(step("detach old root"))?;
    crate::timeline::mark("rootfs.detached");
    nix::unistd::chdir("/").map_err(step("chdir /"))?;
    remount(Path::new("/"), ro | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), RootfsError> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(fsio("mkdir", p)(e)),
    }
}

fn tmpfs(target: &Path, data: &str, extra: MsFlags) -> Result<(), RootfsError> {
    mkdir(target)?;
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra,
        Some(data),
    )
    .map_err(m("mount tmpfs", target))
}

/// Re-applies a bind mount's flags, keeping the flags the kernel locked on
/// it (a user namespace may add restrictions, never drop them).
fn remount(target: &Path, flags: MsFlags) -> Result<(), RootfsError> {
    let locked = nix::sys::statvfs::statvfs(target)
        .map_err(m("statvfs", target))?
        .flags();
    use nix::sys::statvfs::FsFlags;
    let mut all = flags | MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    for (have, keep) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if locked.contains(have) {
            all |= keep;
        }
    }
    mount(NONE, target, NONE, all, NONE).map_err(m("remount", target))
}

/// Shows a host directory read-only at `target`, or recreates it as the
/// same symlink (merged-/usr hosts have /bin -> usr/bin).
fn show_host_path(host: &Path, target: &Path, ro: MsFlags) -> Result<(), RootfsError> {
    let meta = match fs::symlink_metadata(host) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fsio("stat", host)(e)),
    };
    if meta.file_type().is_symlink() {
        let to = fs::read_link(host).map_err(fsio("readlink", host))?;
        return symlink(&to, target).map_err(fsio("symlink", target));
    }
    if meta.is_dir() {
        mkdir(target)?;
    } else {
        fs::write(target, b"").map_err(fsio("create", target))?;
    }
    mount(Some(host), target, NONE, MsFlags::MS_BIND | MsFlags::MS_REC, NONE).map_err(m("bind", target))?;
    remount(target, ro | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)
}

/// The shared curated copy at `/etc`, read-only, and the host's
/// directories of [`ETC_DIRS`] over its empty mount points.
fn bind_etc(root: &Path, fd: BorrowedFd<'_>, ro: MsFlags) -> Result<(), RootfsError> {
    let etc = root.join("etc");
    mkdir(&etc)?;
    let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mount(Some(&src), &etc, NONE, MsFlags::MS_BIND, NONE).map_err(m("bind /etc", &etc))?;
    remount(&etc, ro | MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;
    for d in ETC_DIRS {
        let target = etc.join(d);
        if target.is_dir() {
            show_host_path(&Path::new("/etc").join(d), &target, ro)?;
        }
    }
    Ok(())
}

fn build_etc(root: &Path, ro: MsFlags) -> Result<(), RootfsError> {
    let etc = root.join("etc");
    mkdir(&etc)?;
    for f in ETC_FILES {
        let host = Path::new("/etc").join(f);
        let target = etc.join(f);
        match fs::symlink_metadata(&host) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let to = fs::read_link(&host).map_err(fsio("readlink", &host))?;
                symlink(&to, &target).map_err(fsio("symlink", &target))?;
            }
            Ok(meta) if meta.is_file() => {
                fs::copy(&host, &target).map_err(fsio("copy", &host))?;
            }
            _ => {}
        }
    }
    for d in ETC_DIRS {
        show_host_path(&Path::new("/etc").join(d), &etc.join(d), ro)?;
    }
    fs::write(etc.join("hostname"), b"namzu\n").map_err(fsio("write", &etc))?;
    fs::write(etc.join("resolv.conf"), RESOLV_CONF).map_err(fsio("write", &etc))?;
    // A fresh identity, so nothing keyed on the host's machine-id leaks in.
    fs::write(etc.join("machine-id"), format!("{:032x}\n", rand::random::<u128>())).map_err(fsio("write", &etc))?;
    Ok(())
}

/// A minimal /dev under `root`: a tmpfs with the safe nodes bound from the
/// current /dev, its own devpts, /dev/shm (`size`, e.g. `size=64m`) and
/// the fd links. Also the microVM guest's /dev (`crate::guest`).
pub(crate) fn build_dev(root: &Path, size: &str) -> Result<(), RootfsError> {
    let dev = root.join("dev");
    // Not nodev: the bound host nodes must work. noexec instead.
    mkdir(&dev)?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(m("mount tmpfs", &dev))?;
    for d in DEVICES {
        let target = dev.join(d);
        fs::write(&target, b"").map_err(fsio("create", &target))?;
        let host = Path::new("/dev").join(d);
        mount(Some(&host), &target, NONE, MsFlags::MS_BIND, NONE).map_err(m("bind device", &target))?;
    }
    let pts = dev.join("pts");
    mkdir(&pts)?;
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(m("mount devpts", &pts))?;
    symlink("pts/ptmx", dev.join("ptmx")).map_err(fsio("symlink", &dev))?;
    tmpfs(&dev.join("shm"), &format!("mode=1777,{size}"), MsFlags::MS_NOEXEC)?;
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, dev.join(name)).map_err(fsio("symlink", &dev))?;
    }
    fs::set_permissions(&dev, fs::Permissions::from_mode(0o755)).map_err(fsio("chmod", &dev))?;
    Ok(())
}

/// A fresh /proc under `root`, with the paths a sandbox must not read or
/// write masked or made read-only (`root/dev/null` must exist). Also the
/// microVM guest's.
pub(crate) fn build_proc(root: &Path) -> Result<(), RootfsError> {
    let proc = root.join("proc");
    mkdir(&proc)?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        NONE,
    )
    .map_err(m("mount proc", &proc))?;
    let null = root.join("dev/null");
    for f in PROC_NULLED {
        let target = proc.join(f);
        if target.exists() {
            mount(Some(&null), &target, NONE, MsFlags::MS_BIND, NONE).map_err(m("mask", &target))?;
        }
    }
    for d in PROC_EMPTIED {
        let target = proc.join(d);
        if target.is_dir() {
            mount(
                Some("tmpfs"),
                &target,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=0"),
            )
            .map_err(m("mask", &target))?;
        }
    }
    for e in PROC_READONLY {
        let target = proc.join(e);
        if target.exists() {
            mount(Some(&target), &target, NONE, MsFlags::MS_BIND | MsFlags::MS_REC, NONE)
                .map_err(m("bind", &target))?;
            remount(
                &target,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            )?;
        }
    }
    Ok(())
}
