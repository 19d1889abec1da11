//! Terminals: a pty, resizing, login shells, and persistent terminals that outlive their link.

use super::common::*;

/// A pty runs a shell: input is typed, output comes back, a resize is seen
/// by the program, and closing kills the job it put in the background.
pub(super) async fn terminal_runs_resizes_and_close_kills_the_session(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = namzu::TerminalOptions {
            command: Some("sh".into()),
            cols: 80,
            rows: 24,
            ..Default::default()
        };
        let mut t = sb.terminals().open(opts).await.ctx("open terminal")?;
        let mut seen = String::new();
        // The typed line never contains the answer; and the shell may print
        // its prompt after the tty's echo, so "42" need not start a line.
        t.write(Bytes::from_static(b"echo $((6*7))\n")).await.ctx("write")?;
        read_until(&mut t, &mut seen, "42").await?;
        t.resize(100, 30).await.ctx("resize")?;
        t.write(Bytes::from_static(b"stty size\n")).await.ctx("write")?;
        read_until(&mut t, &mut seen, "30 100").await?;
        // Upper-cased by tr, so the terminal's echo of the typed line
        // cannot be mistaken for the answer.
        t.write(Bytes::from_static(b"sleep 300 & echo bg=$!: | tr a-z A-Z\n"))
            .await
            .ctx("write")?;
        read_until_fn(&mut t, &mut seen, "BG=<pid>:", |s| {
            s.contains("BG=") && s.rsplit("BG=").next().unwrap_or_default().contains(':')
        })
        .await?;
        let bg = seen
            .rsplit("BG=")
            .next()
            .and_then(|r| r.split(':').next())
            .unwrap_or_default()
            .trim()
            .to_owned();
        ensure!(bg.parse::<u32>().is_ok(), "no background pid in {seen:?}");
        ensure!(pid_alive(&sb, &bg).await?, "background job {bg} not running");
        t.close().await.ctx("close")?;
        ensure!(
            !pid_alive(&sb, &bg).await?,
            "background job {bg} survived the terminal's close"
        );
        Ok(())
    })
    .await
}

/// With no command, a terminal runs a login shell, and its exit code comes
/// back.
pub(super) async fn terminal_login_shell_exit_code(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut t = sb
            .terminals()
            .open(namzu::TerminalOptions::default())
            .await
            .ctx("open terminal")?;
        t.write(Bytes::from_static(b"exit 7\n")).await.ctx("write")?;
        loop {
            match t.next().await {
                Some(Ok(namzu::TerminalEvent::Exit(st))) => {
                    ensure!(st.code == Some(7), "exit {st:?}");
                    return Ok(());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("no exit".into()),
            }
        }
    })
    .await
}

/// A persistent terminal survives its attachment: dropping it detaches
/// (the shell keeps running), a new attachment replays from an offset and
/// follows, a second attachment ends the first with a typed reason, input
/// through the new one works, and the exit comes through once the program
/// really exits. read_session reads it all without displacing anyone.
pub(super) async fn persistent_terminal_detaches_and_resumes(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = namzu::TerminalOptions {
            command: Some("sh".into()),
            persistent: true,
            session_id: Some("pt".into()),
            ..Default::default()
        };
        let mut t = sb.terminals().open(opts).await.ctx("open persistent terminal")?;
        let mut seen = String::new();
        t.write(Bytes::from_static(b"echo one-$((1+0))\n")).await.ctx("write")?;
        read_until(&mut t, &mut seen, "one-1").await?;
        let off = t.next_offset();
        drop(t);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let listed = sb.sessions().list().await.ctx("list")?;
        ensure!(
            listed
                .iter()
                .any(|s| s.session_id == "pt" && s.state == namzu::SessionState::Running),
            "the shell did not survive the detach: {listed:?}"
        );
        let mut again = sb.terminals().attach("pt", 0).await.ctx("attach from 0")?;
        let mut replay = String::new();
        read_until(&mut again, &mut replay, "one-1").await?;
        let mut third = sb.terminals().attach("pt", off).await.ctx("attach from the offset")?;
        loop {
            match again.next().await {
                Some(Err(Error::AttachmentReplaced { session_id, .. })) => {
                    ensure!(session_id == "pt", "{session_id}");
                    break;
                }
                Some(Ok(_)) => {}
                other => return Err(format!("the replaced attachment ended with {other:?}")),
            }
        }
        third
            .write(Bytes::from_static(b"echo two-$((1+1)); exit 5\n"))
            .await
            .ctx("write")?;
        let mut rest = String::new();
        let status = loop {
            match third.next().await {
                Some(Ok(namzu::TerminalEvent::Output { data, .. })) => rest.push_str(&String::from_utf8_lossy(&data)),
                Some(Ok(namzu::TerminalEvent::Exit(st))) => break st,
                other => return Err(format!("no exit: {other:?} after {rest:?}")),
            }
        };
        ensure!(rest.contains("two-2"), "{rest:?}");
        ensure!(status.code == Some(5), "{status:?}");
        let all = sb.sessions().read_max("pt", 0, 0).await.ctx("read_session")?;
        let text = String::from_utf8_lossy(&all.data);
        ensure!(text.contains("one-1") && text.contains("two-2"), "{text:?}");
        Ok(())
    })
    .await
}
