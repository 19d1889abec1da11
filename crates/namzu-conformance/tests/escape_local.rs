//! The escape suite on the `local` tier. Every attempt must fail; the
//! summary line `escape suite (local): N attempted, 0 succeeded` is printed
//! for CI. Needs the workspace binaries built (`cargo build --workspace
//! --bins`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::local::{LocalOptions, LocalProvider, UID_BASE};
use namzu::{ExecRequest, Provider};
use namzu_conformance::escape::{self, suite};
use namzu_conformance::Factory;

const TMPFS: u64 = 32 << 20;
const MAX_FILE: u64 = 64 << 20;
const MAX_PROCS: u64 = 256;

fn factory(opts: LocalOptions) -> Factory {
    let state: PathBuf = std::env::temp_dir().join(format!("namzu-escape-local-{}", std::process::id()));
    let provider = Arc::new(LocalProvider::new(state).map(|p| p.options(opts)));
    Arc::new(move |spec| {
        let provider = provider.clone();
        Box::pin(async move {
            match provider.as_ref() {
                Ok(p) => p.create(spec).await,
                Err(e) => Err(namzu::Error::AgentStart {
                    id: String::new(),
                    reason: e.to_string(),
                }),
            }
        })
    })
}

fn trial(
    name: &'static str,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> + Send + 'static,
) -> Trial {
    Trial::test(name, move || {
        let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
        rt.block_on(f()).map_err(Failed::from)
    })
}

/// What the local tier must show: everything proven but what this host
/// lacks, and the kernel's own invariants listed apart.
const LOCAL: suite::Expect = suite::Expect {
    host_may_lack: suite::HOST_MAY_LACK,
    invariants: suite::LOCAL_INVARIANTS,
    known_gaps: &[],
    tier_lacks: &[],
};

async fn attempts() -> Result<(), String> {
    let f = factory(LocalOptions::default());
    let report = suite::run(&f, Default::default()).await?;
    suite::print(&report, "local", &LOCAL);
    suite::check(&report, &LOCAL)
}

/// The same attempts in a one-command sandbox (`namzu run` with nothing
/// allowed out: no agent serves in it), made by the CLI from a process of
/// its own (it forks, so it must be single-threaded; this one is not).
fn once_attempts() -> Result<(), String> {
    let (mut targets, control) = suite::prepare()?;
    let escape_bin = escape::escape_binary()?;
    let cli = escape_bin.with_file_name("namzu");
    // The attempts' binary, alone in a directory shown read-only.
    let tools = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::copy(&escape_bin, tools.path().join("escape")).map_err(|e| e.to_string())?;
    let state = std::env::temp_dir().join(format!("namzu-escape-once-{}", std::process::id()));
    let out = std::process::Command::new(&cli)
        .env("NAMZU_STATE_DIR", &state)
        .arg("run")
        .arg("--bind")
        .arg(format!("{}:{}", targets.ro_host().display(), suite::RO_TARGET))
        .arg("--bind")
        .arg(format!("{}:/mnt/namzu-escape", tools.path().display()))
        .arg("--")
        .arg("/mnt/namzu-escape/escape")
        .args(targets.inside_args(None))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", cli.display()))?;
    let inside = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "namzu run failed: {:?}\n{inside}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report = suite::finish(&mut targets, &control, &inside, Default::default())?;
    suite::print(&report, "local, one-command sandbox", &LOCAL);
    suite::check(&report, &LOCAL)
}

/// Health reports what was applied: the landlock ABI the kernel gave, the
/// seccomp filter, the empty capability sets.
async fn hardening_is_reported() -> Result<(), String> {
    let f = factory(LocalOptions::default());
    namzu_conformance::util::with_sandbox(&f, Default::default(), |sb| async move {
        let h = sb.agent().info().hardening.clone();
        let landlock = h.get("landlock").cloned().unwrap_or_default();
        if !(landlock.starts_with("kernel abi ") && landlock.contains("enforced")) {
            return Err(format!("landlock not reported: {h:?}"));
        }
        let abi: u32 = landlock
            .trim_start_matches("kernel abi ")
            .split(',')
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        if abi == 0 {
            return Err(format!("landlock abi unknown: {landlock}"));
        }
        for key in ["seccomp", "capabilities", "no_new_privs", "namespaces", "rlimit.nproc"] {
            if !h.contains_key(key) {
                return Err(format!("{key} not reported: {h:?}"));
            }
        }
        Ok(())
    })
    .await
}

/// The sandbox's processes, seen from the host, hold no host root and no
/// capabilities.
async fn unprivileged_on_the_host() -> Result<(), String> {
    let f = factory(LocalOptions::default());
    namzu_conformance::util::with_sandbox(&f, Default::default(), |sb| async move {
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell("echo go; exec sleep 7.1234"))
            .await
            .map_err(|e| e.to_string())?;
        let _ = s.next().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let euid = nix::unistd::geteuid().as_raw();
        let mut seen = 0;
        for e in std::fs::read_dir("/proc").map_err(|e| e.to_string())?.flatten() {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if cmd != b"sleep\x007.1234\x00" {
                continue;
            }
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            for line in status.lines() {
                if let Some(ids) = line.strip_prefix("Uid:").or(line.strip_prefix("Gid:")) {
                    for id in ids.split_whitespace() {
                        let id: u32 = id.parse().map_err(|_| format!("bad id line {line}"))?;
                        let ok = if euid == 0 {
                            id >= UID_BASE
                        } else {
                            id == euid || line.starts_with("Gid:")
                        };
                        if !ok {
                            return Err(format!("sandbox process runs as host id {id} ({line})"));
                        }
                    }
                }
                if let Some(v) = line.strip_prefix("CapEff:") {
                    if v.trim().bytes().any(|b| b != b'0') {
                        return Err(format!("sandbox process has host capabilities {v}"));
                    }
                }
            }
            seen += 1;
        }
        if seen != 1 {
            return Err(format!("found {seen} matching host processes"));
        }
        drop(s);
        Ok(())
    })
    .await
}

/// Host pids whose command line is exactly `cmd` (NUL-separated).
fn host_pids(cmd: &[u8]) -> Vec<String> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmd))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A process that detached itself (own session, reparented) still dies
/// with the sandbox.
async fn destroy_kills_every_process() -> Result<(), String> {
    let f = factory(LocalOptions::default());
    let sb = f(Default::default()).await.map_err(|e| e.to_string())?;
    let out = sb
        .commands()
        .run(ExecRequest::shell(
            "setsid sleep 3141.5 >/dev/null 2>&1 < /dev/null & echo started",
        ))
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("setup: {:?}", out.status));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cmd = b"sleep\x003141.5\x00";
    if host_pids(cmd).len() != 1 {
        return Err(format!("detached process not found on the host: {:?}", host_pids(cmd)));
    }
    sb.destroy().await.map_err(|e| e.to_string())?;
    for _ in 0..100 {
        if host_pids(cmd).is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("processes outlived the sandbox: {:?}", host_pids(cmd)))
}

/// Cgroup limits need a writable hierarchy: as root they must work; as an
/// ordinary user (no delegation here) they must be refused by name.
fn limit_or_refusal(r: Result<(), String>) -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        return r;
    }
    match r {
        Err(e) if e.contains("resources.") => Ok(()),
        other => Err(format!("expected a refusal naming the resource, got {other:?}")),
    }
}

/// What the local tier promises about a sandbox's surroundings: the rlimits
/// it was given (open files as configured, no core dumps), a /dev of the
/// documented devices only, loopback as its only interface, and a
/// machine-id of its own.
async fn local_environment_is_as_documented() -> Result<(), String> {
    let f = factory(LocalOptions {
        max_open_files: 1234,
        ..Default::default()
    });
    let sh = |sb: namzu::Sandbox, script: &'static str| async move {
        let out = sb
            .commands()
            .run(ExecRequest::shell(script))
            .await
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{script}: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok::<_, String>(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let ids = namzu_conformance::util::with_sandbox(&f, Default::default(), |sb| async move {
        let limits = sh(
            sb.clone(),
            "grep -E '^Max (open files|core file size)' /proc/self/limits",
        )
        .await?;
        let rows: Vec<Vec<&str>> = limits.lines().map(|l| l.split_whitespace().collect()).collect();
        let want_core = ["Max", "core", "file", "size", "0", "0", "bytes"];
        let want_nofile = ["Max", "open", "files", "1234", "1234", "files"];
        if !(rows.iter().any(|r| r[..] == want_core) && rows.iter().any(|r| r[..] == want_nofile)) {
            return Err(format!("rlimits: {limits}"));
        }
        let mut dev: Vec<String> = sh(sb.clone(), "ls -A /dev").await?.lines().map(String::from).collect();
        dev.sort();
        let want: Vec<&str> = vec![
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero",
        ];
        if dev != want {
            return Err(format!("/dev holds {dev:?}, documented {want:?}"));
        }
        let ifs = sh(sb.clone(), "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").await?;
        if ifs.split_whitespace().collect::<Vec<_>>() != ["lo"] {
            return Err(format!("interfaces: {ifs:?}"));
        }
        let id = sh(sb.clone(), "cat /etc/machine-id").await?.trim().to_owned();
        Ok(id)
    })
    .await?;
    let other = namzu_conformance::util::with_sandbox(&f, Default::default(), |sb| async move {
        let out = sb
            .commands()
            .run(ExecRequest::shell("cat /etc/machine-id"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    })
    .await?;
    let host = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    let well_formed = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !(well_formed(&ids) && well_formed(&other) && ids != other && ids != host.trim()) {
        return Err(format!("machine-ids: {ids:?}, {other:?}, host {:?}", host.trim()));
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        trial("escape_attempts_all_fail", || Box::pin(attempts())),
        Trial::test("escape_attempts_all_fail_in_a_one_command_sandbox", || {
            once_attempts().map_err(Failed::from)
        }),
        trial("fork_bomb_is_contained", || {
            Box::pin(async {
                let f = factory(LocalOptions {
                    max_processes: MAX_PROCS,
                    ..Default::default()
                });
                escape::fork_bomb_is_contained(&f, MAX_PROCS).await
            })
        }),
        trial("disk_fill_is_bounded", || {
            Box::pin(async {
                let f = factory(LocalOptions {
                    tmpfs_bytes: TMPFS,
                    max_file_bytes: MAX_FILE,
                    ..Default::default()
                });
                escape::disk_fill_is_bounded(&f, TMPFS, MAX_FILE).await
            })
        }),
        trial("symlink_race_on_the_workspace", || {
            Box::pin(async { escape::symlink_race_on_the_workspace(&factory(LocalOptions::default())).await })
        }),
        trial("sandbox_processes_are_unprivileged_on_the_host", || {
            Box::pin(unprivileged_on_the_host())
        }),
        trial(
            "destroy_kills_every_process",
            || Box::pin(destroy_kills_every_process()),
        ),
        trial("memory_hog_is_killed_and_the_agent_survives", || {
            Box::pin(async {
                limit_or_refusal(escape::memory_hog_is_killed(&factory(LocalOptions::default()), 64 << 20).await)
            })
        }),
        trial("pids_limit_contains_a_fork_bomb", || {
            Box::pin(async {
                let f = factory(LocalOptions::default());
                let f2: Factory = Arc::new(move |mut spec: namzu::SandboxSpec| {
                    spec.resources.pids = Some(64);
                    f(spec)
                });
                limit_or_refusal(escape::fork_bomb_is_contained(&f2, 64).await)
            })
        }),
        trial("cpu_limit_throttles", || {
            Box::pin(async {
                limit_or_refusal(escape::cpu_limit_throttles(&factory(LocalOptions::default()), 0.25).await)
            })
        }),
        trial("hardening_is_reported", || Box::pin(hardening_is_reported())),
        trial("local_environment_is_as_documented", || {
            Box::pin(local_environment_is_as_documented())
        }),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
