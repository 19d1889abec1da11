//! The escape suite inside a pod of the `kubernetes` tier, against the
//! control-plane SIMULATOR (`namzu-k8s-sim`): the pod is claimed from the
//! shipped template, runs the workload image with the agent its init
//! container installed, and is reached over the pod network with mutual
//! TLS. Every attempt must fail; `escape suite (kubernetes-sim): N
//! attempted, 0 succeeded` is printed for CI. Among the attempts: a
//! command speaking to the pod's agent port on loopback with the pod's uid
//! — the bind token a namespace reader sees — as the host would.

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::kubernetes::KubernetesSandbox;
use namzu_conformance::escape::suite;

#[path = "support/k8s_sim.rs"]
mod k8s_sim;

/// The pods are `local` sandboxes: the local tier's expectations, but for
/// the read-only bind, which the kubernetes tier does not take.
const POD: suite::Expect = suite::Expect {
    host_may_lack: suite::HOST_MAY_LACK,
    invariants: suite::LOCAL_INVARIANTS,
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
    let cluster = k8s_sim::start(None, false);
    let factory = cluster.as_ref().map(k8s_sim::SimCluster::factory).map_err(Clone::clone);
    let trial = Trial::test("escape_attempts_all_fail_inside_a_pod", move || {
        let factory = factory.map_err(Failed::from)?;
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
        let veth = namzu_k8s_sim::podnet::Mode::detect() == namzu_k8s_sim::podnet::Mode::Veth;
        // The test command sets the machine up for pod networks: there, a
        // run without one is a broken setup, not a pass.
        if std::env::var("NAMZU_REQUIRE_NET").as_deref() == Ok("1") && !veth {
            return Err(Failed::from(
                "NAMZU_REQUIRE_NET=1 but the simulator has no veth pod network",
            ));
        }
        if veth && !link.contains("TLS alert") {
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
    if let Ok(c) = cluster {
        c.stop();
    }
    conclusion.exit_code()
}
