//! The gRPC service: decodes requests (the retiring fence stands in front
//! of it, [`crate::fence`]), runs file work on
//! blocking threads, and turns every failure into a status carrying a typed
//! [`v1::AgentError`].

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use namzu_proto::v1::{
    self, agent_error::Kind, agent_server::Agent, exec_input, write_file_request, CancelRequest, CancelResponse, Empty,
    ExecInput, ExecOutput, FileChunk, FileEntry, HealthRequest, HealthResponse, ListFilesRequest, ListFilesResponse,
    MkdirRequest, ReadFileRequest, ReadFileResponse, ReadFileStreamRequest, RemoveRequest, RenameRequest,
    ReserveExecRequest, ReserveExecResponse, StatRequest, WalkFilesRequest, WriteFileRequest, WriteFileResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::{AgentConfig, Limits};
use crate::exec::Execs;
use crate::files;
use crate::jail::Jail;

use crate::op_error::{agent_err, IntoStatus, OpError};

pub struct AgentService {
    cfg: Arc<AgentConfig>,
    jail: Arc<Jail>,
    execs: Arc<Execs>,
    ops_served: std::sync::atomic::AtomicU64,
    sessions: Arc<crate::sessions::Sessions>,
    egress: Arc<crate::egress::Broker>,
}

impl AgentService {
    pub fn new(cfg: Arc<AgentConfig>, jail: Arc<Jail>, execs: Arc<Execs>, egress: Arc<crate::egress::Broker>) -> Self {
        Self {
            egress,
            jail,
            ops_served: Default::default(),
            sessions: Arc::new(crate::sessions::Sessions::new(
                cfg.limits.clone(),
                execs.default_cwd().to_path_buf(),
                execs.reaper(),
            )),
            cfg,
            execs,
        }
    }

    fn limits(&self) -> &Limits {
        &self.cfg.limits
    }

    /// Counts the op and refuses it if its feature is withheld.
    fn admit(&self, op: &str, feature: &str) -> Result<(), Status> {
        self.ops_served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.feature(op, feature)
    }

    /// Refuses `op` if `feature` is withheld.
    fn feature(&self, op: &str, feature: &str) -> Result<(), Status> {
        if !self.cfg.feature_enabled(feature) {
            let mut e = agent_err(Kind::FeatureDisabled, op, "feature disabled on this agent");
            e.feature = feature.into();
            return Err(e.into_status());
        }
        Ok(())
    }

    /// Admits a streamed read (on the link or a stream of its own) and
    /// opens its file, with the checks and errors of `ReadFileStream`.
    pub(crate) async fn open_for_stream(&self, op: &'static str, path: bytes::Bytes) -> Result<std::fs::File, Status> {
        self.admit(op, namzu_proto::features::FILES_READ_STREAM)?;
        let (file, _) = self
            .blocking(op, move |jail| files::open_regular(jail, op, &path))
            .await?;
        Ok(file)
    }

    /// Refuses a side read when that feature is withheld.
    pub(crate) fn side_reads_enabled(&self, op: &str) -> Result<(), Status> {
        self.feature(op, namzu_proto::features::FILES_READ_SIDE)
    }

    /// Refuses a command on a stream of its own when that feature is
    /// withheld.
    pub(crate) fn side_exec_enabled(&self, op: &str) -> Result<(), Status> {
        self.feature(op, namzu_proto::features::EXEC_SIDE)
    }

    /// The retiring fence for a stream of its own, which no tower layer
    /// stands in front of: refused as [`crate::fence`] refuses an RPC.
    pub(crate) fn side_fence(&self, op: &str) -> Result<(), Status> {
        if self.execs.retiring() {
            return Err(agent_err(
                Kind::Retiring,
                op,
                "agent is retiring after an unconfirmed kill; only health and cancel are served",
            )
            .into_status());
        }
        Ok(())
    }

    /// Starts a command whose `start` was read, on the link or on a
    /// stream of its own, with the checks and errors of `Exec`. Returns
    /// the first output message (`Started`, or why not) already received,
    /// so that it leaves in one write with whatever precedes it, and the
    /// receiver of the rest.
    pub(crate) async fn start_exec(
        &self,
        mut start: v1::ExecStart,
        input: crate::exec::InputStream,
    ) -> Result<
        (
            Option<Result<ExecOutput, Status>>,
            mpsc::Receiver<Result<ExecOutput, Status>>,
        ),
        Status,
    > {
        self.admit("exec", namzu_proto::features::EXEC)?;
        crate::pause::refuse("exec").map_err(IntoStatus::into_status)?;
        if start.stdin_stream {
            self.feature("exec", namzu_proto::features::EXEC_STDIN_STREAM)?;
        }
        if start.detachable {
            self.feature("exec", namzu_proto::features::EXEC_ATTACH)?;
        }
        // No reservation: nobody can cancel before `Started` names the id, so
        // reserving here saves the caller a round trip.
        if start.execution_id.is_empty() && !start.detachable {
            start.execution_id = self.execs.reserve(None).map_err(IntoStatus::into_status)?.0;
        }
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(self.execs.clone().run(start, input, tx));
        // The answer waits for the first message (`Started`, or why not):
        // the response's head (or a side stream's acceptance) and it leave
        // in one write, and the host wakes once for them instead of twice.
        let first = rx.recv().await;
        Ok((first, rx))
    }

    /// A side write's start, with the checks and errors of `WriteFile`'s
    /// begin: the target located and its temporary made.
    pub(crate) async fn begin_side_write(
        &self,
        begin: namzu_proto::v1::WriteBegin,
    ) -> Result<files::PendingWrite, Status> {
        const OP: &str = "write_file";
        self.side_fence(OP)?;
        self.admit(OP, namzu_proto::features::FILES_WRITE)?;
        self.feature(OP, namzu_proto::features::FILES_WRITE_SIDE)?;
        let max = self.limits().max_write_bytes;
        self.blocking(OP, move |jail| {
            files::PendingWrite::begin(jail, &begin.path, begin.mode, begin.create_parents, max)
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Jail) -> Result<T, OpError> + Send + 'static,
    ) -> Result<T, Status> {
        let jail = self.jail.clone();
        match tokio::task::spawn_blocking(move || f(&jail)).await {
            Ok(r) => r.map_err(IntoStatus::into_status),
            Err(e) => Err(agent_err(Kind::Io, op, &format!("worker failed: {e}")).into_status()),
        }
    }
}

/// RSS and peak RSS of this process, in bytes, from /proc.
fn rss() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

impl AgentService {
    /// What Health answers (also the hello of a hello preface):
    /// `probe_child` adds a probe child's status.
    pub async fn health_response(&self, probe_child: bool) -> Result<HealthResponse, Status> {
        let child_status = if !probe_child {
            String::new()
        } else if let Some(status) = &self.cfg.startup_child_status {
            status.clone()
        } else {
            tokio::task::spawn_blocking(crate::reaper::probe_child_status)
                .await
                .map_err(|e| agent_err(Kind::Io, "health", &e.to_string()).into_status())?
                .map_err(|e| agent_err(Kind::Io, "health", &format!("probe child: {e}")).into_status())?
        };
        let (rss_bytes, peak_rss_bytes) = rss();
        Ok(HealthResponse {
            protocol_version: namzu_proto::PROTOCOL_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").into(),
            boot_id: crate::boot_id().to_owned(),
            features: self.cfg.features(),
            ops_served: self.ops_served.load(std::sync::atomic::Ordering::Relaxed),
            hardening: self.cfg.hardening.iter().cloned().collect(),
            child_status,
            roots: self
                .jail
                .roots()
                .map(|r| bytes::Bytes::copy_from_slice(r.as_os_str().as_encoded_bytes()))
                .collect(),
            retiring: self.execs.retiring(),
            paused: crate::pause::is_paused(),
            pid: std::process::id(),
            egress_refused_unattended: self.egress.refused_unattended(),
            startup: crate::timeline::marks()
                .into_iter()
                .map(|(stage, monotonic_ns)| v1::StartupMark {
                    stage: stage.into(),
                    monotonic_ns,
                })
                .collect(),
            rss_bytes,
            peak_rss_bytes,
            limits: self
                .limits()
                .named()
                .into_iter()
                .map(|(name, value)| v1::Limit {
                    name: name.into(),
                    value,
                })
                .collect(),
        })
    }
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn health(&self, req: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        self.health_response(req.get_ref().probe_child).await.map(Response::new)
    }

    async fn reserve_exec(&self, req: Request<ReserveExecRequest>) -> Result<Response<ReserveExecResponse>, Status> {
        self.admit("reserve_exec", namzu_proto::features::EXEC)?;
        let name = req.into_inner().execution_id;
        if !name.is_empty() {
            self.feature("reserve_exec", namzu_proto::features::EXEC_ATTACH)?;
        }
        let (execution_id, existing) = self
            .execs
            .reserve((!name.is_empty()).then_some(name.as_str()))
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(ReserveExecResponse {
            execution_id,
            existing,
            boot_id: crate::boot_id().to_owned(),
        }))
    }

    type ExecStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<ExecOutput, Status>> + Send>>;

    async fn exec(&self, req: Request<Streaming<ExecInput>>) -> Result<Response<Self::ExecStream>, Status> {
        let mut input = req.into_inner();
        let start = match input.next().await {
            Some(Ok(ExecInput {
                msg: Some(exec_input::Msg::Start(s)),
            })) => s,
            Some(Err(e)) => return Err(e),
            _ => return Err(agent_err(Kind::Protocol, "exec", "first message must be start").into_status()),
        };
        let (first, rest) = self.start_exec(start, Box::pin(input)).await?;
        Ok(Response::new(Box::pin(
            futures::stream::iter(first).chain(ReceiverStream::new(rest)),
        )))
    }

    type AttachExecStream = ReceiverStream<Result<ExecOutput, Status>>;

    async fn attach_exec(
        &self,
        req: Request<v1::AttachExecRequest>,
    ) -> Result<Response<Self::AttachExecStream>, Status> {
        self.admit("attach_exec", namzu_proto::features::EXEC_ATTACH)?;
        let (tx, rx) = mpsc::channel(16);
        let execs = self.execs.clone();
        tokio::spawn(async move { execs.attach(req.into_inner(), tx).await });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn list_execs(&self, _req: Request<v1::Empty>) -> Result<Response<v1::ListExecsResponse>, Status> {
        self.admit("list_execs", namzu_proto::features::EXEC_LIST)?;
        Ok(Response::new(v1::ListExecsResponse {
            executions: self.execs.list(),
        }))
    }

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelResponse>, Status> {
        self.admit("cancel", namzu_proto::features::EXEC_CANCEL)?;
        let outcome = self
            .execs
            .cancel(&req.into_inner().execution_id)
            .await
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(CancelResponse {
            outcome: outcome as i32,
            boot_id: crate::boot_id().to_owned(),
        }))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<WriteFileRequest>>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        const OP: &str = "write_file";
        self.admit("write_file", namzu_proto::features::FILES_WRITE)?;
        let mut input = req.into_inner();
        let begin = match input.next().await {
            Some(Ok(WriteFileRequest {
                msg: Some(write_file_request::Msg::Begin(b)),
            })) => b,
            Some(Err(e)) => return Err(e),
            _ => return Err(agent_err(Kind::Protocol, OP, "first message must be begin").into_status()),
        };
        let max = self.limits().max_write_bytes;
        let mut pending = self
            .blocking(OP, move |jail| {
                files::PendingWrite::begin(jail, &begin.path, begin.mode, begin.create_parents, max)
            })
            .await?;
        // Dropping `pending` on any early return removes the temporary.
        while let Some(msg) = input.next().await {
            match msg?.msg {
                Some(write_file_request::Msg::Data(data)) => {
                    pending = self
                        .blocking(OP, move |_| {
                            pending.write(&data)?;
                            Ok(pending)
                        })
                        .await?;
                }
                Some(write_file_request::Msg::Commit(c)) => {
                    let (bytes_written, mode) = self.blocking(OP, move |_| pending.commit(c.total_bytes)).await?;
                    return Ok(Response::new(WriteFileResponse {
                        bytes_written,
                        mode,
                        boot_id: crate::boot_id().to_owned(),
                    }));
                }
                _ => return Err(agent_err(Kind::Protocol, OP, "unexpected message").into_status()),
            }
        }
        Err(agent_err(Kind::Protocol, OP, "stream ended without commit; nothing was replaced").into_status())
    }

    async fn read_file(&self, req: Request<ReadFileRequest>) -> Result<Response<ReadFileResponse>, Status> {
        self.admit("read_file", namzu_proto::features::FILES_READ)?;
        let r = req.into_inner();
        let max = self.limits().max_read_range_bytes;
        let (data, file_size, eof) = self
            .blocking("read_file", move |jail| {
                files::read_file(jail, &r.path, r.offset, r.length, max)
            })
            .await?;
        Ok(Response::new(ReadFileResponse {
            data: data.into(),
            file_size,
            eof,
            boot_id: crate::boot_id().to_owned(),
        }))
    }

    type ReadFileStreamStream = ReceiverStream<Result<FileChunk, Status>>;

    async fn read_file_stream(
        &self,
        req: Request<ReadFileStreamRequest>,
    ) -> Result<Response<Self::ReadFileStreamStream>, Status> {
        const OP: &str = "read_file_stream";
        let r = req.into_inner();
        let file = self.open_for_stream(OP, r.path.clone()).await?;
        // Capacity 2: with HTTP/2 flow control this bounds what the agent holds
        // for one stream to a few chunks, whatever the file size.
        let (tx, rx) = mpsc::channel(2);
        tokio::task::spawn_blocking(move || {
            let mut offset = r.offset;
            let mut left = r.length.unwrap_or(u64::MAX);
            while left > 0 {
                let want = left.min(files::STREAM_CHUNK as u64);
                let item = match files::read_at(&file, offset, want, files::STREAM_CHUNK) {
                    Ok((data, eof)) => {
                        let n = data.len() as u64;
                        let chunk = FileChunk {
                            offset,
                            data: Bytes::from(data),
                        };
                        offset += n;
                        left -= n;
                        if n > 0 && tx.blocking_send(Ok(chunk)).is_err() {
                            return;
                        }
                        if eof {
                            return;
                        }
                        continue;
                    }
                    Err(e) => Err(files::os_err(
                        OP,
                        &r.path,
                        rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
                    )
                    .into_status()),
                };
                let _ = tx.blocking_send(item);
                return;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn list_files(&self, req: Request<ListFilesRequest>) -> Result<Response<ListFilesResponse>, Status> {
        self.admit("list_files", namzu_proto::features::FILES_LIST)?;
        let r = req.into_inner();
        let max = self.limits().max_list_entries;
        let entries = self
            .blocking("list_files", move |jail| files::list(jail, &r.path, max))
            .await?;
        Ok(Response::new(ListFilesResponse { entries }))
    }

    type WatchDirStream = ReceiverStream<Result<v1::WatchEvent, Status>>;

    async fn watch_dir(&self, req: Request<v1::WatchDirRequest>) -> Result<Response<Self::WatchDirStream>, Status> {
        self.admit("watch_dir", namzu_proto::features::FILES_WATCH)?;
        let r = req.into_inner();
        let (tx, rx) = mpsc::channel(256);
        // Watches are set up before the answer, so a missing directory fails
        // the call itself and events after it returns are never missed.
        crate::files_watch::start(
            self.jail.clone(),
            r.path.to_vec(),
            r.recursive,
            self.limits().max_walk_entries,
            tx,
        )
        .map_err(IntoStatus::into_status)?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type WalkFilesStream = ReceiverStream<Result<FileEntry, Status>>;

    async fn walk_files(&self, req: Request<WalkFilesRequest>) -> Result<Response<Self::WalkFilesStream>, Status> {
        const OP: &str = "walk_files";
        self.admit("walk_files", namzu_proto::features::FILES_WALK)?;
        let r = req.into_inner();
        let cap = self.limits().max_walk_entries;
        let max_entries = match u64::from(r.max_entries) {
            0 => cap,
            n => n.min(cap),
        };
        // A missing root must fail the call itself, not arrive mid-stream.
        let root = r.root.clone();
        self.blocking(OP, move |jail| files::stat(jail, &root).map(|_| ()))
            .await?;
        let (tx, rx) = mpsc::channel(64);
        let jail = self.jail.clone();
        tokio::task::spawn_blocking(move || {
            let res = files::walk(&jail, &r.root, max_entries, r.max_depth, r.include_hidden, |e| {
                tx.blocking_send(Ok(e)).is_ok()
            });
            if let Err(e) = res {
                let _ = tx.blocking_send(Err(e.into_status()));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn start_session(&self, req: Request<v1::StartSessionRequest>) -> Result<Response<v1::SessionInfo>, Status> {
        self.admit("start_session", namzu_proto::features::SESSIONS)?;
        crate::pause::refuse("start_session").map_err(IntoStatus::into_status)?;
        let info = self
            .sessions
            .start_session(req.into_inner())
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(info))
    }

    async fn read_session(
        &self,
        req: Request<v1::ReadSessionRequest>,
    ) -> Result<Response<v1::ReadSessionResponse>, Status> {
        self.admit("read_session", namzu_proto::features::SESSIONS)?;
        let r = self.sessions.read(&req.into_inner()).map_err(IntoStatus::into_status)?;
        Ok(Response::new(r))
    }

    async fn list_sessions(&self, _: Request<Empty>) -> Result<Response<v1::ListSessionsResponse>, Status> {
        self.admit("list_sessions", namzu_proto::features::SESSIONS)?;
        Ok(Response::new(v1::ListSessionsResponse {
            sessions: self.sessions.list(),
        }))
    }

    async fn kill_session(&self, req: Request<v1::KillSessionRequest>) -> Result<Response<v1::SessionInfo>, Status> {
        use nix::sys::signal::Signal;
        use v1::kill_session_request::Sig;
        self.admit("kill_session", namzu_proto::features::SESSIONS)?;
        let r = req.into_inner();
        let sig = match r.signal() {
            Sig::Kill => Signal::SIGKILL,
            Sig::Int => Signal::SIGINT,
            Sig::Hup => Signal::SIGHUP,
            Sig::Term | Sig::Unspecified => Signal::SIGTERM,
        };
        let info = self
            .sessions
            .kill(&r.session_id, sig)
            .await
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(info))
    }

    async fn quiesce(&self, req: Request<v1::QuiesceRequest>) -> Result<Response<v1::QuiesceResponse>, Status> {
        self.admit("quiesce", namzu_proto::features::QUIESCE)?;
        let grace = match req.into_inner().grace_ms {
            0 => self.limits().shutdown_grace(),
            ms => std::time::Duration::from_millis(ms),
        };
        self.execs.set_quiescing(true);
        let result = crate::quiesce::quiesce(grace).await;
        self.execs.set_quiescing(false);
        let (stopped, rounds) = result.map_err(IntoStatus::into_status)?;
        tracing::info!(stopped = stopped.len(), rounds, "quiesced");
        Ok(Response::new(v1::QuiesceResponse { stopped, rounds }))
    }

    async fn flush(&self, req: Request<v1::FlushRequest>) -> Result<Response<v1::FlushResponse>, Status> {
        self.admit("flush", namzu_proto::features::FLUSH)?;
        let timeout = match req.into_inner().timeout_ms {
            0 => std::time::Duration::from_secs(30),
            ms => std::time::Duration::from_millis(ms),
        };
        let root = self.cfg.roots.first().cloned().unwrap_or_else(|| "/".into());
        let took = crate::quiesce::flush(&root, timeout)
            .await
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(v1::FlushResponse {
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    async fn pause(&self, _req: Request<Empty>) -> Result<Response<v1::PauseResponse>, Status> {
        self.admit("pause", namzu_proto::features::PAUSE)?;
        let (stopped, rounds) = crate::pause::pause().await.map_err(IntoStatus::into_status)?;
        Ok(Response::new(v1::PauseResponse { stopped, rounds }))
    }

    async fn resume(&self, _req: Request<Empty>) -> Result<Response<v1::ResumeResponse>, Status> {
        self.admit("resume", namzu_proto::features::PAUSE)?;
        let (continued, paused_for) = crate::pause::resume().await;
        Ok(Response::new(v1::ResumeResponse {
            continued,
            paused_ms: u64::try_from(paused_for.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    type TerminalStream = ReceiverStream<Result<v1::TerminalOutput, Status>>;

    async fn terminal(
        &self,
        req: Request<Streaming<v1::TerminalInput>>,
    ) -> Result<Response<Self::TerminalStream>, Status> {
        const OP: &str = "terminal";
        self.admit(OP, namzu_proto::features::TERMINAL)?;
        let mut input = req.into_inner();
        let first = match input.next().await {
            Some(Ok(v1::TerminalInput { msg: Some(m) })) => m,
            Some(Err(e)) => return Err(e),
            _ => return Err(agent_err(Kind::Protocol, OP, "first message must be open or attach").into_status()),
        };
        if matches!(first, v1::terminal_input::Msg::Open(_)) {
            crate::pause::refuse(OP).map_err(IntoStatus::into_status)?;
        }
        let (tx, rx) = mpsc::channel(16);
        match first {
            v1::terminal_input::Msg::Open(open) if open.persistent => {
                self.feature(OP, namzu_proto::features::SESSIONS)?;
                self.sessions
                    .open_terminal(&self.execs.reaper(), &open)
                    .map_err(IntoStatus::into_status)?;
                let sessions = self.sessions.clone();
                let beats = open.host_heartbeats;
                tokio::spawn(async move { sessions.attach(&open.session_id, 0, beats, input, tx).await });
            }
            v1::terminal_input::Msg::Open(open) => {
                let (reaper, cwd) = (self.execs.reaper(), self.execs.default_cwd().to_path_buf());
                let heartbeat = self.limits().heartbeat();
                tokio::spawn(crate::terminal::run(reaper, heartbeat, cwd, open, input, tx));
            }
            v1::terminal_input::Msg::Attach(a) => {
                self.feature(OP, namzu_proto::features::SESSIONS)?;
                let sessions = self.sessions.clone();
                tokio::spawn(async move {
                    sessions
                        .attach(&a.session_id, a.from_offset, a.host_heartbeats, input, tx)
                        .await
                });
            }
            _ => return Err(agent_err(Kind::Protocol, OP, "first message must be open or attach").into_status()),
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type EgressStream = ReceiverStream<Result<v1::EgressAsk, Status>>;

    async fn egress(&self, req: Request<Streaming<v1::EgressVerdict>>) -> Result<Response<Self::EgressStream>, Status> {
        self.admit("egress", namzu_proto::features::EGRESS)?;
        Ok(Response::new(ReceiverStream::new(self.egress.attach(req.into_inner()))))
    }

    type EgressSpliceStream = ReceiverStream<Result<v1::TcpOutput, Status>>;

    async fn egress_splice(
        &self,
        req: Request<Streaming<v1::EgressSpliceInput>>,
    ) -> Result<Response<Self::EgressSpliceStream>, Status> {
        self.admit("egress_splice", namzu_proto::features::EGRESS)?;
        let rx = self.egress.splice(req.into_inner()).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type TcpConnectStream = ReceiverStream<Result<v1::TcpOutput, Status>>;

    async fn tcp_connect(
        &self,
        req: Request<Streaming<v1::TcpInput>>,
    ) -> Result<Response<Self::TcpConnectStream>, Status> {
        const OP: &str = "tcp_connect";
        self.admit(OP, namzu_proto::features::TCP_CONNECT)?;
        // Nothing in the sandbox would accept it.
        crate::pause::refuse(OP).map_err(IntoStatus::into_status)?;
        let mut input = req.into_inner();
        let (port, host_beats) = match input.next().await {
            Some(Ok(v1::TcpInput {
                msg: Some(v1::tcp_input::Msg::Connect(c)),
            })) => (c.port, c.host_heartbeats),
            Some(Err(e)) => return Err(e),
            _ => return Err(agent_err(Kind::Protocol, OP, "first message must be connect").into_status()),
        };
        let port = u16::try_from(port).ok().filter(|p| *p != 0).ok_or_else(|| {
            let mut e = agent_err(Kind::InvalidArgument, OP, "port must be 1-65535");
            e.port = port;
            e.into_status()
        })?;
        let beats = crate::tcp::Beats {
            every: self.limits().heartbeat(),
            from_host: host_beats,
        };
        let rx = crate::tcp::relay(port, input, beats)
            .await
            .map_err(IntoStatus::into_status)?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn stat(&self, req: Request<StatRequest>) -> Result<Response<FileEntry>, Status> {
        self.admit("stat", namzu_proto::features::FILES_STAT)?;
        let r = req.into_inner();
        Ok(Response::new(
            self.blocking("stat", move |jail| files::stat(jail, &r.path)).await?,
        ))
    }

    async fn mkdir(&self, req: Request<MkdirRequest>) -> Result<Response<Empty>, Status> {
        self.admit("mkdir", namzu_proto::features::FILES_MKDIR)?;
        let r = req.into_inner();
        self.blocking("mkdir", move |jail| files::mkdir(jail, &r.path, r.parents, r.mode))
            .await?;
        Ok(Response::new(Empty {}))
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<Empty>, Status> {
        self.admit("remove", namzu_proto::features::FILES_REMOVE)?;
        let r = req.into_inner();
        self.blocking("remove", move |jail| files::remove(jail, &r.path, r.recursive))
            .await?;
        Ok(Response::new(Empty {}))
    }

    async fn rename(&self, req: Request<RenameRequest>) -> Result<Response<Empty>, Status> {
        self.admit("rename", namzu_proto::features::FILES_RENAME)?;
        let r = req.into_inner();
        self.blocking("rename", move |jail| files::rename(jail, &r.from, &r.to, r.no_replace))
            .await?;
        Ok(Response::new(Empty {}))
    }
}
