//! `namzu-escape`: concrete escape attempts, run INSIDE a sandbox by the
//! escape suite (like youki's runtimetest). Static, so it runs in any image.
//!
//! Each attempt prints one line: `attempt NAME: blocked (HOW)` or
//! `attempt NAME: ESCAPED (WHAT)`, and the run ends with
//! `escape attempts: N, escaped: M`. The host-side test plants the targets
//! (a secret file, a TCP listener on its loopback, unix and abstract
//! sockets, a marked process) and passes their coordinates as arguments.
//!
//! Extra modes, run separately because they push limits:
//! `--fork-bomb`, `--disk-fill PATH`, `--mem-hog`.
//!
//! Most attempts are raw system calls: that is the point of the tool, so
//! `unsafe` is allowed here crate-wide, and each call is a plain syscall on
//! arguments owned by the calling frame.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

type Outcome = Result<String, String>;

struct Args {
    secret: String,
    host_path: String,
    tcp_port: u16,
    unix: String,
    abstract_name: String,
    host_pid: i32,
    marker: String,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ename(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// A syscall that must fail: Ok(how) if it returned -1, Err otherwise.
fn must_fail(ret: libc::c_long) -> Outcome {
    if ret < 0 {
        Ok(ename(errno()))
    } else {
        Err(format!("syscall returned {ret}"))
    }
}

fn must_not_open(path: &str, write: bool) -> Outcome {
    let r = if write {
        std::fs::OpenOptions::new().append(true).open(path)
    } else {
        std::fs::File::open(path)
    };
    match r {
        Err(e) => Ok(e.to_string()),
        Ok(mut f) => {
            if write {
                return match f.write_all(b"") {
                    Ok(()) => Err(format!("opened {path} for writing")),
                    Err(e) => Ok(format!("opened but {e}")),
                };
            }
            let mut buf = [0u8; 64];
            match f.read(&mut buf) {
                Ok(n) => Err(format!("read {n} bytes of {path}")),
                Err(e) => Ok(format!("opened but {e}")),
            }
        }
    }
}

fn must_not_create(path: &str) -> Outcome {
    match std::fs::write(path, b"pwned") {
        Err(e) => Ok(e.to_string()),
        Ok(()) => Err(format!("created {path}")),
    }
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn mount_attempt(src: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> Outcome {
    let (s, t, f) = (c(src), c(target), c(fstype));
    // SAFETY: mount(2) with NUL-terminated strings owned by this frame.
    must_fail(unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, std::ptr::null()) }.into())
}

fn unshare_attempt(flags: libc::c_int) -> Outcome {
    // SAFETY: unshare(2) takes only flags.
    must_fail(unsafe { libc::unshare(flags) }.into())
}

fn raw(nr: libc::c_long, a: [libc::c_long; 5]) -> libc::c_long {
    // SAFETY: every caller passes arguments that are integers or null
    // pointers; the kernel (or the seccomp filter) rejects what it must.
    unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4]) }
}

/// Pids, other than this process, whose command line contains `marker`.
fn proc_cmdlines_with(marker: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut hits = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name != me && name.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(cmd) = std::fs::read(format!("/proc/{name}/cmdline")) {
                    if String::from_utf8_lossy(&cmd).contains(marker) {
                        hits.push(name);
                    }
                }
            }
        }
    }
    hits
}

fn attempts(a: &Args) -> Vec<(&'static str, Outcome)> {
    let mut v: Vec<(&'static str, Outcome)> = Vec::new();
    let mut t = |name: &'static str, o: Outcome| v.push((name, o));

    // ---- the host's files
    t("read a secret planted on the host", must_not_open(&a.secret, false));
    t(
        "list the host directory holding the secret",
        match std::fs::read_dir(&a.host_path) {
            Err(e) => Ok(e.to_string()),
            Ok(rd) => Err(format!("listed {} entries", rd.count())),
        },
    );
    t("read /etc/shadow", must_not_open("/etc/shadow", false));
    t("read /etc/gshadow", must_not_open("/etc/gshadow", false));
    t("read /etc/sudoers", must_not_open("/etc/sudoers", false));
    t(
        "list /etc/ssh host keys",
        match std::fs::read_dir("/etc/ssh") {
            Err(e) => Ok(e.to_string()),
            Ok(rd) => Err(format!("listed {} entries", rd.count())),
        },
    );
    t(
        "read the host through /proc/self/root",
        must_not_open("/proc/self/root/../../../etc/shadow", false),
    );
    t(
        "read the host through /proc/1/cwd",
        must_not_open("/proc/1/cwd/etc/shadow", false),
    );
    t(
        "read /sys",
        match std::fs::read_dir("/sys/kernel") {
            Err(e) => Ok(e.to_string()),
            Ok(_) => Err("/sys/kernel is visible".into()),
        },
    );
    t("read /proc/kcore", must_not_open("/proc/kcore", false));
    t(
        "read kernel addresses from /proc/kallsyms",
        match std::fs::read_to_string("/proc/kallsyms") {
            Err(e) => Ok(e.to_string()),
            Ok(s) => {
                let leaked = s
                    .lines()
                    .take(1000)
                    .filter(|l| !l.starts_with("0000000000000000"))
                    .count();
                if leaked == 0 {
                    Ok("all addresses zeroed".into())
                } else {
                    Err(format!("{leaked} real addresses"))
                }
            }
        },
    );

    // ---- writing where it must not
    t("create a file under /usr", must_not_create("/usr/namzu-pwned"));
    t("open /bin/sh for writing", must_not_open("/bin/sh", true));
    t("append to /etc/passwd", must_not_open("/etc/passwd", true));
    t("create a file in /", must_not_create("/namzu-pwned"));
    t(
        "remount /usr read-write",
        mount_attempt("", "/usr", "", libc::MS_REMOUNT | libc::MS_BIND),
    );

    // ---- host processes and the agent
    t("see a host process", {
        let hits = proc_cmdlines_with(&a.marker);
        if hits.is_empty() {
            Ok("no process carries the host marker".into())
        } else {
            Err(format!("pids {hits:?}"))
        }
    });
    t("signal a host process", {
        // SAFETY: kill(2) with integers.
        let r = unsafe { libc::kill(a.host_pid, libc::SIGTERM) };
        if r < 0 {
            Ok(ename(errno()))
        } else if proc_cmdlines_with(&a.marker).is_empty() {
            Ok("that pid is a sandbox process, not the host's".into())
        } else {
            Err("signalled the host process".into())
        }
    });
    t(
        "ptrace a host process",
        must_fail(raw(
            libc::SYS_ptrace,
            [libc::PTRACE_ATTACH as _, a.host_pid as _, 0, 0, 0],
        )),
    );
    t(
        "ptrace the agent",
        must_fail(raw(libc::SYS_ptrace, [libc::PTRACE_ATTACH as _, 1, 0, 0, 0])),
    );
    t("read the agent's environment", must_not_open("/proc/1/environ", false));
    t("read the agent's memory", must_not_open("/proc/1/mem", false));
    t(
        "list the agent's open files",
        match std::fs::read_dir("/proc/1/fd") {
            Err(e) => Ok(e.to_string()),
            Ok(rd) => Err(format!("listed {} fds", rd.count())),
        },
    );
    t(
        "make the agent the OOM victim",
        must_not_open("/proc/1/oom_score_adj", true),
    );
    t("read the agent's memory with process_vm_readv", {
        let mut buf = [0u8; 8];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: 0x400000 as *mut libc::c_void,
            iov_len: 8,
        };
        // SAFETY: both iovecs describe memory valid for the call (the remote
        // one is only read by the kernel, in the other process, if allowed).
        must_fail(unsafe { libc::process_vm_readv(1, &local, 1, &remote, 1, 0) } as libc::c_long)
    });
    t("kill the agent", {
        // SAFETY: kill(2) with integers. The kernel drops SIGKILL sent to a
        // pid namespace's init from inside it.
        unsafe { libc::kill(1, libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        if std::path::Path::new("/proc/1/stat").exists() {
            Ok("init ignores it".into())
        } else {
            Err("agent died".into())
        }
    });

    // ---- mounts and namespaces
    t("mount a tmpfs", mount_attempt("tmpfs", "/tmp", "tmpfs", 0));
    t("mount procfs", mount_attempt("proc", "/tmp", "proc", 0));
    t("unmount the /proc masks", {
        let p = c("/proc/sys");
        // SAFETY: umount2(2) with a NUL-terminated path.
        must_fail(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) }.into())
    });
    t(
        "create a user namespace (unshare)",
        unshare_attempt(libc::CLONE_NEWUSER),
    );
    t("create a mount namespace (unshare)", unshare_attempt(libc::CLONE_NEWNS));
    t(
        "create a network namespace (unshare)",
        unshare_attempt(libc::CLONE_NEWNET),
    );
    t("create a user namespace (clone)", {
        let r = raw(
            libc::SYS_clone,
            [(libc::CLONE_NEWUSER | libc::SIGCHLD) as _, 0, 0, 0, 0],
        );
        if r == 0 {
            // SAFETY: in the child: leave at once.
            unsafe { libc::_exit(0) };
        }
        must_fail(r)
    });
    t(
        "clone3 (flags the filter cannot see)",
        must_fail(raw(libc::SYS_clone3, [0, 0, 0, 0, 0])),
    );
    t(
        "join the agent's mount namespace",
        match std::fs::File::open("/proc/1/ns/mnt") {
            Err(e) => Ok(e.to_string()),
            Ok(f) => {
                use std::os::fd::AsRawFd;
                // SAFETY: setns(2) on an fd this frame owns.
                must_fail(unsafe { libc::setns(f.as_raw_fd(), 0) }.into())
            }
        },
    );
    t("chroot", {
        let p = c(".");
        // SAFETY: chroot(2) with a NUL-terminated path.
        must_fail(unsafe { libc::chroot(p.as_ptr()) }.into())
    });
    t(
        "pivot_root",
        must_fail(raw(
            libc::SYS_pivot_root,
            [c("/tmp").as_ptr() as _, c("/tmp").as_ptr() as _, 0, 0, 0],
        )),
    );
    t(
        "open_tree (new mount API)",
        must_fail(raw(
            libc::SYS_open_tree,
            [libc::AT_FDCWD as _, c("/").as_ptr() as _, 1, 0, 0],
        )),
    );
    t(
        "fsopen (new mount API)",
        must_fail(raw(libc::SYS_fsopen, [c("tmpfs").as_ptr() as _, 0, 0, 0, 0])),
    );

    // ---- privilege
    t("gain capabilities through a setuid binary", setuid_copy());
    t("raise capabilities with capset", {
        // struct __user_cap_header_struct { u32 version; i32 pid; } and two
        // struct __user_cap_data_struct { u32 effective, permitted, inheritable; }
        let hdr: [u32; 2] = [0x2008_0522, 0];
        let data: [u32; 6] = [u32::MAX; 6];
        // SAFETY: capset(2) reads the header and the two data structs we own.
        must_fail(unsafe { libc::syscall(libc::SYS_capset, hdr.as_ptr(), data.as_ptr()) })
    });
    t("clear no_new_privs", {
        // SAFETY: prctl(2) with integers.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0) };
        // SAFETY: prctl(2) with integers.
        let v = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
        if v == 1 {
            Ok("still set".into())
        } else {
            Err(format!("no_new_privs is {v}"))
        }
    });
    t("set the hostname", {
        let n = b"pwned";
        // SAFETY: sethostname(2) reads `n`.
        must_fail(unsafe { libc::sethostname(n.as_ptr().cast(), n.len()) }.into())
    });

    // ---- kernel interfaces
    t(
        "load a kernel module (init_module)",
        must_fail(raw(libc::SYS_init_module, [0, 0, c("").as_ptr() as _, 0, 0])),
    );
    t("load a kernel module (finit_module)", {
        let f = std::fs::File::open("/dev/null");
        use std::os::fd::AsRawFd;
        let fd = f.as_ref().map_or(-1, |f| f.as_raw_fd());
        must_fail(raw(libc::SYS_finit_module, [fd as _, c("").as_ptr() as _, 0, 0, 0]))
    });
    t("bpf", {
        let attr = [0u8; 128];
        must_fail(raw(
            libc::SYS_bpf,
            [5 /* BPF_PROG_LOAD */, attr.as_ptr() as _, 128, 0, 0],
        ))
    });
    t("perf_event_open", {
        let attr = [0u8; 128];
        must_fail(raw(libc::SYS_perf_event_open, [attr.as_ptr() as _, 0, -1, -1, 0]))
    });
    t(
        "keyctl",
        must_fail(raw(
            libc::SYS_keyctl,
            [0 /* GET_KEYRING_ID */, -3 /* session */, 1, 0, 0],
        )),
    );
    t(
        "add_key",
        must_fail(raw(
            libc::SYS_add_key,
            [c("user").as_ptr() as _, c("k").as_ptr() as _, 0, 0, -3],
        )),
    );
    t("userfaultfd", must_fail(raw(libc::SYS_userfaultfd, [0, 0, 0, 0, 0])));
    // vsock is not network-namespaced: a socket of it could reach the
    // host's (or other guests') vsock services. Creation only; nothing is
    // ever connected.
    t(
        "create an AF_VSOCK socket",
        must_fail(raw(
            libc::SYS_socket,
            [libc::AF_VSOCK as _, libc::SOCK_STREAM as _, 0, 0, 0],
        )),
    );
    // x32 ABI: same audit arch as x86_64, number | 0x40000000.
    #[cfg(target_arch = "x86_64")]
    t(
        "ptrace through the x32 ABI",
        must_fail(raw(
            libc::SYS_ptrace | 0x4000_0000,
            [libc::PTRACE_TRACEME as _, 0, 0, 0, 0],
        )),
    );
    t("io_uring_setup", {
        let params = [0u8; 120];
        must_fail(raw(libc::SYS_io_uring_setup, [1, params.as_ptr() as _, 0, 0, 0]))
    });
    t("kexec_load", must_fail(raw(libc::SYS_kexec_load, [0, 0, 0, 0, 0])));
    t("reboot", must_fail(raw(libc::SYS_reboot, [0, 0, 0, 0, 0])));
    t("set the clock", {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime/clock_settime on a timespec we own; setting
        // the time it already is changes nothing even if it were allowed.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        // SAFETY: as above.
        must_fail(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) }.into())
    });
    t("read the kernel log (syslog)", {
        let mut buf = [0u8; 64];
        must_fail(raw(
            libc::SYS_syslog,
            [3 /* READ_ALL */, buf.as_mut_ptr() as _, 64, 0, 0],
        ))
    });
    t(
        "swapon",
        must_fail(raw(libc::SYS_swapon, [c("/dev/null").as_ptr() as _, 0, 0, 0, 0])),
    );

    // ---- devices
    for (name, path) in [
        ("open /dev/mem", "/dev/mem"),
        ("open /dev/kmem", "/dev/kmem"),
        ("open /dev/port", "/dev/port"),
        ("open a block device (/dev/vda)", "/dev/vda"),
        ("open a block device (/dev/sda)", "/dev/sda"),
    ] {
        t(name, must_not_open(path, false));
    }
    t("mknod a block device", {
        let p = c("/tmp/namzu-blk");
        // SAFETY: mknod(2) with a NUL-terminated path and integers.
        must_fail(unsafe { libc::mknod(p.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(254, 0)) }.into())
    });
    t("mknod /dev/mem's twin", {
        let p = c("/tmp/namzu-mem");
        // SAFETY: mknod(2) with a NUL-terminated path and integers.
        must_fail(unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 1)) }.into())
    });

    // ---- /proc/sys and friends
    t(
        "write /proc/sys/kernel/hostname",
        must_not_open("/proc/sys/kernel/hostname", true),
    );
    t(
        "write /proc/sys/vm/drop_caches",
        must_not_open("/proc/sys/vm/drop_caches", true),
    );
    t("write /proc/sysrq-trigger", must_not_open("/proc/sysrq-trigger", true));

    // ---- the network
    t("reach a TCP server on the host's loopback", {
        match std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], a.tcp_port)),
            std::time::Duration::from_secs(2),
        ) {
            Err(e) => Ok(e.to_string()),
            Ok(_) => Err(format!("connected to 127.0.0.1:{}", a.tcp_port)),
        }
    });
    t("reach the internet", {
        match std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([1, 1, 1, 1], 53)),
            std::time::Duration::from_secs(2),
        ) {
            Err(e) => Ok(e.to_string()),
            Ok(_) => Err("connected to 1.1.1.1:53".into()),
        }
    });
    t(
        "reach a host unix socket not bound in",
        match UnixStream::connect(&a.unix) {
            Err(e) => Ok(e.to_string()),
            Ok(_) => Err(format!("connected to {}", a.unix)),
        },
    );
    t("reach a host abstract unix socket", abstract_connect(&a.abstract_name));
    t("open a raw packet socket", {
        // SAFETY: socket(2) with integers.
        must_fail(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) }.into())
    });

    // ---- mounts
    t("find a mount without nosuid or nodev", {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let weak: Vec<String> = info
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (point, opts) = (*f.get(4)?, *f.get(5)?);
                let nosuid = opts.split(',').any(|o| o == "nosuid");
                let nodev = opts.split(',').any(|o| o == "nodev");
                // Device nodes bound into /dev and the /proc masks are the
                // exceptions; /dev and devpts must still be nosuid.
                let device_bind = (point.starts_with("/dev/") && point != "/dev/pts" && point != "/dev/shm")
                    || point.starts_with("/proc/");
                let weak = if device_bind {
                    false
                } else if point == "/dev" || point == "/dev/pts" {
                    !nosuid
                } else {
                    !(nosuid && nodev)
                };
                weak.then(|| format!("{point} ({opts})"))
            })
            .collect();
        if weak.is_empty() {
            Ok("every mount is nosuid,nodev (device binds excepted)".into())
        } else {
            Err(format!("{weak:?}"))
        }
    });
    t("see a host mount", {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let ours = [
            "/",
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/opt",
            "/etc",
            "/tmp",
            "/run",
            "/home",
            "/root",
            "/workspace",
            "/dev",
            "/proc",
        ];
        // A tmpfs is the sandbox's own memory, wherever it is mounted (the
        // docker tier's writable set, /var/tmp among them); every other
        // filesystem outside the sandbox's own layout is the host's.
        let foreign: Vec<String> = info
            .lines()
            .filter_map(|l| {
                let point = l.split_whitespace().nth(4)?;
                let fstype = l.split(" - ").nth(1)?.split_whitespace().next()?;
                (fstype != "tmpfs").then(|| format!("{point} ({fstype})"))
            })
            .filter(|p| {
                let p = p.split(' ').next().unwrap_or_default();
                !ours
                    .iter()
                    .any(|o| p == *o || (o.len() > 1 && p.starts_with(&format!("{o}/"))))
            })
            .collect();
        if foreign.is_empty() {
            Ok("only the sandbox's own mount points".into())
        } else {
            Err(format!("{foreign:?}"))
        }
    });

    // ---- leaks from the agent
    t("use file descriptors inherited from the agent", {
        let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        // 0-2 are ours; one more is the directory being read.
        let extra: Vec<_> = fds.iter().filter(|f| f.parse::<u32>().is_ok_and(|n| n > 3)).collect();
        if extra.is_empty() {
            Ok("only stdio inherited".into())
        } else {
            Err(format!("extra fds {extra:?}"))
        }
    });
    v
}

fn abstract_connect(name: &str) -> Outcome {
    // SAFETY: socket(2) with integers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Ok(ename(errno()));
    }
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as _;
    let bytes = name.as_bytes();
    let len = bytes.len().min(addr.sun_path.len() - 1);
    for (d, s) in addr.sun_path[1..=len].iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let alen = (std::mem::size_of::<libc::sa_family_t>() + 1 + len) as libc::socklen_t;
    // SAFETY: connect(2) reads `alen` bytes of `addr`, which we own.
    let r = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), alen) };
    let out = if r < 0 {
        Ok(ename(errno()))
    } else {
        Err(format!("connected to @{name}"))
    };
    // SAFETY: closing the fd we opened.
    unsafe { libc::close(fd) };
    out
}

/// Copies this binary, makes the copy setuid root, runs it, and reads the
/// capabilities it ends up with.
fn setuid_copy() -> Outcome {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let copy = "/workspace/.namzu-suid";
    if let Err(e) = std::fs::copy(&me, copy) {
        return Ok(format!("cannot copy: {e}"));
    }
    if let Err(e) = std::fs::set_permissions(copy, std::fs::Permissions::from_mode(0o4755)) {
        let _ = std::fs::remove_file(copy);
        return Ok(format!("cannot set the setuid bit: {e}"));
    }
    let out = std::process::Command::new(copy).arg("--report-caps").output();
    let _ = std::fs::remove_file(copy);
    let out = out.map_err(|e| format!("exec: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if text == "CapEff: 0000000000000000" {
        Ok("the copy runs with no capabilities".into())
    } else {
        Err(format!("the copy reports {text}"))
    }
}

fn report_caps() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status.lines().find(|l| l.starts_with("CapEff:")).unwrap_or("CapEff: ?");
    println!("CapEff: {}", eff.trim_start_matches("CapEff:").trim());
}

/// Forks idle children until fork fails; prints how many, then kills them
/// all (and itself) through the process group.
fn fork_bomb(limit: u32) {
    let mut n = 0u32;
    let err = loop {
        if n >= limit {
            break "reached the test's own ceiling".to_owned();
        }
        // SAFETY: fork(2); the child only pauses until the group is killed.
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: pause(2) takes nothing.
                unsafe { libc::pause() };
            },
            -1 => break ename(errno()),
            _ => n += 1,
        }
    };
    println!("forked {n} before: {err}");
    let _ = std::io::stdout().flush();
    // SAFETY: kill(2) of our own process group.
    unsafe { libc::kill(0, libc::SIGKILL) };
}

fn disk_fill(path: &str) {
    // SAFETY: ignoring a signal installs no handler code. Past RLIMIT_FSIZE
    // the write then fails with EFBIG instead of the signal killing us.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    let res: std::io::Result<()> = std::fs::File::create(path).and_then(|mut f| loop {
        f.write_all(&chunk)?;
        written += chunk.len() as u64;
    });
    let e = res.err().map_or_else(|| "none".to_owned(), |e| e.to_string());
    let _ = std::fs::remove_file(path);
    println!("wrote {written} bytes before: {e}");
}

/// Allocates and touches memory in 16 MiB steps until something stops it;
/// prints progress so the host sees how far it got.
fn mem_hog() {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 16 << 20];
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
        held.push(chunk);
        println!("holding {} MiB", held.len() * 16);
        let _ = std::io::stdout().flush();
    }
}

/// Spins for `secs` of wall time; prints the CPU time it got.
fn cpu_burn(secs: f64) {
    let t0 = std::time::Instant::now();
    let mut x = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    // SAFETY: getrusage(2) fills a struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let cpu = ru.ru_utime.tv_sec as f64
        + ru.ru_utime.tv_usec as f64 / 1e6
        + ru.ru_stime.tv_sec as f64
        + ru.ru_stime.tv_usec as f64 / 1e6;
    println!("cpu {cpu:.3} wall {:.3} ({x})", t0.elapsed().as_secs_f64());
}

/// Echoes every connection on 127.0.0.1:`port` until the peer half-closes,
/// then closes its own half. Prints `listening` once ready.
fn echo_server(port: u16) {
    let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
        println!("cannot bind {port}");
        return;
    };
    println!("listening");
    let _ = std::io::stdout().flush();
    for conn in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut conn = conn;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = conn.shutdown(std::net::Shutdown::Write);
        });
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let get = |k: &str| {
        argv.iter()
            .position(|a| a == k)
            .and_then(|i| argv.get(i + 1))
            .cloned()
            .unwrap_or_default()
    };
    if argv.iter().any(|a| a == "--report-caps") {
        return report_caps();
    }
    if argv.iter().any(|a| a == "--fork-bomb") {
        return fork_bomb(get("--fork-bomb").parse().unwrap_or(100_000));
    }
    if argv.iter().any(|a| a == "--echo-server") {
        return echo_server(get("--echo-server").parse().unwrap_or(7777));
    }
    if argv.iter().any(|a| a == "--mem-hog") {
        return mem_hog();
    }
    if argv.iter().any(|a| a == "--cpu-burn") {
        return cpu_burn(get("--cpu-burn").parse().unwrap_or(1.0));
    }
    if argv.iter().any(|a| a == "--disk-fill") {
        return disk_fill(&get("--disk-fill"));
    }
    let a = Args {
        secret: get("--secret"),
        host_path: get("--host-path"),
        tcp_port: get("--tcp").parse().unwrap_or(1),
        unix: get("--unix"),
        abstract_name: get("--abstract"),
        host_pid: get("--host-pid").parse().unwrap_or(-1),
        marker: get("--marker"),
    };
    let results = attempts(&a);
    let mut escaped = 0;
    for (name, o) in &results {
        match o {
            Ok(how) => println!("attempt {name}: blocked ({how})"),
            Err(what) => {
                escaped += 1;
                println!("attempt {name}: ESCAPED ({what})");
            }
        }
    }
    println!("escape attempts: {}, escaped: {escaped}", results.len());
}
