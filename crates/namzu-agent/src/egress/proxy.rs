//! The loopback proxies: HTTP (CONNECT, and absolute-form requests for
//! plain `http://` URLs) and SOCKS5 (CONNECT, no authentication). Each
//! reads only what it must to learn the destination, asks the host, and on
//! acceptance joins the client to the host's splice.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use namzu_proto::v1::{self, egress_ask, EgressConnect, TcpOutput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Answer, Broker, Splice};

const CHUNK: usize = 64 * 1024;

pub fn spawn_http(broker: Arc<Broker>, listener: TcpListener) {
    spawn_accepting(broker, listener, "http proxy", http_client);
}

pub fn spawn_socks(broker: Arc<Broker>, listener: TcpListener) {
    spawn_accepting(broker, listener, "socks proxy", socks_client);
}

/// Accepts forever, each client on a task of its own.
fn spawn_accepting<F, Fut>(broker: Arc<Broker>, listener: TcpListener, what: &'static str, client: F)
where
    F: Fn(Arc<Broker>, TcpStream) -> Fut + Send + Copy + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Some((c, _)) = namzu_proto::accept::next(|| listener.accept(), what).await {
            let b = broker.clone();
            tokio::spawn(async move {
                if let Err(e) = client(b, c).await {
                    tracing::debug!("{what} client: {e}");
                }
            });
        }
    });
}

async fn connect(broker: &Broker, host: String, port: u16, via: &str) -> Answer {
    broker
        .ask(egress_ask::What::Connect(EgressConnect {
            host,
            port: u32::from(port),
            via: via.into(),
        }))
        .await
}

/// `host:port` or `[v6]:port`.
fn split_authority(a: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => default_port,
            None => return None,
        };
        return Some((h.to_owned(), port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((a.to_owned(), default_port)),
    }
}

async fn http_client(broker: Arc<Broker>, mut client: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let end = loop {
        let mut buf = [0u8; 2048];
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        let found = head.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
        // The bound is on the head itself, however many reads brought it.
        if found.unwrap_or(head.len()) > broker.max_head {
            return respond(
                &mut client,
                "431 Request Header Fields Too Large",
                "request head too long",
            )
            .await;
        }
        if let Some(end) = found {
            break end;
        }
    };
    let rest = head.split_off(end);
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_authority(target, 443) else {
            return respond(&mut client, "400 Bad Request", "CONNECT wants host:port").await;
        };
        return match connect(&broker, host, port, "http-connect").await {
            Answer::Spliced(s) => {
                client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
                join(client, s, Bytes::from(rest), None).await
            }
            other => refuse_http(&mut client, other).await,
        };
    }
    // Absolute form: `GET http://host[:port]/path HTTP/1.1`.
    let Some(after) = target.strip_prefix("http://") else {
        return respond(
            &mut client,
            "400 Bad Request",
            "this proxy takes CONNECT, or absolute http:// URLs",
        )
        .await;
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let Some((host, port)) = split_authority(authority, 80) else {
        return respond(&mut client, "400 Bad Request", "bad host in URL").await;
    };
    // The Host the server sees is the one checked: a request naming
    // another (one allowlisted name on a shared CDN, another site in Host)
    // is refused before anything is asked.
    let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    let mut body = match super::http1::check_head(headers.iter().copied(), authority, 80) {
        Ok(b) => b,
        Err(e) => return respond(&mut client, "403 Forbidden", &format!("namzu egress refused: {e}")).await,
    };
    match connect(&broker, host, port, "http").await {
        Answer::Spliced(s) => {
            // Origin form to the server, our own Host, and exactly one
            // request: whatever the client sends after this request's body
            // is never forwarded.
            let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
            for l in headers {
                let name = l.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
                if !matches!(
                    name.as_str(),
                    "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
                ) {
                    out.push_str(l);
                    out.push_str("\r\n");
                }
            }
            out.push_str("Connection: close\r\n\r\n");
            let mut first = out.into_bytes();
            let taken = match body.feed(&rest) {
                Ok(n) => n,
                Err(e) => return respond(&mut client, "400 Bad Request", e).await,
            };
            first.extend_from_slice(&rest[..taken]);
            join(client, s, Bytes::from(first), Some(body)).await
        }
        other => refuse_http(&mut client, other).await,
    }
}

async fn refuse_http(client: &mut TcpStream, a: Answer) -> std::io::Result<()> {
    match a {
        Answer::Refused(why) => respond(client, "403 Forbidden", &format!("namzu egress refused: {why}")).await,
        Answer::Failed(why) => respond(client, "502 Bad Gateway", &format!("namzu egress: {why}")).await,
        Answer::Addresses(_) | Answer::Spliced(_) => respond(client, "502 Bad Gateway", "unexpected answer").await,
    }
}

async fn respond(client: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let body = format!("{body}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(msg.as_bytes()).await?;
    client.shutdown().await
}

/// SOCKS5 reply codes (RFC 1928 §6).
const SOCKS_OK: u8 = 0;
const SOCKS_FAILURE: u8 = 1;
const SOCKS_NOT_ALLOWED: u8 = 2;
const SOCKS_HOST_UNREACHABLE: u8 = 4;
const SOCKS_COMMAND: u8 = 7;
const SOCKS_ADDRESS_TYPE: u8 = 8;

async fn socks_client(broker: Arc<Broker>, mut client: TcpStream) -> std::io::Result<()> {
    let mut hello = [0u8; 2];
    client.read_exact(&mut hello).await?;
    if hello[0] != 5 {
        return Ok(());
    }
    let mut methods = vec![0u8; usize::from(hello[1])];
    client.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        client.write_all(&[5, 0xff]).await?;
        return Ok(());
    }
    client.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    client.read_exact(&mut req).await?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            client.read_exact(&mut name).await?;
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        _ => return socks_reply(&mut client, SOCKS_ADDRESS_TYPE).await,
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await?;
    if req[1] != 1 {
        return socks_reply(&mut client, SOCKS_COMMAND).await;
    }
    match connect(&broker, host, u16::from_be_bytes(port), "socks5").await {
        Answer::Spliced(s) => {
            socks_reply(&mut client, SOCKS_OK).await?;
            join(client, s, Bytes::new(), None).await
        }
        Answer::Refused(_) => socks_reply(&mut client, SOCKS_NOT_ALLOWED).await,
        Answer::Failed(_) => socks_reply(&mut client, SOCKS_HOST_UNREACHABLE).await,
        Answer::Addresses(_) => socks_reply(&mut client, SOCKS_FAILURE).await,
    }
}

async fn socks_reply(client: &mut TcpStream, code: u8) -> std::io::Result<()> {
    client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Joins `client` to the host's splice: `first` (bytes already read past
/// what the proxy consumed) goes out before anything else. Each direction
/// half-closes on its own EOF; a splice the host drops (a policy change)
/// closes the client. With `body` (one plain-HTTP request), only the rest
/// of that request's body goes upstream; later client bytes are read and
/// dropped, and the client is closed when the response ends.
async fn join(
    client: TcpStream,
    s: Box<Splice>,
    first: Bytes,
    body: Option<super::http1::Body>,
) -> std::io::Result<()> {
    let framed = body.is_some();
    let _ = client.set_nodelay(true);
    let (mut rd, mut wr) = client.into_split();
    let Splice { mut from_host, to_host } = *s;
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
                    let n = match body.as_mut() {
                        None => n,
                        Some(b) if b.done() => 0,
                        Some(b) => match b.feed(&buf[..n]) {
                            Ok(k) => k,
                            Err(_) => return,
                        },
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

#[cfg(test)]
mod tests {
    use super::split_authority;

    #[test]
    fn authorities_split() {
        assert_eq!(split_authority("a.example:8443", 443), Some(("a.example".into(), 8443)));
        assert_eq!(split_authority("a.example", 80), Some(("a.example".into(), 80)));
        assert_eq!(
            split_authority("[2001:db8::1]:443", 80),
            Some(("2001:db8::1".into(), 443))
        );
        assert_eq!(split_authority("[2001:db8::1]", 80), Some(("2001:db8::1".into(), 80)));
        assert_eq!(split_authority("a.example:x", 80), None);
    }
}
