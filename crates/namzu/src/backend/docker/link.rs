//! The exec transport: a host link carried by a `docker exec` of
//! `namzu-agent --relay` inside the container.
//!
//! The Engine API hijacks the exec's HTTP connection; its stdin is ours to
//! write, its stdout comes back framed (stdout and stderr multiplexed), and
//! bollard splits the frames. [`ExecLink`] turns that pair into the one
//! byte stream an agent link runs over. Every dial is a fresh exec, so a
//! link that drops is re-established like a socket would be.

use std::pin::Pin;
use std::task::{Context, Poll};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where the agent listens inside every container.
pub const AGENT_SOCKET: &str = "/.namzu/run/agent.sock";
/// The uid:gid relays run as: the agent's own (its run directory and socket
/// are that uid's alone), never the commands'.
pub fn relay_user() -> String {
    let id = namzu_proto::CONTAINER_AGENT_UID;
    format!("{id}:{id}")
}
/// Where the agent binary is bind-mounted, read-only.
pub const AGENT_PATH: &str = "/.namzu/bin/namzu-agent";

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// One hijacked exec, as a byte stream.
pub struct ExecLink {
    output: Output,
    pending: Bytes,
    input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// Starts a relay exec in `container` and returns its stdio as a stream.
pub async fn dial(docker: &Docker, container: &str) -> std::io::Result<ExecLink> {
    let io = |e: bollard::errors::Error| std::io::Error::other(e.to_string());
    let user = relay_user();
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(vec![AGENT_PATH, "--relay", &format!("unix:{AGENT_SOCKET}")]),
                // Not the commands' uid: a command cannot signal (kill) the
                // process carrying the host's link without CAP_KILL.
                user: Some(&user),
                ..Default::default()
            },
        )
        .await
        .map_err(io)?;
    let started = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: Some(1 << 20),
            }),
        )
        .await
        .map_err(io)?;
    match started {
        StartExecResults::Attached { output, input } => Ok(ExecLink {
            output,
            pending: Bytes::new(),
            input,
        }),
        StartExecResults::Detached => Err(std::io::Error::other("the daemon started the relay detached")),
    }
}

impl AsyncRead for ExecLink {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match self.output.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                // End of the exec: end of the link.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(std::io::Error::other(e.to_string()))),
                Poll::Ready(Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message }))) => {
                    self.pending = message;
                }
                Poll::Ready(Some(Ok(LogOutput::StdErr { message }))) => {
                    tracing::debug!(relay = %String::from_utf8_lossy(&message).trim(), "relay stderr");
                }
                Poll::Ready(Some(Ok(LogOutput::StdIn { .. }))) => {}
            }
        }
    }
}

impl AsyncWrite for ExecLink {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.input.as_mut().poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.input.as_mut().poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.input.as_mut().poll_shutdown(cx)
    }
}
