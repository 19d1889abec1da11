//! Watching a directory: changes made inside the sandbox by its own
//! processes arrive as typed events, named relative to the watched
//! directory, recursively into directories created after the watch began;
//! a watch cannot be pointed outside the sandbox.

use std::time::Duration;

use futures::StreamExt;
use namzu::{WatchEvent, WatchKind};

use super::common::*;

/// A script run inside creates, writes, chmods, renames and removes; the
/// watch reports each, in order per name, and sees into a subdirectory made
/// after it started. A watch of `../..` is a path escape; of a file, not a
/// directory.
pub(super) async fn watch_reports_changes_made_inside(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        sb.files().mkdir_all("w").await.ctx("mkdir")?;
        let mut events = sb.files().watch("w", true).await.ctx("watch")?;
        let script = "cd w && echo a > a.txt && echo more >> a.txt && chmod 600 a.txt && mkdir sub && sleep 0.3 \
                      && echo b > sub/b.txt && mv a.txt c.txt && rm sub/b.txt";
        let out = sb.commands().run(ExecRequest::shell(script)).await.ctx("script")?;
        ensure!(
            out.status.success(),
            "script: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let want = [
            (WatchKind::Create, "a.txt"),
            (WatchKind::Write, "a.txt"),
            (WatchKind::Chmod, "a.txt"),
            (WatchKind::Create, "sub"),
            (WatchKind::Create, "sub/b.txt"),
            (WatchKind::Rename, "a.txt"),
            (WatchKind::Create, "c.txt"),
            (WatchKind::Remove, "sub/b.txt"),
        ];
        let mut got: Vec<WatchEvent> = Vec::new();
        let found = |got: &[WatchEvent], (k, n): (WatchKind, &str)| {
            got.iter().position(|e| e.kind == k && e.name.to_str() == Some(n))
        };
        while want.iter().any(|w| found(&got, *w).is_none()) {
            match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
                Ok(Some(Ok(e))) => got.push(e),
                other => return Err(format!("waiting for events: {other:?}; got {got:?}")),
            }
        }
        // Per name, in the order they happened.
        let pos: Vec<usize> = want.iter().filter_map(|w| found(&got, *w)).collect();
        ensure!(
            pos[0] < pos[1] && pos[1] < pos[2] && pos[2] < pos[5],
            "a.txt out of order: {got:?}"
        );
        ensure!(pos[3] < pos[4] && pos[4] < pos[7], "sub out of order: {got:?}");
        ensure!(
            got.iter().any(|e| e.name.to_str() == Some("sub") && e.is_dir),
            "sub not a directory: {got:?}"
        );
        ensure!(
            !got.iter().any(|e| e.name.to_string_lossy().contains("namzu-tmp")),
            "a temporary was reported: {got:?}"
        );
        let escape = sb.files().watch("../..", false).await.err();
        ensure!(
            matches!(escape, Some(Error::PathEscape { .. })),
            "watch ../..: {escape:?}"
        );
        sb.files().write("w/file", "x").await.ctx("write")?;
        let not_dir = sb.files().watch("w/file", false).await.err();
        ensure!(not_dir.is_some(), "a watch of a file was accepted");
        Ok(())
    })
    .await
}
