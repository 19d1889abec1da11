//! The loopback proxies: HTTP (CONNECT, and absolute-form requests for
//! plain `http://` URLs) and SOCKS5 (CONNECT, no authentication). Each
//! reads only what it must to learn the destination, asks the host, and on
//! acceptance joins the client to the host's splice.

use std::sync::Arc;

use bytes::Bytes;
use namzu_proto::v1::{egress_ask, EgressConnect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::join::join;
use super::{Answer, Broker};

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

/// Header fields a request head may have; more is 431, as a head over
/// `egress_max_head_bytes` is.
const MAX_HEADERS: usize = 100;

/// Where a request head read so far stands.
enum Head {
    /// Ends at this offset.
    Complete(usize),
    /// Needs more bytes.
    Partial,
    /// Too many header fields.
    TooMany,
    /// Not HTTP/1.x.
    Bad(httparse::Error),
}

fn head_status(head: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::Request::new(&mut headers).parse(head) {
        Ok(httparse::Status::Complete(n)) => Head::Complete(n),
        Ok(httparse::Status::Partial) => Head::Partial,
        Err(httparse::Error::TooManyHeaders) => Head::TooMany,
        Err(e) => Head::Bad(e),
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
        let status = head_status(&head);
        let found = match &status {
            Head::Complete(end) => Some(*end),
            _ => None,
        };
        // The bound is on the head itself, however many reads brought it.
        if found.unwrap_or(head.len()) > broker.max_head || matches!(status, Head::TooMany) {
            return respond(
                &mut client,
                "431 Request Header Fields Too Large",
                "request head too long",
            )
            .await;
        }
        match status {
            Head::Complete(end) => break end,
            Head::Bad(e) => {
                return respond(&mut client, "400 Bad Request", &format!("not an HTTP/1 request: {e}")).await
            }
            Head::Partial | Head::TooMany => {}
        }
    };
    let rest = head.split_off(end);
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    if req.parse(&head).is_err() {
        return respond(&mut client, "400 Bad Request", "not an HTTP/1 request").await;
    }
    let (method, target) = (req.method.unwrap_or_default(), req.path.unwrap_or_default());
    let version = match req.version {
        Some(0) => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
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
    let headers = req.headers;
    let mut body = match super::http1::check_head(headers, authority, 80) {
        Ok(b) => b,
        Err(e) => return respond(&mut client, "403 Forbidden", &format!("namzu egress refused: {e}")).await,
    };
    match connect(&broker, host, port, "http").await {
        Answer::Spliced(s) => {
            // Origin form to the server, our own Host, and exactly one
            // request: whatever the client sends after this request's body
            // is never forwarded.
            let mut first = format!("{method} {path} {version}\r\nHost: {authority}\r\n").into_bytes();
            for h in headers.iter() {
                let name = h.name.to_ascii_lowercase();
                if !matches!(
                    name.as_str(),
                    "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
                ) {
                    first.extend_from_slice(h.name.as_bytes());
                    first.extend_from_slice(b": ");
                    first.extend_from_slice(h.value);
                    first.extend_from_slice(b"\r\n");
                }
            }
            first.extend_from_slice(b"Connection: close\r\n\r\n");
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
