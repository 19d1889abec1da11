//! What an attempt is, how one runs, and how its result is printed.
//!
//! Every attempt is one operation with the arguments it would need to
//! SUCCEED where it is allowed, and the errnos that prove the boundary
//! stopped it. The same code runs twice: inside the sandbox, and on the host
//! as a positive control (`--control`), under the identity the attempt names
//! ([`Ctl`]). An attempt stopped inside for a reason other than the ones it
//! names, or whose control fails too, proves nothing: the host side reports
//! it inconclusive, never blocked.
//!
//! Each attempt runs in a child of its own (forked), so one that changes its
//! process (chroot, setns, a dropped privilege) cannot colour the next.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What the op did.
pub enum Res {
    /// The operation worked: what it got.
    Succeeded(String),
    /// A step failed with this errno.
    Errno(&'static str, i32),
    /// Performed, and what it looked for is not there (a zeroed address, a
    /// mount table without host mounts): the observation is the proof.
    Absent(String),
    /// Could not be performed as written (e.g. /proc unreadable): proves
    /// nothing either way.
    Broken(String),
}

/// Who runs the positive control on the host.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    /// uid/gid 65534, no capabilities, the host's namespaces: what a
    /// command would be without the boundary.
    User,
    /// Root with every capability, in private mount, UTS and IPC
    /// namespaces (mounts, hostnames and the like stay there): for what the
    /// boundary takes from a sandbox's root.
    Root,
    /// No safe control: the call would change the host's kernel (load a
    /// module, reboot, set the clock). Such attempts are kernel invariants
    /// or near it; they must fail and are not counted as evidence.
    None,
}

/// The coordinates of the targets, as given on the command line.
#[derive(Clone)]
pub struct Env {
    pub control: bool,
    pub secret: String,
    pub host_path: String,
    pub tcp_port: u16,
    /// A host address other than loopback, with a listener on `tcp_port`.
    pub host_ip: String,
    pub unix: String,
    pub abstract_name: String,
    pub host_pid: i32,
    pub marker: String,
    /// A file planted in the host's /etc that the curated copy leaves out.
    pub etc_canary: String,
    /// `len:fnv64` of the host's /etc/shadow (the control computes it).
    pub shadow_digest: String,
    /// The host's disk (a block device).
    pub disk: String,
    /// A directory that is read-only inside (a bind) and 0777 on the host,
    /// holding `file` (0666).
    pub ro_dir: String,
    /// Where the setuid copy is made (a directory the caller may write).
    pub scratch: String,
    /// The process that stands for the agent: 1 inside; a sibling of the
    /// attempt's identity in the control.
    pub agent_pid: i32,
    /// Where an agent's link listens (a pod's agent port inside; a
    /// plaintext agent the host planted in the control) …
    pub agent_link: String,
    /// … and the bind token it takes there (a pod's uid: no secret).
    pub agent_token: String,
}

pub type Op = fn(&Env) -> Res;

pub struct Attempt {
    pub name: &'static str,
    pub ctl: Ctl,
    /// The errnos that prove the boundary stopped it.
    pub proof: &'static [i32],
    pub op: Op,
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn ename(e: i32) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::E2BIG => "E2BIG",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ECONNRESET => "ECONNRESET",
        _ => "E?",
    }
}

/// `Errno(step, errno)` when `ret` is negative, else `ok(ret)`.
pub fn sys(step: &'static str, ret: libc::c_long, ok: impl FnOnce(libc::c_long) -> Res) -> Res {
    if ret < 0 {
        Res::Errno(step, errno())
    } else {
        ok(ret)
    }
}

/// An io::Error as `Errno`, or `Broken` when it carries none.
pub fn io(step: &'static str, e: &std::io::Error) -> Res {
    match e.raw_os_error() {
        Some(n) => Res::Errno(step, n),
        None => Res::Broken(format!("{step}: {e}")),
    }
}

fn line(name: &str, verdict: &str, detail: &str) -> String {
    format!("attempt\t{name}\t{verdict}\t{}", detail.replace(['\t', '\n'], " "))
}

/// Runs `a` in a child and prints its line:
/// `attempt<TAB>NAME<TAB>succeeded|blocked|unexpected|skipped<TAB>DETAIL`.
/// Inside, `blocked` means failed with one of the proof errnos (or the
/// target was absent); in the control, the verdict is the same words for
/// the same result, read by the host.
pub fn run(a: &Attempt, env: &Env) -> String {
    if env.control && a.ctl == Ctl::None {
        return line(a.name, "skipped", "no safe control on the host");
    }
    in_child(a, env)
}

/// The line for `res`, judged against the attempt's proof errnos.
fn judged(a: &Attempt, res: Res) -> String {
    let (verdict, detail) = match res {
        Res::Succeeded(what) => ("succeeded", what),
        Res::Errno(step, e) if a.proof.contains(&e) => ("blocked", format!("{} ({step})", ename(e))),
        Res::Errno(step, e) => ("unexpected", format!("{} {e} ({step})", ename(e))),
        Res::Absent(what) => ("blocked", what),
        Res::Broken(what) => ("unexpected", what),
    };
    line(a.name, verdict, &detail)
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills the two-int array we own.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2");
    // SAFETY: both fds were just opened and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// The child becomes the control's identity (when `env.control`), runs the
/// op, and sends back its finished line.
fn in_child(a: &Attempt, env: &Env) -> String {
    // The stand-in first: it must not hold the pipe's write end.
    let agent = if env.control {
        match spawn_stand_in(a.ctl) {
            Ok(pid) => pid,
            Err(e) => return judged(a, Res::Broken(format!("stand-in agent: {e}"))),
        }
    } else {
        env.agent_pid
    };
    let (r, w) = pipe();
    // SAFETY: this program is single-threaded when attempts run; the child
    // only runs the op and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        drop(r);
        let env = Env {
            agent_pid: agent,
            ..env.clone()
        };
        let res = match become_control(a.ctl, env.control) {
            Ok(()) => (a.op)(&env),
            Err(e) => Res::Broken(format!("become the control's identity: {e}")),
        };
        let text = judged(a, res);
        let mut f = std::fs::File::from(w);
        let _ = f.write_all(text.as_bytes());
        drop(f);
        // SAFETY: leave at once, without running the parent's atexit work.
        unsafe { libc::_exit(0) };
    }
    drop(w);
    let mut text = String::new();
    let _ = std::fs::File::from(r).read_to_string(&mut text);
    reap(pid, Duration::from_secs(20));
    if env.control && agent > 0 {
        // SAFETY: kill(2)/waitpid(2) of our own stand-in.
        unsafe {
            libc::kill(agent, libc::SIGKILL);
            libc::waitpid(agent, std::ptr::null_mut(), 0);
        }
    }
    if text.is_empty() {
        return judged(
            a,
            Res::Broken(format!("the attempt's process {pid} died without a result")),
        );
    }
    text
}

fn reap(pid: i32, limit: Duration) {
    let t0 = Instant::now();
    loop {
        // SAFETY: waitpid(2) of our own child.
        let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        if r != 0 || t0.elapsed() > limit {
            if r == 0 {
                // SAFETY: kill(2) of our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // SAFETY: as above.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// In the control, a process of the attempt's identity that stands for the
/// agent: a dumpable sibling that only waits (its environment carries a
/// marker an attempt can look for).
fn spawn_stand_in(ctl: Ctl) -> std::io::Result<i32> {
    // SAFETY: single-threaded; the child pauses until killed.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        if ctl == Ctl::User {
            let _ = drop_to_nobody();
        }
        loop {
            // SAFETY: pause(2) takes nothing.
            unsafe { libc::pause() };
        }
    }
    // Let it reach its identity before an attempt looks at it.
    std::thread::sleep(Duration::from_millis(20));
    Ok(pid)
}

fn drop_to_nobody() -> std::io::Result<()> {
    let nobody = 65534;
    // SAFETY: plain credential syscalls on integers.
    let r = unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(nobody, nobody, nobody) != 0
            || libc::setresuid(nobody, nobody, nobody) != 0
        {
            -1
        } else {
            0
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Dropping uid clears the capability sets; make sure the process stays
    // traceable like any ordinary command.
    // SAFETY: prctl(2) with integers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    Ok(())
}

fn become_control(ctl: Ctl, control: bool) -> std::io::Result<()> {
    if !control {
        return Ok(());
    }
    match ctl {
        Ctl::User => drop_to_nobody(),
        Ctl::Root => {
            // SAFETY: unshare(2)/mount(2) with integers and static strings.
            let ok = unsafe {
                libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC) == 0
                    && libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) == 0
            };
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        }
        Ctl::None => Ok(()),
    }
}

/// `len:fnv64` of a file's bytes: enough to tell the host's file from an
/// image's without passing the secret itself around.
pub fn digest(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{}:{h:016x}", bytes.len())
}
