//! `quiesce`, `flush`, `pause`, `suspend` and `resume`: stopping a
//! sandbox's processes (for good, in place until resumed, or ended with
//! the disk kept) and making its workspace durable, e.g. before a snapshot.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::fail::Fail;
use crate::providers::{connect, provider_of};

fn seconds(flag: &str, s: f64) -> Result<Duration, Fail> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(Fail(format!(
            "{flag} must be a non-negative number of seconds, got {s}"
        )))
    }
}

/// Stops every process but the agent; prints what it stopped and how.
pub async fn quiesce(state_dir: &Option<PathBuf>, id: String, grace: f64) -> Result<ExitCode, Fail> {
    let grace = seconds("--grace", grace)?;
    let sb = connect(state_dir, &id).await?;
    let report = sb.quiesce(grace).await?;
    for p in &report.stopped {
        let how = if p.signal == 9 { "KILL" } else { "TERM" };
        println!("{:<8} {:<16} {how}", p.pid, p.comm);
    }
    eprintln!(
        "namzu: {} process(es) stopped in {} round(s)",
        report.stopped.len(),
        report.rounds
    );
    Ok(ExitCode::SUCCESS)
}

/// Syncs the workspace to disk; prints how long it took.
pub async fn flush(state_dir: &Option<PathBuf>, id: String, timeout: f64) -> Result<ExitCode, Fail> {
    let timeout = seconds("--timeout", timeout)?;
    let sb = connect(state_dir, &id).await?;
    let took = sb.flush(timeout).await?;
    println!("flushed in {} ms", took.as_millis());
    Ok(ExitCode::SUCCESS)
}

/// Stops every process but the agent in place; prints the pids stopped.
pub async fn pause(state_dir: &Option<PathBuf>, id: String) -> Result<ExitCode, Fail> {
    let (_, p) = provider_of(state_dir, &id).await?;
    let sb = match p.connect(&id).await {
        // A VM paused whole refuses the connect itself.
        Err(namzu::Error::SandboxPaused { .. }) => {
            eprintln!("namzu: {id} was paused already");
            return Ok(ExitCode::SUCCESS);
        }
        other => other?,
    };
    let report = sb.pause().await?;
    for pid in &report.stopped {
        println!("{pid}");
    }
    if report.rounds == 0 {
        eprintln!("namzu: {id} was paused already");
    } else if report.stopped.is_empty() {
        // The tier paused the whole sandbox (a VM's vCPUs).
        eprintln!("namzu: {id} paused; `namzu resume {id}` continues it");
    } else {
        eprintln!(
            "namzu: {} process(es) stopped; `namzu resume {id}` continues them",
            report.stopped.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Ends every process, keeping the disk for `resume`.
pub async fn suspend(state_dir: &Option<PathBuf>, id: String) -> Result<ExitCode, Fail> {
    let (_, p) = provider_of(state_dir, &id).await?;
    let bar = crate::ui::spinner(&format!("suspending {id}"));
    let done = p.suspend(&id).await;
    bar.finish_and_clear();
    done?;
    eprintln!("namzu: {id} suspended; `namzu resume {id}` starts it again");
    Ok(ExitCode::SUCCESS)
}

/// Continues what `pause` stopped (prints the pids continued), or starts
/// a suspended sandbox again.
pub async fn resume(state_dir: &Option<PathBuf>, id: String) -> Result<ExitCode, Fail> {
    let (_, p) = provider_of(state_dir, &id).await?;
    let sb = match p.connect(&id).await {
        // Suspended, or a VM paused whole (its agent answers no connect):
        // the provider wakes it.
        Err(namzu::Error::SandboxSuspended { .. } | namzu::Error::SandboxPaused { .. }) => {
            let bar = crate::ui::spinner(&format!("resuming {id}"));
            let resumed = p.resume(&id).await;
            bar.finish_and_clear();
            resumed?;
            eprintln!("namzu: {id} resumed");
            return Ok(ExitCode::SUCCESS);
        }
        other => other?,
    };
    let report = sb.resume().await?;
    for pid in &report.continued {
        println!("{pid}");
    }
    eprintln!(
        "namzu: {} process(es) continued after {} ms paused",
        report.continued.len(),
        report.paused_for.as_millis()
    );
    Ok(ExitCode::SUCCESS)
}
