//! The warm pool against real local sandboxes: it fills, hands each
//! sandbox out once, never hands out one whose agent died, starts one
//! itself when empty, and leaves nothing behind when closed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use namzu::backend::local::LocalProvider;
use namzu::pool::{Pool, PoolOptions};
use namzu::{ExecRequest, Provider, SandboxSpec};

fn agent() -> std::path::PathBuf {
    std::env::var_os("NAMZU_AGENT_BIN").map(Into::into).unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/x86_64-unknown-linux-gnu/debug/namzu-agent")
    })
}

fn provider(state: &std::path::Path) -> Arc<LocalProvider> {
    Arc::new(LocalProvider::with_agent(state, agent()))
}

/// The anchor pid the state directory records for `id`.
fn anchor_pid(state: &std::path::Path, id: &str) -> i32 {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("local").join(id).join("meta.json")).unwrap()).unwrap();
    meta["pid"].as_i64().unwrap() as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_warm_distinct_and_live_and_close_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path());
    let pool = Pool::new(
        p.clone(),
        SandboxSpec::default(),
        PoolOptions::default().size(3).max_starting(2),
    );
    assert_eq!(
        pool.filled(3, Duration::from_secs(60)).await,
        3,
        "the pool did not fill"
    );

    // A waiting sandbox whose agent dies is never handed out.
    let waiting = p.list().await.unwrap();
    assert_eq!(waiting.len(), 3);
    let victim = &waiting[0].id;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(anchor_pid(state.path(), victim)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Six claims at once from a pool of three: every one distinct and
    // live, the dead one never among them.
    let pool = Arc::new(pool);
    let claims: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.claim().await })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut held = Vec::new();
    for c in claims {
        let sb = c.await.unwrap().unwrap();
        assert_ne!(sb.id(), victim, "a dead sandbox was handed out");
        let out = sb.commands().run(ExecRequest::shell("echo $$")).await.unwrap();
        assert!(out.status.success());
        assert!(ids.insert(sb.id().to_owned()), "{} was handed out twice", sb.id());
        held.push(sb);
    }
    let stats = pool.stats();
    assert_eq!(stats.warm + stats.cold, 6);
    assert!(stats.warm >= 2, "{stats:?}");
    assert_eq!(stats.discarded, 1, "{stats:?}");
    for sb in held {
        sb.destroy().await.unwrap();
    }

    // Closing destroys what waits and what was still starting.
    let pool = Arc::into_inner(pool).unwrap();
    pool.filled(3, Duration::from_secs(60)).await;
    pool.close().await;
    // The dead sandbox's destroy ran in the background; give it a moment.
    for _ in 0..100 {
        if p.list().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        p.list().await.unwrap(),
        Vec::new(),
        "the closed pool left sandboxes behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_starts_one_itself() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path());
    let pool = Pool::new(p.clone(), SandboxSpec::default(), PoolOptions::default().size(0));
    let sb = pool.claim().await.unwrap();
    assert!(sb
        .commands()
        .run(ExecRequest::new("true"))
        .await
        .unwrap()
        .status
        .success());
    assert_eq!(pool.stats().cold, 1);
    sb.destroy().await.unwrap();
    pool.close().await;
    assert_eq!(p.list().await.unwrap(), Vec::new());
}
