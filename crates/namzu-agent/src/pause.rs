//! Pause and resume.
//!
//! A pause stops every process of the sandbox but the agent: SIGSTOP to
//! each descendant ([`crate::quiesce::tree`]), ancestors first so no shell
//! sees its job stop before it is stopped itself, in rounds until a pass
//! finds none running — a process forked between a scan and its parent's
//! stop is caught by the next. Nothing new starts while paused: the gate
//! every spawn passes ([`gate`], taken by the reaper) is closed before the
//! first scan, and a spawn already past it finishes before the pause
//! begins. A process stopped before the pause (job control) is left as it
//! is, and stays stopped after the resume, which continues exactly the
//! processes the pause stopped, descendants first.
//!
//! The agent itself runs on: its link, heartbeats, file operations,
//! attaches, cancels and kills go on (a stopped process still dies of
//! SIGKILL). A command's timeout counts only time the sandbox was not
//! paused ([`sleep_running`]), so a pause never uses it up.
//!
//! Not the cgroup freezer: the agent shares its sandbox's cgroup (and on
//! some tiers has none of its own to freeze), and a frozen agent would
//! drop its link and every stream on it.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use namzu_proto::v1::agent_error::Kind;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::op_error::{agent_err, OpError};

/// Passes before a pause gives up on a tree that keeps forking.
const MAX_ROUNDS: u32 = 32;
/// How long a SIGSTOPped process may take to settle ([`settled`]).
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Why something was refused while paused.
const PAUSED: &str = "the sandbox is paused: nothing starts until it is resumed";

/// Closed (true) while paused: every spawn passes it.
static GATE: RwLock<bool> = RwLock::new(false);

struct State {
    /// Set while paused: since when, and the pids the pause stopped with
    /// their depth.
    paused: Option<(Instant, BTreeMap<i32, u32>)>,
    /// Time spent paused before the current pause.
    total: Duration,
}

static STATE: Mutex<State> = Mutex::new(State {
    paused: None,
    total: Duration::ZERO,
});

/// The fixed point of the running clock: set before the first pause or
/// the first timeout, whichever comes first, so every pause it subtracts
/// came after it.
fn origin() -> Instant {
    static O: OnceLock<Instant> = OnceLock::new();
    *O.get_or_init(Instant::now)
}

/// Serializes pauses and resumes (each takes many steps).
fn op_lock() -> &'static tokio::sync::Mutex<()> {
    static L: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    L.get_or_init(|| tokio::sync::Mutex::new(()))
}

/// Tells waiters in [`sleep_running`] that the pause state changed.
fn changed() -> &'static tokio::sync::watch::Sender<bool> {
    static W: OnceLock<tokio::sync::watch::Sender<bool>> = OnceLock::new();
    W.get_or_init(|| tokio::sync::watch::channel(false).0)
}

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the sandbox is paused.
pub fn is_paused() -> bool {
    *GATE.read().unwrap_or_else(|p| p.into_inner())
}

/// Runs `spawn` unless the sandbox is paused (then nothing is started and
/// the error says so); a pause waits for a spawn already inside.
pub(crate) fn gate<T>(spawn: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let closed = GATE.read().unwrap_or_else(|p| p.into_inner());
    if *closed {
        return Err(std::io::Error::new(std::io::ErrorKind::ResourceBusy, PAUSED));
    }
    spawn()
}

/// The typed refusal of `op` while paused.
pub fn refuse(op: &str) -> Result<(), OpError> {
    if is_paused() {
        return Err(agent_err(Kind::Paused, op, PAUSED));
    }
    Ok(())
}

fn set_gate(closed: bool) {
    *GATE.write().unwrap_or_else(|p| p.into_inner()) = closed;
    changed().send_replace(closed);
}

/// Stops every descendant (see the module docs). Returns the pids it
/// stopped and the rounds it took; a second pause answers the first's.
pub async fn pause() -> Result<(Vec<u32>, u32), OpError> {
    let _one = op_lock().lock().await;
    origin();
    if let Some((_, stopped)) = &state().paused {
        return Ok((pids(stopped), 0));
    }
    set_gate(true);
    let mut ours: BTreeMap<i32, u32> = BTreeMap::new();
    let mut rounds = 0;
    let outcome = loop {
        let mut fresh: Vec<_> = crate::quiesce::tree()
            .into_iter()
            .filter(|p| !ours.contains_key(&p.pid) && p.state != 'T' && p.state != 't')
            .collect();
        if fresh.is_empty() {
            break Ok(());
        }
        rounds += 1;
        if rounds > MAX_ROUNDS {
            let mut e = agent_err(Kind::Survivor, "pause", "processes keep appearing");
            e.pid = u32::try_from(fresh[0].pid).unwrap_or(0);
            break Err(e);
        }
        fresh.sort_by_key(|p| p.depth);
        for p in &fresh {
            if kill(Pid::from_raw(p.pid), Signal::SIGSTOP).is_ok() {
                ours.insert(p.pid, p.depth);
            }
        }
        if let Some(p) = wait_stopped(&ours).await {
            let what = format!("{} did not stop (state {})", p.comm, p.state);
            let mut e = agent_err(Kind::Survivor, "pause", &what);
            e.pid = u32::try_from(p.pid).unwrap_or(0);
            break Err(e);
        }
    };
    if let Err(e) = outcome {
        // Nothing half paused: what was stopped runs again.
        cont(&ours);
        set_gate(false);
        return Err(e);
    }
    let stopped = pids(&ours);
    state().paused = Some((Instant::now(), ours));
    tracing::info!(stopped = stopped.len(), rounds, "paused");
    Ok((stopped, rounds))
}

/// Continues what the pause stopped. Returns the pids continued and how
/// long the sandbox was paused (nothing and zero when it was not).
pub async fn resume() -> (Vec<u32>, Duration) {
    let _one = op_lock().lock().await;
    let Some((since, ours)) = state().paused.take() else {
        return (Vec::new(), Duration::ZERO);
    };
    let continued = cont(&ours);
    let paused_for = since.elapsed();
    state().total += paused_for;
    set_gate(false);
    tracing::info!(continued = continued.len(), ?paused_for, "resumed");
    (continued, paused_for)
}

fn pids(m: &BTreeMap<i32, u32>) -> Vec<u32> {
    m.keys().filter_map(|p| u32::try_from(*p).ok()).collect()
}

/// SIGCONT to those of `ours` still descendants, deepest first.
fn cont(ours: &BTreeMap<i32, u32>) -> Vec<u32> {
    let live: std::collections::HashSet<i32> = crate::quiesce::tree().iter().map(|p| p.pid).collect();
    let mut order: Vec<(&i32, &u32)> = ours.iter().filter(|(p, _)| live.contains(p)).collect();
    order.sort_by_key(|(_, d)| std::cmp::Reverse(**d));
    order
        .into_iter()
        .filter(|(p, _)| kill(Pid::from_raw(**p), Signal::SIGCONT).is_ok())
        .filter_map(|(p, _)| u32::try_from(*p).ok())
        .collect()
}

/// Whether a process sent SIGSTOP runs no more of its own code: stopped,
/// or in uninterruptible sleep — it takes the pending stop on its way back
/// to user space. (A shell's `vfork` parent waits there for a child the
/// pause stopped before its `exec`; it could never show as stopped.)
fn settled(state: char) -> bool {
    matches!(state, 'T' | 't' | 'D')
}

/// Waits until every pid of `ours` has settled (or is gone); the first
/// that does not within [`STOP_DEADLINE`].
async fn wait_stopped(ours: &BTreeMap<i32, u32>) -> Option<crate::quiesce::Proc> {
    let deadline = Instant::now() + STOP_DEADLINE;
    for round in 0u32.. {
        let mut running = crate::quiesce::tree()
            .into_iter()
            .filter(|p| ours.contains_key(&p.pid) && !settled(p.state));
        match running.next() {
            None => return None,
            Some(p) if Instant::now() >= deadline => return Some(p),
            // A stop usually lands within a scheduler tick: look again
            // at once a few times before sleeping between looks.
            Some(_) if round < 20 => tokio::task::yield_now().await,
            Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    None
}

/// Time the sandbox was not paused since [`origin`].
fn running_clock() -> Duration {
    let origin = origin();
    let s = state();
    let paused_now = s.paused.as_ref().map_or(Duration::ZERO, |(since, _)| since.elapsed());
    origin.elapsed().saturating_sub(s.total + paused_now)
}

/// Sleeps until `d` of time the sandbox was not paused has passed: a
/// command's timeout.
pub async fn sleep_running(d: Duration) {
    let target = running_clock() + d;
    let mut rx = changed().subscribe();
    loop {
        if *rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        }
        let now = running_clock();
        if now >= target {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(target - now) => {}
            r = rx.changed() => if r.is_err() { return },
        }
    }
}
