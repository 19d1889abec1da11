//! Applying one image layer (a tar stream) beneath a rootfs, by file
//! descriptor.
//!
//! A layer is hostile input: an entry may create a symlink that a later
//! entry then names as a parent, hard-link a file outside, or whiteout a
//! directory reached through a symlink. So nothing here resolves a path
//! from the rootfs's name: every operation acts on a directory fd opened
//! beneath the rootfs without following any symlink (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; where the kernel lacks openat2,
//! a walk of `openat(O_NOFOLLOW | O_DIRECTORY)` one component at a time),
//! and the last component is handled with `*at` calls that do not follow it
//! either (`unlinkat`, `linkat` without `AT_SYMLINK_FOLLOW`, `O_EXCL |
//! O_NOFOLLOW` creates). An entry whose path crosses a symlink or a
//! non-directory is refused with its name ([`Refusal::ThroughSymlink`]):
//! image builders write layer diffs under real paths, so refusing costs no
//! legitimate image.
//!
//! What a layer may carry and how it lands:
//! * symlinks are created verbatim, whatever their target (`/usr/lib`,
//!   `../x`): they are resolved inside the sandbox, after its pivot_root,
//!   and never followed here;
//! * hard links must name an entry of the rootfs by a plain relative path;
//!   an absolute or `..` target is refused ([`Refusal::LinkOutside`]);
//! * device nodes are skipped; setuid and setgid bits are dropped (inside a
//!   sandbox no_new_privs makes them inert; in the host's image cache they
//!   would only be a hazard); ownership is not restored;
//! * whiteouts (`.wh.NAME`, `.wh..wh..opq`) remove by fd, recursively,
//!   never leaving the directory they were opened in;
//! * directories are kept writable by the importer while the layer applies
//!   and get their own mode and mtime at its end.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

pub use namzu_core::image::{Refusal, MAX_ENTRY_PATH};

/// What went wrong applying a layer.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// Entry refused.
    #[error("entry {entry:?} refused: {reason}")]
    Refused {
        /// The entry as the layer names it.
        entry: String,
        /// Why, for humans.
        reason: Refusal,
    },
    /// Entry.
    #[error("entry {entry:?}")]
    Io {
        /// The entry as the layer names it.
        entry: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// Not a readable tar stream.
    #[error("not a readable tar stream")]
    Read(#[source] io::Error),
}

/// Applies the tar stream `layer` onto the directory `rootfs`.
pub fn apply(layer: impl Read, rootfs: &Path) -> Result<(), LayerError> {
    let root: OwnedFd = rustix::fs::open(
        rootfs,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LayerError::Io {
        entry: String::new(),
        source: e.into(),
    })?;
    let mut ar = tar::Archive::new(layer);
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in ar.entries().map_err(LayerError::Read)? {
        let mut entry = entry.map_err(LayerError::Read)?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let refuse = |reason| LayerError::Refused {
            entry: name.clone(),
            reason,
        };
        let io_err = |source: io::Error| LayerError::Io {
            entry: name.clone(),
            source,
        };
        let Some(rel) = plain_relative(&raw).map_err(refuse)? else {
            continue; // "./": the root itself
        };
        let (parent, leaf) = split(&rel);
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().map_err(io_err)? & 0o1777;
        let mtime = entry.header().mtime().unwrap_or(0);

        if let Some(hidden) = leaf.as_bytes().strip_prefix(b".wh.") {
            // A whiteout of something whose directory never existed is a
            // no-op, as in every runtime's unpacker.
            let dir = match open_beneath(root.as_fd(), parent).map_err(io_err)? {
                Opened::Dir(d) => d,
                Opened::Missing => continue,
                Opened::Crosses => return Err(refuse(Refusal::ThroughSymlink)),
            };
            if hidden == b".wh..opq" {
                empty_dir(dir.as_fd()).map_err(io_err)?;
            } else if !hidden.is_empty() && !hidden.starts_with(b".wh.") {
                remove_at(dir.as_fd(), OsStr::from_bytes(hidden)).map_err(io_err)?;
            }
            continue;
        }
        if kind.is_character_special() || kind.is_block_special() || !is_file_system_entry(kind) {
            continue;
        }
        let dir = match open_beneath(root.as_fd(), parent).map_err(io_err)? {
            Opened::Dir(d) => d,
            Opened::Missing => match walk(root.as_fd(), parent, true).map_err(io_err)? {
                Opened::Dir(d) => d,
                _ => return Err(refuse(Refusal::ThroughSymlink)),
            },
            Opened::Crosses => return Err(refuse(Refusal::ThroughSymlink)),
        };
        let dir = dir.as_fd();
        let existing = match rustix::fs::statat(dir, leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(io_err(e.into())),
        };
        if kind.is_dir() {
            if existing != Some(FileType::Directory) {
                if existing.is_some() {
                    remove_at(dir, leaf).map_err(io_err)?;
                }
                rustix::fs::mkdirat(dir, leaf, Mode::from_raw_mode(0o700)).map_err(|e| io_err(e.into()))?;
            }
            dirs.push((rel.clone(), mode, mtime));
            continue;
        }
        if existing.is_some() {
            remove_at(dir, leaf).map_err(io_err)?;
        }
        let times = timestamps(mtime);
        if kind.is_symlink() {
            let target = entry.link_name_bytes().unwrap_or_default().into_owned();
            rustix::fs::symlinkat(OsStr::from_bytes(&target), dir, leaf).map_err(|e| io_err(e.into()))?;
            let _ = rustix::fs::utimensat(dir, leaf, &times, AtFlags::SYMLINK_NOFOLLOW);
        } else if kind.is_hard_link() {
            let target = entry.link_name_bytes().unwrap_or_default().into_owned();
            let target = match plain_relative(&target) {
                Ok(Some(t)) => t,
                _ => return Err(refuse(Refusal::LinkOutside)),
            };
            let (tparent, tleaf) = split(&target);
            let tdir = match open_beneath(root.as_fd(), tparent).map_err(io_err)? {
                Opened::Dir(d) => d,
                Opened::Missing => return Err(refuse(Refusal::LinkMissing)),
                Opened::Crosses => return Err(refuse(Refusal::ThroughSymlink)),
            };
            // Flags 0: a symlink named as the target is linked itself, not
            // what it points at.
            match rustix::fs::linkat(tdir.as_fd(), tleaf, dir, leaf, AtFlags::empty()) {
                Ok(()) => {}
                Err(Errno::NOENT) => return Err(refuse(Refusal::LinkMissing)),
                Err(e) => return Err(io_err(e.into())),
            }
        } else if kind.is_fifo() {
            rustix::fs::mknodat(dir, leaf, FileType::Fifo, Mode::from_raw_mode(mode & 0o777), 0)
                .map_err(|e| io_err(e.into()))?;
            let _ = rustix::fs::utimensat(dir, leaf, &times, AtFlags::SYMLINK_NOFOLLOW);
        } else {
            let fd = rustix::fs::openat(
                dir,
                leaf,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| io_err(e.into()))?;
            let mut file = std::fs::File::from(fd);
            io::copy(&mut entry, &mut file).map_err(io_err)?;
            rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(|e| io_err(e.into()))?;
            rustix::fs::futimens(&file, &times).map_err(|e| io_err(e.into()))?;
        }
    }
    // Directories last and deepest first, so a read-only mode cannot stop
    // the entries beneath it and no later write moves an mtime. A directory
    // a later entry replaced, or reached through a symlink, is left alone.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0.components().count()));
    for (rel, mode, mtime) in dirs {
        if let Ok(Opened::Dir(fd)) = open_beneath(root.as_fd(), &rel) {
            let entry = rel.display().to_string();
            let io_err = |e: Errno| LayerError::Io {
                entry: entry.clone(),
                source: e.into(),
            };
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(io_err)?;
            rustix::fs::futimens(&fd, &timestamps(mtime)).map_err(io_err)?;
        }
    }
    Ok(())
}

/// Entry kinds that become something in the rootfs (metadata records such
/// as pax globals are not).
fn is_file_system_entry(kind: tar::EntryType) -> bool {
    use tar::EntryType as T;
    matches!(
        kind,
        T::Regular | T::Continuous | T::GNUSparse | T::Directory | T::Symlink | T::Link | T::Fifo
    )
}

fn timestamps(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// `raw` as a plain relative path: `.` and empty components dropped, an
/// absolute path or a `..` refused. `None` for the root itself.
pub fn plain_relative(raw: &[u8]) -> Result<Option<PathBuf>, Refusal> {
    if raw.len() > MAX_ENTRY_PATH {
        return Err(Refusal::PathTooLong);
    }
    let path = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => return Err(Refusal::PathOutside),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn split(rel: &Path) -> (&Path, &OsStr) {
    (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().unwrap_or(OsStr::new("")),
    )
}

enum Opened {
    Dir(OwnedFd),
    Missing,
    /// A component is a symlink or not a directory.
    Crosses,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `rel` beneath `root` following no symlink.
fn open_beneath(root: BorrowedFd<'_>, rel: &Path) -> io::Result<Opened> {
    if rel.as_os_str().is_empty() {
        return Ok(Opened::Dir(rustix::io::fcntl_dupfd_cloexec(root, 0)?));
    }
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(root, rel, DIR_FLAGS, Mode::empty(), how) {
        Ok(fd) => Ok(Opened::Dir(fd)),
        Err(Errno::NOENT) => Ok(Opened::Missing),
        Err(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => Ok(Opened::Crosses),
        Err(Errno::NOSYS | Errno::PERM) => walk(root, rel, false),
        Err(e) => Err(e.into()),
    }
}

/// The portable half of [`open_beneath`]: one `O_NOFOLLOW` open per
/// component; with `create`, missing directories are made on the way
/// (tar streams may leave parents implicit).
fn walk(root: BorrowedFd<'_>, rel: &Path, create: bool) -> io::Result<Opened> {
    let mut cur = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    for c in rel.components() {
        let c = c.as_os_str();
        let mut tried_create = false;
        cur = loop {
            match rustix::fs::openat(&cur, c, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => break fd,
                Err(Errno::NOENT) if create && !tried_create => {
                    tried_create = true;
                    match rustix::fs::mkdirat(&cur, c, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(Errno::NOENT) => return Ok(Opened::Missing),
                Err(Errno::LOOP | Errno::NOTDIR) => return Ok(Opened::Crosses),
                Err(e) => return Err(e.into()),
            }
        };
    }
    Ok(Opened::Dir(cur))
}

/// Removes `name` in `dir` whatever it is; a directory with everything in
/// it, each step by fd (a symlink is removed, never entered).
fn remove_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            let sub = rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?;
            empty_dir(sub.as_fd())?;
            Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }
        Ok(_) => Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

/// Removes everything in the directory `dir`.
fn empty_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    // Names first, removals after: unlinking while a getdents stream is
    // open may skip entries.
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(n.to_vec());
        }
    }
    for n in names {
        remove_at(dir, OsStr::from_bytes(&n))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_relative_paths() {
        let ok = |s: &str| plain_relative(s.as_bytes()).unwrap().map(|p| p.display().to_string());
        assert_eq!(ok("./usr/bin/x").as_deref(), Some("usr/bin/x"));
        assert_eq!(ok("a//b/./c/").as_deref(), Some("a/b/c"));
        assert_eq!(ok("./"), None);
        assert_eq!(plain_relative(b"/etc/passwd"), Err(Refusal::PathOutside));
        assert_eq!(plain_relative(b"a/../../b"), Err(Refusal::PathOutside));
        assert_eq!(plain_relative(&[b'a'; MAX_ENTRY_PATH + 1]), Err(Refusal::PathTooLong));
    }
}
