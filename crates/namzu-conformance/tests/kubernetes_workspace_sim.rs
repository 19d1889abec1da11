//! The conformance suite on the `kubernetes` tier's persistent
//! WORKSPACES, against the control-plane SIMULATOR (`namzu-k8s-sim`): each
//! case opens a workspace of its own (a Sandbox from the shipped workspace
//! template, its /workspace on a PVC the simulated node keeps), whose pod
//! is a real `local` sandbox running the real agent over mutual TLS; the
//! guest's destroy suspends the workspace. Every pod is stopped at the end.

#[path = "support/k8s_sim.rs"]
mod k8s_sim;

/// Nothing is refused: a workspace takes the spec's environment and agent
/// limits at its creation, as a task sandbox takes them on its claim.
const CANNOT: &[(&str, &str)] = &[];

fn main() -> std::process::ExitCode {
    let cluster = match k8s_sim::start(None, false) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("conformance[kubernetes-workspace-sim]: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = namzu_conformance::run_main_except("kubernetes-workspace-sim", cluster.workspace_factory(), CANNOT);
    cluster.stop();
    code
}
