//! Quiesce: every process but the agent stopped.

use super::common::*;

/// Quiesce stops a running command (SIGTERM is enough) and a detached one
/// that ignores SIGTERM (it takes SIGKILL), reports both with the signal
/// that did it, ends the running execution as cancelled, and leaves the
/// agent serving.
pub(super) async fn quiesce_stops_everything_but_the_agent(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut running = sb.commands().stream(ExecRequest::shell("echo go; exec sleep 300")).await.ctx("exec")?;
        let running_pid = running.pid.ok_or("no pid")?;
        match running.next().await {
            Some(Ok(ExecEvent::Stdout { .. })) => {}
            other => return Err(format!("no output: {other:?}")),
        }
        let script = "setsid sh -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do sleep 1; done' >/dev/null 2>&1 < /dev/null &";
        ensure!(sh(&sb, script).await?.status.success(), "start the stubborn process");
        let mut stubborn = String::new();
        for _ in 0..100 {
            if let Ok(d) = sb.files().read("stubborn.pid").await {
                stubborn = String::from_utf8_lossy(&d).trim().to_owned();
                if !stubborn.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stubborn: u32 = stubborn.parse().map_err(|_| format!("no stubborn pid: {stubborn:?}"))?;
        let report = sb.quiesce(Duration::from_millis(300)).await.ctx("quiesce")?;
        let sig = |pid: u32| report.stopped.iter().find(|s| s.pid == pid).map(|s| s.signal);
        ensure!(sig(running_pid) == Some(15), "running command: {:?} in {report:?}", sig(running_pid));
        ensure!(sig(stubborn) == Some(9), "TERM-ignoring process: {:?} in {report:?}", sig(stubborn));
        let mut exit = None;
        while let Some(ev) = running.next().await {
            if let Ok(ExecEvent::Exit(x)) = ev {
                exit = Some(x);
            }
        }
        let exit = exit.ok_or("the running execution did not end")?;
        ensure!(exit.status.cancelled, "the running execution did not end as cancelled: {:?}", exit.status);
        // Nothing is left, and the agent serves (and is not fenced).
        let again = sb.quiesce(Duration::from_millis(300)).await.ctx("second quiesce")?;
        ensure!(again.stopped.is_empty(), "left after quiesce: {:?}", again.stopped);
        ensure!(sh(&sb, "true").await?.status.success(), "agent after quiesce");
        Ok(())
    })
    .await
}
