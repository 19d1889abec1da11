//! Commands: run streamed (NDJSON or SSE), run detached, run collected,
//! re-attach from an offset, cancel, list.
//!
//! Every command the API starts is a detachable execution: it outlives the
//! HTTP request and the server process, and its output is kept by the
//! agent by offset. A client whose stream broke — it went away, or the
//! server was killed — re-attaches with `offset` = the `next_offset` of
//! the last event it got and loses no byte.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use namzu::{AttachOptions, ExecEvent, ExecRequest};
use tokio::sync::mpsc;

use super::model::{
    AttachQuery, CancelView, CommandEvent, CommandRequest, CommandResult, ExecutionView, ExitView, Started,
};
use crate::error::{library_error, ApiError, ApiResult, ErrorBody};
use crate::state::{check_id, AppState, Json, Owner, Query};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Events buffered between the sandbox and a slow client; past it the
/// agent's own log holds the output (backpressure, never loss).
const EVENT_QUEUE: usize = 32;

fn exec_request(req: &CommandRequest) -> ApiResult<ExecRequest> {
    let mut r = match (&req.script, req.argv.split_first()) {
        (Some(s), None) => ExecRequest::shell(s),
        (None, Some((cmd, args))) => ExecRequest::new(cmd).args(args),
        (Some(_), Some(_)) => return Err(ApiError::invalid("argv", "give argv or script, not both")),
        (None, None) => return Err(ApiError::invalid("argv", "give argv (non-empty) or script")),
    };
    if let Some(c) = &req.cwd {
        r = r.cwd(c);
    }
    for (k, v) in &req.env {
        r = r.env(k, v);
    }
    if let Some(b) = &req.stdin_b64 {
        let data = B64
            .decode(b)
            .map_err(|e| ApiError::invalid("stdin_b64", format!("not base64: {e}")))?;
        r = r.stdin(data);
    }
    if let Some(t) = req.timeout_ms {
        if t == 0 {
            return Err(ApiError::invalid("timeout_ms", "timeout_ms must be positive"));
        }
        r = r.timeout(Duration::from_millis(t));
    }
    if let Some(id) = &req.execution_id {
        check_id("execution_id", id)?;
        r = r.execution_id(id);
    }
    Ok(r)
}

/// How a stream is framed.
#[derive(Clone, Copy)]
enum Framing {
    Ndjson,
    Sse,
}

fn framing(headers: &HeaderMap) -> Framing {
    let sse = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    if sse {
        Framing::Sse
    } else {
        Framing::Ndjson
    }
}

fn frame(f: Framing, ev: &CommandEvent) -> Bytes {
    let json = serde_json::to_string(ev).unwrap_or_default();
    match f {
        Framing::Ndjson => Bytes::from(json + "\n"),
        Framing::Sse => {
            let (kind, id) = match ev {
                CommandEvent::Start { next_offset, .. } => ("start", next_offset),
                CommandEvent::Stdout { next_offset, .. } => ("stdout", next_offset),
                CommandEvent::Stderr { next_offset, .. } => ("stderr", next_offset),
                CommandEvent::Exit { next_offset, .. } => ("exit", next_offset),
                CommandEvent::Error { next_offset, .. } => ("error", next_offset),
            };
            Bytes::from(format!("event: {kind}\nid: {id}\ndata: {json}\n\n"))
        }
    }
}

/// Streams an execution's events to the client from a task that owns the
/// exec stream and the client's stream slot. The client going away drops
/// the task's sender side: the execution goes on in the sandbox.
fn stream_response(
    st: AppState,
    tier: String,
    mut s: namzu::client::ExecStream,
    from: u64,
    f: Framing,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(EVENT_QUEUE);
    tokio::spawn(async move {
        let _slot = slot;
        let start = CommandEvent::Start {
            execution_id: s.execution_id.clone(),
            pid: s.pid,
            next_offset: from,
        };
        if tx.send(Ok(frame(f, &start))).await.is_err() {
            return;
        }
        let mut at = from;
        loop {
            let item = tokio::select! {
                _ = st.shutdown.cancelled() => {
                    let ev = CommandEvent::Error {
                        code: "server_shutting_down".into(),
                        message: "the server is shutting down; the command goes on: re-attach from next_offset".into(),
                        next_offset: at,
                    };
                    let _ = tx.send(Ok(frame(f, &ev))).await;
                    return;
                }
                item = s.next() => item,
            };
            let ev = match item {
                None => return,
                Some(Ok(ExecEvent::Stdout { offset, data })) => {
                    at = s.next_offset().max(at);
                    st.metrics.moved("stdout", data.len() as u64);
                    CommandEvent::Stdout {
                        offset,
                        data: B64.encode(&data),
                        next_offset: at,
                    }
                }
                Some(Ok(ExecEvent::Stderr { offset, data })) => {
                    at = s.next_offset().max(at);
                    st.metrics.moved("stderr", data.len() as u64);
                    CommandEvent::Stderr {
                        offset,
                        data: B64.encode(&data),
                        next_offset: at,
                    }
                }
                Some(Ok(ExecEvent::Exit(x))) => {
                    st.metrics.command_ended(&tier, x.duration);
                    CommandEvent::Exit {
                        status: ExitView::from(&x.status),
                        stdout_bytes: x.stdout_bytes,
                        stderr_bytes: x.stderr_bytes,
                        duration_ms: x.duration.as_millis() as u64,
                        next_offset: s.next_offset().max(at),
                    }
                }
                Some(Err(e)) => {
                    let a = library_error(&e);
                    let next_offset = match &e {
                        namzu::Error::ExecutionLinkLost { offset, .. } => *offset,
                        _ => at,
                    };
                    CommandEvent::Error {
                        code: a.code.into(),
                        message: a.message,
                        next_offset,
                    }
                }
            };
            let last = matches!(ev, CommandEvent::Exit { .. } | CommandEvent::Error { .. });
            if tx.send(Ok(frame(f, &ev))).await.is_err() || last {
                return;
            }
        }
    });
    let ct = match f {
        Framing::Ndjson => "application/x-ndjson",
        Framing::Sse => "text/event-stream",
    };
    let body = axum::body::Body::from_stream(tokio_stream_from(rx));
    (
        [
            (http::header::CONTENT_TYPE, ct),
            (http::header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

fn tokio_stream_from<T: Send + 'static>(mut rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Run a command and stream its output (NDJSON, or SSE when the client
/// accepts `text/event-stream`); with `detached`, start it and answer at
/// once with its id.
#[utoipa::path(post, operation_id = "startCommand", path = "/v1/sandboxes/{id}/commands", tag = "commands", params(("id" = String, Path)), request_body = CommandRequest,
    responses((status = 200, description = "the events, one per line (application/x-ndjson) or SSE (text/event-stream)", 
               content((CommandEvent = "application/x-ndjson"), (CommandEvent = "text/event-stream"))),
              (status = 201, description = "detached: started", body = Started),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 429, description = "max_streams_per_key", body = ErrorBody)))]
pub async fn start(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<CommandRequest>,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    let exec = exec_request(&req)?;
    let (rec, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = if req.detached {
        None
    } else {
        Some(st.stream_slot(&owner)?)
    };
    let s = sb.commands().spawn(exec).await?;
    st.metrics.command_started(rec.tier.name());
    match slot {
        None => Ok((
            StatusCode::CREATED,
            axum::Json(Started {
                execution_id: s.execution_id.clone(),
                pid: s.pid,
            }),
        )
            .into_response()),
        Some(slot) => Ok(stream_response(
            st.clone(),
            rec.tier.name().into(),
            s,
            0,
            framing(&headers),
            slot,
        )),
    }
}

/// Re-attach to an execution's output from `offset` (or the SSE
/// `Last-Event-ID`), streamed like the run that started it.
#[utoipa::path(get, operation_id = "attachCommand", path = "/v1/sandboxes/{id}/commands/{execution_id}/events", tag = "commands",
    params(("id" = String, Path), ("execution_id" = String, Path), AttachQuery),
    responses((status = 200, description = "the events, as for the run",
               content((CommandEvent = "application/x-ndjson"), (CommandEvent = "text/event-stream"))),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn attach(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path((id, eid)): Path<(String, String)>,
    headers: HeaderMap,
    Query(q): Query<AttachQuery>,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    check_id("execution_id", &eid)?;
    let last_event = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let from = last_event.unwrap_or(q.offset);
    let (rec, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = st.stream_slot(&owner)?;
    let opts = AttachOptions::default()
        .from_offset(from)
        .follow(q.follow.unwrap_or(true));
    let s = sb.commands().attach_stream(&eid, opts).await?;
    Ok(stream_response(
        st.clone(),
        rec.tier.name().into(),
        s,
        from,
        framing(&headers),
        slot,
    ))
}

/// Run a command to its end and answer with its collected output.
#[utoipa::path(post, operation_id = "runCommand", path = "/v1/sandboxes/{id}/commands/run", tag = "commands", params(("id" = String, Path)), request_body = CommandRequest,
    responses((status = 200, body = CommandResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn run(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(req): Json<CommandRequest>,
) -> ApiResult<axum::Json<CommandResult>> {
    check_id("id", &id)?;
    if req.detached {
        return Err(ApiError::invalid("detached", "detached applies to POST …/commands"));
    }
    let exec = exec_request(&req)?;
    let (rec, sb) = st.registry.sandbox(&owner, &id).await?;
    st.metrics.command_started(rec.tier.name());
    let out = sb.commands().run(exec).await?;
    st.metrics.command_ended(rec.tier.name(), out.duration);
    st.metrics.moved("stdout", out.stdout.len() as u64);
    st.metrics.moved("stderr", out.stderr.len() as u64);
    let (stdout, stderr, encoding) = match (std::str::from_utf8(&out.stdout), std::str::from_utf8(&out.stderr)) {
        (Ok(o), Ok(e)) => (o.to_string(), e.to_string(), "utf8"),
        _ => (B64.encode(&out.stdout), B64.encode(&out.stderr), "base64"),
    };
    Ok(axum::Json(CommandResult {
        execution_id: out.execution_id.clone(),
        status: ExitView::from(&out.status),
        stdout,
        stderr,
        encoding: encoding.into(),
        stdout_truncated: out.stdout_truncated,
        stderr_truncated: out.stderr_truncated,
        duration_ms: out.duration.as_millis() as u64,
    }))
}

/// The executions the sandbox holds: running ones, and detached ones kept
/// after their exit.
#[utoipa::path(get, operation_id = "listCommands", path = "/v1/sandboxes/{id}/commands", tag = "commands", params(("id" = String, Path)),
    responses((status = 200, body = [ExecutionView]), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Vec<ExecutionView>>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let list = sb.commands().list().await?;
    Ok(axum::Json(
        list.iter()
            .map(|e| {
                let (state, status) = match &e.state {
                    namzu::ExecutionState::Reserved => ("reserved", None),
                    namzu::ExecutionState::Running => ("running", None),
                    namzu::ExecutionState::Exited(s) => ("exited", Some(ExitView::from(s))),
                };
                ExecutionView {
                    execution_id: e.execution_id.clone(),
                    state: state.into(),
                    status,
                    pid: e.pid,
                    output_bytes: e.output_bytes,
                }
            })
            .collect(),
    ))
}

/// Kill an execution's whole process group and wait for the kill to be
/// confirmed.
#[utoipa::path(post, operation_id = "cancelCommand", path = "/v1/sandboxes/{id}/commands/{execution_id}/cancel", tag = "commands",
    params(("id" = String, Path), ("execution_id" = String, Path)),
    responses((status = 200, body = CancelView), (status = 404, body = ErrorBody), (status = 503, description = "unconfirmed; retry", body = ErrorBody)))]
pub async fn cancel(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path((id, eid)): Path<(String, String)>,
) -> ApiResult<axum::Json<CancelView>> {
    check_id("id", &id)?;
    check_id("execution_id", &eid)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let outcome = sb.commands().cancel(&eid).await?;
    let outcome = match outcome {
        namzu::client::CancelOutcome::Killed => "killed",
        namzu::client::CancelOutcome::NotStarted => "not_started",
        namzu::client::CancelOutcome::AlreadyExited => "already_exited",
    };
    Ok(axum::Json(CancelView {
        outcome: outcome.into(),
    }))
}
