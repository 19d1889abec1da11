//! Pause and resume: every process stopped in place, and continued.

use super::common::*;

/// `/proc/PID/stat`'s state letter, read inside the sandbox.
async fn state_of(sb: &Sandbox, pid: &str) -> Result<char, String> {
    let out = sh(sb, &format!("cat /proc/{pid}/stat")).await?;
    let stat = String::from_utf8_lossy(&out.stdout).into_owned();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .ok_or_else(|| format!("no state in {stat:?}"))
}

/// While paused, no process of the sandbox makes progress and nothing new
/// starts (`SandboxPaused`), while files and running commands' output can
/// still be read (where the tier pauses the whole machine, nothing is
/// served and its clock stands still); a resume continues every process where it was: a
/// detached execution's output is complete across the pause, a command
/// whose timeout is shorter than the pause finishes (paused time does not
/// count), and a process stopped by job control before the pause is still
/// stopped after it.
pub(super) async fn pause_stops_every_process_and_resume_continues_them(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let counter = "i=0; while [ $i -lt 100 ]; do i=$((i+1)); echo $i; sleep 0.01; done";
        let s = sb
            .commands()
            .spawn(ExecRequest::shell(counter).execution_id("counter"))
            .await
            .ctx("start the counter")?;
        drop(s);
        let held = sh(&sb, "sleep 300 >/dev/null 2>&1 </dev/null & echo $!").await?;
        let held = String::from_utf8_lossy(&held.stdout).trim().to_owned();
        ensure!(
            sh(&sb, &format!("kill -STOP {held}")).await?.status.success(),
            "stop {held}"
        );
        // The stop is the kernel's to carry out: seen, before the pause.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while state_of(&sb, &held).await? != 'T' {
            ensure!(tokio::time::Instant::now() < deadline, "{held} never stopped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let timed = sb
            .commands()
            .stream(ExecRequest::shell("sleep 0.3; echo finished").timeout(Duration::from_secs(1)))
            .await
            .ctx("start the timed command")?;
        let so_far = |sb: Sandbox| async move {
            let opts = namzu::AttachOptions {
                follow: false,
                ..Default::default()
            };
            let mut s = sb
                .commands()
                .attach_stream("counter", opts)
                .await
                .ctx("read the counter")?;
            let mut out = Vec::new();
            while let Some(ev) = s.next().await {
                if let ExecEvent::Stdout { data, .. } = ev.ctx("the counter so far")? {
                    out.extend_from_slice(&data);
                }
            }
            Ok::<_, String>(out)
        };

        let machine = match crate::hooks().pause_stops_machine {
            true => Some(paused_machine(&sb).await?),
            false => {
                paused_processes(&sb, &held, so_far).await?;
                None
            }
        };

        let resumed = sb.resume().await.ctx("resume")?;
        ensure!(resumed.paused_for >= Duration::from_millis(1400), "{resumed:?}");
        ensure!(!sb.is_paused().await.ctx("health")?, "still paused");
        if let Some((up_before, wall)) = machine {
            // The machine's own clock stood still while it was paused.
            let ran = uptime(&sb).await? - up_before;
            let waited = wall.elapsed().as_secs_f64();
            let stood_still = ran < waited - 1.0;
            ensure!(
                stood_still,
                "the machine ran {ran:.2} s of the {waited:.2} s it was paused across"
            );
        }
        let out = collect_output(timed).await?;
        ensure!(
            out.0 == b"finished\n" && out.1.code == Some(0) && !out.1.timed_out,
            "a 1 s timeout across a 1.5 s pause: {:?} {:?}",
            String::from_utf8_lossy(&out.0),
            out.1
        );
        let all = sb
            .commands()
            .attach("counter", Default::default())
            .await
            .ctx("the counter")?;
        let want: String = (1..=100).map(|i| format!("{i}\n")).collect();
        ensure!(
            all.stdout == want.as_bytes() && all.status.success(),
            "the counter across the pause: {:?}",
            String::from_utf8_lossy(&all.stdout)
        );
        ensure!(state_of(&sb, &held).await? == 'T', "the job-control stop was undone");
        sh(&sb, &format!("kill -9 {held}")).await?;
        ensure!(sh(&sb, "true").await?.status.success(), "exec after resume");
        Ok(())
    })
    .await
}

/// A pause of the processes through the agent: each listed, none of them
/// running on, while files and running commands' output can be read.
async fn paused_processes<F, Fut>(sb: &Sandbox, held: &str, so_far: F) -> Result<(), String>
where
    F: Fn(Sandbox) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<u8>, String>>,
{
    let sb = sb.clone();
    let report = sb.pause().await.ctx("pause")?;
    ensure!(!report.stopped.is_empty() && report.rounds >= 1, "{report:?}");
    ensure!(
        !report.stopped.iter().any(|p| p.to_string() == held),
        "the pause claims {held}, stopped before it: {report:?}"
    );
    ensure!(sb.is_paused().await.ctx("health")?, "health does not say paused");
    let again = sb.pause().await.ctx("pause again")?;
    ensure!(again.rounds == 0 && again.stopped == report.stopped, "{again:?}");
    let before = so_far(sb.clone()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = so_far(sb.clone()).await?;
    ensure!(
        before == after,
        "the counter ran while paused: {} then {} bytes",
        before.len(),
        after.len()
    );
    match sb.commands().run("true").await {
        Err(Error::SandboxPaused { op }) => ensure!(op == "exec", "{op}"),
        other => return Err(format!("an exec in a paused sandbox: {other:?}")),
    }
    sb.files().write("while-paused", "ok").await.ctx("write while paused")?;
    ensure!(
        &sb.files().read("while-paused").await.ctx("read")?[..] == b"ok",
        "read back"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(())
}

/// Seconds the sandbox's machine has run (its `/proc/uptime`).
async fn uptime(sb: &Sandbox) -> Result<f64, String> {
    let out = sh(sb, "cat /proc/uptime").await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .next()
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| format!("no uptime in {text:?}"))
}

/// A pause of the whole machine: no process listed (the machine stopped,
/// not they) and every operation refused while it lasts. Returns the
/// machine's uptime and the host's instant before it, for the check that
/// the machine's clock stood still.
async fn paused_machine(sb: &Sandbox) -> Result<(f64, std::time::Instant), String> {
    let up_before = uptime(sb).await?;
    let wall = std::time::Instant::now();
    let report = sb.pause().await.ctx("pause")?;
    ensure!(report.stopped.is_empty() && report.rounds == 1, "{report:?}");
    ensure!(sb.is_paused().await.ctx("is_paused")?, "not paused");
    let again = sb.pause().await.ctx("pause again")?;
    ensure!(again.rounds == 0, "{again:?}");
    match sb.commands().run("true").await {
        Err(Error::SandboxPaused { op }) => ensure!(op == "exec", "{op}"),
        other => return Err(format!("an exec in a paused machine: {other:?}")),
    }
    match sb.files().read("anything").await {
        Err(Error::SandboxPaused { .. }) => {}
        other => return Err(format!("a read in a paused machine: {other:?}")),
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok((up_before, wall))
}

/// A stream's stdout and how it ended.
async fn collect_output(mut s: namzu::ExecStream) -> Result<(Vec<u8>, namzu::ExitStatus), String> {
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        match ev.ctx("the timed command")? {
            ExecEvent::Stdout { data, .. } => out.extend_from_slice(&data),
            ExecEvent::Stderr { .. } => {}
            ExecEvent::Exit(x) => return Ok((out, x.status)),
        }
    }
    Err("the timed command's stream ended without an exit".into())
}
