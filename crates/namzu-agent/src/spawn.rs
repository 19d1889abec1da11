//! Starting a command with `posix_spawn(3)`: glibc runs it as a vfork
//! (`clone(CLONE_VM | CLONE_VFORK)` on a stack of its own), so nothing of
//! the agent's address space is copied and no copy-on-write fault follows
//! in the agent. `std::process::Command` falls back to `fork` for any
//! command with a working directory in a static binary (it looks up
//! `posix_spawn_file_actions_addchdir_np` dynamically), or with a pre-exec
//! hook; the agent spawns every command of a sandbox without a command user
//! of its own here instead.
//!
//! What the command gets is what the `fork` path gave it: its own session
//! and process group (`POSIX_SPAWN_SETSID`), every signal at its default
//! disposition and none blocked (the agent ignores SIGPIPE; ignored
//! signals would survive the exec), stdin from a pipe or `/dev/null`,
//! stdout and stderr to pipes, the working directory, and exactly the
//! environment given. The program is looked up in that environment's
//! `PATH` as `execvp` would.
//!
//! [`start_command`] starts an execution's command through the reaper:
//! this way, or — where commands run as a user of their own, entered by a
//! pre-exec hook (a container's) — with `std::process::Command`.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use namzu_proto::v1::{agent_error::Kind, ExecStart};

use crate::op_error::{agent_err, OpError};
use crate::reaper::{ExitInfo, Reaper};

/// What to start.
pub struct SpawnSpec<'a> {
    /// The program: a path (with a `/`), or a name looked up in `PATH`.
    pub program: &'a OsStr,
    /// Its arguments, after `argv[0]` (which is `program`).
    pub args: Vec<&'a OsStr>,
    /// The whole environment.
    pub env: Vec<(OsString, OsString)>,
    /// The working directory.
    pub cwd: &'a Path,
    /// A pipe for stdin; else `/dev/null`.
    pub stdin_piped: bool,
}

/// A started command: its pid and the agent's ends of its pipes.
pub struct Spawned {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

fn cstring(s: &OsStr) -> std::io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte"))
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)
}

/// `program` found as `execvp` would: used as given when it holds a `/`,
/// else the first executable regular file of that name in `path`'s
/// directories (an empty entry is the working directory, which the
/// relative result is then resolved against after the chdir).
pub fn resolve(program: &OsStr, path: Option<&OsStr>) -> std::io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    if program.is_empty() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let path = path.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    let mut denied = false;
    for dir in path.as_bytes().split(|&b| b == b':') {
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(dir))
        };
        let candidate = dir.join(program);
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() => {
                if rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok() {
                    return Ok(candidate);
                }
                denied = true;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
            Err(_) => {}
        }
    }
    Err(if denied {
        std::io::ErrorKind::PermissionDenied.into()
    } else {
        std::io::ErrorKind::NotFound.into()
    })
}

/// Starts `spec`. The error is the one the exec (or the lookup, or a file
/// action such as the chdir) failed with.
pub fn spawn(spec: &SpawnSpec<'_>) -> std::io::Result<Spawned> {
    let (stdin_pipe, stdin_ours) = if spec.stdin_piped {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let stdin_child = match &stdin_pipe {
        Some(r) => r.as_fd(),
        None => dev_null()?,
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let pid = spawn_onto(spec, [stdin_child, out_w.as_fd(), err_w.as_fd()])?;
    drop((stdin_pipe, out_w, err_w));
    Ok(Spawned {
        pid,
        stdin: stdin_ours,
        stdout: out_r,
        stderr: err_r,
    })
}

/// `/dev/null` for reading, opened at the first command that needs it and
/// kept (close-on-exec): every command without stdin gets a copy, which
/// spares each one an open and a close. The copies share one open file,
/// whose only state a command can change is its status flags, and no flag
/// changes what reading `/dev/null` gives.
fn dev_null() -> std::io::Result<BorrowedFd<'static>> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd.as_fd());
    }
    let fd = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    // A racing opener's descriptor is dropped; either is the same file.
    Ok(NULL.get_or_init(|| fd).as_fd())
}

/// Starts `spec` with `stdio` as its stdin, stdout and stderr (the caller
/// keeps its own descriptors, which stay close-on-exec); returns the pid.
pub fn spawn_onto(spec: &SpawnSpec<'_>, stdio: [BorrowedFd<'_>; 3]) -> std::io::Result<u32> {
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_os_str());
    let exe = cstring(resolve(spec.program, path_var)?.as_os_str())?;
    let mut argv_owned = vec![cstring(spec.program)?];
    for a in &spec.args {
        argv_owned.push(cstring(a)?);
    }
    let envp_owned = spec
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte"))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let cwd = cstring(spec.cwd.as_os_str())?;
    let mut argv: Vec<*mut libc::c_char> = argv_owned.iter().map(|c| c.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = envp_owned.iter().map(|c| c.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    let mut pid: libc::pid_t = 0;
    #[allow(unsafe_code)]
    // SAFETY: every pointer handed to the posix_spawn calls points into a
    // CString, a Vec or a local attribute/action object that outlives them;
    // argv and envp are NULL-terminated; the attribute and action objects
    // are initialised before use and destroyed once. glibc's sigset_t is
    // an array of unsigned longs (128 bytes), so its first 8 bytes are a
    // u64 holding signals 1 to 64.
    let rc = unsafe {
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        let mut acts: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        libc::posix_spawnattr_init(&mut attr);
        libc::posix_spawn_file_actions_init(&mut acts);
        let mut rc = 0;
        let mut step = |r: libc::c_int| {
            if rc == 0 {
                rc = r;
            }
        };
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // glibc's sigfillset leaves out its own two signals (32 and 33),
        // and its posix_spawn then sets them to SIG_IGN in the child,
        // which the exec keeps: set their bits by hand so they are reset
        // to SIG_DFL as well. Signal n is bit n - 1 of the first word.
        *std::ptr::addr_of_mut!(all).cast::<u64>() |= (1 << 31) | (1 << 32);
        step(libc::posix_spawnattr_setsigmask(&mut attr, &none));
        step(libc::posix_spawnattr_setsigdefault(&mut attr, &all));
        let flags = libc::POSIX_SPAWN_SETSID
            | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short
            | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
        step(libc::posix_spawnattr_setflags(&mut attr, flags));
        step(libc::posix_spawn_file_actions_adddup2(
            &mut acts,
            stdio[0].as_raw_fd(),
            0,
        ));
        step(libc::posix_spawn_file_actions_adddup2(
            &mut acts,
            stdio[1].as_raw_fd(),
            1,
        ));
        step(libc::posix_spawn_file_actions_adddup2(
            &mut acts,
            stdio[2].as_raw_fd(),
            2,
        ));
        step(libc::posix_spawn_file_actions_addchdir_np(&mut acts, cwd.as_ptr()));
        if rc == 0 {
            rc = libc::posix_spawn(&mut pid, exe.as_ptr(), &acts, &attr, argv.as_ptr(), envp.as_ptr());
        }
        libc::posix_spawn_file_actions_destroy(&mut acts);
        libc::posix_spawnattr_destroy(&mut attr);
        rc
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(u32::try_from(pid).unwrap_or(0))
}

impl Spawned {
    /// The same from a child `std::process::Command` started with every
    /// stdio piped (stdin possibly null).
    pub fn from_child(mut child: std::process::Child) -> std::io::Result<Self> {
        let missing = || std::io::Error::other("a piped stdio of the child is missing");
        Ok(Self {
            pid: child.id(),
            stdin: child.stdin.take().map(OwnedFd::from),
            stdout: child.stdout.take().map(OwnedFd::from).ok_or_else(missing)?,
            stderr: child.stderr.take().map(OwnedFd::from).ok_or_else(missing)?,
        })
    }
}

/// Starts `start`'s command through the reaper: with posix_spawn
/// ([`crate::spawn`]), or — where commands run as a user of their own,
/// entered by a pre-exec hook — with `std::process::Command`.
pub(crate) fn start_command(
    start: &ExecStart,
    default_cwd: &Path,
    reaper: &Reaper,
) -> Result<(Spawned, tokio::sync::oneshot::Receiver<ExitInfo>), OpError> {
    const OP: &str = "exec";
    if start.command.is_empty() {
        return Err(agent_err(Kind::InvalidArgument, OP, "command is empty"));
    }
    for kv in &start.env {
        if kv.key.is_empty() || kv.key.contains(&b'=') || kv.key.contains(&0) || kv.value.contains(&0) {
            let mut e = agent_err(Kind::InvalidArgument, OP, "invalid environment variable");
            e.path = bytes::Bytes::copy_from_slice(&kv.key);
            return Err(e);
        }
    }
    let program = OsStr::from_bytes(&start.command);
    let cwd = if start.cwd.is_empty() {
        default_cwd.to_path_buf()
    } else {
        default_cwd.join(OsStr::from_bytes(&start.cwd))
    };
    let stdin_piped = start.stdin_stream || !start.stdin.is_empty();
    let spawned = if crate::identity::command_user_set() {
        let mut cmd = std::process::Command::new(program);
        crate::identity::prepare(&mut cmd);
        cmd.args(start.args.iter().map(|a| OsStr::from_bytes(a)));
        cmd.current_dir(&cwd);
        if start.clear_env {
            cmd.env_clear();
        }
        for kv in &start.env {
            cmd.env(OsStr::from_bytes(&kv.key), OsStr::from_bytes(&kv.value));
        }
        cmd.stdin(if stdin_piped { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped());
        cmd.stderr(Stdio::piped());
        isolate_group(&mut cmd);
        reaper.spawn_with(|| cmd.spawn().and_then(Spawned::from_child).map(|s| (s.pid, s)))
    } else {
        let mut env: Vec<(OsString, OsString)> = if start.clear_env {
            Vec::new()
        } else {
            std::env::vars_os().collect()
        };
        for kv in &start.env {
            let (k, v) = (OsStr::from_bytes(&kv.key), OsStr::from_bytes(&kv.value));
            env.retain(|(have, _)| have != k);
            env.push((k.to_owned(), v.to_owned()));
        }
        let spec = SpawnSpec {
            program,
            args: start.args.iter().map(|a| OsStr::from_bytes(a)).collect(),
            env,
            cwd: &cwd,
            stdin_piped,
        };
        reaper.spawn_with(|| spawn(&spec).map(|s| (s.pid, s)))
    };
    spawned.map_err(|io| {
        let mut e = agent_err(Kind::SpawnFailed, OP, &format!("cannot start command: {io}"));
        e.errno = io.raw_os_error().unwrap_or(0);
        e.path = bytes::Bytes::copy_from_slice(&start.command);
        e
    })
}

fn isolate_group(cmd: &mut std::process::Command) {
    #[allow(unsafe_code)]
    // SAFETY: only async-signal-safe syscalls run between fork and exec
    // (setsid, open, write, close) on no memory but a static string.
    // setsid gives the command its own session and process group, so a
    // kill of the group reaches everything it started and nothing of
    // the agent.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from)?;
            // Under memory pressure the command, not the agent, is the
            // one to go. Raising one's own score needs no privilege;
            // opening a C-string literal with rustix does not allocate.
            let adj = c"/proc/self/oom_score_adj";
            if let Ok(fd) = rustix::fs::open(adj, rustix::fs::OFlags::WRONLY, rustix::fs::Mode::empty()) {
                let _ = rustix::io::write(&fd, b"1000");
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Read;

    fn run(spec: &SpawnSpec<'_>) -> (String, String, i32) {
        let s = spawn(spec).unwrap();
        let mut out = String::new();
        std::fs::File::from(s.stdout).read_to_string(&mut out).unwrap();
        let mut err = String::new();
        std::fs::File::from(s.stderr).read_to_string(&mut err).unwrap();
        let st = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(s.pid as i32), None).unwrap();
        let code = match st {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            _ => -1,
        };
        (out, err, code)
    }

    #[test]
    fn a_command_gets_its_session_cwd_env_and_default_signals() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = SpawnSpec {
            program: OsStr::new("sh"),
            args: vec![
                OsStr::new("-c"),
                OsStr::new("pwd; echo $GREETING; ps -o sid=,pgid=,pid= -p $$; grep SigIgn /proc/self/status; echo err >&2; exit 3"),
            ],
            env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("GREETING".into(), "hi".into())],
            cwd: tmp.path(),
            stdin_piped: false,
        };
        // What the agent ignores must not reach the command.
        #[allow(unsafe_code)]
        // SAFETY: a test process; SIG_IGN for SIGPIPE is what the agent sets.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let (out, err, code) = run(&spec);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], tmp.path().canonicalize().unwrap().to_str().unwrap());
        assert_eq!(lines[1], "hi");
        let ids: Vec<&str> = lines[2].split_whitespace().collect();
        assert!(
            ids[0] == ids[2] && ids[1] == ids[2],
            "its own session and group: {ids:?}"
        );
        assert_eq!(lines[3], "SigIgn:\t0000000000000000");
        assert_eq!((err.as_str(), code), ("err\n", 3));
    }

    /// Commands without stdin read end-of-file from the one kept
    /// `/dev/null`, even after one of them set its stdin non-blocking, and
    /// every one gets a copy of the same descriptor (the other tests of
    /// this process open descriptors meanwhile, so none is counted).
    #[test]
    fn commands_without_stdin_share_one_dev_null() {
        let spec = |script: &'static str| SpawnSpec {
            program: OsStr::new("sh"),
            args: vec![OsStr::new("-c"), OsStr::new(script)],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: Path::new("/"),
            stdin_piped: false,
        };
        assert_eq!(run(&spec("wc -c; readlink /proc/self/fd/0")).0, "0\n/dev/null\n");
        let kept = dev_null().unwrap().as_raw_fd();
        // A command may set O_NONBLOCK on its stdin, which is the one shared
        // open file: later commands must still read end-of-file, not EAGAIN.
        let file = dev_null().unwrap();
        let flags = rustix::fs::fcntl_getfl(file).unwrap();
        rustix::fs::fcntl_setfl(file, flags | rustix::fs::OFlags::NONBLOCK).unwrap();
        assert_eq!(run(&spec("wc -c")).0, "0\n");
        for _ in 0..5 {
            assert_eq!(run(&spec("wc -c")).0, "0\n");
        }
        assert_eq!(dev_null().unwrap().as_raw_fd(), kept, "a new /dev/null for a command");
    }

    #[test]
    fn lookup_follows_the_environments_path_and_names_its_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = tmp.path().join("hello");
        std::fs::write(&exe, "#!/bin/sh\necho from-path\n").unwrap();
        let noexec = tmp.path().join("noexec");
        std::fs::write(&noexec, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = tmp.path().as_os_str();
        assert_eq!(resolve(OsStr::new("hello"), Some(path)).unwrap(), exe);
        assert_eq!(
            resolve(OsStr::new("absent"), Some(path)).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        // No execute bit at all: refused even to root.
        assert_eq!(
            resolve(OsStr::new("noexec"), Some(path)).unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        let spec = SpawnSpec {
            program: OsStr::new("hello"),
            args: vec![],
            env: vec![("PATH".into(), path.to_owned())],
            cwd: Path::new("/"),
            stdin_piped: false,
        };
        assert_eq!(run(&spec).0, "from-path\n");
        let missing_dir = SpawnSpec {
            cwd: Path::new("/nonexistent-dir"),
            ..spec
        };
        assert_eq!(spawn(&missing_dir).err().unwrap().raw_os_error(), Some(libc::ENOENT));
    }
}
