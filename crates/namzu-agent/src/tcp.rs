//! TCP into the sandbox: one relayed connection per `TcpConnect` call, to
//! 127.0.0.1:port in the agent's own network namespace (the sandbox's).
//!
//! Bytes flow through bounded channels and the HTTP/2 stream's flow
//! control, so a slow reader on either side slows the writer on the other;
//! nothing buffers without bound. Half-close is carried both ways: the
//! host's `eof` shuts down the socket's write side, the socket's EOF becomes
//! an `eof` message.

use futures::StreamExt;
use namzu_proto::v1::{self, agent_error::Kind, tcp_input, tcp_output, TcpOutput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::op_error::{agent_err, OpError};

const CHUNK: usize = 64 * 1024;

fn msg(m: tcp_output::Msg) -> Result<TcpOutput, Status> {
    Ok(TcpOutput { msg: Some(m) })
}

/// Connects and starts relaying; the receiver yields `connected` first.
pub async fn relay(
    port: u16,
    mut input: Streaming<v1::TcpInput>,
) -> Result<mpsc::Receiver<Result<TcpOutput, Status>>, OpError> {
    const OP: &str = "tcp_connect";
    let sock = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::ConnectionRefused {
            Kind::ConnectionRefused
        } else {
            Kind::Io
        };
        let mut err = agent_err(kind, OP, &format!("127.0.0.1:{port}: {e}"));
        err.port = u32::from(port);
        err.errno = e.raw_os_error().unwrap_or(0);
        err
    })?;
    let _ = sock.set_nodelay(true);
    let (tx, rx) = mpsc::channel(8);
    let _ = tx
        .send(msg(tcp_output::Msg::Connected(v1::TcpConnected {
            boot_id: crate::boot_id().to_owned(),
        })))
        .await;
    let (mut rd, mut wr) = sock.into_split();
    // Host -> sandbox. Ends on the host's eof, or when the call goes away.
    tokio::spawn(async move {
        while let Some(Ok(m)) = input.next().await {
            match m.msg {
                Some(tcp_input::Msg::Data(d)) => {
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                Some(tcp_input::Msg::Eof(_)) | None | Some(tcp_input::Msg::Connect(_)) => break,
            }
        }
        let _ = wr.shutdown().await;
    });
    // Sandbox -> host. Each send waits for room: that is the backpressure.
    tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) => {
                    let _ = tx.send(msg(tcp_output::Msg::Eof(v1::Empty {}))).await;
                    break;
                }
                Ok(n) => {
                    if tx
                        .send(msg(tcp_output::Msg::Data(bytes::Bytes::copy_from_slice(&buf[..n]))))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::aborted(format!("connection to port {port} failed: {e}"))))
                        .await;
                    break;
                }
            }
        }
    });
    Ok(rx)
}
