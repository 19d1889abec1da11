//! Commands run to completion: output, exit codes and signals, environment, timeouts, cancellation, concurrency, output caps, and what destroy does to every operation.

use super::common::*;

/// A command runs, its stdout is returned byte-exact, and exit 0 is success.
pub(super) async fn exec_basics(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let out = sb
            .commands()
            .run(ExecRequest::new("echo").arg("hello"))
            .await
            .ctx("echo")?;
        ensure!(&out.stdout[..] == b"hello\n", "stdout {:?}", out.stdout);
        ensure!(out.stderr.is_empty(), "stderr {:?}", out.stderr);
        ensure!(
            out.status.success() && out.status.signal.is_none(),
            "status {:?}",
            out.status
        );
        ensure!(!out.status.timed_out && !out.status.cancelled, "flags {:?}", out.status);
        Ok(())
    })
    .await
}

/// Exit codes come back as codes, deaths by signal as signals.
pub(super) async fn exit_codes_and_signals(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let out = sh(&sb, "exit 3").await?;
        ensure!(
            out.status.code == Some(3) && out.status.signal.is_none(),
            "exit 3 gave {:?}",
            out.status
        );
        let out = sh(&sb, "kill -TERM $$").await?;
        ensure!(
            out.status.code.is_none() && out.status.signal == Some(15),
            "kill -TERM gave {:?}",
            out.status
        );
        ensure!(out.status.shell_code() == 143, "shell code {}", out.status.shell_code());
        let out = sh(&sb, "kill -KILL $$").await?;
        ensure!(out.status.signal == Some(9), "kill -KILL gave {:?}", out.status);
        Ok(())
    })
    .await
}

/// stdout and stderr never mix, and each stream's offsets are contiguous
/// from 0.
pub(super) async fn stdout_stderr_separated_with_offsets(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "i=0; while [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done";
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell(script))
            .await
            .ctx("exec_stream")?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut exit = None;
        while let Some(ev) = s.next().await {
            match ev.ctx("event")? {
                ExecEvent::Stdout { offset, data } => {
                    ensure!(offset == out.len() as u64, "stdout offset {offset} != {}", out.len());
                    out.extend_from_slice(&data);
                }
                ExecEvent::Stderr { offset, data } => {
                    ensure!(offset == err.len() as u64, "stderr offset {offset} != {}", err.len());
                    err.extend_from_slice(&data);
                }
                ExecEvent::Exit(x) => exit = Some(x),
            }
        }
        let want_out: String = (0..200).map(|i| format!("out{i}\n")).collect();
        let want_err: String = (0..200).map(|i| format!("err{i}\n")).collect();
        ensure!(out == want_out.as_bytes(), "stdout mixed or lost");
        ensure!(err == want_err.as_bytes(), "stderr mixed or lost");
        let exit = exit.ok_or("no exit event")?;
        ensure!(
            exit.stdout_bytes == out.len() as u64 && exit.stderr_bytes == err.len() as u64,
            "byte totals {exit:?}"
        );
        Ok(())
    })
    .await
}

/// Environment (spec-wide and per command), working directory and both
/// forms of stdin reach the command.
pub(super) async fn env_cwd_stdin(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        env: vec![("SPEC_VAR".into(), "from-spec".into())],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let out = sb
            .commands()
            .run(ExecRequest::shell("printf '%s %s' \"$SPEC_VAR\" \"$CMD_VAR\"").env("CMD_VAR", "from-cmd"))
            .await
            .ctx("env")?;
        ensure!(&out.stdout[..] == b"from-spec from-cmd", "env gave {:?}", out.stdout);
        sb.files().mkdir_all("sub/dir").await.ctx("mkdir")?;
        let out = sb
            .commands()
            .run(ExecRequest::new("pwd").cwd("sub/dir"))
            .await
            .ctx("pwd")?;
        ensure!(out.stdout.ends_with(b"/sub/dir\n"), "cwd gave {:?}", out.stdout);
        let out = sb
            .commands()
            .run(ExecRequest::new("cat").stdin(Bytes::from_static(b"stdin bytes")))
            .await
            .ctx("cat")?;
        ensure!(&out.stdout[..] == b"stdin bytes", "stdin bytes gave {:?}", out.stdout);
        let chunks = futures::stream::iter((0..100).map(|i| Bytes::from(format!("chunk{i};"))));
        let out = sb
            .commands()
            .run(ExecRequest::new("cat").stdin_stream(chunks))
            .await
            .ctx("cat stream")?;
        let want: String = (0..100).map(|i| format!("chunk{i};")).collect();
        ensure!(
            out.stdout == want.as_bytes(),
            "streamed stdin gave {} bytes",
            out.stdout.len()
        );
        let out = sb.commands().run(ExecRequest::new("cat")).await.ctx("cat null")?;
        ensure!(
            out.stdout.is_empty() && out.status.success(),
            "null stdin: {:?}",
            out.status
        );
        Ok(())
    })
    .await
}

/// Arguments are bytes: a non-UTF-8 argument arrives unchanged.
pub(super) async fn non_utf8_argv_round_trips(f: Factory) -> Outcome {
    use std::os::unix::ffi::OsStrExt;
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let arg = std::ffi::OsStr::from_bytes(b"\xff\xfe-not-utf8\x80");
        let out = sb
            .commands()
            .run(ExecRequest::new("printf").arg("%s").arg(arg))
            .await
            .ctx("printf")?;
        ensure!(&out.stdout[..] == arg.as_bytes(), "got {:?}", out.stdout);
        Ok(())
    })
    .await
}

/// A command that cannot start is a typed SpawnFailed, not an exit code.
pub(super) async fn missing_command_is_spawn_failed(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        match sb.commands().run(ExecRequest::new("/no/such/namzu-binary")).await {
            Err(Error::SpawnFailed { command, errno, .. }) => {
                ensure!(command == Path::new("/no/such/namzu-binary"), "command {command:?}");
                ensure!(errno == 2, "errno {errno}");
            }
            other => return Err(format!("expected SpawnFailed, got {other:?}")),
        }
        // The sandbox is still usable afterwards.
        ensure!(
            sh(&sb, "true").await?.status.success(),
            "sandbox unusable after a failed spawn"
        );
        Ok(())
    })
    .await
}

/// A timeout kills the command AND what it started in its group, and the
/// result says timed_out; afterwards no process of the group exists.
pub(super) async fn timeout_kills_the_whole_group(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "sleep 300 & echo $! > bg.pid; echo $$ > fg.pid; sleep 300";
        let out = sb
            .commands()
            .run(ExecRequest::shell(script).timeout(Duration::from_millis(700)))
            .await
            .ctx("exec")?;
        ensure!(out.status.timed_out, "not timed out: {:?}", out.status);
        ensure!(out.status.signal == Some(9), "not killed: {:?}", out.status);
        ensure!(out.duration < Duration::from_secs(60), "took {:?}", out.duration);
        for f in ["bg.pid", "fg.pid"] {
            let pid = String::from_utf8_lossy(&sb.files().read(f).await.ctx(f)?)
                .trim()
                .to_owned();
            ensure!(!pid.is_empty(), "{f} empty");
            ensure!(
                !pid_alive(&sb, &pid).await?,
                "process {pid} from {f} survived the timeout"
            );
        }
        Ok(())
    })
    .await
}

/// A timeout above the sandbox maximum is refused by the limit's name.
pub(super) async fn timeout_above_the_maximum_is_refused(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("sandbox_max_timeout_ms".into(), 5_000)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        match sb
            .commands()
            .run(ExecRequest::new("true").timeout(Duration::from_secs(6)))
            .await
        {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(
                    limit == "sandbox_max_timeout_ms" && value == 5_000,
                    "limit {limit}={value}"
                );
            }
            other => return Err(format!("expected LimitExceeded, got {other:?}")),
        }
        ensure!(
            sb.commands()
                .run(ExecRequest::new("true").timeout(Duration::from_secs(5)))
                .await
                .ctx("at the max")?
                .status
                .success(),
            "max itself refused"
        );
        Ok(())
    })
    .await
}

/// Cancelling the token kills the whole group, the stream ends with a
/// cancelled exit, and nothing of the group survives.
pub(super) async fn cancel_kills_the_whole_group(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        let script = "sleep 300 & echo $! > bg.pid; echo ready; sleep 300";
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell(script).cancel_token(token.clone()))
            .await
            .ctx("exec_stream")?;
        let fg = s.pid.ok_or("no pid")?;
        let mut exit = None;
        while let Some(ev) = s.next().await {
            match ev.ctx("event")? {
                ExecEvent::Stdout { data, .. } if data.starts_with(b"ready") => token.cancel(),
                ExecEvent::Exit(x) => exit = Some(x),
                _ => {}
            }
        }
        let exit = exit.ok_or("no exit")?;
        ensure!(
            exit.status.cancelled && exit.status.signal == Some(9),
            "exit {:?}",
            exit.status
        );
        let bg = String::from_utf8_lossy(&sb.files().read("bg.pid").await.ctx("bg.pid")?)
            .trim()
            .to_owned();
        ensure!(
            !pid_alive(&sb, &bg).await?,
            "background process {bg} survived the cancel"
        );
        ensure!(
            !pid_alive(&sb, &fg.to_string()).await?,
            "leader {fg} survived the cancel"
        );
        Ok(())
    })
    .await
}

/// A cancel that lands before the start is not lost: the command never runs.
pub(super) async fn cancel_before_start_never_runs(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        token.cancel();
        let out = sb
            .commands()
            .run(ExecRequest::shell("echo ran > ran.txt").cancel_token(token))
            .await
            .ctx("exec")?;
        ensure!(
            out.status.cancelled && out.status.code.is_none(),
            "status {:?}",
            out.status
        );
        match sb.files().stat("ran.txt").await {
            Err(Error::NotFound { .. }) => Ok(()),
            other => Err(format!("the command ran anyway: {other:?}")),
        }
    })
    .await
}

/// A group the agent cannot prove dead (a zombie kept in the group by a
/// parent that left it) makes cancel answer RemoteCancellationUnknown, and
/// the sandbox refuses further work while still answering health.
pub(super) async fn unconfirmed_cancel_retires_the_sandbox(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("cancel_confirm_ms".into(), 400)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        // The subshell forks a sleeper into the group, then leaves the group
        // with setsid and never reaps it: after the group kill the sleeper
        // stays a zombie in the group, which no signal can remove.
        let script = "(sleep 30 & exec setsid sleep 30) & echo ready; wait";
        let token = CancellationToken::new();
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell(script).cancel_token(token.clone()))
            .await
            .ctx("exec_stream")?;
        let execution_id = s.execution_id.clone();
        let mut last = None;
        while let Some(ev) = s.next().await {
            match ev {
                Ok(ExecEvent::Stdout { data, .. }) if data.starts_with(b"ready") => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    token.cancel();
                }
                Ok(_) => {}
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        let released = match last {
            Some(Error::RemoteCancellationUnknown {
                execution_id: id,
                retirement,
            }) => {
                ensure!(id == execution_id, "id {id} != {execution_id}");
                retirement
            }
            other => return Err(format!("expected RemoteCancellationUnknown, got {other:?}")),
        };
        // A tier that gives the sandbox back (a cluster's claim) says so in
        // the error, and from then on the sandbox is gone for every op. A
        // tier that keeps it (a cluster's workspace, whose disk is what its
        // holder came for) says that instead, and the agent's fence holds.
        let released = released.filter(|note| !note.starts_with("workspace-kept:"));
        if let Some(note) = released {
            ensure!(
                note.contains("released"),
                "the retirement note names no release: {note}"
            );
            for r in [
                sb.commands().run(ExecRequest::new("true")).await.map(drop),
                sb.files().list(Path::new("/workspace")).await.map(drop),
                sb.agent().health().await.map(drop),
            ] {
                ensure!(
                    matches!(r, Err(Error::SandboxGone { .. })),
                    "a released sandbox still answered: {r:?}"
                );
            }
            return Ok(());
        }
        match sb.commands().run(ExecRequest::new("true")).await {
            Err(Error::AgentRetiring { .. }) => {}
            other => return Err(format!("retired sandbox still runs commands: {other:?}")),
        }
        // Audit item 13.9: reads, lists and metadata ops were served by a
        // retiring agent before; every one is fenced now.
        let ws = Path::new("/workspace");
        let fenced: Vec<(&str, Result<(), Error>)> = vec![
            ("read_file", sb.files().read(&ws.join("x")).await.map(drop)),
            ("list_files", sb.files().list(ws).await.map(drop)),
            ("stat", sb.files().stat(ws).await.map(drop)),
            ("mkdir", sb.files().mkdir(&ws.join("d")).await),
            ("remove", sb.files().remove(&ws.join("x")).await),
            ("rename", sb.files().rename(&ws.join("x"), &ws.join("y")).await),
            ("list_sessions", sb.sessions().list().await.map(drop)),
            ("quiesce", sb.quiesce(Duration::from_millis(10)).await.map(drop)),
        ];
        for (op, r) in fenced {
            ensure!(
                matches!(r, Err(Error::AgentRetiring { .. })),
                "a retiring agent served {op}: {r:?}"
            );
        }
        let h = sb.agent().health().await.ctx("health of a retiring agent")?;
        ensure!(h.retiring, "health does not say retiring");
        Ok(())
    })
    .await
}

/// Eight concurrent commands on one link each get exactly their own output.
pub(super) async fn concurrent_execs_do_not_cross_talk(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let runs = (0..8).map(|n| {
            let sb = sb.clone();
            async move {
                let script = format!("i=0; while [ $i -lt 2000 ]; do echo {n}-$i; echo e{n} >&2; i=$((i+1)); done");
                (n, sb.commands().run(script).await)
            }
        });
        for (n, out) in futures::future::join_all(runs).await {
            let out = out.ctx("exec")?;
            let want: String = (0..2000).map(|i| format!("{n}-{i}\n")).collect();
            ensure!(out.stdout == want.as_bytes(), "exec {n}: stdout is not its own");
            ensure!(
                out.stderr == format!("e{n}\n").repeat(2000).as_bytes(),
                "exec {n}: stderr is not its own"
            );
        }
        Ok(())
    })
    .await
}

/// Output past `max_output_bytes` is dropped and reported, and the command
/// still runs to completion (it never blocks on a full pipe).
pub(super) async fn output_cap_reports_truncation(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_output_bytes".into(), 1000)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let out = sh(&sb, "head -c 300000 /dev/zero; echo done >&2").await?;
        ensure!(out.status.success(), "status {:?}", out.status);
        ensure!(
            out.stdout.len() == 1000 && out.stdout_truncated,
            "kept {} truncated={}",
            out.stdout.len(),
            out.stdout_truncated
        );
        ensure!(out.stdout_bytes == 300_000, "counted {}", out.stdout_bytes);
        ensure!(
            &out.stderr[..] == b"done\n" && !out.stderr_truncated,
            "stderr {:?}",
            out.stderr
        );
        Ok(())
    })
    .await
}

/// After destroy every op fails with SandboxDestroyed, and destroy again is
/// a no-op.
pub(super) async fn every_op_is_refused_after_destroy(f: Factory) -> Outcome {
    let sb: Sandbox = f(SandboxSpec::default()).await.ctx("create")?;
    sb.destroy().await.ctx("destroy")?;
    let id = sb.id().to_owned();
    let is_gone = |e: &Error| matches!(e, Error::SandboxDestroyed { id: i } if *i == id);
    let r = sb.commands().run(ExecRequest::new("true")).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "exec: {r:?}");
    let r = sb.files().read("x").await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "read: {r:?}");
    let r = sb.files().write("x", Bytes::new()).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "write: {r:?}");
    let r = sb.files().list(".").await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "list: {r:?}");
    sb.destroy().await.ctx("second destroy")?;
    Ok(())
}

/// A host that drops a running command's stream has let go of it: the
/// agent kills the command's group promptly rather than leaving it running
/// unwatched until the sandbox ends.
pub(super) async fn dropping_an_exec_stream_kills_the_command(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell("echo $$ > held.pid; echo go; exec sleep 300"))
            .await
            .ctx("exec_stream")?;
        match s.next().await {
            Some(Ok(ExecEvent::Stdout { .. })) => {}
            other => return Err(format!("no output: {other:?}")),
        }
        let pid = String::from_utf8_lossy(&sb.files().read("held.pid").await.ctx("pid")?)
            .trim()
            .to_owned();
        drop(s);
        for _ in 0..100 {
            if !pid_alive(&sb, &pid).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("command {pid} still runs 2 s after its stream was dropped"))
    })
    .await
}
