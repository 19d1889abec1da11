//! Attempts on the kernel's privileged interfaces: mounts, namespaces,
//! capabilities, modules, bpf, perf, keyrings, io_uring, devices. Each is
//! written so that it succeeds where the privilege exists (the control
//! proves it): a well-formed bpf program, a user-only perf counter, a key
//! with a payload, `clone3` with a real argument struct.

use crate::attempt::{errno, sys, Attempt, Ctl, Env, Res};
use libc::{c_long, EACCES, EPERM};

fn cs(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap_or_default()
}

fn raw(nr: c_long, a: [c_long; 5]) -> c_long {
    // SAFETY: every caller passes integers, null, or pointers to memory it
    // owns for the duration of the call.
    unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4]) }
}

fn ok(what: &'static str) -> impl FnOnce(c_long) -> Res {
    move |_| Res::Succeeded(what.into())
}

fn mount(src: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> c_long {
    let (s, t, f) = (cs(src), cs(target), cs(fstype));
    let fp = if fstype.is_empty() {
        std::ptr::null()
    } else {
        f.as_ptr()
    };
    // SAFETY: mount(2) with NUL-terminated strings owned by this frame.
    unsafe { libc::mount(s.as_ptr(), t.as_ptr(), fp, flags, std::ptr::null()) }.into()
}

/// The control's own mount point (a tmpfs on /tmp in its private mount
/// namespace) for the attempts that need one; inside, `/tmp` already is one.
fn scratch_mount(env: &Env) -> Result<&'static str, Res> {
    if env.control && mount("tmpfs", "/tmp", "tmpfs", 0) < 0 {
        return Err(Res::Broken(format!("control setup: mount tmpfs: errno {}", errno())));
    }
    Ok("/tmp")
}

fn remount_rw(env: &Env) -> Res {
    if env.control {
        // The host has no read-only bind there: make one, in the control's
        // private namespace, so the same call below has something to undo.
        let d = env.ro_dir.as_str();
        if mount(d, d, "", libc::MS_BIND) < 0
            || mount("", d, "", libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY) < 0
        {
            return Res::Broken(format!("control setup: ro bind: errno {}", errno()));
        }
    }
    let r = mount("", &env.ro_dir, "", libc::MS_REMOUNT | libc::MS_BIND);
    sys("mount(MS_REMOUNT)", r, ok("remounted it read-write"))
}

fn umount_mask(env: &Env) -> Res {
    let target = if env.control {
        match scratch_mount(env) {
            Ok(t) => t,
            Err(r) => return r,
        }
    } else {
        "/proc/sys"
    };
    let p = cs(target);
    // SAFETY: umount2(2) with a NUL-terminated path.
    let r = unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
    sys("umount2", r.into(), ok("unmounted it"))
}

fn unshare(flags: libc::c_int) -> Res {
    // SAFETY: unshare(2) takes only flags.
    sys("unshare", unsafe { libc::unshare(flags) }.into(), ok("new namespace"))
}

/// A child in a new user namespace by `clone` (old ABI: flags in rdi).
fn clone_userns(_: &Env) -> Res {
    let r = raw(
        libc::SYS_clone,
        [(libc::CLONE_NEWUSER | libc::SIGCHLD) as c_long, 0, 0, 0, 0],
    );
    if r == 0 {
        // SAFETY: in the child: leave at once.
        unsafe { libc::_exit(0) };
    }
    sys("clone", r, |pid| {
        // SAFETY: waitpid(2) of our child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        Res::Succeeded("a child in a new user namespace".into())
    })
}

/// `clone3` with a real `struct clone_args` asking for a user namespace:
/// the filter cannot read the struct, so it must refuse `clone3` whole.
fn clone3_userns(_: &Env) -> Res {
    // struct clone_args (CLONE_ARGS_SIZE_VER0 = 64): flags, pidfd,
    // child_tid, parent_tid, exit_signal, stack, stack_size, tls.
    let args: [u64; 8] = [libc::CLONE_NEWUSER as u64, 0, 0, 0, libc::SIGCHLD as u64, 0, 0, 0];
    let r = raw(libc::SYS_clone3, [args.as_ptr() as c_long, 64, 0, 0, 0]);
    if r == 0 {
        // SAFETY: in the child: leave at once.
        unsafe { libc::_exit(0) };
    }
    sys("clone3", r, |pid| {
        // SAFETY: waitpid(2) of our child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        Res::Succeeded("a child in a new user namespace".into())
    })
}

fn setns_agent(env: &Env) -> Res {
    match std::fs::File::open(format!("/proc/{}/ns/mnt", env.agent_pid)) {
        Err(e) => crate::attempt::io("open ns/mnt", &e),
        Ok(f) => {
            use std::os::fd::AsRawFd;
            // SAFETY: setns(2) on an fd this frame owns.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNS) };
            sys("setns", r.into(), ok("joined the agent's mount namespace"))
        }
    }
}

fn pivot(env: &Env) -> Res {
    let dir = match scratch_mount(env) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let d = cs(dir);
    // SAFETY: chdir(2) with a NUL-terminated path.
    if unsafe { libc::chdir(d.as_ptr()) } < 0 {
        return Res::Broken(format!("chdir {dir}: errno {}", errno()));
    }
    let dot = cs(".");
    let r = raw(
        libc::SYS_pivot_root,
        [dot.as_ptr() as c_long, dot.as_ptr() as c_long, 0, 0, 0],
    );
    sys("pivot_root", r, ok("pivoted the root"))
}

fn mknod(env: &Env, kind: libc::mode_t, major: u32, minor: u32) -> Res {
    let dir = match scratch_mount(env) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let p = cs(&format!("{dir}/namzu-node-{}", std::process::id()));
    // SAFETY: mknod(2) with a NUL-terminated path and integers.
    let r = unsafe { libc::mknod(p.as_ptr(), kind | 0o600, libc::makedev(major, minor)) };
    let res = sys("mknod", r.into(), ok("made the device node"));
    // SAFETY: unlink(2) of what we may have made (after errno was read).
    unsafe { libc::unlink(p.as_ptr()) };
    res
}

/// Runs a setuid-root copy of this binary as an ordinary user and reads
/// the capabilities it gets.
fn setuid_copy(env: &Env) -> Res {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return Res::Broken(format!("current_exe: {e}")),
    };
    let copy = format!("{}/.namzu-suid-{}", env.scratch, std::process::id());
    if let Err(e) = std::fs::copy(&me, &copy) {
        return crate::attempt::io("copy", &e);
    }
    if let Err(e) = std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o4755)) {
        let _ = std::fs::remove_file(&copy);
        return crate::attempt::io("chmod 4755", &e);
    }
    let mut cmd = std::process::Command::new(&copy);
    cmd.arg("--report-caps");
    if env.control {
        // The control runs it as an ordinary user: the setuid bit alone
        // must then give it root's capabilities.
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output();
    let _ = std::fs::remove_file(&copy);
    let out = match out {
        Ok(o) => o,
        Err(e) => return crate::attempt::io("exec the copy", &e),
    };
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match text.strip_prefix("CapEff: ") {
        Some(v) if v.bytes().all(|b| b == b'0') => Res::Absent("the copy runs with no capabilities".into()),
        Some(v) => Res::Succeeded(format!("the copy runs with CapEff {v}")),
        None => Res::Broken(format!("the copy said {text:?}")),
    }
}

fn capset(env: &Env) -> Res {
    // struct __user_cap_header_struct { u32 version; i32 pid; } and two
    // struct __user_cap_data_struct { u32 effective, permitted, inheritable; }
    // Every capability the kernel knows in effective and permitted: what a
    // command must not get (the control asks for its own bounding set,
    // which root holds).
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let mut all: u64 = (1u64 << (last + 1)) - 1;
    if env.control {
        // The host's root may itself run with a bounded set: ask for that.
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        if let Some(b) = status.lines().find_map(|l| l.strip_prefix("CapBnd:")) {
            all = u64::from_str_radix(b.trim(), 16).unwrap_or(all);
        }
    }
    let (lo, hi) = (all as u32, (all >> 32) as u32);
    let hdr: [u32; 2] = [0x2008_0522, 0];
    let data: [u32; 6] = [lo, lo, 0, hi, hi, 0];
    let r = raw(
        libc::SYS_capset,
        [hdr.as_ptr() as c_long, data.as_ptr() as c_long, 0, 0, 0],
    );
    sys("capset", r, ok("raised every capability"))
}

fn no_new_privs(_: &Env) -> Res {
    // SAFETY: prctl(2) with integers.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    // SAFETY: as above.
    match unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } {
        1 => Res::Absent("still set".into()),
        v => Res::Succeeded(format!("no_new_privs is {v}")),
    }
}

fn sethostname(_: &Env) -> Res {
    let n = b"namzu-escape";
    // SAFETY: sethostname(2) reads `n`.
    let r = unsafe { libc::sethostname(n.as_ptr().cast(), n.len()) };
    sys("sethostname", r.into(), ok("set the hostname"))
}

/// Loads a two-instruction socket filter (`r0 = 0; exit`).
fn bpf_load(_: &Env) -> Res {
    // struct bpf_insn { u8 code; u8 regs; s16 off; s32 imm; }
    let insns: [u64; 2] = [0xb7, 0x95]; // BPF_ALU64|BPF_MOV|BPF_K r0=0 ; BPF_JMP|BPF_EXIT
    let license = cs("GPL");
    // union bpf_attr, BPF_PROG_LOAD: prog_type u32, insn_cnt u32, insns
    // u64, license u64, then zeros.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // BPF_PROG_TYPE_SOCKET_FILTER
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let r = raw(
        libc::SYS_bpf,
        [5 /* BPF_PROG_LOAD */, attr.as_ptr() as c_long, 128, 0, 0],
    );
    sys("bpf(PROG_LOAD)", r, ok("loaded a bpf program"))
}

/// A software CPU-clock counter on this process, user space only: what an
/// unprivileged user may open at perf_event_paranoid 2.
fn perf_open(_: &Env) -> Res {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes()); // size
                                                       // config 0 = PERF_COUNT_SW_CPU_CLOCK; flags at 40: disabled,
                                                       // exclude_kernel, exclude_hv.
    let flags: u64 = 1 | 1 << 5 | 1 << 6;
    attr[40..48].copy_from_slice(&flags.to_ne_bytes());
    let r = raw(
        libc::SYS_perf_event_open,
        [attr.as_ptr() as c_long, 0, -1, -1, 8 /* FD_CLOEXEC */],
    );
    sys("perf_event_open", r, ok("opened a perf counter"))
}

fn add_key(_: &Env) -> Res {
    let (t, d, p) = (cs("user"), cs("namzu-escape"), b"x");
    let r = raw(
        libc::SYS_add_key,
        [
            t.as_ptr() as c_long,
            d.as_ptr() as c_long,
            p.as_ptr() as c_long,
            1,
            -2, /* process keyring */
        ],
    );
    sys("add_key", r, ok("added a key"))
}

pub fn attempts() -> Vec<Attempt> {
    vec![
        // ---- mounts and namespaces
        Attempt {
            name: "mount a tmpfs",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| sys("mount", mount("tmpfs", "/tmp", "tmpfs", 0), ok("mounted")),
        },
        Attempt {
            name: "mount procfs",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| sys("mount", mount("proc", "/tmp", "proc", 0), ok("mounted")),
        },
        Attempt {
            name: "remount a read-only mount read-write",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: remount_rw,
        },
        Attempt {
            name: "unmount the /proc masks",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: umount_mask,
        },
        Attempt {
            name: "create a user namespace (unshare)",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |_| unshare(libc::CLONE_NEWUSER),
        },
        Attempt {
            name: "create a mount namespace (unshare)",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| unshare(libc::CLONE_NEWNS),
        },
        Attempt {
            name: "create a network namespace (unshare)",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| unshare(libc::CLONE_NEWNET),
        },
        Attempt {
            name: "create a user namespace (clone)",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: clone_userns,
        },
        Attempt {
            name: "create a user namespace (clone3)",
            ctl: Ctl::User,
            proof: &[libc::ENOSYS, EPERM],
            op: clone3_userns,
        },
        Attempt {
            name: "join the agent's mount namespace",
            ctl: Ctl::Root,
            proof: &[EACCES, EPERM],
            op: setns_agent,
        },
        Attempt {
            name: "chroot",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| {
                let p = cs("/");
                // SAFETY: chroot(2) with a NUL-terminated path.
                sys("chroot", unsafe { libc::chroot(p.as_ptr()) }.into(), ok("chrooted"))
            },
        },
        Attempt {
            name: "pivot_root",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: pivot,
        },
        Attempt {
            name: "open_tree (new mount API)",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| {
                let p = cs("/");
                let r = raw(
                    libc::SYS_open_tree,
                    [libc::AT_FDCWD as c_long, p.as_ptr() as c_long, 1, 0, 0],
                );
                sys("open_tree(CLONE)", r, ok("cloned a mount tree"))
            },
        },
        Attempt {
            name: "fsopen (new mount API)",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| {
                let t = cs("tmpfs");
                sys(
                    "fsopen",
                    raw(libc::SYS_fsopen, [t.as_ptr() as c_long, 0, 0, 0, 0]),
                    ok("opened a filesystem context"),
                )
            },
        },
        // ---- privilege
        Attempt {
            name: "gain capabilities through a setuid binary",
            ctl: Ctl::Root,
            proof: &[],
            op: setuid_copy,
        },
        Attempt {
            name: "raise capabilities with capset",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: capset,
        },
        Attempt {
            name: "set the hostname",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: sethostname,
        },
        Attempt {
            name: "clear no_new_privs",
            ctl: Ctl::None,
            proof: &[],
            op: no_new_privs,
        },
        // ---- kernel interfaces
        Attempt {
            name: "load a bpf program",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: bpf_load,
        },
        Attempt {
            name: "open a perf counter",
            ctl: Ctl::User,
            proof: &[EPERM, EACCES],
            op: perf_open,
        },
        Attempt {
            name: "keyctl",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |_| {
                let r = raw(libc::SYS_keyctl, [0 /* GET_KEYRING_ID */, -3 /* session */, 1, 0, 0]);
                sys("keyctl", r, ok("got the session keyring"))
            },
        },
        Attempt {
            name: "add_key",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: add_key,
        },
        Attempt {
            name: "userfaultfd",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |_| {
                let r = raw(
                    libc::SYS_userfaultfd,
                    [(libc::O_CLOEXEC | 1/* UFFD_USER_MODE_ONLY */) as c_long, 0, 0, 0, 0],
                );
                sys("userfaultfd", r, ok("made a userfaultfd"))
            },
        },
        // vsock is not network-namespaced: a socket of it could reach the
        // host's (or other guests') vsock services. Creation only.
        Attempt {
            name: "create an AF_VSOCK socket",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |_| {
                let r = raw(
                    libc::SYS_socket,
                    [libc::AF_VSOCK as c_long, libc::SOCK_STREAM as c_long, 0, 0, 0],
                );
                sys("socket(AF_VSOCK)", r, ok("made a vsock socket"))
            },
        },
        // x32 ABI: the same audit arch as x86_64, number | 0x40000000.
        Attempt {
            name: "ptrace through the x32 ABI",
            ctl: Ctl::User,
            proof: &[libc::ENOSYS],
            op: |_| {
                let r = raw(
                    libc::SYS_ptrace | 0x4000_0000,
                    [libc::PTRACE_TRACEME as c_long, 0, 0, 0, 0],
                );
                sys("ptrace(x32)", r, ok("x32 ptrace ran"))
            },
        },
        Attempt {
            name: "io_uring_setup",
            ctl: Ctl::User,
            proof: &[EPERM],
            op: |_| {
                let params = [0u8; 120];
                let r = raw(libc::SYS_io_uring_setup, [1, params.as_ptr() as c_long, 0, 0, 0]);
                sys("io_uring_setup", r, ok("made an io_uring"))
            },
        },
        Attempt {
            name: "read the kernel log (syslog)",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| {
                let mut buf = [0u8; 64];
                let r = raw(
                    libc::SYS_syslog,
                    [3 /* READ_ALL */, buf.as_mut_ptr() as c_long, 64, 0, 0],
                );
                sys("syslog", r, ok("read the kernel log"))
            },
        },
        Attempt {
            name: "mknod a block device",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |e| mknod(e, libc::S_IFBLK, 254, 0),
        },
        Attempt {
            name: "mknod /dev/mem's twin",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |e| mknod(e, libc::S_IFCHR, 1, 1),
        },
        // No safe control for these: they would change the host's kernel.
        Attempt {
            name: "load a kernel module (init_module)",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                let p = cs("");
                sys(
                    "init_module",
                    raw(libc::SYS_init_module, [0, 0, p.as_ptr() as c_long, 0, 0]),
                    ok("loaded"),
                )
            },
        },
        Attempt {
            name: "load a kernel module (finit_module)",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                let f = std::fs::File::open("/dev/null");
                use std::os::fd::AsRawFd;
                let fd = f.as_ref().map_or(-1, |f| f.as_raw_fd());
                let p = cs("");
                sys(
                    "finit_module",
                    raw(libc::SYS_finit_module, [fd as c_long, p.as_ptr() as c_long, 0, 0, 0]),
                    ok("loaded"),
                )
            },
        },
        Attempt {
            name: "kexec_load",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                sys(
                    "kexec_load",
                    raw(libc::SYS_kexec_load, [0, 0, 0, 0, 0]),
                    ok("loaded a kernel"),
                )
            },
        },
        Attempt {
            name: "reboot",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                // Real magic; CAD_OFF, which a child pid namespace refuses
                // even when permitted.
                let r = raw(libc::SYS_reboot, [0xfee1_dead_u32 as c_long, 672_274_793, 0, 0, 0]);
                sys("reboot", r, ok("reboot accepted"))
            },
        },
        Attempt {
            name: "set the clock",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: clock_gettime/clock_settime on a timespec we own;
                // the time set is the time it already is.
                unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
                // SAFETY: as above.
                let r = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
                sys("clock_settime", r.into(), ok("set the clock"))
            },
        },
        Attempt {
            name: "swapon",
            ctl: Ctl::None,
            proof: &[EPERM],
            op: |_| {
                let p = cs("/dev/null");
                sys(
                    "swapon",
                    raw(libc::SYS_swapon, [p.as_ptr() as c_long, 0, 0, 0, 0]),
                    ok("swapon"),
                )
            },
        },
    ]
}
