//! The host-agent link against the real agent binary: transports, the
//! preface gate, limits, feature negotiation, shutdown. Needs `namzu-agent`
//! built (`cargo build --workspace --bins`) or `NAMZU_AGENT_BIN`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

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

#[tokio::test]
async fn wrong_token_is_refused_and_right_token_still_works() {
    let a = spawn_unix(&[]).await;
    let r = AgentClient::connect_unix("t", &a.sock(), b"not-the-token".to_vec(), ClientOptions::default()).await;
    assert!(
        matches!(
            r,
            Err(Error::Preface {
                source: PrefaceError::Refused,
                ..
            })
        ),
        "{r:?}"
    );
    let c = connect(&a).await.unwrap();
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
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

#[tokio::test]
async fn malformed_prefaces_are_dropped_without_an_answer() {
    // A 5 s preface timeout: what is refused at parse must go well before
    // it (the first second), not when the timeout would have dropped it.
    let a = spawn_unix(&[("NAMZU_PREFACE_TIMEOUT_MS", "5000")]).await;
    let at_parse = Duration::from_secs(1);

    // An HTTP request instead of a preface: dropped at the magic.
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert_eq!(
        drain(&mut s, at_parse).await,
        (0, true),
        "an HTTP request was not dropped at the magic"
    );

    // A header announcing a 60000-byte token: dropped after 6 bytes,
    // without waiting for the token.
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let mut hdr = b"NZL1".to_vec();
    hdr.extend_from_slice(&60000u16.to_be_bytes());
    s.write_all(&hdr).await.unwrap();
    assert_eq!(
        drain(&mut s, at_parse).await,
        (0, true),
        "an oversized token length was waited for"
    );

    // A megabyte of garbage: the agent stops reading early and closes.
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let junk = vec![b'N'; 1 << 20];
    let wrote = tokio::time::timeout(at_parse, s.write_all(&junk)).await;
    assert!(
        matches!(wrote, Ok(Err(_))) || drain(&mut s, at_parse).await == (0, true),
        "garbage was read on: {wrote:?}"
    );

    // None of it harmed the agent.
    let c = connect(&a).await.unwrap();
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
}

#[tokio::test]
async fn a_silent_peer_is_dropped_at_the_preface_timeout_not_before() {
    let a = spawn_unix(&[("NAMZU_PREFACE_TIMEOUT_MS", "300")]).await;
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let t0 = Instant::now();
    assert_eq!(drain(&mut s, Duration::from_secs(5)).await, (0, true));
    assert!(t0.elapsed() >= Duration::from_millis(250), "dropped before the timeout");
}

#[tokio::test]
async fn oversized_message_is_refused_and_the_agent_survives() {
    let a = spawn_unix(&[("NAMZU_MAX_MESSAGE_BYTES", "65536")]).await;
    let c = connect(&a).await.unwrap();
    // One 1 MiB stdin message is over the agent's bound.
    let r = c
        .exec(ExecRequest::new("cat").stdin(Bytes::from(vec![b'x'; 1 << 20])))
        .await;
    assert!(
        matches!(&r, Err(Error::LimitExceeded { limit, value: 65536, .. }) if limit == "max_message_bytes"),
        "oversized message: {r:?}"
    );
    // Uploads adapt their chunk size to the advertised bound.
    let n = c
        .write_file(Path::new("f"), Bytes::from(vec![7u8; 300_000]), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(n, 300_000);
    let c2 = connect(&a).await.unwrap();
    assert!(c2.exec(ExecRequest::new("true")).await.unwrap().status.success());
}

#[tokio::test]
async fn inherited_fd_link_serves_and_ends_with_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut child = agent_cmd(dir.path(), "fd:0", &[])
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .unwrap();
    ours.set_nonblocking(true).unwrap();
    let s = tokio::net::UnixStream::from_std(ours).unwrap();
    let c = AgentClient::connect_stream("t", "fd", TOKEN.to_vec(), ClientOptions::default(), s)
        .await
        .unwrap();
    let out = c.exec(ExecRequest::new("echo").arg("over fd")).await.unwrap();
    assert_eq!(&out.stdout[..], b"over fd\n");
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent outlived its only link");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn tcp_link_works() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let child = agent_cmd(dir.path(), &format!("tcp:{addr}"), &[]).spawn().unwrap();
    let _a = Agent { child, dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match AgentClient::connect_tcp("t", addr, TOKEN.to_vec(), ClientOptions::default()).await {
            Ok(c) => break c,
            Err(Error::Connect { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        &c.exec(ExecRequest::new("echo").arg("tcp")).await.unwrap().stdout[..],
        b"tcp\n"
    );
}

/// Starts a command that ignores SIGTERM (the disposition survives its
/// exec), waits for its first output, then sends the agent SIGTERM. Returns
/// the stream, the command's pid and when the signal went.
async fn term_ignoring_command_then_sigterm(a: &Agent, c: &AgentClient) -> (namzu::ExecStream, u32, Instant) {
    let mut s = c
        .exec_stream(ExecRequest::shell("trap '' TERM; echo started; exec sleep 300"))
        .await
        .unwrap();
    let pid = s.pid.unwrap();
    assert!(matches!(s.next().await, Some(Ok(ExecEvent::Stdout { .. }))));
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    (s, pid, t0)
}

#[tokio::test]
async fn sigterm_kills_running_work_and_exits_zero_within_the_grace() {
    let mut a = spawn_unix(&[("NAMZU_SHUTDOWN_GRACE_MS", "300")]).await;
    let c = connect(&a).await.unwrap();
    // The command ignores SIGTERM: the agent must escalate past the grace.
    let (mut s, pid, t0) = term_ignoring_command_then_sigterm(&a, &c).await;
    let status = loop {
        if let Some(st) = a.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "agent did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    // The running command was killed, not orphaned.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z"))
    );
    // Its stream ended (killed exit, or the link closing) rather than hanging.
    let rest = tokio::time::timeout(Duration::from_secs(5), async { while s.next().await.is_some() {} }).await;
    assert!(rest.is_ok(), "exec stream hung after the agent exited");
}

#[tokio::test]
async fn boot_id_is_stable_per_agent_and_new_per_start() {
    let a = spawn_unix(&[]).await;
    let one = connect(&a).await.unwrap().info().boot_id.clone();
    let again = connect(&a).await.unwrap().info().boot_id.clone();
    assert_eq!(one, again);
    let b = spawn_unix(&[]).await;
    let other = connect(&b).await.unwrap().info().boot_id.clone();
    assert_ne!(one, other);
    assert_eq!(one.len(), 32);
}

#[tokio::test]
async fn an_op_the_agent_did_not_advertise_is_refused_before_sending() {
    let a = spawn_unix(&[("NAMZU_DISABLED_FEATURES", "files.walk")]).await;
    let c = connect(&a).await.unwrap();
    assert!(!c.info().features.iter().any(|f| f == "files.walk"));
    let before = c.health().await.unwrap().ops_served;
    let r = c.walk_files(Path::new("."), WalkOptions::default()).await;
    assert!(
        matches!(&r, Err(Error::Unsupported { feature, .. }) if feature == "files.walk"),
        "{:?}",
        r.err()
    );
    assert_eq!(
        c.health().await.unwrap().ops_served,
        before,
        "the refused op reached the agent"
    );
    // Other ops are unaffected, and the agent itself also refuses the op.
    assert!(c.list_files(Path::new(".")).await.is_ok());
    assert!(a.root().is_dir());
}

#[tokio::test]
async fn agent_refuses_to_start_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let bin = namzu::backend::find_agent_binary().unwrap();
    let out = Command::new(bin)
        .args(["--listen", &format!("unix:{}", dir.path().join("s").display())])
        .env_remove("NAMZU_AGENT_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no bind token"));
}

#[tokio::test]
async fn unknown_op_is_unimplemented_and_harmless() {
    let a = spawn_unix(&[]).await;
    let c = connect(&a).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(c.raw_channel());
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/namzu.agent.v1.Agent/NoSuchOp");
    let codec: tonic::codec::ProstCodec<namzu_proto::v1::HealthRequest, namzu_proto::v1::HealthResponse> =
        tonic::codec::ProstCodec::default();
    let r = grpc
        .unary(
            tonic::Request::new(namzu_proto::v1::HealthRequest { probe_child: false }),
            path,
            codec,
        )
        .await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::Unimplemented);
    // A message that is not what the op expects is refused, not a panic.
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/namzu.agent.v1.Agent/ReadFile");
    let codec: tonic::codec::ProstCodec<namzu_proto::v1::ExecOutput, namzu_proto::v1::ReadFileResponse> =
        tonic::codec::ProstCodec::default();
    grpc.ready().await.unwrap();
    let junk = namzu_proto::v1::ExecOutput {
        msg: Some(namzu_proto::v1::exec_output::Msg::Stdout(
            namzu_proto::v1::OutputChunk {
                offset: 1,
                data: Bytes::from_static(b"\xff\xff"),
                log_offset: 0,
            },
        )),
    };
    let r = grpc.unary(tonic::Request::new(junk), path, codec).await;
    assert!(r.is_err(), "garbage request answered {r:?}");
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
}

#[tokio::test]
async fn connections_in_their_preface_are_bounded() {
    let a = spawn_unix(&[("NAMZU_MAX_PENDING_LINKS", "2"), ("NAMZU_PREFACE_TIMEOUT_MS", "5000")]).await;
    let s1 = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let s2 = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A third silent peer is closed at once, not after the preface timeout.
    let mut s3 = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let t0 = Instant::now();
    assert_eq!(drain(&mut s3, Duration::from_secs(4)).await, (0, true));
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "over-limit peer kept for {:?}",
        t0.elapsed()
    );
    // Once the squatters leave, real clients get in.
    drop((s1, s2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = connect(&a).await.unwrap();
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
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

#[tokio::test]
async fn agent_shutdown_deadline_bounds_a_shutdown_the_grace_would_stretch() {
    // A 10 s grace, a command that ignores SIGTERM (so the grace would run
    // out in full), and a 500 ms deadline: the agent is gone long before
    // the grace.
    let mut a = spawn_unix(&[
        ("NAMZU_SHUTDOWN_GRACE_MS", "10000"),
        ("NAMZU_AGENT_SHUTDOWN_DEADLINE_MS", "500"),
    ])
    .await;
    let c = connect(&a).await.unwrap();
    let (_s, pid, t0) = term_ignoring_command_then_sigterm(&a, &c).await;
    let exited = loop {
        if a.child.try_wait().unwrap().is_some() {
            break Some(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(8) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let took = exited.expect("the agent outlived its shutdown deadline");
    println!("agent gone {took:?} after SIGTERM (deadline 500 ms + 1 s to flush answers, grace 10 s)");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: the grace, not the deadline, ended it"
    );
}

#[tokio::test]
async fn sigterm_also_kills_terminal_sessions() {
    let mut a = spawn_unix(&[("NAMZU_SHUTDOWN_GRACE_MS", "300")]).await;
    let c = connect(&a).await.unwrap();
    // Held open: only the SIGTERM may end the job.
    let (_terminal, bg) = terminal_with_background_job(&c).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t0 = Instant::now();
    while a.child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "agent did not exit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let alive = std::fs::read_to_string(format!("/proc/{bg}/stat")).is_ok_and(|s| !s.contains(") Z"));
    assert!(!alive, "terminal job {bg} outlived the agent");
}

/// An agent with `heartbeat_ms`, a command streaming from it, then the
/// agent stopped (SIGSTOP; the caller continues it).
async fn stopped_mid_stream(heartbeat_ms: &str) -> (Agent, AgentClient, namzu::ExecStream, nix::unistd::Pid) {
    let a = spawn_unix(&[("NAMZU_HEARTBEAT_INTERVAL_MS", heartbeat_ms)]).await;
    let c = connect(&a).await.unwrap();
    let mut s = c
        .exec_stream(ExecRequest::shell("echo go; exec sleep 300"))
        .await
        .unwrap();
    assert!(matches!(s.next().await, Some(Ok(ExecEvent::Stdout { .. }))));
    let pid = nix::unistd::Pid::from_raw(a.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    (a, c, s, pid)
}

#[tokio::test]
async fn a_stopped_agent_is_noticed_within_three_heartbeats() {
    let (_a, _c, mut s, pid) = stopped_mid_stream("200").await;
    let t0 = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), s.next()).await;
    let took = t0.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    match ended {
        Ok(Some(Err(Error::LinkLost { .. }))) => {}
        other => panic!("a stopped agent was not noticed: {other:?}"),
    }
    println!("stopped agent noticed after {took:?} (heartbeat 200 ms)");
    // Three intervals of silence, checked on a timer: not at once (that
    // would be something else ending the stream) and not much after.
    assert!(
        took >= Duration::from_millis(400) && took <= Duration::from_millis(1200),
        "noticed after {took:?}, expected about three 200 ms intervals"
    );
}

#[tokio::test]
async fn heartbeat_zero_disables_the_silence_check() {
    let (_a, c, mut s, pid) = stopped_mid_stream("0").await;
    // With heartbeats on at 200 ms this resolves as lost in under a second
    // (the test above); off, a stopped agent is simply waited for.
    let ended = tokio::time::timeout(Duration::from_millis(1500), s.next()).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(ended.is_err(), "the stream ended with heartbeats off: {ended:?}");
    // And the link still serves once the agent runs again.
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
}

/// Forwards bytes between two unix streams until `hole` is set, then keeps
/// both open and drops everything: a peer that vanished without FIN or RST.
async fn relay(
    listener: tokio::net::UnixListener,
    target: PathBuf,
    hole: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    let (client, _) = listener.accept().await.unwrap();
    let server = tokio::net::UnixStream::connect(&target).await.unwrap();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let pump = |mut r: tokio::net::unix::OwnedReadHalf,
                mut w: tokio::net::unix::OwnedWriteHalf,
                hole: std::sync::Arc<std::sync::atomic::AtomicBool>| async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return (r, w),
                Ok(n) => n,
            };
            if !hole.load(Ordering::SeqCst) && w.write_all(&buf[..n]).await.is_err() {
                return (r, w);
            }
        }
    };
    let up = tokio::spawn(pump(cr, sw, hole.clone()));
    let down = tokio::spawn(pump(sr, cw, hole));
    // Hold every half open whatever happens: no FIN, no RST.
    let _held = tokio::join!(up, down);
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_black_holed_link_is_noticed_by_both_ends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let a = spawn_unix(&[("NAMZU_HEARTBEAT_INTERVAL_MS", "200")]).await;
    let relay_path = a.dir.path().join("relay.sock");
    let hole = std::sync::Arc::new(AtomicBool::new(false));
    let listener = tokio::net::UnixListener::bind(&relay_path).unwrap();
    tokio::spawn(relay(listener, a.sock(), hole.clone()));
    let c = AgentClient::connect_unix("t", &relay_path, TOKEN.to_vec(), ClientOptions::default())
        .await
        .unwrap();
    let (mut t, bg) = terminal_with_background_job(&c).await;
    hole.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    // The host side: the plain terminal resolves as lost (output already in
    // flight, like the shell's prompt, may still arrive first).
    let ev = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match t.next().await {
                Some(Ok(namzu::TerminalEvent::Output { .. })) => continue,
                other => return other,
            }
        }
    })
    .await;
    let host_took = t0.elapsed();
    match ev {
        Ok(Some(Ok(namzu::TerminalEvent::Exit(st)))) => assert_eq!(st.code, Some(-1), "{st:?}"),
        other => panic!("the host did not notice the black hole: {other:?}"),
    }
    // The agent side: it stops hearing heartbeats and runs the close
    // cleanup, killing the terminal's session.
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
    while alive(bg) {
        assert!(
            Instant::now() < deadline,
            "the agent kept the terminal's job {bg} after the host vanished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let agent_took = t0.elapsed();
    println!("black hole noticed: host after {host_took:?}, agent cleaned up after {agent_took:?} (heartbeat 200 ms)");
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

const TALKER: &str = "i=0; while [ $i -lt 150 ]; do echo out$i; echo err$i >&2; i=$((i+1)); sleep 0.01; done; exit 4";

fn talker_output() -> (Vec<u8>, Vec<u8>) {
    (
        (0..150).map(|i| format!("out{i}\n")).collect::<String>().into_bytes(),
        (0..150).map(|i| format!("err{i}\n")).collect::<String>().into_bytes(),
    )
}

/// Reads `n` stdout chunks (or to the exit), collecting both streams.
async fn read_some(s: &mut namzu::ExecStream, out: &mut Vec<u8>, err: &mut Vec<u8>, n: usize) {
    let mut got = 0;
    while got < n {
        match s.next().await.unwrap().unwrap() {
            ExecEvent::Stdout { data, .. } => {
                out.extend_from_slice(&data);
                got += 1;
            }
            ExecEvent::Stderr { data, .. } => err.extend_from_slice(&data),
            ExecEvent::Exit(x) => panic!("exited early: {x:?}"),
        }
    }
}

#[tokio::test]
async fn a_detachable_execution_reattaches_after_the_link_drops_and_loses_nothing() {
    let a = spawn_unix(&[]).await;
    let relay = Relay::start(a.dir.path(), a.sock());
    let c = AgentClient::connect_unix("t", &relay.path, TOKEN.to_vec(), ClientOptions::default())
        .await
        .unwrap();
    let mut s = c
        .exec_stream(ExecRequest::shell(TALKER).execution_id("talker"))
        .await
        .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    read_some(&mut s, &mut out, &mut err, 10).await;
    // The link drops and stays down for half a second.
    relay.set(RelayMode::Refuse);
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.set(RelayMode::Pass);
    let exit = loop {
        match s.next().await.unwrap() {
            Ok(ExecEvent::Stdout { data, .. }) => out.extend_from_slice(&data),
            Ok(ExecEvent::Stderr { data, .. }) => err.extend_from_slice(&data),
            Ok(ExecEvent::Exit(x)) => break x,
            Err(e) => panic!("the stream did not survive the drop: {e}"),
        }
    };
    let (want_out, want_err) = talker_output();
    assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&want_out));
    assert_eq!(String::from_utf8_lossy(&err), String::from_utf8_lossy(&want_err));
    assert_eq!(exit.status.code, Some(4));
    assert!(!exit.stdout_truncated && !exit.stderr_truncated);
}

#[tokio::test]
async fn past_the_reattach_window_the_error_names_the_id_and_offset_to_resume_from() {
    let a = spawn_unix(&[("NAMZU_HEARTBEAT_INTERVAL_MS", "200")]).await;
    let relay = Relay::start(a.dir.path(), a.sock());
    let opts = ClientOptions {
        keepalive: Duration::from_secs(1),
        ..Default::default()
    };
    let c = AgentClient::connect_unix("t", &relay.path, TOKEN.to_vec(), opts)
        .await
        .unwrap();
    let mut s = c
        .exec_stream(
            ExecRequest::shell(TALKER)
                .execution_id("talker")
                .reattach_window(Duration::from_millis(1500)),
        )
        .await
        .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    read_some(&mut s, &mut out, &mut err, 10).await;
    // A black hole: no FIN, no RST, nothing arrives. Heartbeats notice it;
    // reattaching cannot succeed.
    relay.set(RelayMode::BlackHole);
    let t0 = Instant::now();
    let offset = loop {
        match tokio::time::timeout(Duration::from_secs(20), s.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(ExecEvent::Stdout { data, .. }) => out.extend_from_slice(&data),
            Ok(ExecEvent::Stderr { data, .. }) => err.extend_from_slice(&data),
            Err(Error::ExecutionLinkLost { execution_id, offset }) => {
                assert_eq!(execution_id, "talker");
                break offset;
            }
            other => panic!("expected a detached error, got {other:?}"),
        }
    };
    println!("gave up after {:?} (heartbeat 200 ms, window 1.5 s)", t0.elapsed());
    assert_eq!(
        offset,
        (out.len() + err.len()) as u64,
        "the offset is not what was received"
    );
    // Another host, over a working link, resumes from that offset.
    relay.set(RelayMode::Pass);
    let direct = connect(&a).await.unwrap();
    let rest = direct
        .attach_execution(
            "talker",
            namzu::AttachOptions {
                from_offset: offset,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    out.extend_from_slice(&rest.stdout);
    err.extend_from_slice(&rest.stderr);
    let (want_out, want_err) = talker_output();
    assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&want_out));
    assert_eq!(String::from_utf8_lossy(&err), String::from_utf8_lossy(&want_err));
    assert_eq!(rest.status.code, Some(4));
}
