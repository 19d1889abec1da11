//! One command in a `local` sandbox made for it and gone with it, with no
//! agent: `LocalProvider::run_once`, what `namzu run` uses when nothing
//! may leave the sandbox.
//!
//! The sandbox is the local tier's in every respect a command can see: the
//! same namespaces, id range, root filesystem, cgroups, rlimits,
//! no_new_privs, empty capability sets, landlock and seccomp (built by the
//! same code, `namzu_agent::sandbox`), and the same privilege check before
//! the command starts: the sandbox's init's `/proc/<pid>/status`, which is
//! what every command inherits, must show no capability, no_new_privs and
//! a seccomp filter, or the command never runs. What it lacks is what a
//! handle needs: no agent serves, so nothing listens inside (no egress
//! proxy or resolver: the policy is `NoNetwork`, and anything else is
//! refused by name), and the command's output goes straight to the
//! caller's writers instead of over a link.
//!
//! The sandbox's directory (`<state>/local/<id>`, its workspace) holds a
//! `once.lock` flocked for the run: `gc` removes a directory whose lock it
//! can take (its process died mid-run) with its id range.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use namzu_agent::sandbox::once::{self, Report};

use crate::error::{Error, Result};

/// The file a run holds locked in its sandbox directory.
pub(crate) const ONCE_LOCK: &str = "once.lock";

/// What `LocalProvider::run_once` runs.
#[derive(Debug, Clone, Default)]
pub struct OnceRequest {
    /// The program and its arguments; the program is looked up in the
    /// sandbox's `PATH` unless it holds a `/`.
    pub command: Vec<OsString>,
    /// Added to the environment every command of the tier gets.
    pub env: Vec<(String, String)>,
    /// The working directory; a relative one is beneath `/workspace`.
    pub cwd: Option<PathBuf>,
    /// Killed (everything in the sandbox) after this long.
    pub timeout: Option<Duration>,
    /// When the sandbox's directory, id range and cgroups are removed.
    pub cleanup: OnceCleanup,
}

/// When `LocalProvider::run_once` removes what the sandbox leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnceCleanup {
    /// Before it returns: once the sandbox's namespaces are gone (their
    /// holder reaped), the directory, id range and cgroups are removed.
    #[default]
    Wait,
    /// For a caller about to exit (the CLI): it returns as soon as the
    /// output is delivered and nothing of the sandbox runs any more, and a
    /// process forked for it removes the rest once the namespaces are gone
    /// (the kernel takes about a millisecond to tear a mount namespace
    /// down). The namespaces' holder, this process's child, is left for
    /// the caller's exit to hand to init, so a caller that goes on running
    /// keeps a zombie per call.
    Detached,
}

/// Where the command's input comes from and its output goes.
pub struct OnceIo<'a> {
    /// Copied to the command's stdin until it ends; `None`: `/dev/null`.
    pub stdin: Option<OwnedFd>,
    /// Gets the command's stdout as it comes.
    pub stdout: &'a mut dyn Write,
    /// Gets the command's stderr as it comes.
    pub stderr: &'a mut dyn Write,
    /// Readable means cancel: the sandbox is killed (a signalfd of SIGINT,
    /// a pipe).
    pub cancel: Option<BorrowedFd<'a>>,
}

/// How the command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnceOutcome {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it (SIGKILL after a timeout or a cancel).
    pub signal: Option<i32>,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Killed because `cancel` turned readable.
    pub cancelled: bool,
}

/// A one-command sandbox's share of the host, removed however the run
/// ends: its directory (which it holds locked), id range and cgroups.
pub(super) struct Leftovers {
    pub id: String,
    pub dir: PathBuf,
    /// Held (and dropped) for its flock.
    pub _lock: std::fs::File,
    /// Whether dropping removes them (not in a process that left that to
    /// another).
    pub armed: bool,
    /// The id range claimed, in the table it was claimed in.
    pub slot: Option<(crate::backend::uid_slots::UidSlots, u32)>,
    pub cgroups: Option<crate::backend::cgroup::Cgroups>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if self.armed {
            self.remove();
        }
    }
}

impl Leftovers {
    fn remove(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "could not remove a one-command sandbox's directory: {e}");
        }
        if let Some((slots, slot)) = self.slot.take() {
            slots.release(slot, &self.id);
        }
        if let Some(cg) = &self.cgroups {
            cg.remove();
        }
        crate::timeline::mark("destroy.end");
    }
}

/// This process's thread count (field 20 of /proc/self/stat).
pub(super) fn threads() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(17)?.parse().ok()
}

/// Runs `req` in the sandbox `launch` describes and removes `leftovers`
/// as `req.cleanup` says.
pub(super) fn execute(
    launch: &namzu_proto::launch::LaunchSpec,
    mut leftovers: Leftovers,
    req: OnceRequest,
    io: OnceIo<'_>,
) -> Result<OnceOutcome> {
    let id = leftovers.id.clone();
    let (outcome, sb) = run(&id, launch, req, io, &mut leftovers)?;
    if let Some(sb) = sb {
        if leftovers.armed {
            // Ours to remove, once the namespaces are gone with their holder.
            sb.reap();
        }
        // Else a forked process does both; the holder is left unreaped
        // for this (exiting) process's end to hand to init.
    }
    drop(leftovers);
    outcome
}

impl Leftovers {
    /// Leaves the removal to a process forked now, which waits until the
    /// namespaces' holder (`holder`, a pidfd) is gone: the sandbox runs
    /// meanwhile, so the fork costs the run nothing it waits on. This
    /// process has one thread (run_once's precondition), so the child may
    /// run ordinary code; it holds nothing of this process's but the
    /// pidfd and the run's lock (a shared open file: `gc` keeps off until
    /// it is done), and /dev/null as its stdio, so no reader of this
    /// process's output waits for it.
    fn detach(&mut self, holder: OwnedFd) {
        use std::os::fd::AsRawFd;
        #[allow(unsafe_code)]
        // SAFETY: single-threaded (checked at the start of run_once, and no
        // thread was started since): the child may run arbitrary code.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                once::close_all_but(&[holder.as_raw_fd(), self._lock.as_raw_fd()]);
                once::stdio_onto([None, None, None]);
                // Out of the caller's session: a Ctrl-C aimed at it is not ours.
                let _ = nix::unistd::setsid();
                wait_readable(&holder);
                self.remove();
                #[allow(unsafe_code)]
                // SAFETY: _exit ends this forked child without running the
                // parent's exit handlers or flushing its buffered output twice.
                unsafe {
                    libc::_exit(0)
                };
            }
            // The child removes them; this process only lets go.
            Ok(nix::unistd::ForkResult::Parent { .. }) => self.armed = false,
            // No process to leave them to: removed here, after the reap.
            Err(e) => tracing::warn!("could not fork the cleanup of a one-command sandbox: {e}"),
        }
    }
}

/// Waits until `fd` is readable (a pidfd: its process is gone).
fn wait_readable(fd: &OwnedFd) {
    loop {
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, -1) {
            Err(rustix::io::Errno::INTR) => continue,
            _ => break,
        }
    }
}

/// Creates and flocks `dir/once.lock` for the run's life.
pub(super) fn hold_lock(dir: &Path) -> Result<std::fs::File> {
    let io = |source| Error::LocalIo {
        op: "run_once".into(),
        source,
    };
    let f = std::fs::File::create(dir.join(ONCE_LOCK)).map_err(io)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| io(e.into()))?;
    Ok(f)
}

/// Removes the directories (and id ranges) of one-command sandboxes whose
/// process died mid-run: a directory with the lock file that nobody holds.
/// Their processes died with that process (each sandbox process dies with
/// its parent). Returns their ids.
pub(super) fn gc_abandoned(root: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    for ent in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let dir = ent.path();
        let Ok(f) = std::fs::File::open(dir.join(ONCE_LOCK)) else {
            continue;
        };
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        let id = ent.file_name().to_string_lossy().into_owned();
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), "could not remove an abandoned one-command sandbox: {e}");
            continue;
        }
        removed.push(id);
    }
    removed
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| Error::LocalIo {
        op: "run_once".into(),
        source: e.into(),
    })
}

fn start_error(id: &str, reason: impl std::fmt::Display) -> Error {
    Error::AgentStart {
        id: id.into(),
        reason: reason.to_string(),
    }
}

/// Starts the sandbox, checks it, runs the command and copies its output;
/// returns how it ended with the sandbox, of which nothing runs any more
/// (`None` where the sandbox never started). Only the start's failures are
/// the outer error.
fn run(
    id: &str,
    launch: &namzu_proto::launch::LaunchSpec,
    req: OnceRequest,
    io: OnceIo<'_>,
    leftovers: &mut Leftovers,
) -> Result<(Result<OnceOutcome>, Option<once::Once>)> {
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (in_r, in_w) = match io.stdin.is_some() {
        true => {
            let (r, w) = pipe()?;
            // Ours only (a pipe's ends are two open files): the copy never
            // blocks on a command that does not read.
            rustix::fs::fcntl_setfl(&w, rustix::fs::OFlags::NONBLOCK).map_err(|e| Error::LocalIo {
                op: "run_once".into(),
                source: e.into(),
            })?;
            (r, Some(w))
        }
        false => {
            let null = rustix::fs::open(
                "/dev/null",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Error::LocalIo {
                op: "run_once".into(),
                source: e.into(),
            })?;
            (null, None)
        }
    };
    let mut args = req.command.into_iter();
    let command = once::Command {
        program: args.next().unwrap_or_default(),
        args: args.collect(),
        env: req.env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        cwd: req.cwd,
    };
    let program = PathBuf::from(&command.program);
    let stdio = once::Stdio {
        stdin: in_r,
        stdout: out_w,
        stderr: err_w,
    };
    let mut sb = once::start(launch, command, stdio).map_err(|e| start_error(id, e))?;
    crate::timeline::mark("create.launcher-spawned");
    if req.cleanup == OnceCleanup::Detached {
        if let Ok(holder) = sb.holder_fd() {
            leftovers.detach(holder);
        }
    }
    let deadline = req.timeout.map(|t| Instant::now() + t);
    // Ready, checked, go: the command starts only in a sandbox whose init
    // (and so every command) holds no privilege.
    let checked = check_and_go(id, &mut sb);
    let outcome = match checked {
        Err(e) => Err(e),
        Ok(()) => {
            let stdin = io.stdin.zip(in_w);
            pump(
                &mut sb,
                [out_r, err_r],
                stdin,
                io.stdout,
                io.stderr,
                io.cancel,
                deadline,
            )
        }
    };
    sb.kill();
    if !sb.wait_gone() {
        // No descriptor of the init: only its holder's end tells.
        sb.reap();
        crate::timeline::mark("destroy.anchor-exited");
        return Ok((outcome.and_then(|(exit, o)| ended(exit, o, program)), None));
    }
    crate::timeline::mark("destroy.anchor-exited");
    Ok((outcome.and_then(|(exit, o)| ended(exit, o, program)), Some(sb)))
}

/// Waits for G's `Ready`, checks what every command will inherit, and
/// lets G start the command.
fn check_and_go(id: &str, sb: &mut once::Once) -> Result<()> {
    match sb.next_report() {
        Some(Report::Ready { marks }) => crate::timeline::replay(&marks),
        Some(Report::Failed(why)) => return Err(start_error(id, why)),
        other => {
            return Err(start_error(
                id,
                format!("the sandbox's init ended early ({other:?}): {}", sb.setup_log()),
            ))
        }
    }
    let status = read_status(sb.init_pid().as_raw()).map_err(|e| Error::LocalIo {
        op: "run_once".into(),
        source: e,
    })?;
    crate::check::unprivileged(&status).map_err(|(field, value)| Error::PrivilegeProbe {
        id: id.into(),
        field,
        value,
    })?;
    crate::timeline::mark("create.privilege-probe");
    sb.go().map_err(|e| start_error(id, format!("go: {e}")))
}

/// `/proc/<pid>/status`, in one read where it fits 4 KiB (it does).
fn read_status(pid: i32) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(format!("/proc/{pid}/status"))?;
    let mut buf = Vec::with_capacity(4096);
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The outcome from G's last word.
fn ended(exit: Option<Report>, mut outcome: OnceOutcome, program: PathBuf) -> Result<OnceOutcome> {
    match exit {
        Some(Report::Exited(namzu_agent::reaper::ExitInfo::Code(c))) => outcome.code = Some(c),
        Some(Report::Exited(namzu_agent::reaper::ExitInfo::Signal(s))) => outcome.signal = Some(s),
        Some(Report::NotStarted { errno }) => {
            return Err(Error::SpawnFailed {
                command: program,
                errno,
                message: nix::errno::Errno::from_raw(errno).desc().to_owned(),
            })
        }
        Some(Report::Failed(why)) => {
            return Err(Error::AgentStart {
                id: String::new(),
                reason: why,
            })
        }
        // Killed by us (timeout, cancel) before it could say.
        _ => outcome.signal = Some(libc::SIGKILL),
    }
    if (outcome.timed_out || outcome.cancelled) && outcome.code.is_none() {
        outcome.signal = Some(libc::SIGKILL);
    }
    Ok(outcome)
}

/// Copies the command's stdout and stderr until both end and G has said
/// how the command ended (or is gone), killing the sandbox at `deadline`
/// or when `cancel` turns readable. Returns G's last word.
fn pump(
    sb: &mut once::Once,
    pipes: [OwnedFd; 2],
    stdin: Option<(OwnedFd, OwnedFd)>,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    cancel: Option<BorrowedFd<'_>>,
    mut deadline: Option<Instant>,
) -> Result<(Option<Report>, OnceOutcome)> {
    use rustix::event::{poll, PollFd, PollFlags};
    let io_err = |source: std::io::Error| Error::LocalIo {
        op: "run_once".into(),
        source,
    };
    let mut open = [Some(pipes[0].as_fd()), Some(pipes[1].as_fd())];
    // The caller's stdin (src) copied into the command's (dst): `pending`
    // is what was read and not yet taken by the pipe.
    let mut stdin = stdin;
    let mut pending: Vec<u8> = Vec::new();
    let mut src_done = false;
    let mut report_open = true;
    let mut last: Option<Report> = None;
    let mut outcome = OnceOutcome::default();
    let mut buf = vec![0u8; 64 << 10];
    // G's last word (Exited, NotStarted, Failed) ends what it can say;
    // its socket's end does too.
    while open.iter().any(Option::is_some) || (report_open && last.is_none()) {
        let report_fd = sb.report_fd();
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(4);
        let mut which = Vec::with_capacity(4);
        for (i, fd) in open.iter().enumerate() {
            if let Some(fd) = fd {
                fds.push(PollFd::new(fd, PollFlags::IN));
                which.push(i);
            }
        }
        if report_open && last.is_none() {
            fds.push(PollFd::new(&report_fd, PollFlags::IN));
            which.push(2);
        }
        if let Some(c) = cancel.as_ref().filter(|_| !outcome.cancelled) {
            fds.push(PollFd::new(c, PollFlags::IN));
            which.push(3);
        }
        if let Some((src, dst)) = &stdin {
            if pending.is_empty() && !src_done {
                fds.push(PollFd::new(src, PollFlags::IN));
                which.push(4);
            } else {
                fds.push(PollFd::new(dst, PollFlags::OUT));
                which.push(5);
            }
        }
        let wait_ms = match deadline {
            Some(d) => i32::try_from(d.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(i32::MAX),
            None => -1,
        };
        match poll(&mut fds, wait_ms) {
            Ok(0) => {
                outcome.timed_out = true;
                sb.kill();
                // What is still buffered in the pipes is read on; the
                // kill makes every writer go.
                deadline = None;
                continue;
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io_err(e.into())),
        }
        let ready: Vec<(usize, bool)> = fds
            .iter()
            .zip(&which)
            .map(|(f, &w)| (w, !f.revents().is_empty()))
            .filter(|(_, r)| *r)
            .collect();
        drop(fds);
        for (w, _) in ready {
            match w {
                0 | 1 => {
                    let Some(fd) = open[w] else { continue };
                    match rustix::io::read(fd, &mut buf) {
                        Ok(0) => open[w] = None,
                        Ok(n) => {
                            let out: &mut dyn Write = if w == 0 { &mut *stdout } else { &mut *stderr };
                            let data = buf.get(..n).unwrap_or_default();
                            if let Err(e) = out.write_all(data).and_then(|()| out.flush()) {
                                sb.kill();
                                return Err(io_err(e));
                            }
                        }
                        Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                        Err(e) => return Err(io_err(e.into())),
                    }
                }
                2 => match sb.next_report() {
                    Some(Report::Started { .. }) => {}
                    Some(r) => last = Some(r),
                    None => report_open = false,
                },
                3 => {
                    outcome.cancelled = true;
                    sb.kill();
                }
                4 => {
                    let Some((src, _)) = &stdin else { continue };
                    match rustix::io::read(src, &mut buf) {
                        Ok(0) | Err(_) => src_done = true,
                        Ok(n) => pending.extend_from_slice(buf.get(..n).unwrap_or_default()),
                    }
                }
                _ => {
                    let Some((_, dst)) = &stdin else { continue };
                    match rustix::io::write(dst, &pending) {
                        Ok(n) => {
                            pending.drain(..n);
                        }
                        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                        // The command closed its stdin: the rest is dropped.
                        Err(_) => {
                            pending.clear();
                            src_done = true;
                        }
                    }
                }
            }
        }
        if src_done && pending.is_empty() {
            // EOF for the command.
            stdin = None;
        }
    }
    Ok((last, outcome))
}
