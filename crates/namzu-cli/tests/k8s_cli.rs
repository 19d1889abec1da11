//! `namzu run --tier kubernetes` against the control-plane SIMULATOR, found
//! through a kubeconfig as a real cluster would be: the claim made, the
//! command run in a pod (a real local sandbox), its exit code returned, the
//! claim given back; kubernetes flags on another tier refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, POOL};
use namzu_k8s_sim::controller::CLAIMS;

fn kubeconfig(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: sim\n    user: u\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_claims_a_pod_runs_the_command_and_gives_it_back() {
    let c = Cluster::start(Some(1)).await.unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), &c.url);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_namzu"))
            .args([
                "run",
                "--tier",
                "kubernetes",
                "--kube-namespace",
                NAMESPACE,
                "--warm-pool",
                POOL,
                "--kube-address",
                "pod-ip",
                "--claim-label",
                "run=cli",
                "--",
                "sh",
                "-c",
                "echo in-pod; exit 3",
            ])
            .env("KUBECONFIG", cfg)
            .env("NAMZU_STATE_DIR", dir.path().join("state"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "in-pod\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3));
    let left: Vec<_> = c
        .sim
        .all(CLAIMS)
        .into_iter()
        .filter(|o| o["metadata"]["labels"]["run"] == "cli")
        .collect();
    assert!(left.is_empty(), "the claim outlived the run: {left:?}");
    c.stop().await;
}

#[test]
fn kubernetes_flags_on_another_tier_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["run", "--tier", "local", "--warm-pool", "p", "--", "true"])
        .env("NAMZU_STATE_DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--warm-pool") && err.contains("--tier kubernetes"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["create", "--tier", "kubernetes"])
        .env("NAMZU_STATE_DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("namzu run --tier kubernetes"));
}
