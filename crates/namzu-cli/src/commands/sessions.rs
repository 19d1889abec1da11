//! `sessions`, `kill` and `cancel`: background sessions and named
//! executions of a sandbox.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::fail::Fail;
use crate::providers::connect;
use crate::ui::session_state;

pub async fn list(state_dir: &Option<PathBuf>, id: String) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    println!("{:<24} {:<8} {:<12} BYTES", "SESSION", "PID", "STATE");
    for s in sb.sessions().list().await? {
        println!(
            "{:<24} {:<8} {:<12} {}",
            s.session_id,
            s.pid,
            session_state(&s),
            s.output_bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(state_dir: &Option<PathBuf>, id: String, name: String) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    let outcome = match sb.commands().cancel(&name).await? {
        namzu::CancelOutcome::Killed => "killed",
        namzu::CancelOutcome::NotStarted => "never started",
        namzu::CancelOutcome::AlreadyExited => "had already exited",
    };
    println!("{name} {outcome}");
    Ok(ExitCode::SUCCESS)
}

pub async fn kill(
    state_dir: &Option<PathBuf>,
    id: String,
    session: String,
    signal: namzu::SessionSignal,
) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    let info = sb.sessions().kill(&session, signal).await?;
    println!("{} {}", info.session_id, session_state(&info));
    Ok(ExitCode::SUCCESS)
}
