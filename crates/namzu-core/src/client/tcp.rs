//! TCP connections into the sandbox, relayed by the agent.

use super::link::*;

impl AgentClient {
    /// A TCP connection to 127.0.0.1:`port` inside the sandbox, relayed by
    /// the agent. The returned stream is `AsyncRead + AsyncWrite`;
    /// `shutdown()` half-closes, EOF means the sandbox side closed — or
    /// that the agent said nothing for three heartbeat intervals while the
    /// host waited to read (a vanished peer; the user's writes then fail).
    /// Backpressure holds end to end: every buffer on the way is bounded,
    /// and time spent held back by it is never counted as silence.
    pub async fn open_tcp_connection(&self, port: u16) -> Result<tokio::io::DuplexStream> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const OP: &str = "tcp_connect";
        self.require(OP, feat::TCP_CONNECT)?;
        // Heartbeats both ways where the agent offers them: each end then
        // notices the other gone (three silent intervals while it waits to
        // read) instead of holding the connection open for ever.
        let every = self
            .inner
            .heartbeat
            .filter(|_| self.inner.features.contains(feat::TCP_HEARTBEAT));
        let (tx, rx) = mpsc::channel(8);
        let start = v1::TcpInput {
            msg: Some(v1::tcp_input::Msg::Connect(v1::TcpConnectStart {
                port: u32::from(port),
                host_heartbeats: every.is_some(),
            })),
        };
        let _ = tx.send(start).await;
        let mut out = self
            .rpc()
            .tcp_connect(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        match out.message().await.map_err(|s| self.status(OP, s))? {
            Some(v1::TcpOutput {
                msg: Some(v1::tcp_output::Msg::Connected(c)),
            }) => {
                self.answered_by(&c.boot_id);
            }
            other => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: format!("expected connected, got {other:?}"),
                })
            }
        }
        let (user, ours) = tokio::io::duplex(256 * 1024);
        let (mut from_user, mut to_user) = tokio::io::split(ours);
        let done = CancellationToken::new();
        let download_done = done.clone();
        let beats = every.map(|every| {
            beat_every(tx.clone(), every, || v1::TcpInput {
                msg: Some(v1::tcp_input::Msg::Heartbeat(v1::Empty {})),
            })
        });
        let upload = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let m = match from_user.read(&mut buf).await {
                    Ok(0) | Err(_) => v1::tcp_input::Msg::Eof(v1::Empty {}),
                    Ok(n) => v1::tcp_input::Msg::Data(Bytes::copy_from_slice(&buf[..n])),
                };
                let eof = matches!(m, v1::tcp_input::Msg::Eof(_));
                if tx.send(v1::TcpInput { msg: Some(m) }).await.is_err() || eof {
                    break;
                }
            }
            // Keep the request half open until the answer ends.
            tokio::select! {
                _ = tx.closed() => {}
                _ = done.cancelled() => {}
            }
        });
        let silence = every.map(|d| d * 3);
        let link = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(next) = link.within(silence, out.message()).await else {
                    tracing::warn!(
                        port,
                        "tcp: no word from the agent in three heartbeat intervals; closing"
                    );
                    // The user's writes fail from here on.
                    upload.abort();
                    break;
                };
                match next {
                    Ok(Some(v1::TcpOutput {
                        msg: Some(v1::tcp_output::Msg::Heartbeat(_)),
                    })) => {}
                    Ok(Some(v1::TcpOutput {
                        msg: Some(v1::tcp_output::Msg::Data(d)),
                    })) => {
                        if to_user.write_all(&d).await.is_err() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
            let _ = to_user.shutdown().await;
            download_done.cancel();
            if let Some(b) = beats {
                b.abort();
            }
        });
        Ok(user)
    }
}
