//! A sandbox's disk limit on the single-host tiers whose `/workspace` is a
//! directory in the sandbox's state directory (local, docker).
//!
//! With `resources.disk_bytes`, `<dir>/workspace` is a mount of
//! `<dir>/disk.img`: a sparse file of that size formatted ext4 (no blocks
//! reserved for a root the sandbox does not have), loop-mounted nosuid,
//! nodev, owned by the sandbox's root. It takes from the host only what is
//! written, and never more than its size: a sandbox that fills it gets
//! ENOSPC, and nothing outside the image grows. The mount is made again
//! when a suspended sandbox resumes after a host restart, and is detached
//! before the state directory is removed.
//!
//! Loop devices and mounts need the host process to be root; otherwise
//! the option is refused by name, never ignored.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::spec::Tier;

/// The image file, beside the workspace it is mounted on.
pub(crate) const IMAGE: &str = "disk.img";
/// The smallest disk accepted: ext4's own metadata takes a few MiB.
pub const MIN_DISK_BYTES: u64 = 8 << 20;

/// Finds a tool in `PATH` or the sbin directories (often off an ordinary
/// `PATH`); `Err` lists where it looked.
pub fn find_tool(name: &str) -> std::result::Result<PathBuf, Vec<PathBuf>> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    let mut searched = Vec::new();
    for d in dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(p);
    }
    Err(searched)
}

fn refuse(tier: Tier, reason: String) -> Error {
    Error::OptionRefused {
        tier,
        option: "resources.disk_bytes".into(),
        reason,
    }
}

fn io_err(op: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::LocalIo { op: op.into(), source }
}

/// Runs a tool; a failure names it with what it said.
fn run(op: &'static str, cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(io_err(op))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::LocalIo {
        op: op.into(),
        source: std::io::Error::other(format!(
            "{:?} exited with {}: {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    })
}

/// Checks that `bytes` can be a disk here, before anything is made.
pub(crate) fn check(tier: Tier, bytes: u64) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(refuse(
            tier,
            "a size-limited disk is a loop-mounted filesystem image, which needs the host process to be root".into(),
        ));
    }
    if bytes < MIN_DISK_BYTES {
        return Err(refuse(
            tier,
            format!("{bytes} bytes is below the smallest disk, {MIN_DISK_BYTES} bytes"),
        ));
    }
    find_tool("mkfs.ext4")
        .map(drop)
        .map_err(|searched| refuse(tier, format!("mkfs.ext4 (e2fsprogs) not found; looked in {searched:?}")))
}

/// Makes the sandbox's disk of `bytes`, owned by `owner` (uid and gid),
/// and mounts it on `<dir>/workspace`. Call [`check`] first.
pub(crate) fn make(dir: &Path, bytes: u64, owner: u32) -> Result<()> {
    const OP: &str = "create the sandbox's disk";
    let image = dir.join(IMAGE);
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(bytes))
        .map_err(io_err(OP))?;
    let mkfs = find_tool("mkfs.ext4").map_err(|_| io_err(OP)(std::io::ErrorKind::NotFound.into()))?;
    run(
        OP,
        Command::new(mkfs)
            .args(["-q", "-F", "-m", "0", "-L", "namzu-disk", "-E"])
            .arg(format!("root_owner={owner}:{owner},nodiscard"))
            .arg(&image),
    )?;
    mount(dir)
}

/// Whether `<dir>/workspace` is a mount (of the disk) rather than a plain
/// directory of the state directory's filesystem.
fn mounted(dir: &Path) -> bool {
    match (std::fs::metadata(dir), std::fs::metadata(dir.join("workspace"))) {
        (Ok(d), Ok(w)) => d.dev() != w.dev(),
        _ => false,
    }
}

/// Mounts `<dir>`'s disk on its workspace unless there is no disk or it
/// is mounted already (a resume after a host restart mounts it again).
pub(crate) fn mount(dir: &Path) -> Result<()> {
    const OP: &str = "mount the sandbox's disk";
    let image = dir.join(IMAGE);
    if !image.exists() || mounted(dir) {
        return Ok(());
    }
    let workspace = dir.join("workspace");
    let tool = find_tool("mount").map_err(|_| io_err(OP)(std::io::ErrorKind::NotFound.into()))?;
    run(
        OP,
        Command::new(tool)
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(&image)
            .arg(&workspace),
    )?;
    // mkfs's lost+found is the host's business, not a file of the sandbox's
    // (kept if fsck ever put something in it).
    let _ = std::fs::remove_dir(workspace.join("lost+found"));
    Ok(())
}

/// Detaches `<dir>`'s disk, if mounted: its loop device goes once the
/// last user lets go. Before the state directory is removed.
pub(crate) fn unmount(dir: &Path) {
    if dir.join(IMAGE).exists() && mounted(dir) {
        let ws = dir.join("workspace");
        if let Err(e) = nix::mount::umount2(&ws, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %ws.display(), "could not detach the sandbox's disk: {e}");
        }
    }
}
