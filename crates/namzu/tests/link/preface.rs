//! The preface gate and the transports: tokens, malformed and silent peers,
//! oversized messages, inherited fds, TCP.

use super::*;

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

/// The hello the preface brings says what a Health call says, and a
/// connect to an agent that only knows the plain preface (a proxy in front
/// refusing the hello form as an older agent's gate does) still works,
/// through a second dial.
#[tokio::test]
async fn the_hello_is_health_and_an_agent_without_it_is_dialed_again() {
    let a = spawn_unix(&[]).await;
    let c = connect(&a).await.unwrap();
    let fresh = c.health().await.unwrap();
    assert_eq!(c.info().boot_id, fresh.boot_id);
    assert_eq!(c.info().features, fresh.features);
    assert_eq!(c.info().limits, fresh.limits);
    assert!(c.info().child_status.is_empty(), "no probe was asked for");
    let probed = AgentClient::connect_unix(
        "t",
        &a.sock(),
        TOKEN.to_vec(),
        ClientOptions {
            probe_child: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        probed.info().child_status.contains("CapEff:"),
        "{}",
        probed.info().child_status
    );

    // An "old agent": NZL2 is closed unanswered, NZL1 reaches the agent.
    let old = a.dir.path().join("old.sock");
    let listener = tokio::net::UnixListener::bind(&old).unwrap();
    let target = a.sock();
    let dials = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = dials.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let target = target.clone();
            tokio::spawn(async move {
                let mut magic = [0u8; 4];
                if s.read_exact(&mut magic).await.is_err() || &magic != b"NZL1" {
                    return;
                }
                let mut up = tokio::net::UnixStream::connect(target).await.unwrap();
                up.write_all(&magic).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    let c = AgentClient::connect_unix("t", &old, TOKEN.to_vec(), ClientOptions::default())
        .await
        .unwrap();
    assert_eq!(
        dials.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one refused hello, one plain dial"
    );
    assert_eq!(c.info().boot_id, fresh.boot_id);
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
}
