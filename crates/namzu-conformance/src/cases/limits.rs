//! Cases on the workspace's durability and on named limits: flush
//! measured by what it writes back, and `max_list_entries`,
//! `max_walk_entries` and `session_ttl_ms` set low and passed.

use std::time::Duration;

use futures::StreamExt;
use namzu::{Error, SandboxSpec, WalkOptions};

use super::common::{detached, drain_session, sh};
use crate::util::{with_sandbox, Ctx};
use crate::{ensure, Factory, Outcome};

/// Dirty page-cache bytes on the host (`Dirty:` of /proc/meminfo).
fn host_dirty_bytes() -> Result<u64, String> {
    let m = std::fs::read_to_string("/proc/meminfo").ctx("meminfo")?;
    m.lines()
        .find_map(|l| l.strip_prefix("Dirty:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb << 10)
        .ok_or_else(|| "no Dirty: in /proc/meminfo".into())
}

/// Flush answers once the workspace's filesystem is synced: 64 MiB written
/// by a command (buffered, never synced by it) are dirty on the host before
/// the flush and written back after it. A flush that did nothing would
/// leave them dirty for the kernel's expiry (30 s by default). Another
/// sandbox's flush of the same filesystem (a `syncfs` of its own, running
/// beside this case) may write the pages back first; that attempt proves
/// nothing either way and is made again, up to five times.
pub(super) async fn flush_makes_the_workspace_durable(f: Factory) -> Outcome {
    const BIG: u64 = 64 << 20;
    const ATTEMPTS: u32 = 5;
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        for attempt in 1..=ATTEMPTS {
            let out = sh(
                &sb,
                "rm -f durable && head -c 67108864 /dev/zero > durable && echo written",
            )
            .await?;
            ensure!(out.status.success(), "write: {:?}", out.status);
            let before = host_dirty_bytes()?;
            if before < BIG * 3 / 4 {
                ensure!(
                    attempt < ATTEMPTS,
                    "the command's writes were not dirty before the flush ({} MiB dirty), {ATTEMPTS} times",
                    before >> 20
                );
                continue;
            }
            let took = sb.flush(Duration::from_secs(30)).await.ctx("flush")?;
            let after = host_dirty_bytes()?;
            ensure!(took < Duration::from_secs(30), "flush took {took:?}");
            ensure!(
                after + BIG * 3 / 4 <= before,
                "flush wrote nothing back: {} MiB dirty before, {} MiB after",
                before >> 20,
                after >> 20
            );
            return Ok(());
        }
        Ok(())
    })
    .await
}

/// `max_list_entries`, `max_walk_entries` (a walk's default budget) and
/// `session_ttl_ms`, each set low on one sandbox and passed.
pub(super) async fn named_list_walk_and_session_limits_hold(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![
            ("max_list_entries".into(), 5),
            ("max_walk_entries".into(), 7),
            ("session_ttl_ms".into(), 300),
        ],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        let out = sh(
            &sb,
            "mkdir -p many few && cd many && for i in 0 1 2 3 4 5 6 7 8 9; do touch f$i; done && touch ../few/a",
        )
        .await?;
        ensure!(out.status.success(), "setup: {:?}", out.status);
        let r = sb.files().list("many").await;
        ensure!(
            matches!(&r, Err(Error::LimitExceeded { limit, value: 5, .. }) if limit == "max_list_entries"),
            "list of 10 under max_list_entries 5: {r:?}"
        );
        ensure!(
            sb.files().list("few").await.ctx("list under the limit")?.len() == 1,
            "few"
        );
        let mut walk = sb.files().walk("many", WalkOptions::default()).await.ctx("walk")?;
        let mut seen = 0;
        let end = loop {
            match walk.next().await {
                Some(Ok(_)) => seen += 1,
                Some(Err(e)) => break Some(e),
                None => break None,
            }
        };
        ensure!(
            seen == 7 && matches!(end, Some(Error::WalkLimit { limit: 7, .. })),
            "walk of 10 under max_walk_entries 7: {seen} entries, then {end:?}"
        );
        sb.sessions()
            .start(detached("brief", "echo hi"))
            .await
            .ctx("start_session")?;
        let (out, _) = drain_session(&sb, "brief", 0).await?;
        ensure!(out == b"hi\n", "session output {out:?}");
        // Kept for session_ttl_ms after it exited, then gone.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let r = sb.sessions().read_max("brief", 0, 0).await;
        ensure!(
            matches!(&r, Err(Error::SessionNotFound { id }) if id == "brief"),
            "an exited session past session_ttl_ms: {r:?}"
        );
        Ok(())
    })
    .await
}
