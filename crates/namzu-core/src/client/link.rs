//! The link itself: dialing, the authenticating preface, `Health` at
//! connect, the features the agent offers, and the checks every operation
//! makes before it sends (open, not retired, feature offered, guard). The
//! operations are the sibling modules' `impl AgentClient` blocks; the
//! imports here are `pub(super)` so they share them.

pub(super) use std::collections::HashSet;
pub(super) use std::future::Future;
pub(super) use std::io;
pub(super) use std::os::unix::ffi::OsStrExt;
pub(super) use std::path::Path;
pub(super) use std::pin::Pin;
pub(super) use std::sync::atomic::{AtomicBool, Ordering};
pub(super) use std::sync::{Arc, Mutex};
pub(super) use std::time::{Duration, SystemTime};

pub(super) use bytes::Bytes;
pub(super) use futures::{Stream, StreamExt};
pub(super) use hyper_util::rt::TokioIo;
pub(super) use namzu_proto::features as feat;
pub(super) use namzu_proto::v1::{
    self, agent_client::AgentClient as Rpc, cancel_response::Outcome, exec_input, exec_output, write_file_request,
};
pub(super) use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
pub(super) use tokio::sync::mpsc;
pub(super) use tokio_stream::wrappers::ReceiverStream;
pub(super) use tokio_util::sync::CancellationToken;
pub(super) use tonic::transport::{Channel, Endpoint, Uri};

pub(super) use crate::error::{bytes_path, Error, Result};
pub(super) use crate::types::*;

use super::boot::{agent_info, AgentRestartObserver, Boot};

/// Chunk size of uploads. Well under the message limit.
pub const WRITE_CHUNK: usize = 1 << 20;

/// Host-side options of a link.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Largest gRPC message accepted or sent (`max_message_bytes`).
    pub max_message_bytes: usize,
    /// HTTP/2 keepalive: a peer silent this long past a ping is dead.
    pub keepalive: Duration,
    /// Bound on dialing plus the preface.
    pub connect_timeout: Duration,
    /// Have the connect-time Health fork a child and report its status
    /// ([`AgentInfo::child_status`]): the privilege probe of a fresh
    /// sandbox, riding the call every connect makes anyway.
    pub probe_child: bool,
    /// The sandbox may be held still on purpose ([`LinkGuard::held`]: a VM
    /// paused whole, silent for as long as the pause lasts). The link then
    /// keeps alive by its own ping every `keepalive` instead of HTTP/2's,
    /// and drops the connection only when an unanswered ping falls outside
    /// a hold; streams count no silence during one.
    pub holdable: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            max_message_bytes: namzu_proto::DEFAULT_MAX_MESSAGE_BYTES,
            keepalive: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
            probe_child: false,
            holdable: false,
        }
    }
}

/// A byte stream an agent link can run over.
pub trait LinkStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> LinkStream for T {}

pub(super) type DialFuture = Pin<Box<dyn Future<Output = io::Result<Box<dyn LinkStreamObj>>> + Send>>;
pub(super) type Dialer = Arc<dyn Fn() -> DialFuture + Send + Sync>;
/// The token offered at each (re)dial, asked for after the dial.
pub(super) type TokenSource = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Opens a unix stream to the agent: a connect to its socket, or a standby
/// it dialed back ([`super::BackListener`]).
pub(super) type UnixDialer =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<tokio::net::UnixStream>> + Send>> + Send + Sync>;

/// What a link's dialer allows.
#[derive(Clone)]
pub(super) enum Dial {
    /// One stream only (an inherited socket, an exec's stdio): no second
    /// dial to fall back to the plain preface with, so no hello either.
    Once,
    /// Dials again as often as needed.
    Again,
    /// Dials again, cheaply enough for a stream per egress connection.
    Cheap,
    /// Unix streams: as `Cheap`, and spliced; with the socket's path where
    /// there is one to connect to directly.
    Unix(UnixDialer, Option<Arc<Path>>),
}

/// Object-safe form of [`LinkStream`], so one client type serves every
/// transport.
pub trait LinkStreamObj: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkStreamObj for T {}

pub(super) struct Inner {
    pub(super) rpc: Rpc<Channel>,
    pub(super) channel: Channel,
    pub(super) info: AgentInfo,
    pub(super) features: HashSet<String>,
    pub(super) closed: AtomicBool,
    pub(super) retired: AtomicBool,
    /// What the guard's tier did after this link's first unconfirmed
    /// cancel (told once; every such error carries it).
    pub(super) released: std::sync::OnceLock<Option<String>>,
    pub(super) sandbox_id: String,
    /// Upload chunk: [`WRITE_CHUNK`], or less if the agent's message limit
    /// is smaller.
    pub(super) write_chunk: usize,
    /// Largest message this host reads (`max_message_bytes`), on the link
    /// or framed on a stream of its own.
    pub(super) max_message_bytes: usize,
    /// The agent's heartbeat interval (`None`: it sends none, or is too
    /// old to): both ends beat at it and give up after three silent ones.
    pub(super) heartbeat: Option<Duration>,
    /// Checked before every op: a tier that can learn the sandbox is gone
    /// (a Kubernetes lease) attaches one.
    pub(super) guard: std::sync::OnceLock<Arc<dyn LinkGuard>>,
    /// How to open a stream of its own (a cheap dial and the token), for
    /// an egress connection; `None` where dials are dear or one-shot.
    pub(super) side: Option<(SideDial, TokenSource)>,
    /// The agent process it reaches ([`super::boot`]).
    pub(super) boot: Arc<Boot>,
}

/// How a link opens an egress connection's own stream.
pub(super) enum SideDial {
    /// A unix stream: spliced; the path, where a stream is a plain
    /// connect to it (see [`super::side`]).
    Unix(UnixDialer, Option<Arc<Path>>),
    /// Any other cheap dial.
    Other(Dialer),
}

/// The same token at every dial.
fn fixed_token(token: Vec<u8>) -> TokenSource {
    let token = Arc::new(token);
    Arc::new(move || token.as_ref().clone())
}

/// `dial` as a [`Dialer`] of boxed streams.
fn boxed_dialer<D, F, S>(dial: D) -> Dialer
where
    D: Fn() -> F + Send + Sync + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
    S: LinkStream,
{
    Arc::new(move || {
        let fut = dial();
        Box::pin(async move { fut.await.map(|s| Box::new(s) as Box<dyn LinkStreamObj>) })
    })
}

/// Something besides the link that can know a sandbox must no longer be
/// reached (a tier's lease on it): checked before every operation.
pub trait LinkGuard: Send + Sync {
    /// `Ok` while the sandbox may be reached; else the error every
    /// operation fails with (e.g. [`Error::SandboxGone`]).
    fn check(&self, sandbox_id: &str) -> Result<()>;

    /// Called once, when the link retires after an unconfirmed kill: what
    /// the tier does beyond the agent's own fence (a cluster gives the
    /// sandbox back, since nobody can vouch for what still runs in it),
    /// told to the caller in the error. `None`: nothing more.
    fn retire(&self, _sandbox_id: &str) -> Option<String> {
        None
    }

    /// Whether the sandbox is held still on purpose right now (a VM
    /// paused whole): every operation is refused with
    /// [`Error::SandboxPaused`], and on a link made with
    /// [`ClientOptions::holdable`] its silence is not taken for a dead
    /// peer's. Default: never.
    fn held(&self, _sandbox_id: &str) -> bool {
        false
    }
}

/// A cheap-to-clone handle on one agent link.
#[derive(Clone)]
pub struct AgentClient {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("boot_id", &self.inner.info.boot_id)
            .finish()
    }
}

impl AgentClient {
    /// Connects through `dial`, which is called again if the connection has
    /// to be re-established. `endpoint` names the peer in errors.
    pub async fn connect<D, F, S>(
        sandbox_id: &str,
        endpoint: &str,
        token: Vec<u8>,
        opts: ClientOptions,
        dial: D,
    ) -> Result<Self>
    where
        D: Fn() -> F + Send + Sync + 'static,
        F: Future<Output = io::Result<S>> + Send + 'static,
        S: LinkStream,
    {
        let token = Arc::new(token);
        Self::connect_following(sandbox_id, endpoint, opts, dial, move || token.as_ref().clone()).await
    }

    /// Connects through `dial`, offering whatever `token` returns after
    /// each (re)dial: a dialer that follows an agent which moved (a pod
    /// replaced under the same name, with a new address and a new bind
    /// token) changes both, and every later operation reaches it.
    pub async fn connect_following<D, F, S, T>(
        sandbox_id: &str,
        endpoint: &str,
        opts: ClientOptions,
        dial: D,
        token: T,
    ) -> Result<Self>
    where
        D: Fn() -> F + Send + Sync + 'static,
        F: Future<Output = io::Result<S>> + Send + 'static,
        S: LinkStream,
        T: Fn() -> Vec<u8> + Send + Sync + 'static,
    {
        Self::connect_dialer(
            sandbox_id,
            endpoint,
            Arc::new(token),
            opts,
            boxed_dialer(dial),
            Dial::Again,
        )
        .await
    }

    /// Connects over one already-open stream (an inherited socket, an exec's
    /// stdio). The link cannot be re-established once it drops.
    pub async fn connect_stream<S: LinkStream>(
        sandbox_id: &str,
        endpoint: &str,
        token: Vec<u8>,
        opts: ClientOptions,
        stream: S,
    ) -> Result<Self> {
        let slot = Arc::new(Mutex::new(Some(stream)));
        let ep = endpoint.to_owned();
        let dialer: Dialer = Arc::new(move || {
            let taken = slot.lock().ok().and_then(|mut s| s.take());
            let ep = ep.clone();
            Box::pin(async move {
                taken.map(|s| Box::new(s) as Box<dyn LinkStreamObj>).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotConnected,
                        format!("the one-shot link to {ep} is gone"),
                    )
                })
            })
        });
        let token = Arc::new(token);
        Self::connect_dialer(
            sandbox_id,
            endpoint,
            Arc::new(move || token.as_ref().clone()),
            opts,
            dialer,
            Dial::Once,
        )
        .await
    }

    /// Connects to an agent's unix socket.
    pub async fn connect_unix(sandbox_id: &str, path: &Path, token: Vec<u8>, opts: ClientOptions) -> Result<Self> {
        let p = path.to_path_buf();
        let dial: UnixDialer = Arc::new(move || Box::pin(tokio::net::UnixStream::connect(p.clone())));
        let at: Arc<Path> = path.into();
        Self::connect_unix_dialer(sandbox_id, &path.display().to_string(), token, opts, dial, Some(at)).await
    }

    /// Connects to an agent that dials this host back, through `listener`
    /// (see [`super::BackListener`]); every later stream (relinks, egress,
    /// reads) is a standby it dialed.
    pub async fn connect_back(
        sandbox_id: &str,
        listener: Arc<super::BackListener>,
        token: Vec<u8>,
        opts: ClientOptions,
    ) -> Result<Self> {
        let endpoint = format!("{} (dialed back)", listener.path().display());
        let dial: UnixDialer = Arc::new(move || {
            let l = listener.clone();
            Box::pin(async move { l.dial().await })
        });
        Self::connect_unix_dialer(sandbox_id, &endpoint, token, opts, dial, None).await
    }

    async fn connect_unix_dialer(
        sandbox_id: &str,
        endpoint: &str,
        token: Vec<u8>,
        opts: ClientOptions,
        dial: UnixDialer,
        path: Option<Arc<Path>>,
    ) -> Result<Self> {
        let d = dial.clone();
        // A dial cheap enough to make per egress connection: the link may
        // open byte streams of their own for them.
        Self::connect_dialer(
            sandbox_id,
            endpoint,
            fixed_token(token),
            opts,
            boxed_dialer(move || d()),
            Dial::Unix(dial, path),
        )
        .await
    }

    /// Connects to an agent over TCP.
    pub async fn connect_tcp(
        sandbox_id: &str,
        addr: std::net::SocketAddr,
        token: Vec<u8>,
        opts: ClientOptions,
    ) -> Result<Self> {
        Self::connect_dialer(
            sandbox_id,
            &addr.to_string(),
            fixed_token(token),
            opts,
            boxed_dialer(move || async move {
                let s = tokio::net::TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                Ok(s)
            }),
            Dial::Cheap,
        )
        .await
    }

    pub(super) async fn connect_dialer(
        sandbox_id: &str,
        endpoint: &str,
        token: TokenSource,
        opts: ClientOptions,
        dialer: Dialer,
        how: Dial,
    ) -> Result<Self> {
        let hello = !matches!(how, Dial::Once);
        let side = match &how {
            Dial::Cheap => Some((SideDial::Other(dialer.clone()), token.clone())),
            Dial::Unix(dial, path) => Some((SideDial::Unix(dial.clone(), path.clone()), token.clone())),
            Dial::Once | Dial::Again => None,
        };
        use namzu_proto::preface::{self, PrefaceError};
        let dial = || async {
            dialer().await.map_err(|source| Error::Connect {
                endpoint: endpoint.into(),
                source,
            })
        };
        let refused = |source| Error::Preface {
            endpoint: endpoint.into(),
            source,
        };
        // The first link is dialed here, not inside tonic, so a refused
        // preface or a dead socket comes back as a typed error. Its preface
        // asks for the agent's hello, which says what Health would, so
        // connecting costs one round trip; an agent that predates the
        // hello refuses it, and is dialed again with the plain preface.
        let first = tokio::time::timeout(opts.connect_timeout, async {
            let mut s = dial().await?;
            crate::timeline::mark("link.dialed");
            if hello {
                let flags = if opts.probe_child {
                    preface::HELLO_PROBE_CHILD
                } else {
                    0
                };
                match preface::offer_hello(&mut s, &token(), flags).await {
                    Ok(h) => {
                        crate::timeline::mark("link.hello");
                        return Ok::<_, Error>((s, Some(h)));
                    }
                    Err(PrefaceError::Refused) => s = dial().await?,
                    Err(source) => return Err(refused(source)),
                }
            }
            preface::offer(&mut s, &token()).await.map_err(refused)?;
            crate::timeline::mark("link.preface-accepted");
            Ok::<_, Error>((s, None))
        })
        .await
        .map_err(|_| Error::Connect {
            endpoint: endpoint.into(),
            source: io::Error::new(io::ErrorKind::TimedOut, "connect and preface timed out"),
        })??;
        let (first, hello) = first;
        let first = Arc::new(Mutex::new(Some(first)));
        let boot = Arc::new(Boot::default());
        let (redial_boot, sid, ask_hello) = (boot.clone(), sandbox_id.to_owned(), !matches!(how, Dial::Once));
        let cutter = opts.holdable.then(super::keepalive::Cutter::default);
        let cut = cutter.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let first = first.lock().ok().and_then(|mut f| f.take());
            let (dialer, token, boot, sid) = (dialer.clone(), token.clone(), redial_boot.clone(), sid.clone());
            let cut = cut.clone();
            async move {
                let s = match first {
                    Some(s) => s,
                    None => redial(&dialer, &token, ask_hello.then_some((&*boot, sid.as_str()))).await?,
                };
                let s: Box<dyn LinkStreamObj> = match cut {
                    Some(cut) => Box::new(cut.wrap(s)),
                    None => s,
                };
                Ok::<_, io::Error>(TokioIo::new(s))
            }
        });
        // The URI is never resolved: the connector above supplies the stream.
        let endpoint_cfg = Endpoint::from_static("http://namzu-agent");
        // A holdable link pings by itself (`super::keepalive`).
        let endpoint_cfg = match opts.holdable {
            true => endpoint_cfg,
            false => endpoint_cfg
                .http2_keep_alive_interval(opts.keepalive)
                .keep_alive_timeout(opts.keepalive)
                .keep_alive_while_idle(true),
        }
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(8 << 20));
        let (channel, h) = match hello {
            // HTTP/2 starts with the first call: its preface and SETTINGS
            // travel with that call's frames instead of a round trip ahead.
            Some(bytes) => {
                let h = <v1::HealthResponse as prost::Message>::decode(&bytes[..]).map_err(|e| Error::Protocol {
                    op: "connect".into(),
                    message: format!("the agent's hello does not decode: {e}"),
                })?;
                (endpoint_cfg.connect_with_connector_lazy(connector), h)
            }
            None => {
                let channel = endpoint_cfg
                    .connect_with_connector(connector)
                    .await
                    .map_err(|e| Error::Connect {
                        endpoint: endpoint.into(),
                        source: io::Error::other(e),
                    })?;
                crate::timeline::mark("link.http2-up");
                let h = Rpc::new(channel.clone())
                    .max_decoding_message_size(opts.max_message_bytes)
                    .health(v1::HealthRequest {
                        probe_child: opts.probe_child,
                    })
                    .await
                    .map_err(|s| Error::from_status("health", s))?
                    .into_inner();
                crate::timeline::mark("link.health");
                (channel, h)
            }
        };
        let rpc = Rpc::new(channel.clone())
            .max_decoding_message_size(opts.max_message_bytes)
            .max_encoding_message_size(opts.max_message_bytes);
        if h.protocol_version != namzu_proto::PROTOCOL_VERSION {
            return Err(Error::ProtocolVersion {
                agent: h.protocol_version,
                host: namzu_proto::PROTOCOL_VERSION,
            });
        }
        let info = agent_info(h);
        boot.saw(sandbox_id, &info.boot_id);
        let agent_max = info
            .limits
            .iter()
            .find(|(n, _)| n == namzu_proto::limits::MAX_MESSAGE_BYTES)
            .map_or(opts.max_message_bytes, |(_, v)| {
                usize::try_from(*v).unwrap_or(usize::MAX)
            });
        let heartbeat = info
            .limits
            .iter()
            .find(|(n, _)| n == namzu_proto::limits::HEARTBEAT_INTERVAL_MS)
            .and_then(|(_, v)| (*v > 0).then(|| Duration::from_millis(*v)));
        // Room for the message's own framing and fields.
        let write_chunk = WRITE_CHUNK
            .min(agent_max.min(opts.max_message_bytes).saturating_sub(1024))
            .max(1);
        let client = Self {
            inner: Arc::new(Inner {
                rpc,
                channel,
                features: info.features.iter().cloned().collect(),
                retired: AtomicBool::new(info.retiring),
                released: std::sync::OnceLock::new(),
                info,
                closed: AtomicBool::new(false),
                sandbox_id: sandbox_id.into(),
                write_chunk,
                max_message_bytes: opts.max_message_bytes,
                heartbeat,
                guard: std::sync::OnceLock::new(),
                side,
                boot,
            }),
        };
        if let Some(cutter) = cutter {
            super::keepalive::spawn(Arc::downgrade(&client.inner), opts.keepalive, cutter);
        }
        Ok(client)
    }

    /// What the agent said at connect time.
    pub fn info(&self) -> &AgentInfo {
        &self.inner.info
    }

    /// The id of the sandbox this link reaches.
    pub fn sandbox_id(&self) -> &str {
        &self.inner.sandbox_id
    }

    /// A fresh Health call (RSS, retiring state).
    pub async fn health(&self) -> Result<AgentInfo> {
        self.open("health")?;
        let h = self
            .rpc()
            .health(v1::HealthRequest { probe_child: false })
            .await
            .map_err(|s| Error::from_status("health", s))?
            .into_inner();
        self.answered_by(&h.boot_id);
        Ok(agent_info(h))
    }

    /// The underlying HTTP/2 channel, for protocol-level tests.
    #[doc(hidden)]
    pub fn raw_channel(&self) -> Channel {
        self.inner.channel.clone()
    }

    /// `/proc/self/status` of a freshly forked agent child: the privileges
    /// every command starts with.
    pub async fn probe_child_status(&self) -> Result<String> {
        self.open("health")?;
        let h = self
            .rpc()
            .health(v1::HealthRequest { probe_child: true })
            .await
            .map_err(|s| Error::from_status("health", s))?;
        Ok(h.into_inner().child_status)
    }

    /// Marks the link unusable: every later op fails with
    /// [`Error::SandboxDestroyed`].
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    /// The agent fenced itself after an unconfirmed kill: it serves nothing but health.
    pub fn is_retired(&self) -> bool {
        self.inner.retired.load(Ordering::SeqCst)
    }

    pub(super) fn rpc(&self) -> Rpc<Channel> {
        self.inner.rpc.clone()
    }

    /// Attaches a guard checked before every op (e.g. a lease that fails
    /// ops with [`Error::SandboxGone`] once the object behind the sandbox
    /// is gone). Set once; later calls are ignored.
    pub fn guard_with(&self, guard: Arc<dyn LinkGuard>) {
        let _ = self.inner.guard.set(guard);
    }

    /// The generated gRPC client, for a host service's own calls (the
    /// egress supervisor's): checks first, as every op does, that the link
    /// is open and the agent offers `feature`. Map failures with
    /// [`Self::status_error`].
    pub fn rpc_for(&self, op: &str, feature: &str) -> Result<Rpc<Channel>> {
        self.require(op, feature)?;
        Ok(self.rpc())
    }

    /// The typed error of a failed call made through [`Self::rpc_for`].
    pub fn status_error(&self, op: &str, s: tonic::Status) -> Error {
        self.status(op, s)
    }

    pub(super) fn open(&self, _op: &str) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::SandboxDestroyed {
                id: self.inner.sandbox_id.clone(),
            });
        }
        match self.inner.guard.get() {
            Some(g) => {
                g.check(&self.inner.sandbox_id)?;
                if g.held(&self.inner.sandbox_id) {
                    return Err(Error::SandboxPaused { op: _op.into() });
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Checks the link is usable and the agent offers `feature` for `op`.
    pub(super) fn require(&self, op: &str, feature: &str) -> Result<()> {
        self.open(op)?;
        if self.is_retired() {
            return Err(Error::AgentRetiring { op: op.into() });
        }
        if !self.inner.features.contains(feature) {
            return Err(Error::Unsupported {
                op: op.into(),
                feature: feature.into(),
            });
        }
        Ok(())
    }

    pub(super) fn status(&self, op: &str, s: tonic::Status) -> Error {
        let e = Error::from_status(op, s);
        if matches!(e, Error::RemoteCancellationUnknown { .. } | Error::AgentRetiring { .. }) {
            return self.retire(e);
        }
        e
    }

    /// Retires the link (the agent fenced itself, or will). An unconfirmed
    /// cancel on this link also tells the guard's tier — once, however
    /// many paths (the cancel, the output stream) report it — and carries
    /// what it did; an agent found already fenced is only refused.
    pub(super) fn retire(&self, mut e: Error) -> Error {
        self.inner.retired.store(true, Ordering::SeqCst);
        if let Error::RemoteCancellationUnknown { retirement, .. } = &mut e {
            *retirement = self
                .inner
                .released
                .get_or_init(|| self.inner.guard.get().and_then(|g| g.retire(&self.inner.sandbox_id)))
                .clone();
        }
        e
    }
}

/// A re-dial of the link, past its preface. With `boot`, the preface asks
/// for the agent's hello, whose boot id says whether the agent restarted
/// since the link last reached it; an agent that predates the hello is
/// dialed again with the plain preface.
async fn redial(
    dialer: &Dialer,
    token: &TokenSource,
    boot: Option<(&Boot, &str)>,
) -> io::Result<Box<dyn LinkStreamObj>> {
    use namzu_proto::preface::{self, PrefaceError};
    let denied = |e: PrefaceError| io::Error::new(io::ErrorKind::PermissionDenied, e);
    let mut s = dialer().await?;
    if let Some((boot, sandbox_id)) = boot {
        match preface::offer_hello(&mut s, &token(), 0).await {
            Ok(bytes) => {
                if let Ok(h) = <v1::HealthResponse as prost::Message>::decode(&bytes[..]) {
                    boot.saw(sandbox_id, &h.boot_id);
                }
                return Ok(s);
            }
            Err(PrefaceError::Refused) => s = dialer().await?,
            Err(e) => return Err(denied(e)),
        }
    }
    preface::offer(&mut s, &token()).await.map_err(denied)?;
    Ok(s)
}

impl AgentClient {
    /// The boot id of the agent this link reached last: at connect
    /// [`AgentInfo::boot_id`], then whatever a re-dial or a result said.
    pub fn boot_id(&self) -> String {
        self.inner.boot.current()
    }

    /// Adds an observer told of every agent restart this link finds (a
    /// re-dial or a result naming another boot id).
    pub fn on_agent_restart(&self, observer: AgentRestartObserver) {
        self.inner.boot.observe(observer);
    }

    /// Records the boot id a result carried; the id of the agent that
    /// answered.
    pub(super) fn answered_by(&self, id: &str) -> String {
        self.inner.boot.saw(&self.inner.sandbox_id, id)
    }
}

/// Sends `beat()` on `tx` every `every` until its receiver is gone: the
/// host's heartbeats on one streaming call.
pub(super) fn beat_every<T: Send + 'static>(
    tx: mpsc::Sender<T>,
    every: Duration,
    beat: fn() -> T,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if tx.send(beat()).await.is_err() {
                return;
            }
        }
    })
}

pub(super) fn path_bytes(p: &Path) -> Bytes {
    Bytes::copy_from_slice(p.as_os_str().as_bytes())
}

/// A file streamed in chunks.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;

/// Changes under a watched directory, streamed.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<crate::types::WatchEvent>> + Send>>;

/// Entries of a walk, streamed.
pub type FileInfoStream = Pin<Box<dyn Stream<Item = Result<FileInfo>> + Send>>;
