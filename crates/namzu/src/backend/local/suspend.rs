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

use std::io::BufWriter;
use std::path::Path;

use namzu_agent::archive::{self, Saved};
use namzu_proto::launch::SAVED_DIRS;
use rustix::fs::{Mode, OFlags};

use super::{LocalProvider, LocalRecord};
use crate::backend::detached::Disarm;
use crate::backend::state::{now_unix, Meta, Stop};
use crate::error::{Error, Result};
use crate::handle::Sandbox;

/// The archive of the writable tmpfs's, in the sandbox's directory.
pub(super) const SAVED: &str = "saved.tar";

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
        // What the tmpfs's can hold; only a sparse file claims more.
        let limit = self.opts.tmpfs_bytes.saturating_mul(SAVED_DIRS.len() as u64);
        // Nothing may change under the copy.
        client.pause().await?;
        let saved = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || {
                sync_workspace(&dir)?;
                save(init, &dir.join(SAVED), limit)
            }
        })
        .await
        .map_err(|e| io(OP)(std::io::Error::other(e)))
        .and_then(|r| {
            r.map_err(|e| match e.kind() {
                std::io::ErrorKind::StorageFull => Error::LimitExceeded {
                    op: OP.into(),
                    limit: "suspend_archive_bytes".into(),
                    value: limit,
                    path: None,
                },
                _ => io(OP)(e),
            })
        });
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
        let egress = crate::egress::supervisor::saved_config(&dir).map_err(io(OP))?;
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
                    kill_if_abandoned: false,
                },
            )
            .await;
        let sandbox = match started {
            // Not killed if abandoned (see `Origin::kill_if_abandoned`).
            Ok((sb, unanswered)) => {
                unanswered.disarm();
                sb
            }
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

/// Archives [`SAVED_DIRS`] of the sandbox whose init is host pid `init`
/// into `out` (through a temporary file, synced and renamed into place),
/// at most `limit` bytes of content.
pub(super) fn save(init: u32, out: &Path, limit: u64) -> std::io::Result<Saved> {
    let maps = archive::Maps {
        uids: archive::read_map(Path::new(&format!("/proc/{init}/uid_map")))?,
        gids: archive::read_map(Path::new(&format!("/proc/{init}/gid_map")))?,
    };
    let root = rustix::fs::open(
        format!("/proc/{init}/root"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let tmp = out.with_extension("tar.tmp");
    let written = (|| {
        let file = BufWriter::new(std::fs::File::create(&tmp)?);
        let (file, saved) = archive::write(&root, SAVED_DIRS, &maps, file, limit)?;
        file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(saved)
    })();
    let saved = match written {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out)?;
    if let Some(parent) = out.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(saved)
}
