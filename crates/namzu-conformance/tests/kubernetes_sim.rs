//! The conformance suite on the `kubernetes` tier, against the control-plane
//! SIMULATOR (`namzu-k8s-sim`): task sandboxes claimed from the shipped warm
//! pool, whose pods are real `local` sandboxes running the real agent, reached
//! over the pod network with mutual TLS and the pod's uid as the bind token.
//! The simulator runs on a runtime of its own for the whole run; every pod is
//! stopped at the end.

#[path = "support/k8s_sim.rs"]
mod k8s_sim;

/// What the kubernetes tier refuses by name: a task sandbox is the
/// template's pod, so a case that needs a spec of its own cannot run.
const CANNOT: &[(&str, &str)] = &[];

fn main() -> std::process::ExitCode {
    let cluster = match k8s_sim::start(Some(2), true) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("conformance[kubernetes-sim]: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = namzu_conformance::run_main_except("kubernetes-sim", cluster.factory(), CANNOT);
    cluster.stop();
    code
}
