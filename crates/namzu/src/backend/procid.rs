//! Processes by identity: a pid together with its start time (clock ticks
//! after boot, field 22 of `/proc/<pid>/stat`). A pid alone may have been
//! reused by an unrelated process; the pair cannot be within one boot. How
//! a sandbox's leftovers are killed: only the processes recorded for it at
//! create (its anchor and the anchor's descendants: on `local` the
//! launcher, its namespace child and the sandbox's init, whose death takes
//! its whole pid namespace), never a process because its command line
//! happens to name the sandbox's directory (an operator's `tail -f` of a
//! log there, say).

use serde::{Deserialize, Serialize};

/// One process, by identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    /// Its process id inside the sandbox.
    pub pid: u32,
    /// Start time, in clock ticks after boot.
    pub start: u64,
}

/// (parent pid, start time, state) from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, u64, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted
    // after the last ')'. Field 3 (state) is the first after it.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start, state))
}

impl ProcId {
    /// The process with this pid now, if there is one.
    pub fn of(pid: u32) -> Option<Self> {
        stat(pid).map(|(_, start, _)| Self { pid, start })
    }

    /// Whether this very process still runs (not a zombie).
    pub fn is_live(&self) -> bool {
        matches!(stat(self.pid), Some((_, start, state)) if start == self.start && state != 'Z')
    }

    /// SIGKILLs this very process if it still runs; whether it did.
    pub fn kill(&self) -> bool {
        if !self.is_live() {
            return false;
        }
        let Ok(raw) = i32::try_from(self.pid) else { return false };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL).is_ok()
    }
}

/// `root` and every process descending from it now, by identity: read
/// from each process's `/proc/<pid>/task/<tid>/children`, a few small
/// files for a sandbox's three processes, or — on a kernel without those
/// files — from a scan of every process's parent.
pub fn tree(root: u32) -> Vec<ProcId> {
    tree_by_children(root).unwrap_or_else(|| tree_by_scan(root))
}

/// The identities a launcher wrote to `path` (`LaunchSpec::procs_file`:
/// itself, its namespace child, the sandbox's init), if the file is whole
/// and names `launcher` first: a file left by an earlier launch does not.
pub fn from_launcher(path: &std::path::Path, launcher: u32) -> Option<Vec<ProcId>> {
    let text = std::fs::read_to_string(path).ok()?;
    let procs = namzu_proto::launch::procs_from_text(&text)?;
    (procs.first()?.0 == launcher).then(|| procs.into_iter().map(|(pid, start)| ProcId { pid, start }).collect())
}

/// The children of every thread of `pid`; `None` where the kernel has no
/// `children` files (CONFIG_PROC_CHILDREN).
fn children(pid: u32) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut any = false;
    for t in tasks.flatten() {
        match std::fs::read_to_string(t.path().join("children")) {
            Ok(text) => {
                any = true;
                out.extend(text.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The thread is gone (then its siblings tell), or the
                // kernel lacks the file (then none has it).
                if t.path().exists() {
                    return None;
                }
            }
            Err(_) => {}
        }
    }
    any.then_some(out)
}

fn tree_by_children(root: u32) -> Option<Vec<ProcId>> {
    let mut out: Vec<ProcId> = ProcId::of(root).into_iter().collect();
    let mut i = 0;
    while i < out.len() {
        let pid = out[i].pid;
        match children(pid) {
            Some(kids) => out.extend(kids.into_iter().filter_map(ProcId::of)),
            // A process that exited meanwhile has no children to list.
            None if !std::path::Path::new(&format!("/proc/{pid}")).exists() => {}
            None => return None,
        }
        i += 1;
    }
    Some(out)
}

fn tree_by_scan(root: u32) -> Vec<ProcId> {
    let mut parents: Vec<(u32, u32, u64)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((ppid, start, _)) = stat(pid) {
            parents.push((pid, ppid, start));
        }
    }
    let mut out: Vec<ProcId> = parents
        .iter()
        .find(|(p, _, _)| *p == root)
        .map(|(pid, _, start)| ProcId {
            pid: *pid,
            start: *start,
        })
        .into_iter()
        .collect();
    let mut i = 0;
    while i < out.len() {
        let parent = out[i].pid;
        out.extend(
            parents
                .iter()
                .filter(|(_, ppid, _)| *ppid == parent)
                .map(|(pid, _, start)| ProcId {
                    pid: *pid,
                    start: *start,
                }),
        );
        i += 1;
    }
    out
}

/// SIGKILLs each of `procs` still running, deepest first (on `local` the
/// sandbox's init, whose death takes its pid namespace, before its
/// launcher), each through a pidfd checked against its identity after it
/// was opened, and waits on the pidfds until every one has exited or
/// `bound` passed. Returns how many were running.
pub async fn kill_and_wait(procs: &[ProcId], bound: std::time::Duration) -> usize {
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let mut fds = Vec::new();
    for p in procs.iter().rev() {
        let Some(pid) = i32::try_from(p.pid).ok().and_then(Pid::from_raw) else {
            continue;
        };
        let Ok(fd) = pidfd_open(pid, PidfdFlags::NONBLOCK) else {
            continue; // gone
        };
        // The pidfd names whatever held the pid when it was opened: ours
        // only if it still has our start time now.
        if !p.is_live() {
            continue;
        }
        if pidfd_send_signal(&fd, Signal::Kill).is_ok() {
            fds.push(fd);
        }
    }
    let n = fds.len();
    let wait = async {
        for fd in fds {
            // Readable once the process has exited.
            #[allow(unsafe_code)]
            // SAFETY: the AsyncFd takes the OwnedFd itself, so the
            // descriptor stays open and the same until it is dropped.
            let registered =
                unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
            if let Ok(fd) = registered {
                let _ = fd.readable().await;
            }
        }
    };
    if tokio::time::timeout(bound, wait).await.is_err() {
        tracing::warn!(?bound, "processes SIGKILLed did not exit within the bound");
    }
    n
}

/// SIGKILLs each of `procs` still running, in rounds (10 ms apart, at
/// most 20) until none is left; returns how many it found in the first.
pub async fn kill_all(procs: &[ProcId]) -> usize {
    let mut first = None;
    for _ in 0..20 {
        let found = procs.iter().filter(|p| p.kill()).count();
        first.get_or_insert(found);
        if found == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    first.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identity_survives_only_as_long_as_the_process() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = ProcId::of(std::process::id()).unwrap();
        let id = ProcId::of(child.id()).unwrap();
        assert!(id.is_live());
        // Other tests of this binary start and reap processes meanwhile,
        // and a `children` file read while its list changes can skip an
        // entry (seq_file positions): a few reads, each of both ways.
        let mut agreed = None;
        for _ in 0..20 {
            let mut by_children = tree_by_children(me.pid).unwrap();
            let mut by_scan = tree_by_scan(me.pid);
            by_children.sort_by_key(|p| p.pid);
            by_scan.sort_by_key(|p| p.pid);
            if by_children == by_scan && by_children.contains(&id) {
                agreed = Some(by_children);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(agreed.is_some(), "both ways find the same tree, the child in it");
        // Another start time is another process, even at the same pid.
        let impostor = ProcId {
            pid: id.pid,
            start: id.start + 1,
        };
        assert!(!impostor.is_live());
        assert!(!impostor.kill());
        assert!(
            child.try_wait().unwrap().is_none(),
            "the impostor's kill reached the process"
        );
        assert!(id.kill());
        child.wait().unwrap();
        assert!(!id.is_live());
    }
}
