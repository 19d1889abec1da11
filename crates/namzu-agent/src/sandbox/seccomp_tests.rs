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
    let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
    let mut pc = 0usize;
    loop {
        let i = &prog[pc];
        pc += 1;
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
            0x06 => return if i.code & 0x18 == 0x10 { a } else { k },
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
/// < KILL_THREAD < TRAP < ERRNO < … < ALLOW), compared as signed.
fn combined(d: &Data) -> u32 {
    filters()
        .unwrap()
        .iter()
        .map(|f| run(f, d))
        .min_by_key(|r| (*r & libc::SECCOMP_RET_ACTION_FULL) as i32)
        .unwrap()
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
