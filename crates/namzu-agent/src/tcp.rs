//! TCP into the sandbox: one relayed connection per `TcpConnect` call, to
//! 127.0.0.1:port in the agent's own network namespace (the sandbox's).
//!
//! Bytes flow through bounded channels and the HTTP/2 stream's flow
//! control, so a slow reader on either side slows the writer on the other;
//! nothing buffers without bound. Half-close is carried both ways: the
//! host's `eof` shuts down the socket's write side, the socket's EOF becomes
//! an `eof` message.
//!
//! Heartbeats (feature `tcp.heartbeat`): the agent sends one every
//! heartbeat interval for as long as the call is open; with
//! `host_heartbeats`, a host that says nothing for three intervals while
//! the agent waits for its next message is gone, and the connection is
//! closed as if the call had been dropped. Only waiting to READ counts:
//! while the agent waits to write (the sandbox's side not reading, its
//! socket buffer full), nobody's silence is held against the host.

use std::time::Duration;

use futures::StreamExt;
use namzu_proto::v1::{self, agent_error::Kind, tcp_input, tcp_output, TcpOutput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::op_error::{agent_err, OpError};

const CHUNK: usize = 64 * 1024;

fn msg(m: tcp_output::Msg) -> Result<TcpOutput, Status> {
    Ok(TcpOutput { msg: Some(m) })
}

/// A relay's heartbeats.
#[derive(Debug, Clone, Copy)]
pub struct Beats {
    /// The interval (`None`: none are sent, and no silence is noticed).
    pub every: Option<Duration>,
    /// The host beats on this call, so its silence may be noticed.
    pub from_host: bool,
}

/// Connects and starts relaying; the receiver yields `connected` first.
pub async fn relay(
    port: u16,
    mut input: Streaming<v1::TcpInput>,
    beats: Beats,
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
    let beating = beats
        .every
        .map(|every| crate::heartbeat::spawn(tx.clone(), every, || msg(tcp_output::Msg::Heartbeat(v1::Empty {}))));
    let silence = beats.every.filter(|_| beats.from_host).map(|d| d * 3);
    // Set when the host fell silent: the whole connection is dropped.
    let gone = CancellationToken::new();
    let host_gone = gone.clone();
    // Host -> sandbox. Ends on the host's eof (heartbeats still heard
    // after it), or when the call goes away.
    tokio::spawn(async move {
        let mut open = true;
        loop {
            let next = match silence {
                Some(d) => match tokio::time::timeout(d, input.next()).await {
                    Ok(m) => m,
                    Err(_) => {
                        tracing::warn!(port, "tcp: no word from the host in three heartbeat intervals; closing");
                        host_gone.cancel();
                        break;
                    }
                },
                None => input.next().await,
            };
            match next.and_then(Result::ok).and_then(|m| m.msg) {
                Some(tcp_input::Msg::Heartbeat(_)) => {}
                Some(tcp_input::Msg::Data(d)) if open => {
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                Some(tcp_input::Msg::Eof(_)) if open => {
                    let _ = wr.shutdown().await;
                    open = false;
                    if silence.is_none() {
                        break;
                    }
                }
                _ => break,
            }
        }
        let _ = wr.shutdown().await;
    });
    // Sandbox -> host. Each send waits for room: that is the backpressure.
    tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let read = tokio::select! {
                r = rd.read(&mut buf) => r,
                () = gone.cancelled() => break,
            };
            match read {
                Ok(0) => {
                    let _ = tx.send(msg(tcp_output::Msg::Eof(v1::Empty {}))).await;
                    break;
                }
                Ok(n) => {
                    let sent = tokio::select! {
                        r = tx.send(msg(tcp_output::Msg::Data(bytes::Bytes::copy_from_slice(&buf[..n])))) => r.is_ok(),
                        () = gone.cancelled() => false,
                    };
                    if !sent {
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
        // The call ends with the last sender: no more heartbeats.
        if let Some(b) = beating {
            b.abort();
        }
    });
    Ok(rx)
}
