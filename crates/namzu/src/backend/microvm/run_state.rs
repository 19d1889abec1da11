//! Whether a VM runs: the pause of the whole machine (its vCPUs stopped by
//! QMP `stop`, continued by `cont`), owned by the anchor.
//!
//! The anchor is the one process that sees every host link (it carries
//! them into the port) and holds the control port, so it is the one that
//! pauses: it serves `run.sock` (0600) in the state directory, one line
//! each way (`pause`, `resume` or `state`; `ok paused`, `ok running <ms
//! paused>` or `err <words>`). While the VM is paused the anchor
//! forwards nothing from the host into it (whatever a host sends waits in
//! the anchor, as it would in a full port), and the file [`PAUSED_FILE`]
//! says so to every host process: their links count the VM's silence as
//! held, not dead, and refuse new operations with `SandboxPaused`. On
//! `cont` the anchor tells the guest the host's time (its clock stood
//! still with its vCPUs) on the control port, then lets the held bytes on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Mutex};

use super::qmp::{Qmp, QmpError};

/// The anchor's run-state socket, in the sandbox's state directory.
pub const RUN_SOCKET: &str = "run.sock";
/// Present while the VM is paused: the time of the pause (ms since the
/// epoch). Removed before the held bytes go on.
pub const PAUSED_FILE: &str = "paused";
/// Bound on one QMP command of a pause or a resume.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest request line read.
const MAX_REQUEST: u64 = 64;

/// Whether the VM at `dir` is paused, by the file the anchor keeps.
pub fn is_paused(dir: &Path) -> bool {
    dir.join(PAUSED_FILE).exists()
}

/// The anchor's side: the VM's run state and what a change of it touches.
pub struct RunState {
    running: watch::Sender<bool>,
    paused_at: std::sync::Mutex<Option<Instant>>,
    /// Serialises pause and resume: each is a QMP exchange, then a file.
    change: Mutex<()>,
    qmp: PathBuf,
    dir: PathBuf,
    /// The control port's host end, for the clock line.
    ctl: Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
}

impl RunState {
    /// A running VM whose QMP socket is `qmp`, state in `dir`, control
    /// port written through `ctl`.
    pub fn new(qmp: PathBuf, dir: PathBuf, ctl: Box<dyn AsyncWrite + Send + Unpin>) -> Arc<Self> {
        // A pause an earlier anchor left behind is no pause of this VM.
        let _ = std::fs::remove_file(dir.join(PAUSED_FILE));
        Arc::new(Self {
            running: watch::Sender::new(true),
            paused_at: std::sync::Mutex::new(None),
            change: Mutex::new(()),
            qmp,
            dir,
            ctl: Mutex::new(ctl),
        })
    }

    /// Resolves while (or once) the VM runs: where a host link's bytes
    /// wait during a pause.
    pub async fn wait_running(&self) {
        let mut rx = self.running.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Serves `run.sock` until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::UnixListener) {
        while let Some((conn, _)) = namzu_proto::accept::next(|| listener.accept(), "microvm run state").await {
            let me = self.clone();
            tokio::spawn(async move {
                let (r, mut w) = conn.into_split();
                let mut line = String::new();
                let read = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(r, MAX_REQUEST))
                    .read_line(&mut line)
                    .await;
                let reply = match read {
                    Ok(_) => me.answer(line.trim()).await,
                    Err(e) => format!("err {e}"),
                };
                let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
            });
        }
    }

    async fn answer(&self, verb: &str) -> String {
        let _one = self.change.lock().await;
        let done = match verb {
            "pause" => self.pause().await,
            "resume" => self.resume().await,
            "state" => Ok(self.describe(None)),
            other => Err(format!("unknown request {other:?}")),
        };
        done.unwrap_or_else(|e| format!("err {}", e.replace('\n', " ")))
    }

    fn describe(&self, paused_for: Option<Duration>) -> String {
        if *self.running.borrow() {
            format!("ok running {}", paused_for.unwrap_or_default().as_millis())
        } else {
            "ok paused".into()
        }
    }

    async fn pause(&self) -> Result<String, String> {
        if !*self.running.borrow() {
            return Ok(self.describe(None));
        }
        // Held first: nothing more goes in while the vCPUs stop.
        self.running.send_replace(false);
        if let Err(e) = self.qmp("stop").await {
            self.running.send_replace(true);
            return Err(e.to_string());
        }
        *self.paused_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        if let Err(e) = std::fs::write(self.dir.join(PAUSED_FILE), ms.to_string()) {
            // Hosts could not tell the pause from a dead VM: undo it.
            let _ = self.qmp("cont").await;
            self.running.send_replace(true);
            return Err(format!("{PAUSED_FILE}: {e}"));
        }
        tracing::info!("VM paused");
        Ok(self.describe(None))
    }

    async fn resume(&self) -> Result<String, String> {
        if *self.running.borrow() {
            return Ok(self.describe(None));
        }
        self.qmp("cont").await.map_err(|e| e.to_string())?;
        let line = namzu_proto::mux_sync::ClockLine {
            unix_ns: namzu_proto::mux_sync::now_unix_ns(),
        };
        if let Err(e) = self.ctl.lock().await.write_all(&line.encode()).await {
            tracing::warn!("the guest's clock was not told the host's time: {e}");
        }
        let _ = std::fs::remove_file(self.dir.join(PAUSED_FILE));
        let paused_for = self
            .paused_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .map(|t| t.elapsed());
        self.running.send_replace(true);
        tracing::info!(?paused_for, "VM continued");
        Ok(self.describe(paused_for))
    }

    async fn qmp(&self, command: &'static str) -> Result<(), QmpError> {
        let sock = self.qmp.clone();
        tokio::task::spawn_blocking(move || Qmp::connect(&sock, QMP_TIMEOUT)?.execute(command, None).map(drop))
            .await
            .map_err(|e| QmpError::Protocol(format!("qmp task: {e}")))?
    }
}

/// What the anchor said to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunReply {
    /// The VM is paused.
    Paused,
    /// The VM runs; after a resume, how long it was paused.
    Running(Duration),
}

/// Asks the anchor of the VM at `dir` to `verb` (`pause`, `resume`,
/// `state`). `Ok(None)`: the anchor serves no run state (one started by an
/// older namzu).
pub async fn request(dir: &Path, verb: &str) -> std::io::Result<Option<RunReply>> {
    let sock = dir.join(RUN_SOCKET);
    let conn = match tokio::net::UnixStream::connect(&sock).await {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let (r, mut w) = conn.into_split();
    w.write_all(format!("{verb}\n").as_bytes()).await?;
    let mut line = String::new();
    // A pause or resume is two QMP exchanges at most.
    tokio::time::timeout(QMP_TIMEOUT * 3, tokio::io::BufReader::new(r).read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the VM's anchor did not answer"))??;
    parse_reply(line.trim()).map(Some)
}

fn parse_reply(line: &str) -> std::io::Result<RunReply> {
    let mut f = line.splitn(3, ' ');
    match (f.next(), f.next(), f.next()) {
        (Some("ok"), Some("paused"), None) => Ok(RunReply::Paused),
        (Some("ok"), Some("running"), Some(ms)) => ms
            .parse()
            .map(|ms| RunReply::Running(Duration::from_millis(ms)))
            .map_err(|_| std::io::Error::other(format!("the anchor said {line:?}"))),
        (Some("err"), ..) => Err(std::io::Error::other(line.trim_start_matches("err ").to_string())),
        _ => Err(std::io::Error::other(format!("the anchor said {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_errors_keep_their_words() {
        assert_eq!(parse_reply("ok paused").unwrap(), RunReply::Paused);
        assert_eq!(
            parse_reply("ok running 1500").unwrap(),
            RunReply::Running(Duration::from_millis(1500))
        );
        let e = parse_reply("err qmp stop: GenericError: no").unwrap_err();
        assert_eq!(e.to_string(), "qmp stop: GenericError: no");
        assert!(parse_reply("ok running x").is_err());
        assert!(parse_reply("hello").is_err());
    }
}
