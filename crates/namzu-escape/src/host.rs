//! Attempts on what belongs to the host: its files, its disk, its /proc/sys,
//! its processes, and the agent that serves the sandbox.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use crate::attempt::{digest, errno, io, sys, Attempt, Ctl, Env, Res};
use libc::{EACCES, ENOENT, EPERM, EROFS, ESRCH};

/// Opens `path` and reads from it: Succeeded when at least one byte came.
pub fn read_some(path: &str) -> Res {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return io("open", &e),
    };
    let mut buf = [0u8; 64];
    match f.read(&mut buf) {
        Ok(0) => Res::Absent(format!("{path} opens but is empty")),
        Ok(n) => Res::Succeeded(format!("read {n} bytes of {path}")),
        Err(e) => io("read", &e),
    }
}

pub fn list(path: &str) -> Res {
    match std::fs::read_dir(path) {
        Ok(rd) => Res::Succeeded(format!("listed {} entries of {path}", rd.count())),
        Err(e) => io("opendir", &e),
    }
}

/// Opens an existing file for writing (appending, nothing written).
pub fn open_for_write(path: &str) -> Res {
    match std::fs::OpenOptions::new().append(true).open(path) {
        Ok(_) => Res::Succeeded(format!("opened {path} for writing")),
        Err(e) => io("open for writing", &e),
    }
}

/// Creates a new file, and removes it again if that worked.
pub fn create(path: &str) -> Res {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(path);
            Res::Succeeded(format!("created {path}"))
        }
        Err(e) => io("create", &e),
    }
}

fn pid_tag() -> u32 {
    std::process::id()
}

/// Pids, other than this process, whose argv[0] is `marker`;
/// fails closed: a /proc that cannot be read, or one that does not show
/// this very process, is Broken, not "nothing found".
pub fn proc_with(marker: &str) -> Result<Vec<String>, Res> {
    let me = pid_tag().to_string();
    let rd = std::fs::read_dir("/proc").map_err(|e| Res::Broken(format!("read /proc: {e}")))?;
    let (mut hits, mut saw_me) = (Vec::new(), false);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == me {
            saw_me = true;
        } else if name.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(cmd) = std::fs::read(format!("/proc/{name}/cmdline")) {
                // The marked process's argv[0] is the marker; this
                // program's own processes only carry it as an argument.
                if cmd.split(|b| *b == 0).next() == Some(marker.as_bytes()) {
                    hits.push(name);
                }
            }
        }
    }
    if !saw_me {
        return Err(Res::Broken("/proc does not show this process".into()));
    }
    Ok(hits)
}

fn shadow(env: &Env) -> Res {
    match std::fs::read("/etc/shadow") {
        Err(e) => io("read", &e),
        Ok(b) if digest(&b) == env.shadow_digest => Res::Succeeded("read the host's /etc/shadow".into()),
        Ok(_) => Res::Absent("an /etc/shadow that is not the host's (the image's)".into()),
    }
}

fn kcore(_: &Env) -> Res {
    read_some("/proc/kcore")
}

fn kallsyms(_: &Env) -> Res {
    let s = match std::fs::read_to_string("/proc/kallsyms") {
        Ok(s) => s,
        Err(e) => return io("read", &e),
    };
    let lines: Vec<&str> = s.lines().take(1000).collect();
    if lines.is_empty() {
        return Res::Absent("/proc/kallsyms is empty".into());
    }
    let real = lines.iter().filter(|l| !l.starts_with("0000000000000000")).count();
    if real > 0 {
        Res::Succeeded(format!("{real} real kernel addresses"))
    } else {
        Res::Absent("all addresses zeroed".into())
    }
}

/// Finds a readable mapping of `pid` (its maps file), for a read that can
/// only fail on access, not on the address.
fn readable_address(pid: i32) -> Option<usize> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let range = f.next()?;
        let perms = f.next()?;
        perms
            .starts_with('r')
            .then(|| usize::from_str_radix(range.split('-').next()?, 16).ok())
            .flatten()
    })
}

fn vm_readv(env: &Env) -> Res {
    // Where the map is unreadable, an address that is never mapped: EFAULT
    // then means the access check passed, which is the escape.
    let addr = readable_address(env.agent_pid).unwrap_or(0x1000);
    let mut buf = [0u8; 8];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: both iovecs describe memory valid for the call (the remote one
    // is read by the kernel in the other process, if allowed at all).
    let r = unsafe { libc::process_vm_readv(env.agent_pid, &local, 1, &remote, 1, 0) };
    if r < 0 && errno() == libc::EFAULT {
        return Res::Succeeded("access granted (EFAULT only at the unmapped address)".into());
    }
    sys("process_vm_readv", r as libc::c_long, |n| {
        Res::Succeeded(format!("read {n} bytes at {addr:#x}"))
    })
}

fn seize(pid: i32) -> Res {
    // SAFETY: ptrace(2) with integers. A seize does not stop the tracee, and
    // the tracer's exit (this child's) detaches it.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
    sys("ptrace(SEIZE)", r, |_| Res::Succeeded(format!("seized pid {pid}")))
}

fn signal_host(env: &Env) -> Res {
    // Signal 0: the permission and existence check of a real signal, with
    // no signal sent.
    // SAFETY: kill(2) with integers.
    let r = unsafe { libc::kill(env.host_pid, 0) };
    sys("kill", r.into(), |_| match proc_with(&env.marker) {
        Ok(h) if !h.is_empty() => Res::Succeeded(format!("may signal host pid {}", env.host_pid)),
        Ok(_) => Res::Absent("that pid is one of the sandbox's own".into()),
        Err(e) => e,
    })
}

fn kill_agent(env: &Env) -> Res {
    // SAFETY: kill(2) with integers. Inside, the kernel drops SIGKILL sent
    // to a pid namespace's init from within it.
    let r = unsafe { libc::kill(env.agent_pid, libc::SIGKILL) };
    if r < 0 {
        return Res::Errno("kill", errno());
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    match std::fs::read_to_string(format!("/proc/{}/stat", env.agent_pid)) {
        Ok(s) if s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')) => {
            Res::Succeeded("the agent died".into())
        }
        Ok(_) => Res::Absent("the agent ignores it".into()),
        Err(_) => Res::Succeeded("the agent is gone".into()),
    }
}

fn oom_victim(env: &Env) -> Res {
    let path = format!("/proc/{}/oom_score_adj", env.agent_pid);
    match std::fs::OpenOptions::new().write(true).open(&path) {
        Err(e) => io("open", &e),
        Ok(mut f) => match f.write_all(b"1000") {
            Ok(()) => Res::Succeeded(format!("wrote {path}")),
            Err(e) => io("write", &e),
        },
    }
}

pub fn attempts() -> Vec<Attempt> {
    vec![
        // ---- the host's files
        Attempt {
            name: "read a secret planted on the host",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |e| read_some(&e.secret),
        },
        Attempt {
            name: "list the host directory holding the secret",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |e| list(&e.host_path),
        },
        Attempt {
            name: "read a host /etc file the curated copy leaves out",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |e| read_some(&format!("/etc/{}", e.etc_canary)),
        },
        Attempt {
            name: "read the host's /etc/shadow",
            ctl: Ctl::Root,
            proof: &[ENOENT, EACCES],
            op: shadow,
        },
        Attempt {
            name: "read the host through /proc/self/root/..",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |e| read_some(&format!("/proc/self/root/../../..{}", e.secret)),
        },
        Attempt {
            name: "read the host through the agent's /proc/PID/root",
            ctl: Ctl::User,
            proof: &[ENOENT, EACCES],
            op: |e| read_some(&format!("/proc/{}/root{}", e.agent_pid, e.secret)),
        },
        Attempt {
            name: "read /sys",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |_| list("/sys/kernel"),
        },
        Attempt {
            name: "read /proc/kcore",
            ctl: Ctl::Root,
            proof: &[EACCES, EPERM, ENOENT],
            op: kcore,
        },
        Attempt {
            name: "read kernel addresses from /proc/kallsyms",
            ctl: Ctl::Root,
            proof: &[EACCES, ENOENT],
            op: kallsyms,
        },
        Attempt {
            name: "open the host's disk",
            ctl: Ctl::Root,
            proof: &[ENOENT, EACCES, EPERM],
            op: |e| read_some(&e.disk),
        },
        // ---- writing where it must not
        Attempt {
            name: "create a file under /usr",
            ctl: Ctl::Root,
            proof: &[EROFS],
            op: |_| create(&format!("/usr/.namzu-escape-{}", pid_tag())),
        },
        Attempt {
            name: "create a file in /",
            ctl: Ctl::Root,
            proof: &[EROFS],
            op: |_| create(&format!("/.namzu-escape-{}", pid_tag())),
        },
        Attempt {
            name: "open a system file for writing (/usr/lib/os-release)",
            ctl: Ctl::Root,
            proof: &[EROFS, EACCES],
            op: |_| open_for_write("/usr/lib/os-release"),
        },
        Attempt {
            name: "append to /etc/passwd",
            ctl: Ctl::Root,
            proof: &[EROFS, EACCES],
            op: |_| open_for_write("/etc/passwd"),
        },
        Attempt {
            name: "write a 0666 file under a read-only mount",
            ctl: Ctl::User,
            proof: &[EROFS],
            op: |e| open_for_write(&format!("{}/file", e.ro_dir)),
        },
        Attempt {
            name: "create a file in a 0777 directory under a read-only mount",
            ctl: Ctl::User,
            proof: &[EROFS],
            op: |e| create(&format!("{}/new-{}", e.ro_dir, pid_tag())),
        },
        Attempt {
            name: "write /proc/sys/kernel/hostname",
            ctl: Ctl::Root,
            proof: &[EROFS, EACCES],
            op: |_| open_for_write("/proc/sys/kernel/hostname"),
        },
        Attempt {
            name: "write /proc/sys/vm/drop_caches",
            ctl: Ctl::Root,
            proof: &[EROFS, EACCES],
            op: |_| open_for_write("/proc/sys/vm/drop_caches"),
        },
        Attempt {
            name: "write /proc/sysrq-trigger",
            ctl: Ctl::Root,
            proof: &[EROFS, EACCES, ENOENT],
            op: |_| open_for_write("/proc/sysrq-trigger"),
        },
        // ---- host processes and the agent
        Attempt {
            name: "see a host process",
            ctl: Ctl::User,
            proof: &[],
            op: |e| match proc_with(&e.marker) {
                Ok(h) if h.is_empty() => Res::Absent("no process carries the host's marker".into()),
                Ok(h) => Res::Succeeded(format!("pids {h:?}")),
                Err(r) => r,
            },
        },
        Attempt {
            name: "signal a host process",
            ctl: Ctl::Root,
            proof: &[ESRCH, EPERM],
            op: signal_host,
        },
        Attempt {
            name: "ptrace a host process",
            ctl: Ctl::Root,
            proof: &[EPERM, ESRCH],
            op: |e| seize(e.host_pid),
        },
        Attempt {
            name: "ptrace the agent",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |e| seize(e.agent_pid),
        },
        Attempt {
            name: "read the agent's environment",
            ctl: Ctl::User,
            proof: &[EACCES],
            op: |e| read_some(&format!("/proc/{}/environ", e.agent_pid)),
        },
        Attempt {
            name: "open the agent's memory (/proc/PID/mem)",
            ctl: Ctl::User,
            proof: &[EACCES],
            op: |e| match std::fs::File::open(format!("/proc/{}/mem", e.agent_pid)) {
                Ok(_) => Res::Succeeded("opened".into()),
                Err(err) => io("open", &err),
            },
        },
        Attempt {
            name: "read the agent's memory with process_vm_readv",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: vm_readv,
        },
        Attempt {
            name: "list the agent's open files",
            ctl: Ctl::User,
            proof: &[EACCES],
            op: |e| list(&format!("/proc/{}/fd", e.agent_pid)),
        },
        Attempt {
            name: "make the agent the OOM victim",
            ctl: Ctl::User,
            proof: &[EACCES],
            op: oom_victim,
        },
        Attempt {
            name: "kill the agent",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: kill_agent,
        },
    ]
}
