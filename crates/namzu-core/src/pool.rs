//! A warm pool: sandboxes of one configuration started ahead of demand, so
//! a caller that creates many (a server, a CI runner) gets one in the time
//! a queue pop takes instead of a cold start.
//!
//! A [`Pool`] holds up to [`PoolOptions::size`] started sandboxes of one
//! [`SandboxSpec`] from one [`Provider`], and refills itself in the
//! background, at most [`PoolOptions::max_starting`] starts at a time.
//! What it promises:
//!
//! * **Never twice.** A sandbox leaves the pool by being popped from its
//!   queue under a lock; nobody else ever holds it.
//! * **Never dead.** Before a claim hands one out, its liveness is checked
//!   (the tier's own cheap check where it has one, else a `Health` call
//!   bounded by [`PoolOptions::check_timeout`]); one whose agent died is
//!   destroyed and the next is tried. Idle ones are checked every
//!   [`PoolOptions::recheck_every`] as well.
//! * **Bounded.** At most `size` wait, at most `max_starting` start at
//!   once; a claim on an empty pool starts one itself (a cold start).
//! * **Nothing left behind.** [`Pool::close`] destroys what it holds; a
//!   sandbox already claimed is the caller's. With a ledger
//!   ([`PoolOptions::ledger`]) the pool also survives its process dying:
//!   every waiting sandbox is a file there until it is claimed or
//!   destroyed, and the next pool on that ledger destroys what it finds
//!   before it starts any.
//!
//! Start failures are logged and retried after a backoff; a claim never
//! fails because a refill did.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::handle::Sandbox;
use crate::provider::Provider;
use crate::spec::SandboxSpec;

/// How a pool fills and checks itself.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Sandboxes kept started and waiting.
    pub size: usize,
    /// Starts in flight at once while refilling.
    pub max_starting: usize,
    /// Bound on a liveness check by `Health` (tiers without a cheaper one).
    pub check_timeout: Duration,
    /// How often idle sandboxes are checked.
    pub recheck_every: Duration,
    /// Wait after a failed start before the next.
    pub retry_after: Duration,
    /// How long after a claim the refill waits before starting the
    /// replacement: on a host with few cores a start competes for them
    /// with the claimer's first commands, which this keeps it from.
    pub refill_delay: Duration,
    /// Run `true` in each sandbox once it has started, before it waits:
    /// the link's first call and the agent's first spawn, which cost a
    /// cold sandbox about a millisecond more than the next ones, are paid
    /// in the background instead of by the claimer's first command.
    pub warm_up: bool,
    /// A directory naming every sandbox waiting in the pool (one empty
    /// file each), so what a crashed process left waiting is destroyed by
    /// the next pool started on it. `None`: no ledger.
    pub ledger: Option<std::path::PathBuf>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            size: 4,
            max_starting: 1,
            check_timeout: Duration::from_millis(500),
            recheck_every: Duration::from_secs(10),
            retry_after: Duration::from_secs(1),
            warm_up: true,
            refill_delay: Duration::from_millis(20),
            ledger: None,
        }
    }
}

impl PoolOptions {
    /// These options with `size` waiting.
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// These options with `n` starts at once.
    pub fn max_starting(mut self, n: usize) -> Self {
        self.max_starting = n.max(1);
        self
    }

    /// These options with a ledger in `dir`.
    pub fn ledger(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.ledger = Some(dir.into());
        self
    }
}

/// What a pool has done, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Claims served from the pool.
    pub warm: u64,
    /// Claims that found it empty and started one themselves.
    pub cold: u64,
    /// Sandboxes found dead (at a claim or a recheck) and destroyed.
    pub discarded: u64,
    /// Starts by the refill that failed.
    pub failed_starts: u64,
}

struct State {
    ready: VecDeque<(Sandbox, Instant)>,
    starting: usize,
    closed: bool,
    stats: PoolStats,
}

struct Shared {
    provider: Arc<dyn Provider>,
    spec: SandboxSpec,
    opts: PoolOptions,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

/// Started sandboxes of one configuration, handed out once each.
pub struct Pool {
    shared: Arc<Shared>,
    refill: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("tier", &self.shared.provider.tier())
            .field("size", &self.shared.opts.size)
            .field("ready", &self.ready())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Whole entries only ever go in or out: a poisoned queue is valid.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `sb`'s agent still answers: by the tier's cheap check where
    /// it has one (its processes), unless `thorough`, else by `Health`.
    async fn alive(&self, sb: &Sandbox, thorough: bool) -> bool {
        if sb.agent().is_retired() {
            return false;
        }
        match sb.alive() {
            Some(false) => false,
            Some(true) if !thorough => true,
            _ => matches!(
                tokio::time::timeout(self.opts.check_timeout, sb.agent().health()).await,
                Ok(Ok(_))
            ),
        }
    }

    /// Destroys a sandbox found dead, in the background.
    fn discard(self: &Arc<Self>, sb: Sandbox) {
        self.lock().stats.discarded += 1;
        tracing::warn!(
            sandbox = sb.id(),
            "pool: a waiting sandbox's agent is gone; destroying it"
        );
        let me = self.clone();
        tokio::spawn(async move { me.destroy(sb).await });
    }

    /// Destroys `sb`, then strikes it from the ledger.
    async fn destroy(&self, sb: Sandbox) {
        if let Err(e) = sb.destroy().await {
            tracing::warn!(sandbox = sb.id(), "pool: destroy failed: {e}");
        }
        self.unlist(sb.id());
    }

    fn list(&self, id: &str) {
        if let Some(dir) = &self.opts.ledger {
            let made = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join(id), b""));
            if let Err(e) = made {
                tracing::warn!(sandbox = id, "pool: cannot enter it in the ledger: {e}");
            }
        }
    }

    fn unlist(&self, id: &str) {
        if let Some(dir) = &self.opts.ledger {
            let _ = std::fs::remove_file(dir.join(id));
        }
    }

    /// Destroys what the ledger names: sandboxes a process that died left
    /// waiting.
    async fn sweep_ledger(&self) {
        let Some(dir) = &self.opts.ledger else { return };
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            match self.provider.destroy(&id).await {
                Ok(()) => tracing::info!(sandbox = %id, "pool: destroyed a sandbox an earlier pool left waiting"),
                Err(err) => {
                    tracing::warn!(sandbox = %id, "pool: a sandbox an earlier pool left could not be destroyed: {err}")
                }
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Pool {
    /// A pool of `spec` sandboxes from `provider`; it starts filling at
    /// once (on the current tokio runtime).
    pub fn new(provider: Arc<dyn Provider>, spec: SandboxSpec, opts: PoolOptions) -> Self {
        let shared = Arc::new(Shared {
            provider,
            spec,
            opts,
            state: Mutex::new(State {
                ready: VecDeque::new(),
                starting: 0,
                closed: false,
                stats: PoolStats::default(),
            }),
            wake: tokio::sync::Notify::new(),
        });
        let refill = tokio::spawn(refill(shared.clone()));
        Self { shared, refill }
    }

    /// The configuration this pool starts.
    pub fn spec(&self) -> &SandboxSpec {
        &self.shared.spec
    }

    /// Sandboxes waiting now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats
    }

    /// Waits until `n` sandboxes wait (at most the pool's size), or
    /// `timeout` passed; returns how many wait.
    pub async fn filled(&self, n: usize, timeout: Duration) -> usize {
        let n = n.min(self.shared.opts.size);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ready = self.ready();
            if ready >= n || tokio::time::Instant::now() >= deadline {
                return ready;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A started sandbox of the pool's configuration, the caller's from now
    /// on: a waiting one whose agent answers, else one started now.
    pub async fn claim(&self) -> Result<Sandbox> {
        loop {
            let next = {
                let mut st = self.shared.lock();
                st.ready.pop_front()
            };
            let Some((sb, _)) = next else { break };
            self.shared.wake.notify_one();
            if self.shared.alive(&sb, false).await {
                crate::timeline::mark("pool.claimed");
                self.shared.lock().stats.warm += 1;
                self.shared.unlist(sb.id());
                return Ok(sb);
            }
            self.shared.discard(sb);
        }
        self.shared.lock().stats.cold += 1;
        self.shared.wake.notify_one();
        self.shared.provider.create(self.shared.spec.clone()).await
    }

    /// Stops refilling, and returns once every sandbox still waiting, or
    /// still starting, is destroyed.
    pub async fn close(mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        let _ = (&mut self.refill).await;
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Without `close`, the refill task destroys what waits in the
        // background, for as long as the runtime runs.
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// Destroys what the pool still holds once it is closed.
async fn drain(sh: &Arc<Shared>, mut starts: tokio::task::JoinSet<Result<Sandbox>>) {
    let waiting: Vec<Sandbox> = sh.lock().ready.drain(..).map(|(sb, _)| sb).collect();
    let mut doomed = waiting;
    while let Some(done) = starts.join_next().await {
        if let Ok(Ok(sb)) = done {
            doomed.push(sb);
        }
    }
    for sb in doomed {
        sh.destroy(sb).await;
    }
}

/// Keeps the pool full and its idle sandboxes checked until it is closed,
/// then destroys what it holds.
async fn refill(sh: Arc<Shared>) {
    sh.sweep_ledger().await;
    let mut starts = tokio::task::JoinSet::new();
    loop {
        if sh.lock().closed {
            return drain(&sh, starts).await;
        }
        // Start what is missing, within the bound on starts at once.
        loop {
            let mut st = sh.lock();
            if st.closed || st.ready.len() + st.starting >= sh.opts.size || st.starting >= sh.opts.max_starting {
                break;
            }
            st.starting += 1;
            drop(st);
            let (provider, spec, warm_up) = (sh.provider.clone(), sh.spec.clone(), sh.opts.warm_up);
            starts.spawn(async move {
                let sb = provider.create(spec).await?;
                if warm_up {
                    if let Err(e) = sb.commands().run(crate::types::ExecRequest::new("true")).await {
                        let _ = sb.destroy().await;
                        return Err(e);
                    }
                }
                Ok(sb)
            });
        }
        // Idle ones past their recheck time.
        let stale: Vec<Sandbox> = {
            let mut st = sh.lock();
            let every = sh.opts.recheck_every;
            let (old, fresh): (VecDeque<_>, VecDeque<_>) =
                st.ready.drain(..).partition(|(_, at)| at.elapsed() >= every);
            st.ready = fresh;
            old.into_iter().map(|(sb, _)| sb).collect()
        };
        for sb in stale {
            if sh.alive(&sb, true).await {
                sh.lock().ready.push_back((sb, Instant::now()));
            } else {
                sh.discard(sb);
            }
        }
        let recheck = sh.opts.recheck_every;
        let wake = async {
            sh.wake.notified().await;
            tokio::time::sleep(sh.opts.refill_delay).await;
        };
        tokio::select! {
            Some(done) = starts.join_next(), if !starts.is_empty() => {
                // Decided under the lock, acted on after it.
                let late = {
                    let mut st = sh.lock();
                    st.starting -= 1;
                    match done {
                        Ok(Ok(sb)) if !st.closed => {
                            sh.list(sb.id());
                            st.ready.push_back((sb, Instant::now()));
                            None
                        }
                        Ok(Ok(sb)) => Some(Ok(sb)),
                        Ok(Err(e)) => {
                            st.stats.failed_starts += 1;
                            Some(Err(e.to_string()))
                        }
                        Err(e) => Some(Err(format!("the start panicked: {e}"))),
                    }
                };
                match late {
                    None => {}
                    Some(Ok(sb)) => sh.destroy(sb).await,
                    Some(Err(e)) => {
                        tracing::warn!("pool: a start failed: {e}");
                        tokio::time::sleep(sh.opts.retry_after).await;
                    }
                }
            }
            _ = wake => {}
            _ = tokio::time::sleep(recheck) => {}
        }
    }
}
