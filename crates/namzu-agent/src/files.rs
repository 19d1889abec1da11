//! File operations, all resolved through the [`Jail`].
//!
//! Promises:
//! * A write replaces its target atomically and durably: data goes to a
//!   temporary sibling, which is fsynced, given the target's mode, renamed
//!   onto the target, and the directory is fsynced. A write that fails or is
//!   abandoned before its commit leaves the previous file (or no file) and
//!   removes its temporary.
//! * A streamed read holds one chunk in memory whatever the file's size, and
//!   reads to EOF (files whose size says 0, like procfs, read fully).
//! * Symlinks are reported, never followed, by list, walk and stat; no path
//!   resolves outside the roots.
//!
//! Every function here blocks; the service calls them on blocking threads.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use namzu_proto::v1::{agent_error::Kind, FileEntry, FileType};
use rustix::fs::{AtFlags, FileType as RxFileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::jail::{Jail, JailError, Located, ResolveError};
use crate::op_error::{agent_err, OpError};

/// The mode bits the agent ever sets: permissions and sticky, never
/// S_ISUID or S_ISGID.
const NO_SETID: u32 = 0o1777;

pub const STREAM_CHUNK: usize = 256 * 1024;
const TMP_MARKER: &str = ".namzu-tmp-";

/// Maps a resolution or syscall failure to the typed error of `op` on `path`.
pub fn os_err(op: &str, path: &[u8], e: impl Into<ResolveError>) -> OpError {
    let (kind, errno, msg) = match e.into() {
        ResolveError::Jail(JailError::Escape) => (Kind::PathEscape, 0, "path escapes the sandbox".to_owned()),
        ResolveError::Jail(JailError::IsRoot) => (Kind::InvalidArgument, 0, "not allowed on a root".to_owned()),
        ResolveError::Jail(j) => (Kind::InvalidArgument, 0, j.to_string()),
        ResolveError::Os(errno) => {
            let kind = match errno {
                Errno::NOENT => Kind::NotFound,
                // openat2(RESOLVE_BENEATH) answers EXDEV for a path that would
                // leave the root, ELOOP for a magic link.
                Errno::XDEV | Errno::LOOP => Kind::PathEscape,
                Errno::EXIST => Kind::AlreadyExists,
                Errno::ACCESS | Errno::PERM | Errno::ROFS => Kind::PermissionDenied,
                Errno::NOTDIR => Kind::NotADirectory,
                Errno::ISDIR => Kind::IsADirectory,
                Errno::NOTEMPTY => Kind::DirectoryNotEmpty,
                Errno::NAMETOOLONG | Errno::INVAL => Kind::InvalidArgument,
                _ => Kind::Io,
            };
            (kind, errno.raw_os_error(), errno.to_string())
        }
    };
    let mut err = agent_err(kind, op, &msg);
    err.path = bytes::Bytes::copy_from_slice(path);
    err.errno = errno;
    err
}

fn limit_err(op: &str, path: &[u8], name: &str, limit: u64) -> OpError {
    let mut e = agent_err(Kind::LimitExceeded, op, &format!("exceeds {name} ({limit})"));
    e.path = bytes::Bytes::copy_from_slice(path);
    e.limit_name = name.into();
    e.limit = limit;
    e
}

pub(crate) fn locate(jail: &Jail, op: &str, path: &[u8]) -> Result<Located, OpError> {
    jail.locate(path).map_err(|e| os_err(op, path, e))
}

// ---------------------------------------------------------------- writes --

/// An in-progress atomic write. Dropping it without [`PendingWrite::commit`]
/// removes the temporary and leaves the target untouched.
pub struct PendingWrite {
    dir: OwnedFd,
    name: PathBuf,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    mode: u32,
    written: u64,
    max: u64,
    path: Vec<u8>,
}

impl PendingWrite {
    pub fn begin(jail: &Jail, path: &[u8], mode: Option<u32>, create_parents: bool, max: u64) -> Result<Self, OpError> {
        const OP: &str = "write_file";
        let loc = locate(jail, OP, path)?;
        if create_parents {
            if let Some(parent) = loc.rel.parent() {
                mkdir_all(jail, loc.root, parent).map_err(|e| os_err(OP, path, e))?;
            }
        }
        let (dir, name) = jail.parent(&loc).map_err(|e| os_err(OP, path, e))?;
        // The target's mode carries over; a new file takes the requested
        // mode. Never setuid or setgid: a file the agent writes must not
        // become a privileged program (a command may have marked the
        // target so, and on docker the workspace is a host directory).
        let mode = match rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if RxFileType::from_raw_mode(st.st_mode) == RxFileType::Directory => {
                return Err(os_err(OP, path, Errno::ISDIR));
            }
            Ok(st) if RxFileType::from_raw_mode(st.st_mode) == RxFileType::RegularFile => st.st_mode & NO_SETID,
            Ok(_) | Err(Errno::NOENT) => mode.unwrap_or(0o644) & NO_SETID,
            Err(e) => return Err(os_err(OP, path, e)),
        };
        let mut tmp = OsString::from(".");
        tmp.push(name.as_os_str());
        tmp.push(format!("{TMP_MARKER}{:016x}", rand::random::<u64>()));
        let tmp = PathBuf::from(tmp);
        let fd = rustix::fs::openat(
            &dir,
            &tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| os_err(OP, path, e))?;
        crate::identity::give_to_user(&dir, &tmp).map_err(|e| os_err(OP, path, e))?;
        Ok(Self {
            dir,
            name,
            tmp,
            file: Some(std::fs::File::from(fd)),
            mode,
            written: 0,
            max,
            path: path.to_vec(),
        })
    }

    pub fn write(&mut self, data: &[u8]) -> Result<(), OpError> {
        use std::io::Write;
        let next = self.written + data.len() as u64;
        if next > self.max {
            return Err(limit_err(
                "write_file",
                &self.path,
                namzu_proto::limits::MAX_WRITE_BYTES,
                self.max,
            ));
        }
        let f = self
            .file
            .as_mut()
            .ok_or_else(|| agent_err(Kind::Protocol, "write_file", "write after commit"))?;
        f.write_all(data)
            .map_err(|e| os_err("write_file", &self.path, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        self.written = next;
        Ok(())
    }

    /// Makes the write visible and durable. Returns (bytes, mode).
    pub fn commit(mut self, expected: u64) -> Result<(u64, u32), OpError> {
        const OP: &str = "write_file";
        let e = |err| os_err(OP, &self.path, err);
        if expected != self.written {
            let mut err = agent_err(Kind::Protocol, OP, "commit size differs from the bytes received");
            err.path = bytes::Bytes::copy_from_slice(&self.path);
            return Err(err);
        }
        let file = self
            .file
            .take()
            .ok_or_else(|| agent_err(Kind::Protocol, OP, "committed twice"))?;
        rustix::fs::fchmod(&file, Mode::from_raw_mode(self.mode)).map_err(e)?;
        rustix::fs::fsync(&file).map_err(e)?;
        drop(file);
        rustix::fs::renameat(&self.dir, &self.tmp, &self.dir, &self.name).map_err(e)?;
        // Renamed: nothing left for Drop to remove.
        self.tmp = PathBuf::new();
        rustix::fs::fsync(&self.dir).map_err(e)?;
        Ok((self.written, self.mode))
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = rustix::fs::unlinkat(&self.dir, &self.tmp, AtFlags::empty());
        }
    }
}

fn mkdir_all(jail: &Jail, root: usize, rel: &Path) -> Result<(), ResolveError> {
    let mut cur = PathBuf::new();
    for c in rel.components() {
        cur.push(c);
        let loc = Located { root, rel: cur.clone() };
        let (dir, name) = jail.parent(&loc)?;
        match rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755)) {
            Ok(()) => crate::identity::give_to_user(&dir, &name)?,
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(&dir, &name, AtFlags::empty())?;
                if RxFileType::from_raw_mode(st.st_mode) != RxFileType::Directory {
                    return Err(Errno::NOTDIR.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

// ----------------------------------------------------------------- reads --

/// Opens a file for reading without blocking on a fifo; refuses anything but
/// a regular file. Returns the file and its size.
pub fn open_regular(jail: &Jail, op: &str, path: &[u8]) -> Result<(std::fs::File, u64), OpError> {
    let loc = locate(jail, op, path)?;
    let fd = jail
        .open(&loc, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
        .map_err(|e| os_err(op, path, e))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| os_err(op, path, e))?;
    match RxFileType::from_raw_mode(st.st_mode) {
        RxFileType::RegularFile => {}
        RxFileType::Directory => return Err(os_err(op, path, Errno::ISDIR)),
        _ => {
            let mut e = agent_err(Kind::NotRegularFile, op, "not a regular file");
            e.path = bytes::Bytes::copy_from_slice(path);
            return Err(e);
        }
    }
    Ok((std::fs::File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
}

/// Reads at most `want` bytes from `offset`, to EOF. Returns (data, eof).
pub fn read_at(file: &std::fs::File, offset: u64, want: u64, buf_cap: usize) -> std::io::Result<(Vec<u8>, bool)> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::with_capacity(usize::try_from(want).unwrap_or(buf_cap).min(buf_cap));
    let mut chunk = vec![0u8; STREAM_CHUNK.min(usize::try_from(want).unwrap_or(STREAM_CHUNK)).max(1)];
    let mut pos = offset;
    while (out.len() as u64) < want {
        let room = usize::try_from(want - out.len() as u64)
            .unwrap_or(usize::MAX)
            .min(chunk.len());
        let n = match file.read_at(&mut chunk[..room], pos) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk[..n]);
        pos += n as u64;
    }
    Ok((out, false))
}

/// Ranged or whole read, bounded by `max_range`. Returns (data, size, eof).
pub fn read_file(
    jail: &Jail,
    path: &[u8],
    offset: u64,
    length: Option<u64>,
    max_range: u64,
) -> Result<(Vec<u8>, u64, bool), OpError> {
    const OP: &str = "read_file";
    let (file, size) = open_regular(jail, OP, path)?;
    if let Some(len) = length {
        if len > max_range {
            return Err(limit_err(
                OP,
                path,
                namzu_proto::limits::MAX_READ_RANGE_BYTES,
                max_range,
            ));
        }
    }
    // Whole reads probe one byte past the limit to tell "too big" from "fits".
    let want = length.unwrap_or(max_range + 1);
    let (data, eof) = read_at(&file, offset, want, 4 << 20)
        .map_err(|e| os_err(OP, path, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
    if length.is_none() && data.len() as u64 > max_range {
        return Err(limit_err(
            OP,
            path,
            namzu_proto::limits::MAX_READ_RANGE_BYTES,
            max_range,
        ));
    }
    let end = offset + data.len() as u64;
    // procfs-style files report size 0 and are read to EOF instead.
    let eof = eof || (size > 0 && end >= size);
    let size = if size == 0 && eof { end } else { size };
    Ok((data, size, eof))
}

// ------------------------------------------------------- metadata, trees --

fn entry_of(dir: impl AsFd, name: &Path, full: &[u8], depth: u32) -> Result<FileEntry, Errno> {
    let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let ft = RxFileType::from_raw_mode(st.st_mode);
    let file_type = match ft {
        RxFileType::RegularFile => FileType::Regular,
        RxFileType::Directory => FileType::Directory,
        RxFileType::Symlink => FileType::Symlink,
        _ => FileType::Other,
    };
    let symlink_target = if ft == RxFileType::Symlink {
        Some(rustix::fs::readlinkat(&dir, name, Vec::new())?.into_bytes().into())
    } else {
        None
    };
    Ok(FileEntry {
        path: full.to_vec().into(),
        name: name.as_os_str().as_bytes().to_vec().into(),
        file_type: file_type as i32,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        mtime_ms: i64::try_from(st.st_mtime).unwrap_or(0) * 1000
            + i64::try_from(st.st_mtime_nsec / 1_000_000).unwrap_or(0),
        symlink_target,
        depth,
    })
}

pub fn stat(jail: &Jail, path: &[u8]) -> Result<FileEntry, OpError> {
    const OP: &str = "stat";
    let loc = locate(jail, OP, path)?;
    if loc.rel.as_os_str().is_empty() {
        let fd = jail
            .open(&loc, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| os_err(OP, path, e))?;
        return entry_of(&fd, Path::new("."), path, 0).map_err(|e| os_err(OP, path, e));
    }
    let (dir, name) = jail.parent(&loc).map_err(|e| os_err(OP, path, e))?;
    entry_of(&dir, &name, path, 0).map_err(|e| os_err(OP, path, e))
}

/// Names in a directory, sorted, without `.` and `..`.
fn names(dir: &OwnedFd) -> Result<Vec<OsString>, Errno> {
    let mut out = Vec::new();
    for ent in rustix::fs::Dir::read_from(dir)? {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsString::from_vec(n.to_vec()));
        }
    }
    out.sort();
    Ok(out)
}

fn join_bytes(base: &[u8], name: &OsStr) -> Vec<u8> {
    let mut p = base.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name.as_bytes());
    p
}

pub fn list(jail: &Jail, path: &[u8], max: u64) -> Result<Vec<FileEntry>, OpError> {
    const OP: &str = "list_files";
    let loc = locate(jail, OP, path)?;
    let dir = jail
        .open(&loc, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| os_err(OP, path, e))?;
    let names = names(&dir).map_err(|e| os_err(OP, path, e))?;
    if names.len() as u64 > max {
        return Err(limit_err(OP, path, namzu_proto::limits::MAX_LIST_ENTRIES, max));
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        match entry_of(&dir, Path::new(&n), &join_bytes(path, &n), 1) {
            Ok(e) => out.push(e),
            // Removed between listing and stat: it is simply not there.
            Err(Errno::NOENT) => {}
            Err(e) => return Err(os_err(OP, path, e)),
        }
    }
    Ok(out)
}

/// Depth-first walk. Calls `emit` per entry; stops early when it returns
/// false (the receiver went away). Symlinks are reported, never followed.
pub fn walk(
    jail: &Jail,
    root: &[u8],
    max_entries: u64,
    max_depth: u32,
    include_hidden: bool,
    mut emit: impl FnMut(FileEntry) -> bool,
) -> Result<(), OpError> {
    const OP: &str = "walk_files";
    let loc = locate(jail, OP, root)?;
    let top = jail
        .open(&loc, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| os_err(OP, root, e))?;
    // One cursor per open directory: pre-order depth-first, with memory
    // proportional to depth times directory width, never to the tree.
    struct Cursor {
        dir: OwnedFd,
        base: Vec<u8>,
        depth: u32,
        names: std::vec::IntoIter<OsString>,
    }
    let open_cursor = |dir: OwnedFd, base: Vec<u8>, depth: u32| -> Result<Cursor, OpError> {
        let names = names(&dir).map_err(|e| os_err(OP, &base, e))?;
        Ok(Cursor {
            dir,
            base,
            depth,
            names: names.into_iter(),
        })
    };
    let mut stack = vec![open_cursor(top, root.to_vec(), 1)?];
    let mut emitted = 0u64;
    while let Some(cur) = stack.last_mut() {
        let Some(n) = cur.names.next() else {
            stack.pop();
            continue;
        };
        if !include_hidden && n.as_bytes().first() == Some(&b'.') {
            continue;
        }
        let full = join_bytes(&cur.base, &n);
        let depth = cur.depth;
        let entry = match entry_of(&cur.dir, Path::new(&n), &full, depth) {
            Ok(e) => e,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(os_err(OP, &full, e)),
        };
        if emitted == max_entries {
            let mut e = agent_err(Kind::WalkLimit, OP, "walk entry budget exhausted");
            e.path = bytes::Bytes::copy_from_slice(root);
            e.limit_name = "max_entries".into();
            e.limit = max_entries;
            return Err(e);
        }
        let is_dir = entry.file_type == FileType::Directory as i32;
        emitted += 1;
        if !emit(entry) {
            return Ok(());
        }
        if is_dir && (max_depth == 0 || depth < max_depth) {
            // NOFOLLOW: a directory swapped for a symlink since the stat is
            // not followed.
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(&cur.dir, Path::new(&n), flags, Mode::empty()) {
                Ok(fd) => {
                    let c = open_cursor(fd, full, depth + 1)?;
                    stack.push(c);
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(os_err(OP, &full, e)),
            }
        }
    }
    Ok(())
}

pub fn mkdir(jail: &Jail, path: &[u8], parents: bool, mode: Option<u32>) -> Result<(), OpError> {
    const OP: &str = "mkdir";
    let loc = locate(jail, OP, path)?;
    if parents {
        mkdir_all(jail, loc.root, &loc.rel).map_err(|e| os_err(OP, path, e))?;
        if let Some(m) = mode {
            let fd = jail
                .open(&loc, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .map_err(|e| os_err(OP, path, e))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(m & NO_SETID)).map_err(|e| os_err(OP, path, e))?;
        }
        return Ok(());
    }
    let (dir, name) = jail.parent(&loc).map_err(|e| os_err(OP, path, e))?;
    rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(mode.unwrap_or(0o755) & NO_SETID))
        .and_then(|()| crate::identity::give_to_user(&dir, &name))
        .map_err(|e| os_err(OP, path, e))
}

pub fn remove(jail: &Jail, path: &[u8], recursive: bool) -> Result<(), OpError> {
    const OP: &str = "remove";
    let loc = locate(jail, OP, path)?;
    let (dir, name) = jail.parent(&loc).map_err(|e| os_err(OP, path, e))?;
    remove_at(&dir, &name, recursive).map_err(|e| os_err(OP, path, e))
}

fn remove_at(dir: &OwnedFd, name: &Path, recursive: bool) -> Result<(), Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if RxFileType::from_raw_mode(st.st_mode) != RxFileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    if recursive {
        let sub = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for n in names(&sub)? {
            remove_at(&sub, Path::new(&n), true)?;
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

pub fn rename(jail: &Jail, from: &[u8], to: &[u8], no_replace: bool) -> Result<(), OpError> {
    const OP: &str = "rename";
    let lf = locate(jail, OP, from)?;
    let lt = locate(jail, OP, to)?;
    let (fd_from, n_from) = jail.parent(&lf).map_err(|e| os_err(OP, from, e))?;
    let (fd_to, n_to) = jail.parent(&lt).map_err(|e| os_err(OP, to, e))?;
    let flags = if no_replace {
        RenameFlags::NOREPLACE
    } else {
        RenameFlags::empty()
    };
    rustix::fs::renameat_with(&fd_from, &n_from, &fd_to, &n_to, flags).map_err(|e| os_err(OP, from, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_files_that_claim_size_zero_read_to_eof() {
        let jail = Jail::new(&[PathBuf::from("/proc/self")]).unwrap();
        let (data, size, eof) = read_file(&jail, b"status", 0, None, 1 << 20).unwrap();
        assert!(
            String::from_utf8_lossy(&data).contains("VmRSS"),
            "{}",
            String::from_utf8_lossy(&data)
        );
        assert!(eof);
        assert_eq!(size, data.len() as u64);
        let (file, stat_size) = open_regular(&jail, "t", b"status").unwrap();
        assert_eq!(stat_size, 0, "procfs reports size 0; reads must not trust it");
        let (streamed, eof) = read_at(&file, 0, u64::MAX, STREAM_CHUNK).unwrap();
        assert!(eof && !streamed.is_empty());
    }
}
