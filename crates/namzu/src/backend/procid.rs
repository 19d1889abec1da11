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

/// `root` and every process descending from it now, by identity.
pub fn tree(root: u32) -> Vec<ProcId> {
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
        assert!(tree(me.pid).contains(&id), "the child is in our tree");
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
