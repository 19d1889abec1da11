//! The escape suite: concrete attempts to get out of a sandbox, made from
//! inside by the static `namzu-escape` binary, against targets this process
//! plants on the host. Every attempt must fail. Tier-agnostic: a backend
//! passes a factory, as for the conformance suite.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use namzu::{Error, ExecRequest, Sandbox, SandboxSpec, WriteOptions};

pub mod suite;

use crate::util::Ctx;
use crate::{ensure, Factory, Outcome};

/// Finds `namzu-escape` beside the running test binary (`cargo build
/// --workspace --bins`) or at `NAMZU_ESCAPE_BIN`.
pub fn escape_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NAMZU_ESCAPE_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().ctx("current_exe")?;
    for dir in exe.ancestors().skip(1).take(2) {
        let p = dir.join("namzu-escape");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err("namzu-escape not built (cargo build --workspace --bins)".into())
}

/// Copies the escape binary into the sandbox's workspace.
pub async fn install(sb: &Sandbox) -> Outcome {
    let bin = std::fs::read(escape_binary()?).ctx("read namzu-escape")?;
    let opts = WriteOptions {
        mode: Some(0o755),
        ..Default::default()
    };
    sb.files()
        .write_with(Path::new("escape"), Bytes::from(bin), opts)
        .await
        .ctx("install namzu-escape")?;
    Ok(())
}

/// Parses `forked N before: ...` / `wrote N bytes before: ...`.
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// A fork bomb stops at the sandbox's process limit; the host can still
/// fork, and the agent still serves.
pub async fn fork_bomb_is_contained(factory: &Factory, limit: u64) -> Outcome {
    crate::util::with_sandbox(factory, SandboxSpec::default(), |sb| async move {
        install(&sb).await?;
        let out = sb
            .commands()
            .run(ExecRequest::new("./escape").arg("--fork-bomb").arg("100000"))
            .await
            .ctx("fork bomb")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let n = number_after(&text, "forked ").ok_or(format!("no report: {text}"))?;
        ensure!(n < limit, "forked {n} processes, limit {limit}: {text}");
        ensure!(
            text.contains("Resource temporarily unavailable"),
            "stopped for another reason: {text}"
        );
        let host = std::process::Command::new("true")
            .status()
            .ctx("host fork during the bomb")?;
        ensure!(host.success(), "host could not fork");
        ensure!(
            sb.commands()
                .run(ExecRequest::new("true"))
                .await
                .ctx("agent after the bomb")?
                .status
                .success(),
            "agent down"
        );
        Ok(())
    })
    .await
}

/// Writes stop at the tmpfs size in /tmp and at the file-size limit in the
/// workspace.
pub async fn disk_fill_is_bounded(factory: &Factory, tmpfs_bytes: u64, max_file_bytes: u64) -> Outcome {
    crate::util::with_sandbox(factory, SandboxSpec::default(), |sb| async move {
        install(&sb).await?;
        for (path, bound, why) in [
            ("/tmp/fill", tmpfs_bytes, "No space left on device"),
            ("/workspace/fill", max_file_bytes, "File too large"),
        ] {
            let out = sb
                .commands()
                .run(ExecRequest::new("./escape").arg("--disk-fill").arg(path))
                .await
                .ctx("disk fill")?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let n = number_after(&text, "wrote ").ok_or(format!("no report: {text}"))?;
            ensure!(n <= bound, "{path}: wrote {n} bytes past the bound {bound}");
            ensure!(text.contains(why), "{path}: stopped by something else: {text}");
        }
        Ok(())
    })
    .await
}

/// While a command swaps a workspace directory for a symlink pointing out
/// of the workspace, host writes through the agent land inside or fail —
/// never outside. The race must really overlap: some writes land, some are
/// refused, and the racer itself ran to the end.
pub async fn symlink_race_on_the_workspace(factory: &Factory) -> Outcome {
    crate::util::with_sandbox(factory, SandboxSpec::default(), |sb| async move {
        ensure!(
            sb.commands().run("mkdir -p race /tmp/outside").await.ctx("setup")?.status.success(),
            "setup"
        );
        let racer = {
            let sb = sb.clone();
            tokio::spawn(async move {
                let script = "touch started; i=0; while [ $i -lt 3000 ]; do mv race race.d && ln -s /tmp/outside race && rm race && mv race.d race || exit 3; i=$((i+1)); done";
                sb.commands().run(script).await
            })
        };
        // Writes start once the racer has.
        for _ in 0..200 {
            if sb.files().stat(Path::new("started")).await.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (mut inside, mut refused) = (0, 0);
        let mut i = 0;
        while !racer.is_finished() && i < 5000 {
            match sb.files().write(Path::new(&format!("race/f{i}")), Bytes::from_static(b"x")).await {
                Ok(_) => inside += 1,
                Err(Error::PathEscape { .. } | Error::NotFound { .. } | Error::NotADirectory { .. }) => refused += 1,
                Err(e) => return Err(format!("write {i}: {e}")),
            }
            i += 1;
        }
        let status = racer.await.ctx("racer")?.ctx("racer exec")?.status;
        ensure!(status.success(), "the racer failed: {status:?}");
        ensure!(
            inside > 0 && refused > 0,
            "the race did not overlap: {inside} writes landed, {refused} refused"
        );
        let out = sb.commands().run("ls /tmp/outside | wc -l").await.ctx("count")?;
        let leaked = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        ensure!(leaked == "0", "{leaked} writes landed outside the workspace ({inside} ok, {refused} refused)");
        Ok(())
    })
    .await
}

/// A memory hog is killed at the memory limit; the agent survives and
/// reports which cgroup layout applied.
pub async fn memory_hog_is_killed(factory: &Factory, limit: u64) -> Outcome {
    let spec = SandboxSpec {
        resources: namzu::Resources {
            memory_bytes: Some(limit),
            ..Default::default()
        },
        ..Default::default()
    };
    crate::util::with_sandbox(factory, spec, |sb| async move {
        install(&sb).await?;
        let applied = sb.agent().info().hardening.get("cgroups").cloned().unwrap_or_default();
        ensure!(
            applied.contains("memory=cgroup"),
            "no memory cgroup reported: {applied:?}"
        );
        let out = sb
            .commands()
            .run(ExecRequest::new("./escape").arg("--mem-hog"))
            .await
            .ctx("memory hog")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let held = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("holding "))
            .unwrap_or("0 MiB");
        let mib: u64 = held.trim_end_matches(" MiB").parse().unwrap_or(u64::MAX);
        ensure!(
            out.status.signal == Some(9),
            "the hog was not killed: {:?} after {held}",
            out.status
        );
        ensure!(
            mib << 20 <= limit,
            "the hog held {mib} MiB under a {} MiB limit",
            limit >> 20
        );
        ensure!(
            sb.commands()
                .run(ExecRequest::new("true"))
                .await
                .ctx("agent after the hog")?
                .status
                .success(),
            "agent down"
        );
        Ok(())
    })
    .await
}

/// A CPU-bound command under a CPU limit gets about that share of a CPU,
/// and the same burn in a sandbox without the limit, right after, gets at
/// least twice as much: the measurement can tell the difference. Every
/// limited burn must be throttled; a control that got too little CPU to
/// tell (the machine busy with something else) makes the pair
/// inconclusive, and it is measured again, up to three times.
pub async fn cpu_limit_throttles(factory: &Factory, cpus: f64) -> Outcome {
    const PAIRS: usize = 3;
    let spec = SandboxSpec {
        resources: namzu::Resources {
            cpus: Some(cpus),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut seen = Vec::new();
    for _ in 0..PAIRS {
        let limited = burn_share(factory, spec.clone()).await?;
        let free = burn_share(factory, SandboxSpec::default()).await?;
        // Unthrottled, a spinning process gets ~1 CPU; the bound leaves
        // generous room for the scheduler's period.
        let throttled = limited < cpus + 0.35;
        ensure!(
            throttled,
            "{limited:.2} CPU under a {cpus} CPU limit (unlimited: {free:.2})"
        );
        if free > 2.0 * limited {
            return Ok(());
        }
        seen.push(format!("{free:.2} against {limited:.2}"));
    }
    Err(format!(
        "the unlimited control never got twice the limited burn's CPU in {PAIRS} pairs ({}): no difference to see",
        seen.join(", ")
    ))
}

/// CPU seconds per wall second of a 1.5 s spin in a sandbox of `spec`.
async fn burn_share(factory: &Factory, spec: SandboxSpec) -> Result<f64, String> {
    crate::util::with_sandbox(factory, spec, |sb| async move {
        install(&sb).await?;
        let out = sb
            .commands()
            .run(ExecRequest::new("./escape").arg("--cpu-burn").arg("1.5"))
            .await
            .ctx("cpu burn")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut it = text.split_whitespace();
        match (it.next(), it.next(), it.next(), it.next()) {
            (Some("cpu"), Some(c), Some("wall"), Some(w)) => {
                let (c, w) = (c.parse::<f64>().ctx("cpu")?, w.parse::<f64>().ctx("wall")?);
                Ok(c / w)
            }
            _ => Err(format!("no report: {text}")),
        }
    })
    .await
}
