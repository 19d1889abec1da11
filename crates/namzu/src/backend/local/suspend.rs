//! Suspend and resume of local sandboxes: the sandbox's processes end, its
//! disk stays, and a later process — after a host restart too — starts it
//! again under the same id, on the same disk, with the same spec.
//!
//! What is kept: `/workspace` (a directory of the state directory, or the
//! sandbox's disk image) as it is, and the writable tmpfs's
//! [`SAVED_DIRS`] (`/tmp`, `/home`, `/root`), which live in memory while
//! the sandbox runs: the suspend archives them, with the sandbox paused so
//! nothing changes under the copy, into `<dir>/saved.tar`, and the resumed
//! sandbox's init unpacks them before it serves (`namzu_agent::sandbox`).
//! `/run` and `/dev/shm` start empty, as after a reboot; so do processes.
//! The egress policy in force (saved in the directory by every change)
//! and the uid range (which owns the files) are kept.
//!
//! The archive is read through `/proc/<init>/root`, by descriptors opened
//! one name at a time with `O_NOFOLLOW`, never crossing into another mount
//! (a bind on top of /tmp is the host's, not the sandbox's): a symlink in
//! the sandbox is archived as a symlink, never followed on the host side.
//! Owners are written as the sandbox sees them (through its uid_map).
//!
//! A failed suspend resumes the sandbox where it was; a failed resume
//! leaves it suspended, its disk and archive untouched.

use std::io::{BufWriter, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use namzu_proto::launch::SAVED_DIRS;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::{LocalProvider, LocalRecord};
use crate::backend::state::{now_unix, Meta, Stop};
use crate::error::{Error, Result};
use crate::handle::Sandbox;

/// The archive of the writable tmpfs's, in the sandbox's directory.
pub(super) const SAVED: &str = "saved.tar";

/// What a suspend archived.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Saved {
    /// Entries archived.
    pub entries: u64,
    /// Bytes of file content archived.
    pub bytes: u64,
    /// Entries left out: sockets, devices, other mounts.
    pub skipped: u64,
}

fn io(op: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::LocalIo { op: op.into(), source }
}

fn state_err(id: &str, message: &str) -> Error {
    Error::State {
        id: id.into(),
        message: message.into(),
    }
}

/// Holds an exclusive lock on `<dir>/.lock` while alive: one suspend or
/// resume of a sandbox at a time, across processes.
fn lock(dir: &Path, op: &'static str) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .map_err(io(op))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| io(op)(e.into()))?;
    Ok(f)
}

impl LocalProvider {
    /// [`Provider::suspend`](crate::Provider::suspend) of the local tier.
    pub(super) async fn suspend_sandbox(&self, id: &str) -> Result<()> {
        const OP: &str = "suspend";
        let dir = self.state.dir(id)?;
        let (_, first) = self.state.read_meta(id)?;
        let _lock = lock(&dir, OP)?;
        let (_, meta) = self.state.read_meta(id)?;
        if meta.suspended_unix.is_some() || first.suspended_unix.is_some() {
            return Ok(());
        }
        let mut record: LocalRecord = meta.record().unwrap_or_default();
        if record.spec.is_none() {
            return Err(state_err(
                id,
                "made by a namzu that kept no spec to start it again; cannot suspend",
            ));
        }
        let (_, client) = self.state.reattach(id, &self.client).await?;
        let init = init_of(&meta).ok_or_else(|| state_err(id, "its init process is not among those recorded"))?;
        // Nothing may change under the copy.
        client.pause().await?;
        let saved = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || {
                sync_workspace(&dir)?;
                save(init, &dir.join(SAVED))
            }
        })
        .await
        .map_err(|e| io(OP)(std::io::Error::other(e)))
        .and_then(|r| r.map_err(io(OP)));
        let saved = match saved {
            Ok(s) => s,
            Err(e) => {
                if let Err(r) = client.resume().await {
                    tracing::warn!(%id, "a failed suspend could not resume the sandbox: {r}");
                }
                return Err(e);
            }
        };
        tracing::debug!(%id, entries = saved.entries, bytes = saved.bytes, skipped = saved.skipped, "suspend saved the writable tmpfs's");
        client.close();
        self.state.halt(id, Stop::Kill).await?;
        if let Some(cg) = record.cgroups.take() {
            cg.remove();
        }
        let suspended = Meta {
            pid: 0,
            procs: Vec::new(),
            suspended_unix: Some(now_unix()),
            ..meta
        }
        .with_record(&record);
        self.state.write_meta(&dir, &suspended)?;
        crate::backend::disk::unmount(&dir);
        Ok(())
    }

    /// [`Provider::resume`](crate::Provider::resume) of the local tier.
    pub(super) async fn resume_sandbox(&self, id: &str) -> Result<Sandbox> {
        const OP: &str = "resume";
        let dir = self.state.dir(id)?;
        let _ = self.state.read_meta(id)?;
        let _lock = lock(&dir, OP)?;
        let (_, suspended) = self.state.read_meta(id)?;
        if suspended.suspended_unix.is_none() {
            return Err(Error::NotSuspended { id: id.into() });
        }
        let record: LocalRecord = suspended
            .record()
            .ok_or_else(|| state_err(id, "its record is unreadable"))?;
        let spec = record
            .spec
            .clone()
            .ok_or_else(|| state_err(id, "no spec kept to start it again"))?;
        crate::backend::disk::mount(&dir)?;
        let archive = dir.join(SAVED);
        let restore = archive.exists().then(|| archive.clone());
        let egress = crate::egress::supervisor::read_config(&dir).or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(Default::default()),
            _ => Err(io(OP)(e)),
        })?;
        let back_to_suspended = |e: Error| {
            // The directory says "suspended" again; disk and archive as they were.
            if let Err(w) = self.state.write_meta(&dir, &suspended) {
                tracing::warn!(%id, "could not mark a failed resume suspended again: {w}");
            }
            crate::backend::disk::unmount(&dir);
            e
        };
        let started = self
            .start(
                id,
                &dir,
                &spec,
                record.uid_slot,
                None,
                super::Origin {
                    restore,
                    begun: suspended.created_unix,
                },
            )
            .await;
        let sandbox = match started {
            Ok(sb) => sb,
            Err(e) => return Err(back_to_suspended(e)),
        };
        if let Err(e) = self.arm(id, &dir, &sandbox, &egress).await {
            sandbox.client.close();
            let _ = self.state.halt(id, Stop::Kill).await;
            if let Some(cg) = self
                .state
                .read_meta(id)
                .ok()
                .and_then(|(_, m)| m.record::<LocalRecord>()?.cgroups)
            {
                cg.remove();
            }
            return Err(back_to_suspended(e));
        }
        // Put back: the tmpfs's hold it now, and the next suspend writes anew.
        if let Err(e) = std::fs::remove_file(&archive) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(%id, "could not remove the restored archive: {e}");
            }
        }
        Ok(Sandbox::new(sandbox))
    }
}

/// The sandbox's init: the recorded process that is pid 1 of its own pid
/// namespace.
fn init_of(meta: &Meta) -> Option<u32> {
    meta.procs.iter().map(|p| p.pid).find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let ids: Vec<String> = s
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))?
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                Some(ids.len() >= 2 && ids.last().map(String::as_str) == Some("1"))
            })
            .unwrap_or(false)
    })
}

/// Makes what was written to the workspace durable (the host's side of it:
/// a directory, or the disk image's filesystem).
fn sync_workspace(dir: &Path) -> std::io::Result<()> {
    let ws = std::fs::File::open(dir.join("workspace"))?;
    rustix::fs::syncfs(&ws).map_err(Into::into)
}

/// One line of a `uid_map`/`gid_map`: (inside, outside, count).
type IdRange = (u32, u32, u32);

fn read_map(path: &str) -> std::io::Result<Vec<IdRange>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|x| x.parse::<u32>().ok());
            Some((f.next()??, f.next()??, f.next()??))
        })
        .collect())
}

/// A host id as the sandbox sees it (65534, the overflow id, if unmapped).
fn inside(map: &[IdRange], host: u32) -> u32 {
    map.iter()
        .find(|(_, out, n)| host >= *out && host - out < *n)
        .map_or(65534, |(ins, out, _)| ins + (host - out))
}

/// Archives [`SAVED_DIRS`] of the sandbox whose init is host pid `init`
/// into `out` (through a temporary file, synced and renamed into place).
pub(super) fn save(init: u32, out: &Path) -> std::io::Result<Saved> {
    let uids = read_map(&format!("/proc/{init}/uid_map"))?;
    let gids = read_map(&format!("/proc/{init}/gid_map"))?;
    let root = rustix::fs::open(
        format!("/proc/{init}/root"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let tmp = out.with_extension("tar.tmp");
    let file = std::fs::File::create(&tmp)?;
    let mut walker = Walker {
        tar: tar::Builder::new(BufWriter::new(file)),
        uids,
        gids,
        saved: Saved::default(),
    };
    let mut saved = Saved::default();
    let result = (|| {
        for top in SAVED_DIRS {
            let fd = match openat(&root, top, OFlags::DIRECTORY) {
                Ok(fd) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let dev = rustix::fs::fstat(&fd)?.st_dev;
            walker.dir(&fd, PathBuf::from(top), dev)?;
        }
        saved = walker.saved;
        let file = walker.tar.into_inner()?.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out)?;
    if let Some(parent) = out.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(saved)
}

fn openat(dir: &impl AsFd, name: &str, extra: OFlags) -> std::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
    .map_err(Into::into)
}

struct Walker {
    tar: tar::Builder<BufWriter<std::fs::File>>,
    uids: Vec<IdRange>,
    gids: Vec<IdRange>,
    saved: Saved,
}

impl Walker {
    /// A header for `st`, owners as the sandbox sees them.
    fn header(&self, st: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(st.st_mode & 0o7777);
        h.set_uid(u64::from(inside(&self.uids, st.st_uid)));
        h.set_gid(u64::from(inside(&self.gids, st.st_gid)));
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
                    let f = std::fs::File::from(openat(fd, &name, OFlags::empty())?);
                    let size = u64::try_from(st.st_size).unwrap_or(0);
                    let mut h = self.header(&st, tar::EntryType::Regular, size);
                    // Every process is stopped, so the size cannot move;
                    // a short read would still fail the archive, not pad it.
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
                // Sockets and devices mean nothing without their
                // processes; another mount is not the sandbox's tmpfs.
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
        self.1 -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_written_as_the_sandbox_sees_them() {
        let map = [(0, 100_000, 65_536)];
        assert_eq!(inside(&map, 100_000), 0);
        assert_eq!(inside(&map, 101_000), 1000);
        assert_eq!(inside(&map, 99_999), 65534);
        assert_eq!(inside(&map, 165_536), 65534);
    }
}
