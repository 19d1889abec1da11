//! Detached sessions: output by offset, ring eviction, and killing a whole session.

use super::common::*;

/// A detached command's merged output is read by offset, completely, by
/// any number of readers, and its exit code comes back.
pub(super) async fn detached_session_output_is_read_by_offset(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let script = "i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); done; echo err >&2; exit 3";
        let info = sb
            .sessions()
            .start(detached("job", script))
            .await
            .ctx("start_session")?;
        ensure!(info.session_id == "job" && info.pid > 0, "{info:?}");
        let (a, end) = drain_session(&sb, "job", 0).await?;
        let want: String = (0..300).map(|i| format!("line{i}\n")).collect::<String>() + "err\n";
        ensure!(a == want.as_bytes(), "first reader got {} bytes", a.len());
        ensure!(
            end.state
                == namzu::SessionState::Exited(namzu::ExitStatus {
                    code: Some(3),
                    ..Default::default()
                }),
            "{end:?}"
        );
        let (b, _) = drain_session(&sb, "job", 0).await?;
        ensure!(a == b, "a second reader got other bytes");
        let (tail, _) = drain_session(&sb, "job", 10).await?;
        ensure!(tail[..] == a[10..], "a read from an offset is not the stream's tail");
        Ok(())
    })
    .await
}

/// Output the ring had to evict is reported as dropped bytes, never as a
/// shorter stream that looks complete.
pub(super) async fn session_ring_eviction_is_reported_as_dropped_bytes(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("session_ring_bytes".into(), 1024)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        sb.sessions()
            .start(detached("big", "head -c 10000 /dev/zero | tr '\\0' a"))
            .await
            .ctx("start")?;
        for _ in 0..500 {
            let c = sb.sessions().read_max("big", 0, 0).await.ctx("read")?;
            if matches!(c.info.state, namzu::SessionState::Exited(_)) {
                ensure!(c.info.output_bytes == 10_000, "{:?}", c.info);
                ensure!(c.dropped_bytes == 10_000 - 1024 && c.offset == 10_000 - 1024, "{c:?}");
                ensure!(
                    c.data.len() == 1024 && c.next_offset == 10_000,
                    "{} bytes, next {}",
                    c.data.len(),
                    c.next_offset
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("the session did not finish".into())
    })
    .await
}

/// kill_session reaches every process of the session, background jobs
/// included, and reports the real state; ids are unique; the session count
/// is bounded by name.
pub(super) async fn kill_session_kills_the_whole_session(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_sessions".into(), 2)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        sb.sessions()
            .start(detached("svc", "sleep 300 & echo $! > bg.pid; sleep 300"))
            .await
            .ctx("start")?;
        let mut bg = String::new();
        for _ in 0..200 {
            if let Ok(d) = sb.files().read("bg.pid").await {
                bg = String::from_utf8_lossy(&d).trim().to_owned();
                if !bg.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ensure!(!bg.is_empty(), "background pid never written");
        match sb.sessions().start(detached("svc", "true")).await {
            Err(Error::SessionExists { id }) => ensure!(id == "svc", "{id}"),
            other => return Err(format!("duplicate id: {other:?}")),
        }
        sb.sessions()
            .start(detached("second", "sleep 300"))
            .await
            .ctx("second")?;
        match sb.sessions().start(detached("third", "true")).await {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_sessions" && value == 2, "{limit}={value}")
            }
            other => return Err(format!("third session: {other:?}")),
        }
        let info = sb
            .sessions()
            .kill("svc", namzu::SessionSignal::Term)
            .await
            .ctx("kill_session")?;
        ensure!(
            info.state
                == namzu::SessionState::Exited(namzu::ExitStatus {
                    signal: Some(15),
                    ..Default::default()
                }),
            "{info:?}"
        );
        ensure!(!pid_alive(&sb, &bg).await?, "background job {bg} survived kill_session");
        let listed = sb.sessions().list().await.ctx("list")?;
        ensure!(
            listed.iter().any(|s| s.session_id == "svc" && s.state == info.state),
            "{listed:?}"
        );
        let info = sb
            .sessions()
            .kill("second", namzu::SessionSignal::Kill)
            .await
            .ctx("kill -9")?;
        ensure!(
            matches!(info.state, namzu::SessionState::Exited(st) if st.signal == Some(9)),
            "{info:?}"
        );
        match sb.sessions().read_max("nope", 0, 0).await {
            Err(Error::SessionNotFound { id }) => ensure!(id == "nope", "{id}"),
            other => return Err(format!("unknown session: {:?}", other.map(|c| c.info))),
        }
        Ok(())
    })
    .await
}
