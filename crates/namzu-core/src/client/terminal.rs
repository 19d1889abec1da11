//! Terminals: opened, attached by offset, written, resized, closed.

use super::exec::exit_summary;
use super::link::*;

impl AgentClient {
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
            }) => {
                self.answered_by(&s.boot_id);
                s.pid
            }
            other => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: format!("expected opened, got {other:?}"),
                })
            }
        };
        let beats = self.inner.heartbeat.map(|every| {
            beat_every(tx.clone(), every, || v1::TerminalInput {
                msg: Some(v1::terminal_input::Msg::Heartbeat(v1::Empty {})),
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

    /// Types `data` into the terminal. Fails once the terminal's call has
    /// ended (it exited, or the link failed); what ended it is still read
    /// from [`Terminal::next`], so a caller should stop writing, not give up.
    pub async fn write(&mut self, data: impl Into<Bytes>) -> Result<()> {
        self.send(v1::terminal_input::Msg::Input(data.into())).await
    }

    /// Sets the terminal size.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        self.send(v1::terminal_input::Msg::Resize(v1::TerminalSize {
            cols: u32::from(cols),
            rows: u32::from(rows),
        }))
        .await
    }

    /// The next output or the exit; `None` after the exit. A plain terminal
    /// whose agent goes silent for three heartbeat intervals resolves as
    /// lost (exit code -1); a persistent one as [`Error::TerminalLinkLost`].
    pub async fn next(&mut self) -> Option<Result<TerminalEvent>> {
        if self.ended {
            return None;
        }
        let msg = loop {
            let (client, silence) = (self.client.clone(), self.silence);
            let Some(got) = client.within(silence, self.out.message()).await else {
                self.ended = true;
                tracing::warn!("terminal: no word from the agent in three heartbeat intervals");
                return Some(match &self.session {
                    Some(id) => Err(Error::TerminalLinkLost {
                        session_id: id.clone(),
                        offset: self.next_offset,
                    }),
                    None => Ok(TerminalEvent::Exit(ExitStatus {
                        code: Some(-1),
                        ..Default::default()
                    })),
                });
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
                    (Error::LinkLost { .. }, Some(id)) => Error::TerminalLinkLost {
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
