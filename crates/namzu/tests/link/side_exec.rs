//! Commands on a unix stream of their own (the exec form of the preface):
//! the output, exit and errors of the link's `Exec`, the call dropped when
//! the stream is, the feature withheld, and the link as the fallback.

use namzu_proto::side_read as frames;
use namzu_proto::v1::{exec_output, ExecStart};

use super::*;

/// A start asked by hand on a stream of its own: the frames' tags, and
/// the output messages of its data frames (or the error's code).
async fn by_hand(a: &Agent, start: &ExecStart) -> (Vec<u8>, Vec<exec_output::Msg>, Option<i32>) {
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    namzu_proto::preface::offer_exec(&mut s, TOKEN, &prost::Message::encode_to_vec(start))
        .await
        .unwrap();
    let (mut tags, mut msgs) = (Vec::new(), Vec::new());
    loop {
        let mut h = [0u8; frames::HEADER_LEN];
        if s.read_exact(&mut h).await.is_err() {
            return (tags, msgs, None);
        }
        let (tag, len) = frames::parse_header(&h);
        tags.push(tag);
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body).await.unwrap();
        match tag {
            frames::DATA => {
                let m: namzu_proto::v1::ExecOutput = prost::Message::decode(body.as_slice()).unwrap();
                let exit = matches!(m.msg, Some(exec_output::Msg::Exit(_)));
                msgs.push(m.msg.unwrap());
                if exit {
                    return (tags, msgs, None);
                }
            }
            frames::ERROR => {
                let (code, _, _) = frames::decode_status(&body).unwrap();
                return (tags, msgs, Some(code));
            }
            _ => return (tags, msgs, None),
        }
    }
}

fn start_of(args: &[&str]) -> ExecStart {
    ExecStart {
        command: Bytes::copy_from_slice(args[0].as_bytes()),
        args: args[1..].iter().map(|a| Bytes::copy_from_slice(a.as_bytes())).collect(),
        ..Default::default()
    }
}

fn has_side(c: &AgentClient) -> bool {
    c.info().features.iter().any(|f| f == namzu_proto::features::EXEC_SIDE)
}

/// Over 3 MiB of stdout (many output messages), stderr, an exit code, the
/// env and cwd asked for.
const SCRIPT: &str = "head -c 3300000 /dev/zero | tr '\\0' a; echo \"$GREETING from $(pwd)\" >&2; exit 7";

async fn run_script(c: &AgentClient, a: &Agent) -> namzu::ExecOutput {
    std::fs::create_dir_all(a.root().join("sub")).unwrap();
    c.exec(
        ExecRequest::shell(SCRIPT)
            .env("GREETING", "hello")
            .cwd(a.root().join("sub")),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_command_on_a_stream_of_its_own_gives_what_the_link_gives() {
    let side = spawn_unix(&[]).await;
    let link = spawn_unix(&[("NAMZU_DISABLED_FEATURES", "exec.side")]).await;
    let (cs, cl) = (connect(&side).await.unwrap(), connect(&link).await.unwrap());
    assert!(has_side(&cs));
    assert!(!has_side(&cl));

    let (os, ol) = (run_script(&cs, &side).await, run_script(&cl, &link).await);
    assert_eq!(os.status.code, Some(7));
    assert_eq!(os.status, ol.status);
    assert!(os.stdout.len() == 3_300_000 && os.stdout.iter().all(|b| *b == b'a'));
    assert!(os.stdout == ol.stdout, "stdout differs between the stream and the link");
    let stderr = |o: &namzu::ExecOutput, a: &Agent| {
        String::from_utf8_lossy(&o.stderr).replace(&a.root().display().to_string(), "ROOT")
    };
    assert_eq!(stderr(&os, &side), "hello from ROOT/sub\n");
    assert_eq!(stderr(&os, &side), stderr(&ol, &link));
    assert!(!os.execution_id.is_empty());
    assert_eq!(os.boot_id, cs.boot_id());

    // The same typed refusals at the call.
    let missing = |c: AgentClient| async move { c.exec(ExecRequest::new("/no/such/namzu-binary")).await.err() };
    let (es, el) = (missing(cs.clone()).await, missing(cl.clone()).await);
    assert!(matches!(es, Some(Error::SpawnFailed { errno: 2, .. })), "{es:?}");
    assert_eq!(format!("{es:?}"), format!("{el:?}"));

    // The stream itself: data frames up to the exit; a wrong token is
    // refused before anything runs.
    let marker = side.root().join("ran");
    let (tags, msgs, err) = by_hand(&side, &start_of(&["sh", "-c", "echo out; touch ran"])).await;
    assert_eq!(err, None);
    assert!(tags.iter().all(|t| *t == frames::DATA), "{tags:?}");
    assert!(matches!(msgs.first(), Some(exec_output::Msg::Started(s)) if s.pid > 0));
    assert!(msgs
        .iter()
        .any(|m| matches!(m, exec_output::Msg::Stdout(c) if c.data.as_ref() == b"out\n")));
    assert!(matches!(msgs.last(), Some(exec_output::Msg::Exit(e)) if e.code == Some(0)));
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    let mut s = tokio::net::UnixStream::connect(side.sock()).await.unwrap();
    let wrong = start_of(&["touch", "ran"]);
    let r = namzu_proto::preface::offer_exec(&mut s, b"not-the-token", &prost::Message::encode_to_vec(&wrong)).await;
    assert_eq!(r, Err(PrefaceError::Refused));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!marker.exists(), "a refused preface ran its command");
    // What belongs to the link is refused here, before it runs.
    let mut detachable = start_of(&["touch", "ran"]);
    detachable.detachable = true;
    let (_, msgs, err) = by_hand(&side, &detachable).await;
    assert_eq!((msgs.len(), err), (0, Some(tonic::Code::InvalidArgument as i32)));
    assert!(!marker.exists());
}

#[tokio::test]
async fn withheld_the_stream_is_refused_and_commands_run_over_the_link() {
    let a = spawn_unix(&[("NAMZU_DISABLED_FEATURES", "exec.side")]).await;
    let (tags, msgs, err) = by_hand(&a, &start_of(&["touch", "ran"])).await;
    assert_eq!(tags, vec![frames::ERROR]);
    assert!(msgs.is_empty() && err.is_some());
    assert!(!a.root().join("ran").exists());
    let c = connect(&a).await.unwrap();
    let out = c.exec(ExecRequest::shell("echo over the link")).await.unwrap();
    assert_eq!(out.stdout.as_ref(), b"over the link\n");
}

fn alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

async fn gone_within(pid: u32, limit: Duration) -> bool {
    let t0 = Instant::now();
    while alive(pid) {
        if t0.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test]
async fn dropping_the_stream_kills_the_command_and_its_group() {
    let a = spawn_unix(&[]).await;
    let c = connect(&a).await.unwrap();
    assert!(has_side(&c));
    // A child in the background, so the kill must reach the group, not
    // only the shell.
    let mut s = c
        .exec_stream(ExecRequest::shell("sleep 300 & echo $!; wait"))
        .await
        .unwrap();
    let shell = s.pid.unwrap();
    let bg = match s.next().await {
        Some(Ok(ExecEvent::Stdout { data, .. })) => String::from_utf8_lossy(&data).trim().parse::<u32>().unwrap(),
        other => panic!("{other:?}"),
    };
    assert!(alive(shell) && alive(bg));
    drop(s);
    assert!(
        gone_within(shell, Duration::from_secs(10)).await,
        "shell outlived its dropped stream"
    );
    assert!(
        gone_within(bg, Duration::from_secs(10)).await,
        "its child outlived the dropped stream"
    );
    // The agent is no worse for it.
    assert!(c.exec(ExecRequest::new("true")).await.unwrap().status.success());
}

#[tokio::test]
async fn timeouts_and_cancellation_hold_on_a_stream_of_its_own() {
    let a = spawn_unix(&[]).await;
    let c = connect(&a).await.unwrap();
    assert!(has_side(&c));
    let out = c
        .exec(ExecRequest::shell("sleep 300").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(out.status.timed_out && !out.status.success(), "{:?}", out.status);

    let token = namzu::CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        t.cancel();
    });
    let mut s = c
        .exec_stream(ExecRequest::shell("echo $$; exec sleep 300").cancel_token(token))
        .await
        .unwrap();
    let pid = s.pid.unwrap();
    let mut ended = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), s.next()).await.unwrap() {
        if let Ok(ExecEvent::Exit(st)) = ev {
            ended = Some(st);
        }
    }
    let st = ended.expect("no exit after the cancel");
    assert!(st.status.cancelled, "{st:?}");
    assert!(gone_within(pid, Duration::from_secs(5)).await);

    // Streamed stdin stays on the link, and works.
    let input = futures::stream::iter([Bytes::from_static(b"in "), Bytes::from_static(b"put\n")]);
    let out = c.exec(ExecRequest::new("cat").stdin_stream(input)).await.unwrap();
    assert_eq!(out.stdout.as_ref(), b"in put\n");
}
