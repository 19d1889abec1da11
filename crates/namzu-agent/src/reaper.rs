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
        let mut waiters = self.lock();
        let child = cmd.spawn()?;
        let (tx, rx) = oneshot::channel();
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        waiters.insert(pid, tx);
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

/// Forks a child that writes its own `/proc/self/status` to a pipe and
/// exits, and returns what it wrote. The child inherits exactly what a
/// command inherits (no_new_privs, capabilities, seccomp, landlock), so this
/// is the privilege probe's view from inside, without needing any binary in
/// the sandbox. The reaper collects the child like any orphan.
pub fn probe_child_status() -> std::io::Result<String> {
    use std::io::Read;
    let (mut r, w) = std::os::unix::net::UnixStream::pair()?;
    let path = c"/proc/self/status";
    #[allow(unsafe_code)]
    // SAFETY: after fork in this multi-threaded process the child runs only
    // async-signal-safe syscalls (open, read, write, _exit) on a stack
    // buffer and a static string; it allocates nothing and takes no lock.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        #[allow(unsafe_code)]
        // SAFETY: see above; all arguments are valid for the calls.
        unsafe {
            // A command's own first step; should it fail, the caps it
            // leaves show in the status and the probe refuses.
            let _ = crate::identity::enter_command_identity();
            let mut buf = [0u8; 8192];
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                let mut n = 0usize;
                loop {
                    let k = libc::read(fd, buf.as_mut_ptr().add(n).cast(), buf.len() - n);
                    if k <= 0 {
                        break;
                    }
                    n += k as usize;
                }
                use std::os::fd::AsRawFd;
                let _ = libc::write(w.as_raw_fd(), buf.as_ptr().cast(), n);
            }
            // Some kernels (gVisor's) leave no_new_privs out of the status
            // file; the prctl answer is appended so it is checked anyway.
            let line: &[u8] = match libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) {
                1 => b"PrctlNoNewPrivs:\t1\n",
                0 => b"PrctlNoNewPrivs:\t0\n",
                _ => b"PrctlNoNewPrivs:\t?\n",
            };
            use std::os::fd::AsRawFd;
            let _ = libc::write(w.as_raw_fd(), line.as_ptr().cast(), line.len());
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(w);
    let mut out = String::new();
    r.read_to_string(&mut out)?;
    Ok(out)
}
