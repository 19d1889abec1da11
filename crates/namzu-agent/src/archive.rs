//! The archive a suspend keeps of a sandbox's in-memory writable paths
//! (its tmpfs's) and a resume puts back: a tar stream of named top
//! directories beneath a root.
//!
//! [`write`] walks from a root directory descriptor (the host's
//! `/proc/<init>/root` on the local tier; `/` for `namzu-agent --archive`
//! inside a container), one name at a time with `O_NOFOLLOW`, never
//! crossing into another mount (a bind on top of `/tmp` is not the
//! tmpfs's): a symlink is archived as a symlink and never followed;
//! directories, regular files and named pipes are kept with owner (as the
//! sandbox sees it, through its uid and gid maps), mode and time; sockets
//! and devices, which mean nothing without their processes, are counted
//! and left out. It is meant to run with every process of the sandbox
//! stopped, and fails — rather than writing a short or padded file — if a
//! file changes size under it. The content written is bounded
//! (`limit`): a sparse file whose apparent size exceeds what a tmpfs can
//! hold fails the archive instead of filling the host's disk.
//!
//! [`unpack`] takes only plain relative entries (no `..`) beneath the
//! given tops, and refuses an entry whose parent, as found on disk, is not
//! a plain directory (a symlink planted where the walk saw a directory):
//! nothing lands outside the tops, whatever the archive says. Its root may
//! be a path into another mount namespace (`/proc/<pid>/root`).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What an archive took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// Entries archived.
    pub entries: u64,
    /// Bytes of file content archived.
    pub bytes: u64,
    /// Entries left out: sockets, devices, other mounts.
    pub skipped: u64,
}

/// One line of a `uid_map` or `gid_map`: (inside, outside, count).
pub type IdRange = (u32, u32, u32);

/// Reads a `uid_map`/`gid_map` file.
pub fn read_map(path: &Path) -> std::io::Result<Vec<IdRange>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|x| x.parse::<u32>().ok());
            Some((f.next()??, f.next()??, f.next()??))
        })
        .collect())
}

/// A host id as the sandbox sees it (65534, the overflow id, if unmapped).
pub fn inside(map: &[IdRange], host: u32) -> u32 {
    map.iter()
        .find(|(_, out, n)| host >= *out && host - out < *n)
        .map_or(65534, |(ins, out, _)| ins + (host - out))
}

/// Id maps of the walk: owners are written through them.
#[derive(Debug, Clone, Default)]
pub struct Maps {
    /// The sandbox's uid map (empty: ids as they are).
    pub uids: Vec<IdRange>,
    /// The sandbox's gid map.
    pub gids: Vec<IdRange>,
}

impl Maps {
    fn uid(&self, id: u32) -> u32 {
        if self.uids.is_empty() {
            id
        } else {
            inside(&self.uids, id)
        }
    }
    fn gid(&self, id: u32) -> u32 {
        if self.gids.is_empty() {
            id
        } else {
            inside(&self.gids, id)
        }
    }
}

fn too_big(limit: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        format!("the archive would exceed its limit of {limit} bytes (a sparse or growing file?)"),
    )
}

/// Archives each of `tops` (relative paths, e.g. `tmp`, `var/tmp`) beneath
/// `root` into `out`, at most `limit` bytes of file content. Returns the
/// writer (flushed, the archive finished) and what was taken. A missing
/// top is skipped.
pub fn write<W: Write>(root: &OwnedFd, tops: &[&str], maps: &Maps, out: W, limit: u64) -> std::io::Result<(W, Saved)> {
    let mut walker = Walker {
        tar: tar::Builder::new(out),
        maps,
        saved: Saved::default(),
        limit,
    };
    for top in tops {
        let mut fd = None;
        let mut missing = false;
        for part in top.split('/').filter(|p| !p.is_empty()) {
            let at: &dyn AsFd = match &fd {
                Some(d) => d,
                None => root,
            };
            match openat(at, part, OFlags::DIRECTORY) {
                Ok(next) => fd = Some(next),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    missing = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let Some(fd) = fd.filter(|_| !missing) else { continue };
        let dev = rustix::fs::fstat(&fd)?.st_dev;
        walker.dir(&fd, PathBuf::from(top.trim_matches('/')), dev)?;
    }
    let saved = walker.saved;
    let mut out = walker.tar.into_inner()?;
    out.flush()?;
    Ok((out, saved))
}

fn openat(dir: &(impl AsFd + ?Sized), name: &str, extra: OFlags) -> std::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir.as_fd(),
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
    .map_err(Into::into)
}

struct Walker<'a, W: Write> {
    tar: tar::Builder<W>,
    maps: &'a Maps,
    saved: Saved,
    limit: u64,
}

impl<W: Write> Walker<'_, W> {
    /// A header for `st`, owners as the sandbox sees them.
    fn header(&self, st: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(st.st_mode & 0o7777);
        h.set_uid(u64::from(self.maps.uid(st.st_uid)));
        h.set_gid(u64::from(self.maps.gid(st.st_gid)));
        // The stat's time type differs by architecture (unsigned on x86_64).
        #[allow(clippy::useless_conversion)]
        h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
        h.set_size(size);
        h
    }

    /// Archives directory `fd` (at `path`) and everything beneath it on
    /// the same device `dev`.
    fn dir(&mut self, fd: &OwnedFd, path: PathBuf, dev: u64) -> std::io::Result<()> {
        let st = rustix::fs::fstat(fd)?;
        let mut h = self.header(&st, tar::EntryType::Directory, 0);
        self.tar.append_data(&mut h, &path, std::io::empty())?;
        self.saved.entries += 1;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        names.sort();
        for name in names {
            let st = rustix::fs::statat(fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            let child = path.join(&name);
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if st.st_dev == dev => {
                    let sub = openat(fd, &name, OFlags::DIRECTORY)?;
                    self.dir(&sub, child, dev)?;
                }
                FileType::RegularFile => {
                    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
                    if self.saved.bytes.saturating_add(size) > self.limit {
                        return Err(too_big(self.limit));
                    }
                    let f = std::fs::File::from(openat(fd, &name, OFlags::empty())?);
                    let mut h = self.header(&st, tar::EntryType::Regular, size);
                    self.tar.append_data(&mut h, &child, Exact(f.take(size), size))?;
                    self.saved.entries += 1;
                    self.saved.bytes += size;
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(fd, name.as_str(), Vec::new())?;
                    let target = PathBuf::from(target.to_string_lossy().into_owned());
                    let mut h = self.header(&st, tar::EntryType::Symlink, 0);
                    self.tar.append_link(&mut h, &child, &target)?;
                    self.saved.entries += 1;
                }
                FileType::Fifo => {
                    let mut h = self.header(&st, tar::EntryType::Fifo, 0);
                    self.tar.append_data(&mut h, &child, std::io::empty())?;
                    self.saved.entries += 1;
                }
                _ => self.saved.skipped += 1,
            }
        }
        Ok(())
    }
}

/// A reader that fails unless it yields exactly `size` bytes.
struct Exact<R>(R, u64);

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        if n == 0 && self.1 > 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "a file shrank while it was archived",
            ));
        }
        self.1 = self.1.saturating_sub(n as u64);
        Ok(n)
    }
}

/// Unpacks `archive` beneath `root`, taking only entries beneath `tops`,
/// owners, modes and times kept. Returns how many entries were put back.
pub fn unpack(archive: impl Read, root: &Path, tops: &[&str]) -> std::io::Result<u64> {
    let mut archive = tar::Archive::new(std::io::BufReader::new(archive));
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut restored = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let Some(top) = top_of(&path, tops) else {
            tracing::warn!(path = %path.display(), "skipped an archive entry outside the archived directories");
            continue;
        };
        let target = root.join(&path);
        plain_parents(root, top, &path)?;
        // The tar crate would unpack a FIFO as an empty regular file.
        if entry.header().entry_type() == tar::EntryType::Fifo {
            fifo(&target, entry.header())?;
            restored += 1;
        } else {
            // Not `unpack_in`: its check canonicalizes the root, which a
            // `/proc/<pid>/root` of another mount namespace is not; the
            // parents were checked above and the path holds no `..`.
            entry.unpack(&target)?;
            restored += 1;
        }
    }
    Ok(restored)
}

/// The top of `tops` that `path` (relative, as archived) lies in, if it
/// is a plain path (no `..`, not absolute).
fn top_of<'a>(path: &Path, tops: &[&'a str]) -> Option<&'a str> {
    let plain = path
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    let path: PathBuf = path.components().filter(|c| !matches!(c, Component::CurDir)).collect();
    if !plain || path.as_os_str().is_empty() {
        return None;
    }
    tops.iter().copied().find(|t| path.starts_with(t.trim_matches('/')))
}

/// Refuses `path` unless every directory between `root/top` and it is a
/// plain directory on disk (not a symlink).
fn plain_parents(root: &Path, top: &str, path: &Path) -> std::io::Result<()> {
    let top = Path::new(top.trim_matches('/'));
    let mut at = root.join(top);
    if !std::fs::symlink_metadata(&at)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a directory", at.display()),
        ));
    }
    let rest = path.strip_prefix(top).unwrap_or(Path::new(""));
    let parts: Vec<_> = rest.components().collect();
    for part in parts.iter().take(parts.len().saturating_sub(1)) {
        at.push(part);
        let md = std::fs::symlink_metadata(&at)?;
        if !md.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: a parent in the archive is not a directory on disk", at.display()),
            ));
        }
    }
    Ok(())
}

/// Makes the named pipe an archive entry describes, with its owner and mode.
fn fifo(path: &Path, h: &tar::Header) -> std::io::Result<()> {
    let mode = h.mode()? & 0o7777;
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let id = |v: u64| u32::try_from(v).unwrap_or(65534);
    nix::unistd::fchownat(
        None,
        path,
        Some(nix::unistd::Uid::from_raw(id(h.uid()?))),
        Some(nix::unistd::Gid::from_raw(id(h.gid()?))),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    // The umask took bits from mkfifo's mode.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_beneath_the_tops_are_taken() {
        let tops = ["tmp", "home", "root", "var/tmp"];
        for (ok, top) in [
            ("tmp", "tmp"),
            ("tmp/a", "tmp"),
            ("./home/u/.bashrc", "home"),
            ("var/tmp/x", "var/tmp"),
        ] {
            assert_eq!(top_of(Path::new(ok), &tops), Some(top), "{ok}");
        }
        for no in [
            "etc/passwd",
            "/tmp/a",
            "tmp/../etc/x",
            "workspace/a",
            "",
            "var/log",
            "tmpx/a",
        ] {
            assert_eq!(top_of(Path::new(no), &tops), None, "{no}");
        }
    }

    #[test]
    fn host_ids_are_written_as_the_sandbox_sees_them() {
        let map = [(0, 100_000, 65_536)];
        assert_eq!(inside(&map, 100_000), 0);
        assert_eq!(inside(&map, 101_000), 1000);
        assert_eq!(inside(&map, 99_999), 65534);
        assert_eq!(inside(&map, 165_536), 65534);
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("tmp/sub")).unwrap();
        std::fs::write(d.path().join("tmp/sub/f"), b"content").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("tmp/link")).unwrap();
        nix::unistd::mkfifo(&d.path().join("tmp/p"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
        d
    }

    fn open(p: &Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn a_tree_round_trips_with_links_and_pipes_kept_as_such() {
        let src = tree();
        let (bytes, saved) = write(
            &open(src.path()),
            &["tmp", "missing"],
            &Maps::default(),
            Vec::new(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(saved.entries, 5, "{saved:?}");
        assert_eq!(saved.bytes, 7);
        let dst = tempfile::tempdir().unwrap();
        std::fs::create_dir(dst.path().join("tmp")).unwrap();
        let n = unpack(&bytes[..], dst.path(), &["tmp"]).unwrap();
        assert_eq!(n, 5);
        assert_eq!(std::fs::read(dst.path().join("tmp/sub/f")).unwrap(), b"content");
        assert_eq!(
            std::fs::read_link(dst.path().join("tmp/link")).unwrap(),
            Path::new("/etc/passwd")
        );
        let p = std::fs::symlink_metadata(dst.path().join("tmp/p")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&p.file_type()));
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&p.permissions()) & 0o777, 0o640);
    }

    #[test]
    fn content_over_the_limit_fails_the_archive() {
        let src = tree();
        let f = std::fs::File::create(src.path().join("tmp/sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        let e = write(&open(src.path()), &["tmp"], &Maps::default(), Vec::new(), 1 << 20).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{e}");
    }

    #[test]
    fn an_entry_beneath_a_planted_symlink_is_refused() {
        // An archive naming tmp/d/x, unpacked where tmp/d is a symlink out.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(3);
        b.append_data(&mut h, "tmp/d/x", &b"bad"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dst.path().join("tmp")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dst.path().join("tmp/d")).unwrap();
        assert!(unpack(&bytes[..], dst.path(), &["tmp"]).is_err());
        assert!(!outside.path().join("x").exists(), "written through the symlink");
    }
}
