//! The host's listener for an agent that dials back
//! ([`namzu_proto::back`]): where the boundary lets the sandbox connect out
//! to a host unix socket but not listen on one (gVisor).
//!
//! A [`BackListener`] binds one socket in the directory the agent scans,
//! challenges every caller (proof of the token, with a fresh nonce) within
//! a deadline, and queues the ones that proved themselves, a bounded few.
//! [`BackListener::dial`] is this process's "connect": it takes the next
//! queued standby, skipping any the agent closed meanwhile. Dropping the
//! listener removes its socket, so the agent stops dialing it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Mutex};

/// Proven standbys queued at once; the agent keeps two per listener, so a
/// few more only ever come from a misbehaving peer.
const QUEUE: usize = 4;
/// Bound on a caller's answer to the challenge.
const CHALLENGE_DEADLINE: Duration = Duration::from_secs(2);
/// Callers in their challenge at once; past it a caller is closed at once,
/// so a flood of silent connections holds no more than this many tasks.
const MAX_CHALLENGES: usize = 16;

/// One host process's socket for an agent to dial.
pub struct BackListener {
    path: PathBuf,
    ready: Mutex<mpsc::Receiver<UnixStream>>,
    accept: tokio::task::JoinHandle<()>,
    wait: Duration,
}

impl std::fmt::Debug for BackListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackListener").field("path", &self.path).finish()
    }
}

impl BackListener {
    /// Binds `path` (a stale file is replaced) with `mode`, and starts
    /// challenging callers with `token`. A dial waits at most `wait` for a
    /// standby.
    pub fn bind(path: &Path, mode: u32, token: Vec<u8>, wait: Duration) -> io::Result<Arc<Self>> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let token = Arc::new(token);
        let shown = path.display().to_string();
        let pending = Arc::new(tokio::sync::Semaphore::new(MAX_CHALLENGES));
        let accept = tokio::spawn(async move {
            while let Some((mut s, _)) = namzu_proto::accept::next(|| listener.accept(), "dial-back").await {
                let Ok(permit) = pending.clone().try_acquire_owned() else {
                    tracing::warn!(listener = %shown, "dial-back caller refused: too many in their challenge");
                    continue;
                };
                let tx = tx.clone();
                let token = token.clone();
                let shown = shown.clone();
                tokio::spawn(async move {
                    let verdict =
                        tokio::time::timeout(CHALLENGE_DEADLINE, namzu_proto::back::challenge(&mut s, &token)).await;
                    drop(permit);
                    match verdict {
                        Ok(Ok(())) => {
                            let _ = tx.send(s).await;
                        }
                        Ok(Err(e)) => tracing::warn!(listener = %shown, error = %e, "dial-back caller refused"),
                        Err(_) => tracing::warn!(listener = %shown, "dial-back caller refused: no answer in time"),
                    }
                });
            }
        });
        Ok(Arc::new(Self {
            path: path.to_path_buf(),
            ready: Mutex::new(rx),
            accept,
            wait,
        }))
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next proven standby the agent dialed, still open.
    pub async fn dial(&self) -> io::Result<UnixStream> {
        let mut ready = self.ready.lock().await;
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let next = tokio::time::timeout_at(deadline, ready.recv()).await;
            let s = match next {
                Ok(Some(s)) => s,
                Ok(None) => return Err(io::Error::new(io::ErrorKind::BrokenPipe, "dial-back listener stopped")),
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no agent dialed {} within {:?}", self.path.display(), self.wait),
                    ))
                }
            };
            // A standby the agent closed while it waited (its agent went):
            // readable at end of file.
            let mut b = [0u8; 1];
            match s.try_read(&mut b) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(s),
                _ => continue,
            }
        }
    }
}

impl Drop for BackListener {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_caller_that_proves_the_token_is_handed_out_and_one_that_cannot_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sock");
        let l = BackListener::bind(&path, 0o600, b"tok".to_vec(), Duration::from_millis(300)).unwrap();
        // A caller with the wrong token: refused, never queued.
        let mut bad = UnixStream::connect(&path).await.unwrap();
        namzu_proto::back::answer(&mut bad, b"guess").await.unwrap();
        let err = l.dial().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        let mut rest = Vec::new();
        bad.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "a refused caller got bytes: {rest:?}");
        // The right one: handed out, and what the host writes reaches it.
        let mut good = UnixStream::connect(&path).await.unwrap();
        namzu_proto::back::answer(&mut good, b"tok").await.unwrap();
        let mut s = l.dial().await.unwrap();
        s.write_all(b"hi").await.unwrap();
        let mut got = [0u8; 2];
        good.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hi");
    }

    #[tokio::test]
    async fn a_standby_closed_while_queued_is_skipped_and_drop_removes_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sock");
        let l = BackListener::bind(&path, 0o600, b"tok".to_vec(), Duration::from_millis(300)).unwrap();
        let mut gone = UnixStream::connect(&path).await.unwrap();
        namzu_proto::back::answer(&mut gone, b"tok").await.unwrap();
        let mut live = UnixStream::connect(&path).await.unwrap();
        namzu_proto::back::answer(&mut live, b"tok").await.unwrap();
        drop(gone);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut s = l.dial().await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut got = [0u8; 1];
        live.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"x");
        drop(l);
        assert!(!path.exists());
    }
}
