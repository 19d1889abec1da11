//! The reaper: the one place that calls `waitpid`.
//!
//! The agent is a child subreaper (PID 1 in a pid namespace on the real
//! tiers), so every orphan of every command is re-parented to it and must be
//! reaped, or zombies pile up and a process group never looks empty. That
//! needs `waitpid(-1)`, which would steal exit statuses from any other waiter
//! in the process — so commands are not spawned with `tokio::process`; they
//! are spawned through [`Reaper::spawn`], which registers the pid for its exit
//! status while holding the same lock the reaping loop takes. A child can
//! therefore never be reaped before its waiter is registered.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    Code(i32),
    Signal(i32),
}

#[derive(Default)]
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<ExitInfo>>>,
}

impl Reaper {
    /// Makes this process a subreaper and starts the reaping task on the
    /// current tokio runtime.
    pub fn start() -> std::io::Result<Arc<Self>> {
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let me = Arc::new(Self::default());
        let mut sigchld = signal(SignalKind::child())?;
        let weak = Arc::downgrade(&me);
        tokio::spawn(async move {
            while sigchld.recv().await.is_some() {
                match weak.upgrade() {
                    Some(r) => r.reap_ready(),
                    None => break,
                }
            }
        });
        Ok(me)
    }

    /// Spawns `cmd` and returns the child with a receiver for its exit.
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<(Child, oneshot::Receiver<ExitInfo>)> {
        self.spawn_with(|| cmd.spawn().map(|c| (c.id(), c)))
    }

    /// Runs `start`, which starts one child and returns its pid with
    /// whatever handle it made, and registers the pid for its exit status
    /// under the lock the reaping loop takes.
    pub fn spawn_with<T>(
        &self,
        start: impl FnOnce() -> std::io::Result<(u32, T)>,
    ) -> std::io::Result<(T, oneshot::Receiver<ExitInfo>)> {
        let mut waiters = self.lock();
        // Nothing starts in a paused sandbox.
        let (pid, child) = crate::pause::gate(start)?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(i32::try_from(pid).unwrap_or(i32::MAX), tx);
        Ok((child, rx))
    }

    /// Reaps every child that has exited; statuses of registered children go
    /// to their waiters, orphans are simply released.
    fn reap_ready(&self) {
        let mut waiters = self.lock();
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    if let Some(tx) = waiters.remove(&pid.as_raw()) {
                        let _ = tx.send(ExitInfo::Code(code));
                    }
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    if let Some(tx) = waiters.remove(&pid.as_raw()) {
                        let _ = tx.send(ExitInfo::Signal(sig as i32));
                    }
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    break;
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitInfo>>> {
        // A poisoned map is still a valid map: the panicking holder only ever
        // inserted or removed whole entries.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Starts a child that reads its own `/proc/self/status` and exits, and
/// returns what it read. The child inherits exactly what a
/// command inherits (no_new_privs, capabilities, seccomp, landlock), so this
/// is the privilege probe's view from inside, without needing any binary in
/// the sandbox. The reaper collects the child like any orphan.
pub fn probe_child_status() -> std::io::Result<String> {
    probe_child().map(|(_, status)| status)
}

/// As [`probe_child_status`], and reaps the child itself: for a process
/// with no reaper running yet (the local sandbox's init before it serves,
/// which keeps the answer for Health).
pub fn probe_child_status_reaped() -> std::io::Result<String> {
    let (pid, status) = probe_child()?;
    let _ = waitpid(Pid::from_raw(pid), None);
    Ok(status)
}

/// What the probe child writes, in memory it shares with the parent.
struct ProbeOut {
    buf: [u8; 8192],
    len: usize,
}

/// The probe child's body: a command's own first step, then its status.
extern "C" fn probe_body(arg: *mut libc::c_void) -> libc::c_int {
    #[allow(unsafe_code)]
    // SAFETY: `arg` is the parent's `ProbeOut`, which outlives this child
    // (the parent is suspended until it exits: CLONE_VFORK); only raw
    // syscalls run here, on this child's own stack, and nothing allocates
    // or takes a lock.
    unsafe {
        let out = &mut *arg.cast::<ProbeOut>();
        // Should the identity switch fail, the caps it leaves show in the
        // status and the probe refuses.
        let _ = crate::identity::enter_command_identity();
        let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            loop {
                let k = libc::read(
                    fd,
                    out.buf.as_mut_ptr().add(out.len).cast(),
                    out.buf.len() - out.len - 32,
                );
                if k <= 0 {
                    break;
                }
                out.len += k as usize;
            }
            libc::close(fd);
        }
        // Some kernels (gVisor's) leave no_new_privs out of the status
        // file; the prctl answer is appended so it is checked anyway.
        let line: &[u8] = match libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) {
            1 => b"PrctlNoNewPrivs:\t1\n",
            0 => b"PrctlNoNewPrivs:\t0\n",
            _ => b"PrctlNoNewPrivs:\t?\n",
        };
        std::ptr::copy_nonoverlapping(line.as_ptr(), out.buf.as_mut_ptr().add(out.len), line.len());
        out.len += line.len();
    }
    0
}

/// Starts the probe child: a clone sharing this process's memory
/// (CLONE_VM | CLONE_VFORK, as posix_spawn does), so nothing is copied and
/// the caller resumes once it has exited; it is a task of its own with
/// its own copy of the credentials, so what it reports is what a command
/// starts with. Every signal stays blocked while it runs, so no handler
/// of this process ever runs on its stack. Its pid and what it wrote.
fn probe_child() -> std::io::Result<(i32, String)> {
    const STACK: usize = 64 << 10;
    let mut stack = vec![0u8; STACK];
    let mut out = Box::new(ProbeOut { buf: [0; 8192], len: 0 });
    #[allow(unsafe_code)]
    // SAFETY: the stack and `out` are allocations owned here that outlive
    // the child (CLONE_VFORK suspends this thread until it exits); the
    // stack pointer handed over is the top of `stack`, 16-byte aligned;
    // the signal masks are saved and restored around the clone.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = stack.as_mut_ptr().add(STACK);
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            probe_body,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of_mut!(*out).cast(),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        pid
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(stack);
    Ok((pid, String::from_utf8_lossy(&out.buf[..out.len]).into_owned()))
}
