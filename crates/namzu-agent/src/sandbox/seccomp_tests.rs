//! The compiled filters, evaluated as the kernel would: a classic-BPF
//! interpreter over `seccomp_data`, every installed program run, and the
//! most restrictive action kept. This is how the x32 rule is proven where
//! the kernel has x32 compiled out (calls then fail with ENOSYS whatever
//! the filter says, so an in-sandbox attempt alone proves nothing).

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;

/// `struct seccomp_data` as the filter reads it.
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    fn word(&self, off: u32) -> u32 {
        match off {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction_pointer
            o if (16..64).contains(&o) && o % 4 == 0 => {
                let arg = self.args[((o - 16) / 8) as usize];
                if (o - 16) % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            o => panic!("load at offset {o}"),
        }
    }
}

/// Runs one program; panics on an instruction it does not know (so a new
/// construct in seccompiler's output cannot pass unevaluated).
fn run(prog: &[seccompiler::sock_filter], d: &Data) -> u32 {
    run_counted(prog, d).0
}

/// As [`run`], with how many instructions ran.
fn run_counted(prog: &[seccompiler::sock_filter], d: &Data) -> (u32, usize) {
    let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
    let mut pc = 0usize;
    let mut steps = 0;
    loop {
        let i = &prog[pc];
        pc += 1;
        steps += 1;
        let (class, k) = (i.code & 0x07, i.k);
        match class {
            0x00 => match i.code {
                0x20 => a = d.word(k),
                0x00 => a = k,
                0x60 => a = mem[k as usize],
                c => panic!("ld {c:#x}"),
            },
            0x01 => match i.code {
                0x01 => x = k,
                0x61 => x = mem[k as usize],
                c => panic!("ldx {c:#x}"),
            },
            0x02 => mem[k as usize] = a,
            0x03 => mem[k as usize] = x,
            0x04 => {
                let v = if i.code & 0x08 != 0 { x } else { k };
                a = match i.code & 0xf0 {
                    0x00 => a.wrapping_add(v),
                    0x10 => a.wrapping_sub(v),
                    0x40 => a | v,
                    0x50 => a & v,
                    0x60 => a << v,
                    0x70 => a >> v,
                    c => panic!("alu {c:#x}"),
                };
            }
            0x05 => {
                let v = if i.code & 0x08 != 0 { x } else { k };
                let taken = match i.code & 0xf0 {
                    0x00 => {
                        pc += k as usize;
                        continue;
                    }
                    0x10 => a == v,
                    0x20 => a > v,
                    0x30 => a >= v,
                    0x40 => a & v != 0,
                    c => panic!("jmp {c:#x}"),
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            0x06 => return (if i.code & 0x18 == 0x10 { a } else { k }, steps),
            0x07 => {
                if i.code == 0x07 {
                    x = a
                } else {
                    a = x
                }
            }
            _ => unreachable!(),
        }
    }
}

/// The kernel's precedence: the lowest action value wins (KILL_PROCESS
/// < KILL_THREAD < TRAP < ERRNO < … < ALLOW), compared as signed; between
/// equals, the filter installed last (run first).
fn combined_of(progs: &[BpfProgram], d: &Data) -> u32 {
    progs
        .iter()
        .rev()
        .map(|f| run(f, d))
        .min_by_key(|r| (*r & libc::SECCOMP_RET_ACTION_FULL) as i32)
        .unwrap()
}

fn combined(d: &Data) -> u32 {
    combined_of(&filters().unwrap(), d)
}

/// The filters as seccompiler alone made them before the number rules got
/// a search of their own: one chain for every EPERM rule, one for clone3,
/// and the x32 guard, each its own program. The oracle for
/// [`the_searched_filters_answer_every_call_as_the_chained_ones_did`].
fn chained() -> Vec<BpfProgram> {
    let mut eperm = arg_rules().unwrap();
    for (_, nr) in denied_syscalls() {
        eperm.insert(nr, vec![]);
    }
    let clone3 = [(libc::SYS_clone3, vec![])].into_iter().collect();
    let mut all = vec![
        compile(clone3, libc::ENOSYS).unwrap(),
        compile(eperm, libc::EPERM).unwrap(),
    ];
    if cfg!(target_arch = "x86_64") {
        let op = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
        all.push(vec![
            op(0x20, 0, 0, 4),
            op(0x15, 1, 0, 0xc000_003e),
            op(0x06, 0, 0, libc::SECCOMP_RET_ALLOW),
            op(0x20, 0, 0, 0),
            op(0x35, 0, 1, X32_SYSCALL_BIT),
            op(0x06, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
            op(0x06, 0, 0, libc::SECCOMP_RET_ALLOW),
        ]);
    }
    all
}

const X86_64: u32 = 0xc000_003e;

fn call(nr: i64, args: [u64; 6]) -> u32 {
    combined(&Data {
        nr: nr as u32,
        arch: X86_64,
        args,
    })
}

fn errno(action: u32) -> Option<u32> {
    (action & libc::SECCOMP_RET_ACTION_FULL == libc::SECCOMP_RET_ERRNO).then_some(action & libc::SECCOMP_RET_DATA)
}

#[test]
fn the_interpreter_agrees_with_the_filter_on_native_calls() {
    // Controls: the evaluator sees the rules the sandbox relies on.
    assert_eq!(errno(call(libc::SYS_ptrace, [0; 6])), Some(libc::EPERM as u32));
    assert_eq!(errno(call(libc::SYS_clone3, [0; 6])), Some(libc::ENOSYS as u32));
    assert_eq!(
        errno(call(libc::SYS_clone, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0])),
        Some(libc::EPERM as u32)
    );
    assert_eq!(
        call(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
        libc::SECCOMP_RET_ALLOW
    );
    assert_eq!(call(libc::SYS_read, [0; 6]), libc::SECCOMP_RET_ALLOW);
    // Another arch (i386 through int 0x80) kills.
    let i386 = combined(&Data {
        nr: 26,
        arch: 0x4000_0003,
        args: [0; 6],
    });
    assert_eq!(i386 & libc::SECCOMP_RET_ACTION_FULL, libc::SECCOMP_RET_KILL_PROCESS);
}

/// Audit item 5: `nr | 0x40000000` of every denied call, and every x32
/// number at all, answers ENOSYS — none falls through to Allow.
#[cfg(target_arch = "x86_64")]
#[test]
fn x32_syscalls_are_denied_by_the_compiled_filters() {
    for (name, nr) in denied_syscalls() {
        let got = call(nr | i64::from(X32_SYSCALL_BIT), [0; 6]);
        assert_eq!(errno(got), Some(libc::ENOSYS as u32), "x32 {name}: action {got:#x}");
    }
    // x32's own numbers (512..547: its compat calls, ptrace 521,
    // process_vm_readv 539, kexec_load 528 among them) and clone/socket
    // with the flags the native rules look at.
    for nr in (512..=547).chain([libc::SYS_clone, libc::SYS_socket, libc::SYS_read]) {
        let got = call(
            nr | i64::from(X32_SYSCALL_BIT),
            [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
        );
        assert_eq!(errno(got), Some(libc::ENOSYS as u32), "x32 nr {nr}: {got:#x}");
    }
}

/// Audit item 11: vsock is not network-namespaced; a socket of that family
/// is refused, any type; other families are not.
#[test]
fn vsock_sockets_are_refused_and_others_are_not() {
    for ty in [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET] {
        let got = call(libc::SYS_socket, [libc::AF_VSOCK as u64, ty as u64, 0, 0, 0, 0]);
        assert_eq!(errno(got), Some(libc::EPERM as u32), "type {ty}");
    }
    for fam in [libc::AF_INET, libc::AF_INET6, libc::AF_UNIX] {
        let got = call(libc::SYS_socket, [fam as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]);
        assert_eq!(got, libc::SECCOMP_RET_ALLOW, "family {fam}");
    }
}

/// Every syscall number (native, x32, out of range) on each arch, with the
/// arguments the rules look at and some they do not: the searched filters
/// answer exactly as the chained ones did, so a wrong jump in the search
/// cannot let a denied call through, nor deny an allowed one.
#[test]
fn the_searched_filters_answer_every_call_as_the_chained_ones_did() {
    let (now, before) = (filters().unwrap(), chained());
    let mut args: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6], [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]];
    args.extend(
        CLONE_NS_FLAGS
            .iter()
            .map(|&f| [f | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
    );
    args.push([libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]);
    for kind in [libc::S_IFCHR, libc::S_IFBLK, libc::S_IFREG, libc::S_IFIFO] {
        let mode = u64::from(kind | 0o600);
        args.push([0, mode, 0, 0, 0, 0]);
        args.push([libc::AT_FDCWD as u64, 0, mode, 0, 0, 0]);
    }
    let mut checked = 0;
    for arch in [0xc000_003e, 0x4000_0003, 0xc000_00b7] {
        for nr in (0..1100u32)
            .chain((0..1100).map(|n| n | X32_SYSCALL_BIT))
            .chain([u32::MAX, 0x8000_0000])
        {
            for a in &args {
                let d = Data { nr, arch, args: *a };
                assert_eq!(
                    combined_of(&now, &d),
                    combined_of(&before, &d),
                    "arch {arch:#x} nr {nr:#x} args {a:x?}"
                );
                checked += 1;
            }
        }
    }
    // Controls: the walk covered denials, ENOSYS and allows alike.
    assert!(checked > 100_000);
    let ptrace = Data {
        nr: libc::SYS_ptrace as u32,
        arch: 0xc000_003e,
        args: [0; 6],
    };
    assert_eq!(errno(combined_of(&now, &ptrace)), Some(libc::EPERM as u32));
    // And the search is a search: no call runs more than a few
    // comparisons of it, where the chain ran one per denied syscall.
    let deepest = |prog: &[seccompiler::sock_filter]| {
        (0..1100)
            .map(|nr| {
                run_counted(
                    prog,
                    &Data {
                        nr,
                        arch: 0xc000_003e,
                        args: [0; 6],
                    },
                )
                .1
            })
            .max()
            .unwrap()
    };
    let (searched, chain) = (deepest(&deny_filter().unwrap()), deepest(&before[1]));
    assert!(
        searched <= 16 && chain > denied_syscalls().len(),
        "{searched} against {chain}"
    );
}
