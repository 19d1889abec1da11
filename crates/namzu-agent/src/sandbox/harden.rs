//! Hardening applied by G to itself after the root is built, and so
//! inherited by every command it starts:
//!
//! 1. rlimits from the spec (NOFILE, FSIZE, CORE, NPROC);
//! 2. not dumpable: commands (same uid, no capabilities) cannot ptrace the
//!    agent or read its /proc files (memory, environment, fds);
//! 3. no_new_privs: no setuid or file-capability gain on exec;
//! 4. landlock: read and execute anywhere in the sandbox, write only where
//!    the sandbox's own writable mounts are;
//! 5. every capability set emptied: bounding, ambient, inheritable,
//!    permitted, effective;
//! 6. seccomp: the syscalls Docker's default profile withholds from an
//!    unprivileged container, plus new namespaces, keyrings, bpf, perf,
//!    userfaultfd, kexec, modules, the whole mount family and io_uring,
//!    all answering EPERM, as does `socket(AF_VSOCK)` (vsock is not
//!    network-namespaced: it would reach the host's and other guests'
//!    vsock services); `clone3` answers ENOSYS so libc falls back to
//!    `clone`, whose namespace flags the filter can see; on x86_64 every
//!    x32-ABI syscall (`nr | 0x40000000`, same audit arch) answers ENOSYS,
//!    since the per-number rules above would not match it.
//!
//! What was applied is reported in Health (`hardening`).

use std::collections::BTreeMap;

use namzu_proto::launch::{LaunchSpec, Rlimit};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    #[error("rlimit {which}: {source}")]
    Rlimit {
        which: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("{step}: {source}")]
    Prctl {
        step: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("landlock: {0}")]
    Landlock(String),
    #[error("landlock is not enforced by this kernel")]
    LandlockNotEnforced,
    #[error("capabilities: {0}")]
    Caps(String),
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// Paths commands (and the agent) may write beneath.
pub const WRITABLE: &[&str] = &["/workspace", "/tmp", "/run", "/home", "/root", "/dev", "/proc"];

/// Syscalls that answer EPERM inside the sandbox.
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    vec![
        ("acct", libc::SYS_acct),
        ("add_key", libc::SYS_add_key),
        ("bpf", libc::SYS_bpf),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("clock_settime", libc::SYS_clock_settime),
        ("delete_module", libc::SYS_delete_module),
        ("finit_module", libc::SYS_finit_module),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fsopen", libc::SYS_fsopen),
        ("fspick", libc::SYS_fspick),
        ("init_module", libc::SYS_init_module),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("ioperm", libc::SYS_ioperm),
        ("iopl", libc::SYS_iopl),
        ("kcmp", libc::SYS_kcmp),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("kexec_load", libc::SYS_kexec_load),
        ("keyctl", libc::SYS_keyctl),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
        ("mount", libc::SYS_mount),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("move_mount", libc::SYS_move_mount),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("nfsservctl", libc::SYS_nfsservctl),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("open_tree", libc::SYS_open_tree),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("pivot_root", libc::SYS_pivot_root),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("ptrace", libc::SYS_ptrace),
        ("quotactl", libc::SYS_quotactl),
        ("reboot", libc::SYS_reboot),
        ("request_key", libc::SYS_request_key),
        ("setns", libc::SYS_setns),
        ("settimeofday", libc::SYS_settimeofday),
        ("swapoff", libc::SYS_swapoff),
        ("swapon", libc::SYS_swapon),
        ("syslog", libc::SYS_syslog),
        ("sysfs", libc::SYS_sysfs),
        ("_sysctl", libc::SYS__sysctl),
        ("umount2", libc::SYS_umount2),
        ("unshare", libc::SYS_unshare),
        ("uselib", libc::SYS_uselib),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("ustat", libc::SYS_ustat),
        ("vhangup", libc::SYS_vhangup),
    ]
}

/// `clone` flags that would create a namespace.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

fn arch() -> Result<seccompiler::TargetArch, HardenError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| HardenError::Seccomp(e.to_string()))
}

/// The argument rules, compiled by seccompiler: `clone` with a namespace
/// flag, `socket(AF_VSOCK)` and the making of device nodes answer EPERM.
/// Four syscalls: the chain seccompiler makes stays short.
pub fn args_filter() -> Result<BpfProgram, HardenError> {
    compile(arg_rules()?, libc::EPERM)
}

/// Compiles `rules` with seccompiler: a match answers `errno`, anything
/// else is allowed, another arch kills.
fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, HardenError> {
    let se = |e: seccompiler::BackendError| HardenError::Seccomp(e.to_string());
    let filter =
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch()?).map_err(se)?;
    filter.try_into().map_err(se)
}

/// [`args_filter`]'s rules, by syscall number.
fn arg_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, HardenError> {
    let se = |e: seccompiler::BackendError| HardenError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let clone_rules = CLONE_NS_FLAGS
        .iter()
        .map(|&flag| {
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .map_err(se)?])
            .map_err(se)
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::AF_VSOCK as u64,
        )
        .map_err(se)?])
        .map_err(se)?],
    );
    // Device nodes: Linux already wants CAP_MKNOD, gVisor does not; a
    // command has no business making one either way.
    for (nr, mode_arg) in [(libc::SYS_mknod, 1), (libc::SYS_mknodat, 2)] {
        let device_rules = [libc::S_IFCHR, libc::S_IFBLK]
            .iter()
            .map(|&kind| {
                SeccompRule::new(vec![SeccompCondition::new(
                    mode_arg,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(u64::from(libc::S_IFMT)),
                    u64::from(kind),
                )
                .map_err(se)?])
                .map_err(se)
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(nr, device_rules);
    }
    Ok(rules)
}

/// The bit that marks an x32-ABI syscall number on x86_64.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The audit arch of this build's native syscalls.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// The number rules, as one program: another arch kills the process; on
/// x86_64 every x32-ABI number (`nr | 0x40000000`, same audit arch, which
/// no per-number rule would match) answers ENOSYS; `clone3` answers ENOSYS
/// (its flags live in memory a filter cannot read, and libc falls back to
/// `clone` on ENOSYS); each of [`denied_syscalls`] answers EPERM, found by
/// a binary search; everything else is allowed.
///
/// Written here rather than by seccompiler, which chains one comparison
/// per syscall: the kernel runs each new filter once for every syscall
/// number as it installs it (to cache which numbers it always allows), so
/// the cost of a chain of fifty lands on every sandbox's start.
pub fn deny_filter() -> Result<BpfProgram, HardenError> {
    let mut nrs: Vec<u32> = denied_syscalls()
        .into_iter()
        .map(|(name, nr)| u32::try_from(nr).map_err(|_| HardenError::Seccomp(format!("{name}: number {nr}"))))
        .collect::<Result<_, _>>()?;
    nrs.sort_unstable();
    nrs.dedup();
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let mut prog = vec![
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 1, 0, AUDIT_ARCH),
        op(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
    ];
    if cfg!(target_arch = "x86_64") {
        prog.extend([op(JGE_K, 0, 1, X32_SYSCALL_BIT), op(RET_K, 0, 0, enosys)]);
    }
    let clone3 = u32::try_from(libc::SYS_clone3).map_err(|_| HardenError::Seccomp("clone3's number".into()))?;
    prog.extend([op(JEQ_K, 0, 1, clone3), op(RET_K, 0, 0, enosys)]);
    search(&nrs, &mut prog)?;
    Ok(prog)
}

/// Appends a search of the sorted `nrs` for the number in A: EPERM when it
/// is one of them, Allow otherwise. Each leaf returns itself, so every
/// jump is forward past a subtree, never to a shared end.
fn search(nrs: &[u32], prog: &mut BpfProgram) -> Result<(), HardenError> {
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    match nrs {
        [] => prog.push(op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW)),
        [nr] => prog.extend([
            op(JEQ_K, 0, 1, *nr),
            op(RET_K, 0, 0, eperm),
            op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ]),
        _ => {
            let (below, from) = nrs.split_at(nrs.len() / 2);
            let at = prog.len();
            prog.push(op(JGE_K, 0, 0, from[0]));
            search(below, prog)?;
            prog[at].jt = u8::try_from(prog.len() - at - 1)
                .map_err(|_| HardenError::Seccomp("too many denied syscalls for one BPF jump".into()))?;
            search(from, prog)?;
        }
    }
    Ok(())
}

/// Every filter [`apply_seccomp`] installs, in installation order.
pub fn filters() -> Result<Vec<BpfProgram>, HardenError> {
    Ok(vec![deny_filter()?, args_filter()?])
}

/// The Landlock ABI the running kernel offers (0: none).
pub fn landlock_abi() -> i64 {
    #[allow(unsafe_code)]
    // SAFETY: with a null attribute, size 0 and the VERSION flag (1) the
    // syscall only returns the ABI number; no memory is read or written.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    }
    .max(0)
}

/// Landlock: read anywhere, write beneath [`WRITABLE`] and the targets of
/// the spec's writable binds (a host path shown read-write is a writable
/// mount of the sandbox's like its workspace).
fn apply_landlock(spec: &LaunchSpec) -> Result<String, HardenError> {
    use landlock::{Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, ABI};
    let le = |e: landlock::RulesetError| HardenError::Landlock(e.to_string());
    let abi = ABI::V5;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(le)?
        .create()
        .map_err(le)?
        .add_rules(landlock::path_beneath_rules(["/"], AccessFs::from_read(abi)))
        .map_err(le)?
        .add_rules(landlock::path_beneath_rules(WRITABLE, AccessFs::from_all(abi)))
        .map_err(le)?
        .add_rules(landlock::path_beneath_rules(
            spec.binds.iter().filter(|b| b.writable).map(|b| b.target.as_str()),
            AccessFs::from_all(abi),
        ))
        .map_err(le)?
        .restrict_self()
        .map_err(le)?;
    let how = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced",
        RulesetStatus::NotEnforced => return Err(HardenError::LandlockNotEnforced),
    };
    Ok(format!("kernel abi {}, {how}", landlock_abi()))
}

fn drop_all_caps() -> Result<(), HardenError> {
    use caps::CapSet;
    let ce = |e: caps::errors::CapsError| HardenError::Caps(e.to_string());
    caps::clear(None, CapSet::Ambient).map_err(ce)?;
    // Bounding first: dropping it needs CAP_SETPCAP, which goes with the rest.
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(ce)?;
    }
    caps::clear(None, CapSet::Inheritable).map_err(ce)?;
    caps::clear(None, CapSet::Effective).map_err(ce)?;
    caps::clear(None, CapSet::Permitted).map_err(ce)?;
    Ok(())
}

/// Sets each limit (soft = hard) on this process and so on everything it
/// starts. Returns what was set, for Health.
pub fn set_rlimits(rlimits: &[Rlimit]) -> Result<Vec<(String, String)>, HardenError> {
    use nix::sys::resource::{setrlimit, Resource};
    let mut report = Vec::new();
    for r in rlimits {
        let (which, res, v) = match *r {
            Rlimit::Nofile(v) => ("NOFILE", Resource::RLIMIT_NOFILE, v),
            Rlimit::Fsize(v) => ("FSIZE", Resource::RLIMIT_FSIZE, v),
            Rlimit::Core(v) => ("CORE", Resource::RLIMIT_CORE, v),
            Rlimit::Nproc(v) => ("NPROC", Resource::RLIMIT_NPROC, v),
        };
        setrlimit(res, v, v).map_err(|source| HardenError::Rlimit { which, source })?;
        report.push((format!("rlimit.{}", which.to_ascii_lowercase()), v.to_string()));
    }
    Ok(report)
}

/// Applies every step, in order. Returns what was applied, for Health.
pub fn apply(spec: &LaunchSpec) -> Result<Vec<(String, String)>, HardenError> {
    let mut report = set_rlimits(&spec.rlimits)?;
    let pe = |step| move |source| HardenError::Prctl { step, source };
    nix::sys::prctl::set_dumpable(false).map_err(pe("set non-dumpable"))?;
    nix::sys::prctl::set_no_new_privs().map_err(pe("no_new_privs"))?;
    report.push(("no_new_privs".into(), "1".into()));
    use super::weaken::{in_spec, REMOVED};
    for (layer, key) in [("readonly", "mounts.read-only"), ("etc", "etc.curated")] {
        if in_spec(spec, layer) {
            report.push((key.into(), REMOVED.into()));
        }
    }
    if in_spec(spec, "landlock") {
        report.push(("landlock".into(), REMOVED.into()));
    } else {
        report.push(("landlock".into(), apply_landlock(spec)?));
    }
    crate::timeline::mark("harden.landlock");
    if in_spec(spec, "probe-bait") {
        report.push(("capabilities".into(), REMOVED.into()));
    } else {
        drop_all_caps()?;
        report.push(("capabilities".into(), "none (all five sets empty)".into()));
    }
    crate::timeline::mark("harden.capabilities");
    if in_spec(spec, "seccomp") {
        apply_allow_all()?;
        report.push(("seccomp".into(), REMOVED.into()));
    } else {
        report.push(("seccomp".into(), apply_seccomp()?));
    }
    report.push(("namespaces".into(), "user,mnt,pid,ipc,uts,net,cgroup".into()));
    Ok(report)
}

/// Installs namzu's own seccomp filters on this process (and so on every
/// command it starts), stacked on whatever filter is already there: the
/// kernel answers with the most restrictive. Needs no_new_privs set.
pub fn apply_seccomp() -> Result<String, HardenError> {
    let se = |e: seccompiler::Error| HardenError::Seccomp(e.to_string());
    let all = filters()?;
    crate::timeline::mark("harden.seccomp-compiled");
    for f in &all {
        seccompiler::apply_filter(f).map_err(se)?;
    }
    Ok(format!(
        "{} syscalls EPERM, clone with namespace flags EPERM, socket(AF_VSOCK) EPERM, clone3 ENOSYS{}",
        denied_syscalls().len(),
        if cfg!(target_arch = "x86_64") {
            ", x32 ABI ENOSYS"
        } else {
            ""
        }
    ))
}

/// A filter that allows everything: what the layer-removal test installs
/// in place of [`apply_seccomp`]'s (a test build only; see `weaken`).
pub fn apply_allow_all() -> Result<(), HardenError> {
    // BPF_RET|BPF_K: one instruction, allow.
    let prog: BpfProgram = vec![seccompiler::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    seccompiler::apply_filter(&prog).map_err(|e| HardenError::Seccomp(e.to_string()))
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod seccomp_tests;

/// Brings up `lo` in the new network namespace (it starts down).
pub fn loopback_up() -> std::io::Result<()> {
    let sock = rustix::net::socket(rustix::net::AddressFamily::INET, rustix::net::SocketType::DGRAM, None)?;
    let mut ifr: libc::ifreq = zeroed_ifreq();
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    #[allow(unsafe_code)]
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write only `ifr`, a valid,
    // initialised ifreq that outlives both calls.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn zeroed_ifreq() -> libc::ifreq {
    #[allow(unsafe_code)]
    // SAFETY: ifreq is a plain C struct of integers and arrays (and a union
    // of them); all-zero is a valid value.
    unsafe {
        std::mem::zeroed()
    }
}
