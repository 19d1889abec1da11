//! Executions: reservation, start, streaming, timeout, cancel, and the fence.
//!
//! Promises:
//! * An execution id is reserved before the command starts; a cancel that
//!   arrives between the two is remembered, and the start then answers
//!   "cancelled" without spawning anything.
//! * Each command leads its own session (and so its own process group). A
//!   timeout or a cancel SIGKILLs the whole group and then *confirms* it is
//!   gone: the leader has been reaped and `kill(-pgid, 0)` answers `ESRCH`.
//! * A kill that cannot be confirmed within `cancel_confirm_ms` fences the
//!   agent (`retiring`): from then on it refuses every op but Health and
//!   Cancel, because a process it believed dead may still be running.
//! * Output beyond `max_output_bytes` per stream is counted and dropped (the
//!   pipe keeps draining so the command never blocks), and reported as
//!   truncated.
//! * A *detachable* execution (`detach`) has a caller-chosen name and
//!   outlives every call: its output goes to a retained log
//!   ([`crate::exec_log`]), losing a call signals nothing, starting a
//!   retained name again runs nothing and attaches, and a cancel that
//!   cannot be confirmed is reported without fencing the agent (the
//!   record stays, running, for the caller to retry). At most
//!   `max_retained_logs` logs are held, exited ones for
//!   `execution_retained_ttl_ms`.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use namzu_proto::v1::{
    self, agent_error::Kind, cancel_response::Outcome, exec_output, ExecExit, ExecOutput, ExecStart,
};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use tokio::sync::{mpsc, oneshot};

use crate::config::Limits;
use crate::exec_log::{spawn_heartbeats, ExecLog, OutputTx};
pub use crate::exec_pipes::InputStream;
use crate::exec_pipes::{pump, watch_input, Sink};
use crate::op_error::{agent_err, IntoStatus, OpError};
use crate::reaper::{ExitInfo, Reaper};

/// After the leader exits, how long output from lingering group members is
/// still collected before the result is sent.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

type CancelReply = oneshot::Sender<Outcome>;

enum Slot {
    Reserved(Instant),
    CancelledBeforeStart,
    Running(mpsc::Sender<CancelReply>),
    Finished,
}

impl Slot {
    /// Counts against `max_execs`.
    fn live(&self) -> bool {
        matches!(self, Slot::Reserved(_) | Slot::Running(_))
    }
}

/// The slots by id, with how many are live and how many reserved kept as
/// they change, so an exec's admission costs the same with 1,024 finished
/// records kept as with none.
#[derive(Default)]
struct Slots {
    map: HashMap<String, Slot>,
    live: u64,
    reserved: u64,
}

impl Slots {
    fn count(&mut self, slot: &Slot, by: i64) {
        if slot.live() {
            self.live = self.live.wrapping_add_signed(by);
        }
        if matches!(slot, Slot::Reserved(_)) {
            self.reserved = self.reserved.wrapping_add_signed(by);
        }
    }

    fn get(&self, id: &str) -> Option<&Slot> {
        self.map.get(id)
    }

    fn insert(&mut self, id: String, slot: Slot) {
        self.count(&slot, 1);
        if let Some(old) = self.map.insert(id, slot) {
            self.count(&old, -1);
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(old) = self.map.remove(id) {
            self.count(&old, -1);
        }
    }

    /// Drops reservations older than `ttl`; a walk only while any is held.
    fn expire_reserved(&mut self, now: Instant, ttl: Duration) {
        if self.reserved == 0 {
            return;
        }
        self.map
            .retain(|_, s| !matches!(s, Slot::Reserved(at) if now.duration_since(*at) > ttl));
        self.reserved = self.map.values().filter(|s| matches!(s, Slot::Reserved(_))).count() as u64;
        self.live = self.map.values().filter(|s| s.live()).count() as u64;
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &Slot)> {
        self.map.iter()
    }
}

#[derive(Default)]
struct Table {
    slots: Slots,
    finished: VecDeque<String>,
    /// Retained logs of detachable executions, by name.
    logs: HashMap<String, Arc<ExecLog>>,
}

/// A name a caller may give a detachable execution.
pub fn valid_name(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn with_id(mut e: OpError, id: &str) -> OpError {
    e.execution_id = id.into();
    e
}

pub struct Execs {
    limits: Limits,
    default_cwd: PathBuf,
    reaper: Arc<Reaper>,
    table: Mutex<Table>,
    retiring: AtomicBool,
    shutting_down: AtomicBool,
    /// Set while a quiesce runs: executions that die meanwhile end as
    /// cancelled, never as a kill that could fence the agent.
    quiescing: AtomicBool,
}

impl Execs {
    pub fn new(limits: Limits, default_cwd: PathBuf, reaper: Arc<Reaper>) -> Self {
        Self {
            limits,
            default_cwd,
            reaper,
            table: Mutex::new(Table::default()),
            retiring: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            quiescing: AtomicBool::new(false),
        }
    }

    /// The reaper commands are spawned through (terminals use it too).
    pub fn reaper(&self) -> Arc<Reaper> {
        self.reaper.clone()
    }

    pub fn default_cwd(&self) -> &std::path::Path {
        &self.default_cwd
    }

    pub fn retiring(&self) -> bool {
        self.retiring.load(Ordering::SeqCst)
    }

    pub fn set_quiescing(&self, on: bool) {
        self.quiescing.store(on, Ordering::SeqCst);
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Whole-entry updates only; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves an id: a fresh one, or `name` for a detachable execution.
    /// Answers whether a retained execution already holds the name (its
    /// start will then attach instead of running anything).
    pub fn reserve(&self, name: Option<&str>) -> Result<(String, bool), OpError> {
        const OP: &str = "reserve_exec";
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(agent_err(Kind::ShuttingDown, OP, "agent is shutting down"));
        }
        if let Some(n) = name {
            if !valid_name(n) {
                return Err(with_id(
                    agent_err(
                        Kind::InvalidArgument,
                        OP,
                        "execution id must be 1-128 of [A-Za-z0-9._-]",
                    ),
                    n,
                ));
            }
        }
        let mut t = self.table();
        let now = Instant::now();
        // Unused reservations expire, so a host that reserves and vanishes
        // cannot exhaust `max_execs`.
        let ttl = Duration::from_millis(self.limits.reservation_ttl_ms);
        t.slots.expire_reserved(now, ttl);
        self.prune_logs(&mut t);
        if let Some(n) = name {
            if t.logs.contains_key(n) {
                return Ok((n.to_owned(), true));
            }
            match t.slots.get(n) {
                Some(Slot::Reserved(_) | Slot::CancelledBeforeStart) => return Ok((n.to_owned(), false)),
                Some(_) => {
                    return Err(with_id(
                        agent_err(Kind::ExecState, OP, "an execution that is not detachable has this id"),
                        n,
                    ))
                }
                None => {}
            }
        }
        self.check_capacity(&t, OP)?;
        let id = match name {
            Some(n) => n.to_owned(),
            None => format!("x-{:016x}", rand::random::<u64>()),
        };
        t.slots.insert(id.clone(), Slot::Reserved(now));
        Ok((id, false))
    }

    /// Refuses a new execution when `max_execs` are reserved or running.
    fn check_capacity(&self, t: &Table, op: &str) -> Result<(), OpError> {
        if t.slots.live >= self.limits.max_execs {
            let mut e = agent_err(Kind::LimitExceeded, op, "too many executions");
            e.limit_name = namzu_proto::limits::MAX_EXECS.into();
            e.limit = self.limits.max_execs;
            return Err(e);
        }
        Ok(())
    }

    /// Forgets logs of executions that exited more than the TTL ago, and
    /// their records with them: past retention an id is unknown.
    fn prune_logs(&self, t: &mut Table) {
        let ttl = Duration::from_millis(self.limits.execution_retained_ttl_ms);
        let expired: Vec<String> = t
            .logs
            .iter()
            .filter(|(_, log)| log.finished_at().is_some_and(|at| at.elapsed() > ttl))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            forget_log(t, &id);
        }
    }

    /// Makes room for one more log: the oldest exited one goes; if every
    /// held log belongs to a running execution, the new one is refused.
    fn room_for_log(&self, t: &mut Table, op: &str) -> Result<(), OpError> {
        self.prune_logs(t);
        if (t.logs.len() as u64) < self.limits.max_retained_logs {
            return Ok(());
        }
        let oldest = t
            .logs
            .iter()
            .filter_map(|(id, log)| log.finished_at().map(|at| (at, id.clone())))
            .min();
        match oldest {
            Some((_, id)) => {
                forget_log(t, &id);
                Ok(())
            }
            None => {
                let mut e = agent_err(
                    Kind::LimitExceeded,
                    op,
                    "every retained log belongs to a running execution",
                );
                e.limit_name = namzu_proto::limits::MAX_RETAINED_LOGS.into();
                e.limit = self.limits.max_retained_logs;
                Err(e)
            }
        }
    }

    /// Every execution held: reserved and running ones, and the detachable
    /// ones whose logs are retained (exited included), sorted by id.
    pub fn list(&self) -> Vec<v1::ExecRecord> {
        let t = self.table();
        let mut out: Vec<v1::ExecRecord> = Vec::new();
        for (id, slot) in t.slots.iter() {
            let state = match slot {
                Slot::Reserved(_) => "reserved",
                Slot::Running(_) => "running",
                Slot::CancelledBeforeStart | Slot::Finished => continue,
            };
            out.push(v1::ExecRecord {
                execution_id: id.clone(),
                state: state.into(),
                ..Default::default()
            });
        }
        for (id, log) in &t.logs {
            let (pid, output_bytes, exit) = log.summary();
            let record = v1::ExecRecord {
                execution_id: id.clone(),
                state: if exit.is_some() { "exited" } else { "running" }.into(),
                detachable: true,
                pid,
                output_bytes,
                exit,
            };
            match out.iter_mut().find(|r| r.execution_id == *id) {
                Some(r) => *r = record,
                None => out.push(record),
            }
        }
        out.sort_by(|a, b| a.execution_id.cmp(&b.execution_id));
        out
    }

    pub async fn cancel(&self, execution_id: &str) -> Result<Outcome, OpError> {
        let tx = {
            let mut t = self.table();
            match t.slots.get(execution_id) {
                // A detachable execution's record outlives its slot.
                None if t.logs.contains_key(execution_id) => return Ok(Outcome::AlreadyExited),
                None => {
                    let mut e = agent_err(Kind::UnknownExec, "cancel", "no such execution");
                    e.execution_id = execution_id.into();
                    return Err(e);
                }
                Some(Slot::Reserved(_)) | Some(Slot::CancelledBeforeStart) => {
                    t.slots.insert(execution_id.to_owned(), Slot::CancelledBeforeStart);
                    return Ok(Outcome::NotStarted);
                }
                Some(Slot::Finished) => return Ok(Outcome::AlreadyExited),
                Some(Slot::Running(tx)) => tx.clone(),
            }
        };
        let (reply, answer) = oneshot::channel();
        if tx.send(reply).await.is_err() {
            return Ok(Outcome::AlreadyExited);
        }
        // The runner answers after its kill is confirmed or given up on; if it
        // finished on its own meanwhile, it drops the reply.
        Ok(answer.await.unwrap_or(Outcome::AlreadyExited))
    }

    fn finish(&self, execution_id: &str) {
        let mut t = self.table();
        t.slots.insert(execution_id.to_owned(), Slot::Finished);
        t.finished.push_back(execution_id.to_owned());
        while t.finished.len() as u64 > self.limits.exec_records_kept {
            // A name may have been started again since; only a finished
            // record goes.
            if let Some(old) = t.finished.pop_front() {
                if matches!(t.slots.get(&old), Some(Slot::Finished)) {
                    t.slots.remove(&old);
                }
            }
        }
    }

    /// Runs one execution whose `start` message has been read. Output
    /// messages go to `out`; the last one is `exit`, or an error status.
    pub async fn run(self: Arc<Self>, start: ExecStart, input: InputStream, out: OutputTx) {
        if start.detachable {
            return self.run_detached(start, input, out).await;
        }
        let execution_id = start.execution_id.clone();
        let result = match self.admit(&start) {
            Ok(Some(cancel_rx)) => {
                let r = self.run_inner(start, input, Sink::Call(out.clone()), cancel_rx).await;
                self.finish(&execution_id);
                r
            }
            Ok(None) => {
                self.finish(&execution_id);
                Ok(cancelled_before_start())
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(exit) => {
                let _ = out
                    .send(Ok(ExecOutput {
                        msg: Some(exec_output::Msg::Exit(exit)),
                    }))
                    .await;
            }
            Err(e) => {
                let _ = out.send(Err(e.into_status())).await;
            }
        }
    }

    /// Checks the timeout against the sandbox maximum; 0 means the maximum.
    fn timeout_ms(&self, start: &ExecStart) -> Result<u64, OpError> {
        match start.timeout_ms {
            0 => Ok(self.limits.sandbox_max_timeout_ms),
            t if t > self.limits.sandbox_max_timeout_ms => {
                let mut e = agent_err(Kind::LimitExceeded, "exec", "timeout exceeds the sandbox maximum");
                e.limit_name = namzu_proto::limits::SANDBOX_MAX_TIMEOUT_MS.into();
                e.limit = self.limits.sandbox_max_timeout_ms;
                Err(with_id(e, &start.execution_id))
            }
            t => Ok(t),
        }
    }

    /// Admission of an attached execution: only a reserved id may start,
    /// and only once. `None`: it was cancelled before it started.
    fn admit(&self, start: &ExecStart) -> Result<Option<mpsc::Receiver<CancelReply>>, OpError> {
        const OP: &str = "exec";
        let execution_id = &start.execution_id;
        self.timeout_ms(start)?;
        let mut t = self.table();
        match t.slots.get(execution_id) {
            Some(Slot::Reserved(_)) => {
                let (cancel_tx, cancel_rx) = mpsc::channel::<CancelReply>(4);
                t.slots.insert(execution_id.clone(), Slot::Running(cancel_tx));
                Ok(Some(cancel_rx))
            }
            Some(Slot::CancelledBeforeStart) => Ok(None),
            Some(_) => Err(with_id(
                agent_err(Kind::ExecState, OP, "execution already started"),
                execution_id,
            )),
            None => Err(with_id(
                agent_err(Kind::UnknownExec, OP, "execution id was not reserved"),
                execution_id,
            )),
        }
    }

    /// A detachable execution: admitted by name, run by a task of its own
    /// into a retained log, and followed by this call from offset 0. A
    /// name already retained runs nothing: the call attaches to it.
    async fn run_detached(self: Arc<Self>, start: ExecStart, input: InputStream, out: OutputTx) {
        const OP: &str = "exec";
        let id = start.execution_id.clone();
        let admitted = (|| {
            if !valid_name(&id) {
                return Err(with_id(
                    agent_err(
                        Kind::InvalidArgument,
                        OP,
                        "execution id must be 1-128 of [A-Za-z0-9._-]",
                    ),
                    &id,
                ));
            }
            self.timeout_ms(&start)?;
            let mut t = self.table();
            self.prune_logs(&mut t);
            if let Some(log) = t.logs.get(&id) {
                return Ok(Err((log.clone(), true)));
            }
            match t.slots.get(&id) {
                Some(Slot::CancelledBeforeStart) => return Ok(Ok(None)),
                Some(Slot::Reserved(_)) => {}
                None => self.check_capacity(&t, OP)?,
                Some(_) => {
                    return Err(with_id(
                        agent_err(Kind::ExecState, OP, "an execution that is not detachable has this id"),
                        &id,
                    ))
                }
            }
            self.room_for_log(&mut t, OP)?;
            let log = ExecLog::new(self.limits.execution_log_bytes);
            let (cancel_tx, cancel_rx) = mpsc::channel::<CancelReply>(4);
            t.logs.insert(id.clone(), log.clone());
            t.slots.insert(id.clone(), Slot::Running(cancel_tx));
            Ok(Ok(Some((log, cancel_rx))))
        })();
        let (log, attached) = match admitted {
            Err(e) => {
                let _ = out.send(Err(e.into_status())).await;
                return;
            }
            Ok(Ok(None)) => {
                self.finish(&id);
                let exit = exec_output::Msg::Exit(cancelled_before_start());
                let _ = out.send(Ok(ExecOutput { msg: Some(exit) })).await;
                return;
            }
            Ok(Err(existing)) => existing,
            Ok(Ok(Some((log, cancel_rx)))) => {
                let runner = self.clone();
                let logged = log.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    let outcome = runner
                        .run_inner(start, input, Sink::Log(logged.clone()), cancel_rx)
                        .await;
                    logged.finish(outcome);
                    runner.finish(&id);
                });
                (log, false)
            }
        };
        if !attached {
            log.started().await;
        }
        log.follow(id, 0, true, attached, self.limits.heartbeat(), out).await;
    }

    /// Reads a detachable execution's log, from any call, while it is
    /// retained.
    pub async fn attach(&self, req: v1::AttachExecRequest, out: OutputTx) {
        const OP: &str = "attach_exec";
        let found = {
            let mut t = self.table();
            self.prune_logs(&mut t);
            match (t.logs.get(&req.execution_id), t.slots.get(&req.execution_id)) {
                (Some(log), _) => Ok(log.clone()),
                (None, Some(slot)) => {
                    let (state, why) = match slot {
                        Slot::Reserved(_) | Slot::CancelledBeforeStart => {
                            ("reserved", "reserved, and never started: nothing runs under this id")
                        }
                        _ => ("not-detachable", "not started detachable: nothing retains its output"),
                    };
                    let mut e = with_id(agent_err(Kind::NotAttachable, OP, why), &req.execution_id);
                    e.exec_state = state.into();
                    Err(e)
                }
                (None, None) => Err(with_id(
                    agent_err(
                        Kind::UnknownExec,
                        OP,
                        "no such execution (never started, or past retention)",
                    ),
                    &req.execution_id,
                )),
            }
        };
        match found {
            Ok(log) => {
                log.follow(
                    req.execution_id,
                    req.from_offset,
                    req.follow,
                    true,
                    self.limits.heartbeat(),
                    out,
                )
                .await
            }
            Err(e) => {
                let _ = out.send(Err(e.into_status())).await;
            }
        }
    }

    async fn run_inner(
        &self,
        start: ExecStart,
        input: InputStream,
        sink: Sink,
        mut cancel_rx: mpsc::Receiver<CancelReply>,
    ) -> Result<ExecExit, OpError> {
        let execution_id = start.execution_id.clone();
        let timeout_ms = self.timeout_ms(&start)?;
        let detached = matches!(sink, Sink::Log(_));

        let started_at = Instant::now();
        let (child, mut exit_rx) = crate::spawn::start_command(&start, &self.default_cwd, &self.reaper)
            .map_err(|e| with_id(e, &execution_id))?;
        let pid = child.pid;
        let pgid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        tracing::debug!(%execution_id, pid, detached, "started");
        match &sink {
            Sink::Call(out) => {
                let started = v1::Started {
                    pid,
                    execution_id: execution_id.clone(),
                    attached: false,
                    boot_id: crate::boot_id().to_owned(),
                };
                let _ = out
                    .send(Ok(ExecOutput {
                        msg: Some(exec_output::Msg::Started(started)),
                    }))
                    .await;
            }
            Sink::Log(log) => log.set_pid(pid),
        }

        let cap = self.limits.max_output_bytes;
        let mut pumps = tokio::task::JoinSet::new();
        pumps.spawn(pump(child.stdout, sink.clone(), cap, true));
        pumps.spawn(pump(child.stderr, sink.clone(), cap, false));
        // One task owns the request stream for the whole execution: it feeds
        // stdin, swallows heartbeats, and says when the host has gone silent.
        // A detachable command does not care: the host going only ends its
        // stdin.
        let host_gone = tokio_util::sync::CancellationToken::new();
        let silence = if start.host_heartbeats && !detached {
            self.limits.heartbeat().map(|d| d * 3)
        } else {
            None
        };
        let stdin_fd = child.stdin;
        let input_task = tokio::spawn(watch_input(
            input,
            stdin_fd,
            start.stdin.clone(),
            start.stdin_stream,
            silence,
            host_gone.clone(),
        ));
        let beats = match (&sink, self.limits.heartbeat()) {
            (Sink::Call(out), Some(every)) => Some(spawn_heartbeats(out.clone(), every)),
            _ => None,
        };
        let host_gone = async {
            if detached {
                futures::future::pending::<()>().await;
            }
            host_gone.cancelled().await;
        };
        tokio::pin!(host_gone);

        // Time the sandbox spends paused does not count.
        let deadline = crate::pause::sleep_running(Duration::from_millis(timeout_ms));
        tokio::pin!(deadline);
        let mut exit: Option<ExitInfo> = None;
        let mut timed_out = false;
        let mut cancelled = false;
        loop {
            tokio::select! {
                status = &mut exit_rx => { exit = status.ok(); }
                _ = &mut deadline => {
                    timed_out = true;
                    if !self.kill_confirm(pgid, &mut exit_rx, &mut exit).await {
                        return Err(self.retire(&execution_id, "timeout kill could not be confirmed"));
                    }
                }
                Some(reply) = cancel_rx.recv() => {
                    let confirmed = self.kill_confirm(pgid, &mut exit_rx, &mut exit).await;
                    let _ = reply.send(if confirmed { Outcome::Confirmed } else { Outcome::Unconfirmed });
                    if !confirmed {
                        if detached {
                            // Nothing is retired: the record stays, running,
                            // and the caller may cancel again.
                            tracing::warn!(%execution_id, "cancel of a detachable execution could not be confirmed");
                            continue;
                        }
                        return Err(self.retire(&execution_id, "cancel could not be confirmed"));
                    }
                    cancelled = true;
                }
                _ = &mut host_gone => {
                    tracing::warn!(%execution_id, "host silent for three heartbeat intervals; killing the process group");
                    cancelled = true;
                    if !self.kill_confirm(pgid, &mut exit_rx, &mut exit).await {
                        return Err(self.retire(&execution_id, "kill after the host went silent could not be confirmed"));
                    }
                }
                _ = sink.closed() => {
                    // The host dropped the stream. Leaving the group running would
                    // orphan it with nobody to collect it; a command meant to
                    // outlive its call is started detachable.
                    tracing::info!(%execution_id, "exec stream dropped by the host; killing the process group");
                    cancelled = true;
                    if !self.kill_confirm(pgid, &mut exit_rx, &mut exit).await {
                        return Err(self.retire(&execution_id, "kill after stream drop could not be confirmed"));
                    }
                }
            }
            break;
        }
        if self.quiescing.load(Ordering::SeqCst) {
            cancelled = true;
        }
        input_task.abort();
        if let Some(b) = beats {
            b.abort();
        }
        // Pipes reach EOF when the last holder exits; a background member of
        // the group may keep them open, so collection stops after a grace.
        let mut counts = [(0u64, false); 2];
        let drain = async {
            while let Some(r) = pumps.join_next().await {
                if let Ok((is_stdout, total, truncated)) = r {
                    counts[usize::from(!is_stdout)] = (total, truncated);
                }
            }
        };
        if tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await.is_err() {
            pumps.abort_all();
        }
        let (code, signal) = match exit {
            Some(ExitInfo::Code(c)) => (Some(c), None),
            Some(ExitInfo::Signal(s)) => (None, Some(s)),
            None => (None, None),
        };
        Ok(ExecExit {
            code,
            signal,
            timed_out,
            cancelled,
            stdout_bytes: counts[0].0,
            stdout_truncated: counts[0].1,
            stderr_bytes: counts[1].0,
            stderr_truncated: counts[1].1,
            duration_ms: u64::try_from(started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn retire(&self, execution_id: &str, why: &str) -> OpError {
        self.retiring.store(true, Ordering::SeqCst);
        tracing::error!(%execution_id, why, "agent is retiring: a process group may still be running");
        let mut e = agent_err(Kind::Retiring, "exec", why);
        e.execution_id = execution_id.into();
        e
    }

    /// SIGKILLs the group, then waits until the leader is reaped and the
    /// group is empty. False if that was not seen within `cancel_confirm_ms`.
    async fn kill_confirm(
        &self,
        pgid: Pid,
        exit_rx: &mut oneshot::Receiver<ExitInfo>,
        exit: &mut Option<ExitInfo>,
    ) -> bool {
        let _ = killpg(pgid, Signal::SIGKILL);
        let deadline = Instant::now() + self.limits.cancel_confirm();
        loop {
            if exit.is_none() {
                if let Ok(status) = exit_rx.try_recv() {
                    *exit = Some(status);
                }
            }
            if exit.is_some() && kill(Pid::from_raw(-pgid.as_raw()), None) == Err(nix::errno::Errno::ESRCH) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // A member forked after the first signal is caught on the next pass.
            let _ = killpg(pgid, Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Drops a finished detachable execution's log and record.
fn forget_log(t: &mut Table, id: &str) {
    t.logs.remove(id);
    if matches!(t.slots.get(id), Some(Slot::Finished)) {
        t.slots.remove(id);
    }
}

fn cancelled_before_start() -> ExecExit {
    ExecExit {
        cancelled: true,
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod tests;
