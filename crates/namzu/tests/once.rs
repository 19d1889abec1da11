//! `LocalProvider::run_once`: one command in a local sandbox made for it,
//! with no agent. Every trial runs on this binary's main thread (the call
//! forks, and refuses a caller with other threads), so the harness is told
//! to use one thread and no trial starts a runtime.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use namzu::backend::local::{LocalProvider, OnceCleanup, OnceIo, OnceOutcome, OnceRequest, UID_BASE};
use namzu::{Error, SandboxSpec};

fn provider(state: &Path) -> LocalProvider {
    // No agent starts: no agent binary is needed.
    LocalProvider::with_agent(state, "")
}

fn req(script: &str) -> OnceRequest {
    OnceRequest {
        command: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    }
}

struct Ran {
    outcome: namzu::Result<OnceOutcome>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

fn run_with(
    p: &LocalProvider,
    spec: SandboxSpec,
    r: OnceRequest,
    stdin: Option<OwnedFd>,
    cancel: Option<&OwnedFd>,
) -> Ran {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let outcome = p.run_once(
        spec,
        r,
        OnceIo {
            stdin,
            stdout: &mut stdout,
            stderr: &mut stderr,
            cancel: cancel.map(|c| c.as_fd()),
        },
    );
    Ran {
        outcome,
        stdout,
        stderr,
    }
}

fn run(p: &LocalProvider, r: OnceRequest) -> Ran {
    run_with(p, SandboxSpec::default(), r, None, None)
}

/// Runs `f` in a forked child that then exits; returns its pid. The
/// trials' helpers (a stdin feeder, a canceller, a run to kill) are
/// processes, never threads: run_once wants this process single-threaded.
fn fork_child(f: impl FnOnce()) -> nix::unistd::Pid {
    #[allow(unsafe_code)]
    // SAFETY: this process has one thread (the harness runs the trials on
    // it), so the child may run ordinary code; it leaves with _exit, which
    // runs none of the parent's exit handlers.
    unsafe {
        match nix::unistd::fork().unwrap() {
            nix::unistd::ForkResult::Child => {
                f();
                libc::_exit(0)
            }
            nix::unistd::ForkResult::Parent { child } => child,
        }
    }
}

/// What the state directory holds of the local tier besides its caches.
fn sandbox_dirs(state: &Path) -> Vec<String> {
    std::fs::read_dir(state.join("local"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sb-"))
                .collect()
        })
        .unwrap_or_default()
}

fn uid_claims(state: &Path) -> usize {
    std::fs::read_dir(state.join("local/.uids"))
        .map(|rd| rd.flatten().filter(|e| e.file_name() != ".lock").count())
        .unwrap_or(0)
}

/// Host pids whose command line is exactly `cmd` (NUL-separated).
fn host_pids(cmd: &[u8]) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmd))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn exit_code_output_and_the_sandbox_it_ran_in() {
    let st = tempfile::tempdir().unwrap();
    let p = provider(st.path());
    let r = OnceRequest {
        env: vec![("GREETING".into(), "hi".into())],
        ..req("echo $GREETING; pwd; hostname; echo oops >&2; \
               grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
               touch /usr/namzu-once 2>/dev/null && echo usr-writable; \
               echo data > /workspace/f && cat /workspace/f; \
               grep -c . /proc/net/dev; exit 7")
    };
    let ran = run(&p, r);
    let outcome = ran.outcome.unwrap();
    assert_eq!(outcome.code, Some(7), "{outcome:?}");
    assert!(!outcome.timed_out && !outcome.cancelled);
    let out = String::from_utf8(ran.stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hi");
    assert_eq!(lines[1], "/workspace");
    assert_eq!(lines[2], "namzu");
    assert!(lines.contains(&"CapEff:\t0000000000000000"), "{out}");
    assert!(lines.contains(&"CapBnd:\t0000000000000000"), "{out}");
    assert!(lines.contains(&"NoNewPrivs:\t1"), "{out}");
    assert!(lines.contains(&"Seccomp:\t2"), "{out}");
    assert!(!out.contains("usr-writable"), "{out}");
    assert!(lines.contains(&"data"), "{out}");
    // Two header lines and loopback: the only interface.
    assert_eq!(lines.last(), Some(&"3"), "{out}");
    assert_eq!(ran.stderr, b"oops\n");
    // Gone with the run: its directory and its id range.
    assert!(sandbox_dirs(st.path()).is_empty(), "{:?}", sandbox_dirs(st.path()));
    assert_eq!(uid_claims(st.path()), 0);
}

fn the_workdir_is_beneath_the_workspace() {
    let st = tempfile::tempdir().unwrap();
    let ran = run(
        &provider(st.path()),
        OnceRequest {
            command: vec!["pwd".into()],
            cwd: Some("/".into()),
            ..Default::default()
        },
    );
    assert_eq!(ran.outcome.unwrap().code, Some(0));
    assert_eq!(ran.stdout, b"/\n");
    // A relative one that does not exist: the start fails, typed.
    let ran = run(
        &provider(st.path()),
        OnceRequest {
            command: vec!["pwd".into()],
            cwd: Some("missing".into()),
            ..Default::default()
        },
    );
    assert!(
        matches!(
            ran.outcome,
            Err(Error::SpawnFailed {
                errno: libc::ENOENT,
                ..
            })
        ),
        "{:?}",
        ran.outcome
    );
}

fn piped_stdin_arrives_byte_exact_and_ends() {
    let st = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (r, w) = rustix::pipe::pipe().unwrap();
    let feeder = fork_child(|| {
        let mut f = std::fs::File::from(w.try_clone().unwrap());
        let _ = std::io::Write::write_all(&mut f, &data);
    });
    drop(w);
    let ran = run_with(&provider(st.path()), SandboxSpec::default(), req("cat"), Some(r), None);
    nix::sys::wait::waitpid(feeder, None).unwrap();
    assert_eq!(ran.outcome.unwrap().code, Some(0));
    assert!(
        ran.stdout == data,
        "got {} bytes, sent {}",
        ran.stdout.len(),
        data.len()
    );
}

fn a_command_that_never_reads_stdin_is_not_held_up_by_it() {
    let st = tempfile::tempdir().unwrap();
    // A stdin that never ends: /dev/zero.
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let t = Instant::now();
    let ran = run_with(
        &provider(st.path()),
        SandboxSpec::default(),
        req("echo done"),
        Some(zero.into()),
        None,
    );
    assert_eq!(ran.outcome.unwrap().code, Some(0));
    assert_eq!(ran.stdout, b"done\n");
    assert!(t.elapsed() < Duration::from_secs(20));
}

fn a_timeout_kills_everything_the_command_started() {
    let st = tempfile::tempdir().unwrap();
    let r = OnceRequest {
        timeout: Some(Duration::from_millis(300)),
        ..req("setsid sleep 2718.5 >/dev/null 2>&1 </dev/null & echo started; sleep 30")
    };
    let ran = run(&provider(st.path()), r);
    let outcome = ran.outcome.unwrap();
    assert!(outcome.timed_out, "{outcome:?}");
    assert_eq!((outcome.code, outcome.signal), (None, Some(libc::SIGKILL)));
    assert_eq!(ran.stdout, b"started\n");
    // Nothing of it runs once run_once returned.
    assert!(host_pids(b"sleep\x002718.5\x00").is_empty());
    assert!(sandbox_dirs(st.path()).is_empty());
}

fn a_cancel_kills_it_and_says_so() {
    let st = tempfile::tempdir().unwrap();
    let (cancel_r, cancel_w) = rustix::pipe::pipe().unwrap();
    // The cancel arrives from another process after the command started.
    let canceller = fork_child(|| {
        std::thread::sleep(Duration::from_millis(300));
        let _ = rustix::io::write(&cancel_w, b"x");
    });
    drop(cancel_w);
    let ran = run_with(
        &provider(st.path()),
        SandboxSpec::default(),
        req("echo up; exec sleep 31415.9"),
        None,
        Some(&cancel_r),
    );
    nix::sys::wait::waitpid(canceller, None).unwrap();
    let outcome = ran.outcome.unwrap();
    assert!(outcome.cancelled && !outcome.timed_out, "{outcome:?}");
    assert_eq!(outcome.signal, Some(libc::SIGKILL));
    assert_eq!(ran.stdout, b"up\n");
    assert!(host_pids(b"sleep\x0031415.9\x00").is_empty());
}

fn a_missing_program_is_a_typed_spawn_failure() {
    let st = tempfile::tempdir().unwrap();
    let ran = run(
        &provider(st.path()),
        OnceRequest {
            command: vec!["no-such-program-here".into()],
            ..Default::default()
        },
    );
    match ran.outcome {
        Err(Error::SpawnFailed { command, errno, .. }) => {
            assert_eq!(command, Path::new("no-such-program-here"));
            assert_eq!(errno, libc::ENOENT);
        }
        other => panic!("{other:?}"),
    }
    assert!(sandbox_dirs(st.path()).is_empty());
}

fn what_needs_an_agent_is_refused_by_name() {
    let st = tempfile::tempdir().unwrap();
    let p = provider(st.path());
    let spec = SandboxSpec {
        egress: namzu::egress::EgressConfig {
            policy: namzu::egress::EgressPolicy::DenyAll,
            ..Default::default()
        },
        ..Default::default()
    };
    let ran = run_with(&p, spec, req("true"), None, None);
    assert!(
        matches!(&ran.outcome, Err(Error::OptionRefused { option, .. }) if option == "egress"),
        "{:?}",
        ran.outcome
    );
    let spec = SandboxSpec {
        limits: vec![("max_execs".into(), 3)],
        ..Default::default()
    };
    let ran = run_with(&p, spec, req("true"), None, None);
    assert!(
        matches!(&ran.outcome, Err(Error::OptionRefused { option, .. }) if option == "limits"),
        "{:?}",
        ran.outcome
    );
    // Nothing was made for them.
    assert!(sandbox_dirs(st.path()).is_empty());
}

fn a_caller_with_other_threads_is_refused() {
    let st = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let ran = run(&provider(st.path()), req("true"));
    tx.send(()).unwrap();
    other.join().unwrap();
    assert!(
        matches!(&ran.outcome, Err(Error::InvalidArgument { message, .. }) if message.contains("threads")),
        "{:?}",
        ran.outcome
    );
    assert!(sandbox_dirs(st.path()).is_empty());
}

fn detached_cleanup_removes_the_rest_after_returning() {
    let st = tempfile::tempdir().unwrap();
    let ran = run(
        &provider(st.path()),
        OnceRequest {
            cleanup: OnceCleanup::Detached,
            ..req("echo x > /workspace/left")
        },
    );
    assert_eq!(ran.outcome.unwrap().code, Some(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(sandbox_dirs(st.path()).is_empty() && uid_claims(st.path()) == 0) {
        assert!(Instant::now() < deadline, "left behind: {:?}", sandbox_dirs(st.path()));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The forked cleaner and the namespaces' holder are this process's
    // children: reaped here so the next trial starts clean.
    while nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)).is_ok_and(|s| s.pid().is_some()) {}
}

fn gc_removes_what_a_dead_run_left() {
    let st = tempfile::tempdir().unwrap();
    let p = provider(st.path());
    // A run whose process is killed mid-run: a child that runs one.
    let child = fork_child(|| {
        let _ = run(&p, req("sleep 1000"));
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while host_pids(b"sleep\x001000\x00").is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let dirs = sandbox_dirs(st.path());
    assert_eq!(dirs.len(), 1);
    nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).unwrap();
    nix::sys::wait::waitpid(child, None).unwrap();
    // Its sandbox died with it; its directory (and id range) are left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host_pids(b"sleep\x001000\x00").is_empty() {
        assert!(Instant::now() < deadline, "the sandbox outlived its process");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(sandbox_dirs(st.path()), dirs);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let removed = rt.block_on(namzu::Provider::gc(&p)).unwrap();
    drop(rt);
    assert_eq!(removed, dirs);
    assert!(sandbox_dirs(st.path()).is_empty());
    assert_eq!(uid_claims(st.path()), 0);
}

/// The spec's process limit holds in a one-command sandbox as in a served
/// one: its cgroup stops a command starting more (where the host offers a
/// writable hierarchy; elsewhere the option is refused by name).
fn the_process_limit_holds() {
    let st = tempfile::tempdir().unwrap();
    let limited = |pids: Option<u64>| SandboxSpec {
        resources: namzu::Resources {
            pids,
            ..Default::default()
        },
        ..Default::default()
    };
    // Forty background sleeps, then how many run: a shell that cannot fork
    // says so and stops.
    let script = "i=0; while [ $i -lt 40 ]; do sleep 30.5 & i=$((i+1)); done; \
                  for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -c '^sleep 30[.]5'";
    // Without a limit, the script does what it says.
    let free = run_with(&provider(st.path()), limited(None), req(script), None, None);
    assert_eq!(free.outcome.unwrap().code, Some(0));
    assert_eq!(String::from_utf8_lossy(&free.stdout).trim(), "40");
    let ran = run_with(&provider(st.path()), limited(Some(16)), req(script), None, None);
    if !nix::unistd::geteuid().is_root() {
        assert!(
            matches!(&ran.outcome, Err(Error::OptionRefused { option, .. }) if option.starts_with("resources.")),
            "{:?}",
            ran.outcome
        );
        return;
    }
    let outcome = ran.outcome.unwrap();
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_ne!(outcome.code, Some(0), "40 processes started under pids 16");
    assert!(stderr.to_ascii_lowercase().contains("fork"), "{stderr}");
    assert!(host_pids(b"sleep\x0030.5\x00").is_empty());
    assert!(sandbox_dirs(st.path()).is_empty());
}

fn as_root_it_runs_in_an_id_range_of_its_own() {
    let st = tempfile::tempdir().unwrap();
    let ran = run(&provider(st.path()), req("cat /proc/self/uid_map"));
    assert_eq!(ran.outcome.unwrap().code, Some(0));
    let map = String::from_utf8(ran.stdout).unwrap();
    let f: Vec<u64> = map.split_whitespace().map(|v| v.parse().unwrap()).collect();
    if nix::unistd::geteuid().is_root() {
        assert_eq!(f[0], 0);
        assert!(f[1] >= u64::from(UID_BASE), "{map}");
        assert_eq!(f[2], 65_536);
    } else {
        assert_eq!(f, [0, u64::from(nix::unistd::geteuid().as_raw()), 1]);
    }
}

fn main() -> std::process::ExitCode {
    let mut args = libtest_mimic::Arguments::from_args();
    // The trials fork: they run one at a time on this (the only) thread.
    args.test_threads = Some(1);
    let t = |name: &'static str, f: fn()| {
        libtest_mimic::Trial::test(name, move || {
            std::panic::catch_unwind(f).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default()
                    .into()
            })
        })
    };
    let trials = vec![
        t(
            "exit_code_output_and_the_sandbox_it_ran_in",
            exit_code_output_and_the_sandbox_it_ran_in,
        ),
        t(
            "the_workdir_is_beneath_the_workspace",
            the_workdir_is_beneath_the_workspace,
        ),
        t(
            "piped_stdin_arrives_byte_exact_and_ends",
            piped_stdin_arrives_byte_exact_and_ends,
        ),
        t(
            "a_command_that_never_reads_stdin_is_not_held_up_by_it",
            a_command_that_never_reads_stdin_is_not_held_up_by_it,
        ),
        t(
            "a_timeout_kills_everything_the_command_started",
            a_timeout_kills_everything_the_command_started,
        ),
        t("a_cancel_kills_it_and_says_so", a_cancel_kills_it_and_says_so),
        t(
            "a_missing_program_is_a_typed_spawn_failure",
            a_missing_program_is_a_typed_spawn_failure,
        ),
        t(
            "what_needs_an_agent_is_refused_by_name",
            what_needs_an_agent_is_refused_by_name,
        ),
        t(
            "a_caller_with_other_threads_is_refused",
            a_caller_with_other_threads_is_refused,
        ),
        t(
            "detached_cleanup_removes_the_rest_after_returning",
            detached_cleanup_removes_the_rest_after_returning,
        ),
        t("the_process_limit_holds", the_process_limit_holds),
        t(
            "as_root_it_runs_in_an_id_range_of_its_own",
            as_root_it_runs_in_an_id_range_of_its_own,
        ),
        // Last: it starts a runtime, whose threads may linger.
        t("gc_removes_what_a_dead_run_left", gc_removes_what_a_dead_run_left),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
