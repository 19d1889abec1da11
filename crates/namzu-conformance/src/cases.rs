//! The cases. Each states the promise it checks in its doc comment.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use namzu::features as feat;
use namzu::{
    ByteRange, CancellationToken, Error, ExecEvent, ExecRequest, FileKind, Sandbox, SandboxSpec, WalkOptions,
    WriteOptions,
};

use crate::util::{check_pattern, pattern, with_sandbox, Ctx, PatternReader};

mod limits;
use crate::{ensure, Case, Factory, Outcome};
use limits::*;

macro_rules! register {
    ($( $name:ident [$($need:expr),*] ),* $(,)?) => {
        vec![$( Case { name: stringify!($name), needs: &[$($need),*], run: |f| Box::pin($name(f)) } ),*]
    };
}

pub fn all() -> Vec<Case> {
    register![
        exec_basics[feat::EXEC],
        exit_codes_and_signals[feat::EXEC],
        stdout_stderr_separated_with_offsets[feat::EXEC],
        env_cwd_stdin[feat::EXEC, feat::EXEC_STDIN_STREAM, feat::FILES_MKDIR],
        non_utf8_argv_round_trips[feat::EXEC],
        missing_command_is_spawn_failed[feat::EXEC],
        timeout_kills_the_whole_group[feat::EXEC],
        timeout_above_the_maximum_is_refused[feat::EXEC],
        cancel_kills_the_whole_group[feat::EXEC, feat::EXEC_CANCEL],
        cancel_before_start_never_runs[feat::EXEC, feat::EXEC_CANCEL, feat::FILES_STAT],
        unconfirmed_cancel_retires_the_sandbox[feat::EXEC, feat::EXEC_CANCEL],
        concurrent_execs_do_not_cross_talk[feat::EXEC],
        output_cap_reports_truncation[feat::EXEC],
        write_64mib_round_trips[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM],
        readers_never_see_a_partial_write[feat::FILES_WRITE, feat::FILES_READ],
        failed_write_leaves_the_old_file[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        oversized_write_is_refused_by_limit[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        abandoned_write_leaves_the_old_file[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_LIST],
        streamed_read_refuses_non_regular_files[feat::FILES_READ_STREAM, feat::FILES_READ, feat::EXEC],
        mode_is_preserved[feat::FILES_WRITE, feat::FILES_STAT, feat::EXEC],
        ranged_reads[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM],
        streamed_1gib_read_keeps_agent_memory_bounded[feat::FILES_WRITE, feat::FILES_READ_STREAM],
        list_stat_mkdir_remove_rename[feat::FILES_WRITE, feat::FILES_LIST, feat::FILES_STAT, feat::FILES_MKDIR, feat::FILES_REMOVE, feat::FILES_RENAME],
        walk_reports_symlinks_and_honours_limits[feat::FILES_WALK, feat::FILES_WRITE, feat::FILES_MKDIR, feat::EXEC],
        path_escapes_are_refused[feat::FILES_WRITE, feat::FILES_READ, feat::FILES_READ_STREAM, feat::FILES_STAT, feat::FILES_RENAME, feat::FILES_REMOVE, feat::FILES_LIST, feat::EXEC],
        every_op_is_refused_after_destroy[feat::EXEC, feat::FILES_READ],
        tcp_into_the_sandbox_round_trips_with_half_close[feat::TCP_CONNECT, feat::EXEC, feat::FILES_WRITE],
        dropping_an_exec_stream_kills_the_command[feat::EXEC, feat::FILES_READ],
        terminal_runs_resizes_and_close_kills_the_session[feat::TERMINAL, feat::EXEC],
        terminal_login_shell_exit_code[feat::TERMINAL],
        quiesce_stops_everything_but_the_agent[feat::QUIESCE, feat::EXEC, feat::FILES_READ],
        flush_makes_the_workspace_durable[feat::FLUSH, feat::FILES_WRITE],
        detached_session_output_is_read_by_offset[feat::SESSIONS],
        session_ring_eviction_is_reported_as_dropped_bytes[feat::SESSIONS],
        kill_session_kills_the_whole_session[feat::SESSIONS, feat::EXEC, feat::FILES_READ],
        persistent_terminal_detaches_and_resumes[feat::TERMINAL, feat::SESSIONS],
        detachable_execution_outlives_its_stream_and_resumes_by_offset[feat::EXEC, feat::EXEC_ATTACH, feat::FILES_STAT],
        detachable_execution_refusals_are_typed[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL],
        detachable_execution_cancel_and_retention_limits[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL],
        evicted_execution_output_is_a_gap_and_truncation[feat::EXEC, feat::EXEC_ATTACH],
        cancel_before_start_of_a_detachable_execution_never_runs[feat::EXEC, feat::EXEC_ATTACH, feat::EXEC_CANCEL, feat::FILES_STAT],
        exited_execution_records_expire_after_the_ttl[feat::EXEC, feat::EXEC_ATTACH, feat::FILES_STAT],
        named_list_walk_and_session_limits_hold[feat::EXEC, feat::FILES_LIST, feat::FILES_WALK, feat::SESSIONS],
    ]
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

async fn sh(sb: &Arc<dyn Sandbox>, script: &str) -> Result<namzu::ExecOutput, String> {
    sb.exec(ExecRequest::shell(script)).await.ctx(script)
}

const OLD: &[u8] = b"old contents";

/// Writes `keep.txt` with [`OLD`], the file the write-failure cases guard.
async fn seed_old(sb: &Arc<dyn Sandbox>) -> Outcome {
    sb.write_file(p("keep.txt"), Bytes::from_static(OLD), WriteOptions::default())
        .await
        .ctx("seed")
        .map(drop)
}

/// `keep.txt` still holds [`OLD`] and nothing else is in the directory:
/// `Ok(false)` if a leftover remains (the caller may retry).
async fn old_file_alone(sb: &Arc<dyn Sandbox>) -> Result<bool, String> {
    let data = sb.read_file(p("keep.txt"), None).await.ctx("read back")?.data;
    ensure!(&data[..] == OLD, "old file changed: {} bytes", data.len());
    let names: Vec<_> = sb
        .list_files(p("."))
        .await
        .ctx("list")?
        .into_iter()
        .map(|e| e.name)
        .collect();
    Ok(names == ["keep.txt"])
}

/// Is a process with this pid still present (even as a zombie)?
async fn pid_alive(sb: &Arc<dyn Sandbox>, pid: &str) -> Result<bool, String> {
    Ok(sh(sb, &format!("kill -0 {pid} 2>/dev/null")).await?.status.success())
}

/// A command runs, its stdout is returned byte-exact, and exit 0 is success.
async fn exec_basics(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let out = sb.exec(ExecRequest::new("echo").arg("hello")).await.ctx("echo")?;
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
async fn exit_codes_and_signals(f: Factory) -> Outcome {
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
async fn stdout_stderr_separated_with_offsets(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "i=0; while [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done";
        let mut s = sb.exec_stream(ExecRequest::shell(script)).await.ctx("exec_stream")?;
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
async fn env_cwd_stdin(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        env: vec![("SPEC_VAR".into(), "from-spec".into())],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let out = sb
            .exec(ExecRequest::shell("printf '%s %s' \"$SPEC_VAR\" \"$CMD_VAR\"").env("CMD_VAR", "from-cmd"))
            .await
            .ctx("env")?;
        ensure!(&out.stdout[..] == b"from-spec from-cmd", "env gave {:?}", out.stdout);
        sb.mkdir(p("sub/dir"), true).await.ctx("mkdir")?;
        let out = sb.exec(ExecRequest::new("pwd").cwd("sub/dir")).await.ctx("pwd")?;
        ensure!(out.stdout.ends_with(b"/sub/dir\n"), "cwd gave {:?}", out.stdout);
        let out = sb
            .exec(ExecRequest::new("cat").stdin(Bytes::from_static(b"stdin bytes")))
            .await
            .ctx("cat")?;
        ensure!(&out.stdout[..] == b"stdin bytes", "stdin bytes gave {:?}", out.stdout);
        let chunks = futures::stream::iter((0..100).map(|i| Bytes::from(format!("chunk{i};"))));
        let out = sb
            .exec(ExecRequest::new("cat").stdin_stream(chunks))
            .await
            .ctx("cat stream")?;
        let want: String = (0..100).map(|i| format!("chunk{i};")).collect();
        ensure!(
            out.stdout == want.as_bytes(),
            "streamed stdin gave {} bytes",
            out.stdout.len()
        );
        let out = sb.exec(ExecRequest::new("cat")).await.ctx("cat null")?;
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
async fn non_utf8_argv_round_trips(f: Factory) -> Outcome {
    use std::os::unix::ffi::OsStrExt;
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let arg = std::ffi::OsStr::from_bytes(b"\xff\xfe-not-utf8\x80");
        let out = sb
            .exec(ExecRequest::new("printf").arg("%s").arg(arg))
            .await
            .ctx("printf")?;
        ensure!(&out.stdout[..] == arg.as_bytes(), "got {:?}", out.stdout);
        Ok(())
    })
    .await
}

/// A command that cannot start is a typed SpawnFailed, not an exit code.
async fn missing_command_is_spawn_failed(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        match sb.exec(ExecRequest::new("/no/such/namzu-binary")).await {
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
async fn timeout_kills_the_whole_group(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "sleep 300 & echo $! > bg.pid; echo $$ > fg.pid; sleep 300";
        let out = sb
            .exec(ExecRequest::shell(script).timeout(Duration::from_millis(700)))
            .await
            .ctx("exec")?;
        ensure!(out.status.timed_out, "not timed out: {:?}", out.status);
        ensure!(out.status.signal == Some(9), "not killed: {:?}", out.status);
        ensure!(out.duration < Duration::from_secs(60), "took {:?}", out.duration);
        for f in ["bg.pid", "fg.pid"] {
            let pid = String::from_utf8_lossy(&sb.read_file(p(f), None).await.ctx(f)?.data)
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
async fn timeout_above_the_maximum_is_refused(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("sandbox_max_timeout_ms".into(), 5_000)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        match sb.exec(ExecRequest::new("true").timeout(Duration::from_secs(6))).await {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(
                    limit == "sandbox_max_timeout_ms" && value == 5_000,
                    "limit {limit}={value}"
                );
            }
            other => return Err(format!("expected LimitExceeded, got {other:?}")),
        }
        ensure!(
            sb.exec(ExecRequest::new("true").timeout(Duration::from_secs(5)))
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
async fn cancel_kills_the_whole_group(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        let script = "sleep 300 & echo $! > bg.pid; echo ready; sleep 300";
        let mut s = sb
            .exec_stream(ExecRequest::shell(script).cancel_token(token.clone()))
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
        let bg = String::from_utf8_lossy(&sb.read_file(p("bg.pid"), None).await.ctx("bg.pid")?.data)
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
async fn cancel_before_start_never_runs(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        token.cancel();
        let out = sb
            .exec(ExecRequest::shell("echo ran > ran.txt").cancel_token(token))
            .await
            .ctx("exec")?;
        ensure!(
            out.status.cancelled && out.status.code.is_none(),
            "status {:?}",
            out.status
        );
        match sb.stat(p("ran.txt")).await {
            Err(Error::NotFound { .. }) => Ok(()),
            other => Err(format!("the command ran anyway: {other:?}")),
        }
    })
    .await
}

/// A group the agent cannot prove dead (a zombie kept in the group by a
/// parent that left it) makes cancel answer RemoteCancellationUnknown, and
/// the sandbox refuses further work while still answering health.
async fn unconfirmed_cancel_retires_the_sandbox(f: Factory) -> Outcome {
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
            .exec_stream(ExecRequest::shell(script).cancel_token(token.clone()))
            .await
            .ctx("exec_stream")?;
        let exec_id = s.exec_id.clone();
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
        match last {
            Some(Error::RemoteCancellationUnknown { exec_id: id }) => ensure!(id == exec_id, "id {id} != {exec_id}"),
            other => return Err(format!("expected RemoteCancellationUnknown, got {other:?}")),
        }
        match sb.exec(ExecRequest::new("true")).await {
            Err(Error::AgentRetiring { .. }) => {}
            other => return Err(format!("retired sandbox still runs commands: {other:?}")),
        }
        // Audit item 13.9: reads, lists and metadata ops were served by a
        // retiring agent before; every one is fenced now.
        let ws = Path::new("/workspace");
        let fenced: Vec<(&str, Result<(), Error>)> = vec![
            ("read_file", sb.read_file(&ws.join("x"), None).await.map(drop)),
            ("list_files", sb.list_files(ws).await.map(drop)),
            ("stat", sb.stat(ws).await.map(drop)),
            ("mkdir", sb.mkdir(&ws.join("d"), false).await),
            ("remove", sb.remove(&ws.join("x"), false).await),
            ("rename", sb.rename(&ws.join("x"), &ws.join("y")).await),
            ("list_sessions", sb.list_sessions().await.map(drop)),
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
async fn concurrent_execs_do_not_cross_talk(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let runs = (0..8).map(|n| {
            let sb = sb.clone();
            async move {
                let script = format!("i=0; while [ $i -lt 2000 ]; do echo {n}-$i; echo e{n} >&2; i=$((i+1)); done");
                (n, sb.exec(ExecRequest::shell(script)).await)
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
async fn output_cap_reports_truncation(f: Factory) -> Outcome {
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

/// 64 MiB written from memory reads back byte-exact, whole-stream and by
/// ranges; a whole ReadFile above its limit is refused by name.
async fn write_64mib_round_trips(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        const N: usize = 64 << 20;
        let data = Bytes::from(pattern(7, N));
        let n = sb
            .write_file(p("big.bin"), data.clone(), WriteOptions::default())
            .await
            .ctx("write")?;
        ensure!(n == N as u64, "wrote {n}");
        let mut s = sb.read_file_stream(p("big.bin"), None).await.ctx("stream")?;
        let mut got = 0usize;
        while let Some(chunk) = s.next().await {
            let chunk = chunk.ctx("chunk")?;
            ensure!(
                data[got..got + chunk.len()] == chunk[..],
                "bytes differ near offset {got}"
            );
            got += chunk.len();
        }
        ensure!(got == N, "streamed {got} of {N}");
        let r = sb
            .read_file(
                p("big.bin"),
                Some(ByteRange {
                    offset: 10 << 20,
                    length: Some(1 << 20),
                }),
            )
            .await
            .ctx("range")?;
        ensure!(
            r.data[..] == data[10 << 20..11 << 20] && r.file_size == N as u64,
            "range differs"
        );
        match sb.read_file(p("big.bin"), None).await {
            Err(Error::LimitExceeded { limit, .. }) => ensure!(limit == "max_read_range_bytes", "limit {limit}"),
            other => {
                return Err(format!(
                    "whole read of 64 MiB should exceed the range limit, got {other:?}"
                ))
            }
        }
        Ok(())
    })
    .await
}

/// A write held midway (its source paused after 1.5 MiB of 4): every read
/// meanwhile sees the old file whole; once it finishes, the new one whole.
/// Then the same under a stream of rewrites.
async fn readers_never_see_a_partial_write(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        const N: usize = 1 << 20;
        let a = Bytes::from(vec![b'a'; N]);
        let b = Bytes::from(vec![b'b'; 2 * N]);
        sb.write_file(p("f"), a.clone(), WriteOptions::default())
            .await
            .ctx("seed")?;
        let whole = |data: &[u8]| data == &a[..];
        let (paused_tx, paused) = tokio::sync::oneshot::channel();
        let (resume, resume_rx) = tokio::sync::oneshot::channel();
        let reader = PatternReader::new(7, 4 << 20).pausing_at(3 << 19, paused_tx, resume_rx);
        let held = {
            let sb = sb.clone();
            tokio::spawn(async move {
                sb.write_file_from(p("f"), Box::new(reader), WriteOptions::default())
                    .await
            })
        };
        tokio::time::timeout(Duration::from_secs(30), paused)
            .await
            .ctx("the writer never reached its pause")?
            .ctx("pause")?;
        // 1.5 MiB are in flight or in the temporary by now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 0..5 {
            let r = sb.read_file(p("f"), None).await.ctx("read during the write")?;
            ensure!(
                whole(&r.data),
                "read {i} during the held write saw {} bytes, not the old file",
                r.data.len()
            );
        }
        let _ = resume.send(());
        held.await.ctx("writer task")?.ctx("held write")?;
        let r = sb.read_file(p("f"), None).await.ctx("read after")?;
        ensure!(r.data.len() == 4 << 20, "after the write: {} bytes", r.data.len());
        crate::util::check_pattern(7, 0, &r.data)?;

        let writer = {
            let sb = sb.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let d = if i % 2 == 0 { b.clone() } else { a.clone() };
                    sb.write_file(p("f"), d, WriteOptions::default()).await?;
                }
                Ok::<_, Error>(())
            })
        };
        let mut reads = 0;
        while !writer.is_finished() || reads < 5 {
            let r = sb
                .read_file(
                    p("f"),
                    Some(ByteRange {
                        offset: 0,
                        length: Some(4 * N as u64),
                    }),
                )
                .await
                .ctx("read")?;
            let whole_a = r.data.len() == N && r.data.iter().all(|&c| c == b'a');
            let whole_b = r.data.len() == 2 * N && r.data.iter().all(|&c| c == b'b');
            let whole_p = r.data.len() == 4 << 20;
            ensure!(
                whole_a || whole_b || whole_p,
                "read {reads} saw a partial file of {} bytes",
                r.data.len()
            );
            reads += 1;
        }
        writer.await.ctx("writer task")?.ctx("writer")?;
        Ok(())
    })
    .await
}

/// A write whose source fails part-way leaves the previous contents and no
/// temporary file behind.
async fn failed_write_leaves_the_old_file(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        seed_old(&sb).await?;
        let reader = PatternReader::new(1, 8 << 20).failing_at(3 << 20);
        let r = sb
            .write_file_from(p("keep.txt"), Box::new(reader), WriteOptions::default())
            .await;
        ensure!(
            matches!(r, Err(Error::LocalIo { .. })),
            "expected the local read error, got {r:?}"
        );
        ensure!(old_file_alone(&sb).await?, "temporary left behind");
        Ok(())
    })
    .await
}

/// A write over `max_write_bytes` is refused by name and changes nothing.
async fn oversized_write_is_refused_by_limit(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_write_bytes".into(), 1 << 20)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        seed_old(&sb).await?;
        let r = sb
            .write_file(p("keep.txt"), Bytes::from(vec![0u8; 2 << 20]), WriteOptions::default())
            .await;
        match r {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_write_bytes" && value == 1 << 20, "{limit}={value}")
            }
            other => return Err(format!("expected LimitExceeded, got {other:?}")),
        }
        ensure!(old_file_alone(&sb).await?, "temporary left behind");
        Ok(())
    })
    .await
}

/// A write the host abandons mid-stream (its future dropped) leaves the
/// previous contents, and its temporary is removed.
async fn abandoned_write_leaves_the_old_file(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        seed_old(&sb).await?;
        // 2 MiB arrive, then the source stalls forever.
        let stalled = tokio::io::AsyncReadExt::chain(PatternReader::new(5, 2 << 20), Stall);
        let write = sb.write_file_from(p("keep.txt"), Box::new(stalled), WriteOptions::default());
        ensure!(
            tokio::time::timeout(Duration::from_millis(500), write).await.is_err(),
            "stalled write finished"
        );
        // The agent notices the reset stream asynchronously.
        for _ in 0..200 {
            if old_file_alone(&sb).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err("temporary left behind".into())
    })
    .await
}

/// A reader that never yields.
struct Stall;
impl tokio::io::AsyncRead for Stall {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Pending
    }
}

/// Streamed and whole reads refuse a fifo (and never block on it) and a
/// directory, each with its own typed error.
async fn streamed_read_refuses_non_regular_files(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(sh(&sb, "mkfifo pipe && mkdir dir").await?.status.success(), "mkfifo");
        let r = tokio::time::timeout(Duration::from_secs(10), sb.read_file_stream(p("pipe"), None))
            .await
            .ctx("fifo blocked")?;
        ensure!(
            matches!(r, Err(Error::NotRegularFile { .. })),
            "fifo stream: {:?}",
            r.err()
        );
        let r = tokio::time::timeout(Duration::from_secs(10), sb.read_file(p("pipe"), None))
            .await
            .ctx("fifo blocked")?;
        ensure!(
            matches!(r, Err(Error::NotRegularFile { .. })),
            "fifo read: {:?}",
            r.err()
        );
        let r = sb.read_file_stream(p("dir"), None).await;
        ensure!(
            matches!(r, Err(Error::IsADirectory { .. })),
            "dir stream: {:?}",
            r.err()
        );
        Ok(())
    })
    .await
}

/// A new file takes the requested mode; an overwrite keeps the target's.
async fn mode_is_preserved(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = WriteOptions {
            mode: Some(0o600),
            ..Default::default()
        };
        sb.write_file(p("new.sh"), Bytes::from_static(b"#!/bin/sh\necho hi\n"), opts)
            .await
            .ctx("write")?;
        ensure!(sb.stat(p("new.sh")).await.ctx("stat")?.mode == 0o600, "new file mode");
        ensure!(sh(&sb, "chmod 0751 new.sh").await?.status.success(), "chmod");
        sb.write_file(
            p("new.sh"),
            Bytes::from_static(b"#!/bin/sh\necho again\n"),
            WriteOptions::default(),
        )
        .await
        .ctx("overwrite")?;
        let st = sb.stat(p("new.sh")).await.ctx("stat")?;
        ensure!(st.mode == 0o751, "overwrite changed mode to {:o}", st.mode);
        let out = sh(&sb, "./new.sh").await?;
        ensure!(
            &out.stdout[..] == b"again\n",
            "new contents not executed: {:?}",
            out.stdout
        );
        Ok(())
    })
    .await
}

/// Ranged reads: the answer carries the file size; a range past EOF returns
/// what exists; a stream honours offset and length.
async fn ranged_reads(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        sb.write_file(p("r.txt"), Bytes::from_static(b"0123456789"), WriteOptions::default())
            .await
            .ctx("write")?;
        let rng = |o, l| Some(ByteRange { offset: o, length: l });
        let r = sb.read_file(p("r.txt"), rng(2, Some(3))).await.ctx("2+3")?;
        ensure!(
            &r.data[..] == b"234" && r.file_size == 10 && !r.eof,
            "2+3 gave {:?} size {} eof {}",
            r.data,
            r.file_size,
            r.eof
        );
        let r = sb.read_file(p("r.txt"), rng(8, Some(10))).await.ctx("8+10")?;
        ensure!(&r.data[..] == b"89" && r.eof, "8+10 gave {:?} eof {}", r.data, r.eof);
        let r = sb.read_file(p("r.txt"), rng(20, Some(5))).await.ctx("20+5")?;
        ensure!(
            r.data.is_empty() && r.eof && r.file_size == 10,
            "past EOF gave {:?}",
            r.data
        );
        let r = sb.read_file(p("r.txt"), rng(4, None)).await.ctx("4+")?;
        ensure!(&r.data[..] == b"456789" && r.eof, "4.. gave {:?}", r.data);
        let mut s = sb.read_file_stream(p("r.txt"), rng(3, Some(4))).await.ctx("stream")?;
        let mut got = Vec::new();
        while let Some(c) = s.next().await {
            got.extend_from_slice(&c.ctx("chunk")?);
        }
        ensure!(got == b"3456", "stream range gave {got:?}");
        let r = sb.read_file(p("empty"), None).await;
        ensure!(matches!(r, Err(Error::NotFound { .. })), "missing file gave {r:?}");
        Ok(())
    })
    .await
}

/// A 1 GiB file streams out byte-exact while the agent's peak RSS stays
/// far below the file size.
async fn streamed_1gib_read_keeps_agent_memory_bounded(f: Factory) -> Outcome {
    const N: u64 = 1 << 30;
    const BOUND: u64 = 96 << 20;
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let before = sb.agent().health().await.ctx("health")?;
        sb.write_file_from(
            p("huge.bin"),
            Box::new(PatternReader::new(3, N)),
            WriteOptions::default(),
        )
        .await
        .ctx("write 1 GiB")?;
        let after_write = sb.agent().health().await.ctx("health")?;
        let mut s = sb.read_file_stream(p("huge.bin"), None).await.ctx("stream")?;
        let mut off = 0u64;
        while let Some(c) = s.next().await {
            let c = c.ctx("chunk")?;
            // Checking every byte of 1 GiB costs more than the transfer; a
            // sampled check still catches misordered or shifted chunks.
            check_pattern(3, off, &c[..c.len().min(64)])?;
            off += c.len() as u64;
        }
        ensure!(off == N, "streamed {off} of {N}");
        let after_read = sb.agent().health().await.ctx("health")?;
        let growth = after_read.peak_rss_bytes.saturating_sub(before.rss_bytes);
        eprintln!(
            "agent RSS: idle {} KiB, peak after 1 GiB write {} KiB, peak after 1 GiB read {} KiB",
            before.rss_bytes >> 10,
            after_write.peak_rss_bytes >> 10,
            after_read.peak_rss_bytes >> 10
        );
        ensure!(
            growth < BOUND,
            "agent peak RSS grew by {} MiB moving 1 GiB",
            growth >> 20
        );
        Ok(())
    })
    .await
}

/// The basic file ops, with their typed failures.
async fn list_stat_mkdir_remove_rename(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        sb.mkdir(p("d/e"), true).await.ctx("mkdir -p")?;
        ensure!(
            matches!(sb.mkdir(p("d"), false).await, Err(Error::AlreadyExists { .. })),
            "mkdir existing"
        );
        sb.write_file(p("d/x.txt"), Bytes::from_static(b"xx"), WriteOptions::default())
            .await
            .ctx("write")?;
        let st = sb.stat(p("d/x.txt")).await.ctx("stat")?;
        ensure!(st.kind == FileKind::File && st.size == 2, "stat {st:?}");
        let names: Vec<_> = sb
            .list_files(p("d"))
            .await
            .ctx("list")?
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
        ensure!(
            names == [("e".into(), FileKind::Dir), ("x.txt".into(), FileKind::File)],
            "list {names:?}"
        );
        ensure!(
            matches!(sb.list_files(p("d/x.txt")).await, Err(Error::NotADirectory { .. })),
            "list of a file"
        );
        sb.rename(p("d/x.txt"), p("d/e/y.txt")).await.ctx("rename")?;
        ensure!(
            matches!(sb.stat(p("d/x.txt")).await, Err(Error::NotFound { .. })),
            "old name remains"
        );
        ensure!(
            matches!(sb.remove(p("d"), false).await, Err(Error::DirectoryNotEmpty { .. })),
            "non-recursive remove of a tree"
        );
        sb.remove(p("d"), true).await.ctx("rm -r")?;
        ensure!(
            matches!(sb.stat(p("d")).await, Err(Error::NotFound { .. })),
            "tree remains"
        );
        ensure!(
            matches!(sb.remove(p("d"), true).await, Err(Error::NotFound { .. })),
            "remove of nothing"
        );
        Ok(())
    })
    .await
}

/// Walks are depth-first, skip hidden entries unless asked, report symlinks
/// without following them, honour max_depth, and tell a missing root from an
/// exhausted budget.
async fn walk_reports_symlinks_and_honours_limits(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(
            sh(
                &sb,
                "mkdir -p t/a/b t/.hid && touch t/a/b/deep t/a/f t/.hid/h t/z && ln -s a t/link && ln -s / t/root"
            )
            .await?
            .status
            .success(),
            "setup"
        );
        let collect = |opts: WalkOptions| {
            let sb = sb.clone();
            async move {
                let mut s = sb.walk_files(p("t"), opts).await?;
                let mut v = Vec::new();
                while let Some(e) = s.next().await {
                    match e {
                        Ok(e) => v.push((e.path.to_string_lossy().into_owned(), e.kind, e.depth)),
                        Err(err) => return Ok::<_, Error>((v, Some(err))),
                    }
                }
                Ok((v, None))
            }
        };
        let (all, err) = collect(WalkOptions::default()).await.ctx("walk")?;
        ensure!(err.is_none(), "walk failed: {err:?}");
        let paths: Vec<&str> = all.iter().map(|e| e.0.as_str()).collect();
        ensure!(
            paths == ["t/a", "t/a/b", "t/a/b/deep", "t/a/f", "t/link", "t/root", "t/z"],
            "walk order {paths:?}"
        );
        ensure!(
            all.iter().any(|e| e.0 == "t/link" && e.1 == FileKind::Symlink),
            "symlink not reported as one"
        );
        let (hidden, _) = collect(WalkOptions {
            include_hidden: true,
            ..Default::default()
        })
        .await
        .ctx("walk hidden")?;
        ensure!(
            hidden.iter().any(|e| e.0 == "t/.hid/h"),
            "include_hidden missed t/.hid/h"
        );
        let (shallow, _) = collect(WalkOptions {
            max_depth: 1,
            ..Default::default()
        })
        .await
        .ctx("walk depth 1")?;
        ensure!(
            shallow.iter().all(|e| e.2 == 1) && shallow.len() == 4,
            "depth 1 gave {shallow:?}"
        );
        let (some, err) = collect(WalkOptions {
            max_entries: 3,
            ..Default::default()
        })
        .await
        .ctx("walk budget")?;
        ensure!(some.len() == 3, "budget 3 gave {} entries", some.len());
        ensure!(
            matches!(err, Some(Error::WalkLimit { limit: 3, .. })),
            "budget overrun gave {err:?}"
        );
        match sb.walk_files(p("nope"), WalkOptions::default()).await {
            Err(Error::NotFound { .. }) => {}
            Ok(_) => return Err("walk of a missing root succeeded".into()),
            Err(e) => return Err(format!("walk of a missing root: {e:?}")),
        }
        Ok(())
    })
    .await
}

/// `..`, absolute paths outside the roots and symlinks that point out are
/// refused as PathEscape, for reads, writes, renames and removes.
async fn path_escapes_are_refused(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(
            sh(
                &sb,
                "ln -s / rootlink && ln -s ../../../../../../etc up && mkdir -p d && ln -s /tmp d/tmplink"
            )
            .await?
            .status
            .success(),
            "setup"
        );
        // Absolute paths outside every root escape too; where a root is "/"
        // (the boundary is the mount namespace) there is no such path.
        let roots = sb.agent().info().roots.clone();
        let outside = Path::new("/etc/passwd");
        let mut escapes = vec!["../x", "a/../../x", "rootlink/etc/passwd", "up/passwd", "d/tmplink/x"];
        if roots.iter().any(|r| outside.starts_with(r)) {
            sb.read_file(outside, None).await.ctx("read of a path inside a root")?;
        } else {
            escapes.push("/etc/passwd");
        }
        for e in escapes {
            let r = sb.read_file(p(e), None).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "read {e}: {r:?}");
            let r = sb
                .write_file(p(e), Bytes::from_static(b"pwn"), WriteOptions::default())
                .await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "write {e}: {r:?}");
            let r = sb.read_file_stream(p(e), None).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "stream {e}: {:?}", r.err());
            let r = sb.list_files(p(e)).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "list {e}: {r:?}");
        }
        let r = sb.rename(p("d"), p("../moved")).await;
        ensure!(matches!(r, Err(Error::PathEscape { .. })), "rename out: {r:?}");
        let r = sb.remove(p("rootlink/tmp"), true).await;
        ensure!(
            matches!(r, Err(Error::PathEscape { .. })),
            "remove through a link: {r:?}"
        );
        // The link itself is inside and may be inspected and removed.
        let st = sb.stat(p("rootlink")).await.ctx("stat link")?;
        ensure!(
            st.kind == FileKind::Symlink && st.symlink_target.as_deref() == Some(Path::new("/")),
            "stat link {st:?}"
        );
        sb.remove(p("rootlink"), false).await.ctx("remove link")?;
        Ok(())
    })
    .await
}

/// After destroy every op fails with SandboxDestroyed, and destroy again is
/// a no-op.
async fn every_op_is_refused_after_destroy(f: Factory) -> Outcome {
    let sb: Arc<dyn Sandbox> = Arc::from(f(SandboxSpec::default()).await.ctx("create")?);
    sb.destroy().await.ctx("destroy")?;
    let id = sb.id().to_owned();
    let is_gone = |e: &Error| matches!(e, Error::SandboxDestroyed { id: i } if *i == id);
    let r = sb.exec(ExecRequest::new("true")).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "exec: {r:?}");
    let r = sb.read_file(p("x"), None).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "read: {r:?}");
    let r = sb.write_file(p("x"), Bytes::new(), WriteOptions::default()).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "write: {r:?}");
    let r = sb.list_files(p(".")).await;
    ensure!(r.as_ref().err().is_some_and(is_gone), "list: {r:?}");
    sb.destroy().await.ctx("second destroy")?;
    Ok(())
}

/// A TCP connection to a server inside the sandbox carries 4 MiB both ways
/// byte-exact while writing and reading concurrently, half-closes both ways,
/// and a closed port is a typed refusal naming it.
async fn tcp_into_the_sandbox_round_trips_with_half_close(f: Factory) -> Outcome {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        crate::escape::install(&sb).await?;
        let port = 7000 + (std::process::id() % 1000) as u16;
        let mut server = sb
            .exec_stream(ExecRequest::new("./escape").arg("--echo-server").arg(port.to_string()))
            .await
            .ctx("start echo server")?;
        match server.next().await {
            Some(Ok(ExecEvent::Stdout { data, .. })) if data.starts_with(b"listening") => {}
            other => return Err(format!("echo server did not start: {other:?}")),
        }
        let conn = sb.open_tcp_connection(port).await.ctx("open tcp")?;
        let (mut rd, mut wr) = tokio::io::split(conn);
        let data = Bytes::from(pattern(11, 4 << 20));
        let sent = data.clone();
        // Writing 4 MiB before reading would deadlock on a bounded path if
        // backpressure were missing; reading concurrently must succeed.
        let writer = tokio::spawn(async move {
            wr.write_all(&sent).await?;
            wr.shutdown().await
        });
        let mut back = Vec::with_capacity(data.len());
        rd.read_to_end(&mut back).await.ctx("read echo")?;
        writer.await.ctx("writer")?.ctx("write")?;
        ensure!(
            back.len() == data.len(),
            "echoed {} of {} bytes",
            back.len(),
            data.len()
        );
        ensure!(back == data, "echo differs");
        let closed = port.wrapping_add(1);
        match sb.open_tcp_connection(closed).await {
            Err(Error::ConnectionRefused { port }) => ensure!(port == closed, "refusal names port {port}"),
            other => return Err(format!("expected ConnectionRefused, got {:?}", other.err())),
        }
        drop(server);
        Ok(())
    })
    .await
}

/// A host that drops a running command's stream has let go of it: the
/// agent kills the command's group promptly rather than leaving it running
/// unwatched until the sandbox ends.
async fn dropping_an_exec_stream_kills_the_command(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut s = sb
            .exec_stream(ExecRequest::shell("echo $$ > held.pid; echo go; exec sleep 300"))
            .await
            .ctx("exec_stream")?;
        match s.next().await {
            Some(Ok(ExecEvent::Stdout { .. })) => {}
            other => return Err(format!("no output: {other:?}")),
        }
        let pid = String::from_utf8_lossy(&sb.read_file(p("held.pid"), None).await.ctx("pid")?.data)
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

/// Reads terminal output until `needle` shows up; returns all output so far.
async fn read_until(t: &mut namzu::Terminal, seen: &mut String, needle: &str) -> Result<(), String> {
    read_until_fn(t, seen, needle, |s| s.contains(needle)).await
}

/// Reads terminal output into `seen` until `done(seen)` holds.
async fn read_until_fn(
    t: &mut namzu::Terminal,
    seen: &mut String,
    needle: &str,
    done: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(seen) {
        match tokio::time::timeout_at(deadline, t.next()).await {
            Err(_) => return Err(format!("no {needle:?} in terminal output: {seen:?}")),
            Ok(None) => return Err(format!("terminal ended before {needle:?}: {seen:?}")),
            Ok(Some(Ok(namzu::TerminalEvent::Output { data, .. }))) => seen.push_str(&String::from_utf8_lossy(&data)),
            Ok(Some(Ok(namzu::TerminalEvent::Exit(st)))) => {
                return Err(format!("terminal exited {st:?} before {needle:?}"))
            }
            Ok(Some(Err(e))) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// A pty runs a shell: input is typed, output comes back, a resize is seen
/// by the program, and closing kills the job it put in the background.
async fn terminal_runs_resizes_and_close_kills_the_session(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = namzu::TerminalOptions {
            command: Some("sh".into()),
            cols: 80,
            rows: 24,
            ..Default::default()
        };
        let mut t = sb.open_terminal(opts).await.ctx("open terminal")?;
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
async fn terminal_login_shell_exit_code(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut t = sb
            .open_terminal(namzu::TerminalOptions::default())
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

/// Quiesce stops a running command (SIGTERM is enough) and a detached one
/// that ignores SIGTERM (it takes SIGKILL), reports both with the signal
/// that did it, ends the running execution as cancelled, and leaves the
/// agent serving.
async fn quiesce_stops_everything_but_the_agent(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut running = sb.exec_stream(ExecRequest::shell("echo go; exec sleep 300")).await.ctx("exec")?;
        let running_pid = running.pid.ok_or("no pid")?;
        match running.next().await {
            Some(Ok(ExecEvent::Stdout { .. })) => {}
            other => return Err(format!("no output: {other:?}")),
        }
        let script = "setsid sh -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do sleep 1; done' >/dev/null 2>&1 < /dev/null &";
        ensure!(sh(&sb, script).await?.status.success(), "start the stubborn process");
        let mut stubborn = String::new();
        for _ in 0..100 {
            if let Ok(d) = sb.read_file(p("stubborn.pid"), None).await {
                stubborn = String::from_utf8_lossy(&d.data).trim().to_owned();
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

fn detached(id: &str, script: &str) -> namzu::DetachedSpec {
    namzu::DetachedSpec {
        session_id: id.into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

/// Reads a session from `from` until it has exited and every byte is in.
async fn drain_session(
    sb: &Arc<dyn Sandbox>,
    id: &str,
    mut from: u64,
) -> Result<(Vec<u8>, namzu::SessionInfo), String> {
    let mut out = Vec::new();
    for _ in 0..2000 {
        let c = sb.read_session(id, from, 0).await.ctx("read_session")?;
        ensure!(c.offset == from && c.dropped_bytes == 0, "lost bytes at {from}: {c:?}");
        out.extend_from_slice(&c.data);
        from = c.next_offset;
        if matches!(c.info.state, namzu::SessionState::Exited(_)) && from == c.info.output_bytes {
            return Ok((out, c.info));
        }
        if c.data.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Err("the session did not finish".into())
}

/// A detached command's merged output is read by offset, completely, by
/// any number of readers, and its exit code comes back.
async fn detached_session_output_is_read_by_offset(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done; echo err >&2; exit 3";
        let info = sb.start_detached(detached("job", script)).await.ctx("start_detached")?;
        ensure!(info.session_id == "job" && info.pid > 0, "{info:?}");
        let (a, end) = drain_session(&sb, "job", 0).await?;
        let want: String = (0..300).map(|i| format!("line{i}\n")).collect::<String>() + "err\n";
        ensure!(a == want.as_bytes(), "first reader got {} bytes", a.len());
        ensure!(
            end.state
                == namzu::SessionState::Exited(namzu::ExitStatus {
                    code: Some(3),
                    ..Default::default()
                }),
            "{end:?}"
        );
        let (b, _) = drain_session(&sb, "job", 0).await?;
        ensure!(a == b, "a second reader got other bytes");
        let (tail, _) = drain_session(&sb, "job", 10).await?;
        ensure!(tail[..] == a[10..], "a read from an offset is not the stream's tail");
        Ok(())
    })
    .await
}

/// Output the ring had to evict is reported as dropped bytes, never as a
/// shorter stream that looks complete.
async fn session_ring_eviction_is_reported_as_dropped_bytes(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("session_ring_bytes".into(), 1024)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        sb.start_detached(detached("big", "head -c 10000 /dev/zero | tr '\\0' a"))
            .await
            .ctx("start")?;
        for _ in 0..500 {
            let c = sb.read_session("big", 0, 0).await.ctx("read")?;
            if matches!(c.info.state, namzu::SessionState::Exited(_)) {
                ensure!(c.info.output_bytes == 10_000, "{:?}", c.info);
                ensure!(c.dropped_bytes == 10_000 - 1024 && c.offset == 10_000 - 1024, "{c:?}");
                ensure!(
                    c.data.len() == 1024 && c.next_offset == 10_000,
                    "{} bytes, next {}",
                    c.data.len(),
                    c.next_offset
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("the session did not finish".into())
    })
    .await
}

/// kill_session reaches every process of the session, background jobs
/// included, and reports the real state; ids are unique; the session count
/// is bounded by name.
async fn kill_session_kills_the_whole_session(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_sessions".into(), 2)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        sb.start_detached(detached("svc", "sleep 300 & echo $! > bg.pid; sleep 300"))
            .await
            .ctx("start")?;
        let mut bg = String::new();
        for _ in 0..200 {
            if let Ok(d) = sb.read_file(p("bg.pid"), None).await {
                bg = String::from_utf8_lossy(&d.data).trim().to_owned();
                if !bg.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ensure!(!bg.is_empty(), "background pid never written");
        match sb.start_detached(detached("svc", "true")).await {
            Err(Error::SessionExists { id }) => ensure!(id == "svc", "{id}"),
            other => return Err(format!("duplicate id: {other:?}")),
        }
        sb.start_detached(detached("second", "sleep 300")).await.ctx("second")?;
        match sb.start_detached(detached("third", "true")).await {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_sessions" && value == 2, "{limit}={value}")
            }
            other => return Err(format!("third session: {other:?}")),
        }
        let info = sb
            .kill_session("svc", namzu::SessionSignal::Term)
            .await
            .ctx("kill_session")?;
        ensure!(
            info.state
                == namzu::SessionState::Exited(namzu::ExitStatus {
                    signal: Some(15),
                    ..Default::default()
                }),
            "{info:?}"
        );
        ensure!(!pid_alive(&sb, &bg).await?, "background job {bg} survived kill_session");
        let listed = sb.list_sessions().await.ctx("list")?;
        ensure!(
            listed.iter().any(|s| s.session_id == "svc" && s.state == info.state),
            "{listed:?}"
        );
        let info = sb
            .kill_session("second", namzu::SessionSignal::Kill)
            .await
            .ctx("kill -9")?;
        ensure!(
            matches!(info.state, namzu::SessionState::Exited(st) if st.signal == Some(9)),
            "{info:?}"
        );
        match sb.read_session("nope", 0, 0).await {
            Err(Error::SessionNotFound { id }) => ensure!(id == "nope", "{id}"),
            other => return Err(format!("unknown session: {:?}", other.map(|c| c.info))),
        }
        Ok(())
    })
    .await
}

/// A persistent terminal survives its attachment: dropping it detaches
/// (the shell keeps running), a new attachment replays from an offset and
/// follows, a second attachment ends the first with a typed reason, input
/// through the new one works, and the exit comes through once the program
/// really exits. read_session reads it all without displacing anyone.
async fn persistent_terminal_detaches_and_resumes(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = namzu::TerminalOptions {
            command: Some("sh".into()),
            persistent: true,
            session_id: Some("pt".into()),
            ..Default::default()
        };
        let mut t = sb.open_terminal(opts).await.ctx("open persistent terminal")?;
        let mut seen = String::new();
        t.write(Bytes::from_static(b"echo one-$((1+0))\n")).await.ctx("write")?;
        read_until(&mut t, &mut seen, "one-1").await?;
        let off = t.next_offset();
        drop(t);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let listed = sb.list_sessions().await.ctx("list")?;
        ensure!(
            listed
                .iter()
                .any(|s| s.session_id == "pt" && s.state == namzu::SessionState::Running),
            "the shell did not survive the detach: {listed:?}"
        );
        let mut again = sb.attach_terminal("pt", 0).await.ctx("attach from 0")?;
        let mut replay = String::new();
        read_until(&mut again, &mut replay, "one-1").await?;
        let mut third = sb.attach_terminal("pt", off).await.ctx("attach from the offset")?;
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
        let all = sb.read_session("pt", 0, 0).await.ctx("read_session")?;
        let text = String::from_utf8_lossy(&all.data);
        ensure!(text.contains("one-1") && text.contains("two-2"), "{text:?}");
        Ok(())
    })
    .await
}

/// Collects a stream's stdout and stderr up to its exit.
async fn collect_events(s: &mut namzu::ExecStream) -> Result<(Vec<u8>, Vec<u8>, namzu::ExitSummary), String> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = s.next().await {
        match ev.ctx("event")? {
            ExecEvent::Stdout { data, .. } => out.extend_from_slice(&data),
            ExecEvent::Stderr { data, .. } => err.extend_from_slice(&data),
            ExecEvent::Exit(x) => return Ok((out, err, x)),
        }
    }
    Err("stream ended without an exit".into())
}

const TALKER: &str = "i=0; while [ $i -lt 60 ]; do echo out$i; echo err$i >&2; i=$((i+1)); sleep 0.01; done; exit 7";

fn talker_output() -> (String, String) {
    (
        (0..60).map(|i| format!("out{i}\n")).collect(),
        (0..60).map(|i| format!("err{i}\n")).collect(),
    )
}

/// A detachable execution keeps running when its stream is dropped; an
/// attach from the offset the stream had reached yields exactly the rest
/// (nothing lost, nothing repeated); every attach from 0 returns the same
/// result; starting the same id again runs nothing and attaches.
async fn detachable_execution_outlives_its_stream_and_resumes_by_offset(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let mut s = sb
            .exec_stream(ExecRequest::shell(TALKER).execution_id("job-1"))
            .await
            .ctx("start")?;
        ensure!(s.exec_id == "job-1", "{}", s.exec_id);
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
            .attach_execution_stream(
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
        let a = sb.attach_execution("job-1", Default::default()).await.ctx("attach 1")?;
        let b = sb.attach_execution("job-1", Default::default()).await.ctx("attach 2")?;
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
            .exec(ExecRequest::shell("touch ran-twice; exit 0").execution_id("job-1"))
            .await
            .ctx("second start")?;
        ensure!(
            again.status.code == Some(7) && again.stdout == a.stdout,
            "second start: {again:?}"
        );
        ensure!(
            sb.stat(p("ran-twice")).await.is_err(),
            "the second start ran its command"
        );
        match sb.cancel_execution("job-1").await {
            Ok(namzu::CancelOutcome::AlreadyExited) => {}
            other => return Err(format!("cancel after the exit: {other:?}")),
        }
        Ok(())
    })
    .await
}

/// What cannot be attached is told apart by type: an unknown id, a command
/// that was not started detachable, a bad name, an offset past the end.
async fn detachable_execution_refusals_are_typed(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        match sb.attach_execution("never-started", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                execution_id,
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => ensure!(execution_id == "never-started", "{execution_id}"),
            other => return Err(format!("unknown id: {other:?}")),
        }
        let mut plain = sb
            .exec_stream(ExecRequest::shell("echo go; exec sleep 300"))
            .await
            .ctx("plain exec")?;
        let _ = plain.next().await;
        match sb.attach_execution(&plain.exec_id, Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::NotDetachable,
                ..
            }) => {}
            other => return Err(format!("attach to a plain exec: {other:?}")),
        }
        drop(plain);
        match sb
            .exec(ExecRequest::shell("true").execution_id("no spaces/allowed"))
            .await
        {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("bad name: {other:?}")),
        }
        sb.exec(ExecRequest::shell("echo 123").execution_id("short"))
            .await
            .ctx("short")?;
        let past = namzu::AttachOptions {
            from_offset: 100,
            ..Default::default()
        };
        match sb.attach_execution("short", past).await {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("offset past the end: {other:?}")),
        }
        match sb.cancel_execution("never-started").await {
            Err(Error::UnknownExecution { exec_id, .. }) => ensure!(exec_id == "never-started", "{exec_id}"),
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
async fn detachable_execution_cancel_and_retention_limits(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_retained_logs".into(), 2)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        for id in ["a", "b"] {
            let s = sb
                .exec_stream(ExecRequest::shell("exec sleep 300").execution_id(id))
                .await
                .ctx(id)?;
            drop(s);
        }
        match sb.exec_stream(ExecRequest::shell("true").execution_id("c")).await {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_retained_logs" && value == 2, "{limit}={value}")
            }
            other => return Err(format!("third log: {:?}", other.map(|s| s.exec_id.clone()))),
        }
        match sb.cancel_execution("a").await {
            Ok(namzu::CancelOutcome::Killed) => {}
            other => return Err(format!("cancel a: {other:?}")),
        }
        let a = sb.attach_execution("a", Default::default()).await.ctx("attach a")?;
        ensure!(a.status.cancelled && a.status.signal == Some(9), "{:?}", a.status);
        let c = sb
            .exec(ExecRequest::shell("echo c").execution_id("c"))
            .await
            .ctx("c after a exited")?;
        ensure!(c.stdout.as_ref() == b"c\n", "{c:?}");
        match sb.attach_execution("a", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => {}
            other => return Err(format!("a should have made room: {other:?}")),
        }
        match sb.cancel_execution("b").await {
            Ok(namzu::CancelOutcome::Killed) => Ok(()),
            other => Err(format!("cancel b: {other:?}")),
        }
    })
    .await
}

/// Output a log evicted is reported, never hidden: the gap callback gets
/// the lost byte count, the result says both streams were truncated, and
/// the bytes that are there are the newest ones.
async fn evicted_execution_output_is_a_gap_and_truncation(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("execution_log_bytes".into(), 1024)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let s = sb
            .exec_stream(ExecRequest::shell("head -c 10000 /dev/zero | tr '\\0' a; echo -n b").detach())
            .await
            .ctx("start")?;
        let id = s.exec_id.clone();
        drop(s);
        let lost = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = lost.clone();
        // The first attach waits for the exit; the second reads a finished log.
        sb.attach_execution(&id, Default::default()).await.ctx("wait")?;
        let opts = namzu::AttachOptions {
            on_gap: Some(Arc::new(move |g: namzu::OutputGap| {
                if let Ok(mut v) = seen.lock() {
                    v.push(g)
                }
            })),
            ..Default::default()
        };
        let r = sb.attach_execution(&id, opts).await.ctx("attach")?;
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
async fn cancel_before_start_of_a_detachable_execution_never_runs(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let token = CancellationToken::new();
        token.cancel();
        let r = sb
            .exec(ExecRequest::shell("touch ran").execution_id("pre").cancel_token(token))
            .await
            .ctx("exec")?;
        ensure!(r.status.cancelled, "{:?}", r.status);
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensure!(sb.stat(p("ran")).await.is_err(), "the cancelled command ran");
        Ok(())
    })
    .await
}

/// Past execution_retained_ttl_ms an exited execution is forgotten: attach
/// is refused as unknown, and the same id starts a fresh command.
async fn exited_execution_records_expire_after_the_ttl(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("execution_retained_ttl_ms".into(), 200)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let first = sb
            .exec(ExecRequest::shell("echo first").execution_id("ttl"))
            .await
            .ctx("first")?;
        ensure!(first.stdout.as_ref() == b"first\n", "{first:?}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        match sb.attach_execution("ttl", Default::default()).await {
            Err(Error::ExecutionNotAttachable {
                state: namzu::AttachRefusal::Unknown,
                ..
            }) => {}
            other => return Err(format!("attach past the ttl: {other:?}")),
        }
        let second = sb
            .exec(ExecRequest::shell("echo second").execution_id("ttl"))
            .await
            .ctx("second")?;
        ensure!(second.stdout.as_ref() == b"second\n", "{second:?}");
        Ok(())
    })
    .await
}
