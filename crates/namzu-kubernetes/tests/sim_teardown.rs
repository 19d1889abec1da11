//! The control-plane SIMULATOR's teardown: a cluster stopped, or dropped
//! with its runtime, while its pods' sandboxes are still starting leaves
//! no process behind — a pod is a real local sandbox, built to outlive
//! the process that started it, so one that escapes teardown lives on on
//! the CI machine.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use namzu_k8s_sim::cluster::Cluster;

/// Live processes whose command line names `dir` (a pod's launcher runs
/// on a spec beneath the cluster's state directory, and its forks keep
/// that command line).
fn naming(dir: &str) -> Vec<u32> {
    let live = |pid: &u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(dir))
        })
        .filter(live)
        .collect()
}

/// Pods of the pool are mid-start at every stop below: the first right
/// after the pool was made, the later ones as the first pods come up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_pods_start_leaves_no_process() {
    for delay_ms in [0u64, 5, 15, 40] {
        let c = Cluster::start(Some(3)).await.unwrap();
        let dir = c.state_dir().to_string_lossy().into_owned();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        c.stop().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let left = naming(&dir);
        assert!(
            left.is_empty(),
            "a stop {delay_ms} ms into the pool's start left {left:?}"
        );
        drop(c);
    }
}

/// A test that ends without `stop` (one that failed, say) drops its
/// cluster and then its runtime, which cancels pod starts mid-way. The
/// drops that matter land while a pod's launcher runs but before its
/// processes are recorded (what `Cluster`'s own drop kills): they are
/// counted, and the delays step on until enough did.
#[test]
fn a_cluster_dropped_with_its_runtime_mid_start_leaves_no_process() {
    let mut unrecorded = 0;
    for delay_ms in (0u64..=90).step_by(3) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let c = rt.block_on(Cluster::start(Some(3))).unwrap();
        let dir = c.state_dir().to_string_lossy().into_owned();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let recorded: Vec<u32> = namzu::backend::local::LocalProvider::with_agent(c.state_dir(), "namzu-agent")
            .recorded_processes()
            .iter()
            .map(|p| p.pid)
            .collect();
        if naming(&dir).iter().any(|p| !recorded.contains(p)) {
            unrecorded += 1;
        }
        drop(c);
        drop(rt);
        std::thread::sleep(Duration::from_millis(100));
        let left = naming(&dir);
        assert!(
            left.is_empty(),
            "a cluster dropped {delay_ms} ms into the pool's start left {left:?}"
        );
        if unrecorded >= 3 {
            return;
        }
    }
    panic!("only {unrecorded} drops landed while a pod's launcher ran unrecorded");
}
