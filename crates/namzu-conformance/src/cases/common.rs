//! What the case modules share: the imports every case uses, and helpers
//! (a shell, an old file to overwrite, terminal and session readers).

pub(super) use std::path::Path;
pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;

pub(super) use bytes::Bytes;
pub(super) use futures::StreamExt;
pub(super) use namzu::{
    ByteRange, CancellationToken, Error, ExecEvent, ExecRequest, FileKind, Sandbox, SandboxSpec, WalkOptions,
    WriteOptions,
};

pub(super) use crate::util::{check_pattern, pattern, with_sandbox, Ctx, PatternReader};

pub(super) use crate::{ensure, Factory, Outcome};

pub(super) async fn sh(sb: &Sandbox, script: &str) -> Result<namzu::ExecOutput, String> {
    sb.commands().run(script).await.ctx(script)
}

pub(super) const OLD: &[u8] = b"old contents";

/// Writes `keep.txt` with [`OLD`], the file the write-failure cases guard.
pub(super) async fn seed_old(sb: &Sandbox) -> Outcome {
    sb.files()
        .write("keep.txt", Bytes::from_static(OLD))
        .await
        .ctx("seed")
        .map(drop)
}

/// `keep.txt` still holds [`OLD`] and nothing else is in the directory:
/// `Ok(false)` if a leftover remains (the caller may retry).
pub(super) async fn old_file_alone(sb: &Sandbox) -> Result<bool, String> {
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
pub(super) async fn pid_alive(sb: &Sandbox, pid: &str) -> Result<bool, String> {
    Ok(sh(sb, &format!("kill -0 {pid} 2>/dev/null")).await?.status.success())
}

/// A reader that never yields.
pub(super) struct Stall;
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
pub(super) async fn read_until(t: &mut namzu::Terminal, seen: &mut String, needle: &str) -> Result<(), String> {
    read_until_fn(t, seen, needle, |s| s.contains(needle)).await
}

/// Reads terminal output into `seen` until `done(seen)` holds.
pub(super) async fn read_until_fn(
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

pub(super) fn detached(id: &str, script: &str) -> namzu::SessionSpec {
    namzu::SessionSpec {
        session_id: id.into(),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

/// Reads a session from `from` until it has exited and every byte is in.
pub(super) async fn drain_session(
    sb: &Sandbox,
    id: &str,
    mut from: u64,
) -> Result<(Vec<u8>, namzu::SessionInfo), String> {
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
pub(super) async fn collect_events(
    s: &mut namzu::ExecStream,
) -> Result<(Vec<u8>, Vec<u8>, namzu::ExitSummary), String> {
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

pub(super) const TALKER: &str =
    "i=0; while [ $i -lt 60 ]; do echo out$i; echo err$i >&2; i=$((i+1)); sleep 0.01; done; exit 7";

pub(super) fn talker_output() -> (String, String) {
    (
        (0..60).map(|i| format!("out{i}\n")).collect(),
        (0..60).map(|i| format!("err{i}\n")).collect(),
    )
}
