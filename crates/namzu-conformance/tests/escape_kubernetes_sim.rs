//! The escape suite inside a pod of the `kubernetes` tier, against the
//! control-plane SIMULATOR (`namzu-k8s-sim`): the pod is claimed from the
//! shipped template, runs the workload image with the agent its init
//! container installed, and is reached over the pod network with mutual
//! TLS. Every attempt must fail; `escape suite (kubernetes-sim): N
//! attempted, 0 succeeded` is printed for CI. Among the attempts: a
//! command speaking to the pod's agent port on loopback with the pod's uid
//! — the bind token a namespace reader sees — as the host would.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::kubernetes::{KubernetesOptions, KubernetesProvider, KubernetesSandbox};
use namzu::Provider;
use namzu_conformance::escape::suite;
use namzu_k8s_sim::cluster::Cluster;

/// The pods are `local` sandboxes: the local tier's expectations, but for
/// the read-only bind, which the kubernetes tier does not take.
const POD: suite::Expect = suite::Expect {
    host_may_lack: suite::HOST_MAY_LACK,
    invariants: &[
        (
            "kill the agent",
            "the kernel drops SIGKILL sent to a pid namespace's init from inside it",
        ),
        (
            "mknod a block device",
            "device nodes need CAP_MKNOD in the initial user namespace",
        ),
        (
            "mknod /dev/mem's twin",
            "device nodes need CAP_MKNOD in the initial user namespace",
        ),
        (
            "read the kernel log (syslog)",
            "the kernel log needs CAP_SYSLOG in the initial user namespace",
        ),
        (
            "read kernel addresses from /proc/kallsyms",
            "real addresses need CAP_SYSLOG in the initial user namespace",
        ),
        (
            "load a bpf program",
            "bpf needs CAP_BPF or CAP_SYS_ADMIN in the initial user namespace",
        ),
    ],
    known_gaps: &[],
    tier_lacks: &[
        (
            "write a 0666 file under a read-only mount",
            "the kubernetes tier takes no binds: there is no read-only bind in a pod",
        ),
        (
            "create a file in a 0777 directory under a read-only mount",
            "the kubernetes tier takes no binds: there is no read-only bind in a pod",
        ),
    ],
};

const LINK_ATTEMPT: &str = "act as the host on the agent's link";

/// The token a pod's agent takes: its pod's uid.
fn pod_uid(sb: &namzu::Sandbox) -> String {
    sb.backend::<KubernetesSandbox>()
        .map(|k| k.current_pod().uid)
        .unwrap_or_default()
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(String, KubernetesOptions), String>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cluster = std::thread::spawn(move || {
        let rt = match tokio::runtime::Runtime::new() {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        rt.block_on(async move {
            let c = match Cluster::start(None).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok((c.url.clone(), c.options(false))));
            let _ = stop_rx.await;
            c.stop().await;
        });
    });
    let started = ready_rx
        .recv()
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("the simulator did not start: {e}")));
    let trial = Trial::test("escape_attempts_all_fail_inside_a_pod", move || {
        let (url, opts) = started.map_err(Failed::from)?;
        let factory: namzu_conformance::Factory = Arc::new(move |spec| {
            let (url, opts) = (url.clone(), opts.clone());
            Box::pin(async move {
                let uri = url.parse().map_err(|e| namzu::Error::InvalidArgument {
                    op: "simulator url".into(),
                    message: format!("{e}"),
                })?;
                let client =
                    kube::Client::try_from(kube::Config::new(uri)).map_err(|e| namzu::Error::InvalidArgument {
                        op: "kube client".into(),
                        message: e.to_string(),
                    })?;
                KubernetesProvider::new(client, opts)?.create(spec).await
            })
        });
        let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
        let shape = suite::TierShape {
            binds: false,
            link_token: Some(pod_uid),
        };
        let report = rt
            .block_on(suite::run_on(&factory, Default::default(), &shape))
            .map_err(Failed::from)?;
        suite::print(&report, "kubernetes-sim", &POD);
        suite::check(&report, &POD).map_err(Failed::from)?;
        // With a pod network namespace (root), the agent port IS there on
        // the pod's loopback: the attempt must have reached the agent and
        // been refused by it, not found the port closed.
        let link = report
            .inside
            .get(LINK_ATTEMPT)
            .map(|l| l.detail.clone())
            .unwrap_or_default();
        if namzu_k8s_sim::podnet::Mode::detect() == namzu_k8s_sim::podnet::Mode::Veth && !link.contains("TLS alert") {
            return Err(Failed::from(format!(
                "{LINK_ATTEMPT}: the agent was not what refused it: {link}"
            )));
        }
        println!(
            "{LINK_ATTEMPT}: inside: {link}; control: {:?}",
            report.control.get(LINK_ATTEMPT)
        );
        Ok(())
    });
    let conclusion = libtest_mimic::run(&args, vec![trial]);
    let _ = stop_tx.send(());
    let _ = cluster.join();
    conclusion.exit_code()
}
