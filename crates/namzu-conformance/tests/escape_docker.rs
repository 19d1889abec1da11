//! The escape suite on the `docker` tier, with runc and with runsc. Every
//! attempt must fail; `escape suite (docker-<runtime>): N attempted, 0
//! succeeded` is printed for CI. Needs a daemon (`scripts/docker-up.sh`);
//! without one every trial is reported ignored, unless
//! `NAMZU_REQUIRE_DOCKER=1`.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::docker::DockerOptions;
use namzu_conformance::escape::{self, suite};
use namzu_conformance::{docker, Factory};

fn opts(runtime: &str) -> DockerOptions {
    DockerOptions {
        runtime: (runtime != "runc").then(|| runtime.to_owned()),
        tmpfs_bytes: Some(32 << 20),
        max_file_bytes: Some(64 << 20),
        ..Default::default()
    }
}

async fn factory(runtime: &str) -> Result<Factory, String> {
    Ok(docker::factory(
        docker::provider(&format!("escape-{runtime}"), opts(runtime)).await?,
    ))
}

/// Attempts that succeed on docker/runsc, each with why: what gVisor
/// cannot do, listed so that the suite fails on any NEW escape and on a
/// fixed one left listed. runc has none.
const RUNSC_KNOWN_GAPS: &[(&str, &str)] = &[
    (
        "read the agent's environment",
        "gVisor's procfs makes /proc/<pid>/environ 0444 whatever the uid or dumpable state; it holds the container's environment, which every command is given (the token came from a file, deleted before any command)",
    ),
    (
        "list the agent's open files",
        "gVisor's /proc/<pid>/fd is root's and 0555 whatever the owner; the links can be listed and read, but sockets and anon inodes do not reopen (ENXIO, ENODEV)",
    ),
    (
        "find a mount without nosuid or nodev",
        "gVisor's mount table shows neither flag and its remount answers EINVAL; no-new-privileges and the mknod filter cover what the flags would",
    ),
    (
        "see a host mount",
        "the exec transport starts its relay from the bind-mounted agent binary (read-only) and connects through /.namzu/run (the agent uid's, mode 0700), so neither can be detached; gVisor refuses exec of /proc/1/exe",
    ),
];

/// Attempts gVisor's kernel has no interface for: they fail inside for
/// that reason (ENOENT), which proves nothing about namzu.
const RUNSC_LACKS: &[(&str, &str)] = &[
    (
        "join the agent's mount namespace",
        "gVisor's procfs has no /proc/PID/ns/mnt",
    ),
    (
        "write /proc/sys/vm/drop_caches",
        "gVisor's procfs has no /proc/sys/vm/drop_caches",
    ),
];

/// Trials that cannot run on runsc (Debian's 20221219), with what was
/// seen instead.
const RUNSC_CANNOT: &[(&str, &str)] = &[
    (
        "pids_limit_contains_a_fork_bomb",
        "the Sentry's own threads count against the container's pids limit; at 64 the sandbox cannot serve",
    ),
    (
        "memory_hog_is_killed_and_the_agent_survives",
        "at the memory limit the host kills the whole sandbox (the Sentry), not the hog, so the agent does not survive",
    ),
    (
        "cpu_limit_throttles",
        "the guest's getrusage counts gVisor's own CPU time (1.1 s in 1.5 s under 0.25 CPU); the host-side throttle is not visible inside",
    ),
];

/// What each runtime must show: everything proven but what this host
/// lacks, with runsc's known gaps the only escapes.
fn expect(runtime: &str) -> suite::Expect {
    suite::Expect {
        host_may_lack: suite::HOST_MAY_LACK,
        invariants: &[],
        known_gaps: if runtime == "runsc" { RUNSC_KNOWN_GAPS } else { &[] },
        tier_lacks: if runtime == "runsc" { RUNSC_LACKS } else { &[] },
    }
}

async fn attempts(runtime: &'static str) -> Result<(), String> {
    let f = factory(runtime).await?;
    let report = suite::run(&f, Default::default()).await?;
    let expect = expect(runtime);
    suite::print(&report, &format!("docker-{runtime}"), &expect);
    suite::check(&report, &expect)
}

/// One trial's body, given the runtime.
type Body = fn(&'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

fn with_resources(f: Factory, set: impl Fn(&mut namzu::Resources) + Send + Sync + 'static) -> Factory {
    Arc::new(move |mut spec: namzu::SandboxSpec| {
        set(&mut spec.resources);
        f(spec)
    })
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let reachable = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(docker::provider("escape-probe", DockerOptions::default()))
                .map(drop)
        });
    let mut trials = Vec::new();
    for runtime in ["runc", "runsc"] {
        let t = |name: &str, body: Body| {
            let trial = Trial::test(format!("docker-{runtime}::{name}"), move || {
                let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(body(runtime)).map_err(Failed::from)
            });
            let cannot = if runtime == "runsc" { RUNSC_CANNOT } else { &[] };
            match (&reachable, cannot.iter().find(|(n, _)| *n == name)) {
                (Err(why), _) if !docker::required() => {
                    trial.with_ignored_flag(true).with_kind(format!("unavailable: {why}"))
                }
                (_, Some((_, why))) => trial.with_ignored_flag(true).with_kind(format!("cannot: {why}")),
                _ => trial,
            }
        };
        trials.push(t("escape_attempts_all_fail", |rt| Box::pin(attempts(rt))));
        if runtime == "runsc" {
            // Each known gap, reported as what it is: an attempt gVisor's
            // kernel lets through (the trial above asserts exactly these).
            for (attempt, why) in RUNSC_KNOWN_GAPS {
                trials.push(
                    Trial::test(format!("docker-runsc::escape::{attempt}"), || Ok(()))
                        .with_ignored_flag(true)
                        .with_kind(format!("cannot: {why}")),
                );
            }
        }
        trials.push(t("pids_limit_contains_a_fork_bomb", |rt| {
            Box::pin(async move {
                let f = with_resources(factory(rt).await?, |r| r.pids = Some(64));
                escape::fork_bomb_is_contained(&f, 64).await
            })
        }));
        trials.push(t("disk_fill_is_bounded", |rt| {
            Box::pin(async move { escape::disk_fill_is_bounded(&factory(rt).await?, 32 << 20, 64 << 20).await })
        }));
        trials.push(t("symlink_race_on_the_workspace", |rt| {
            Box::pin(async move { escape::symlink_race_on_the_workspace(&factory(rt).await?).await })
        }));
        trials.push(t("memory_hog_is_killed_and_the_agent_survives", |rt| {
            Box::pin(async move {
                let f = with_resources(factory(rt).await?, |r| r.memory_bytes = Some(64 << 20));
                escape::memory_hog_is_killed(&f, 64 << 20).await
            })
        }));
        trials.push(t("cpu_limit_throttles", |rt| {
            // The case sets the limit itself: its unlimited control must
            // come from the same factory without it.
            Box::pin(async move { escape::cpu_limit_throttles(&factory(rt).await?, 0.25).await })
        }));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
