//! The host side of egress: answers the agent's asks against the policy,
//! resolves, checks every address, connects and splices. One [`Service`]
//! per sandbox, run by the egress supervisor ([`super::supervisor`]).
//!
//! A policy change ([`Service::set`]) is atomic: asks decided after it see
//! only the new policy, and every open connection the new policy would
//! refuse is closed (both ends) before `set` returns.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use namzu_proto::v1::{self, egress_ask, EgressAsk, EgressVerdict};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::policy::{Refusal, Target};
pub use super::{EgressConfig, DEFAULT_DNS_QUERIES_PER_SEC, DEFAULT_MAX_CONNECTIONS};
use crate::client::AgentClient;
use crate::error::Result;

/// How long one connection attempt to one address may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent may take to send its handoff offer, which it
/// sends as soon as the stream is accepted.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);
const CHUNK: usize = 64 * 1024;
/// Bytes copied at a time on an egress connection's own stream.
const STREAM_CHUNK: usize = 256 * 1024;

/// A string from the sandbox (a host name as asked, a refusal quoting it,
/// the proxy it came through) as written to the decision log: every
/// control character escaped (`\n`, `\u{1b}` …), so no name can end a
/// log line and forge the next one, whatever subscriber writes it.
pub struct Clean<'a, T: std::fmt::Display + ?Sized>(pub &'a T);

impl<T: std::fmt::Display + ?Sized> std::fmt::Display for Clean<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        for ch in self.0.to_string().chars() {
            if ch.is_control() {
                for e in ch.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(ch)?;
            }
        }
        Ok(())
    }
}

/// One open connection, as the policy sees it.
struct Conn {
    host: String,
    port: u16,
    addr: IpAddr,
    close: CancellationToken,
}

/// The egress decisions of one sandbox.
///
/// Lock order: `conns`, then `config`. [`Service::set`] replaces the
/// configuration while holding `conns`, and a connection is registered
/// under `conns` after deciding again against the configuration read
/// there: so a connection decided under an old policy either registered
/// before the change (and the change closes it) or registers after it
/// (and is refused), never survives in between.
pub struct Service {
    id: String,
    config: RwLock<EgressConfig>,
    conns: Mutex<HashMap<u64, Conn>>,
    next: AtomicU64,
    /// Connections open or being opened: the `max_connections` bound.
    slots: std::sync::atomic::AtomicUsize,
    /// Name queries in the current one-second window.
    dns: Mutex<DnsWindow>,
    /// Decisions so far: allowed, refused, resolved, failed; and
    /// connections handed over.
    counts: [AtomicU64; 5],
}

const ALLOWED: usize = 0;
const REFUSED: usize = 1;
const RESOLVED: usize = 2;
const FAILED: usize = 3;
const HANDED_OVER: usize = 4;

/// A one-second window of name queries.
#[derive(Debug)]
struct DnsWindow {
    start: std::time::Instant,
    count: u32,
    refused: u32,
}

impl DnsWindow {
    /// Counts one query at `now` against `limit`: `Ok`, or the refusal and
    /// whether it is the window's first (the one that is logged).
    fn admit(&mut self, now: std::time::Instant, limit: u32) -> std::result::Result<(), bool> {
        if now.duration_since(self.start) >= Duration::from_secs(1) {
            *self = Self {
                start: now,
                count: 0,
                refused: 0,
            };
        }
        if self.count < limit {
            self.count += 1;
            return Ok(());
        }
        self.refused += 1;
        Err(self.refused == 1)
    }
}

/// One reserved connection slot, given back when dropped.
struct Slot<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Service {
    /// A service for sandbox `id`, deciding by `config`.
    pub fn new(id: impl Into<String>, config: EgressConfig) -> Arc<Self> {
        Arc::new(Self {
            id: id.into(),
            config: RwLock::new(config),
            conns: Mutex::default(),
            next: AtomicU64::new(0),
            slots: Default::default(),
            dns: Mutex::new(DnsWindow {
                start: std::time::Instant::now(),
                count: 0,
                refused: 0,
            }),
            counts: Default::default(),
        })
    }

    fn count(&self, verdict: usize) {
        self.counts[verdict].fetch_add(1, Ordering::Relaxed);
    }

    /// The decisions made so far, by verdict.
    pub fn decisions(&self) -> super::Decisions {
        let n = |i: usize| self.counts[i].load(Ordering::Relaxed);
        super::Decisions {
            allowed: n(ALLOWED),
            refused: n(REFUSED),
            resolved: n(RESOLVED),
            failed: n(FAILED),
            handed_over: n(HANDED_OVER),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> EgressConfig {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Replaces the policy (and host overrides) and closes every open
    /// connection the new policy refuses. Returns how many it closed.
    pub fn set(&self, config: EgressConfig) -> usize {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config.clone();
        let mut conns = conns;
        let mut refused = Vec::new();
        for (key, c) in conns.iter() {
            let verdict = config
                .may_connect(&c.host, c.port)
                .and_then(|_| config.may_reach(c.addr));
            if let Err(why) = verdict {
                tracing::info!(sandbox = %self.id, host = %Clean(&c.host), port = c.port, address = %c.addr, reason = %Clean(&why), "egress: open connection closed by a policy change");
                c.close.cancel();
                refused.push(*key);
            }
        }
        // Gone from the count before `set` returns; each splice ends on
        // its token and drops both sockets.
        for key in &refused {
            conns.remove(key);
        }
        refused.len()
    }

    /// Reserves one connection slot, or refuses past `max_connections`.
    fn reserve(&self) -> std::result::Result<Slot<'_>, Refusal> {
        let limit = self.config.read().unwrap_or_else(|p| p.into_inner()).connection_limit();
        let taken = self.slots.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(&self.slots);
        if taken >= limit {
            return Err(Refusal::TooManyConnections { limit });
        }
        Ok(slot)
    }

    /// Registers an established connection after deciding it again
    /// against the configuration in force now (see the lock order on
    /// [`Service`]). Returns its key.
    fn register(&self, conn: Conn) -> std::result::Result<u64, Refusal> {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        {
            let config = self.config.read().unwrap_or_else(|p| p.into_inner());
            config
                .may_connect(&conn.host, conn.port)
                .and_then(|_| config.may_reach(conn.addr))?;
        }
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        conns.insert(key, conn);
        Ok(key)
    }

    /// Answers asks on the agent's `Egress` call until it ends;
    /// `attached` runs once the call is up.
    pub async fn serve(self: &Arc<Self>, client: &AgentClient, attached: impl FnOnce()) -> Result<()> {
        let (verdicts, mut asks) = egress_channel(client).await?;
        tracing::info!(sandbox = %self.id, "egress: attached");
        attached();
        while let Some(ask) = asks.next().await {
            let Ok(ask) = ask else { break };
            let (me, client, verdicts) = (self.clone(), client.clone(), verdicts.clone());
            tokio::spawn(async move {
                if let Some(v) = me.handle(&client, ask).await {
                    let _ = verdicts.send(v).await;
                }
            });
        }
        Ok(())
    }

    async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        if let Some(a) = self.config.read().unwrap_or_else(|p| p.into_inner()).hosts.get(name) {
            return Ok(a.clone());
        }
        Ok(tokio::net::lookup_host((name, 0)).await?.map(|s| s.ip()).collect())
    }

    /// One ask; `None` when the answer is the splice itself.
    async fn handle(self: &Arc<Self>, client: &AgentClient, ask: EgressAsk) -> Option<EgressVerdict> {
        let id = ask.id;
        let refuse = |r: String| EgressVerdict {
            id,
            refusal: r,
            ..Default::default()
        };
        let fail = |e: String| EgressVerdict {
            id,
            error: e,
            ..Default::default()
        };
        match ask.what? {
            egress_ask::What::Resolve(q) => {
                let config = self.config();
                let limit = config.dns_limit();
                let admitted = self
                    .dns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .admit(std::time::Instant::now(), limit);
                if let Err(first) = admitted {
                    self.count(REFUSED);
                    let why = Refusal::DnsRateLimited { limit };
                    if first {
                        tracing::info!(sandbox = %self.id, host = %Clean(&q.name), verdict = "refused", reason = %why, "egress (further refusals this second are not logged)");
                    }
                    return Some(refuse(why.to_string()));
                }
                let name = match config.may_resolve(&q.name) {
                    Ok(n) => n,
                    Err(why) => {
                        self.log(&q.name, 0, "resolve", Err(&why));
                        return Some(refuse(why.to_string()));
                    }
                };
                match self.resolve(&name).await {
                    Ok(addrs) => {
                        self.count(RESOLVED);
                        tracing::info!(sandbox = %self.id, host = %Clean(&name), verdict = "resolved", count = addrs.len(), "egress");
                        Some(EgressVerdict {
                            id,
                            addresses: addrs
                                .into_iter()
                                .filter(|a| a.is_ipv6() == q.ipv6)
                                .map(|a| match a {
                                    IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
                                    IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
                                })
                                .collect(),
                            ..Default::default()
                        })
                    }
                    Err(e) => Some(fail(format!("resolve {name}: {e}"))),
                }
            }
            egress_ask::What::Connect(c) => {
                let Ok(port) = u16::try_from(c.port) else {
                    return Some(refuse(format!("port {} is not a port", c.port)));
                };
                let policy = self.config();
                // Decided once; the slot is reserved only for a permitted
                // connection, before any resolving or dialling.
                let decided = policy
                    .may_connect(&c.host, port)
                    .and_then(|target| self.reserve().map(|slot| (target, slot)));
                let (target, slot) = match decided {
                    Ok(d) => d,
                    Err(why) => {
                        self.log(&c.host, port, &c.via, Err(&why));
                        return Some(refuse(why.to_string()));
                    }
                };
                let (host, addrs) = match target {
                    Target::Address(ip) => (ip.to_string(), vec![ip]),
                    Target::Name(name) => match self.resolve(&name).await {
                        Ok(a) if a.is_empty() => return Some(fail(format!("{name} has no address"))),
                        Ok(a) => (name, a),
                        Err(e) => return Some(fail(format!("resolve {name}: {e}"))),
                    },
                };
                // Every address, not just the one dialled: a permitted name
                // that resolves inside is refused whole (DNS rebinding).
                if let Some(why) = addrs.iter().find_map(|a| policy.may_reach(*a).err()) {
                    self.log(&host, port, &c.via, Err(&why));
                    return Some(refuse(why.to_string()));
                }
                let mut last = String::new();
                for addr in &addrs {
                    let sa = SocketAddr::new(*addr, port);
                    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(sa)).await {
                        Ok(Ok(stream)) => {
                            let close = CancellationToken::new();
                            let conn = Conn {
                                host: host.clone(),
                                port,
                                addr: *addr,
                                close: close.clone(),
                            };
                            let key = match self.register(conn) {
                                Ok(key) => key,
                                Err(why) => {
                                    self.log(&host, port, &c.via, Err(&why));
                                    return Some(refuse(why.to_string()));
                                }
                            };
                            self.log(&host, port, &c.via, Ok(*addr));
                            let spliced = self.splice(client, id, close, stream).await;
                            self.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
                            drop(slot);
                            return spliced.err().map(fail);
                        }
                        Ok(Err(e)) => last = format!("connect {sa}: {e}"),
                        Err(_) => last = format!("connect {sa}: no answer within {CONNECT_TIMEOUT:?}"),
                    }
                }
                self.count(FAILED);
                tracing::info!(sandbox = %self.id, host = %Clean(&host), port, via = %Clean(&c.via), verdict = "failed", reason = %Clean(&last), "egress");
                Some(fail(last))
            }
        }
    }

    fn log(&self, host: &str, port: u16, via: &str, verdict: std::result::Result<IpAddr, &Refusal>) {
        self.count(if verdict.is_ok() { ALLOWED } else { REFUSED });
        match verdict {
            Ok(addr) => {
                tracing::info!(sandbox = %self.id, host = %Clean(&host), port, via = %Clean(&via), address = %addr, verdict = "allowed", "egress")
            }
            Err(why) => {
                tracing::info!(sandbox = %self.id, host = %Clean(&host), port, via = %Clean(&via), verdict = "refused", reason = %Clean(why), "egress")
            }
        }
    }

    /// Joins `stream` to the agent's client for ask `id` until either side
    /// ends or `close` fires (a policy change).
    async fn splice(
        self: &Arc<Self>,
        client: &AgentClient,
        id: u64,
        close: CancellationToken,
        stream: tokio::net::TcpStream,
    ) -> std::result::Result<(), String> {
        let _ = stream.set_nodelay(true);
        // A stream of the connection's own where the link can open one:
        // no framing, no sharing the link's flow control with the rest.
        match client.open_egress_stream(id).await {
            // A unix socket: spliced, the bytes never through this process.
            Some(Ok(crate::client::EgressStream::Unix { stream: raw, handoff })) => {
                tokio::select! {
                    r = relay_unix(raw, handoff, &stream, || self.count(HANDED_OVER)) => {
                        if let Err(e) = r {
                            tracing::debug!(sandbox = %self.id, ask = id, "egress: relay ended: {e}");
                        }
                    }
                    _ = close.cancelled() => {}
                }
                return Ok(());
            }
            Some(Ok(crate::client::EgressStream::Other(mut raw))) => {
                let mut stream = stream;
                tokio::select! {
                    _ = tokio::io::copy_bidirectional_with_sizes(&mut raw, &mut stream, STREAM_CHUNK, STREAM_CHUNK) => {}
                    _ = close.cancelled() => {}
                }
                return Ok(());
            }
            Some(Err(e)) => {
                tracing::warn!(sandbox = %self.id, ask = id, "egress: no stream of its own ({e}); through the link")
            }
            None => {}
        }
        let (to_sandbox, mut from_sandbox) = egress_splice(client, id).await.map_err(|e| e.to_string())?;
        let (mut rd, mut wr) = stream.into_split();
        let up = async {
            while let Some(Ok(m)) = from_sandbox.next().await {
                match m.msg {
                    Some(v1::tcp_output::Msg::Data(d)) => {
                        if wr.write_all(&d).await.is_err() {
                            return;
                        }
                    }
                    _ => break,
                }
            }
            let _ = wr.shutdown().await;
        };
        let down = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let m = match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => v1::egress_splice_input::Msg::Eof(v1::Empty {}),
                    Ok(n) => v1::egress_splice_input::Msg::Data(Bytes::copy_from_slice(&buf[..n])),
                };
                let eof = matches!(m, v1::egress_splice_input::Msg::Eof(_));
                if to_sandbox.send(v1::EgressSpliceInput { msg: Some(m) }).await.is_err() || eof {
                    return;
                }
            }
        };
        tokio::select! {
            _ = async { tokio::join!(up, down) } => {}
            _ = close.cancelled() => {}
        }
        Ok(())
    }
}

/// Relays `upstream` through a unix egress stream: after the agent's
/// offer where it was asked for one, straight to the client's socket when
/// the agent handed it over (one relay instead of two), else through the
/// stream.
async fn relay_unix(
    raw: tokio::net::UnixStream,
    handoff: bool,
    upstream: &tokio::net::TcpStream,
    handed_over: impl FnOnce(),
) -> std::io::Result<()> {
    use namzu_proto::handoff::{self, Mode};
    use namzu_proto::splice::{both_ways, one_way, write_all};
    if !handoff {
        return both_ways(&raw, upstream).await.map(drop);
    }
    let offered = tokio::time::timeout(HANDOFF_TIMEOUT, handoff::take(&raw))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no handoff offer in time"))??;
    write_all(upstream, &offered.first).await?;
    if offered.client.is_some() {
        handed_over();
    }
    match (offered.client, offered.mode) {
        (Some(client), Mode::Whole) => {
            drop(raw);
            both_ways(&client, upstream).await.map(drop)
        }
        (Some(client), Mode::Downstream) => {
            // The agent sends the client's bytes (a request's body, cut
            // at its end); the response goes straight to the client, and
            // its end closes everything, the stream telling the agent.
            let up = async {
                let _ = one_way(&raw, upstream).await;
                futures::future::pending::<()>().await
            };
            tokio::select! {
                _ = up => Ok(()),
                r = one_way(upstream, &client) => r.map(drop),
            }
        }
        _ => both_ways(&raw, upstream).await.map(drop),
    }
}

/// Opens the `Egress` call this service holds for the sandbox's life:
/// verdicts go out through the sender, the agent's asks come in on the
/// stream. A newer call replaces this one.
async fn egress_channel(
    client: &AgentClient,
) -> Result<(
    tokio::sync::mpsc::Sender<v1::EgressVerdict>,
    tonic::Streaming<v1::EgressAsk>,
)> {
    const OP: &str = "egress";
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let asks = client
        .rpc_for(OP, namzu_proto::features::EGRESS)?
        .egress(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| client.status_error(OP, s))?
        .into_inner();
    Ok((tx, asks))
}

/// Accepts the agent's connect ask `id`: the host has connected, and this
/// joins the two ends. Bytes for the sandbox's client go through the sender
/// (after the `accept` this sends first); the client's bytes come in on the
/// stream.
async fn egress_splice(
    client: &AgentClient,
    id: u64,
) -> Result<(
    tokio::sync::mpsc::Sender<v1::EgressSpliceInput>,
    tonic::Streaming<v1::TcpOutput>,
)> {
    const OP: &str = "egress_splice";
    let rpc = client.rpc_for(OP, namzu_proto::features::EGRESS)?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let accept = v1::EgressSpliceInput {
        msg: Some(v1::egress_splice_input::Msg::Accept(id)),
    };
    let _ = tx.send(accept).await;
    let from = rpc
        .clone()
        .egress_splice(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| client.status_error(OP, s))?
        .into_inner();
    Ok((tx, from))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::egress::{EgressPolicy, HostRule};

    // TEST-NET-2: public to the classifier, never one of this host's.
    const ADDR: [u8; 4] = [198, 51, 100, 7];

    fn allow_a() -> EgressConfig {
        EgressConfig {
            policy: EgressPolicy::Allowlist {
                hosts: vec![HostRule::parse("a.test", None).unwrap()],
            },
            ..Default::default()
        }
    }

    fn deny() -> EgressConfig {
        EgressConfig {
            policy: EgressPolicy::DenyAll,
            ..Default::default()
        }
    }

    fn conn() -> (Conn, CancellationToken) {
        let close = CancellationToken::new();
        let c = Conn {
            host: "a.test".into(),
            port: 80,
            addr: IpAddr::from(ADDR),
            close: close.clone(),
        };
        (c, close)
    }

    /// Audit item 13: a name with control characters cannot forge a line
    /// of the decision log. Rendered by a real fmt subscriber, through the
    /// service's own log call.
    #[test]
    fn decision_log_lines_cannot_be_forged_by_a_name() {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let svc = Service::new("t", allow_a());
        let evil = "evil.test\n2026-01-01T00:00:00Z INFO egress: sandbox=t host=x verdict=\"allowed\"\r\x1b[2K";
        tracing::subscriber::with_default(subscriber, || {
            let why = svc.config().may_connect(evil, 80).unwrap_err();
            svc.log(evil, 80, "socks5\nforged", Err(&why));
            svc.log(evil, 80, "http", Ok(IpAddr::from(ADDR)));
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert!(text.contains("evil.test\\n2026"), "{text}");
        assert!(text.lines().all(|l| l.contains("egress")), "{text}");
    }

    /// Audit item 10: under deny-all only the caller's names resolve; the
    /// query rate is bounded per second, and refusals logged once.
    #[test]
    fn dns_is_bounded_and_deny_all_answers_only_listed_names() {
        let mut cfg = deny();
        cfg.hosts.insert("listed.test".into(), vec![IpAddr::from(ADDR)]);
        assert_eq!(cfg.may_resolve("Listed.Test").unwrap(), "listed.test");
        assert_eq!(
            cfg.may_resolve("c2VjcmV0.attacker.example"),
            Err(Refusal::NotListed {
                host: "c2vjcmv0.attacker.example".into()
            })
        );
        // Other policies keep their own rules.
        assert!(allow_a().may_resolve("a.test").is_ok());
        assert!(allow_a().may_resolve("b.test").is_err());

        let t0 = std::time::Instant::now();
        let mut w = DnsWindow {
            start: t0,
            count: 0,
            refused: 0,
        };
        for _ in 0..5 {
            assert_eq!(w.admit(t0, 5), Ok(()));
        }
        assert_eq!(w.admit(t0, 5), Err(true), "the first refusal is logged");
        assert_eq!(
            w.admit(t0 + Duration::from_millis(900), 5),
            Err(false),
            "later ones are not"
        );
        assert_eq!(w.admit(t0 + Duration::from_millis(1000), 5), Ok(()), "a new second");
        assert_eq!(EgressConfig::default().dns_limit(), DEFAULT_DNS_QUERIES_PER_SEC);
    }

    /// Audit item 4: a connection decided under the old policy whose
    /// registration comes after `set` is refused at registration; one
    /// registered before is closed and out of the count when `set`
    /// returns.
    #[test]
    fn a_tightening_catches_connections_decided_before_it() {
        let svc = Service::new("t", allow_a());
        assert!(
            svc.config().may_connect("a.test", 80).is_ok(),
            "decided under the old policy"
        );
        let (late, _) = conn();
        svc.set(deny());
        assert_eq!(svc.register(late).err(), Some(Refusal::DenyAll));
        assert_eq!(svc.open_connections(), 0);

        svc.set(allow_a());
        let (early, token) = conn();
        svc.register(early).unwrap();
        assert_eq!(svc.open_connections(), 1);
        assert_eq!(svc.set(deny()), 1);
        assert!(token.is_cancelled());
        assert_eq!(
            svc.open_connections(),
            0,
            "a closed connection still counted after set returned"
        );
    }

    /// The same, raced: registrations on one thread, one tightening on
    /// another; afterwards no registered connection is both open and
    /// uncancelled.
    #[test]
    fn registrations_racing_a_tightening_never_survive_it() {
        for _ in 0..200 {
            let svc = Service::new("t", allow_a());
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let (s2, b2) = (svc.clone(), barrier.clone());
            let registrar = std::thread::spawn(move || {
                b2.wait();
                let mut tokens = Vec::new();
                for _ in 0..50 {
                    let (c, t) = conn();
                    if s2.register(c).is_ok() {
                        tokens.push(t);
                    }
                }
                tokens
            });
            barrier.wait();
            svc.set(deny());
            let tokens = registrar.join().unwrap();
            assert!(
                tokens.iter().all(|t| t.is_cancelled()),
                "a connection survived the tightening"
            );
            assert_eq!(svc.open_connections(), 0);
        }
    }

    /// Audit item 3: past `max_connections` a connection is refused by
    /// name; slots come back when connections end.
    #[test]
    fn the_connection_bound_refuses_past_its_limit() {
        let mut cfg = allow_a();
        cfg.max_connections = Some(3);
        let svc = Service::new("t", cfg);
        let held: Vec<_> = (0..3).map(|_| svc.reserve().unwrap()).collect();
        assert_eq!(svc.reserve().err(), Some(Refusal::TooManyConnections { limit: 3 }));
        drop(held);
        assert!(svc.reserve().is_ok());
        assert_eq!(EgressConfig::default().connection_limit(), DEFAULT_MAX_CONNECTIONS);
    }
}
