//! Terminals: a command on a pseudo-terminal, driven over one call.
//!
//! The command leads a new session with the pty as its controlling
//! terminal. Output is read whether or not the host keeps up (bounded by
//! the call's flow control) and carries byte offsets. When the host closes
//! the terminal, or drops the call, every process still in the terminal's
//! kernel session is killed — found through /proc, so jobs the shell put in
//! the background with `&` (own process group, same session) go too.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use namzu_proto::v1::{self, agent_error::Kind, terminal_input, terminal_output, TerminalOutput};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::op_error::{agent_err, IntoStatus, OpError};
use crate::reaper::{ExitInfo, Reaper};

const OP: &str = "terminal";
/// After the leader exits, how long late output is still read.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// How long the session sweep keeps killing before it gives up.
const SWEEP_DEADLINE: Duration = Duration::from_secs(5);

/// Sessions of live terminals, swept when the agent shuts down.
static LIVE: std::sync::Mutex<std::collections::BTreeSet<i32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<i32>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kills every live terminal's session (agent shutdown).
pub async fn kill_all() {
    let sids: Vec<i32> = live().iter().copied().collect();
    for sid in sids {
        let _ = kill_session(sid, Signal::SIGKILL).await;
    }
}

pub(crate) fn out(m: terminal_output::Msg) -> Result<TerminalOutput, Status> {
    Ok(TerminalOutput { msg: Some(m) })
}

pub(crate) fn winsize(cols: u32, rows: u32) -> rustix::termios::Winsize {
    rustix::termios::Winsize {
        ws_row: u16::try_from(rows).unwrap_or(u16::MAX).max(1),
        ws_col: u16::try_from(cols).unwrap_or(u16::MAX).max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Pids whose session id is `sid`.
pub fn session_members(sid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp session ..."; comm may hold spaces.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, session) = (f.next(), f.nth(2));
        if state != Some("Z") && session.and_then(|s| s.parse::<i32>().ok()) == Some(sid) {
            out.push(pid);
        }
    }
    out
}

/// SIGKILLs every process of session `sid` until none is left (or the
/// deadline passes). Returns the pids still found at the end.
pub async fn kill_session(sid: i32, sig: Signal) -> Vec<i32> {
    let deadline = Instant::now() + SWEEP_DEADLINE;
    loop {
        let members = session_members(sid);
        if members.is_empty() || Instant::now() >= deadline {
            return members;
        }
        for pid in &members {
            let _ = kill(Pid::from_raw(*pid), sig);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn login_shell() -> (PathBuf, Vec<&'static str>) {
    for sh in ["/bin/bash", "/bin/sh"] {
        if Path::new(sh).exists() {
            return (sh.into(), vec!["-l"]);
        }
    }
    ("/bin/sh".into(), vec![])
}

fn io_err(e: impl std::fmt::Display) -> OpError {
    agent_err(Kind::Io, OP, &e.to_string())
}

/// Opens the pty and starts the command; returns (master, pid, exit).
pub(crate) fn start(
    reaper: &Reaper,
    default_cwd: &Path,
    open: &v1::TerminalOpen,
) -> Result<(OwnedFd, u32, tokio::sync::oneshot::Receiver<ExitInfo>), OpError> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).map_err(io_err)?;
    grantpt(&master).map_err(io_err)?;
    unlockpt(&master).map_err(io_err)?;
    let name = ptsname(&master, Vec::new()).map_err(io_err)?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(io_err)?;
    rustix::termios::tcsetwinsize(&master, winsize(open.cols, open.rows)).map_err(io_err)?;

    let mut cmd = if open.command.is_empty() {
        let (sh, args) = login_shell();
        let mut c = std::process::Command::new(sh);
        c.args(args);
        c
    } else {
        let mut c = std::process::Command::new(OsStr::from_bytes(&open.command));
        c.args(open.args.iter().map(|a| OsStr::from_bytes(a)));
        c
    };
    crate::identity::prepare(&mut cmd);
    cmd.current_dir(if open.cwd.is_empty() {
        default_cwd.to_path_buf()
    } else {
        default_cwd.join(OsStr::from_bytes(&open.cwd))
    });
    cmd.env("TERM", "xterm-256color");
    for kv in &open.env {
        if kv.key.is_empty() || kv.key.contains(&b'=') || kv.key.contains(&0) || kv.value.contains(&0) {
            return Err(agent_err(Kind::InvalidArgument, OP, "invalid environment variable"));
        }
        cmd.env(OsStr::from_bytes(&kv.key), OsStr::from_bytes(&kv.value));
    }
    let clone = |fd: &OwnedFd| fd.try_clone().map(std::process::Stdio::from).map_err(io_err);
    cmd.stdin(clone(&slave)?).stdout(clone(&slave)?).stderr(clone(&slave)?);
    #[allow(unsafe_code)]
    // SAFETY: only async-signal-safe syscalls run between fork and exec:
    // setsid, and an ioctl making stdin (the pty slave) the controlling
    // terminal of the new session.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (child, exit) = reaper.spawn(&mut cmd).map_err(|e| {
        let mut err = agent_err(
            Kind::SpawnFailed,
            OP,
            &format!("cannot start the terminal's command: {e}"),
        );
        err.errno = e.raw_os_error().unwrap_or(0);
        err.path = open.command.clone();
        err
    })?;
    drop((cmd, slave));
    Ok((master, child.id(), exit))
}

/// Runs one terminal call to its end.
pub async fn run(
    reaper: Arc<Reaper>,
    heartbeat: Option<Duration>,
    default_cwd: PathBuf,
    open: v1::TerminalOpen,
    mut input: Streaming<v1::TerminalInput>,
    tx: mpsc::Sender<Result<TerminalOutput, Status>>,
) {
    let (master, pid, mut exit_rx) = match start(&reaper, &default_cwd, &open) {
        Ok(x) => x,
        Err(e) => {
            let _ = tx.send(Err(e.into_status())).await;
            return;
        }
    };
    let sid = i32::try_from(pid).unwrap_or(i32::MAX);
    live().insert(sid);
    let _ = tx
        .send(out(terminal_output::Msg::Opened(v1::Started {
            pid,
            execution_id: String::new(),
            attached: false,
            boot_id: crate::boot_id().to_owned(),
        })))
        .await;
    if rustix::io::ioctl_fionbio(&master, true).is_err() {
        let _ = kill_session(sid, Signal::SIGKILL).await;
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: an OwnedFd always returns the same, open descriptor from
    // as_raw_fd, and the AsyncFd owns it until it is dropped.
    let registered = unsafe { AsyncFd::register(master) };
    let Ok(master) = registered else {
        let _ = kill_session(sid, Signal::SIGKILL).await;
        return;
    };
    let master = Arc::new(master);

    // Output pump: reads until the last slave holder is gone (EIO).
    let reader = {
        let master = master.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut offset = 0u64;
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let Ok(mut guard) = master.readable().await else { break };
                match guard.try_io(|fd| rustix::io::read(fd.get_ref().as_fd(), &mut buf).map_err(std::io::Error::from))
                {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => {
                        let chunk = v1::OutputChunk {
                            offset,
                            data: bytes::Bytes::copy_from_slice(&buf[..n]),
                            log_offset: 0,
                        };
                        offset += n as u64;
                        if tx.send(out(terminal_output::Msg::Data(chunk))).await.is_err() {
                            break;
                        }
                    }
                    Err(_would_block) => continue,
                }
            }
        })
    };

    let beats = heartbeat.map(|every| spawn_heartbeats(tx.clone(), every));
    let silence = if open.host_heartbeats {
        heartbeat.map(|d| d * 3)
    } else {
        None
    };
    let mut exit = None;
    loop {
        tokio::select! {
            status = &mut exit_rx => { exit = status.ok(); break; }
            msg = next_input(&mut input, silence) => match msg {
                Some(Ok(v1::TerminalInput { msg: Some(terminal_input::Msg::Heartbeat(_)) })) => {}
                Some(Ok(v1::TerminalInput { msg: Some(terminal_input::Msg::Input(data)) })) => {
                    if write_all(&master, &data).await.is_err() {
                        break;
                    }
                }
                Some(Ok(v1::TerminalInput { msg: Some(terminal_input::Msg::Resize(sz)) })) => {
                    let _ = rustix::termios::tcsetwinsize(master.get_ref(), winsize(sz.cols, sz.rows));
                }
                // close, a protocol slip, or the host going away: close.
                _ => break,
            },
            _ = tx.closed() => break,
        }
    }
    if let Some(b) = beats {
        b.abort();
    }
    // Whatever ended the loop, nothing of this terminal's session survives it.
    let left = kill_session(sid, Signal::SIGKILL).await;
    live().remove(&sid);
    if !left.is_empty() {
        tracing::warn!(sid, ?left, "terminal session members survived the sweep");
    }
    if exit.is_none() {
        exit = tokio::time::timeout(Duration::from_secs(5), exit_rx)
            .await
            .ok()
            .and_then(Result::ok);
    }
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, reader).await;
    let (code, signal) = match exit {
        Some(ExitInfo::Code(c)) => (Some(c), None),
        Some(ExitInfo::Signal(s)) => (None, Some(s)),
        None => (None, None),
    };
    let _ = tx
        .send(out(terminal_output::Msg::Exit(v1::ExecExit {
            code,
            signal,
            ..Default::default()
        })))
        .await;
}

/// The next input message; `None` (as if the call ended) after `silence`
/// without one.
pub(crate) async fn next_input(
    input: &mut Streaming<v1::TerminalInput>,
    silence: Option<Duration>,
) -> Option<Result<v1::TerminalInput, Status>> {
    match silence {
        Some(d) => tokio::time::timeout(d, input.next()).await.ok().flatten(),
        None => input.next().await,
    }
}

/// Sends a heartbeat every `every` until the call's receiver is gone.
pub(crate) fn spawn_heartbeats(
    tx: mpsc::Sender<Result<TerminalOutput, Status>>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    crate::heartbeat::spawn(tx, every, || out(terminal_output::Msg::Heartbeat(v1::Empty {})))
}

pub(crate) async fn write_all(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        match guard.try_io(|fd| rustix::io::write(fd.get_ref().as_fd(), data).map_err(std::io::Error::from)) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}
