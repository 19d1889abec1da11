//! Silence on the link: heartbeats noticed by both ends, and a black-holed
//! link.

use super::*;

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

/// An agent beating every 200 ms, linked through [`relay`]; setting the
/// flag black-holes the link.
async fn behind_a_relay() -> (Agent, AgentClient, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let a = spawn_unix(&[("NAMZU_HEARTBEAT_INTERVAL_MS", "200")]).await;
    let relay_path = a.dir.path().join("relay.sock");
    let hole = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = tokio::net::UnixListener::bind(&relay_path).unwrap();
    tokio::spawn(relay(listener, a.sock(), hole.clone()));
    let c = AgentClient::connect_unix("t", &relay_path, TOKEN.to_vec(), ClientOptions::default())
        .await
        .unwrap();
    (a, c, hole)
}

#[tokio::test]
async fn a_black_holed_link_is_noticed_by_both_ends() {
    use std::sync::atomic::Ordering;
    let (_a, c, hole) = behind_a_relay().await;
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

/// A TCP connection into the sandbox whose link black-holes: the host's
/// end reads EOF (its writes then fail) and the agent closes the
/// sandbox-side socket, each within about three heartbeat intervals.
#[tokio::test]
async fn a_black_holed_tcp_connection_is_closed_by_both_ends() {
    use std::sync::atomic::Ordering;
    let (_a, c, hole) = behind_a_relay().await;
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = server.local_addr().unwrap().port();
    let mut host = c.open_tcp_connection(port).await.unwrap();
    let (mut inner, _) = server.accept().await.unwrap();
    host.write_all(b"ping").await.unwrap();
    let mut four = [0u8; 4];
    inner.read_exact(&mut four).await.unwrap();
    assert_eq!(&four, b"ping");
    hole.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let host_end = async {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), host.read(&mut buf)).await;
        (n.map(|r| r.map_err(|e| e.kind())), t0.elapsed())
    };
    let inner_end = async {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), inner.read(&mut buf)).await;
        (n.map(|r| r.map_err(|e| e.kind())), t0.elapsed())
    };
    let ((host_read, host_took), (inner_read, inner_took)) = tokio::join!(host_end, inner_end);
    assert_eq!(host_read, Ok(Ok(0)), "the host's end did not end");
    assert_eq!(inner_read, Ok(Ok(0)), "the agent kept the sandbox's socket");
    println!("black-holed tcp: host end after {host_took:?}, sandbox end after {inner_took:?} (heartbeat 200 ms)");
    for took in [host_took, inner_took] {
        assert!(
            took >= Duration::from_millis(400) && took <= Duration::from_secs(3),
            "ended after {took:?}: not about three 200 ms intervals"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.write_all(b"more").await.is_ok() {
        assert!(Instant::now() < deadline, "writes to a dead connection kept succeeding");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Silence is a dead peer only while an end waits to read: a connection
/// idle for many heartbeat intervals stays up, and so does one held back
/// by backpressure — the host not reading what the sandbox writes, or the
/// sandbox not reading what the host writes — every byte arriving.
#[tokio::test]
async fn an_idle_or_backpressured_tcp_connection_is_not_a_dead_peer() {
    const BIG: usize = 8 << 20;
    let a = spawn_unix(&[("NAMZU_HEARTBEAT_INTERVAL_MS", "100")]).await;
    let c = connect(&a).await.unwrap();
    assert!(c
        .info()
        .features
        .iter()
        .any(|f| f == namzu_proto::features::TCP_HEARTBEAT));
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = server.local_addr().unwrap().port();
    let mut host = c.open_tcp_connection(port).await.unwrap();
    let (mut inner, _) = server.accept().await.unwrap();
    // Idle for fifteen intervals.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    host.write_all(b"still").await.unwrap();
    let mut five = [0u8; 5];
    inner.read_exact(&mut five).await.unwrap();
    inner.write_all(b"there").await.unwrap();
    host.read_exact(&mut five).await.unwrap();
    assert_eq!(&five, b"there");
    // The sandbox writes; the host does not read for fifteen intervals.
    let (mut inner_rd, mut inner_wr) = inner.into_split();
    let writer = tokio::spawn(async move {
        inner_wr.write_all(&vec![7u8; BIG]).await.unwrap();
        inner_wr
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut got = vec![0u8; BIG];
    host.read_exact(&mut got).await.unwrap();
    assert!(got.iter().all(|b| *b == 7));
    let inner_wr = writer.await.unwrap();
    // The host writes; the sandbox does not read for fifteen intervals.
    let (mut host_rd, mut host_wr) = tokio::io::split(host);
    let writer = tokio::spawn(async move {
        host_wr.write_all(&vec![9u8; BIG]).await.unwrap();
        host_wr.shutdown().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut got = Vec::new();
    inner_rd.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), BIG);
    assert!(got.iter().all(|b| *b == 9));
    writer.await.unwrap();
    drop(inner_wr);
    let mut rest = Vec::new();
    host_rd.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}
