//! envd's `process.Process` on namzu executions. A process is a detachable
//! execution named `e2b-<tag or random>`; its pid is the one inside the
//! sandbox. `Start` and `Connect` stream `start`, `data`, `end` events;
//! closing the stream leaves the process running. `SendSignal` kills its
//! whole process group (namzu's confirmed cancel, for SIGTERM and SIGKILL
//! alike). PTY processes are refused until the terminal mapping is built.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use namzu::{AttachOptions, ExecEvent, ExecRequest, Sandbox};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, ConnectError};
use super::shared::{end_event, EnvdTarget, Proc};
use crate::state::AppState;

type PtyTx = mpsc::Sender<super::pty::PtyInput>;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartRequest {
    process: Option<Value>,
    pty: Option<Value>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WithProcess {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    signal: Option<Value>,
}

async fn sandbox(st: &AppState, t: &EnvdTarget) -> Result<Sandbox, ConnectError> {
    Ok(st.envd_sandbox(t).await?)
}

/// Every `process.Process` method.
pub async fn call(
    State(st): State<AppState>,
    Extension(t): Extension<EnvdTarget>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    let r = match method.as_str() {
        "Start" => return start(st, t, &headers, body).await.unwrap_or_else(connect::stream_error),
        "Connect" => {
            return reconnect(st, t, &headers, body)
                .await
                .unwrap_or_else(connect::stream_error)
        }
        "List" => list(&st, &t).await,
        "SendInput" => send_input(&st, &t, &headers, &body).await,
        "CloseStdin" => close_stdin(&st, &t, &headers, &body),
        "SendSignal" => send_signal(&st, &t, &headers, &body).await,
        "Update" => update(&st, &t, &headers, &body).await,
        other => Err(ConnectError::new("unimplemented", format!("process.Process/{other}"))),
    };
    match (r, streaming) {
        (Ok(v), _) => axum::Json(v).into_response(),
        (Err(e), true) => connect::stream_error(e),
        (Err(e), false) => e.into_response(),
    }
}

/// Streams an execution's events as envd `ProcessEvent`s, with keepalives
/// when the SDK asked for them; the client going away stops the reading,
/// never the process.
fn pump(st: AppState, headers: &HeaderMap, pid: u32, mut s: namzu::client::ExecStream) -> Response {
    let every = connect::keepalive(headers);
    let (tx, rx) = mpsc::channel::<Bytes>(32);
    tokio::spawn(async move {
        if tx
            .send(connect::envelope(0, &json!({"event": {"start": {"pid": pid}}})))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let tick = connect::tick(every);
            let item = tokio::select! {
                _ = st.shutdown.cancelled() => {
                    let _ = tx.send(ConnectError::new("unavailable", "the server is shutting down; the process goes on: Connect to it again").end_stream()).await;
                    return;
                }
                _ = tick => {
                    if tx.send(connect::envelope(0, &json!({"event": {"keepalive": {}}}))).await.is_err() { return; }
                    continue;
                }
                item = s.next() => item,
            };
            let msg = match item {
                None => return,
                Some(Ok(ExecEvent::Stdout { data, .. })) => json!({"event": {"data": {"stdout": B64.encode(&data)}}}),
                Some(Ok(ExecEvent::Stderr { data, .. })) => json!({"event": {"data": {"stderr": B64.encode(&data)}}}),
                Some(Ok(ExecEvent::Exit(x))) => {
                    let _ = tx.send(connect::envelope(0, &end_event(&x.status))).await;
                    let _ = tx.send(connect::end_ok()).await;
                    return;
                }
                Some(Err(e)) => {
                    let _ = tx.send(ConnectError::from(e).end_stream()).await;
                    return;
                }
            };
            if tx.send(connect::envelope(0, &msg)).await.is_err() {
                return;
            }
        }
    });
    connect::stream_response(rx)
}

async fn start(st: AppState, t: EnvdTarget, headers: &HeaderMap, body: Bytes) -> Result<Response, ConnectError> {
    let req: StartRequest = connect::request(headers, &body)?;
    let raw = req.process.unwrap_or(Value::Null);
    let cfg: ProcessConfig =
        serde_json::from_value(raw.clone()).map_err(|e| ConnectError::new("invalid_argument", e.to_string()))?;
    if cfg.cmd.is_empty() {
        return Err(ConnectError::new("invalid_argument", "process.cmd is empty"));
    }
    if let Some(pty) = &req.pty {
        let sb = sandbox(&st, &t).await?;
        let (pid, input, out) = super::pty::start(&sb, &cfg.cmd, &cfg.args, &cfg.envs, cfg.cwd.as_deref(), pty).await?;
        if let Ok(mut procs) = st.e2b.0.lock() {
            procs.insert(
                (t.0.id.clone(), pid),
                Proc {
                    execution_id: format!("pty-{pid}"),
                    config: raw,
                    tag: req.tag.clone(),
                    stdin: None,
                    pty: Some(input),
                },
            );
        }
        return Ok(connect::stream_response(out));
    }
    let mut exec = ExecRequest::new(&cfg.cmd).args(&cfg.args);
    for (k, v) in &cfg.envs {
        exec = exec.env(k, v);
    }
    if let Some(c) = &cfg.cwd {
        exec = exec.cwd(c);
    }
    if let Some(ms) = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
    {
        exec = exec.timeout(Duration::from_millis(ms));
    }
    let stdin = if req.stdin == Some(true) {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        exec = exec.stdin_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (b, rx))
        }));
        Some(tx)
    } else {
        None
    };
    let id = match &req.tag {
        Some(tag) => {
            let id = format!("e2b-{tag}");
            crate::state::check_id("tag", &id)?;
            id
        }
        None => format!("e2b-{:016x}", rand::random::<u64>()),
    };
    let sb = sandbox(&st, &t).await?;
    let s = sb.commands().spawn(exec.execution_id(&id)).await?;
    st.metrics.command_started(t.0.tier.name());
    let pid = s.pid.unwrap_or(0);
    if let Ok(mut procs) = st.e2b.0.lock() {
        procs.insert(
            (t.0.id.clone(), pid),
            Proc {
                execution_id: id,
                config: raw,
                tag: req.tag.clone(),
                stdin,
                pty: None,
            },
        );
    }
    Ok(pump(st, headers, pid, s))
}

/// The execution behind a selector: a pid or tag the server started, or
/// (after a restart) any running execution with that pid.
async fn find(st: &AppState, t: &EnvdTarget, sb: &Sandbox, sel: &Selector) -> Result<(u32, String), ConnectError> {
    if let Ok(procs) = st.e2b.0.lock() {
        let hit = procs.iter().find(|((sid, pid), p)| {
            sid == &t.0.id && (sel.pid == Some(*pid) || (sel.tag.is_some() && p.tag == sel.tag))
        });
        if let Some(((_, pid), p)) = hit {
            return Ok((*pid, p.execution_id.clone()));
        }
    }
    let want_tag = sel.tag.as_ref().map(|t| format!("e2b-{t}"));
    sb.commands()
        .list()
        .await?
        .into_iter()
        .find(|e| (sel.pid.is_some() && e.pid == sel.pid) || want_tag.as_deref() == Some(e.execution_id.as_str()))
        .map(|e| (e.pid.unwrap_or(0), e.execution_id))
        .ok_or_else(|| ConnectError::new("not_found", format!("process {sel:?} not found")))
}

async fn reconnect(st: AppState, t: EnvdTarget, headers: &HeaderMap, body: Bytes) -> Result<Response, ConnectError> {
    let req: WithProcess = connect::request(headers, &body)?;
    if pty_of(&st, &t, &req.process).is_ok() {
        return Err(ConnectError::new(
            "unimplemented",
            "a PTY process is not re-attached; start a new one",
        ));
    }
    let sb = sandbox(&st, &t).await?;
    let (pid, id) = find(&st, &t, &sb, &req.process).await?;
    let s = sb.commands().attach_stream(&id, AttachOptions::default()).await?;
    Ok(pump(st, headers, pid, s))
}

async fn list(st: &AppState, t: &EnvdTarget) -> Result<Value, ConnectError> {
    let sb = sandbox(st, t).await?;
    let running: Vec<namzu::ExecutionInfo> = sb
        .commands()
        .list()
        .await?
        .into_iter()
        .filter(|e| matches!(e.state, namzu::ExecutionState::Running))
        .collect();
    let mut procs = st.e2b.0.lock().map_err(|_| ConnectError::new("internal", "poisoned"))?;
    // Forget what no longer runs.
    procs.retain(|(sid, _), p| {
        sid != &t.0.id
            || running.iter().any(|e| e.execution_id == p.execution_id)
            || p.pty.as_ref().is_some_and(|tx| !tx.is_closed())
    });
    let ptys = procs
        .iter()
        .filter(|((sid, _), p)| sid == &t.0.id && p.pty.is_some())
        .map(|((_, pid), p)| json!({"pid": pid, "config": p.config, "tag": p.tag}));
    let list: Vec<Value> = ptys
        .chain(running.iter().filter(|e| e.execution_id.starts_with("e2b-")).map(|e| {
            let pid = e.pid.unwrap_or(0);
            match procs.get(&(t.0.id.clone(), pid)) {
                Some(p) => json!({"pid": pid, "config": p.config, "tag": p.tag}),
                None => json!({"pid": pid, "config": {"cmd": ""}}),
            }
        }))
        .collect();
    Ok(json!({"processes": list}))
}

fn stdin_of(st: &AppState, t: &EnvdTarget, sel: &Selector) -> Result<(u32, Option<mpsc::Sender<Bytes>>), ConnectError> {
    let procs = st.e2b.0.lock().map_err(|_| ConnectError::new("internal", "poisoned"))?;
    procs
        .iter()
        .find(|((sid, pid), p)| sid == &t.0.id && (sel.pid == Some(*pid) || (sel.tag.is_some() && p.tag == sel.tag)))
        .map(|((_, pid), p)| (*pid, p.stdin.clone()))
        .ok_or_else(|| {
            ConnectError::new(
                "not_found",
                format!("process {sel:?} not found (or not started by this server)"),
            )
        })
}

async fn send_input(st: &AppState, t: &EnvdTarget, headers: &HeaderMap, body: &Bytes) -> Result<Value, ConnectError> {
    let req: WithProcess = connect::request(headers, body)?;
    let input = req.input.clone().unwrap_or(Value::Null);
    if let Some(data) = input.get("pty").and_then(Value::as_str) {
        let data = B64
            .decode(data)
            .map_err(|e| ConnectError::new("invalid_argument", e.to_string()))?;
        pty_of(st, t, &req.process)?
            .send(super::pty::PtyInput::Data(Bytes::from(data)))
            .await
            .map_err(|_| ConnectError::new("failed_precondition", "the terminal has exited"))?;
        return Ok(json!({}));
    }
    let (_, tx) = stdin_of(st, t, &req.process)?;
    let tx = tx.ok_or_else(|| {
        ConnectError::new(
            "failed_precondition",
            "the process was started without stdin, or its stdin is closed",
        )
    })?;
    let Some(data) = input.get("stdin").and_then(Value::as_str) else {
        return Err(ConnectError::new("unimplemented", "only stdin input is built (no PTY)"));
    };
    let data = B64
        .decode(data)
        .map_err(|e| ConnectError::new("invalid_argument", e.to_string()))?;
    tx.send(Bytes::from(data))
        .await
        .map_err(|_| ConnectError::new("failed_precondition", "the process has exited"))?;
    Ok(json!({}))
}

fn close_stdin(st: &AppState, t: &EnvdTarget, headers: &HeaderMap, body: &Bytes) -> Result<Value, ConnectError> {
    let req: WithProcess = connect::request(headers, body)?;
    let (pid, _) = stdin_of(st, t, &req.process)?;
    if let Ok(mut procs) = st.e2b.0.lock() {
        if let Some(p) = procs.get_mut(&(t.0.id.clone(), pid)) {
            p.stdin = None;
        }
    }
    Ok(json!({}))
}

async fn send_signal(st: &AppState, t: &EnvdTarget, headers: &HeaderMap, body: &Bytes) -> Result<Value, ConnectError> {
    let req: WithProcess = connect::request(headers, body)?;
    match req.signal.as_ref().and_then(Value::as_str) {
        Some("SIGNAL_SIGKILL" | "SIGNAL_SIGTERM") => {}
        other => {
            return Err(ConnectError::new(
                "invalid_argument",
                format!("signal {other:?}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
            ))
        }
    }
    if let Ok(tx) = pty_of(st, t, &req.process) {
        let _ = tx.send(super::pty::PtyInput::Kill).await;
        return Ok(json!({}));
    }
    let sb = sandbox(st, t).await?;
    let (_, id) = find(st, t, &sb, &req.process).await?;
    sb.commands().cancel(&id).await?;
    Ok(json!({}))
}

fn pty_of(st: &AppState, t: &EnvdTarget, sel: &Selector) -> Result<mpsc::Sender<super::pty::PtyInput>, ConnectError> {
    let procs = st.e2b.0.lock().map_err(|_| ConnectError::new("internal", "poisoned"))?;
    procs
        .iter()
        .find(|((sid, pid), p)| {
            sid == &t.0.id && p.pty.is_some() && (sel.pid == Some(*pid) || (sel.tag.is_some() && p.tag == sel.tag))
        })
        .and_then(|(_, p)| p.pty.clone())
        .ok_or_else(|| ConnectError::new("not_found", format!("no PTY process {sel:?}")))
}

async fn update(st: &AppState, t: &EnvdTarget, headers: &HeaderMap, body: &Bytes) -> Result<Value, ConnectError> {
    #[derive(Deserialize)]
    struct Update {
        #[serde(default)]
        process: Selector,
        pty: Option<Value>,
    }
    let req: Update = connect::request(headers, body)?;
    let pty = req
        .pty
        .ok_or_else(|| ConnectError::new("invalid_argument", "pty is required"))?;
    let (cols, rows) = super::pty::size_of(&pty);
    pty_of(st, t, &req.process)?
        .send(super::pty::PtyInput::Resize(cols, rows))
        .await
        .map_err(|_| ConnectError::new("failed_precondition", "the terminal has exited"))?;
    Ok(json!({}))
}

/// `StreamInput`: a client stream of envelopes — `start` naming the
/// process, then `data` (stdin or pty bytes) and `keepalive` — fed to the
/// process as they arrive; answered once the request body ends.
pub async fn stream_input(
    State(st): State<AppState>,
    Extension(t): Extension<EnvdTarget>,
    req: axum::extract::Request,
) -> Response {
    let r = async {
        let mut body = req.into_body().into_data_stream();
        let mut buf = bytes::BytesMut::new();
        let mut target: Option<(Option<mpsc::Sender<Bytes>>, Option<PtyTx>)> = None;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| ConnectError::new("canceled", e.to_string()))?;
            buf.extend_from_slice(&chunk);
            for (flags, msg) in connect::split_envelopes(&mut buf)? {
                if flags & 0x02 != 0 {
                    continue;
                }
                let v: Value =
                    serde_json::from_slice(&msg).map_err(|e| ConnectError::new("invalid_argument", e.to_string()))?;
                if let Some(start) = v.get("start") {
                    let sel: Selector = serde_json::from_value(start.get("process").cloned().unwrap_or(Value::Null))
                        .unwrap_or_default();
                    let pty = pty_of(&st, &t, &sel).ok();
                    let stdin = if pty.is_some() {
                        None
                    } else {
                        stdin_of(&st, &t, &sel)?.1
                    };
                    if pty.is_none() && stdin.is_none() {
                        return Err(ConnectError::new(
                            "failed_precondition",
                            "the process was started without stdin, or its stdin is closed",
                        ));
                    }
                    target = Some((stdin, pty));
                } else if let Some(input) = v.get("data").and_then(|d| d.get("input")) {
                    let Some((stdin, pty)) = &target else {
                        return Err(ConnectError::new("invalid_argument", "data before start"));
                    };
                    let decode = |s: &str| {
                        B64.decode(s)
                            .map(Bytes::from)
                            .map_err(|e| ConnectError::new("invalid_argument", e.to_string()))
                    };
                    let gone = |_| ConnectError::new("failed_precondition", "the process has exited");
                    match (
                        input.get("stdin").and_then(Value::as_str),
                        input.get("pty").and_then(Value::as_str),
                        stdin,
                        pty,
                    ) {
                        (Some(d), _, Some(tx), _) => tx.send(decode(d)?).await.map_err(gone)?,
                        (_, Some(d), _, Some(tx)) => tx
                            .send(super::pty::PtyInput::Data(decode(d)?))
                            .await
                            .map_err(|_| ConnectError::new("failed_precondition", "the terminal has exited"))?,
                        _ => {
                            return Err(ConnectError::new(
                                "invalid_argument",
                                "input for a stream the process does not have",
                            ))
                        }
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    let (tx, rx) = mpsc::channel(2);
    match r {
        Ok(()) => {
            let _ = tx.try_send(connect::envelope(0, &json!({})));
            let _ = tx.try_send(connect::end_ok());
        }
        Err(e) => {
            let _ = tx.try_send(e.end_stream());
        }
    }
    drop(tx);
    connect::stream_response(rx)
}
