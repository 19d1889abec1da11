//! Detachable executions: reattach by offset, typed refusals, cancel, retention and eviction.

use super::common::*;

/// A detachable execution keeps running when its stream is dropped; an
/// attach from the offset the stream had reached yields exactly the rest
/// (nothing lost, nothing repeated); every attach from 0 returns the same
/// result; starting the same id again runs nothing and attaches.
pub(super) async fn detachable_execution_outlives_its_stream_and_resumes_by_offset(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell(TALKER).execution_id("job-1"))
            .await
            .ctx("start")?;
        ensure!(s.execution_id == "job-1", "{}", s.execution_id);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while out.len() < 20 {
            match s.next().await {
                Some(Ok(ExecEvent::Stdout { data, .. })) => out.extend_from_slice(&data),
                Some(Ok(ExecEvent::Stderr { data, .. })) => err.extend_from_slice(&data),
                other => return Err(format!("before the drop: {other:?}")),
            }
        }
        let off = s.next_offset();
        ensure!(
            off == (out.len() + err.len()) as u64,
            "offset {off} after {} bytes",
            out.len() + err.len()
        );
        drop(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut rest = sb
            .commands()
            .attach_stream(
                "job-1",
                namzu::AttachOptions {
                    from_offset: off,
                    ..Default::default()
                },
            )
            .await
            .ctx("attach from the offset")?;
        let (o2, e2, exit) = collect_events(&mut rest).await?;
        out.extend_from_slice(&o2);
        err.extend_from_slice(&e2);
        let (want_out, want_err) = talker_output();
        ensure!(
            out == want_out.as_bytes(),
            "stdout across the detach: {:?}",
            String::from_utf8_lossy(&out)
        );
        ensure!(
            err == want_err.as_bytes(),
            "stderr across the detach: {:?}",
            String::from_utf8_lossy(&err)
        );
        ensure!(exit.status.code == Some(7) && !exit.stdout_truncated, "{exit:?}");
        let a = sb
            .commands()
            .attach("job-1", Default::default())
            .await
            .ctx("attach 1")?;
        let b = sb
            .commands()
            .attach("job-1", Default::default())
            .await
            .ctx("attach 2")?;
        ensure!(
            a.stdout == want_out.as_bytes() && a.stderr == want_err.as_bytes(),
            "attach from 0: {a:?}"
        );
        ensure!(
            a.status == b.status && a.stdout == b.stdout && a.stderr == b.stderr,
            "two attaches differ"
        );
        ensure!(
            a.status == exit.status && a.stdout_bytes == want_out.len() as u64,
            "{a:?}"
        );
        // The same id again: nothing runs, the caller gets the retained run.
        let again = sb
            .commands()
            .run(ExecRequest::shell("touch ran-twice; exit 0").execution_id("job-1"))
            .await
            .ctx("second start")?;
        ensure!(
            again.status.code == Some(7) && again.stdout == a.stdout,
            "second start: {again:?}"
        );
        ensure!(
            sb.files().stat("ran-twice").await.is_err(),
            "the second start ran its command"
        );
        match sb.commands().cancel("job-1").await {
            Ok(namzu::CancelOutcome::AlreadyExited) => {}
            other => return Err(format!("cancel after the exit: {other:?}")),
        }
        Ok(())
    })
    .await
}

/// What cannot be attached is told apart by type: an unknown id, a command
/// that was not started detachable, a bad name, an offset past the end.
pub(super) async fn detachable_execution_refusals_are_typed(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        match sb.commands().attach("never-started", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                execution_id,
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => ensure!(execution_id == "never-started", "{execution_id}"),
            other => return Err(format!("unknown id: {other:?}")),
        }
        let mut plain = sb
            .commands()
            .stream(ExecRequest::shell("echo go; exec sleep 300"))
            .await
            .ctx("plain exec")?;
        let _ = plain.next().await;
        match sb.commands().attach(&plain.execution_id, Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::NotDetachable,
                ..
            }) => {}
            other => return Err(format!("attach to a plain exec: {other:?}")),
        }
        drop(plain);
        match sb
            .commands()
            .run(ExecRequest::shell("true").execution_id("no spaces/allowed"))
            .await
        {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("bad name: {other:?}")),
        }
        sb.commands()
            .run(ExecRequest::shell("echo 123").execution_id("short"))
            .await
            .ctx("short")?;
        let past = namzu::AttachOptions {
            from_offset: 100,
            ..Default::default()
        };
        match sb.commands().attach("short", past).await {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("offset past the end: {other:?}")),
        }
        match sb.commands().cancel("never-started").await {
            Err(Error::UnknownExecution { execution_id, .. }) => {
                ensure!(execution_id == "never-started", "{execution_id}")
            }
            other => return Err(format!("cancel of an unknown id: {other:?}")),
        }
        Ok(())
    })
    .await
}

/// cancel_execution kills a detachable execution from any caller and
/// confirms it; every attacher then sees it cancelled. Retained logs are
/// bounded by max_retained_logs: a full set of running ones refuses by
/// name, an exited one makes room.
pub(super) async fn detachable_execution_cancel_and_retention_limits(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_retained_logs".into(), 2)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        for id in ["a", "b"] {
            let s = sb
                .commands()
                .stream(ExecRequest::shell("exec sleep 300").execution_id(id))
                .await
                .ctx(id)?;
            drop(s);
        }
        match sb.commands().stream(ExecRequest::shell("true").execution_id("c")).await {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_retained_logs" && value == 2, "{limit}={value}")
            }
            other => return Err(format!("third log: {:?}", other.map(|s| s.execution_id.clone()))),
        }
        match sb.commands().cancel("a").await {
            Ok(namzu::CancelOutcome::Killed) => {}
            other => return Err(format!("cancel a: {other:?}")),
        }
        let a = sb.commands().attach("a", Default::default()).await.ctx("attach a")?;
        ensure!(a.status.cancelled && a.status.signal == Some(9), "{:?}", a.status);
        let c = sb
            .commands()
            .run(ExecRequest::shell("echo c").execution_id("c"))
            .await
            .ctx("c after a exited")?;
        ensure!(c.stdout.as_ref() == b"c\n", "{c:?}");
        match sb.commands().attach("a", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => {}
            other => return Err(format!("a should have made room: {other:?}")),
        }
        match sb.commands().cancel("b").await {
            Ok(namzu::CancelOutcome::Killed) => Ok(()),
            other => Err(format!("cancel b: {other:?}")),
        }
    })
    .await
}

/// Output a log evicted is reported, never hidden: the gap callback gets
/// the lost byte count, the result says both streams were truncated, and
/// the bytes that are there are the newest ones.
pub(super) async fn evicted_execution_output_is_a_gap_and_truncation(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("execution_log_bytes".into(), 1024)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let s = sb
            .commands()
            .stream(ExecRequest::shell("head -c 10000 /dev/zero | tr '\\0' a; echo -n b").detachable())
            .await
            .ctx("start")?;
        let id = s.execution_id.clone();
        drop(s);
        let lost = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = lost.clone();
        // The first attach waits for the exit; the second reads a finished log.
        sb.commands().attach(&id, Default::default()).await.ctx("wait")?;
        let opts = namzu::AttachOptions {
            on_gap: Some(Arc::new(move |g: namzu::OutputGap| {
                if let Ok(mut v) = seen.lock() {
                    v.push(g)
                }
            })),
            ..Default::default()
        };
        let r = sb.commands().attach(&id, opts).await.ctx("attach")?;
        let gaps = lost.lock().map(|v| v.clone()).unwrap_or_default();
        ensure!(
            gaps == [namzu::OutputGap {
                from_offset: 0,
                lost_bytes: 10_001 - 1024
            }],
            "{gaps:?}"
        );
        ensure!(r.stdout_truncated && r.stderr_truncated, "{r:?}");
        ensure!(
            r.stdout.len() == 1024 && r.stdout.ends_with(b"aab"),
            "{} bytes",
            r.stdout.len()
        );
        ensure!(r.stdout_bytes == 10_001, "{}", r.stdout_bytes);
        Ok(())
    })
    .await
}

/// A cancel token already cancelled reaches a named reservation before the
/// start, so the command never runs and the result says cancelled.
pub(super) async fn cancel_before_start_of_a_detachable_execution_never_runs(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        token.cancel();
        let r = sb
            .commands()
            .run(ExecRequest::shell("touch ran").execution_id("pre").cancel_token(token))
            .await
            .ctx("exec")?;
        ensure!(r.status.cancelled, "{:?}", r.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensure!(sb.files().stat("ran").await.is_err(), "the cancelled command ran");
        Ok(())
    })
    .await
}

/// Past execution_retained_ttl_ms an exited execution is forgotten: attach
/// is refused as unknown, and the same id starts a fresh command.
pub(super) async fn exited_execution_records_expire_after_the_ttl(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("execution_retained_ttl_ms".into(), 200)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let first = sb
            .commands()
            .run(ExecRequest::shell("echo first").execution_id("ttl"))
            .await
            .ctx("first")?;
        ensure!(first.stdout.as_ref() == b"first\n", "{first:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        match sb.commands().attach("ttl", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => {}
            other => return Err(format!("attach past the ttl: {other:?}")),
        }
        let second = sb
            .commands()
            .run(ExecRequest::shell("echo second").execution_id("ttl"))
            .await
            .ctx("second")?;
        ensure!(second.stdout.as_ref() == b"second\n", "{second:?}");
        Ok(())
    })
    .await
}

/// `commands().list()` shows what the agent holds: a running foreground
/// execution and a running detachable one; once the
/// detachable one exits it stays listed (with its code and output size)
/// while the foreground one, cancelled, is gone.
pub(super) async fn executions_are_listed_with_their_state(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let cmds = sb.commands();
        let token = CancellationToken::new();
        let mut fg = cmds
            .stream(ExecRequest::shell("echo up; sleep 30").cancel_token(token.clone()))
            .await
            .ctx("foreground")?;
        let fg_id = fg.execution_id.clone();
        ensure!(
            matches!(fg.next().await, Some(Ok(ExecEvent::Stdout { .. }))),
            "the foreground command did not start"
        );
        let bg = cmds
            .spawn(ExecRequest::shell("printf 12345; sleep 0.5; exit 4").execution_id("listed-bg"))
            .await
            .ctx("spawn")?;
        let listed = cmds.list().await.ctx("list")?;
        let of = |id: &str| listed.iter().find(|e| e.execution_id == id).cloned();
        let f_info = of(&fg_id).ok_or(format!("{fg_id} not listed: {listed:?}"))?;
        ensure!(
            f_info.state == namzu::ExecutionState::Running && !f_info.detachable,
            "{f_info:?}"
        );
        let b_info = of("listed-bg").ok_or(format!("listed-bg not listed: {listed:?}"))?;
        ensure!(
            b_info.state == namzu::ExecutionState::Running && b_info.detachable,
            "{b_info:?}"
        );
        drop(bg);
        token.cancel();
        while fg.next().await.is_some() {}
        // The detachable one finishes on its own.
        let mut exited = None;
        for _ in 0..100 {
            let now = cmds.list().await.ctx("list again")?;
            ensure!(
                now.iter().all(|e| e.execution_id != fg_id),
                "a cancelled foreground execution is still listed: {now:?}"
            );
            if let Some(e) = now.into_iter().find(|e| e.execution_id == "listed-bg") {
                if let namzu::ExecutionState::Exited(st) = e.state {
                    exited = Some((st, e.output_bytes, e.pid));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (st, bytes, pid) = exited.ok_or("listed-bg never showed as exited")?;
        ensure!(
            st.code == Some(4) && bytes == 5 && pid.is_some(),
            "{st:?}, {bytes} bytes, pid {pid:?}"
        );
        Ok(())
    })
    .await
}
