//! A ready-made simulated cluster for tests and benchmarks: the simulator,
//! its controller running pods as real `local` sandboxes, and the task
//! SandboxTemplate, the SandboxWarmPool and the NetworkPolicy closing the
//! agent port that namzu ships in `deploy/k8s/`, applied as shipped (with
//! the pod link's ConfigMap and Secret, made fresh per cluster) — but
//! for ONE substitution: the template's workload image, `python:3.12-slim`,
//! is not in the simulated node's cache (no registry is reachable here), so
//! the workload runs the real Debian bookworm image of [`crate::images`]
//! instead ([`WORKLOAD_IMAGE`]). The init container and the agent image are
//! as shipped.

use std::sync::Arc;
use std::time::Duration;

use namzu_kubernetes::link::LinkCredentials;
use namzu_kubernetes::KubernetesOptions;
use serde_json::Value;

use crate::controller::{Controller, ControllerConfig, POOLS, TEMPLATES};
use crate::server::Simulator;

/// The namespace of the shipped manifests.
pub const NAMESPACE: &str = "sandboxes";
/// The workload image the simulated cluster's template runs.
pub const WORKLOAD_IMAGE: &str = crate::images::DISTRO_IMAGE;
/// The shipped template's and pool's names.
pub const TEMPLATE: &str = "namzu-task";
pub const POOL: &str = "namzu-pool";

const TEMPLATE_YAML: &str = include_str!("../../../deploy/k8s/sandboxtemplate-task.yaml");
const WORKSPACE_TEMPLATE_YAML: &str = include_str!("../../../deploy/k8s/sandboxtemplate-workspace.yaml");
const POOL_YAML: &str = include_str!("../../../deploy/k8s/sandboxwarmpool.yaml");
const AGENT_PORT_POLICY_YAML: &str = include_str!("../../../deploy/k8s/networkpolicy.yaml");

/// A simulated cluster (see the module docs).
pub struct Cluster {
    pub sim: Arc<Simulator>,
    pub ctl: Arc<Controller>,
    pub url: String,
    /// The pod link's credentials, made for this cluster: its ConfigMap
    /// and Secret are applied; the host's side is in [`Cluster::options`].
    pub link: LinkCredentials,
    _state: tempfile::TempDir,
}

impl Cluster {
    /// Starts the simulator and its controller on the current runtime, with
    /// the shipped template, and the shipped pool scaled to `replicas`
    /// (none at all if `None`).
    pub async fn start(replicas: Option<i64>) -> std::io::Result<Self> {
        Self::start_with(replicas, |_| {}).await
    }

    /// [`Cluster::start`] with the controller configured by `configure`
    /// (its label allowlist, its label delay …).
    pub async fn start_with(
        replicas: Option<i64>,
        configure: impl FnOnce(&mut ControllerConfig),
    ) -> std::io::Result<Self> {
        let state = tempfile::Builder::new().prefix("namzu-k8s-sim.").tempdir()?;
        let agent_bin = namzu::backend::find_agent_binary().map_err(std::io::Error::other)?;
        let sim = Simulator::new();
        let url = sim.serve().await?;
        crate::images::link_cache(state.path(), &agent_bin)?;
        let mut cfg = ControllerConfig::new(state.path().to_path_buf(), agent_bin);
        configure(&mut cfg);
        let ctl = Controller::start(&sim, cfg);
        let parse = |y: &str| serde_yaml::from_str::<Value>(y).map_err(std::io::Error::other);
        let mut template = parse(TEMPLATE_YAML)?;
        template["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = WORKLOAD_IMAGE.into();
        sim.put(TEMPLATES, template);
        let mut workspace = parse(WORKSPACE_TEMPLATE_YAML)?;
        workspace["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = WORKLOAD_IMAGE.into();
        sim.put(TEMPLATES, workspace);
        sim.put(crate::controller::NETWORK_POLICIES, parse(AGENT_PORT_POLICY_YAML)?);
        let link = LinkCredentials::generate().map_err(std::io::Error::other)?;
        let [ca, secret] = link.cluster_objects(NAMESPACE);
        sim.put(crate::controller::CONFIG_MAPS, ca);
        sim.put(crate::controller::SECRETS, secret);
        let c = Self {
            sim,
            ctl,
            url,
            link,
            _state: state,
        };
        if let Some(n) = replicas {
            c.add_pool(n)?;
        }
        Ok(c)
    }

    /// Applies the shipped pool, scaled to `replicas`.
    pub fn add_pool(&self, replicas: i64) -> std::io::Result<()> {
        let mut pool = serde_yaml::from_str::<Value>(POOL_YAML).map_err(std::io::Error::other)?;
        pool["spec"]["replicas"] = replicas.into();
        self.sim.put(POOLS, pool);
        Ok(())
    }

    /// A kube client for the simulator's API.
    pub fn client(&self) -> kube::Client {
        let uri = self.url.parse().unwrap_or_default();
        kube::Client::try_from(kube::Config::new(uri)).unwrap_or_else(|e| unreachable!("a plain http config: {e}"))
    }

    /// Backend options for this cluster: claims on the pool, or Sandboxes
    /// from the template; `service` addresses resolved by the simulated
    /// cluster DNS.
    pub fn options(&self, warm_pool: bool) -> KubernetesOptions {
        KubernetesOptions {
            namespace: NAMESPACE.into(),
            warm_pool_name: warm_pool.then(|| POOL.into()),
            template_name: (!warm_pool).then(|| TEMPLATE.into()),
            resolution: self.ctl.resolution(),
            link_tls: Some(
                self.link
                    .host_tls()
                    .unwrap_or_else(|e| unreachable!("generated credentials: {e}")),
            ),
            ..Default::default()
        }
    }

    /// An object in the cluster's namespace, as stored.
    pub fn get(&self, (g, v, p): crate::Gvr, name: &str) -> Option<Value> {
        self.sim.object(g, v, p, NAMESPACE, name)
    }

    /// How many objects of `gvr` namzu made for a sandbox (`namzu-sb-*`):
    /// what a released acquire leaves behind, which must be none.
    pub fn sandbox_objects(&self, gvr: crate::Gvr) -> usize {
        self.sim
            .all(gvr)
            .iter()
            .filter(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("namzu-sb-")
            })
            .count()
    }

    /// Waits until the pool reports `replicas` ready pods.
    pub async fn pool_ready(&self, replicas: i64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            let ready = self
                .sim
                .object(POOLS.0, POOLS.1, POOLS.2, NAMESPACE, POOL)
                .and_then(|p| p["status"]["readyReplicas"].as_i64());
            if ready == Some(replicas) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// The node's state directory (pods' sandboxes, volumes, images).
    pub fn state_dir(&self) -> &std::path::Path {
        self._state.path()
    }

    /// Stops every pod's sandbox.
    pub async fn stop(&self) {
        self.ctl.shutdown().await;
    }
}

impl Drop for Cluster {
    /// The safety net of a test that panicked before [`Cluster::stop`]:
    /// pods are sandboxes built to outlive their host process, so every
    /// process recorded for this cluster's pods is killed, by identity.
    fn drop(&mut self) {
        self.ctl.release_network();
        let pods = namzu::backend::local::LocalProvider::with_agent(self._state.path(), "namzu-agent");
        let procs = pods.recorded_processes();
        for _ in 0..3 {
            if procs.iter().filter(|p| p.kill()).count() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
