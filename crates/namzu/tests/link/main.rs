//! The host-agent link against the real agent binary: transports, the
//! preface gate, limits, feature negotiation, shutdown. Needs `namzu-agent`
//! built (`cargo build --workspace --bins`) or `NAMZU_AGENT_BIN`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod heartbeat;
mod lifecycle;
mod pod_entry;
mod pod_tls;
mod preface;
mod reattach;
mod side_exec;
mod side_read;
mod side_write;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use namzu::{AgentClient, ClientOptions, Error, ExecEvent, ExecRequest, WalkOptions, WriteOptions};
use namzu_proto::preface::PrefaceError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &[u8] = b"test-token-0123456789";

struct Agent {
    child: Child,
    dir: tempfile::TempDir,
}

impl Agent {
    fn sock(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent_cmd(dir: &Path, listen: &str, env: &[(&str, &str)]) -> Command {
    let bin = namzu::backend::find_agent_binary().expect("agent binary");
    std::fs::create_dir_all(dir.join("root")).unwrap();
    std::fs::write(dir.join("token"), TOKEN).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("--listen")
        .arg(listen)
        .arg("--token-file")
        .arg(dir.join("token"))
        .arg("--root")
        .arg(dir.join("root"))
        .env("NAMZU_AGENT_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::null());
    cmd
}

async fn spawn_unix(env: &[(&str, &str)]) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("agent.sock").display());
    let child = agent_cmd(dir.path(), &listen, env).spawn().unwrap();
    let a = Agent { child, dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.sock().exists() {
        assert!(Instant::now() < deadline, "agent did not listen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a
}

async fn connect(a: &Agent) -> namzu::Result<AgentClient> {
    AgentClient::connect_unix("t", &a.sock(), TOKEN.to_vec(), ClientOptions::default()).await
}

/// A unix-socket relay in front of an agent whose behaviour the test
/// switches: the link failing the ways real ones do.
struct Relay {
    path: PathBuf,
    mode: std::sync::Arc<std::sync::Mutex<RelayMode>>,
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Relay {
    fn start(dir: &Path, target: PathBuf) -> Relay {
        use std::sync::atomic::Ordering;
        let path = dir.join("relay.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(RelayMode::Pass));
        let generation = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (m, g) = (mode.clone(), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let now = *m.lock().unwrap();
                if now == RelayMode::Refuse {
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::UnixStream::connect(&target).await else {
                    continue;
                };
                let (m, g) = (m.clone(), g.clone());
                let born = g.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let mut a = vec![0u8; 64 * 1024];
                    let mut b = vec![0u8; 64 * 1024];
                    loop {
                        // A switch to Refuse cuts connections made before it.
                        let cut = async {
                            while g.load(Ordering::SeqCst) == born {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        };
                        let (n, up) = tokio::select! {
                            r = cr.read(&mut a) => (r.unwrap_or(0), true),
                            r = sr.read(&mut b) => (r.unwrap_or(0), false),
                            _ = cut, if *m.lock().unwrap() == RelayMode::Refuse => return,
                        };
                        if n == 0 {
                            return;
                        }
                        if *m.lock().unwrap() == RelayMode::BlackHole {
                            continue;
                        }
                        let w = if up {
                            sw.write_all(&a[..n]).await
                        } else {
                            cw.write_all(&b[..n]).await
                        };
                        if w.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Relay { path, mode, generation }
    }

    fn set(&self, mode: RelayMode) {
        *self.mode.lock().unwrap() = mode;
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Reads until EOF or `limit`; returns bytes read and whether EOF came.
async fn drain(s: &mut tokio::net::UnixStream, limit: Duration) -> (usize, bool) {
    let mut n = 0;
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (n, true),
            Ok(Ok(k)) => n += k,
            Err(_) => return (n, false),
        }
    }
}

/// Opens a plain `sh` terminal and starts `sleep 300 &` in it; returns the
/// terminal and the job's pid.
async fn terminal_with_background_job(c: &AgentClient) -> (namzu::Terminal, i32) {
    let opts = namzu::TerminalOptions {
        command: Some("sh".into()),
        ..Default::default()
    };
    let mut t = c.open_terminal(opts).await.unwrap();
    // Upper-cased by tr, so the terminal's echo of the typed line cannot match.
    t.write(Bytes::from_static(b"sleep 300 & echo bg=$!: | tr a-z A-Z\n"))
        .await
        .unwrap();
    let mut seen = String::new();
    while !(seen.contains("BG=") && seen.rsplit("BG=").next().unwrap().contains(':')) {
        match t.next().await {
            Some(Ok(namzu::TerminalEvent::Output { data, .. })) => seen.push_str(&String::from_utf8_lossy(&data)),
            other => panic!("{other:?} after {seen:?}"),
        }
    }
    let bg = seen
        .rsplit("BG=")
        .next()
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (t, bg)
}

/// What [`Relay`] does with the link.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RelayMode {
    Pass,
    /// Existing connections are closed; new ones are closed at accept.
    Refuse,
    /// Everything is accepted, held open, and dropped on the floor.
    BlackHole,
}
