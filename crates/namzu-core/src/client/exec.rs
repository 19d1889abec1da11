//! Commands: run, stream, detachable executions (reserve, attach by offset, cancel), and the stream a running command is read through.

use super::link::*;
use super::side_exec::OutputStream;

impl AgentClient {
    /// Runs a command and collects its output.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        let stream = self.exec_stream(req).await?;
        collect(stream, "exec").await
    }

    /// Starts a command and streams its output. The id is reserved first, so
    /// a cancel that races the start is never lost.
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream> {
        const OP: &str = "exec";
        if req.detachable.is_some() {
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
        // The agent reserves the id and names it in `Started`, saving a
        // round trip; a cancel that comes before `Started` is sent once it
        // arrives (the command then started, and its kill is confirmed),
        // so none is lost. A token cancelled already reserves first and
        // cancels the reservation, so nothing is ever spawned.
        let mut execution_id = String::new();
        let reserve_first = cancel.as_ref().is_some_and(CancellationToken::is_cancelled);
        if reserve_first {
            let r = self
                .rpc()
                .reserve_exec(v1::ReserveExecRequest::default())
                .await
                .map_err(|s| self.status("reserve_exec", s))?
                .into_inner();
            self.answered_by(&r.boot_id);
            execution_id = r.execution_id;
            start.execution_id = execution_id.clone();
        }

        // From here a cancel is answered by the agent even before the start.
        // A token cancelled already is sent first, so the start is answered
        // "cancelled" without ever spawning the command.
        if reserve_first {
            self.cancel_or_retire(&execution_id).await?;
        }
        let mut canceller = if reserve_first {
            cancel
                .clone()
                .map(|token| tokio::spawn(cancel_on(self.clone(), execution_id.clone(), token, false)))
        } else {
            None
        };
        // A command with nothing to stream in, on a local socket, runs on a
        // stream of its own ([`super::side_exec`]); any other on the link.
        let side = if stdin_stream.is_none() && !reserve_first {
            let mut own = start.clone();
            // Its socket closing says the host is gone; no beats needed.
            own.host_heartbeats = false;
            self.side_exec(&own).await?
        } else {
            None
        };
        let (first, out, input_task) = match side {
            Some((first, out)) => (Some(first), out, None),
            None => {
                // The forwarder keeps the request half open for the whole
                // call; the stream aborts it when dropped, which lets HTTP/2
                // reset the call so the agent kills the command instead of
                // running it unwatched.
                let (input, input_task) = exec_input_stream(start, stdin_stream, self.inner.heartbeat);
                let out = self
                    .rpc()
                    .exec(input)
                    .await
                    .map_err(|s| self.status(OP, s))?
                    .into_inner();
                let me = self.clone();
                let mut out: OutputStream = Box::pin(out.map(move |m| m.map_err(|s| me.status(OP, s))));
                let first = out.next().await.transpose()?;
                (first, out, Some(input_task))
            }
        };
        let pid = match first {
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Started(s)),
            }) => {
                if execution_id.is_empty() {
                    execution_id = s.execution_id;
                }
                self.answered_by(&s.boot_id);
                if canceller.is_none() {
                    canceller =
                        cancel.map(|token| tokio::spawn(cancel_on(self.clone(), execution_id.clone(), token, false)));
                }
                Some(s.pid)
            }
            // Cancelled before start: the agent answers exit at once.
            Some(v1::ExecOutput {
                msg: Some(exec_output::Msg::Exit(x)),
            }) => {
                if let Some(t) = input_task {
                    t.abort();
                }
                return Ok(ExecStream::finished(
                    self.clone(),
                    execution_id,
                    exit_summary(x),
                    canceller,
                ));
            }
            other => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: format!("expected started, got {other:?}"),
                });
            }
        };
        Ok(ExecStream {
            execution_id,
            pid,
            boot_id: self.boot_id(),
            client: self.clone(),
            out: Some(out),
            driven: None,
            next_offset: 0,
            pending_exit: None,
            canceller,
            input_task,
            silence: silence_timer(self.inner.heartbeat),
            after_hold: false,
        })
    }

    /// A detachable execution (see [`Detachable`]): started by name, it outlives
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
        let detach = req.detachable.take().unwrap_or_default();
        let id = detach
            .execution_id
            .clone()
            .unwrap_or_else(|| format!("e-{:016x}", rand::random::<u64>()));
        let cancel = req.cancel.clone();
        let (mut start, stdin_stream) = exec_start(req);
        start.execution_id = id.clone();
        start.detachable = true;
        start.host_heartbeats = self.inner.heartbeat.is_some();
        if cancel.is_some() {
            // Reserved by name, so a cancel racing the start is remembered.
            let r = self
                .rpc()
                .reserve_exec(v1::ReserveExecRequest {
                    execution_id: id.clone(),
                })
                .await
                .map_err(|s| self.status("reserve_exec", s))?;
            self.answered_by(&r.into_inner().boot_id);
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

    /// One AttachExec call, up to its `Started`.
    async fn attach_raw(&self, id: &str, from: u64, follow: bool) -> Result<Opened> {
        const OP: &str = "attach_execution";
        let req = v1::AttachExecRequest {
            execution_id: id.into(),
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
            Error::UnknownExecution { execution_id, .. } => Error::ExecutionNotAttachable {
                execution_id,
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
            }) => {
                self.answered_by(&s.boot_id);
                Ok(Opened::Following(s.pid, Box::new(out)))
            }
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
        let execution_id = follow.id.clone();
        let next_offset = follow.at;
        let driver = tokio::spawn(drive(self.clone(), follow, out, tx, input_task));
        ExecStream {
            execution_id,
            pid: Some(pid),
            boot_id: self.boot_id(),
            client: self.clone(),
            out: None,
            driven: Some((rx, driver)),
            next_offset,
            pending_exit: None,
            canceller,
            input_task: None,
            silence: None,
            after_hold: false,
        }
    }

    /// Cancels an execution: kills its process group and waits for the
    /// agent to confirm. An unconfirmed kill retires the sandbox.
    pub(crate) async fn cancel_or_retire(&self, execution_id: &str) -> Result<CancelOutcome> {
        const OP: &str = "cancel";
        self.open(OP)?;
        match self.cancel_rpc(OP, execution_id).await? {
            Some(outcome) => Ok(outcome),
            None => Err(self.retire(Error::RemoteCancellationUnknown {
                execution_id: execution_id.into(),
                retirement: None,
            })),
        }
    }
}

/// A running command's output, ending with [`ExecEvent::Exit`].
pub struct ExecStream {
    /// The execution's id.
    pub execution_id: String,
    /// Pid inside the sandbox; `None` if it never started.
    pub pid: Option<u32>,
    /// The boot id of the agent that started (or answered for) it: a link
    /// that later reaches another boot id reaches an agent that never
    /// knew this command.
    pub boot_id: String,
    client: AgentClient,
    out: Option<OutputStream>,
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
    /// The silence timer last ran out while the sandbox was held.
    after_hold: bool,
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
        execution_id: String,
        exit: ExitSummary,
        canceller: Option<tokio::task::JoinHandle<Result<CancelOutcome>>>,
    ) -> Self {
        Self {
            execution_id,
            pid: None,
            boot_id: client.boot_id(),
            client,
            out: None,
            driven: None,
            next_offset: 0,
            pending_exit: Some(exit),
            canceller,
            input_task: None,
            silence: None,
            after_hold: false,
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
                let fired = match self.silence.as_mut() {
                    Some((_, timer)) => timer.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                let held = fired && self.client.held();
                // Held still on purpose, or the hold ended within the last
                // interval: silence counts from a whole interval after it.
                if held || (fired && std::mem::take(&mut self.after_hold)) {
                    self.after_hold |= held;
                    if let Some((d, timer)) = self.silence.as_mut() {
                        let d = *d;
                        timer.as_mut().reset(tokio::time::Instant::now() + d);
                        let _ = timer.as_mut().poll(cx);
                    }
                } else if fired {
                    self.out = None;
                    return Poll::Ready(Some(Err(Error::LinkLost {
                        op: "exec".into(),
                        message: "no word from the agent in three heartbeat intervals".into(),
                    })));
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
        polled: std::task::Poll<Option<Result<v1::ExecOutput>>>,
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
            Poll::Ready(Some(Err(e))) => {
                self.out = None;
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
        execution_id: String::new(),
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
        detachable: false,
    };
    (start, stream)
}

async fn cancel_on(
    client: AgentClient,
    execution_id: String,
    token: CancellationToken,
    detached: bool,
) -> Result<CancelOutcome> {
    token.cancelled().await;
    if detached {
        client.cancel_execution(&execution_id).await
    } else {
        client.cancel_or_retire(&execution_id).await
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
                    execution_id: stream.execution_id.clone(),
                    boot_id: stream.boot_id.clone(),
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
            let Some(next) = client.within(silence, out.message()).await else {
                break Error::LinkLost {
                    op: "exec".into(),
                    message: "no word from the agent in three heartbeat intervals".into(),
                };
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
                    let e = Error::ExecutionLinkLost {
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

pub(super) fn exit_summary(x: v1::ExecExit) -> ExitSummary {
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
