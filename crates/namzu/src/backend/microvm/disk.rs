//! A microVM's disks: the image as a read-only ext4 base, built once per
//! image and shared by every sandbox of it, and a writable disk per
//! sandbox that the guest joins over it with overlayfs. Create never
//! copies the image; the writable disk's size is the sandbox's disk limit
//! (a sparse file: it takes what the guest writes, up to that size).
//!
//! Both are made by e2fsprogs' `mkfs.ext4 -d`, which copies a directory
//! into the new filesystem as it formats it, owners and modes kept, with no
//! mount and no privilege. Each is written under a temporary name and
//! renamed into place, so a failed build leaves nothing half made.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::MicroVmError;

/// Finds `mkfs.ext4` (sbin directories are often off an ordinary PATH).
pub fn mkfs() -> Result<PathBuf, MicroVmError> {
    crate::backend::disk::find_tool("mkfs.ext4").map_err(|searched| MicroVmError::ToolNotFound {
        tool: "mkfs.ext4 (e2fsprogs)",
        searched,
    })
}

/// Bytes and inodes a directory tree uses (not following symlinks).
fn usage(root: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(md) = e.path().symlink_metadata() else { continue };
            inodes += 1;
            bytes += md.blocks() * 512;
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Runs `f` holding an exclusive lock on `<path>.lock`: one build of a
/// shared artifact (a base disk, an initramfs) at a time, across threads
/// and processes; whoever waited finds it built.
pub fn locked<T>(path: &Path, f: impl FnOnce() -> T) -> std::io::Result<T> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.with_extension("lock"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
    let out = f();
    drop(lock);
    Ok(out)
}

/// Runs `mkfs.ext4` to make `out` (via a temporary file) of `bytes`.
fn make(out: &Path, bytes: u64, label: &str, content: &Path, extra: &[&str]) -> Result<(), MicroVmError> {
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    let built = (|| {
        std::fs::File::create(&tmp)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| MicroVmError::Disk {
                path: tmp.clone(),
                reason: e.to_string(),
            })?;
        let res = Command::new(mkfs()?)
            .args([
                "-q",
                "-F",
                "-L",
                label,
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
            ])
            .args(extra)
            .arg("-d")
            .arg(content)
            .arg(&tmp)
            .env_clear()
            .output()
            .map_err(|e| MicroVmError::Disk {
                path: out.to_path_buf(),
                reason: format!("mkfs.ext4: {e}"),
            })?;
        if !res.status.success() {
            return Err(MicroVmError::Disk {
                path: out.to_path_buf(),
                reason: format!(
                    "mkfs.ext4 -d {} failed ({}): {}",
                    content.display(),
                    res.status,
                    String::from_utf8_lossy(&res.stderr).trim()
                ),
            });
        }
        std::fs::rename(&tmp, out).map_err(|e| MicroVmError::Disk {
            path: out.to_path_buf(),
            reason: e.to_string(),
        })
    })();
    if built.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    built
}

/// The base disk of the image whose rootfs is `rootfs`, built into `cache`
/// unless already there. `key` names the image (its id); `progress` hears
/// of a build (its last word with `true`).
pub fn base(cache: &Path, key: &str, rootfs: &Path, progress: &dyn Fn(&str, bool)) -> Result<PathBuf, MicroVmError> {
    let out = cache.join(format!("{key}.ext4"));
    if out.is_file() {
        return Ok(out);
    }
    let io = |e: std::io::Error| MicroVmError::Disk {
        path: cache.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(cache).map_err(io)?;
    locked(&out, || build_base(cache, key, rootfs, &out, progress)).map_err(io)?
}

fn build_base(
    cache: &Path,
    key: &str,
    rootfs: &Path,
    out: &Path,
    progress: &dyn Fn(&str, bool),
) -> Result<PathBuf, MicroVmError> {
    if out.is_file() {
        return Ok(out.to_path_buf());
    }
    let io = |e: std::io::Error| MicroVmError::Disk {
        path: cache.to_path_buf(),
        reason: e.to_string(),
    };
    // Readable by the VMM's own uid (see `jail`); the disk is the image,
    // which holds nothing the image's users may not read.
    std::fs::set_permissions(cache, std::os::unix::fs::PermissionsExt::from_mode(0o755)).map_err(io)?;
    progress(&format!("building the base disk of image {key}"), false);
    let (bytes, inodes) = usage(rootfs);
    // ext4's own metadata and a margin: the base is read-only, so it only
    // needs to hold the tree.
    let size = (bytes + bytes / 5 + (64 << 20)).div_ceil(1 << 20) << 20;
    let inodes = (inodes + inodes / 5 + 4096).to_string();
    make(
        out,
        size,
        namzu_proto::launch::BASE_DISK_LABEL,
        rootfs,
        &["-N", &inodes, "-O", "^has_journal"],
    )?;
    std::fs::set_permissions(out, std::os::unix::fs::PermissionsExt::from_mode(0o644)).map_err(io)?;
    progress(
        &format!("built the base disk of image {key} ({} MiB)", size >> 20),
        true,
    );
    Ok(out.to_path_buf())
}

/// The sandbox's writable disk, `bytes` large, holding `seed` (the guest
/// spec, under `namzu/`) and nothing else.
pub fn writable(out: &Path, bytes: u64, seed: &Path) -> Result<(), MicroVmError> {
    make(out, bytes, namzu_proto::launch::RW_DISK_LABEL, seed, &[])
}

/// The key a rootfs is cached under: the image id when it is an imported
/// image (`…/sha256/<id>/rootfs`), else a hash of its path.
pub fn image_key(rootfs: &Path) -> String {
    use sha2::Digest;
    let imported = rootfs
        .parent()
        .filter(|p| p.parent().and_then(|pp| pp.file_name()).is_some_and(|n| n == "sha256"))
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    imported.unwrap_or_else(|| {
        let h = sha2::Sha256::digest(rootfs.as_os_str().as_encoded_bytes());
        format!(
            "dir-{}",
            h.iter().take(16).map(|b| format!("{b:02x}")).collect::<String>()
        )
    })
}
