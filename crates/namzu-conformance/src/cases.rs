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

use crate::{ensure, Case, Factory, Outcome};

mod detach;
mod exec;
mod files;
mod limits;
mod net;
mod quiesce;
mod sessions;
mod terminal;
use detach::*;
use exec::*;
use files::*;
use limits::*;
use net::*;
use quiesce::*;
use sessions::*;
use terminal::*;

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

async fn sh(sb: &Sandbox, script: &str) -> Result<namzu::ExecOutput, String> {
    sb.commands().run(script).await.ctx(script)
}

const OLD: &[u8] = b"old contents";

/// Writes `keep.txt` with [`OLD`], the file the write-failure cases guard.
async fn seed_old(sb: &Sandbox) -> Outcome {
    sb.files()
        .write("keep.txt", Bytes::from_static(OLD))
        .await
        .ctx("seed")
        .map(drop)
}

/// `keep.txt` still holds [`OLD`] and nothing else is in the directory:
/// `Ok(false)` if a leftover remains (the caller may retry).
async fn old_file_alone(sb: &Sandbox) -> Result<bool, String> {
    let data = sb.files().read("keep.txt").await.ctx("read back")?;
    ensure!(&data[..] == OLD, "old file changed: {} bytes", data.len());
    let names: Vec<_> = sb
        .files()
        .list(".")
        .await
        .ctx("list")?
        .into_iter()
        .map(|e| e.name)
        .collect();
    Ok(names == ["keep.txt"])
}

/// Is a process with this pid still present (even as a zombie)?
async fn pid_alive(sb: &Sandbox, pid: &str) -> Result<bool, String> {
    Ok(sh(sb, &format!("kill -0 {pid} 2>/dev/null")).await?.status.success())
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

fn detached(id: &str, script: &str) -> namzu::SessionSpec {
    namzu::SessionSpec {
        session_id: id.into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

/// Reads a session from `from` until it has exited and every byte is in.
async fn drain_session(sb: &Sandbox, id: &str, mut from: u64) -> Result<(Vec<u8>, namzu::SessionInfo), String> {
    let mut out = Vec::new();
    for _ in 0..2000 {
        let c = sb.sessions().read_max(id, from, 0).await.ctx("read_session")?;
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
