//! `namzu run --tier kubernetes` against the control-plane SIMULATOR, found
//! through a kubeconfig as a real cluster would be: the claim made, the
//! command run in a pod (a real local sandbox), its exit code returned, the
//! claim given back; kubernetes flags on another tier refused by name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, POOL};
use namzu_k8s_sim::controller::CLAIMS;

/// Where the simulated cluster's sandboxes are claimed, as flags.
const PLACE: [&str; 8] = [
    "--tier",
    "kubernetes",
    "--kube-namespace",
    NAMESPACE,
    "--warm-pool",
    POOL,
    "--kube-address",
    "pod-ip",
];

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
    let c = Cluster::start(None).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), &c.url);
    // The link's credentials, as an operator makes them: the host's into
    // the state directory, the cluster's applied from the manifest (here
    // into the simulator, replacing the ones it started with) before the
    // pool's pods start.
    let link_init = ["kube", "link-init", "--kube-namespace", NAMESPACE];
    let (_, err, code) = namzu(&cfg, &dir.path().join("state"), &link_init).await;
    assert_eq!(code, Some(0), "{err}");
    let link = dir.path().join("state/kubernetes/link");
    for f in ["ca.crt", "client.crt", "client.key", "cluster.yaml"] {
        assert!(link.join(f).is_file(), "{f}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |f: &str| std::fs::metadata(link.join(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("client.key"), mode("cluster.yaml")), (0o600, 0o600));
    let manifest = std::fs::read_to_string(link.join("cluster.yaml")).unwrap();
    assert!(!manifest.contains(&std::fs::read_to_string(link.join("client.key")).unwrap()[40..80]));
    use serde::Deserialize;
    for doc in serde_yaml::Deserializer::from_str(&manifest) {
        let o = serde_json::Value::deserialize(doc).unwrap();
        let gvr = if o["kind"] == "Secret" {
            namzu_k8s_sim::controller::SECRETS
        } else {
            namzu_k8s_sim::controller::CONFIG_MAPS
        };
        c.sim.put(gvr, o);
    }
    // Made once; replaced only when asked.
    let (_, err, code) = namzu(&cfg, &dir.path().join("state"), &link_init).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("--rotate"), "{err}");
    c.add_pool(1).unwrap();
    assert!(c.pool_ready(1, Duration::from_secs(30)).await);
    let args = [
        &["run"][..],
        &PLACE,
        &["--claim-label", "run=cli", "--", "sh", "-c", "echo in-pod; exit 3"],
    ]
    .concat();
    let (stdout, stderr, code) = namzu(&cfg, &dir.path().join("state"), &args).await;
    assert_eq!(stdout, "in-pod\n", "{stderr}");
    assert_eq!(code, Some(3));
    let left: Vec<_> = c
        .sim
        .all(CLAIMS)
        .into_iter()
        .filter(|o| o["metadata"]["labels"]["run"] == "cli")
        .collect();
    assert!(left.is_empty(), "the claim outlived the run: {left:?}");
    c.stop().await;
}

/// Runs `namzu ARGS` with no cluster, asserts it fails, gives its stderr.
fn refused(state: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(args)
        .env("NAMZU_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn kubernetes_flags_on_another_tier_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(
        dir.path(),
        &["run", "--tier", "local", "--warm-pool", "p", "--", "true"],
    );
    assert!(
        err.contains("--warm-pool") && err.contains("--tier kubernetes"),
        "{err}"
    );
    // A docker runtime on a cluster is refused, not ignored.
    let err = refused(
        dir.path(),
        &[
            "create",
            "--tier",
            "kubernetes",
            "--runtime",
            "runsc",
            "--warm-pool",
            "p",
        ],
    );
    assert!(err.contains("--runtime") && err.contains("not kubernetes"), "{err}");
    // Where to acquire is required, and said so by option name.
    let err = refused(dir.path(), &["create", "--tier", "kubernetes"]);
    assert!(
        err.contains("warm_pool_name") && err.contains("SandboxTemplate"),
        "{err}"
    );
}

/// Runs `namzu ARGS` against the simulated cluster; (stdout, stderr, code).
async fn namzu(cfg: &std::path::Path, state: &std::path::Path, args: &[&str]) -> (String, String, Option<i32>) {
    let (cfg, state) = (cfg.to_owned(), state.to_owned());
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_namzu"))
            .args(&args)
            .env("KUBECONFIG", cfg)
            .env("NAMZU_STATE_DIR", state)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_ls_rm_capacity_and_release_reach_a_kubernetes_sandbox_by_id() {
    let c = Cluster::start(Some(2)).await.unwrap();
    assert!(c.pool_ready(2, Duration::from_secs(30)).await);
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), &c.url);
    let state = dir.path().join("state");
    let create = |label: &'static str| {
        let mut a = vec!["create"];
        a.extend(PLACE);
        a.extend(["--claim-label", label]);
        a
    };
    // No link credentials: refused before anything is claimed.
    let (_, err, code) = namzu(&cfg, &state, &create("job=none")).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("link-init"), "{err}");
    assert_eq!(c.sandbox_objects(CLAIMS), 0);
    c.link.write_host_dir(&state.join("kubernetes/link")).unwrap();
    // Made in one process, reached by id from others.
    let (out, err, code) = namzu(&cfg, &state, &create("job=a")).await;
    assert_eq!(code, Some(0), "{err}");
    let id = out.trim().to_owned();
    assert!(id.starts_with("sb-"), "{out}");
    assert!(state.join("kubernetes").join(format!("{id}.json")).is_file());
    let (out, err, code) = namzu(
        &cfg,
        &state,
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo hi > /workspace/f; cat /workspace/f",
        ],
    )
    .await;
    assert_eq!((out.as_str(), code), ("hi\n", Some(0)), "{err}");
    let (out, _, _) = namzu(&cfg, &state, &["exec", &id, "--", "cat", "/workspace/f"]).await;
    assert_eq!(out, "hi\n", "the same pod, found again");
    let (out, err, code) = namzu(&cfg, &state, &["ls"]).await;
    assert_eq!(code, Some(0), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("kubernetes") && line.contains("up"), "{line}");
    // Headroom: one of the two warm pods is claimed.
    let (out, err, code) = namzu(
        &cfg,
        &state,
        &["kube", "capacity", "--kube-namespace", NAMESPACE, "--warm-pool", POOL],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("active_claims 1") && out.contains("warm_desired  2"),
        "{out}"
    );
    // rm gives the claim back and forgets it.
    let (_, err, code) = namzu(&cfg, &state, &["rm", &id]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(!state.join("kubernetes").join(format!("{id}.json")).exists());
    assert!(c.get(CLAIMS, &format!("namzu-{id}")).is_none());
    let (_, _, code) = namzu(&cfg, &state, &["exec", &id, "--", "true"]).await;
    assert_ne!(code, Some(0), "an id given back still answers");
    // Crash recovery by claim label: only what matches is given back.
    let (keep, _, _) = namzu(&cfg, &state, &create("job=keep")).await;
    let (drop, _, _) = namzu(&cfg, &state, &create("job=drop")).await;
    let (out, err, code) = namzu(
        &cfg,
        &state,
        &[
            "kube",
            "release",
            "--kube-namespace",
            NAMESPACE,
            "--warm-pool",
            POOL,
            "--selector",
            "job=drop",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("namzu-{}", drop.trim()));
    assert!(c.get(CLAIMS, &format!("namzu-{}", keep.trim())).is_some());
    assert!(!state.join("kubernetes").join(format!("{}.json", drop.trim())).exists());
    let (_, err, code) = namzu(&cfg, &state, &["rm", keep.trim()]).await;
    assert_eq!(code, Some(0), "{err}");
    c.stop().await;
}

/// `namzu workspace` on the simulated cluster: create, ls (without
/// waking), suspend (pod gone, disk kept), resume (a new pod), a fenced
/// rm refused below the holder epoch, rm; a pool refused by flag name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_create_ls_suspend_resume_rm_by_name() {
    use namzu_k8s_sim::controller::{PODS, PVCS, SANDBOXES};
    let c = Cluster::start(None).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(dir.path(), &c.url);
    let state = dir.path().join("state");
    c.link.write_host_dir(&state.join("kubernetes/link")).unwrap();
    let ws = |verb: &'static str, extra: &[&'static str]| {
        let mut a = vec!["workspace", verb, "proj"];
        a.extend(["--kube-namespace", NAMESPACE, "--kube-address", "pod-ip"]);
        a.extend(extra);
        a
    };
    let (out, err, code) = namzu(&cfg, &state, &ws("create", &["--epoch", "2"])).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("proj\tcreated\tpod "), "{out}");
    let pod = c.get(PODS, "namzu-ws-proj").unwrap()["metadata"]["uid"].clone();
    let (out, err, code) = namzu(&cfg, &state, &ws("create", &[])).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("adopted"), "{out}");
    let (out, err, code) = namzu(&cfg, &state, &["workspace", "ls", "--kube-namespace", NAMESPACE]).await;
    assert_eq!(code, Some(0), "{err}");
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["proj", "Running", "namzu-workspace", "2"], "{out}");
    let (out, err, code) = namzu(&cfg, &state, &ws("suspend", &["--epoch", "2"])).await;
    assert_eq!((out.as_str(), code), ("proj\tsuspended\n", Some(0)), "{err}");
    assert!(c.get(PODS, "namzu-ws-proj").is_none());
    assert!(c.get(PVCS, "workspace-namzu-ws-proj").is_some());
    assert_eq!(
        c.get(SANDBOXES, "namzu-ws-proj").unwrap()["spec"]["operatingMode"],
        "Suspended"
    );
    let (out, err, code) = namzu(&cfg, &state, &ws("resume", &["--epoch", "2"])).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("resumed"), "{out}");
    assert_ne!(c.get(PODS, "namzu-ws-proj").unwrap()["metadata"]["uid"], pod);
    let (_, err, code) = namzu(&cfg, &state, &ws("rm", &["--epoch", "1"])).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("held at epoch 2"), "{err}");
    assert!(c.get(SANDBOXES, "namzu-ws-proj").is_some());
    let (_, err, code) = namzu(&cfg, &state, &ws("create", &["--warm-pool", "p"])).await;
    assert_ne!(code, Some(0));
    assert!(err.contains("--warm-pool"), "{err}");
    let (out, err, code) = namzu(&cfg, &state, &ws("rm", &["--epoch", "2"])).await;
    assert_eq!((out.as_str(), code), ("proj\tdeleted\n", Some(0)), "{err}");
    assert!(c.get(SANDBOXES, "namzu-ws-proj").is_none());
    c.stop().await;
}
