//! Live connections into a sandbox over WebSocket — a terminal, and a TCP
//! port-forward to any port inside — and the sandbox-wide operations:
//! network policy, quiesce, flush, pause and resume.
//!
//! Both WebSockets carry data in binary frames both ways. The terminal
//! takes `{"type":"resize","cols":C,"rows":R}` as a text frame and ends
//! with a text frame `{"type":"exit","code":…}`. Everything that can fail
//! before the upgrade (no sandbox, nothing listening on the port) is an
//! ordinary HTTP error.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use namzu::TerminalEvent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::model::{
    ExitView, FlushBody, FlushView, NetworkBody, NetworkView, PauseView, QuiesceBody, QuiesceView, ResumeView,
    StoppedView, TerminalControl, TerminalQuery,
};
use super::sandboxes::{body_of, policy_of};
use crate::error::{ApiResult, ErrorBody};
use crate::state::{check_id, AppState, Json, Owner, Query};

/// Open a terminal (a pty) in the sandbox, over a WebSocket.
#[utoipa::path(get, operation_id = "openTerminal", path = "/v1/sandboxes/{id}/terminal", tag = "live", params(("id" = String, Path), TerminalQuery),
    responses((status = 101, description = "WebSocket: binary frames are the terminal's bytes; text frames are TerminalControl in, exit out"),
              (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn terminal(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<TerminalQuery>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = st.stream_slot(&owner)?;
    let mut opts = namzu::TerminalOptions::default().size(q.cols.unwrap_or(80), q.rows.unwrap_or(24));
    if let Some(c) = &q.command {
        opts = opts.command(c);
    }
    let term = sb.terminals().open(opts).await?;
    Ok(ws.on_upgrade(move |socket| async move {
        let _slot = slot;
        pump_terminal(st, socket, term).await;
    }))
}

async fn pump_terminal(st: AppState, mut socket: WebSocket, mut term: namzu::client::Terminal) {
    // A send fails only once the terminal's call has ended; what ended it
    // (the exit, after all output, or the link's failure) still comes from
    // `term.next()`, so input is dropped from then on instead of the socket.
    let mut sending = true;
    loop {
        tokio::select! {
            _ = st.shutdown.cancelled() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    st.metrics.moved("terminal_in", b.len() as u64);
                    if sending && term.write(b).await.is_err() { sending = false; }
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<TerminalControl>(&t) {
                    Ok(TerminalControl::Resize { cols, rows }) => {
                        if sending && term.resize(cols, rows).await.is_err() { sending = false; }
                    }
                    Err(e) => {
                        let err = serde_json::json!({"type": "error", "code": "invalid_argument", "message": e.to_string()});
                        let _ = socket.send(Message::Text(err.to_string())).await;
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                // The client left: the terminal and its processes end.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    let _ = term.close().await;
                    return;
                }
            },
            ev = term.next() => match ev {
                Some(Ok(TerminalEvent::Output { data, .. })) => {
                    st.metrics.moved("terminal_out", data.len() as u64);
                    if socket.send(Message::Binary(data.to_vec())).await.is_err() { return; }
                }
                Some(Ok(TerminalEvent::Exit(s))) => {
                    let mut v = serde_json::to_value(ExitView::from(&s)).unwrap_or_default();
                    v["type"] = "exit".into();
                    let _ = socket.send(Message::Text(v.to_string())).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Some(Err(e)) => {
                    let a = crate::error::library_error(&e);
                    let err = serde_json::json!({"type": "error", "code": a.code, "message": a.message});
                    let _ = socket.send(Message::Text(err.to_string())).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                None => return,
            },
        }
    }
}

/// A TCP connection to `port` on the sandbox's loopback, over a WebSocket
/// (no port is published on the host).
#[utoipa::path(get, operation_id = "forwardPort", path = "/v1/sandboxes/{id}/ports/{port}", tag = "live", params(("id" = String, Path), ("port" = u16, Path)),
    responses((status = 101, description = "WebSocket: binary frames are the connection's bytes"),
              (status = 502, description = "nothing listens on the port", body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn port_forward(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path((id, port)): Path<(String, u16)>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = st.stream_slot(&owner)?;
    let conn = sb.network().connect(port).await?;
    Ok(ws.on_upgrade(move |socket| async move {
        let _slot = slot;
        pump_tcp(st, socket, conn).await;
    }))
}

async fn pump_tcp(st: AppState, mut socket: WebSocket, conn: tokio::io::DuplexStream) {
    let (mut rd, mut wr) = tokio::io::split(conn);
    let mut buf = vec![0u8; 64 << 10];
    let mut input_open = true;
    loop {
        tokio::select! {
            _ = st.shutdown.cancelled() => break,
            msg = socket.recv(), if input_open => match msg {
                Some(Ok(Message::Binary(b))) => {
                    st.metrics.moved("tcp_in", b.len() as u64);
                    if wr.write_all(&b).await.is_err() { break; }
                }
                Some(Ok(Message::Text(t))) => {
                    if wr.write_all(t.as_bytes()).await.is_err() { break; }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                // The client is done sending: half-close, keep reading.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    let _ = wr.shutdown().await;
                    input_open = false;
                }
            },
            n = rd.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    st.metrics.moved("tcp_out", n as u64);
                    if socket.send(Message::Binary(buf[..n].to_vec())).await.is_err() { break; }
                }
            },
        }
    }
    let _ = socket.send(Message::Close(None)).await;
}

/// The egress policy in force and the open connections.
#[utoipa::path(get, operation_id = "getNetwork", path = "/v1/sandboxes/{id}/network", tag = "live", params(("id" = String, Path)),
    responses((status = 200, body = NetworkView), (status = 404, body = ErrorBody), (status = 422, description = "the tier has no egress boundary", body = ErrorBody)))]
pub async fn network(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<NetworkView>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let (cfg, open) = sb.network().policy().await?;
    Ok(axum::Json(NetworkView {
        policy: body_of(&cfg.policy),
        open_connections: open,
    }))
}

/// Replace the egress policy, live: open connections it refuses are closed
/// before this answers.
#[utoipa::path(put, operation_id = "setNetwork", path = "/v1/sandboxes/{id}/network", tag = "live", params(("id" = String, Path)), request_body = NetworkBody,
    responses((status = 200, body = NetworkView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn set_network(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(b): Json<NetworkBody>,
) -> ApiResult<axum::Json<NetworkView>> {
    check_id("id", &id)?;
    let policy = policy_of(&b)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    sb.network().set_policy(policy).await?;
    let (cfg, open) = sb.network().policy().await?;
    Ok(axum::Json(NetworkView {
        policy: body_of(&cfg.policy),
        open_connections: open,
    }))
}

/// Stop every process in the sandbox but its agent (SIGTERM, then SIGKILL
/// after `grace_ms`).
#[utoipa::path(post, operation_id = "quiesce", path = "/v1/sandboxes/{id}/quiesce", tag = "live", params(("id" = String, Path)), request_body = QuiesceBody,
    responses((status = 200, body = QuiesceView), (status = 404, body = ErrorBody)))]
pub async fn quiesce(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(b): Json<QuiesceBody>,
) -> ApiResult<axum::Json<QuiesceView>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let r = sb.quiesce(Duration::from_millis(b.grace_ms.unwrap_or(2000))).await?;
    Ok(axum::Json(QuiesceView {
        stopped: r
            .stopped
            .iter()
            .map(|p| StoppedView {
                pid: p.pid,
                comm: p.comm.clone(),
                signal: p.signal,
            })
            .collect(),
        rounds: r.rounds,
    }))
}

/// Make the sandbox's workspace durable (sync to disk).
#[utoipa::path(post, operation_id = "flush", path = "/v1/sandboxes/{id}/flush", tag = "live", params(("id" = String, Path)), request_body = FlushBody,
    responses((status = 200, body = FlushView), (status = 404, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn flush(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(b): Json<FlushBody>,
) -> ApiResult<axum::Json<FlushView>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let took = sb.flush(Duration::from_millis(b.timeout_ms.unwrap_or(30_000))).await?;
    Ok(axum::Json(FlushView {
        took_ms: took.as_millis() as u64,
    }))
}

/// Pause the sandbox: every process in it but its agent stopped in place.
/// Until it is resumed nothing starts in it (commands, terminals, TCP:
/// 409 `sandbox_paused`); files and running commands' output can still
/// be read, and a command's timeout does not run. On microvm the whole VM
/// stops: every operation answers 409 `sandbox_paused` until the resume,
/// and streams already open wait for it.
#[utoipa::path(post, operation_id = "pause", path = "/v1/sandboxes/{id}/pause", tag = "live", params(("id" = String, Path)),
    responses((status = 200, body = PauseView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn pause(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<PauseView>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let r = sb.pause().await?;
    st.registry.set_state(&id, "paused");
    Ok(axum::Json(PauseView {
        stopped: r.stopped,
        rounds: r.rounds,
    }))
}

/// Resume a paused sandbox where it was, or start a suspended one again
/// on its disk (a running one: nothing to do). A paused or suspended
/// sandbox does not expire; its timeout runs again from here.
#[utoipa::path(post, operation_id = "resume", path = "/v1/sandboxes/{id}/resume", tag = "live", params(("id" = String, Path)),
    responses((status = 200, body = ResumeView), (status = 404, body = ErrorBody)))]
pub async fn resume(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<ResumeView>> {
    check_id("id", &id)?;
    let view = if st.registry.get(&owner, &id)?.state == "suspended" {
        st.registry.resume_suspended(&owner, &id).await?;
        ResumeView {
            continued: Vec::new(),
            paused_ms: 0,
            from_disk: true,
        }
    } else {
        let r = st.registry.resume_paused(&owner, &id).await?;
        ResumeView {
            continued: r.continued,
            paused_ms: u64::try_from(r.paused_for.as_millis()).unwrap_or(u64::MAX),
            from_disk: false,
        }
    };
    let timeout = st.registry.get(&owner, &id)?.timeout(st.config.limits.default_timeout);
    st.registry.extend(&owner, &id, timeout)?;
    Ok(axum::Json(view))
}

/// Suspend the sandbox to disk: every process in it ends, and what it
/// wrote (`/workspace`, and the tier's writable paths) is kept under its
/// id until `resume` starts it again — after a server restart too. A
/// suspended sandbox does not expire; its operations answer 409
/// `sandbox_suspended`. Refused (422 `option_refused`) on a tier that
/// cannot.
#[utoipa::path(post, operation_id = "suspend", path = "/v1/sandboxes/{id}/suspend", tag = "live", params(("id" = String, Path)),
    responses((status = 200, body = super::model::SandboxView), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn suspend(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<super::model::SandboxView>> {
    check_id("id", &id)?;
    let rec = st.registry.suspend(&owner, &id).await?;
    Ok(axum::Json(super::model::SandboxView::from(&rec)))
}
