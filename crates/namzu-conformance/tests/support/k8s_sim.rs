//! The control-plane SIMULATOR on a thread and runtime of its own for a
//! whole test binary (libtest-mimic trials make their own runtimes), and a
//! factory that acquires task sandboxes from it as a host would: through
//! a kube client to its URL.

use std::sync::Arc;

use namzu::backend::kubernetes::{KubernetesOptions, KubernetesProvider};
use namzu::Provider;
use namzu_k8s_sim::cluster::Cluster;

/// A running simulated cluster; [`SimCluster::stop`] stops every pod.
pub struct SimCluster {
    url: String,
    opts: KubernetesOptions,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Starts a cluster with the shipped pool at `replicas` (none if `None`);
/// sandboxes are claimed from the pool when `warm_pool`, else made from
/// the template.
pub fn start(replicas: Option<i64>, warm_pool: bool) -> Result<SimCluster, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(String, KubernetesOptions), String>>();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = match tokio::runtime::Runtime::new() {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        rt.block_on(async move {
            let c = match Cluster::start(replicas).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok((c.url.clone(), c.options(warm_pool))));
            let _ = stop_rx.await;
            c.stop().await;
        });
    });
    let (url, opts) = ready_rx
        .recv()
        .map_err(|e| format!("the simulator thread died: {e}"))?
        .map_err(|e| format!("the simulator did not start: {e}"))?;
    Ok(SimCluster {
        url,
        opts,
        stop,
        thread,
    })
}

impl SimCluster {
    /// Acquires a task sandbox per call, through a client to the simulator.
    #[allow(dead_code)] // each test binary uses one of the two factories
    pub fn factory(&self) -> namzu_conformance::Factory {
        let (url, opts) = (self.url.clone(), self.opts.clone());
        Arc::new(move |spec| {
            let (url, opts) = (url.clone(), opts.clone());
            Box::pin(async move { provider(&url, opts)?.create(spec).await })
        })
    }

    /// Opens a new persistent workspace per call (a fresh name, so each is
    /// created with the spec's environment) and hands out its running
    /// guest; the guest's destroy suspends it, keeping its disk.
    #[allow(dead_code)]
    pub fn workspace_factory(&self) -> namzu_conformance::Factory {
        let (url, opts) = (self.url.clone(), self.opts.clone());
        Arc::new(move |spec| {
            let (url, opts) = (url.clone(), opts.clone());
            Box::pin(async move {
                let w = namzu::backend::kubernetes::WorkspaceOptions::for_spec(&spec)?;
                let name = format!("c{:010x}", rand::random::<u64>() & 0xff_ffff_ffff);
                provider(&url, opts)?.workspace(&name, w).await?.sandbox().await
            })
        })
    }

    /// Stops every pod and the simulator.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// A provider on a kube client to the simulator at `url`.
fn provider(url: &str, opts: KubernetesOptions) -> Result<KubernetesProvider, namzu::Error> {
    let uri = url.parse().map_err(|e| namzu::Error::InvalidArgument {
        op: "simulator url".into(),
        message: format!("{e}"),
    })?;
    let client = kube::Client::try_from(kube::Config::new(uri)).map_err(|e| namzu::Error::InvalidArgument {
        op: "kube client".into(),
        message: e.to_string(),
    })?;
    KubernetesProvider::new(client, opts)
}
