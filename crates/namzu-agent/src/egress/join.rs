//! Joining a sandbox's client to the host's end of an egress connection
//! the host accepted: an `EgressSplice` call's messages, or a byte stream
//! of the connection's own, copied both ways in large reads — or, on a
//! unix stream opened with the handoff form, the client's socket handed
//! to the host, which then relays it without this process.

use std::os::fd::{AsFd, AsRawFd};

use bytes::Bytes;
use futures::StreamExt;
use namzu_proto::v1::{self, TcpOutput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http1::Body;
use super::{RawStream, Splice};

/// Bytes read at a time from the client for a call's messages.
const CHUNK: usize = 64 * 1024;
/// Bytes copied at a time on a stream of the connection's own.
const STREAM_CHUNK: usize = 256 * 1024;

/// Joins `client` to the host's splice: `first` (bytes already read past
/// what the proxy consumed) goes out before anything else. Each direction
/// half-closes on its own EOF; a splice the host drops (a policy change)
/// closes the client. With `body` (one plain-HTTP request), only the rest
/// of that request's body goes upstream; later client bytes are read and
/// dropped, and the client is closed when the response ends.
pub(super) async fn join(client: TcpStream, s: Box<Splice>, first: Bytes, body: Option<Body>) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    match *s {
        Splice::Call { from_host, to_host } => join_call(client, from_host, to_host, first, body).await,
        Splice::Stream { host, handoff } => join_stream(client, host, handoff, first, body).await,
        Splice::Unix { host, handoff } => join_unix(client, host, handoff, first, body).await,
    }
}

/// How much of `read` goes upstream: all of it with no body to cut at its
/// end, else what is left of the one request's body (0 once it is done);
/// `None` for a malformed body, which ends the connection.
fn upstream_len(body: Option<&mut Body>, read: &[u8]) -> Option<usize> {
    match body {
        None => Some(read.len()),
        Some(b) if b.done() => Some(0),
        Some(b) => b.feed(read).ok(),
    }
}

/// Reads what `s` has, waiting for it.
async fn read_ref(s: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// [`join`] on a unix stream of the connection's own. With `handoff`
/// the client's socket is offered to the host first
/// ([`namzu_proto::handoff`]): taken, the host relays the destination's
/// bytes to it directly (and the client's too, where no body is to be
/// cut) and this process steps out of that path. Otherwise the bytes are
/// spliced, never copied through this process (but a plain-HTTP
/// request's body, which is read to be cut at its end).
async fn join_unix(
    client: TcpStream,
    host: tokio::net::UnixStream,
    handoff: bool,
    first: Bytes,
    body: Option<Body>,
) -> std::io::Result<()> {
    use namzu_proto::handoff::{give, Mode};
    let taken = if handoff {
        let mode = if body.is_some() { Mode::Downstream } else { Mode::Whole };
        give(&host, client.as_fd(), mode, &first).await?
    } else {
        namzu_proto::splice::write_all(&host, &first).await?;
        false
    };
    let Some(mut body) = body else {
        if !taken {
            namzu_proto::splice::both_ways(&client, &host).await?;
        }
        // Taken whole: the host holds the client; this copy closes.
        return Ok(());
    };
    let upstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match read_ref(&client, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Whatever the client sends after the one request is read and
            // dropped, never forwarded.
            let Some(k) = upstream_len(Some(&mut body), &buf[..n]) else {
                break;
            };
            if k > 0 && namzu_proto::splice::write_all(&host, &buf[..k]).await.is_err() {
                break;
            }
        }
        // The client's end, passed on: the server may be waiting for it.
        let _ = nix::sys::socket::shutdown(host.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        futures::future::pending::<()>().await;
    };
    // The one request's response is over when the host's side ends: then
    // both halves close, whatever the client is doing. Taken, the host
    // writes the response itself and closes the stream at its end.
    tokio::select! {
        _ = upstream => {}
        _ = async {
            if taken {
                namzu_proto::handoff::closed(&host).await;
            } else {
                let _ = namzu_proto::splice::one_way(&host, &client).await;
            }
        } => {}
    }
    Ok(())
}

/// [`join`] through an `EgressSplice` call: every chunk a message.
async fn join_call(
    client: TcpStream,
    mut from_host: tonic::Streaming<v1::EgressSpliceInput>,
    to_host: tokio::sync::mpsc::Sender<Result<TcpOutput, tonic::Status>>,
    first: Bytes,
    body: Option<Body>,
) -> std::io::Result<()> {
    let framed = body.is_some();
    let (mut rd, mut wr) = client.into_split();
    let out = |m| Ok(TcpOutput { msg: Some(m) });
    let upstream = async move {
        if !first.is_empty() && to_host.send(out(v1::tcp_output::Msg::Data(first))).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; CHUNK];
        let mut body = body;
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to_host.send(out(v1::tcp_output::Msg::Eof(v1::Empty {}))).await;
                    return;
                }
                Ok(n) => {
                    let Some(n) = upstream_len(body.as_mut(), &buf[..n]) else {
                        return;
                    };
                    if n == 0 {
                        continue;
                    }
                    let data = Bytes::copy_from_slice(&buf[..n]);
                    if to_host.send(out(v1::tcp_output::Msg::Data(data))).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let upstream = tokio::spawn(upstream);
    // True when the host dropped the splice rather than ending it.
    let dropped = async move {
        while let Some(Ok(m)) = from_host.next().await {
            match m.msg {
                Some(v1::egress_splice_input::Msg::Data(d)) => {
                    if wr.write_all(&d).await.is_err() {
                        return false;
                    }
                }
                Some(v1::egress_splice_input::Msg::Eof(_)) => {
                    let _ = wr.shutdown().await;
                    return false;
                }
                _ => break,
            }
        }
        true
    }
    .await;
    if dropped || framed {
        // A policy change (or the host going away), or the one request's
        // response is over: close both halves now, whatever the client is
        // doing.
        upstream.abort();
    } else {
        let _ = upstream.await;
    }
    Ok(())
}

/// [`join`] on a stream of the connection's own. The host closes the
/// stream when the destination is done or a policy change ends the
/// connection (the two look alike here): the client's read side then sees
/// the end, and its writes fail once the host is gone.
async fn join_stream(
    client: TcpStream,
    mut host: RawStream,
    handoff: bool,
    first: Bytes,
    body: Option<Body>,
) -> std::io::Result<()> {
    let framed = body.is_some();
    if handoff {
        namzu_proto::handoff::keep(&mut host, &first).await?;
    } else {
        host.write_all(&first).await?;
    }
    let (mut crd, mut cwr) = client.into_split();
    let (mut hrd, mut hwr) = tokio::io::split(host);
    let upstream = async move {
        let mut buf = vec![0u8; STREAM_CHUNK];
        let mut body = body;
        loop {
            let n = match crd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let Some(n) = upstream_len(body.as_mut(), &buf[..n]) else {
                break;
            };
            if n > 0 && hwr.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = hwr.shutdown().await;
    };
    let upstream = tokio::spawn(upstream);
    let mut buf = vec![0u8; STREAM_CHUNK];
    loop {
        match hrd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if cwr.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = cwr.shutdown().await;
    if framed {
        // The one request's response is over: close the client now.
        upstream.abort();
    } else {
        let _ = upstream.await;
    }
    Ok(())
}
