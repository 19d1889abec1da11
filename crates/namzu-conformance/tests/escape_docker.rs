//! The escape suite on the `docker` tier, with runc and with runsc. Every
//! attempt must fail; `escape suite (docker-<runtime>): N attempted, 0
//! succeeded` is printed for CI. Needs a daemon (`scripts/docker-up.sh`);
//! without one every trial is reported ignored, unless
//! `NAMZU_REQUIRE_DOCKER=1`.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::docker::DockerOptions;
use namzu_conformance::{docker, escape, Factory};

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

async fn attempts(runtime: &'static str) -> Result<(), String> {
    let f = factory(runtime).await?;
    let (attempted, escaped) = escape::run_attempts(&f).await?;
    println!(
        "escape suite (docker-{runtime}): {attempted} attempted, {} succeeded",
        escaped.len()
    );
    for e in &escaped {
        println!("  {e}");
    }
    if attempted < 40 {
        return Err(format!("only {attempted} attempts ran"));
    }
    let known = if runtime == "runsc" { RUNSC_KNOWN_GAPS } else { &[] };
    let listed = |name: &str, e: &str| e.contains(&format!("attempt {name}:"));
    let new: Vec<&String> = escaped
        .iter()
        .filter(|e| !known.iter().any(|(name, _)| listed(name, e)))
        .collect();
    if !new.is_empty() {
        return Err(format!("{} escapes beyond the known gaps: {new:?}", new.len()));
    }
    let fixed: Vec<&str> = known
        .iter()
        .filter(|(name, _)| !escaped.iter().any(|e| listed(name, e)))
        .map(|(name, _)| *name)
        .collect();
    if !fixed.is_empty() {
        return Err(format!(
            "known gaps no longer open; remove them from the list: {fixed:?}"
        ));
    }
    Ok(())
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
            Box::pin(async move {
                let f = with_resources(factory(rt).await?, |r| r.cpus = Some(0.25));
                escape::cpu_limit_throttles(&f, 0.25).await
            })
        }));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
