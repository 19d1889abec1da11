//! WatchDir: changes under a directory inside the jail, from inotify.
//!
//! The directory is opened through the jail (so a symlink cannot lead the
//! watch outside it) and watched by its `/proc/self/fd` path, which names
//! that very inode. Subdirectories of a recursive watch are opened the
//! same way, relative to their parent's descriptor with `O_NOFOLLOW`, both
//! those present at the start (at most `max_walk_entries` of them) and
//! those created later. The call ends when the host drops it, or when the
//! watched directory itself goes away.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use namzu_proto::v1::{WatchEvent, WatchEventKind};
use nix::sys::inotify::{AddWatchFlags as W, InitFlags, Inotify, WatchDescriptor};
use rustix::fs::{Mode, OFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tonic::Status;

use crate::files::{locate, os_err};
use crate::jail::Jail;
use crate::op_error::{agent_err, IntoStatus, OpError};
use namzu_proto::v1::agent_error::Kind;

const OP: &str = "watch_dir";

fn mask() -> W {
    W::IN_CREATE
        | W::IN_MODIFY
        | W::IN_DELETE
        | W::IN_MOVED_FROM
        | W::IN_MOVED_TO
        | W::IN_ATTRIB
        | W::IN_DELETE_SELF
        | W::IN_ONLYDIR
    // Not IN_DONT_FOLLOW: the path is /proc/self/fd/N, a link that must be
    // followed to the directory the jail opened (without following links).
}

/// The inotify instance, as tokio's reactor needs it.
struct Ino(Inotify);

impl AsRawFd for Ino {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The watches of one call: each directory's descriptor and its path
/// relative to the root.
struct Watches {
    ino: AsyncFd<Ino>,
    dirs: HashMap<WatchDescriptor, (OwnedFd, PathBuf)>,
    budget: u64,
}

impl Watches {
    fn add(&mut self, fd: OwnedFd, rel: PathBuf) -> Result<(), nix::Error> {
        if self.budget == 0 {
            return Ok(());
        }
        self.budget -= 1;
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let wd = self.ino.get_ref().0.add_watch(path.as_str(), mask())?;
        self.dirs.insert(wd, (fd, rel));
        Ok(())
    }

    /// Adds `name` under the directory `parent` and, depth-first, its
    /// subdirectories.
    fn add_tree(&mut self, parent: &OwnedFd, name: &OsStr, rel: PathBuf) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::openat(parent.as_fd(), name, flags, Mode::empty()) else {
            return;
        };
        self.add_children(&fd, &rel);
        let _ = self.add(fd, rel);
    }

    fn add_children(&mut self, dir: &OwnedFd, rel: &Path) {
        let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
            return;
        };
        for ent in entries.flatten() {
            let n = ent.file_name().to_bytes();
            if n == b"." || n == b".." || ent.file_type() != rustix::fs::FileType::Directory || self.budget == 0 {
                continue;
            }
            let name = OsStr::from_bytes(n).to_owned();
            self.add_tree(dir, &name, rel.join(&name));
        }
    }
}

/// `.NAME.namzu-tmp-HEX`, the name [`crate::files`] writes under.
fn is_namzu_temporary(name: &[u8]) -> bool {
    name.starts_with(b".") && name.windows(11).any(|w| w == b".namzu-tmp-")
}

fn event(kind: WatchEventKind, name: &Path, is_dir: bool) -> WatchEvent {
    WatchEvent {
        kind: kind as i32,
        name: name.as_os_str().as_bytes().to_vec().into(),
        is_dir,
    }
}

/// Sets the watches up (failing the call if the directory cannot be
/// watched) and returns the task that streams events into `tx`.
pub fn start(
    jail: Arc<Jail>,
    path: Vec<u8>,
    recursive: bool,
    max_dirs: u64,
    tx: mpsc::Sender<Result<WatchEvent, Status>>,
) -> Result<tokio::task::JoinHandle<()>, OpError> {
    let loc = locate(&jail, OP, &path)?;
    let root = jail
        .open(
            &loc,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os_err(OP, &path, e))?;
    let io = |e: nix::Error| {
        let mut err = agent_err(Kind::Io, OP, &format!("inotify: {e}"));
        err.errno = e as i32;
        err
    };
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(io)?;
    #[allow(unsafe_code)]
    // SAFETY: the Inotify owns its descriptor and returns the same open one
    // from as_raw_fd until the AsyncFd, which owns it, is dropped.
    let registered = unsafe { AsyncFd::register(Ino(ino)) };
    let ino = registered.map_err(|e| {
        io(nix::Error::from_raw(
            std::io::Error::from(e).raw_os_error().unwrap_or(0),
        ))
    })?;
    let mut w = Watches {
        ino,
        dirs: HashMap::new(),
        budget: max_dirs.max(1),
    };
    if recursive {
        w.add_children(&root, Path::new(""));
    }
    w.add(root, PathBuf::new()).map_err(io)?;
    Ok(tokio::spawn(pump(w, recursive, tx)))
}

async fn pump(mut w: Watches, recursive: bool, tx: mpsc::Sender<Result<WatchEvent, Status>>) {
    if tx
        .send(Ok(event(WatchEventKind::WatchStarted, Path::new(""), true)))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let ready = tokio::select! {
            _ = tx.closed() => return,
            r = w.ino.readable() => r,
        };
        let Ok(mut guard) = ready else { return };
        let events = match guard.get_inner().0.read_events() {
            Ok(evs) => evs,
            Err(nix::Error::EAGAIN) => {
                guard.clear_ready();
                continue;
            }
            Err(e) => {
                let _ = tx
                    .send(Err(agent_err(Kind::Io, OP, &format!("inotify: {e}")).into_status()))
                    .await;
                return;
            }
        };
        drop(guard);
        for ev in events {
            if ev.mask.contains(W::IN_Q_OVERFLOW) {
                if tx
                    .send(Ok(event(WatchEventKind::WatchOverflow, Path::new(""), false)))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            let Some((_, base)) = w.dirs.get(&ev.wd) else { continue };
            let base = base.clone();
            if ev.mask.contains(W::IN_IGNORED) || ev.mask.contains(W::IN_DELETE_SELF) {
                w.dirs.remove(&ev.wd);
                if base.as_os_str().is_empty() {
                    return; // the watched directory is gone
                }
                continue;
            }
            let Some(name) = ev.name.as_ref() else { continue };
            let name = OsStr::from_bytes(name.as_bytes()).to_owned();
            // The temporaries of namzu's own atomic writes are not the
            // caller's business: the write shows as its rename into place.
            if is_namzu_temporary(name.as_bytes()) {
                continue;
            }
            let rel = base.join(&name);
            let is_dir = ev.mask.contains(W::IN_ISDIR);
            let kind = if ev.mask.intersects(W::IN_CREATE | W::IN_MOVED_TO) {
                WatchEventKind::WatchCreate
            } else if ev.mask.contains(W::IN_MODIFY) {
                WatchEventKind::WatchWrite
            } else if ev.mask.contains(W::IN_DELETE) {
                WatchEventKind::WatchRemove
            } else if ev.mask.contains(W::IN_MOVED_FROM) {
                WatchEventKind::WatchRename
            } else if ev.mask.contains(W::IN_ATTRIB) {
                WatchEventKind::WatchChmod
            } else {
                continue;
            };
            if recursive && is_dir && kind == WatchEventKind::WatchCreate {
                if let Some((parent, _)) = w.dirs.get(&ev.wd) {
                    let parent = parent.try_clone();
                    if let Ok(parent) = parent {
                        w.add_tree(&parent, &name, rel.clone());
                    }
                }
            }
            if tx.send(Ok(event(kind, &rel, is_dir))).await.is_err() {
                return;
            }
        }
    }
}
