//! Commands on a stream of their own (the exec form of the preface): the
//! same start, checks, execution table, kill and errors as the link's
//! `Exec` call, the output messages framed by [`namzu_proto::side_read`]
//! instead of carried by HTTP/2 and gRPC. The host's unix socket wakes this
//! process once for the request, and each batch of output leaves in one
//! write; the acceptance leaves with `Started`.
//!
//! Promises:
//! * Whatever `Exec` refuses is refused here with the same status, and a
//!   retiring agent refuses it as its fence refuses an RPC.
//! * The host's end closing (or anything it sends after the preface) is
//!   the call dropped: the command's group is killed, as for a reset call.
//! * Stdin that streams, and detachable executions, are the link's: a
//!   start asking for either is refused before anything runs.
//! * Nothing new is held per stream beyond the execution itself, so
//!   `max_execs` bounds these streams as it bounds `Exec` calls.

use std::pin::Pin;
use std::sync::Arc;

use namzu_proto::side_read::{self as frames, header};
use namzu_proto::v1::{exec_output, ExecStart};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tonic::Status;

use crate::service::AgentService;
use crate::side_read::status_body;

const OP: &str = "exec";

/// Serves one command (its preface read, not yet answered) on `peer`: a
/// unix socket, or another stream, on which it is refused.
pub async fn serve(
    service: Arc<AgentService>,
    peer: Result<tokio::net::UnixStream, Pin<Box<dyn AsyncWrite + Send>>>,
    request: Vec<u8>,
) {
    let unix = match peer {
        Ok(u) => u,
        Err(mut other) => {
            let st = Status::unimplemented("commands run on streams of their own on unix sockets only");
            let _ = other.write_all(&refusal(&st)).await;
            return;
        }
    };
    let (mut rd, mut wr) = unix.into_split();
    // Read for as long as the command runs: the host sends nothing, so
    // its end closing, or any byte, means the caller is gone.
    let input = futures::stream::once(async move {
        let mut b = [0u8; 1];
        let why = match rd.read(&mut b).await {
            Ok(0) => "the host closed the command's stream",
            Ok(_) => "the host sent bytes on the command's stream",
            Err(_) => "the command's stream broke",
        };
        Err(Status::cancelled(why))
    });
    let started = async {
        service.side_fence(OP)?;
        service.side_exec_enabled(OP)?;
        let start: ExecStart = prost::Message::decode(request.as_slice())
            .map_err(|e| Status::invalid_argument(format!("bad exec request: {e}")))?;
        if start.stdin_stream || start.detachable {
            return Err(Status::invalid_argument(
                "streamed stdin and detachable executions travel on the link, not a stream of their own",
            ));
        }
        service.start_exec(start, Box::pin(input)).await
    };
    let (first, mut rest) = match started.await {
        Ok(v) => v,
        Err(st) => {
            let _ = wr.write_all(&refusal(&st)).await;
            return;
        }
    };
    let mut out = vec![namzu_proto::preface::ACCEPTED];
    let mut next = first;
    loop {
        let done = match next.take() {
            // The execution ended without its exit (the agent shutting
            // down): the stream closes, which the host reads as broken.
            None => true,
            Some(Ok(msg)) => {
                let exit = matches!(msg.msg, Some(exec_output::Msg::Exit(_)));
                frame(&mut out, frames::DATA, &prost::Message::encode_to_vec(&msg));
                exit
            }
            Some(Err(st)) => {
                frame(&mut out, frames::ERROR, &status_body(&st));
                true
            }
        };
        if !done {
            // What is ready already goes in the same write.
            if let Ok(m) = rest.try_recv() {
                next = Some(m);
                continue;
            }
        }
        if !out.is_empty() && wr.write_all(&out).await.is_err() {
            // The host is gone: dropping the receiver ends the call, and
            // the command with it.
            return;
        }
        out.clear();
        if done {
            return;
        }
        next = rest.recv().await;
    }
}

/// The acceptance and an `ERROR` frame: the command was refused.
fn refusal(st: &Status) -> Vec<u8> {
    let mut out = vec![namzu_proto::preface::ACCEPTED];
    frame(&mut out, frames::ERROR, &status_body(st));
    out
}

fn frame(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.extend_from_slice(&header(tag, body.len() as u64));
    out.extend_from_slice(body);
}
