//! A running command's pipes: its output copied to the call or the
//! retained log it belongs to ([`pump`]), and its request stream feeding
//! stdin and watching for the host's silence ([`watch_input`]).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use namzu_proto::v1::{self, exec_input, exec_output, ExecOutput, OutputChunk};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::exec_log::{ExecLog, OutputTx};

/// Bytes read from an output pipe at a time.
const READ_CHUNK: usize = 64 * 1024;

/// The client half of an Exec call after its `start` message.
pub type InputStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::ExecInput, tonic::Status>> + Send>>;

/// Where a running command's output goes.
#[derive(Clone)]
pub(crate) enum Sink {
    /// Straight to the call that started it; the call's end ends the command.
    Call(OutputTx),
    /// To a retained log that outlives every call.
    Log(Arc<ExecLog>),
}

impl Sink {
    pub(crate) async fn closed(&self) {
        match self {
            Sink::Call(out) => out.closed().await,
            Sink::Log(_) => futures::future::pending().await,
        }
    }
}

/// Copies one output pipe to its sink. Returns (is_stdout, total bytes
/// produced, truncated). A call keeps `cap` bytes per stream; a log is
/// bounded by its own size instead.
pub(crate) async fn pump(fd: OwnedFd, sink: Sink, cap: u64, is_stdout: bool) -> (bool, u64, bool) {
    let mut total = 0u64;
    let mut truncated = false;
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return (is_stdout, 0, false);
    };
    let mut buf = vec![0u8; READ_CHUNK];
    let mut forwarding = true;
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let offset = total;
        total += n as u64;
        let out = match &sink {
            Sink::Log(log) => {
                log.append(is_stdout, &buf[..n]);
                continue;
            }
            Sink::Call(out) => out,
        };
        let keep = cap.saturating_sub(offset).min(n as u64) as usize;
        if keep < n {
            truncated = true;
        }
        if keep > 0 && forwarding {
            let chunk = OutputChunk {
                offset,
                data: bytes::Bytes::copy_from_slice(&buf[..keep]),
                log_offset: 0,
            };
            let msg = if is_stdout {
                exec_output::Msg::Stdout(chunk)
            } else {
                exec_output::Msg::Stderr(chunk)
            };
            // A gone host stops forwarding, not draining: the command must
            // never block on a full pipe.
            forwarding = out.send(Ok(ExecOutput { msg: Some(msg) })).await.is_ok();
        }
    }
    (is_stdout, total, truncated)
}

/// Owns an execution's request stream: writes stdin (the initial bytes,
/// then streamed chunks if `follow`), ignores heartbeats, and cancels
/// `gone` when the call fails or, with `silence`, when nothing arrives for
/// that long.
pub(crate) async fn watch_input(
    mut input: InputStream,
    stdin: Option<OwnedFd>,
    initial: bytes::Bytes,
    follow: bool,
    silence: Option<Duration>,
    gone: tokio_util::sync::CancellationToken,
) {
    let mut w = stdin.and_then(|fd| tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok());
    if let Some(pipe) = w.as_mut() {
        if !initial.is_empty() && pipe.write_all(&initial).await.is_err() {
            w = None;
        }
    }
    if !follow {
        w = None;
    }
    loop {
        let next = match silence {
            Some(d) => match tokio::time::timeout(d, input.next()).await {
                Ok(n) => n,
                Err(_) => {
                    gone.cancel();
                    return;
                }
            },
            None => input.next().await,
        };
        match next {
            Some(Ok(v1::ExecInput {
                msg: Some(exec_input::Msg::Stdin(data)),
            })) => {
                if let Some(pipe) = w.as_mut() {
                    if pipe.write_all(&data).await.is_err() {
                        w = None;
                    }
                }
            }
            Some(Ok(v1::ExecInput {
                msg: Some(exec_input::Msg::StdinEof(_)),
            })) => w = None,
            Some(Ok(_)) => {}
            Some(Err(_)) => {
                gone.cancel();
                return;
            }
            // The host ended its half on purpose; a dropped call shows up
            // as the answer's receiver closing.
            None => return,
        }
    }
}
