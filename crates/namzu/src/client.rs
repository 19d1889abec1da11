//! `AgentClient`: the host's end of one link to an agent.
//!
//! It owns one HTTP/2 connection, carried over whatever byte stream a dialer
//! produces (unix socket, TCP, an inherited socket, later vsock or an exec's
//! stdio). Each new stream is authenticated with the preface before HTTP/2
//! starts. The client reads `Health` once at connect and refuses, with
//! [`Error::Unsupported`], any op whose feature the agent did not advertise —
//! before sending anything.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use hyper_util::rt::TokioIo;
use namzu_proto::features as feat;
use namzu_proto::v1::{
    self, agent_client::AgentClient as Rpc, cancel_response::Outcome, exec_input, exec_output, write_file_request,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{bytes_path, Error, Result};
use crate::types::*;

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
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            max_message_bytes: namzu_proto::DEFAULT_MAX_MESSAGE_BYTES,
            keepalive: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A byte stream an agent link can run over.
pub trait LinkStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> LinkStream for T {}

type DialFuture = Pin<Box<dyn Future<Output = io::Result<Box<dyn LinkStreamObj>>> + Send>>;
type Dialer = Arc<dyn Fn() -> DialFuture + Send + Sync>;

/// Object-safe form of [`LinkStream`], so one client type serves every
/// transport.
pub trait LinkStreamObj: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> LinkStreamObj for T {}

struct Inner {
    rpc: Rpc<Channel>,
    channel: Channel,
    info: AgentInfo,
    features: HashSet<String>,
    closed: AtomicBool,
    retired: AtomicBool,
    sandbox_id: String,
    /// Upload chunk: [`WRITE_CHUNK`], or less if the agent's message limit
    /// is smaller.
    write_chunk: usize,
    /// The agent's heartbeat interval (`None`: it sends none, or is too
    /// old to): both ends beat at it and give up after three silent ones.
    heartbeat: Option<Duration>,
    /// Set by the owner of a lease on the sandbox (the `kubernetes` tier)
    /// once the object behind it is gone: every later op is
    /// [`Error::SandboxGone`].
    gone: std::sync::OnceLock<Arc<AtomicBool>>,
}

/// A cheap-to-clone handle on one agent link.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
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
        let dial = Arc::new(dial);
        let dialer: Dialer = Arc::new(move || {
            let fut = dial();
            Box::pin(async move { fut.await.map(|s| Box::new(s) as Box<dyn LinkStreamObj>) })
        });
        Self::connect_dialer(sandbox_id, endpoint, token, opts, dialer).await
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
        Self::connect_dialer(sandbox_id, endpoint, token, opts, dialer).await
    }

    /// Connects to an agent's unix socket.
    pub async fn connect_unix(sandbox_id: &str, path: &Path, token: Vec<u8>, opts: ClientOptions) -> Result<Self> {
        let p = path.to_path_buf();
        Self::connect(sandbox_id, &path.display().to_string(), token, opts, move || {
            tokio::net::UnixStream::connect(p.clone())
        })
        .await
    }

    /// Connects to an agent over TCP.
    pub async fn connect_tcp(
        sandbox_id: &str,
        addr: std::net::SocketAddr,
        token: Vec<u8>,
        opts: ClientOptions,
    ) -> Result<Self> {
        Self::connect(sandbox_id, &addr.to_string(), token, opts, move || async move {
            let s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(s)
        })
        .await
    }

    async fn connect_dialer(
        sandbox_id: &str,
        endpoint: &str,
        token: Vec<u8>,
        opts: ClientOptions,
        dialer: Dialer,
    ) -> Result<Self> {
        let token = Arc::new(token);
        // The first link is dialed here, not inside tonic, so a refused
        // preface or a dead socket comes back as a typed error.
        let first = tokio::time::timeout(opts.connect_timeout, async {
            let mut s = dialer().await.map_err(|source| Error::Connect {
                endpoint: endpoint.into(),
                source,
            })?;
            namzu_proto::preface::offer(&mut s, &token)
                .await
                .map_err(|source| Error::Preface {
                    endpoint: endpoint.into(),
                    source,
                })?;
            Ok::<_, Error>(s)
        })
        .await
        .map_err(|_| Error::Connect {
            endpoint: endpoint.into(),
            source: io::Error::new(io::ErrorKind::TimedOut, "connect and preface timed out"),
        })??;
        let first = Arc::new(Mutex::new(Some(first)));
        let connector = tower::service_fn(move |_: Uri| {
            let first = first.lock().ok().and_then(|mut f| f.take());
            let dialer = dialer.clone();
            let token = token.clone();
            async move {
                let s = match first {
                    Some(s) => s,
                    None => {
                        let mut s = dialer().await?;
                        namzu_proto::preface::offer(&mut s, &token)
                            .await
                            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
                        s
                    }
                };
                Ok::<_, io::Error>(TokioIo::new(s))
            }
        });
        // The URI is never resolved: the connector above supplies the stream.
        let channel = Endpoint::from_static("http://namzu-agent")
            .http2_keep_alive_interval(opts.keepalive)
            .keep_alive_timeout(opts.keepalive)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(8 << 20))
            .connect_with_connector(connector)
            .await
            .map_err(|e| Error::Connect {
                endpoint: endpoint.into(),
                source: io::Error::other(e),
            })?;
        let mut rpc = Rpc::new(channel.clone())
            .max_decoding_message_size(opts.max_message_bytes)
            .max_encoding_message_size(opts.max_message_bytes);
        let h = rpc
            .health(v1::HealthRequest { probe_child: false })
            .await
            .map_err(|s| Error::from_status("health", s))?
            .into_inner();
        if h.protocol_version != namzu_proto::PROTOCOL_VERSION {
            return Err(Error::ProtocolVersion {
                agent: h.protocol_version,
                host: namzu_proto::PROTOCOL_VERSION,
            });
        }
        let info = agent_info(h);
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
        Ok(Self {
            inner: Arc::new(Inner {
                rpc,
                channel,
                features: info.features.iter().cloned().collect(),
                retired: AtomicBool::new(info.retiring),
                info,
                closed: AtomicBool::new(false),
                sandbox_id: sandbox_id.into(),
                write_chunk,
                heartbeat,
                gone: std::sync::OnceLock::new(),
            }),
        })
    }

    /// What the agent said at connect time.
    pub fn info(&self) -> &AgentInfo {
        &self.inner.info
    }

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
            .map_err(|s| Error::from_status("health", s))?;
        Ok(agent_info(h.into_inner()))
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

    pub fn is_retired(&self) -> bool {
        self.inner.retired.load(Ordering::SeqCst)
    }

    fn rpc(&self) -> Rpc<Channel> {
        self.inner.rpc.clone()
    }

    /// Ties the link to a lease: once `gone` is set, every op fails with
    /// [`Error::SandboxGone`] instead of reaching for an agent that no
    /// longer exists. Set once; later calls are ignored.
    pub fn watch_lease(&self, gone: Arc<AtomicBool>) {
        let _ = self.inner.gone.set(gone);
    }

    fn open(&self, _op: &str) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::SandboxDestroyed {
                id: self.inner.sandbox_id.clone(),
            });
        }
        if self.inner.gone.get().is_some_and(|g| g.load(Ordering::SeqCst)) {
            return Err(Error::SandboxGone {
                id: self.inner.sandbox_id.clone(),
            });
        }
        Ok(())
    }

    /// Checks the link is usable and the agent offers `feature` for `op`.
    fn require(&self, op: &str, feature: &str) -> Result<()> {
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

    fn status(&self, op: &str, s: tonic::Status) -> Error {
        let e = Error::from_status(op, s);
        if matches!(e, Error::RemoteCancellationUnknown { .. } | Error::AgentRetiring { .. }) {
            self.inner.retired.store(true, Ordering::SeqCst);
        }
        e
    }

    // ------------------------------------------------------------ exec --

    /// Runs a command and collects its output.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        let stream = self.exec_stream(req).await?;
        collect(stream, "exec").await
    }

    /// Starts a command and streams its output. The id is reserved first, so
    /// a cancel that races the start is never lost.
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream> {
        const OP: &str = "exec";
        if req.detach.is_some() {
            return self.exec_detached(req).await;
        }
        self.require(OP, feat::EXEC)?;
        if matches!(req.stdin, Stdin::Stream(_)) {
            self.require(OP, feat::EXEC_STDIN_STREAM)?;
        }
        if req.cancel.is_some() {
            self.require(OP, feat::EXEC_CANCEL)?;
        }
        let cancel = req.cancel.clone();
        let (mut start, stdin_stream) = exec_start(req);
        start.host_heartbeats = self.inner.heartbeat.is_some();
        // With a cancel token the id is reserved first, so a cancel racing
        // the start is never lost; without one, the agent reserves it and
        // names it in `Started`, saving a round trip.
        let mut exec_id = String::new();
        if cancel.is_some() {
            exec_id = self
                .rpc()
                .reserve_exec(v1::ReserveExecRequest::default())
                .await
                .map_err(|s| self.status("reserve_exec", s))?
                .into_inner()
                .exec_id;
            start.exec_id = exec_id.clone();
        }

        // From here a cancel is answered by the agent even before the start.
        // A token cancelled already is sent first, so the start is answered
        // "cancelled" without ever spawning the command.
        if cancel.as_ref().is_some_and(CancellationToken::is_cancelled) {
            self.cancel(&exec_id).await?;
        }
        let canceller = cancel.map(|token| tokio::spawn(cancel_on(self.clone(), exec_id.clone(), token, false)));
        // The forwarder keeps the request half open for the whole call; the
        // stream aborts it when dropped, which lets HTTP/2 reset the call so
        // the agent kills the command instead of running it unwatched.
        let (input, input_task) = exec_input_stream(start, stdin_stream, self.inner.heartbeat);
        let mut out = self
            .rpc()
            .exec(input)
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let pid = match out.message().await.map_err(|s| self.status(OP, s))? {
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Started(s)),
            }) => {
                if exec_id.is_empty() {
                    exec_id = s.exec_id;
                }
                Some(s.pid)
            }
            // Cancelled before start: the agent answers exit at once.
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Exit(x)),
            }) => {
                input_task.abort();
                return Ok(ExecStream::finished(self.clone(), exec_id, exit_summary(x), canceller));
            }
            other => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: format!("expected started, got {other:?}"),
                });
            }
        };
        Ok(ExecStream {
            exec_id,
            pid,
            client: self.clone(),
            out: Some(out),
            driven: None,
            next_offset: 0,
            pending_exit: None,
            canceller,
            input_task: Some(input_task),
            silence: silence_timer(self.inner.heartbeat),
        })
    }

    /// A detachable execution (see [`Detach`]): started by name, it outlives
    /// this call; the stream survives a failed link by reattaching from the
    /// last byte it received. Dropping the stream stops watching and leaves
    /// the command running; the cancel token still kills it.
    async fn exec_detached(&self, mut req: ExecRequest) -> Result<ExecStream> {
        const OP: &str = "exec";
        self.require(OP, feat::EXEC)?;
        self.require(OP, feat::EXEC_ATTACH)?;
        if matches!(req.stdin, Stdin::Stream(_)) {
            self.require(OP, feat::EXEC_STDIN_STREAM)?;
        }
        if req.cancel.is_some() {
            self.require(OP, feat::EXEC_CANCEL)?;
        }
        let detach = req.detach.take().unwrap_or_default();
        let id = detach
            .execution_id
            .clone()
            .unwrap_or_else(|| format!("e-{:016x}", rand::random::<u64>()));
        let cancel = req.cancel.clone();
        let (mut start, stdin_stream) = exec_start(req);
        start.exec_id = id.clone();
        start.detach = true;
        start.host_heartbeats = self.inner.heartbeat.is_some();
        if cancel.is_some() {
            // Reserved by name, so a cancel racing the start is remembered.
            self.rpc()
                .reserve_exec(v1::ReserveExecRequest { exec_id: id.clone() })
                .await
                .map_err(|s| self.status("reserve_exec", s))?;
            if cancel.as_ref().is_some_and(CancellationToken::is_cancelled) {
                self.cancel_execution(&id).await?;
            }
        }
        let canceller = cancel.map(|token| tokio::spawn(cancel_on(self.clone(), id.clone(), token, true)));
        let (input, input_task) = exec_input_stream(start, stdin_stream, self.inner.heartbeat);
        let out = self.rpc().exec(input).await.map_err(|s| self.status(OP, s));
        let opened = match out {
            Ok(out) => self.opened_log(OP, &id, out.into_inner()).await,
            Err(e) => Err(e),
        };
        let (pid, out) = match opened {
            Ok(Opened::Following(pid, out)) => (pid, *out),
            Ok(Opened::Ended(exit)) => {
                input_task.abort();
                return Ok(ExecStream::finished(self.clone(), id, exit, canceller));
            }
            Err(e) => {
                input_task.abort();
                return Err(e);
            }
        };
        let follow = Follow {
            id: id.clone(),
            at: 0,
            follow: true,
            window: detach.reattach_window,
            on_gap: detach.on_gap,
        };
        Ok(self.driven_stream(follow, pid, out, canceller, Some(input_task)))
    }

    /// Reads a detachable execution by id — started by this process or by
    /// one that is gone — from `opts.from_offset`, and collects its output.
    /// Never signals the command. Every attach while the agent retains the
    /// execution ends with the same exit.
    pub async fn attach_execution(&self, execution_id: &str, opts: AttachOptions) -> Result<ExecOutput> {
        let stream = self.attach_execution_stream(execution_id, opts).await?;
        collect(stream, "attach_execution").await
    }

    /// [`Self::attach_execution`], streamed.
    pub async fn attach_execution_stream(&self, execution_id: &str, opts: AttachOptions) -> Result<ExecStream> {
        const OP: &str = "attach_execution";
        self.require(OP, feat::EXEC_ATTACH)?;
        let (pid, out) = match self.attach_raw(execution_id, opts.from_offset, opts.follow).await? {
            Opened::Following(pid, out) => (pid, *out),
            Opened::Ended(exit) => return Ok(ExecStream::finished(self.clone(), execution_id.into(), exit, None)),
        };
        let follow = Follow {
            id: execution_id.into(),
            at: opts.from_offset,
            follow: opts.follow,
            window: opts.reattach_window,
            on_gap: opts.on_gap,
        };
        Ok(self.driven_stream(follow, pid, out, None, None))
    }

    /// Cancels a detachable execution by id, from any process: resolves
    /// once the kill is confirmed. An unconfirmed kill is
    /// [`Error::ExecutionCancelUnconfirmed`] and retires nothing: the
    /// record stays and the cancel may be retried.
    pub async fn cancel_execution(&self, execution_id: &str) -> Result<CancelOutcome> {
        const OP: &str = "cancel_execution";
        self.require(OP, feat::EXEC_CANCEL)?;
        self.cancel_rpc(OP, execution_id)
            .await?
            .ok_or_else(|| Error::ExecutionCancelUnconfirmed {
                execution_id: execution_id.into(),
            })
    }

    /// One Cancel call; `None` when the agent could not confirm the kill.
    async fn cancel_rpc(&self, op: &str, exec_id: &str) -> Result<Option<CancelOutcome>> {
        let r = self
            .rpc()
            .cancel(v1::CancelRequest {
                exec_id: exec_id.into(),
            })
            .await
            .map_err(|s| self.status(op, s))?
            .into_inner();
        match r.outcome() {
            Outcome::Confirmed => Ok(Some(CancelOutcome::Killed)),
            Outcome::NotStarted => Ok(Some(CancelOutcome::NotStarted)),
            Outcome::AlreadyExited => Ok(Some(CancelOutcome::AlreadyExited)),
            Outcome::Unconfirmed => Ok(None),
            Outcome::Unspecified => Err(Error::Protocol {
                op: op.into(),
                message: "no outcome".into(),
            }),
        }
    }

    /// One AttachExec call, up to its `Started`.
    async fn attach_raw(&self, id: &str, from: u64, follow: bool) -> Result<Opened> {
        const OP: &str = "attach_execution";
        let req = v1::AttachExecRequest {
            exec_id: id.into(),
            from_offset: from,
            follow,
        };
        let out = self
            .rpc()
            .attach_exec(req)
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        self.opened_log(OP, id, out).await.map_err(|e| match e {
            Error::UnknownExecution { exec_id, .. } => Error::ExecutionNotAttachable {
                execution_id: exec_id,
                state: crate::error::AttachRefusal::Unknown,
                reason: "the agent holds no record of it (never started, past retention, or the agent restarted)"
                    .into(),
            },
            other => other,
        })
    }

    /// The first answer on a call reading an execution's log.
    async fn opened_log(&self, op: &str, id: &str, mut out: tonic::Streaming<v1::ExecOutput>) -> Result<Opened> {
        match out.message().await.map_err(|s| self.status(op, s))? {
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Started(s)),
            }) => Ok(Opened::Following(s.pid, Box::new(out))),
            // Cancelled before it started.
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Exit(x)),
            }) => Ok(Opened::Ended(exit_summary(x))),
            other => Err(Error::Protocol {
                op: op.into(),
                message: format!("execution {id}: expected started, got {other:?}"),
            }),
        }
    }

    fn driven_stream(
        &self,
        follow: Follow,
        pid: u32,
        out: tonic::Streaming<v1::ExecOutput>,
        canceller: Option<tokio::task::JoinHandle<Result<CancelOutcome>>>,
        input_task: Option<tokio::task::JoinHandle<()>>,
    ) -> ExecStream {
        let (tx, rx) = mpsc::channel(16);
        let exec_id = follow.id.clone();
        let next_offset = follow.at;
        let driver = tokio::spawn(drive(self.clone(), follow, out, tx, input_task));
        ExecStream {
            exec_id,
            pid: Some(pid),
            client: self.clone(),
            out: None,
            driven: Some((rx, driver)),
            next_offset,
            pending_exit: None,
            canceller,
            input_task: None,
            silence: None,
        }
    }

    /// Cancels an execution: kills its process group and waits for the
    /// agent to confirm. An unconfirmed kill retires the sandbox.
    pub async fn cancel(&self, exec_id: &str) -> Result<CancelOutcome> {
        const OP: &str = "cancel";
        self.open(OP)?;
        match self.cancel_rpc(OP, exec_id).await? {
            Some(outcome) => Ok(outcome),
            None => {
                self.inner.retired.store(true, Ordering::SeqCst);
                Err(Error::RemoteCancellationUnknown {
                    exec_id: exec_id.into(),
                })
            }
        }
    }

    // ----------------------------------------------------------- files --

    /// Writes `data` to `path` atomically.
    pub async fn write_file(&self, path: &Path, data: Bytes, opts: WriteOptions) -> Result<u64> {
        const OP: &str = "write_file";
        self.require(OP, feat::FILES_WRITE)?;
        let total = data.len() as u64;
        let chunk = self.inner.write_chunk;
        let chunks = (0..data.len()).step_by(chunk).map(move |i| {
            let end = (i + chunk).min(data.len());
            v1::WriteFileRequest {
                msg: Some(write_file_request::Msg::Data(data.slice(i..end))),
            }
        });
        let msgs = std::iter::once(begin_msg(path, &opts))
            .chain(chunks)
            .chain(std::iter::once(v1::WriteFileRequest {
                msg: Some(write_file_request::Msg::Commit(v1::WriteCommit { total_bytes: total })),
            }));
        let r = self
            .rpc()
            .write_file(futures::stream::iter(msgs))
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(r.into_inner().bytes_written)
    }

    /// Writes everything `reader` yields to `path` atomically, streaming. A
    /// read error aborts the write; the old file stays.
    pub async fn write_file_from<R>(&self, path: &Path, mut reader: R, opts: WriteOptions) -> Result<u64>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        const OP: &str = "write_file";
        self.require(OP, feat::FILES_WRITE)?;
        let (tx, rx) = mpsc::channel(4);
        let begin = begin_msg(path, &opts);
        let chunk = self.inner.write_chunk;
        let pump = tokio::spawn(async move {
            if tx.send(begin).await.is_err() {
                return Ok(());
            }
            let mut total = 0u64;
            loop {
                let mut buf = Vec::with_capacity(chunk);
                let n = (&mut reader).take(chunk as u64).read_to_end(&mut buf).await?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                let msg = v1::WriteFileRequest {
                    msg: Some(write_file_request::Msg::Data(buf.into())),
                };
                if tx.send(msg).await.is_err() {
                    return Ok(());
                }
            }
            let _ = tx
                .send(v1::WriteFileRequest {
                    msg: Some(write_file_request::Msg::Commit(v1::WriteCommit { total_bytes: total })),
                })
                .await;
            Ok::<_, io::Error>(())
        });
        let r = self.rpc().write_file(ReceiverStream::new(rx)).await;
        // A local read error explains the failure better than the agent's
        // "ended without commit".
        if let Ok(Err(source)) = pump.await {
            return Err(Error::LocalIo { op: OP.into(), source });
        }
        Ok(r.map_err(|s| self.status(OP, s))?.into_inner().bytes_written)
    }

    /// Reads a whole file, or a range of it.
    pub async fn read_file(&self, path: &Path, range: Option<ByteRange>) -> Result<FileData> {
        const OP: &str = "read_file";
        self.require(OP, feat::FILES_READ)?;
        let (offset, length) = range.map_or((0, None), |r| (r.offset, r.length));
        let r = self
            .rpc()
            .read_file(v1::ReadFileRequest {
                path: path_bytes(path),
                offset,
                length,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(FileData {
            data: r.data,
            file_size: r.file_size,
            eof: r.eof,
        })
    }

    /// Streams a file (or a range) in chunks; memory stays bounded on both
    /// ends whatever the size.
    pub async fn read_file_stream(&self, path: &Path, range: Option<ByteRange>) -> Result<ByteStream> {
        const OP: &str = "read_file_stream";
        self.require(OP, feat::FILES_READ_STREAM)?;
        let (offset, length) = range.map_or((0, None), |r| (r.offset, r.length));
        let s = self
            .rpc()
            .read_file_stream(v1::ReadFileStreamRequest {
                path: path_bytes(path),
                offset,
                length,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let me = self.clone();
        Ok(Box::pin(
            s.map(move |r| r.map(|c| c.data).map_err(|s| me.status(OP, s))),
        ))
    }

    pub async fn list_files(&self, path: &Path) -> Result<Vec<FileInfo>> {
        const OP: &str = "list_files";
        self.require(OP, feat::FILES_LIST)?;
        let r = self
            .rpc()
            .list_files(v1::ListFilesRequest { path: path_bytes(path) })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(r.into_inner().entries.into_iter().map(file_info).collect())
    }

    /// Walks a tree depth-first. Symlinks are reported, never followed. A
    /// budget overrun ends the stream with [`Error::WalkLimit`].
    pub async fn walk_files(&self, root: &Path, opts: WalkOptions) -> Result<FileInfoStream> {
        const OP: &str = "walk_files";
        self.require(OP, feat::FILES_WALK)?;
        let s = self
            .rpc()
            .walk_files(v1::WalkFilesRequest {
                root: path_bytes(root),
                max_entries: opts.max_entries,
                max_depth: opts.max_depth,
                include_hidden: opts.include_hidden,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let me = self.clone();
        Ok(Box::pin(s.map(move |r| r.map(file_info).map_err(|s| me.status(OP, s)))))
    }

    pub async fn stat(&self, path: &Path) -> Result<FileInfo> {
        const OP: &str = "stat";
        self.require(OP, feat::FILES_STAT)?;
        let r = self
            .rpc()
            .stat(v1::StatRequest { path: path_bytes(path) })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(file_info(r.into_inner()))
    }

    pub async fn mkdir(&self, path: &Path, parents: bool) -> Result<()> {
        const OP: &str = "mkdir";
        self.require(OP, feat::FILES_MKDIR)?;
        self.rpc()
            .mkdir(v1::MkdirRequest {
                path: path_bytes(path),
                parents,
                mode: None,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }

    pub async fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        const OP: &str = "remove";
        self.require(OP, feat::FILES_REMOVE)?;
        self.rpc()
            .remove(v1::RemoveRequest {
                path: path_bytes(path),
                recursive,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }

    pub async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        const OP: &str = "rename";
        self.require(OP, feat::FILES_RENAME)?;
        self.rpc()
            .rename(v1::RenameRequest {
                from: path_bytes(from),
                to: path_bytes(to),
                no_replace: false,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }
}

impl AgentClient {
    /// A TCP connection to 127.0.0.1:`port` inside the sandbox, relayed by
    /// the agent. The returned stream is `AsyncRead + AsyncWrite`;
    /// `shutdown()` half-closes, EOF means the sandbox side closed.
    /// Backpressure holds end to end: every buffer on the way is bounded.
    pub async fn open_tcp_connection(&self, port: u16) -> Result<tokio::io::DuplexStream> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const OP: &str = "tcp_connect";
        self.require(OP, feat::TCP_CONNECT)?;
        let (tx, rx) = mpsc::channel(8);
        let start = v1::TcpInput {
            msg: Some(v1::tcp_input::Msg::Connect(v1::TcpConnectStart {
                port: u32::from(port),
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
                msg: Some(v1::tcp_output::Msg::Connected(_)),
            }) => {}
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
        tokio::spawn(async move {
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
        tokio::spawn(async move {
            while let Ok(Some(m)) = out.message().await {
                match m.msg {
                    Some(v1::tcp_output::Msg::Data(d)) => {
                        if to_user.write_all(&d).await.is_err() {
                            break;
                        }
                    }
                    _ => break,
                }
            }
            let _ = to_user.shutdown().await;
            download_done.cancel();
        });
        Ok(user)
    }
}

impl AgentClient {
    /// Opens the `Egress` call the host's egress service holds for the
    /// sandbox's life: verdicts go out through the sender, the agent's asks
    /// come in on the stream. A newer call replaces this one.
    pub async fn egress_channel(&self) -> Result<(mpsc::Sender<v1::EgressVerdict>, tonic::Streaming<v1::EgressAsk>)> {
        const OP: &str = "egress";
        self.require(OP, feat::EGRESS)?;
        let (tx, rx) = mpsc::channel(64);
        let asks = self
            .rpc()
            .egress(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok((tx, asks))
    }

    /// Accepts the agent's connect ask `id`: the host has connected, and
    /// this joins the two ends. Bytes for the sandbox's client go through
    /// the sender (after the `accept` this sends first); the client's bytes
    /// come in on the stream.
    pub async fn egress_splice(
        &self,
        id: u64,
    ) -> Result<(mpsc::Sender<v1::EgressSpliceInput>, tonic::Streaming<v1::TcpOutput>)> {
        const OP: &str = "egress_splice";
        self.require(OP, feat::EGRESS)?;
        let (tx, rx) = mpsc::channel(8);
        let accept = v1::EgressSpliceInput {
            msg: Some(v1::egress_splice_input::Msg::Accept(id)),
        };
        let _ = tx.send(accept).await;
        let from = self
            .rpc()
            .egress_splice(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok((tx, from))
    }
}

impl AgentClient {
    /// Starts a command in a named session that outlives this link.
    pub async fn start_detached(&self, spec: DetachedSpec) -> Result<SessionInfo> {
        const OP: &str = "start_detached";
        self.require(OP, feat::SESSIONS)?;
        let b = |s: &std::ffi::OsStr| Bytes::copy_from_slice(s.as_bytes());
        let req = v1::StartDetachedRequest {
            session_id: spec.session_id,
            command: b(&spec.command),
            args: spec.args.iter().map(|a| b(a)).collect(),
            cwd: spec.cwd.as_ref().map(|c| b(c.as_os_str())).unwrap_or_default(),
            env: spec
                .env
                .iter()
                .map(|(k, v)| v1::EnvVar { key: b(k), value: b(v) })
                .collect(),
        };
        let r = self.rpc().start_detached(req).await.map_err(|s| self.status(OP, s))?;
        Ok(session_info(r.into_inner()))
    }

    /// Reads a session's output from `from_offset` (at most `max_bytes`, 0
    /// for the agent's default). Never disturbs anyone attached.
    pub async fn read_session(&self, id: &str, from_offset: u64, max_bytes: u32) -> Result<SessionChunk> {
        const OP: &str = "read_session";
        self.require(OP, feat::SESSIONS)?;
        let r = self
            .rpc()
            .read_session(v1::ReadSessionRequest {
                session_id: id.into(),
                from_offset,
                max_bytes,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(SessionChunk {
            data: r.data,
            offset: r.offset,
            next_offset: r.next_offset,
            dropped_bytes: r.dropped_bytes,
            info: session_info(r.info.unwrap_or_default()),
        })
    }

    pub async fn list_sessions(&self) -> Result<Vec<SessionInfo>> {
        const OP: &str = "list_sessions";
        self.require(OP, feat::SESSIONS)?;
        let r = self
            .rpc()
            .list_sessions(v1::Empty {})
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(r.into_inner().sessions.into_iter().map(session_info).collect())
    }

    /// Signals every process still in the session; returns the state after.
    pub async fn kill_session(&self, id: &str, signal: SessionSignal) -> Result<SessionInfo> {
        use v1::kill_session_request::Sig;
        const OP: &str = "kill_session";
        self.require(OP, feat::SESSIONS)?;
        let sig = match signal {
            SessionSignal::Term => Sig::Term,
            SessionSignal::Kill => Sig::Kill,
            SessionSignal::Int => Sig::Int,
            SessionSignal::Hup => Sig::Hup,
        };
        let r = self
            .rpc()
            .kill_session(v1::KillSessionRequest {
                session_id: id.into(),
                signal: sig as i32,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(session_info(r.into_inner()))
    }

    /// Stops every process in the sandbox but the agent: SIGTERM, `grace`,
    /// SIGKILL, in rounds until a pass finds none. Running executions end as
    /// cancelled; nothing is retired.
    pub async fn quiesce(&self, grace: Duration) -> Result<QuiesceReport> {
        const OP: &str = "quiesce";
        self.require(OP, feat::QUIESCE)?;
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX).max(1);
        let r = self
            .rpc()
            .quiesce(v1::QuiesceRequest { grace_ms })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(QuiesceReport {
            stopped: r
                .stopped
                .into_iter()
                .map(|p| StoppedProcess {
                    pid: p.pid,
                    comm: p.comm,
                    signal: p.signal,
                })
                .collect(),
            rounds: r.rounds,
        })
    }

    /// Makes everything written to the workspace durable (syncfs) within
    /// `timeout`; returns how long it took.
    pub async fn flush(&self, timeout: Duration) -> Result<Duration> {
        const OP: &str = "flush";
        self.require(OP, feat::FLUSH)?;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX).max(1);
        let r = self
            .rpc()
            .flush(v1::FlushRequest { timeout_ms })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(Duration::from_millis(r.into_inner().duration_ms))
    }

    /// Opens a terminal. Dropping or closing a plain terminal kills every
    /// process still in its session; a persistent one only detaches.
    pub async fn open_terminal(&self, opts: TerminalOptions) -> Result<Terminal> {
        const OP: &str = "terminal";
        self.require(OP, feat::TERMINAL)?;
        if opts.persistent {
            self.require(OP, feat::SESSIONS)?;
        }
        let b = |s: &std::ffi::OsStr| Bytes::copy_from_slice(s.as_bytes());
        let open = v1::TerminalOpen {
            command: opts.command.as_deref().map(b).unwrap_or_default(),
            args: opts.args.iter().map(|a| b(a)).collect(),
            cwd: opts.cwd.as_ref().map(|c| b(c.as_os_str())).unwrap_or_default(),
            env: opts
                .env
                .iter()
                .map(|(k, v)| v1::EnvVar { key: b(k), value: b(v) })
                .collect(),
            cols: u32::from(if opts.cols == 0 { 80 } else { opts.cols }),
            rows: u32::from(if opts.rows == 0 { 24 } else { opts.rows }),
            session_id: opts.session_id.clone().unwrap_or_default(),
            persistent: opts.persistent,
            host_heartbeats: self.inner.heartbeat.is_some(),
        };
        let session = opts.persistent.then(|| opts.session_id.clone().unwrap_or_default());
        self.terminal_call(v1::terminal_input::Msg::Open(open), session, 0)
            .await
    }

    /// Attaches to a persistent terminal from `from_offset`: what it printed
    /// since is replayed, then it follows live. Takes over from any other
    /// attachment (which ends with [`Error::AttachmentReplaced`]).
    pub async fn attach_terminal(&self, session_id: &str, from_offset: u64) -> Result<Terminal> {
        self.require("terminal", feat::SESSIONS)?;
        let attach = v1::TerminalAttach {
            session_id: session_id.into(),
            from_offset,
            host_heartbeats: self.inner.heartbeat.is_some(),
        };
        self.terminal_call(
            v1::terminal_input::Msg::Attach(attach),
            Some(session_id.into()),
            from_offset,
        )
        .await
    }

    async fn terminal_call(
        &self,
        first: v1::terminal_input::Msg,
        session: Option<String>,
        from: u64,
    ) -> Result<Terminal> {
        const OP: &str = "terminal";
        let (tx, rx) = mpsc::channel(16);
        let _ = tx.send(v1::TerminalInput { msg: Some(first) }).await;
        let mut out = self
            .rpc()
            .terminal(ReceiverStream::new(rx))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let pid = match out.message().await.map_err(|s| self.status(OP, s))? {
            Some(v1::TerminalOutput {
                msg: Some(v1::terminal_output::Msg::Opened(s)),
            }) => s.pid,
            other => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: format!("expected opened, got {other:?}"),
                })
            }
        };
        let beats = self.inner.heartbeat.map(|every| {
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let beat = v1::TerminalInput {
                        msg: Some(v1::terminal_input::Msg::Heartbeat(v1::Empty {})),
                    };
                    if tx.send(beat).await.is_err() {
                        return;
                    }
                }
            })
        });
        let silence = self.inner.heartbeat.map(|d| d * 3);
        Ok(Terminal {
            pid,
            input: tx,
            out,
            client: self.clone(),
            ended: false,
            session,
            next_offset: from,
            beats,
            silence,
        })
    }
}

/// A live terminal. Dropping it closes it.
pub struct Terminal {
    /// Pid of the terminal's command inside the sandbox.
    pub pid: u32,
    input: mpsc::Sender<v1::TerminalInput>,
    out: tonic::Streaming<v1::TerminalOutput>,
    client: AgentClient,
    ended: bool,
    /// The session id of a persistent terminal.
    session: Option<String>,
    /// Offset of the next byte this attachment expects.
    next_offset: u64,
    beats: Option<tokio::task::JoinHandle<()>>,
    /// Three heartbeat intervals: the agent saying nothing for that long is
    /// gone.
    silence: Option<Duration>,
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(b) = self.beats.take() {
            b.abort();
        }
    }
}

impl Terminal {
    /// Offset of the next output byte: where to attach again after a detach.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    async fn send(&mut self, msg: v1::terminal_input::Msg) -> Result<()> {
        self.input
            .send(v1::TerminalInput { msg: Some(msg) })
            .await
            .map_err(|_| Error::LinkLost {
                op: "terminal".into(),
                message: "the terminal is closed".into(),
            })
    }

    /// Types `data` into the terminal.
    pub async fn write(&mut self, data: impl Into<Bytes>) -> Result<()> {
        self.send(v1::terminal_input::Msg::Input(data.into())).await
    }

    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        self.send(v1::terminal_input::Msg::Resize(v1::TerminalSize {
            cols: u32::from(cols),
            rows: u32::from(rows),
        }))
        .await
    }

    /// The next output or the exit; `None` after the exit. A plain terminal
    /// whose agent goes silent for three heartbeat intervals resolves as
    /// lost (exit code -1); a persistent one as [`Error::Detached`].
    pub async fn next(&mut self) -> Option<Result<TerminalEvent>> {
        if self.ended {
            return None;
        }
        let msg = loop {
            let got = match self.silence {
                Some(d) => match tokio::time::timeout(d, self.out.message()).await {
                    Ok(m) => m,
                    Err(_) => {
                        self.ended = true;
                        tracing::warn!("terminal: no word from the agent in three heartbeat intervals");
                        return Some(match &self.session {
                            Some(id) => Err(Error::Detached {
                                session_id: id.clone(),
                                offset: self.next_offset,
                            }),
                            None => Ok(TerminalEvent::Exit(ExitStatus {
                                code: Some(-1),
                                ..Default::default()
                            })),
                        });
                    }
                },
                None => self.out.message().await,
            };
            if !matches!(
                &got,
                Ok(Some(v1::TerminalOutput {
                    msg: Some(v1::terminal_output::Msg::Heartbeat(_))
                }))
            ) {
                break got;
            }
        };
        match msg {
            Ok(Some(v1::TerminalOutput {
                msg: Some(v1::terminal_output::Msg::Data(c)),
            })) => Some(Ok(TerminalEvent::Output {
                offset: c.offset,
                data: c.data,
            })),
            Ok(Some(v1::TerminalOutput {
                msg: Some(v1::terminal_output::Msg::Exit(x)),
            })) => {
                self.ended = true;
                Some(Ok(TerminalEvent::Exit(exit_summary(x).status)))
            }
            Ok(_) => {
                self.ended = true;
                Some(Err(Error::LinkLost {
                    op: "terminal".into(),
                    message: "ended without an exit".into(),
                }))
            }
            Err(s) => {
                self.ended = true;
                Some(Err(match (self.client.status("terminal", s), &self.session) {
                    (Error::LinkLost { .. }, Some(id)) => Error::Detached {
                        session_id: id.clone(),
                        offset: self.next_offset,
                    },
                    (e, _) => e,
                }))
            }
        }
    }

    /// Closes the terminal: everything in its session is killed. Returns
    /// how the command ended.
    pub async fn close(mut self) -> Result<ExitStatus> {
        let _ = self.send(v1::terminal_input::Msg::Close(v1::Empty {})).await;
        while let Some(ev) = self.next().await {
            if let TerminalEvent::Exit(st) = ev? {
                return Ok(st);
            }
        }
        Err(Error::LinkLost {
            op: "terminal".into(),
            message: "ended without an exit".into(),
        })
    }
}

/// How a cancel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The whole process group was killed and is confirmed gone.
    Killed,
    /// Reserved but never started; it never will be.
    NotStarted,
    AlreadyExited,
}

pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;
pub type FileInfoStream = Pin<Box<dyn Stream<Item = Result<FileInfo>> + Send>>;

/// A running command's output, ending with [`ExecEvent::Exit`].
pub struct ExecStream {
    pub exec_id: String,
    /// Pid inside the sandbox; `None` if it never started.
    pub pid: Option<u32>,
    client: AgentClient,
    out: Option<tonic::Streaming<v1::ExecOutput>>,
    /// A detachable execution's events, each with the log offset after it,
    /// fed by a task that reattaches.
    driven: Option<(mpsc::Receiver<Driven>, tokio::task::JoinHandle<()>)>,
    /// Log offset of the next byte of a detachable execution.
    next_offset: u64,
    pending_exit: Option<ExitSummary>,
    canceller: Option<tokio::task::JoinHandle<Result<CancelOutcome>>>,
    input_task: Option<tokio::task::JoinHandle<()>>,
    /// Three heartbeat intervals, and the timer that runs out when the
    /// agent says nothing for that long.
    silence: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
}

fn silence_timer(heartbeat: Option<Duration>) -> Option<(Duration, Pin<Box<tokio::time::Sleep>>)> {
    heartbeat.map(|d| (d * 3, Box::pin(tokio::time::sleep(d * 3))))
}

impl ExecStream {
    /// For a detachable execution: the log offset (stdout and stderr
    /// interleaved) just past the last event this stream yielded — where
    /// [`AgentClient::attach_execution`] resumes without losing or
    /// repeating a byte.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// A stream whose command never started (cancelled before its start).
    fn finished(
        client: AgentClient,
        exec_id: String,
        exit: ExitSummary,
        canceller: Option<tokio::task::JoinHandle<Result<CancelOutcome>>>,
    ) -> Self {
        Self {
            exec_id,
            pid: None,
            client,
            out: None,
            driven: None,
            next_offset: 0,
            pending_exit: Some(exit),
            canceller,
            input_task: None,
            silence: None,
        }
    }
}

impl Drop for ExecStream {
    fn drop(&mut self) {
        if let Some(c) = self.canceller.take() {
            c.abort();
        }
        if let Some(t) = self.input_task.take() {
            t.abort();
        }
        if let Some((_, driver)) = self.driven.take() {
            driver.abort();
        }
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if let Some(x) = self.pending_exit.take() {
            return Poll::Ready(Some(Ok(ExecEvent::Exit(x))));
        }
        if let Some((rx, _)) = self.driven.as_mut() {
            return match rx.poll_recv(cx) {
                Poll::Ready(Some((ev, at))) => {
                    self.next_offset = at;
                    Poll::Ready(Some(ev))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
        loop {
            let Some(out) = self.out.as_mut() else {
                return Poll::Ready(None);
            };
            let polled = out.poll_next_unpin(cx);
            if polled.is_pending() {
                if let Some((_, timer)) = self.silence.as_mut() {
                    if timer.as_mut().poll(cx).is_ready() {
                        self.out = None;
                        return Poll::Ready(Some(Err(Error::LinkLost {
                            op: "exec".into(),
                            message: "no word from the agent in three heartbeat intervals".into(),
                        })));
                    }
                }
                return Poll::Pending;
            }
            if let Some((d, timer)) = self.silence.as_mut() {
                let d = *d;
                timer.as_mut().reset(tokio::time::Instant::now() + d);
            }
            if let Poll::Ready(Some(Ok(v1::ExecOutput {
                msg: Some(exec_output::Msg::Heartbeat(_)),
            }))) = polled
            {
                continue;
            }
            return self.as_mut().map_polled(polled);
        }
    }
}

impl ExecStream {
    fn map_polled(
        mut self: Pin<&mut Self>,
        polled: std::task::Poll<Option<std::result::Result<v1::ExecOutput, tonic::Status>>>,
    ) -> std::task::Poll<Option<Result<ExecEvent>>> {
        use std::task::Poll;
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.out = None;
                Poll::Ready(Some(Err(Error::LinkLost {
                    op: "exec".into(),
                    message: "stream ended before the exit".into(),
                })))
            }
            Poll::Ready(Some(Err(s))) => {
                self.out = None;
                let e = self.client.status("exec", s);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(Some(Ok(msg))) => match msg.msg {
                Some(exec_output::Msg::Stdout(c)) => Poll::Ready(Some(Ok(ExecEvent::Stdout {
                    offset: c.offset,
                    data: c.data,
                }))),
                Some(exec_output::Msg::Stderr(c)) => Poll::Ready(Some(Ok(ExecEvent::Stderr {
                    offset: c.offset,
                    data: c.data,
                }))),
                Some(exec_output::Msg::Exit(x)) => {
                    self.out = None;
                    Poll::Ready(Some(Ok(ExecEvent::Exit(exit_summary(x)))))
                }
                _ => Poll::Ready(Some(Err(Error::Protocol {
                    op: "exec".into(),
                    message: "unexpected message".into(),
                }))),
            },
        }
    }
}

/// The start message (without its id yet) and the stdin stream, if any.
fn exec_start(req: ExecRequest) -> (v1::ExecStart, Option<StdinStream>) {
    let timeout_ms = match req.timeout {
        None => 0,
        Some(t) => u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1),
    };
    let (stdin, stream, follow) = match req.stdin {
        Stdin::Null => (Bytes::new(), None, false),
        Stdin::Bytes(b) => (b, None, false),
        Stdin::Stream(s) => (Bytes::new(), Some(s), true),
    };
    let b = |s: &std::ffi::OsStr| Bytes::copy_from_slice(s.as_bytes());
    let start = v1::ExecStart {
        exec_id: String::new(),
        command: b(&req.command),
        args: req.args.iter().map(|a| b(a)).collect(),
        cwd: req.cwd.as_ref().map(|c| b(c.as_os_str())).unwrap_or_default(),
        env: req
            .env
            .iter()
            .map(|(k, v)| v1::EnvVar { key: b(k), value: b(v) })
            .collect(),
        clear_env: req.clear_env,
        timeout_ms,
        stdin_stream: follow,
        stdin,
        host_heartbeats: false,
        detach: false,
    };
    (start, stream)
}

async fn cancel_on(
    client: AgentClient,
    exec_id: String,
    token: CancellationToken,
    detached: bool,
) -> Result<CancelOutcome> {
    token.cancelled().await;
    if detached {
        client.cancel_execution(&exec_id).await
    } else {
        client.cancel(&exec_id).await
    }
}

/// Collects a stream's output up to its exit.
async fn collect(mut stream: ExecStream, op: &str) -> Result<ExecOutput> {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev? {
            ExecEvent::Stdout { data, .. } => stdout.extend_from_slice(&data),
            ExecEvent::Stderr { data, .. } => stderr.extend_from_slice(&data),
            ExecEvent::Exit(x) => {
                return Ok(ExecOutput {
                    exec_id: stream.exec_id.clone(),
                    status: x.status,
                    stdout: stdout.into(),
                    stderr: stderr.into(),
                    stdout_truncated: x.stdout_truncated,
                    stderr_truncated: x.stderr_truncated,
                    stdout_bytes: x.stdout_bytes,
                    stderr_bytes: x.stderr_bytes,
                    duration: x.duration,
                });
            }
        }
    }
    Err(Error::Protocol {
        op: op.into(),
        message: "stream ended without an exit".into(),
    })
}

/// An event of a detachable execution, with the log offset just past it.
type Driven = (Result<ExecEvent>, u64);

/// How an execution's log opened.
enum Opened {
    Following(u32, Box<tonic::Streaming<v1::ExecOutput>>),
    Ended(ExitSummary),
}

/// A reader of a detachable execution's log, and where it has got to.
struct Follow {
    id: String,
    /// Log offset of the next byte wanted.
    at: u64,
    follow: bool,
    window: Duration,
    on_gap: Option<GapCallback>,
}

fn is_link_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::LinkLost { .. } | Error::Connect { .. } | Error::Preface { .. }
    )
}

/// Feeds one detachable execution's events to its stream: follows the
/// call, and when the link fails, attaches again from the last byte
/// received until the reattach window runs out. Never signals the command.
async fn drive(
    client: AgentClient,
    mut f: Follow,
    mut out: tonic::Streaming<v1::ExecOutput>,
    tx: mpsc::Sender<Driven>,
    input_task: Option<tokio::task::JoinHandle<()>>,
) {
    struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            if let Some(t) = self.0.take() {
                t.abort();
            }
        }
    }
    let _input = AbortOnDrop(input_task);
    let silence = client.inner.heartbeat.map(|d| d * 3);
    loop {
        let failure = loop {
            let next = match silence {
                Some(d) => match tokio::time::timeout(d, out.message()).await {
                    Ok(n) => n,
                    Err(_) => {
                        break Error::LinkLost {
                            op: "exec".into(),
                            message: "no word from the agent in three heartbeat intervals".into(),
                        }
                    }
                },
                None => out.message().await,
            };
            let msg = match next {
                Ok(Some(m)) => m,
                // A read without `follow` ends when it has what is held.
                Ok(None) if !f.follow => return,
                Ok(None) => {
                    break Error::LinkLost {
                        op: "exec".into(),
                        message: "stream ended before the exit".into(),
                    }
                }
                Err(s) => {
                    let e = client.status("exec", s);
                    if is_link_failure(&e) {
                        break e;
                    }
                    let _ = tx.send((Err(e), f.at)).await;
                    return;
                }
            };
            let ev = match msg.msg {
                Some(exec_output::Msg::Heartbeat(_) | exec_output::Msg::Started(_)) => continue,
                Some(exec_output::Msg::Gap(g)) => {
                    f.at = g.to_offset;
                    if let Some(cb) = &f.on_gap {
                        cb(OutputGap {
                            from_offset: g.from_offset,
                            lost_bytes: g.to_offset.saturating_sub(g.from_offset),
                        });
                    }
                    continue;
                }
                Some(exec_output::Msg::Stdout(c)) => {
                    f.at = c.log_offset + c.data.len() as u64;
                    ExecEvent::Stdout {
                        offset: c.offset,
                        data: c.data,
                    }
                }
                Some(exec_output::Msg::Stderr(c)) => {
                    f.at = c.log_offset + c.data.len() as u64;
                    ExecEvent::Stderr {
                        offset: c.offset,
                        data: c.data,
                    }
                }
                Some(exec_output::Msg::Exit(x)) => {
                    let _ = tx.send((Ok(ExecEvent::Exit(exit_summary(x))), f.at)).await;
                    return;
                }
                None => {
                    let e = Error::Protocol {
                        op: "exec".into(),
                        message: "empty message".into(),
                    };
                    let _ = tx.send((Err(e), f.at)).await;
                    return;
                }
            };
            if tx.send((Ok(ev), f.at)).await.is_err() {
                return;
            }
        };
        tracing::debug!(execution_id = %f.id, offset = f.at, error = %failure, "link failed; reattaching");
        let deadline = tokio::time::Instant::now() + f.window;
        let mut backoff = Duration::from_millis(50);
        out = loop {
            if tx.is_closed() {
                return;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let attempt = tokio::time::timeout(left, client.attach_raw(&f.id, f.at, f.follow)).await;
            match attempt {
                Ok(Ok(Opened::Following(_, s))) => break *s,
                Ok(Ok(Opened::Ended(x))) => {
                    let _ = tx.send((Ok(ExecEvent::Exit(x)), f.at)).await;
                    return;
                }
                Ok(Err(e)) if !is_link_failure(&e) => {
                    let _ = tx.send((Err(e), f.at)).await;
                    return;
                }
                _ if tokio::time::Instant::now() + backoff >= deadline => {
                    let e = Error::ExecutionDetached {
                        execution_id: f.id.clone(),
                        offset: f.at,
                    };
                    let _ = tx.send((Err(e), f.at)).await;
                    return;
                }
                _ => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        };
        tracing::debug!(execution_id = %f.id, offset = f.at, "reattached");
    }
}

/// `start`, then stdin chunks and an end-of-input marker if stdin streams.
/// A forwarding task feeds a channel so the request stream is a concrete
/// `Send + Sync` type whatever the caller's stdin stream is.
fn exec_input_stream(
    start: v1::ExecStart,
    stdin: Option<StdinStream>,
    heartbeat: Option<Duration>,
) -> (ReceiverStream<v1::ExecInput>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(8);
    let task = tokio::spawn(async move {
        let send = |m: exec_input::Msg| {
            let tx = tx.clone();
            async move { tx.send(v1::ExecInput { msg: Some(m) }).await.is_ok() }
        };
        if !send(exec_input::Msg::Start(start)).await {
            return;
        }
        let mut stdin = stdin;
        let beat = || async move {
            match heartbeat {
                Some(d) => tokio::time::sleep(d).await,
                None => futures::future::pending().await,
            }
        };
        loop {
            tokio::select! {
                chunk = async { match stdin.as_mut() { Some(s) => s.next().await, None => futures::future::pending().await } } => {
                    let ok = match chunk {
                        Some(b) => send(exec_input::Msg::Stdin(b)).await,
                        None => {
                            stdin = None;
                            send(exec_input::Msg::StdinEof(v1::Empty {})).await
                        }
                    };
                    if !ok {
                        return;
                    }
                }
                _ = beat() => {
                    if !send(exec_input::Msg::Heartbeat(v1::Empty {})).await {
                        return;
                    }
                }
                // The request half stays open until the call ends.
                _ = tx.closed() => return,
            }
        }
    });
    (ReceiverStream::new(rx), task)
}

fn exit_summary(x: v1::ExecExit) -> ExitSummary {
    ExitSummary {
        status: ExitStatus {
            code: x.code,
            signal: x.signal,
            timed_out: x.timed_out,
            cancelled: x.cancelled,
        },
        stdout_truncated: x.stdout_truncated,
        stderr_truncated: x.stderr_truncated,
        stdout_bytes: x.stdout_bytes,
        stderr_bytes: x.stderr_bytes,
        duration: Duration::from_millis(x.duration_ms),
    }
}

fn begin_msg(path: &Path, opts: &WriteOptions) -> v1::WriteFileRequest {
    v1::WriteFileRequest {
        msg: Some(write_file_request::Msg::Begin(v1::WriteBegin {
            path: path_bytes(path),
            mode: opts.mode,
            create_parents: opts.create_parents,
        })),
    }
}

fn path_bytes(p: &Path) -> Bytes {
    Bytes::copy_from_slice(p.as_os_str().as_bytes())
}

fn file_info(e: v1::FileEntry) -> FileInfo {
    use std::os::unix::ffi::OsStringExt;
    let kind = match e.file_type() {
        v1::FileType::Regular => FileKind::File,
        v1::FileType::Directory => FileKind::Dir,
        v1::FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    let mtime = if e.mtime_ms >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_millis(e.mtime_ms.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_millis(e.mtime_ms.unsigned_abs())
    };
    FileInfo {
        path: bytes_path(&e.path),
        name: std::ffi::OsString::from_vec(e.name.to_vec()),
        kind,
        size: e.size,
        mode: e.mode,
        mtime,
        symlink_target: e.symlink_target.as_deref().map(bytes_path),
        depth: e.depth,
    }
}

fn session_info(i: v1::SessionInfo) -> SessionInfo {
    let state = match i.state() {
        v1::session_info::State::Exited => SessionState::Exited(ExitStatus {
            code: i.code,
            signal: i.signal,
            timed_out: false,
            cancelled: false,
        }),
        _ => SessionState::Running,
    };
    SessionInfo {
        session_id: i.session_id,
        pid: i.pid,
        state,
        output_bytes: i.output_bytes,
        first_offset: i.first_offset,
    }
}

fn agent_info(h: v1::HealthResponse) -> AgentInfo {
    AgentInfo {
        protocol_version: h.protocol_version,
        agent_version: h.agent_version,
        boot_id: h.boot_id,
        features: h.features,
        retiring: h.retiring,
        pid: h.pid,
        rss_bytes: h.rss_bytes,
        peak_rss_bytes: h.peak_rss_bytes,
        limits: h.limits.into_iter().map(|l| (l.name, l.value)).collect(),
        ops_served: h.ops_served,
        hardening: h.hardening.into_iter().collect(),
        roots: h.roots.iter().map(|r| bytes_path(r)).collect(),
    }
}
