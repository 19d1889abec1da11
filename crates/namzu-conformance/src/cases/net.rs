//! TCP connections into the sandbox.

use super::common::*;

/// A TCP connection to a server inside the sandbox carries 4 MiB both ways
/// byte-exact while writing and reading concurrently, half-closes both ways,
/// and a closed port is a typed refusal naming it.
pub(super) async fn tcp_into_the_sandbox_round_trips_with_half_close(f: Factory) -> Outcome {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        crate::escape::install(&sb).await?;
        let port = 7000 + (std::process::id() % 1000) as u16;
        let mut server = sb
            .commands()
            .stream(ExecRequest::new("./escape").arg("--echo-server").arg(port.to_string()))
            .await
            .ctx("start echo server")?;
        match server.next().await {
            Some(Ok(ExecEvent::Stdout { data, .. })) if data.starts_with(b"listening") => {}
            other => return Err(format!("echo server did not start: {other:?}")),
        }
        let conn = sb.network().connect(port).await.ctx("open tcp")?;
        let (mut rd, mut wr) = tokio::io::split(conn);
        let data = Bytes::from(pattern(11, 4 << 20));
        let sent = data.clone();
        // Writing 4 MiB before reading would deadlock on a bounded path if
        // backpressure were missing; reading concurrently must succeed.
        let writer = tokio::spawn(async move {
            wr.write_all(&sent).await?;
            wr.shutdown().await
        });
        let mut back = Vec::with_capacity(data.len());
        rd.read_to_end(&mut back).await.ctx("read echo")?;
        writer.await.ctx("writer")?.ctx("write")?;
        ensure!(
            back.len() == data.len(),
            "echoed {} of {} bytes",
            back.len(),
            data.len()
        );
        ensure!(back == data, "echo differs");
        let closed = port.wrapping_add(1);
        match sb.network().connect(closed).await {
            Err(Error::ConnectionRefused { port }) => ensure!(port == closed, "refusal names port {port}"),
            other => return Err(format!("expected ConnectionRefused, got {:?}", other.err())),
        }
        drop(server);
        Ok(())
    })
    .await
}
