//! One command in a `local` sandbox, with no agent serving: what `namzu
//! run` needs, and all it needs, when nothing may leave the sandbox.
//!
//! The caller's process is L (it must be single-threaded: it forks). C and
//! G are made exactly as for a served sandbox ([`super::child_c`]): the
//! same namespaces, id maps, cgroups, root filesystem and hardening. G then
//! reports [`Report::Ready`] with its start's marks and waits for L's go
//! (L checks G's `/proc/<pid>/status` first: what every command inherits),
//! starts the command with `posix_spawn` onto the stdio L handed over,
//! reaps until the command has exited, reports how it ended, and exits —
//! which ends everything left in its pid namespace.
//!
//! Nothing crosses the boundary but the command's stdio (pipes L made) and
//! the report channel (a `SOCK_SEQPACKET` pair: one message a packet): no
//! socket is bound, no token exists, nothing is listening inside.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use namzu_proto::launch::LaunchSpec;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{c_main, command_env, enter, etc, harden, io, map_ids, os, wait_exit, weaken, LaunchError, SandboxFds};
use crate::timeline::mark;

/// The command G starts.
#[derive(Debug, Clone, Default)]
pub struct Command {
    /// The program: a path, or a name looked up in the sandbox's PATH.
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Added to (or replacing) the environment every command gets.
    pub env: Vec<(OsString, OsString)>,
    /// The working directory: relative ones are beneath `/workspace`.
    pub cwd: Option<PathBuf>,
}

/// The command's stdin, stdout and stderr: the child's ends, which L's
/// copies are closed of once G has them.
pub struct Stdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// What G reports, in order: `Ready` (or `Failed`), then `Started` and
/// `Exited` (or `NotStarted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Built and hardened; the marks of G's start (stage, monotonic ns).
    Ready { marks: Vec<(String, u64)> },
    /// The command runs with this pid (G's namespace's).
    Started { pid: u32 },
    /// The command ended.
    Exited(crate::reaper::ExitInfo),
    /// The command could not be started: the errno of the lookup or exec.
    NotStarted { errno: i32 },
    /// G could not go on; why.
    Failed(String),
}

const READY: u8 = b'R';
const STARTED: u8 = b'S';
const EXITED: u8 = b'X';
const FAILED: u8 = b'E';
const NOT_STARTED: u8 = b'N';
const GO: u8 = b'G';

impl Report {
    fn encode(&self) -> Vec<u8> {
        match self {
            Report::Ready { marks } => {
                let mut b = vec![READY];
                for (stage, ns) in marks {
                    b.extend_from_slice(format!("{stage} {ns}\n").as_bytes());
                }
                b
            }
            Report::Started { pid } => [&[STARTED][..], &pid.to_le_bytes()].concat(),
            Report::Exited(how) => {
                let (kind, v) = match how {
                    crate::reaper::ExitInfo::Code(c) => (0u8, *c),
                    crate::reaper::ExitInfo::Signal(s) => (1u8, *s),
                };
                [&[EXITED, kind][..], &v.to_le_bytes()].concat()
            }
            Report::Failed(why) => [&[FAILED][..], why.as_bytes()].concat(),
            Report::NotStarted { errno } => [&[NOT_STARTED][..], &errno.to_le_bytes()].concat(),
        }
    }

    /// One packet back into a report; `None` for one L cannot read.
    pub fn decode(b: &[u8]) -> Option<Report> {
        let (&tag, rest) = b.split_first()?;
        match tag {
            READY => Some(Report::Ready {
                marks: String::from_utf8_lossy(rest)
                    .lines()
                    .filter_map(|l| {
                        let (stage, ns) = l.rsplit_once(' ')?;
                        Some((stage.to_owned(), ns.parse().ok()?))
                    })
                    .collect(),
            }),
            STARTED => Some(Report::Started {
                pid: u32::from_le_bytes(rest.get(..4)?.try_into().ok()?),
            }),
            EXITED => {
                let v = i32::from_le_bytes(rest.get(1..5)?.try_into().ok()?);
                Some(Report::Exited(match rest.first()? {
                    0 => crate::reaper::ExitInfo::Code(v),
                    _ => crate::reaper::ExitInfo::Signal(v),
                }))
            }
            FAILED => Some(Report::Failed(String::from_utf8_lossy(rest).into_owned())),
            NOT_STARTED => Some(Report::NotStarted {
                errno: i32::from_le_bytes(rest.get(..4)?.try_into().ok()?),
            }),
            _ => None,
        }
    }
}

fn seqpacket_pair() -> Result<(UnixStream, UnixStream), LaunchError> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let (a, b) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).map_err(|e| {
        LaunchError::Os {
            step: "report channel",
            source: e.into(),
        }
    })?;
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

/// A sandbox running (or about to run) one command, seen from L.
pub struct Once {
    /// C, L's child, holding the sandbox's namespaces: reaped by
    /// [`Once::reap`] (its exit tears the mount namespace down, which
    /// costs the kernel an expedited RCU grace period).
    c: Pid,
    /// G, the sandbox's init, as the host sees it.
    g: Pid,
    /// G by descriptor: readable once G is gone, and with it every process
    /// of its pid namespace (an init's exit waits for them).
    g_fd: Option<OwnedFd>,
    report: UnixStream,
    /// C's and G's stderr (non-blocking).
    errors: OwnedFd,
}

/// What is in the (non-blocking) pipe `r` now, as text, trimmed.
fn drain(r: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = rustix::io::read(r, &mut buf) {
        if n == 0 || out.len() > 64 << 10 {
            break;
        }
        out.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    String::from_utf8_lossy(&out).trim().to_owned()
}

/// A pidfd of `pid`, a child of `parent` (checked after opening, so a pid
/// reused since is never taken for it); `None` if it is already gone.
fn pidfd_of_child(pid: Pid, parent: Pid) -> Option<OwnedFd> {
    let raw = rustix::process::Pid::from_raw(pid.as_raw())?;
    let fd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid: i32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
    (ppid == parent.as_raw()).then_some(fd)
}

/// Builds the sandbox of `spec` around `command` (C forked from this
/// process, which must have no other thread: C runs arbitrary code after
/// the fork) and returns once G exists. `etc_cache` is where the shared
/// curated /etc lives (made here, with host credentials, as the launcher
/// does). G waits for [`Once::go`] before it starts the command.
pub fn start(spec: &LaunchSpec, command: Command, stdio: Stdio) -> Result<Once, LaunchError> {
    let etc = match (&spec.etc_cache, &spec.rootfs) {
        (Some(cache), None) if !weaken::in_spec(spec, "etc") => Some(
            etc::cached(Path::new(cache), &spec.hostname, crate::egress::RESOLV_CONF).map_err(io("the shared /etc"))?,
        ),
        _ => None,
    };
    mark("launch.etc-cached");
    let (to_l_r, to_l_w) = UnixStream::pair().map_err(io("pipe"))?;
    let (to_c_r, to_c_w) = UnixStream::pair().map_err(io("pipe"))?;
    let (report_l, report_g) = seqpacket_pair()?;
    // C's and G's stderr (what their logs say when setup fails): L reads
    // it only then, so nothing of the sandbox holds the caller's stdio
    // (whoever reads the caller's output would wait for the namespaces'
    // teardown to see its end).
    let (errors_r, errors_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK).map_err(|e| {
            LaunchError::Os {
                step: "pipe",
                source: e.into(),
            }
        })?;
    #[allow(unsafe_code)]
    // SAFETY: the caller promises a single-threaded process, so the child
    // may run arbitrary code after fork.
    let fork_c = unsafe { fork() }.map_err(os("fork"))?;
    match fork_c {
        ForkResult::Child => {
            drop((to_l_r, to_c_w, report_l, errors_r));
            // Nothing of the caller's reaches the sandbox but what it was
            // handed: every other descriptor (the caller's ends of these
            // pipes included, or the command would never see EOF) closes,
            // and its stdio is /dev/null and the errors pipe.
            use std::os::fd::AsRawFd;
            close_all_but(&[
                to_l_w.as_raw_fd(),
                to_c_r.as_raw_fd(),
                report_g.as_raw_fd(),
                stdio.stdin.as_raw_fd(),
                stdio.stdout.as_raw_fd(),
                stdio.stderr.as_raw_fd(),
                errors_w.as_raw_fd(),
            ]);
            stdio_onto([None, None, Some(errors_w.as_raw_fd())]);
            drop(errors_w);
            // The caller may block signals it takes by descriptor (a CLI's
            // Ctrl-C): the sandbox starts with none blocked.
            let _ = nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            );
            let run = move |fds: SandboxFds| init_once(spec, fds, command, stdio, report_g);
            c_main(spec, etc.as_deref(), to_l_w, to_c_r, run)
        }
        ForkResult::Parent { child } => {
            drop((to_l_w, to_c_r, report_g, stdio, command, errors_w));
            let g = match map_ids(spec, child, to_l_r, to_c_w) {
                Ok(Some(g)) => g,
                Ok(None) => {
                    let code = wait_exit(child);
                    return Err(LaunchError::Os {
                        step: "sandbox setup",
                        source: std::io::Error::other(format!(
                            "the namespace child exited with {code}: {}",
                            drain(&errors_r)
                        )),
                    });
                }
                Err(e) => {
                    let _ = kill(child, Signal::SIGKILL);
                    wait_exit(child);
                    return Err(e);
                }
            };
            Ok(Once {
                c: child,
                g,
                g_fd: pidfd_of_child(g, child),
                report: report_l,
                errors: errors_r,
            })
        }
    }
}

/// Makes `fds` this process's stdin, stdout and stderr (`None`: /dev/null).
pub fn stdio_onto(fds: [Option<std::os::fd::RawFd>; 3]) {
    let null = rustix::fs::open("/dev/null", rustix::fs::OFlags::RDWR, rustix::fs::Mode::empty()).ok();
    use std::os::fd::AsRawFd;
    let null = null.as_ref().map(|n| n.as_raw_fd());
    for (target, fd) in (0..).zip(fds) {
        if let Some(from) = fd.or(null) {
            let _ = nix::unistd::dup2(from, target);
        }
    }
}

/// Closes every descriptor from 3 up but `keep`: for a forked child that
/// must hold nothing of its parent's but what it was handed.
pub fn close_all_but(keep: &[std::os::fd::RawFd]) {
    let mut keep: Vec<u32> = keep.iter().filter_map(|&fd| u32::try_from(fd).ok()).collect();
    keep.sort_unstable();
    let mut from = 3u32;
    for fd in keep.into_iter().chain([u32::MAX]) {
        if fd > from {
            #[allow(unsafe_code)]
            // SAFETY: close_range(2) closes descriptors no Rust object of
            // this fresh child will use: everything it keeps is in `keep`,
            // and the rest were the parent's.
            unsafe {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32);
            }
        }
        from = from.max(fd.saturating_add(1));
    }
}

impl Once {
    /// G's pid as the host sees it: its `/proc` entry is what every
    /// command inherits (capabilities, no_new_privs, seccomp).
    pub fn init_pid(&self) -> Pid {
        self.g
    }

    /// The report channel, to wait on with poll.
    pub fn report_fd(&self) -> BorrowedFd<'_> {
        self.report.as_fd()
    }

    /// The next report; `None` once G is gone (it wrote no more).
    pub fn next_report(&mut self) -> Option<Report> {
        let mut buf = vec![0u8; 8192];
        let n = rustix::io::read(&self.report, &mut buf).ok()?;
        Report::decode(buf.get(..n)?)
    }

    /// What C and G logged (their setup's errors): for a start that
    /// failed.
    pub fn setup_log(&self) -> String {
        drain(&self.errors)
    }

    /// Lets G start the command.
    pub fn go(&mut self) -> std::io::Result<()> {
        rustix::io::write(&self.report, &[GO]).map(drop).map_err(Into::into)
    }

    /// Ends the sandbox: SIGKILL to G takes its whole pid namespace.
    pub fn kill(&self) {
        let _ = kill(self.g, Signal::SIGKILL);
    }

    /// Waits until nothing runs in the sandbox any more: G is gone, and an
    /// init's exit waits for every other process of its pid namespace.
    /// `false` where G could not be had by descriptor (gone before, or a
    /// kernel without pidfds): then only [`Once::reap`] tells.
    pub fn wait_gone(&self) -> bool {
        let Some(fd) = &self.g_fd else {
            return false;
        };
        loop {
            let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
            match rustix::event::poll(&mut fds, -1) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return r.is_ok(),
            }
        }
    }

    /// C by descriptor (C is this process's child and unreaped, so the pid
    /// is its): for a process that waits for the namespaces to go without
    /// being C's parent.
    pub fn holder_fd(&self) -> std::io::Result<OwnedFd> {
        let raw = rustix::process::Pid::from_raw(self.c.as_raw()).ok_or(std::io::ErrorKind::InvalidInput)?;
        rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).map_err(Into::into)
    }

    /// Waits for C, which exits once G (and with it every process of the
    /// sandbox) is gone and takes the namespaces with it; returns C's status.
    pub fn reap(self) -> i32 {
        wait_exit(self.c)
    }
}

/// G: builds the sandbox, reports, waits for the go, runs the command.
fn init_once(
    spec: &LaunchSpec,
    fds: SandboxFds,
    command: Command,
    stdio: Stdio,
    mut report: UnixStream,
) -> Result<i32, LaunchError> {
    let send = |r: &mut UnixStream, what: Report| rustix::io::write(&*r, &what.encode()).map(drop);
    let built = (|| {
        enter(spec, fds)?;
        // No proxy serves here: nothing may leave, and nothing pretends to
        // offer a way out.
        command_env(spec, false);
        harden::apply(spec)?;
        mark("launch.hardened");
        Ok::<_, LaunchError>(())
    })();
    if let Err(e) = built {
        let _ = send(&mut report, Report::Failed(e.to_string()));
        return Err(e);
    }
    let marks = crate::timeline::marks()
        .into_iter()
        .map(|(s, ns)| (s.to_owned(), ns))
        .collect();
    send(&mut report, Report::Ready { marks }).map_err(|e| LaunchError::Os {
        step: "report ready",
        source: e.into(),
    })?;
    let mut go = [0u8; 1];
    match rustix::io::read(&report, &mut go) {
        Ok(1) if go[0] == GO => {}
        // L refused the sandbox (or is gone): nothing runs.
        _ => return Ok(125),
    }
    let cwd = match &command.cwd {
        Some(c) => Path::new("/workspace").join(c),
        None => PathBuf::from("/workspace"),
    };
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in command.env {
        env.retain(|(have, _)| *have != k);
        env.push((k, v));
    }
    let spec = crate::spawn::SpawnSpec {
        program: &command.program,
        args: command.args.iter().map(|a| a.as_os_str()).collect(),
        env,
        cwd: &cwd,
        stdin_piped: true,
    };
    let pid = match crate::spawn::spawn_onto(&spec, [stdio.stdin.as_fd(), stdio.stdout.as_fd(), stdio.stderr.as_fd()]) {
        Ok(pid) => pid,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            let _ = send(&mut report, Report::NotStarted { errno });
            return Ok(127);
        }
    };
    // The command's ends are its own now: L sees EOF when it (and whatever
    // it started) let go of them.
    drop(stdio);
    let _ = send(&mut report, Report::Started { pid });
    let me = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(p, code)) if p == me => {
                let _ = send(&mut report, Report::Exited(crate::reaper::ExitInfo::Code(code)));
                return Ok(0);
            }
            Ok(WaitStatus::Signaled(p, sig, _)) if p == me => {
                let _ = send(&mut report, Report::Exited(crate::reaper::ExitInfo::Signal(sig as i32)));
                return Ok(0);
            }
            // An orphan of the command, reaped; or a stop.
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                let _ = send(&mut report, Report::Failed(format!("waiting for the command: {e}")));
                return Ok(125);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_their_encoding() {
        let all = [
            Report::Ready {
                marks: vec![("launch.unshared".into(), 12), ("rootfs.pivot".into(), 99)],
            },
            Report::Started { pid: 7 },
            Report::Exited(crate::reaper::ExitInfo::Code(3)),
            Report::Exited(crate::reaper::ExitInfo::Signal(9)),
            Report::Failed("no root".into()),
            Report::NotStarted { errno: 2 },
        ];
        for r in all {
            assert_eq!(Report::decode(&r.encode()), Some(r.clone()));
        }
        assert_eq!(Report::decode(b""), None);
        assert_eq!(Report::decode(b"Q"), None);
        assert_eq!(Report::decode(&[STARTED, 1]), None);
    }
}
