//! Quiesce and flush.
//!
//! Every process in a sandbox descends from the agent: commands are its
//! children and orphans are re-parented to it (it is a subreaper, or PID 1).
//! Quiesce walks that tree through /proc and stops it in rounds — SIGTERM,
//! a grace period, SIGKILL — until a pass finds nothing, so processes forked
//! by dying ones are caught too. Flush is `syncfs` on the filesystem under
//! the sandbox's first root, bounded by a timeout.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use namzu_proto::v1::{agent_error::Kind, StoppedProcess};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::op_error::{agent_err, OpError};

/// Passes before quiesce gives up on a process tree that keeps forking.
const MAX_ROUNDS: u32 = 32;
/// How long a SIGKILLed process may take to vanish.
const KILL_DEADLINE: Duration = Duration::from_secs(2);

/// A live (not zombie) descendant of this process.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: i32,
    pub comm: String,
    /// `/proc/PID/stat`'s state: `T` stopped, `S` sleeping, `D` …
    pub state: char,
    /// Generations below the agent: 1 for its children.
    pub depth: u32,
}

/// Every live descendant of this process, by pid.
pub fn tree() -> Vec<Proc> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let mut parent: HashMap<i32, (i32, String, char)> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let (Some((head, rest)), Some(open)) = (stat.rsplit_once(')'), stat.find('(')) else {
                continue;
            };
            let comm = head.get(open + 1..).unwrap_or_default().to_owned();
            let mut f = rest.split_whitespace();
            let (state, ppid) = (
                f.next().and_then(|s| s.chars().next()),
                f.next().and_then(|p| p.parse::<i32>().ok()),
            );
            if let (Some(st), Some(ppid)) = (state, ppid) {
                if st != 'Z' {
                    parent.insert(pid, (ppid, comm, st));
                }
            }
        }
    }
    let depth = |mut pid: i32| {
        for d in 1..4096 {
            match parent.get(&pid) {
                Some((ppid, ..)) if *ppid == me => return Some(d),
                Some((ppid, ..)) if *ppid > 1 => pid = *ppid,
                _ => return None,
            }
        }
        None
    };
    let mut out: Vec<Proc> = parent
        .iter()
        .filter(|(pid, _)| **pid != me)
        .filter_map(|(pid, (_, comm, state))| {
            depth(*pid).map(|depth| Proc {
                pid: *pid,
                comm: comm.clone(),
                state: *state,
                depth,
            })
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    out
}

/// (pid, comm) of every live descendant of this process.
pub fn descendants() -> Vec<(i32, String)> {
    tree().into_iter().map(|p| (p.pid, p.comm)).collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

async fn wait_gone(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Stops every descendant. Returns what was stopped (with the signal that
/// ended it) and how many passes it took.
pub async fn quiesce(grace: Duration) -> Result<(Vec<StoppedProcess>, u32), OpError> {
    let mut stopped: BTreeMap<i32, StoppedProcess> = BTreeMap::new();
    let mut rounds = 0;
    loop {
        let procs = descendants();
        if procs.is_empty() {
            break;
        }
        rounds += 1;
        if rounds > MAX_ROUNDS {
            let mut e = agent_err(Kind::Survivor, "quiesce", "processes keep appearing");
            e.pid = u32::try_from(procs[0].0).unwrap_or(0);
            return Err(e);
        }
        for (pid, comm) in &procs {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
            // A stopped process (paused, or by job control) acts on the
            // TERM only once continued.
            let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
            stopped.entry(*pid).or_insert(StoppedProcess {
                pid: u32::try_from(*pid).unwrap_or(0),
                comm: comm.clone(),
                signal: Signal::SIGTERM as i32,
            });
        }
        let pids: Vec<i32> = procs.iter().map(|(p, _)| *p).collect();
        let stubborn = wait_gone(&pids, grace).await;
        for pid in &stubborn {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            if let Some(s) = stopped.get_mut(pid) {
                s.signal = Signal::SIGKILL as i32;
            }
        }
        if let Some(survivor) = wait_gone(&stubborn, KILL_DEADLINE).await.first() {
            let mut e = agent_err(Kind::Survivor, "quiesce", "a process survived SIGKILL");
            e.pid = u32::try_from(*survivor).unwrap_or(0);
            return Err(e);
        }
    }
    Ok((stopped.into_values().collect(), rounds))
}

/// What a stopping agent (SIGTERM) gives the workspace's `syncfs`, inside
/// `agent_shutdown_deadline_ms` after its quiesce (`shutdown_grace_ms` a
/// round): a pod's `terminationGracePeriodSeconds` must cover all three.
pub const SHUTDOWN_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `syncfs` on the filesystem holding `root`, within `timeout`.
pub async fn flush(root: &Path, timeout: Duration) -> Result<Duration, OpError> {
    let root = root.to_path_buf();
    let t0 = Instant::now();
    let work = tokio::task::spawn_blocking(move || {
        let fd = rustix::fs::open(
            &root,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )?;
        rustix::fs::syncfs(&fd)
    });
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(Ok(()))) => Ok(t0.elapsed()),
        Ok(Ok(Err(e))) => Err(agent_err(Kind::Io, "flush", &format!("syncfs: {e}"))),
        Ok(Err(e)) => Err(agent_err(Kind::Io, "flush", &e.to_string())),
        Err(_) => {
            let mut e = agent_err(Kind::Timeout, "flush", "syncfs did not finish in time");
            e.limit = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            Err(e)
        }
    }
}
