//! Named sessions that outlive any connection.
//!
//! A detached session is a command leading its own kernel session, stdin
//! closed, stdout and stderr merged into one stream. A pump reads that
//! stream into a ring of `session_ring_bytes` whether or not anyone reads
//! it, so the command never blocks on a full pipe; every byte has an offset,
//! and a reader asking for bytes the ring already evicted is told how many
//! it lost instead of getting a shorter stream that looks complete.
//! Records of exited sessions are kept for `session_ttl_ms`; at most
//! `max_sessions` exist at once.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use namzu_proto::v1::{self, agent_error::Kind, session_info::State, SessionInfo};
use nix::sys::signal::Signal;
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;

use crate::config::Limits;
use crate::op_error::{agent_err, OpError};
use crate::reaper::{ExitInfo, Reaper};

/// Default largest chunk of one ReadSession.
const READ_DEFAULT: usize = 256 * 1024;

struct Ring {
    buf: VecDeque<u8>,
    /// Offset of `buf[0]`.
    start: u64,
    cap: usize,
}

impl Ring {
    fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
    }
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

struct Session {
    pid: u32,
    ring: Mutex<Ring>,
    exit: Mutex<Option<(ExitInfo, Instant)>>,
    /// Woken on new output and on exit, for attachments that follow.
    changed: tokio::sync::Notify,
    /// A persistent terminal's pty; `None` for a detached command.
    pty: Option<Arc<AsyncFd<OwnedFd>>>,
    /// The current attachment (generation, token), ended when another takes
    /// over.
    attached: Mutex<Option<(u64, tokio_util::sync::CancellationToken)>>,
    generation: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Whole-value updates only: a poisoned lock still holds a valid value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    fn info(&self, id: &str) -> SessionInfo {
        let (end, start) = {
            let r = lock(&self.ring);
            (r.end(), r.start)
        };
        let exit = *lock(&self.exit);
        let (state, code, signal) = match exit {
            None => (State::Running, None, None),
            Some((ExitInfo::Code(c), _)) => (State::Exited, Some(c), None),
            Some((ExitInfo::Signal(s), _)) => (State::Exited, None, Some(s)),
        };
        SessionInfo {
            session_id: id.into(),
            pid: self.pid,
            state: state as i32,
            code,
            signal,
            output_bytes: end,
            first_offset: start,
        }
    }
}

pub struct Sessions {
    limits: Limits,
    default_cwd: PathBuf,
    reaper: Arc<Reaper>,
    map: Mutex<BTreeMap<String, Arc<Session>>>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn not_found(op: &str, id: &str) -> OpError {
    let mut e = agent_err(Kind::NotFound, op, &format!("no session {id:?}"));
    e.execution_id = id.into();
    e
}

impl Sessions {
    pub fn new(limits: Limits, default_cwd: PathBuf, reaper: Arc<Reaper>) -> Self {
        Self {
            limits,
            default_cwd,
            reaper,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    fn get(&self, op: &str, id: &str) -> Result<Arc<Session>, OpError> {
        // Expired records go before any lookup, not only when a new session
        // is admitted: past its TTL a session is gone for every caller.
        self.prune();
        lock(&self.map).get(id).cloned().ok_or_else(|| not_found(op, id))
    }

    /// Forgets exited sessions older than the TTL.
    fn prune(&self) {
        let ttl = Duration::from_millis(self.limits.session_ttl_ms);
        lock(&self.map).retain(|_, s| !matches!(*lock(&s.exit), Some((_, at)) if at.elapsed() > ttl));
    }

    /// Refuses a bad or taken id, or a full registry.
    fn admit(&self, op: &str, id: &str) -> Result<(), OpError> {
        if !valid_id(id) {
            return Err(agent_err(
                Kind::InvalidArgument,
                op,
                "session id must be 1-128 of [A-Za-z0-9._-]",
            ));
        }
        self.prune();
        let map = lock(&self.map);
        if map.contains_key(id) {
            let mut e = agent_err(Kind::AlreadyExists, op, "a session with this id exists");
            e.execution_id = id.into();
            return Err(e);
        }
        if map.len() as u64 >= self.limits.max_sessions {
            let mut e = agent_err(Kind::LimitExceeded, op, "too many sessions");
            e.limit_name = namzu_proto::limits::MAX_SESSIONS.into();
            e.limit = self.limits.max_sessions;
            return Err(e);
        }
        Ok(())
    }

    pub fn start_session(&self, req: v1::StartSessionRequest) -> Result<SessionInfo, OpError> {
        const OP: &str = "start_session";
        if req.command.is_empty() {
            return Err(agent_err(Kind::InvalidArgument, OP, "command is empty"));
        }
        self.admit(OP, &req.session_id)?;
        let io = |e: std::io::Error| agent_err(Kind::Io, OP, &e.to_string());
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()))?;
        let mut cmd = std::process::Command::new(OsStr::from_bytes(&req.command));
        crate::identity::prepare(&mut cmd);
        cmd.args(req.args.iter().map(|a| OsStr::from_bytes(a)));
        cmd.current_dir(if req.cwd.is_empty() {
            self.default_cwd.clone()
        } else {
            self.default_cwd.join(OsStr::from_bytes(&req.cwd))
        });
        for kv in &req.env {
            if kv.key.is_empty() || kv.key.contains(&b'=') || kv.key.contains(&0) || kv.value.contains(&0) {
                return Err(agent_err(Kind::InvalidArgument, OP, "invalid environment variable"));
            }
            cmd.env(OsStr::from_bytes(&kv.key), OsStr::from_bytes(&kv.value));
        }
        cmd.stdin(std::process::Stdio::null());
        cmd.stdout(std::process::Stdio::from(w.try_clone().map_err(io)?));
        cmd.stderr(std::process::Stdio::from(w));
        #[allow(unsafe_code)]
        // SAFETY: only setsid runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
        }
        let (child, exit_rx) = self.reaper.spawn(&mut cmd).map_err(|e| {
            let mut err = agent_err(Kind::SpawnFailed, OP, &format!("cannot start command: {e}"));
            err.errno = e.raw_os_error().unwrap_or(0);
            err.path = req.command.clone();
            err
        })?;
        drop(cmd);
        let session = self.insert(&req.session_id, child.id(), None);
        let pumped = session.clone();
        let pump = tokio::spawn(async move { pump(r, &pumped).await });
        watch_exit(session.clone(), exit_rx, pump);
        Ok(session.info(&req.session_id))
    }

    fn insert(&self, id: &str, pid: u32, pty: Option<Arc<AsyncFd<OwnedFd>>>) -> Arc<Session> {
        let cap = Limits::usize(self.limits.session_ring_bytes).max(1);
        let session = Arc::new(Session {
            pid,
            ring: Mutex::new(Ring {
                buf: VecDeque::new(),
                start: 0,
                cap,
            }),
            exit: Mutex::new(None),
            changed: tokio::sync::Notify::new(),
            pty,
            attached: Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
        });
        lock(&self.map).insert(id.into(), session.clone());
        session
    }

    /// Starts a persistent terminal: its output drains into the ring from
    /// the start; attachments come and go.
    pub fn open_terminal(&self, reaper: &Reaper, open: &v1::TerminalOpen) -> Result<(), OpError> {
        const OP: &str = "terminal";
        self.admit(OP, &open.session_id)?;
        let (master, pid, exit_rx) = crate::terminal::start(reaper, &self.default_cwd, open)?;
        rustix::io::ioctl_fionbio(&master, true).map_err(|e| agent_err(Kind::Io, OP, &e.to_string()))?;
        #[allow(unsafe_code)]
        // SAFETY: an OwnedFd always returns the same, open descriptor from
        // as_raw_fd, and the AsyncFd owns it until it is dropped.
        let master =
            Arc::new(unsafe { AsyncFd::register(master) }.map_err(|e| agent_err(Kind::Io, OP, &e.to_string()))?);
        let session = self.insert(&open.session_id, pid, Some(master.clone()));
        let pumped = session.clone();
        let pump = tokio::spawn(async move { pump_pty(master, &pumped).await });
        watch_exit(session.clone(), exit_rx, pump);
        // Whatever the leader left behind in its session goes with it.
        let sid = i32::try_from(pid).unwrap_or(i32::MAX);
        let swept = session.clone();
        tokio::spawn(async move {
            loop {
                if lock(&swept.exit).is_some() {
                    let _ = crate::terminal::kill_session(sid, Signal::SIGKILL).await;
                    return;
                }
                let changed = swept.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if lock(&swept.exit).is_some() {
                    continue;
                }
                changed.await;
            }
        });
        Ok(())
    }

    /// Attaches to a persistent terminal from `from`: replays, then follows,
    /// with input and resize. Ends on the program's exit (after the last
    /// byte), on `close` (which kills the session), when the host goes away
    /// (a detach: nothing is signalled), or when another attachment takes
    /// over (ATTACH_REPLACED).
    pub async fn attach(
        &self,
        id: &str,
        from: u64,
        host_heartbeats: bool,
        mut input: tonic::Streaming<v1::TerminalInput>,
        tx: tokio::sync::mpsc::Sender<Result<v1::TerminalOutput, tonic::Status>>,
    ) {
        use crate::op_error::IntoStatus;
        use v1::{terminal_input::Msg as In, terminal_output::Msg as Out};
        let s = match self.get("attach_terminal", id) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(e.into_status())).await;
                return;
            }
        };
        let Some(master) = s.pty.clone() else {
            let _ = tx
                .send(Err(agent_err(
                    Kind::InvalidArgument,
                    "attach_terminal",
                    "not a terminal session",
                )
                .into_status()))
                .await;
            return;
        };
        let mine = tokio_util::sync::CancellationToken::new();
        let generation = s.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some((_, previous)) = lock(&s.attached).replace((generation, mine.clone())) {
            previous.cancel();
        }
        let _ = tx
            .send(crate::terminal::out(Out::Opened(v1::Started {
                pid: s.pid,
                execution_id: id.into(),
                attached: true,
                boot_id: crate::boot_id().to_owned(),
            })))
            .await;
        let heartbeat = self.limits.heartbeat();
        let beats = heartbeat.map(|every| crate::terminal::spawn_heartbeats(tx.clone(), every));
        let silence = if host_heartbeats {
            heartbeat.map(|d| d * 3)
        } else {
            None
        };
        let mut at = from;
        loop {
            let changed = s.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Everything held from `at`, in chunks.
            let (data, offset) = {
                let r = lock(&s.ring);
                let from = at.clamp(r.start, r.end());
                let skip = usize::try_from(from - r.start).unwrap_or(usize::MAX);
                (
                    r.buf.iter().skip(skip).take(64 * 1024).copied().collect::<Vec<u8>>(),
                    from,
                )
            };
            if !data.is_empty() {
                at = offset + data.len() as u64;
                let chunk = v1::OutputChunk {
                    offset,
                    data: data.into(),
                    log_offset: 0,
                };
                if tx.send(crate::terminal::out(Out::Data(chunk))).await.is_err() {
                    break;
                }
                continue;
            }
            let exit = *lock(&s.exit);
            if let Some((status, _)) = exit {
                let (code, signal) = match status {
                    ExitInfo::Code(c) => (Some(c), None),
                    ExitInfo::Signal(sg) => (None, Some(sg)),
                };
                let _ = tx
                    .send(crate::terminal::out(Out::Exit(v1::ExecExit {
                        code,
                        signal,
                        ..Default::default()
                    })))
                    .await;
                break;
            }
            tokio::select! {
                _ = &mut changed => {}
                _ = mine.cancelled() => {
                    let mut e = agent_err(Kind::AttachReplaced, "attach_terminal", "another attachment took this terminal over");
                    e.execution_id = id.into();
                    e.limit = at;
                    let _ = tx.send(Err(e.into_status())).await;
                    return;
                }
                _ = tx.closed() => break,
                msg = crate::terminal::next_input(&mut input, silence) => match msg {
                    Some(Ok(v1::TerminalInput { msg: Some(In::Heartbeat(_)) })) => {}
                    Some(Ok(v1::TerminalInput { msg: Some(In::Input(d)) })) => {
                        let _ = crate::terminal::write_all(&master, &d).await;
                    }
                    Some(Ok(v1::TerminalInput { msg: Some(In::Resize(sz)) })) => {
                        let _ = rustix::termios::tcsetwinsize(master.get_ref(), crate::terminal::winsize(sz.cols, sz.rows));
                    }
                    Some(Ok(v1::TerminalInput { msg: Some(In::Close(_)) })) => {
                        let sid = i32::try_from(s.pid).unwrap_or(i32::MAX);
                        let _ = crate::terminal::kill_session(sid, Signal::SIGKILL).await;
                    }
                    // The host went away: detach, signal nothing.
                    _ => break,
                },
            }
        }
        if let Some(b) = beats {
            b.abort();
        }
        let mut current = lock(&s.attached);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    pub fn read(&self, req: &v1::ReadSessionRequest) -> Result<v1::ReadSessionResponse, OpError> {
        let s = self.get("read_session", &req.session_id)?;
        let max = match req.max_bytes {
            0 => READ_DEFAULT,
            n => usize::try_from(n).unwrap_or(READ_DEFAULT).min(4 * READ_DEFAULT),
        };
        let (data, offset, dropped) = {
            let r = lock(&s.ring);
            let from = req.from_offset.clamp(r.start, r.end());
            let dropped = r.start.saturating_sub(req.from_offset);
            let skip = usize::try_from(from - r.start).unwrap_or(usize::MAX);
            let data: Vec<u8> = r.buf.iter().skip(skip).take(max).copied().collect();
            (data, from, dropped)
        };
        let next_offset = offset + data.len() as u64;
        Ok(v1::ReadSessionResponse {
            data: data.into(),
            offset,
            next_offset,
            dropped_bytes: dropped,
            info: Some(s.info(&req.session_id)),
        })
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        self.prune();
        lock(&self.map).iter().map(|(id, s)| s.info(id)).collect()
    }

    /// Signals everything still in the session, and for a while waits to
    /// report the state the signal led to.
    pub async fn kill(&self, id: &str, sig: Signal) -> Result<SessionInfo, OpError> {
        let s = self.get("kill_session", id)?;
        let sid = i32::try_from(s.pid).unwrap_or(i32::MAX);
        if sig == Signal::SIGKILL {
            let left = crate::terminal::kill_session(sid, sig).await;
            if let Some(pid) = left.first() {
                let mut e = agent_err(Kind::Survivor, "kill_session", "a process survived SIGKILL");
                e.pid = u32::try_from(*pid).unwrap_or(0);
                return Err(e);
            }
        } else {
            for pid in crate::terminal::session_members(sid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            }
        }
        for _ in 0..100 {
            if lock(&s.exit).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(s.info(id))
    }
}

async fn pump(r: OwnedFd, s: &Session) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(r) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                lock(&s.ring).push(&buf[..n]);
                s.changed.notify_waiters();
            }
        }
    }
}

/// Reads a persistent terminal's pty into its ring until the last slave
/// holder is gone.
async fn pump_pty(master: Arc<AsyncFd<OwnedFd>>, s: &Session) {
    use std::os::fd::AsFd;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(mut guard) = master.readable().await else { return };
        match guard.try_io(|fd| rustix::io::read(fd.get_ref().as_fd(), &mut buf).map_err(std::io::Error::from)) {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                lock(&s.ring).push(&buf[..n]);
                s.changed.notify_waiters();
            }
            Err(_would_block) => continue,
        }
    }
}

/// Records the exit once every byte of output is in.
fn watch_exit(s: Arc<Session>, exit_rx: tokio::sync::oneshot::Receiver<ExitInfo>, pump: tokio::task::JoinHandle<()>) {
    tokio::spawn(async move {
        let status = exit_rx.await.unwrap_or(ExitInfo::Signal(9));
        let _ = tokio::time::timeout(Duration::from_millis(200), pump).await;
        *lock(&s.exit) = Some((status, Instant::now()));
        s.changed.notify_waiters();
    });
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn the_ring_keeps_the_newest_bytes_and_counts_what_it_dropped() {
        let mut r = Ring {
            buf: Default::default(),
            start: 0,
            cap: 4,
        };
        r.push(b"abc");
        r.push(b"def");
        assert_eq!(r.start, 2);
        assert_eq!(r.end(), 6);
        assert_eq!(r.buf.iter().copied().collect::<Vec<_>>(), b"cdef");
    }
}
