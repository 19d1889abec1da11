//! Listening, link authentication and shutdown.
//!
//! Every accepted byte stream must present the bind token in the preface
//! within `preface_timeout_ms`, reading at most `HEADER_LEN +
//! max_token_bytes` bytes, before it is handed to the HTTP/2 server; anything
//! else is dropped. Where the agent was given link TLS
//! ([`AgentConfig::tls`]), every TCP stream first completes a mutual TLS
//! handshake ([`namzu_proto::link_tls`]) inside the same deadline, and the
//! preface travels inside it: no client certificate of the link CA, no
//! link, whatever token is offered. On SIGTERM the agent stops accepting, quiesces the
//! sandbox (SIGTERM, `shutdown_grace_ms`, SIGKILL), flushes the workspace,
//! and exits 0, all within `agent_shutdown_deadline_ms`.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use namzu_proto::v1::agent_server::AgentServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::server::Connected;

use crate::config::{AgentConfig, Limits};
use crate::exec::Execs;
use crate::jail::Jail;
use crate::reaper::Reaper;
use crate::service::AgentService;

/// Where the agent serves.
#[derive(Debug, Clone)]
pub enum Listen {
    /// A unix socket path, created mode 0600 (a stale file is replaced).
    Unix(PathBuf),
    Tcp(SocketAddr),
    /// An already connected stream socket inherited from the parent; the
    /// agent serves that one link and exits when it closes.
    Fd(RawFd),
    /// A virtio-serial port the agent already holds open on this fd (a
    /// microVM guest's init opened it): every host link is a stream
    /// multiplexed on it (`namzu_proto::mux`); with the VM's control port
    /// on a second fd, each host starts its own session
    /// ([`crate::port_session`]).
    PortFd(RawFd, Option<RawFd>),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Self::Unix(p.into()));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            return a
                .parse()
                .map(Self::Tcp)
                .map_err(|e| format!("bad tcp address {a:?}: {e}"));
        }
        if let Some(fd) = s.strip_prefix("fd:") {
            return fd.parse().map(Self::Fd).map_err(|e| format!("bad fd {fd:?}: {e}"));
        }
        if let Some(fds) = s.strip_prefix("portfd:") {
            let fd = |f: &str| f.parse::<RawFd>().map_err(|e| format!("bad fd {f:?}: {e}"));
            return match fds.split_once(',') {
                Some((link, ctl)) => Ok(Self::PortFd(fd(link)?, Some(fd(ctl)?))),
                None => Ok(Self::PortFd(fd(fds)?, None)),
            };
        }
        Err(format!(
            "listen address {s:?} must start with unix:, tcp:, fd: or portfd: (portfd:LINK[,CONTROL])"
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {what}: {source}")]
    Listen { what: String, source: std::io::Error },
    #[error("cannot open root {path}: {source}")]
    Root { path: PathBuf, source: std::io::Error },
    #[error("cannot start the reaper: {0}")]
    Reaper(std::io::Error),
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

trait Io: AsyncRead + AsyncWrite + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + 'static> Io for T {}

/// An authenticated link. Dropping it (the HTTP/2 connection ended) fires
/// `closed`, which ends an inherited-fd agent.
pub struct Conn {
    io: Pin<Box<dyn Io>>,
    closed: Option<oneshot::Sender<()>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(tx) = self.closed.take() {
            let _ = tx.send(());
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }
}

/// Admission of fresh streams: at most `max_pending_links` in their preface
/// at once, each bounded in bytes and time; authenticated links are queued
/// for the HTTP/2 server.
#[derive(Clone)]
struct Gate {
    /// Mutual TLS before the preface (TCP links of an agent given TLS).
    tls: Option<tokio_rustls::TlsAcceptor>,
    token: crate::token::Token,
    max_token: usize,
    deadline: Duration,
    pending: Arc<tokio::sync::Semaphore>,
    links: mpsc::Sender<std::io::Result<Conn>>,
    /// Answers a hello preface: what Health would say.
    service: Arc<AgentService>,
    /// Takes the streams of egress connections (the egress preface).
    egress: Arc<crate::egress::Broker>,
    /// Side reads at once (`max_side_reads`).
    side_reads: Arc<tokio::sync::Semaphore>,
    /// Side writes at once (`max_side_writes`).
    side_writes: Arc<tokio::sync::Semaphore>,
}

impl Gate {
    fn admit<S>(&self, s: S, closed: Option<oneshot::Sender<()>>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.pending.clone().try_acquire_owned() else {
            tracing::warn!("link refused: too many connections in their preface (max_pending_links)");
            return;
        };
        let me = self.clone();
        tokio::spawn(async move {
            let admitted = async {
                use namzu_proto::preface::{self, Offer};
                // Kept as it came where there is no TLS, so an egress
                // stream on a unix socket can be spliced.
                let mut io = match &me.tls {
                    Some(tls) => Peer::<S>::Boxed(Box::pin(tls.accept(s).await.map_err(|e| format!("TLS: {e}"))?)),
                    None => Peer::Plain(s),
                };
                let offer = preface::read_offer(&mut io, &me.token.get(), me.max_token)
                    .await
                    .map_err(|e| e.to_string())?;
                let hello = match offer {
                    Offer::Hello { flags } => {
                        let probe = flags & preface::HELLO_PROBE_CHILD != 0;
                        let h = me
                            .service
                            .health_response(probe)
                            .await
                            .map_err(|s| s.message().to_owned())?;
                        Some(prost::Message::encode_to_vec(&h))
                    }
                    Offer::Plain
                    | Offer::Egress { .. }
                    | Offer::Read { .. }
                    | Offer::Write { .. }
                    | Offer::Exec { .. } => None,
                };
                // A command's acceptance leaves with its first frame.
                if !matches!(offer, Offer::Exec { .. }) {
                    preface::answer(&mut io, hello.as_deref())
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>((io, offer))
            };
            let outcome = tokio::time::timeout(me.deadline, admitted).await;
            drop(permit);
            match outcome {
                Ok(Ok((io, namzu_proto::preface::Offer::Egress { ask, handoff }))) => {
                    if !me.egress.attach_stream(ask, io.into_splice(handoff)) {
                        tracing::warn!(ask, "egress stream for an ask that no longer waits: closed");
                    }
                }
                Ok(Ok((io, namzu_proto::preface::Offer::Read { request }))) => {
                    let peer = io.into_unix().map_err(|b| b as Pin<Box<dyn AsyncWrite + Send>>);
                    crate::side_read::serve(me.service.clone(), me.side_reads.clone(), peer, request).await;
                }
                Ok(Ok((io, namzu_proto::preface::Offer::Write { request }))) => {
                    let peer = io.into_unix().map_err(|b| b as Pin<Box<dyn AsyncWrite + Send>>);
                    crate::side_write::serve(me.service.clone(), me.side_writes.clone(), peer, request).await;
                }
                Ok(Ok((io, namzu_proto::preface::Offer::Exec { request }))) => {
                    let peer = io.into_unix().map_err(|b| b as Pin<Box<dyn AsyncWrite + Send>>);
                    crate::side_exec::serve(me.service.clone(), peer, request).await;
                }
                Ok(Ok((io, _))) => {
                    let _ = me.links.send(Ok(Conn { io: io.boxed(), closed })).await;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "link refused"),
                Err(_) => tracing::warn!(deadline = ?me.deadline, "link refused: no preface in time"),
            }
        });
    }
}

/// A stream in its preface: as accepted, or behind TLS.
enum Peer<S> {
    Plain(S),
    Boxed(Pin<Box<dyn Io>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Peer<S> {
    fn boxed(self) -> Pin<Box<dyn Io>> {
        match self {
            Peer::Plain(s) => Box::pin(s),
            Peer::Boxed(b) => b,
        }
    }

    /// The stream as the unix socket it is, or boxed when it is not one.
    fn into_unix(self) -> Result<UnixStream, Pin<Box<dyn Io>>> {
        match self {
            Peer::Plain(s) => {
                let any: Box<dyn std::any::Any + Send> = Box::new(s);
                match any.downcast::<UnixStream>() {
                    Ok(u) => Ok(*u),
                    Err(other) => match other.downcast::<S>() {
                        Ok(s) => Err(Box::pin(*s)),
                        // Unreachable: it was an S a line above.
                        Err(_) => Err(Box::pin(tokio::io::duplex(1).0)),
                    },
                }
            }
            Peer::Boxed(b) => Err(b),
        }
    }

    /// The host's end of an egress connection: a unix socket as itself
    /// (spliced), anything else as a byte stream.
    fn into_splice(self, handoff: bool) -> crate::egress::Splice {
        match self.into_unix() {
            Ok(host) => crate::egress::Splice::Unix { host, handoff },
            Err(b) => crate::egress::Splice::Stream {
                host: Box::pin(b),
                handoff,
            },
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Peer<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Peer::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Peer::Boxed(b) => b.as_mut().poll_read(cx, buf),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Peer<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Peer::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Peer::Boxed(b) => b.as_mut().poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Peer::Plain(s) => Pin::new(s).poll_flush(cx),
            Peer::Boxed(b) => b.as_mut().poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Peer::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Peer::Boxed(b) => b.as_mut().poll_shutdown(cx),
        }
    }
}

/// The runtime the agent serves on: one thread drives every link,
/// command, pump and relay, so a wakeup never crosses to another thread
/// and an idle agent is one thread (an exec's round trip measured the same
/// as on two workers, within this machine's noise); blocking work (file
/// I/O, the side streams' sendfile and copies, quiesce) runs on a pool of
/// at most 32 threads.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(32)
        .enable_all()
        .build()
}

/// Serves until SIGTERM (or, for an inherited fd, until the link closes).
pub async fn serve(cfg: AgentConfig, listen: Listen) -> Result<(), ServeError> {
    serve_source(cfg, Source::Listen(listen)).await
}

/// Serves on a unix listener bound by someone else (the `local` launcher,
/// which binds it outside the sandbox) until SIGTERM.
pub async fn serve_listener(cfg: AgentConfig, listener: std::os::unix::net::UnixListener) -> Result<(), ServeError> {
    serve_source(cfg, Source::Inherited(listener)).await
}

/// Binds a unix socket at `path` (a stale file is replaced), mode 0600,
/// non-blocking, ready for [`serve_listener`]. Owner only: the socket is
/// the way in; the token is the lock. It is bound under a temporary name
/// and renamed into place once it listens with its final mode, so `path`
/// appearing means a dial succeeds (a waiter polling for the file never
/// meets the refused connect between bind and listen) and no one ever
/// sees it with a wider mode.
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

enum Source {
    Listen(Listen),
    Inherited(std::os::unix::net::UnixListener),
}

async fn serve_source(mut cfg: AgentConfig, source: Source) -> Result<(), ServeError> {
    let tcp = cfg.tcp.take();
    let jail = Arc::new(Jail::new(&cfg.roots).map_err(|source| ServeError::Root {
        path: cfg.roots.first().cloned().unwrap_or_default(),
        source,
    })?);
    let reaper = Reaper::start().map_err(ServeError::Reaper)?;
    let execs = Arc::new(Execs::new(cfg.limits.clone(), cfg.default_cwd.clone(), reaper));
    let limits = cfg.limits.clone();
    let token = crate::token::Token::new(cfg.token.clone());
    let cfg = Arc::new(cfg);
    let egress = Arc::new(crate::egress::Broker::new(
        crate::config::Limits::usize(cfg.limits.egress_max_pending),
        std::time::Duration::from_millis(cfg.limits.egress_decision_timeout_ms),
        crate::config::Limits::usize(cfg.limits.egress_max_head_bytes),
    ));
    if let Some(listeners) = &cfg.egress {
        crate::egress::start(egress.clone(), listeners).map_err(|source| ServeError::Listen {
            what: "egress proxy and resolver".into(),
            source,
        })?;
    }
    let service = Arc::new(AgentService::new(cfg.clone(), jail, execs.clone(), egress.clone()));
    let msg_max = Limits::usize(limits.max_message_bytes);

    let (links_tx, links_rx) = mpsc::channel(16);
    let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let main_is_tcp = matches!(source, Source::Listen(Listen::Tcp(_)));
    // A microVM's links share one virtio port, and under emulation a pong
    // can wait behind megabytes of another stream's data on a starved vCPU:
    // the silence a link tolerates there is longer.
    let keepalive = if matches!(source, Source::Listen(Listen::PortFd(..))) {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(20)
    };
    let gate = Gate {
        tls: tls.clone().filter(|_| main_is_tcp),
        token: token.clone(),
        max_token: Limits::usize(limits.max_token_bytes),
        deadline: limits.preface_timeout(),
        pending: Arc::new(tokio::sync::Semaphore::new(Limits::usize(limits.max_pending_links))),
        links: links_tx.clone(),
        service: service.clone(),
        egress: egress.clone(),
        side_reads: Arc::new(tokio::sync::Semaphore::new(Limits::usize(limits.max_side_reads))),
        side_writes: Arc::new(tokio::sync::Semaphore::new(Limits::usize(limits.max_side_writes))),
    };
    let gate_for_tcp = Gate { tls, ..gate.clone() };
    let dial_back = cfg.dial_back.clone().map(|dir| {
        let gate = gate.clone();
        let cfg = crate::dial_back::DialBack {
            dir,
            scan: Duration::from_millis(limits.dial_back_scan_ms.max(1)),
            max_hosts: Limits::usize(limits.max_dial_back_hosts),
            token: token.clone(),
            deadline: limits.preface_timeout(),
        };
        tokio::spawn(crate::dial_back::run(cfg, move |s| gate.admit(s, None)))
    });
    let (closed_tx, closed_rx) = oneshot::channel();
    let mut sigterm = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
    let mut unix_path = None;
    crate::timeline::mark("agent.serving");
    let accept_task = match source {
        Source::Inherited(l) => {
            let l = UnixListener::from_std(l).map_err(|source| ServeError::Listen {
                what: "inherited listener".into(),
                source,
            })?;
            tokio::spawn(async move {
                while let Some((s, _)) = namzu_proto::accept::next(|| l.accept(), "agent link").await {
                    gate.admit(s, None);
                }
            })
        }
        Source::Listen(Listen::Unix(path)) => {
            let l = bind_unix(&path)
                .and_then(UnixListener::from_std)
                .map_err(|source| ServeError::Listen {
                    what: path.display().to_string(),
                    source,
                })?;
            tracing::info!(path = %path.display(), "listening");
            unix_path = Some(path);
            tokio::spawn(async move {
                while let Some((s, _)) = namzu_proto::accept::next(|| l.accept(), "agent link").await {
                    gate.admit(s, None);
                }
            })
        }
        Source::Listen(Listen::Tcp(addr)) => {
            let l = TcpListener::bind(addr).await.map_err(|source| ServeError::Listen {
                what: addr.to_string(),
                source,
            })?;
            tracing::info!(addr = %l.local_addr().map_or(addr, |a| a), "listening");
            tokio::spawn(async move {
                while let Some((s, _)) = namzu_proto::accept::next(|| l.accept(), "agent link").await {
                    let _ = s.set_nodelay(true);
                    gate.admit(s, None);
                }
            })
        }
        Source::Listen(Listen::Fd(fd)) => {
            #[allow(unsafe_code)]
            // SAFETY: the parent handed us `fd` as a connected stream socket
            // for our exclusive use; nothing else in this process owns it.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            let std_stream = std::os::unix::net::UnixStream::from(owned);
            std_stream.set_nonblocking(true).map_err(|source| ServeError::Listen {
                what: format!("fd {fd}"),
                source,
            })?;
            let s = UnixStream::from_std(std_stream).map_err(|source| ServeError::Listen {
                what: format!("fd {fd}"),
                source,
            })?;
            gate.admit(s, Some(closed_tx));
            tokio::spawn(async {})
        }
        Source::Listen(Listen::PortFd(fd, ctl_fd)) => {
            let what = format!("virtio port on fd {fd}");
            let open = |fd: RawFd| {
                #[allow(unsafe_code)]
                // SAFETY: the guest's init opened the port on `fd` for the
                // agent alone; nothing else in this process owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                crate::port::Port::from_fd(owned).map_err(|source| ServeError::Listen {
                    what: format!("virtio port on fd {fd}"),
                    source,
                })
            };
            let port = open(fd)?;
            let ctl = ctl_fd.map(open).transpose()?;
            let token = token.clone();
            tracing::info!(%what, "listening");
            let mux = namzu_proto::mux::MuxLimits {
                max_streams: Limits::usize(limits.max_pending_links).max(1) * 4,
                ..Default::default()
            };
            tokio::spawn(async move {
                let ended = crate::port_session::run(port, ctl, mux, token, move |s| gate.admit(s, None)).await;
                // Nothing can reach the agent any more: only the host holds
                // the port's other end, and it never closes it while the VM runs.
                tracing::error!(?ended, "{what} closed");
            })
        }
    };
    let tcp_task = match tcp {
        Some(l) => {
            let l = l
                .try_clone()
                .and_then(TcpListener::from_std)
                .map_err(|source| ServeError::Listen {
                    what: "the TCP port".into(),
                    source,
                })?;
            tracing::info!(addr = ?l.local_addr().ok(), "listening on TCP too");
            let gate = gate_for_tcp;
            Some(tokio::spawn(async move {
                while let Some((s, _)) = namzu_proto::accept::next(|| l.accept(), "agent link").await {
                    let _ = s.set_nodelay(true);
                    gate.admit(s, None);
                }
            }))
        }
        None => None,
    };
    // The server stops when its incoming stream ends, so one sender stays
    // alive until shutdown even when nothing more will be accepted (fd mode).
    let keep_incoming_open = links_tx;
    let incoming = tokio_stream::wrappers::ReceiverStream::new(links_rx);

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let grace = limits.shutdown_grace();
    let deadline = Duration::from_millis(limits.agent_shutdown_deadline_ms);
    let flush_root = cfg.roots.first().cloned().unwrap_or_else(|| "/".into());
    let execs_for_stop = execs.clone();
    let stopper = tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
            _ = closed_rx => tracing::info!("inherited link closed: stopping"),
        }
        accept_task.abort();
        if let Some(t) = dial_back {
            t.abort();
        }
        if let Some(t) = tcp_task {
            t.abort();
        }
        drop(keep_incoming_open);
        if let Some(p) = unix_path {
            let _ = std::fs::remove_file(p);
        }
        execs_for_stop.begin_shutdown();
        // Stop everything in the sandbox (SIGTERM, the grace, SIGKILL, in
        // rounds), then make the workspace durable, all within the deadline.
        let stop = async {
            execs_for_stop.set_quiescing(true);
            match crate::quiesce::quiesce(grace).await {
                Ok((stopped, rounds)) => tracing::info!(stopped = stopped.len(), rounds, "quiesced"),
                Err(e) => tracing::error!(pid = e.pid, "quiesce: {}", e.message),
            }
            crate::terminal::kill_all().await;
            if let Err(e) = crate::quiesce::flush(&flush_root, crate::quiesce::SHUTDOWN_FLUSH_TIMEOUT).await {
                tracing::error!("flush: {}", e.message);
            }
        };
        if tokio::time::timeout(deadline, stop).await.is_err() {
            tracing::error!(?deadline, "shutdown deadline passed; exiting anyway");
        }
        let _ = stop_tx.send(());
    });

    // Windows as large as the host's: with HTTP/2's 64 KiB default, every
    // upload (file writes, egress downloads to the sandbox) would stall a
    // round trip per 64 KiB. The connection window bounds what one link
    // can leave buffered here.
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(8 << 20))
        // Larger frames from the host: fewer writes and reads per MiB, which
        // is what a syscall costs under gVisor's ptrace platform.
        .max_frame_size(Some(1 << 20))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(keepalive))
        .add_service(crate::fence::Fence::new(
            AgentServer::from_arc(service)
                .max_decoding_message_size(msg_max)
                .max_encoding_message_size(msg_max),
            {
                let execs = execs.clone();
                std::sync::Arc::new(move || execs.retiring())
            },
        ))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    // Connections get one more second to flush final answers, then we go.
    let mut server = Box::pin(server);
    tokio::select! {
        r = &mut server => r?,
        _ = async { let _ = stopper.await; tokio::time::sleep(Duration::from_secs(1)).await } => {}
    }
    Ok(())
}
