//! The conformance suite on the `kubernetes` tier, against the control-plane
//! SIMULATOR (`namzu-k8s-sim`): task sandboxes claimed from the shipped warm
//! pool, whose pods are real `local` sandboxes running the real agent, reached
//! over TCP with the pod's uid as the bind token. The simulator runs on a
//! runtime of its own for the whole run; every pod is stopped at the end.

use std::sync::Arc;

use namzu::backend::kubernetes::{KubernetesOptions, KubernetesProvider};
use namzu::Provider;
use namzu_k8s_sim::cluster::Cluster;

/// What the kubernetes tier refuses by name: a task sandbox is the
/// template's pod, so a case that needs a spec of its own cannot run.
const CANNOT: &[(&str, &str)] = &[];

fn main() -> std::process::ExitCode {
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
            let c = match Cluster::start(Some(2)).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok((c.url.clone(), c.options(true))));
            let _ = stop_rx.await;
            c.stop().await;
        });
    });
    let (url, opts) = match ready_rx.recv() {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            eprintln!("conformance[kubernetes-sim]: the simulator did not start: {e}");
            return std::process::ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("conformance[kubernetes-sim]: the simulator thread died: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let factory: namzu_conformance::Factory = Arc::new(move |spec| {
        let (url, opts) = (url.clone(), opts.clone());
        Box::pin(async move {
            let uri = url.parse().map_err(|e| namzu::Error::InvalidArgument {
                op: "simulator url".into(),
                message: format!("{e}"),
            })?;
            let client = kube::Client::try_from(kube::Config::new(uri)).map_err(|e| namzu::Error::InvalidArgument {
                op: "kube client".into(),
                message: e.to_string(),
            })?;
            KubernetesProvider::new(client, opts)?.create(spec).await
        })
    });
    let code = namzu_conformance::run_main_except("kubernetes-sim", factory, CANNOT);
    let _ = stop_tx.send(());
    let _ = cluster.join();
    code
}
