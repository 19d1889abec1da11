//! Detachable executions across a dropped link: reattached without losing
//! a byte, or an error naming where to resume.

use super::*;

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
