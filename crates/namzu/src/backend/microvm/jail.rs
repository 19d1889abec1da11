//! The VMM's confinement on the host, as Firecracker's jailer does it: the
//! VMM is the process a guest escape lands in, so it holds as little as
//! the host can take away.
//!
//! When the anchor runs as root, the VMM gets, before exec: new network,
//! IPC, UTS and mount namespaces (no interface but a down `lo`: a VMM
//! tricked into opening a socket reaches nothing), a mount view whose root
//! is a fresh tmpfs holding only read-only binds of what qemu loads
//! (`/usr`, `/lib*`, `/etc` for its loader) and the sandbox's own state
//! directory (kernel, initramfs and disks are reached through it), an
//! unprivileged uid and gid of its own with no supplementary groups, and
//! no_new_privs. Unprivileged hosts run the VMM as themselves with
//! no_new_privs. On top, qemu's own seccomp sandbox (`-sandbox on,...`)
//! is always on (see `vmm`).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How to confine the VMM.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JailSpec {
    /// uid and gid to run as (root hosts), none to stay the caller.
    pub ids: Option<(u32, u32)>,
    /// Namespaces and the private mount view (root hosts only).
    pub namespaces: bool,
    /// Host paths shown read-only in the private view.
    pub read_only: Vec<PathBuf>,
    /// Host paths shown writable (the sandbox's state directory).
    pub writable: Vec<PathBuf>,
    /// Where the private root is built (an empty directory of the anchor).
    pub root: PathBuf,
}

/// A jail with every string it needs made before the fork: `enter` runs
/// between fork and exec, where nothing may allocate.
pub struct Prepared {
    ids: Option<(u32, u32)>,
    namespaces: bool,
    root: CString,
    /// (host path, path under the new root, writable, is a directory)
    binds: Vec<(CString, CString, bool, bool)>,
    old: CString,
    tmpfs: CString,
    none: CString,
}

fn cstr(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)
}

impl JailSpec {
    /// Makes the bind targets (as the anchor, before the fork) and every
    /// C string `enter` will pass to the kernel.
    pub fn prepare(&self) -> std::io::Result<Prepared> {
        let mut binds = Vec::new();
        if self.namespaces {
            std::fs::create_dir_all(&self.root)?;
            for (paths, writable) in [(&self.read_only, false), (&self.writable, true)] {
                for p in paths.iter().filter(|p| p.exists()) {
                    let rel = p.strip_prefix("/").unwrap_or(p);
                    let target = self.root.join(rel);
                    binds.push((cstr(p)?, cstr(&target)?, writable, p.is_dir()));
                }
            }
        }
        Ok(Prepared {
            ids: self.ids,
            namespaces: self.namespaces,
            root: cstr(&self.root)?,
            binds,
            old: cstr(&self.root.join(".old"))?,
            tmpfs: c"tmpfs".to_owned(),
            none: c"none".to_owned(),
        })
    }
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Prepared {
    /// Confines the calling (forked, single-threaded) process. Only
    /// async-signal-safe syscalls; the bind targets are made with mkdir(2)
    /// on the fresh tmpfs, one component at a time.
    #[allow(unsafe_code)]
    pub fn enter(&self) -> std::io::Result<()> {
        // SAFETY: plain syscalls on C strings this struct owns, in a child
        // between fork and exec.
        unsafe {
            if self.namespaces {
                check(libc::unshare(
                    libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
                ))?;
                check(libc::mount(
                    self.none.as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    self.tmpfs.as_ptr(),
                    self.root.as_ptr(),
                    self.tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"mode=0755,size=1m".as_ptr().cast(),
                ))?;
                for (src, dst, writable, is_dir) in &self.binds {
                    mkdir_p(dst, *is_dir)?;
                    check(libc::mount(
                        src.as_ptr(),
                        dst.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    let ro = if *writable { 0 } else { libc::MS_RDONLY };
                    // A bound device node (/dev/null) needs dev; no
                    // directory does.
                    let nodev = if *is_dir { libc::MS_NODEV } else { 0 };
                    check(libc::mount(
                        std::ptr::null(),
                        dst.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | nodev | ro,
                        std::ptr::null(),
                    ))?;
                }
                check(libc::mkdir(self.old.as_ptr(), 0o700))?;
                check(libc::syscall(libc::SYS_pivot_root, self.root.as_ptr(), self.old.as_ptr()) as libc::c_int)?;
                check(libc::chdir(c"/".as_ptr()))?;
                check(libc::umount2(c"/.old".as_ptr(), libc::MNT_DETACH))?;
                check(libc::rmdir(c"/.old".as_ptr()))?;
                // The new root itself read-only: qemu writes only beneath
                // the writable binds.
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                    std::ptr::null(),
                ))?;
            }
            if let Some((uid, gid)) = self.ids {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(gid, gid, gid))?;
                check(libc::setresuid(uid, uid, uid))?;
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        Ok(())
    }
}

/// mkdir -p of an absolute C path, without allocating: each '/' is
/// briefly a NUL in a stack copy. The last component is an empty file
/// instead where a file (a device node) is bound onto it.
#[allow(unsafe_code)]
fn mkdir_p(path: &CString, last_is_dir: bool) -> std::io::Result<()> {
    let bytes = path.as_bytes_with_nul();
    let mut buf = [0u8; 4096];
    if bytes.len() > buf.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf[..bytes.len()].copy_from_slice(bytes);
    let len = bytes.len() - 1;
    for i in 1..=len {
        if i == len || buf[i] == b'/' {
            let saved = buf[i];
            buf[i] = 0;
            // SAFETY: buf holds a NUL-terminated prefix of the path.
            let r = unsafe {
                if i == len && !last_is_dir {
                    let fd = libc::open(
                        buf.as_ptr().cast(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    fd
                } else {
                    libc::mkdir(buf.as_ptr().cast(), 0o755)
                }
            };
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(std::io::Error::last_os_error());
            }
            buf[i] = saved;
        }
    }
    Ok(())
}
