//! Named sessions that outlive the link, and quiesce and flush.

use super::link::*;

impl AgentClient {
    /// Starts a command in a named session that outlives this link.
    pub async fn start_session(&self, spec: SessionSpec) -> Result<SessionInfo> {
        const OP: &str = "start_session";
        self.require(OP, feat::SESSIONS)?;
        let b = |s: &std::ffi::OsStr| Bytes::copy_from_slice(s.as_bytes());
        let req = v1::StartSessionRequest {
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
        let r = self.rpc().start_session(req).await.map_err(|s| self.status(OP, s))?;
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

    /// Every session the agent holds.
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

    /// Stops every process in the sandbox but the agent until
    /// [`Self::resume`]; nothing new starts meanwhile
    /// ([`Error::SandboxPaused`]). Pausing a paused sandbox is done.
    pub async fn pause(&self) -> Result<PauseReport> {
        const OP: &str = "pause";
        self.require(OP, feat::PAUSE)?;
        let r = self
            .rpc()
            .pause(v1::Empty {})
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(PauseReport {
            stopped: r.stopped,
            rounds: r.rounds,
        })
    }

    /// Continues what [`Self::pause`] stopped; resuming a running sandbox
    /// is done.
    pub async fn resume(&self) -> Result<ResumeReport> {
        const OP: &str = "resume";
        self.require(OP, feat::PAUSE)?;
        let r = self
            .rpc()
            .resume(v1::Empty {})
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        Ok(ResumeReport {
            continued: r.continued,
            paused_for: Duration::from_millis(r.paused_ms),
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
