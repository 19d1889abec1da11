//! The agent's life: SIGTERM and its grace, boot ids, feature negotiation,
//! refusals at start, unknown ops, bounded prefaces, the shutdown deadline.

use super::*;

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

/// A link whose agent restarted behind the same address learns it at
/// its re-dial (the hello names the new boot id) and tells every observer
/// once, with both ids, before the call that re-dialed returns; results
/// name the agent that produced them.
#[tokio::test]
async fn a_redial_that_reaches_a_restarted_agent_tells_both_boot_ids_once() {
    let a = spawn_unix(&[]).await;
    let b = spawn_unix(&[]).await;
    let target = std::sync::Arc::new(std::sync::Mutex::new(a.sock()));
    let t = target.clone();
    let c = AgentClient::connect("t", "switch", TOKEN.to_vec(), ClientOptions::default(), move || {
        let p = t.lock().unwrap().clone();
        tokio::net::UnixStream::connect(p)
    })
    .await
    .unwrap();
    let told: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>> = Default::default();
    let seen = told.clone();
    c.on_agent_restart(std::sync::Arc::new(move |was, now| {
        seen.lock().unwrap().push((was.to_owned(), now.to_owned()))
    }));
    let first = c.exec(ExecRequest::shell("true")).await.unwrap();
    assert_eq!(first.boot_id, c.info().boot_id);
    assert_eq!(c.boot_id(), c.info().boot_id);
    // The agent is gone; another answers where it was.
    *target.lock().unwrap() = b.sock();
    drop(a);
    // A call whose result names no boot id: the re-dial's hello told it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = c.list_executions().await {
        assert!(Instant::now() < deadline, "never reached the new agent: {e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b_boot = connect(&b).await.unwrap().info().boot_id.clone();
    assert_eq!(c.boot_id(), b_boot);
    assert_eq!(*told.lock().unwrap(), vec![(first.boot_id.clone(), b_boot.clone())]);
    let after = c.exec(ExecRequest::shell("true")).await.unwrap();
    assert_eq!(after.boot_id, b_boot);
    // Later results from the same agent tell nothing more.
    c.write_file(Path::new("f"), "x".into(), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(told.lock().unwrap().len(), 1);
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
