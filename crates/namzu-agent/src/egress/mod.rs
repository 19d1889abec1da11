//! Egress from inside the sandbox: a loopback HTTP CONNECT and SOCKS5
//! proxy ([`proxy`]) and a DNS resolver ([`dns`]), none of which decides
//! anything. Every connection and query becomes an [`EgressAsk`] sent to
//! the host over its `Egress` call ([`Broker`]); the host answers with a
//! verdict, or accepts a connection by opening `EgressSplice` for it, having
//! already connected. Without a host on the `Egress` call every ask is
//! refused at once: the sandbox fails closed.
//!
//! Commands find the proxy through the environment ([`proxy_env`]); a
//! program that ignores it has no route anywhere (the sandbox's network
//! namespace holds only loopback).

pub mod dns;
pub mod http1;
mod join;
pub mod proxy;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use namzu_proto::v1::{self, egress_ask, EgressAsk, EgressSpliceInput, EgressVerdict, TcpOutput};
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

/// Where the proxy and resolver listen inside the sandbox.
pub const HTTP_PROXY_PORT: u16 = 3128;
pub const SOCKS_PROXY_PORT: u16 = 1080;
pub const DNS_PORT: u16 = 53;

/// The sockets the proxy and the resolver serve, bound before the agent
/// gave up the privilege to bind port 53.
#[derive(Debug, Clone)]
pub struct Listeners {
    pub http: Arc<std::net::TcpListener>,
    pub socks: Arc<std::net::TcpListener>,
    pub dns: Arc<std::net::UdpSocket>,
}

impl Listeners {
    /// Binds all three on 127.0.0.1 at the standard ports.
    pub fn bind() -> std::io::Result<Self> {
        let tcp = |port| {
            let l = std::net::TcpListener::bind(("127.0.0.1", port))?;
            l.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(Arc::new(l))
        };
        let dns = std::net::UdpSocket::bind(("127.0.0.1", DNS_PORT))?;
        dns.set_nonblocking(true)?;
        Ok(Self {
            http: tcp(HTTP_PROXY_PORT)?,
            socks: tcp(SOCKS_PROXY_PORT)?,
            dns: Arc::new(dns),
        })
    }
}

/// What `/etc/resolv.conf` says inside a sandbox with egress.
pub const RESOLV_CONF: &[u8] = b"# namzu: every query is decided by the host\nnameserver 127.0.0.1\n";

/// Covers the boundary's `/etc/resolv.conf` (a container's names the
/// host's resolvers, unreachable from here) with [`RESOLV_CONF`]: written
/// under /run and bind-mounted read-only over it. Needs CAP_SYS_ADMIN;
/// returns what it did, for Health.
pub fn cover_resolv_conf() -> String {
    use nix::mount::{mount, MsFlags};
    let target = std::path::Path::new("/etc/resolv.conf");
    let ours = std::path::Path::new("/run/namzu-resolv.conf");
    let none: Option<&str> = None;
    let done = std::fs::write(ours, RESOLV_CONF)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            if !target.exists() {
                return Err("no /etc/resolv.conf to cover (libc then asks loopback anyway)".into());
            }
            mount(Some(ours), target, none, MsFlags::MS_BIND, none).map_err(|e| e.to_string())?;
            let ro =
                MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
            mount(none, target, none, ro, none).map_err(|e| e.to_string())
        });
    match done {
        Ok(()) => "/etc/resolv.conf: nameserver 127.0.0.1 (the agent's)".into(),
        Err(e) => format!("/etc/resolv.conf not covered: {e}"),
    }
}

/// The environment every command gets: both spellings, since tools differ
/// on which they read.
pub fn proxy_env() -> Vec<(&'static str, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PROXY_PORT}");
    let none = "localhost,127.0.0.1,::1".to_owned();
    vec![
        ("HTTP_PROXY", http.clone()),
        ("http_proxy", http.clone()),
        ("HTTPS_PROXY", http.clone()),
        ("https_proxy", http),
        ("ALL_PROXY", socks.clone()),
        ("all_proxy", socks),
        ("NO_PROXY", none.clone()),
        ("no_proxy", none),
    ]
}

/// What the host said about one ask.
pub enum Answer {
    /// Resolved (possibly to nothing).
    Addresses(Vec<IpAddr>),
    /// Connected; the two halves of the host's end.
    Spliced(Box<Splice>),
    /// The policy said no.
    Refused(String),
    /// Permitted, but the host could not do it (or no host is there).
    Failed(String),
}

/// The host's end of an accepted connection.
// Moved only boxed (`Answer::Spliced`), so the variants' sizes cost nothing.
#[allow(clippy::large_enum_variant)]
pub enum Splice {
    /// An `EgressSplice` call on the shared link: bytes from the
    /// destination, and a sender for bytes to it.
    Call {
        from_host: Streaming<EgressSpliceInput>,
        to_host: mpsc::Sender<Result<TcpOutput, Status>>,
    },
    /// A byte stream of its own (the egress form of the preface), raw;
    /// `handoff`: opened with the handoff form, which such a stream
    /// answers with the plain offer.
    Stream { host: RawStream, handoff: bool },
    /// The same on a unix socket, copied with `splice(2)`; `handoff`:
    /// opened with the handoff form, so the client's socket is offered to
    /// the host first.
    Unix {
        host: tokio::net::UnixStream,
        handoff: bool,
    },
}

/// A host stream carrying one egress connection's bytes.
pub type RawStream = std::pin::Pin<Box<dyn RawIo>>;

/// What a raw egress stream is.
pub trait RawIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send> RawIo for T {}

/// Routes asks to the host's `Egress` call and answers back to the asker.
pub struct Broker {
    next: AtomicU64,
    inner: Mutex<Inner>,
    /// `egress_max_pending`: asks waiting at once; more are refused.
    max_pending: usize,
    /// `egress_decision_timeout_ms`.
    decision_timeout: Duration,
    /// `egress_max_head_bytes`: the HTTP proxy's request head bound.
    pub max_head: usize,
    /// Asks refused because no host held the `Egress` call.
    unattended: Unattended,
}

/// Refusals made with nobody on the host's side (a `NoNetwork` sandbox
/// runs no supervisor): counted for Health, and logged at most once a
/// second, so a command asking in a loop cannot flood the agent's log.
#[derive(Default)]
struct Unattended {
    refused: AtomicU64,
    /// When the last line was written, and refusals since.
    log: Mutex<(Option<std::time::Instant>, u64)>,
}

impl Unattended {
    fn refuse(&self, what: &egress_ask::What) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.1 += 1;
        if log.0.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let dest = match what {
            egress_ask::What::Connect(c) => format!("connect {:?}:{}", c.host, c.port),
            egress_ask::What::Resolve(r) => format!("resolve {:?}", r.name),
        };
        tracing::info!(
            refused = log.1,
            last = %dest,
            "egress refused: no egress service is attached (the sandbox's policy lets nothing out)"
        );
        *log = (Some(std::time::Instant::now()), 0);
    }
}

#[derive(Default)]
struct Inner {
    /// The current `Egress` call's sender, and its generation.
    host: Option<(u64, mpsc::Sender<Result<EgressAsk, Status>>)>,
    pending: HashMap<u64, oneshot::Sender<Answer>>,
}

impl Broker {
    /// A broker holding at most `max_pending` undecided asks, each waiting
    /// at most `decision_timeout`, reading at most `max_head` bytes of a
    /// request head (the agent's `egress_*` limits).
    pub fn new(max_pending: usize, decision_timeout: Duration, max_head: usize) -> Self {
        Self {
            next: AtomicU64::new(0),
            inner: Mutex::default(),
            max_pending,
            decision_timeout,
            max_head,
            unattended: Unattended::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a new `Egress` call from the host; an older one is dropped
    /// and what it left unanswered fails.
    pub fn attach(
        self: &Arc<Self>,
        mut verdicts: Streaming<EgressVerdict>,
    ) -> mpsc::Receiver<Result<EgressAsk, Status>> {
        let (tx, rx) = mpsc::channel(64);
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        let stale: Vec<_> = {
            let mut inner = self.lock();
            inner.host = Some((generation, tx));
            inner.pending.drain().collect()
        };
        for (_, waiter) in stale {
            let _ = waiter.send(Answer::Failed("the host's egress service was replaced".into()));
        }
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(Ok(v)) = verdicts.next().await {
                me.answer(v);
            }
            let mut inner = me.lock();
            if inner.host.as_ref().is_some_and(|(g, _)| *g == generation) {
                inner.host = None;
                for (_, waiter) in inner.pending.drain() {
                    let _ = waiter.send(Answer::Failed("the host's egress service went away".into()));
                }
            }
        });
        rx
    }

    fn answer(&self, v: EgressVerdict) {
        let Some(waiter) = self.lock().pending.remove(&v.id) else {
            return;
        };
        let answer = if !v.refusal.is_empty() {
            Answer::Refused(v.refusal)
        } else if !v.error.is_empty() {
            Answer::Failed(v.error)
        } else {
            Answer::Addresses(
                v.addresses
                    .iter()
                    .filter_map(|a| match a.len() {
                        4 => <[u8; 4]>::try_from(&a[..]).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(&a[..]).ok().map(IpAddr::from),
                        _ => None,
                    })
                    .collect(),
            )
        };
        let _ = waiter.send(answer);
    }

    /// The host accepted ask `id` and opened its splice.
    pub async fn splice(
        &self,
        mut from_host: Streaming<EgressSpliceInput>,
    ) -> Result<mpsc::Receiver<Result<TcpOutput, Status>>, Status> {
        let id = match from_host.next().await {
            Some(Ok(EgressSpliceInput {
                msg: Some(v1::egress_splice_input::Msg::Accept(id)),
            })) => id,
            Some(Err(e)) => return Err(e),
            _ => return Err(Status::invalid_argument("the first splice message must be accept")),
        };
        let waiter = self
            .lock()
            .pending
            .remove(&id)
            .ok_or_else(|| Status::not_found(format!("no egress ask {id} is waiting")))?;
        let (to_host, rx) = mpsc::channel(8);
        waiter
            .send(Answer::Spliced(Box::new(Splice::Call { from_host, to_host })))
            .map_err(|_| Status::cancelled(format!("egress ask {id} gave up")))?;
        Ok(rx)
    }

    /// The host accepted ask `id` on a stream of its own: joins it to the
    /// ask's client. False when no such ask waits (answered, timed out).
    pub fn attach_stream(&self, id: u64, stream: Splice) -> bool {
        let Some(waiter) = self.lock().pending.remove(&id) else {
            return false;
        };
        waiter.send(Answer::Spliced(Box::new(stream))).is_ok()
    }

    /// Asks refused so far because no host held the `Egress` call.
    pub fn refused_unattended(&self) -> u64 {
        self.unattended.refused.load(Ordering::Relaxed)
    }

    /// Sends `what` to the host and waits for its answer.
    pub async fn ask(&self, what: egress_ask::What) -> Answer {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let host = {
            let mut inner = self.lock();
            let Some((_, host)) = inner.host.clone() else {
                drop(inner);
                self.unattended.refuse(&what);
                return Answer::Refused("no egress service is attached: nothing leaves this sandbox".into());
            };
            if inner.pending.len() >= self.max_pending {
                return Answer::Failed(format!(
                    "{} egress asks already wait for the host (egress_max_pending)",
                    self.max_pending
                ));
            }
            inner.pending.insert(id, tx);
            host
        };
        if host.send(Ok(EgressAsk { id, what: Some(what) })).await.is_err() {
            self.lock().pending.remove(&id);
            return Answer::Failed("the host's egress service went away".into());
        }
        match tokio::time::timeout(self.decision_timeout, rx).await {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => Answer::Failed("the host's egress service went away".into()),
            Err(_) => {
                self.lock().pending.remove(&id);
                Answer::Failed(format!(
                    "no answer from the host within {:?} (egress_decision_timeout_ms)",
                    self.decision_timeout
                ))
            }
        }
    }
}

/// Starts the proxy and the resolver on `listeners`.
pub fn start(broker: Arc<Broker>, listeners: &Listeners) -> std::io::Result<()> {
    let dup_tcp = |l: &std::net::TcpListener| tokio::net::TcpListener::from_std(l.try_clone()?);
    proxy::spawn_http(broker.clone(), dup_tcp(&listeners.http)?);
    proxy::spawn_socks(broker.clone(), dup_tcp(&listeners.socks)?);
    dns::spawn(broker, tokio::net::UdpSocket::from_std(listeners.dns.try_clone()?)?);
    Ok(())
}
