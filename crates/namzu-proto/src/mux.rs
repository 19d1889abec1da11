//! The microVM link's multiplexer: many host connections over the one byte
//! stream a virtio-serial port gives.
//!
//! A port carries one stream for the life of the VM; the host needs several
//! links at once (the handle, the egress supervisor, another process that
//! connects by id) and a fresh one after any of them drops. Each host
//! connection becomes one yamux stream (`tokio-yamux`): the VMM's anchor on
//! the host opens streams ([`client`]), the agent in the guest accepts them
//! ([`serve`]) and hands each to the same gate as a socket connection, so
//! every stream still presents the bind token in its preface. Yamux gives
//! each stream its own flow-control window, so one link that stops reading
//! never stalls the others.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
pub use tokio_yamux::{Control, StreamHandle};

/// The bounds of one multiplexed port.
#[derive(Debug, Clone, Copy)]
pub struct MuxLimits {
    /// Streams open at once (host links), beyond which opens are refused.
    pub max_streams: usize,
    /// Streams opened but not yet taken by the agent.
    pub accept_backlog: usize,
    /// Bytes one stream may have in flight unread (its window).
    pub stream_window_bytes: u32,
}

impl Default for MuxLimits {
    fn default() -> Self {
        Self {
            max_streams: 256,
            accept_backlog: 64,
            // HTTP/2 above asks for 4 MiB stream windows (see the agent's
            // server); a smaller window here would cap every transfer.
            stream_window_bytes: 4 << 20,
        }
    }
}

fn config(l: MuxLimits) -> tokio_yamux::Config {
    tokio_yamux::Config {
        accept_backlog: l.accept_backlog,
        // HTTP/2 keepalives ride each stream already; the port itself
        // cannot drop while the VM lives.
        enable_keepalive: false,
        keepalive_interval: Duration::from_secs(30),
        connection_write_timeout: Duration::from_secs(30),
        max_stream_count: l.max_streams,
        max_stream_window_size: l.stream_window_bytes.max(tokio_yamux::config::INITIAL_STREAM_WINDOW),
    }
}

/// Accepts streams from the host on `io` and gives each to `admit`, until
/// the port fails or the host ends the session. First it opens one stream
/// of its own, the guest's only one: it tells the host the agent serves
/// (see [`client`]), and carries nothing.
pub async fn serve<T, F>(io: T, limits: MuxLimits, mut admit: F) -> std::io::Result<()>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: FnMut(StreamHandle),
{
    let mut session = tokio_yamux::session::Session::new_server(io, config(limits));
    let _ready = session.open_stream().map_err(std::io::Error::other)?;
    while let Some(next) = session.next().await {
        admit(next?);
    }
    Ok(())
}

/// Starts the host's side of a session on `io`: the returned [`Control`]
/// opens one stream per host connection; the receiver fires when the
/// guest's agent opened its ready stream (or is dropped if the port closed
/// first); the session runs on a task of its own until the port closes.
pub fn client<T>(io: T, limits: MuxLimits) -> (Control, tokio::sync::oneshot::Receiver<()>, tokio::task::JoinHandle<()>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut session = tokio_yamux::session::Session::new_client(io, config(limits));
    let control = session.control();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut held = Vec::new();
        while let Some(next) = session.next().await {
            match next {
                Ok(stream) => {
                    // The guest opens one stream only, to say it serves;
                    // any further one is not the protocol and is closed.
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                        held.push(stream);
                    }
                }
                Err(_) => break,
            }
        }
    });
    (control, ready_rx, task)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Two streams over one pipe stay apart, and one that is never read
    /// does not stall the other.
    #[tokio::test]
    async fn streams_are_independent() -> Result<(), Box<dyn std::error::Error>> {
        let (host, guest) = tokio::io::duplex(64 << 10);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(serve(guest, MuxLimits::default(), move |s| {
            let _ = tx.send(s);
        }));
        let (mut control, ready, _task) = client(host, MuxLimits::default());
        tokio::time::timeout(Duration::from_secs(5), ready).await??;
        let mut stalled = control.open_stream().await?;
        let mut live = control.open_stream().await?;
        // 1 MiB into a stream nobody reads: within its window, so it is
        // buffered on the guest side, not on the shared pipe.
        stalled.write_all(&vec![7u8; 1 << 20]).await?;
        live.write_all(b"ping").await?;
        let _first = rx.recv().await.ok_or("no first stream")?;
        let mut second = rx.recv().await.ok_or("no second stream")?;
        let mut got = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), second.read_exact(&mut got)).await??;
        assert_eq!(&got, b"ping");
        second.write_all(b"pong").await?;
        tokio::time::timeout(Duration::from_secs(5), live.read_exact(&mut got)).await??;
        assert_eq!(&got, b"pong");
        Ok(())
    }
}
