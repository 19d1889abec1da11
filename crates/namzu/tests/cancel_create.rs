//! A `create` dropped before it returns — a caller's timeout, a `select!`
//! that took another branch — leaves nothing behind on `local` and
//! `host`: no process, no state directory. A runtime shutting down under
//! a local create leaves no process either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use namzu::backend::host::HostProvider;
use namzu::backend::local::LocalProvider;
use namzu::{Provider, SandboxSpec};

fn agent() -> std::path::PathBuf {
    std::env::var_os("NAMZU_AGENT_BIN").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/x86_64-unknown-linux-gnu/debug/namzu-agent")
    })
}

/// Pids of live processes whose command line names `dir`: a launcher
/// started on a spec under it, and the processes it forked.
fn naming(dir: &std::path::Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            !zombie && String::from_utf8_lossy(&raw).contains(&needle)
        })
        .collect()
}

/// The sandbox directories under `state`.
fn sandbox_dirs(state: &std::path::Path, tier: &str) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(state.join(tier))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().starts_with("sb-"))
                .collect()
        })
        .unwrap_or_default()
}

/// What is left under `state` once nothing changes any more (or after 10 s).
async fn settled(state: &std::path::Path, tier: &str) -> (Vec<u32>, Vec<std::ffi::OsString>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (left, dirs) = (naming(state), sandbox_dirs(state, tier));
        if (left.is_empty() && dirs.is_empty()) || std::time::Instant::now() > deadline {
            return (left, dirs);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drops creates of `p` all along their course (before the launcher,
/// while the agent starts, during the privilege probe and the egress
/// supervisor's start) and checks each left nothing.
async fn drops_leave_nothing(p: &dyn Provider, state: &std::path::Path, tier: &str) {
    // How long a whole create takes here, so the drops land all along it.
    let mut took = Duration::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let whole = p.create(SandboxSpec::default()).await.unwrap();
        took = took.min(t.elapsed());
        whole.destroy().await.unwrap();
    }
    let mut dropped = 0;
    for step in 0..40u32 {
        let at = took * step / 40;
        if tokio::time::timeout(at, p.create(SandboxSpec::default()))
            .await
            .is_err()
        {
            dropped += 1;
        } else {
            // Finished in time: not the case under test, but it must
            // still be destroyable.
            for s in p.list().await.unwrap() {
                p.connect(&s.id).await.unwrap().destroy().await.unwrap();
            }
        }
        // The create runs on to its end and then destroys what it made.
        let (left, dirs) = settled(state, tier).await;
        assert!(
            left.is_empty(),
            "{tier}: a create dropped after {at:?} left processes {left:?}"
        );
        assert!(
            dirs.is_empty(),
            "{tier}: a create dropped after {at:?} left state {dirs:?}"
        );
    }
    assert!(
        dropped >= 20,
        "{tier}: only {dropped} of 40 creates were dropped before they returned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_create_dropped_at_any_point_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    drops_leave_nothing(&LocalProvider::with_agent(state.path(), agent()), state.path(), "local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_create_dropped_at_any_point_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    drops_leave_nothing(&HostProvider::with_agent(state.path(), agent()), state.path(), "host").await;
}

/// The runtime itself going away mid-create (a test's end, a CLI's exit on
/// a signal) cancels even the create's own task: the launcher's process
/// group is killed then, and `gc` removes the dead sandbox's directory.
#[test]
fn a_runtime_shut_down_mid_create_leaves_no_process() {
    let state = tempfile::tempdir().unwrap();
    let p = std::sync::Arc::new(LocalProvider::with_agent(state.path(), agent()));
    let mut caught = 0;
    for step in 0..20u64 {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let p2 = p.clone();
        let task = rt.spawn(async move { p2.create(SandboxSpec::default()).await });
        // Into the launcher's start: past the state directory, before
        // the agent answers (a create takes ~15 ms here).
        std::thread::sleep(Duration::from_micros(2_000 + step * 500));
        if task.is_finished() {
            let made = rt.block_on(task).unwrap().unwrap();
            rt.block_on(made.destroy()).unwrap();
            continue;
        }
        // Mid-start on disk: a directory whose record names a launcher.
        if sandbox_dirs(state.path(), "local")
            .iter()
            .any(|d| state.path().join("local").join(d).join("meta.json").exists())
        {
            caught += 1;
        }
        drop(rt);
        // The create may have handed its sandbox out just before the
        // shutdown: a sandbox its caller held (and dropped) lives on, as
        // every handed-out one does.
        let after = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        if let Ok(made) = after.block_on(task) {
            let id = made.unwrap().id().to_owned();
            after.block_on(p.destroy(&id)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        let left = naming(state.path());
        assert!(
            left.is_empty(),
            "a runtime shut down {step} steps into a create left processes {left:?}"
        );
    }
    assert!(
        caught >= 3,
        "only {caught} of 20 shutdowns landed while the launcher started"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(p.gc()).unwrap();
    assert!(
        sandbox_dirs(state.path(), "local").is_empty(),
        "gc left {:?}",
        sandbox_dirs(state.path(), "local")
    );
}

/// A resume dropped at any point still brings the sandbox back, whole:
/// it connects, holds its disk, and suspends again (its processes were
/// recorded, as a suspend needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_dropped_at_any_point_still_brings_the_sandbox_back() {
    let state = tempfile::tempdir().unwrap();
    let p = LocalProvider::with_agent(state.path(), agent());
    let sb = p.create(SandboxSpec::default()).await.unwrap();
    let id = sb.id().to_owned();
    sb.files()
        .write("/workspace/kept", "across abandoned resumes")
        .await
        .unwrap();
    sb.suspend().await.unwrap();
    let mut took = Duration::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let back = p.resume(&id).await.unwrap();
        took = took.min(t.elapsed());
        back.suspend().await.unwrap();
    }
    let mut dropped = 0;
    for step in 0..16u32 {
        let at = took * step / 16;
        if tokio::time::timeout(at, p.resume(&id)).await.is_err() {
            dropped += 1;
        }
        // The resume goes on without its caller: the sandbox comes back.
        let mut tries = 0;
        let back = loop {
            match p.connect(&id).await {
                Ok(sb) => break sb,
                Err(e) => {
                    assert!(
                        tries < 250,
                        "a resume dropped after {at:?} did not bring the sandbox back: {e}"
                    );
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let kept = back.files().read("/workspace/kept").await.unwrap();
        assert_eq!(
            &kept[..],
            b"across abandoned resumes",
            "after a resume dropped after {at:?}"
        );
        back.suspend().await.unwrap();
    }
    assert!(
        dropped >= 8,
        "only {dropped} of 16 resumes were dropped before they returned"
    );
    p.resume(&id).await.unwrap().destroy().await.unwrap();
}
