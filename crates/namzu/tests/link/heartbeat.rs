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
