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
use tokio::io::AsyncReadExt;

use crate::config::Limits;
use crate::reaper::{ExitInfo, Reaper};
use crate::service::{agent_err, OpError};

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
    e.exec_id = id.into();
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
        lock(&self.map).get(id).cloned().ok_or_else(|| not_found(op, id))
    }

    /// Forgets exited sessions older than the TTL.
    fn prune(&self) {
        let ttl = Duration::from_millis(self.limits.session_ttl_ms);
        lock(&self.map).retain(|_, s| !matches!(*lock(&s.exit), Some((_, at)) if at.elapsed() > ttl));
    }

    pub fn start_detached(&self, req: v1::StartDetachedRequest) -> Result<SessionInfo, OpError> {
        const OP: &str = "start_detached";
        if !valid_id(&req.session_id) {
            return Err(agent_err(
                Kind::InvalidArgument,
                OP,
                "session id must be 1-128 of [A-Za-z0-9._-]",
            ));
        }
        if req.command.is_empty() {
            return Err(agent_err(Kind::InvalidArgument, OP, "command is empty"));
        }
        self.prune();
        {
            let map = lock(&self.map);
            if map.contains_key(&req.session_id) {
                let mut e = agent_err(Kind::AlreadyExists, OP, "a session with this id exists");
                e.exec_id = req.session_id.clone();
                return Err(e);
            }
            if map.len() as u64 >= self.limits.max_sessions {
                let mut e = agent_err(Kind::LimitExceeded, OP, "too many sessions");
                e.limit_name = namzu_proto::limits::MAX_SESSIONS.into();
                e.limit = self.limits.max_sessions;
                return Err(e);
            }
        }
        let io = |e: std::io::Error| agent_err(Kind::Io, OP, &e.to_string());
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()))?;
        let mut cmd = std::process::Command::new(OsStr::from_bytes(&req.command));
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
        let cap = Limits::usize(self.limits.session_ring_bytes).max(1);
        let session = Arc::new(Session {
            pid: child.id(),
            ring: Mutex::new(Ring {
                buf: VecDeque::new(),
                start: 0,
                cap,
            }),
            exit: Mutex::new(None),
        });
        lock(&self.map).insert(req.session_id.clone(), session.clone());
        let pumped = session.clone();
        let pump = tokio::spawn(async move { pump(r, &pumped).await });
        let waited = session.clone();
        tokio::spawn(async move {
            let status = exit_rx.await.unwrap_or(ExitInfo::Signal(9));
            // Late output first, so "exited" means every byte is in.
            let _ = tokio::time::timeout(Duration::from_millis(200), pump).await;
            *lock(&waited.exit) = Some((status, Instant::now()));
        });
        Ok(session.info(&req.session_id))
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
            Ok(n) => lock(&s.ring).push(&buf[..n]),
        }
    }
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
