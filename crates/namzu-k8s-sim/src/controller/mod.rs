//! The simulator's agent-sandbox controller and kubelet, following the
//! upstream controller's documented behaviour for the parts namzu relies
//! on — and running REAL sandboxes as pods:
//!
//! * a SandboxWarmPool keeps `replicas` unclaimed Sandboxes from its
//!   template (owned by the pool), and reports `replicas`/`readyReplicas`;
//! * a SandboxClaim on a pool is refused for good (`Ready=False`,
//!   `WarmPoolNotFound` / `TemplateNotFound`) or bound: it adopts one of the
//!   pool's Sandboxes (a cold one is made when none is left), whose pod gets
//!   the claim's `additionalPodMetadata`; the claim's `status.sandbox.name`
//!   names it and its `Ready` mirrors the Sandbox's;
//! * a Sandbox gets a pod of its own name from its `podTemplate`, a
//!   headless Service FQDN (`<name>.<namespace>.svc.cluster.local`, served
//!   by [`Controller::resolution`]) and `Ready` when its pod is;
//! * `shutdownTime` with policy `Delete` deletes a claim or Sandbox once it
//!   passes, and owner references cascade: claim → Sandbox → pod;
//! * every pod is a real `local`-tier sandbox (user, mount, pid, net
//!   namespaces, seccomp) running the real agent, started with the bind
//!   token its container's `NAMZU_AGENT_TOKEN` names through the downward
//!   API (the pod's uid). The pod network is simulated: the pod's IP is a
//!   loopback address of its own (127.0.x.y), whose port relays to the
//!   sandbox's agent socket.
//!
//! Pod faults ([`PodFault`]) make new pods unschedulable, unable to pull
//! their image, or run the agent with no confinement at all (the host tier:
//! what a pod without the restricted security context amounts to), and a
//! pod can be replaced (new uid, new IP) right after it is read.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use namzu::backend::host::HostProvider;
use namzu::backend::local::LocalProvider;
use namzu::{Sandbox, SandboxSpec};
use namzu_kubernetes::build::until;
use namzu_kubernetes::NameResolution;
use serde_json::{json, Value};

mod claims;
mod pods;

use crate::podnet::{self, PodNet};
use crate::server::{new_uid, now_rfc3339, Gvr, PodReadHook, Simulator};

pub const PODS: Gvr = ("", "v1", "pods");
pub const SANDBOXES: Gvr = ("agents.x-k8s.io", "v1beta1", "sandboxes");
pub const CLAIMS: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims");
pub const TEMPLATES: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates");
pub const POOLS: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools");
pub const NETWORK_POLICIES: Gvr = ("networking.k8s.io", "v1", "networkpolicies");
pub const CILIUM_POLICIES: Gvr = ("cilium.io", "v2", "ciliumnetworkpolicies");
pub const ADMISSION_POLICIES: Gvr = ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies");
pub const ADMISSION_BINDINGS: Gvr = (
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
);

/// The label a pool puts on the Sandboxes it holds.
pub const POOL_LABEL: &str = "agents.x-k8s.io/warm-pool";

/// What goes wrong with pods created while the fault is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodFault {
    /// `PodScheduled=False`, reason `Unschedulable`: no node has room.
    Unschedulable,
    /// The container waits in `ImagePullBackOff`.
    ImagePull,
    /// The pod runs, but its agent is confined by nothing.
    Unconfined,
}

/// Where pods run.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// State directory of the pods' local sandboxes.
    pub state_dir: PathBuf,
    pub agent_bin: PathBuf,
    /// How often the controller reconciles.
    pub tick: Duration,
}

/// A running pod: its sandbox and its place on the pod network.
struct PodRuntime {
    uid: String,
    net: PodNet,
    sandbox: Sandbox,
}

impl PodRuntime {
    /// A deleted pod: its processes end first (their connections see the
    /// close), then it leaves the network.
    async fn stop(self) {
        let _ = self.sandbox.destroy().await;
        self.net.detach().await;
    }

    /// An evicted pod: off the network at once (its IP stops answering
    /// before anyone can dial it), its sandbox destroyed after.
    async fn evict(self) {
        self.net.detach().await;
        let sb = self.sandbox;
        tokio::spawn(async move {
            let _ = sb.destroy().await;
        });
    }
}

#[derive(Default)]
struct State {
    /// `ns/name` → the pod's runtime.
    running: HashMap<String, PodRuntime>,
    /// `ns/name` of pods being started.
    starting: HashSet<String>,
    /// How many of the next pod reads replace the pod they read.
    replace_on_read: usize,
}

/// The controller (see the module docs).
pub struct Controller {
    sim: Weak<Simulator>,
    cfg: ControllerConfig,
    local: LocalProvider,
    host: HostProvider,
    state: Mutex<State>,
    fault: Mutex<Option<PodFault>>,
    /// Bind claims without giving their pods `additionalPodMetadata`
    /// (a controller whose label allowlist drops them).
    drop_claim_labels: std::sync::atomic::AtomicBool,
    net: podnet::Mode,
    /// Whether this controller let go of the pod range's route.
    released: std::sync::atomic::AtomicBool,
    stopped: std::sync::atomic::AtomicBool,
    /// Tells this controller's veth pairs from another's in the process.
    id: u64,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn meta<'a>(o: &'a Value, field: &str) -> &'a str {
    o["metadata"][field].as_str().unwrap_or_default()
}

fn owner_of(o: &Value, kind: &str) -> Option<(String, String)> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["kind"] == kind)
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_owned(),
                r["uid"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

fn owner_ref(api_version: &str, kind: &str, o: &Value) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": meta(o, "name"), "uid": meta(o, "uid"), "controller": true}])
}

fn condition(kind: &str, ready: bool, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": if ready { "True" } else { "False" }, "reason": reason,
        "message": message, "lastTransitionTime": now_rfc3339()})
}

fn is_ready(o: &Value) -> bool {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether a `shutdownTime` with policy `Delete` has passed.
fn expired(time: &Value, policy: &Value, now: SystemTime) -> bool {
    policy.as_str() != Some("Retain") && time.as_str().is_some_and(|t| until(t, now).is_none())
}

impl Controller {
    /// Starts the controller on `sim` (once; later calls return the first).
    pub fn start(sim: &Arc<Simulator>, cfg: ControllerConfig) -> Arc<Controller> {
        let ctl = Arc::new(Controller {
            sim: Arc::downgrade(sim),
            local: LocalProvider::with_agent(&cfg.state_dir, &cfg.agent_bin),
            host: HostProvider::with_agent(&cfg.state_dir, &cfg.agent_bin),
            cfg,
            state: Mutex::default(),
            fault: Mutex::default(),
            drop_claim_labels: std::sync::atomic::AtomicBool::new(false),
            net: podnet::Mode::detect(),
            released: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::atomic::AtomicBool::new(false),
            id: rand::random(),
        });
        if sim.controller.set(ctl.clone()).is_err() {
            let standing: Option<Arc<dyn std::any::Any + Send + Sync>> = sim.controller.get().cloned().map(|c| c as _);
            return standing.and_then(|c| c.downcast::<Controller>().ok()).unwrap_or(ctl);
        }
        if ctl.net == podnet::Mode::Veth {
            podnet::hold_range();
        }
        let weak = Arc::downgrade(&ctl);
        tokio::spawn(async move {
            loop {
                let Some(ctl) = weak.upgrade() else { return };
                let Some(sim) = ctl.sim.upgrade() else { return };
                if ctl.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                ctl.reconcile(&sim);
                let tick = ctl.cfg.tick;
                drop((ctl, sim));
                tokio::time::sleep(tick).await;
            }
        });
        ctl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, bind claims without putting their
    /// `additionalPodMetadata` labels on the pod.
    pub fn drop_claim_pod_labels(&self, drop: bool) {
        self.drop_claim_labels.store(drop, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sets (or clears) the fault of pods created from now on.
    pub fn set_pod_fault(&self, fault: Option<PodFault>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// Replaces the pod the next successful pod read returns, right after
    /// that read: the reader holds the old uid and IP, which stop answering
    /// at once, while a new pod of the same name (a new uid) starts.
    pub fn replace_next_pod_read(&self) {
        self.lock().replace_on_read += 1;
    }

    /// Lets go of the pod range's route (once; [`Controller::shutdown`]
    /// does it, and a dropped test cluster if shutdown never ran).
    pub fn release_network(&self) {
        if self.net == podnet::Mode::Veth && !self.released.swap(true, std::sync::atomic::Ordering::SeqCst) {
            podnet::remove_all(self.id);
            podnet::release_range();
        }
    }

    /// How pods are reached (see [`podnet`]).
    pub fn pod_network(&self) -> podnet::Mode {
        self.net
    }

    /// How many pods run now (real sandboxes).
    pub fn running_pods(&self) -> usize {
        self.lock().running.len()
    }

    /// The cluster DNS of the simulated Services: `<sandbox>.<ns>.svc.
    /// cluster.local` resolves to its pod's IP while the pod runs.
    pub fn resolution(self: &Arc<Self>) -> NameResolution {
        let weak = Arc::downgrade(self);
        NameResolution::Custom(Arc::new(move |fqdn: &str| {
            let ctl = weak.upgrade()?;
            let (name, rest) = fqdn.split_once('.')?;
            let ns = rest.strip_suffix(".svc.cluster.local")?;
            let st = ctl.lock();
            let pod = st.running.get(&key(ns, name))?;
            Some(vec![IpAddr::V4(pod.net.ip)])
        }))
    }

    /// Called by the API after a pod read: replaces the pod if asked to.
    async fn replace_if_asked(&self, sim: &Simulator, ns: &str, name: &str) {
        {
            let mut st = self.lock();
            if st.replace_on_read == 0 || !st.running.contains_key(&key(ns, name)) {
                return;
            }
            st.replace_on_read -= 1;
        }
        self.replace_pod(sim, ns, name).await;
    }

    /// Evicts pod `ns/name` now and puts a new pod (same name, new uid)
    /// in its place, as a controller replacing an evicted pod does: the old
    /// IP stops answering at once; the new pod starts like any other.
    pub async fn replace_pod(&self, sim: &Simulator, ns: &str, name: &str) {
        let old = self.lock().running.remove(&key(ns, name));
        if let Some(rt) = old {
            rt.evict().await;
        }
        if let Some(mut pod) = sim.remove(PODS, ns, name) {
            if let Some(m) = pod["metadata"].as_object_mut() {
                m.remove("uid");
            }
            pod["status"] = json!({"phase": "Pending"});
            sim.put(PODS, pod);
        }
    }

    /// Stops reconciling and every pod's sandbox, those still starting
    /// included (test teardown).
    pub async fn shutdown(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.lock().starting.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all: Vec<PodRuntime> = self.lock().running.drain().map(|(_, r)| r).collect();
        for rt in all {
            rt.stop().await;
        }
        self.release_network();
    }

    /// One pass over the store.
    fn reconcile(self: &Arc<Self>, sim: &Arc<Simulator>) {
        let now = SystemTime::now();
        // Expiry.
        for c in sim.all(CLAIMS) {
            let l = &c["spec"]["lifecycle"];
            if expired(&l["shutdownTime"], &l["shutdownPolicy"], now) {
                sim.remove(CLAIMS, meta(&c, "namespace"), meta(&c, "name"));
            }
        }
        for s in sim.all(SANDBOXES) {
            if expired(&s["spec"]["shutdownTime"], &s["spec"]["shutdownPolicy"], now) {
                sim.remove(SANDBOXES, meta(&s, "namespace"), meta(&s, "name"));
            }
        }
        // Owner references cascade, as the garbage collector does: an
        // object whose owner's uid is gone goes too (claim or pool →
        // Sandbox → its pod and its per-sandbox policy).
        for gvr in [SANDBOXES, PODS, CILIUM_POLICIES] {
            let live: HashSet<String> = [CLAIMS, POOLS, SANDBOXES]
                .into_iter()
                .flat_map(|g| sim.all(g))
                .map(|o| meta(&o, "uid").to_owned())
                .collect();
            for o in sim.all(gvr) {
                let owners = o["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
                if owners
                    .iter()
                    .any(|r| !live.contains(r["uid"].as_str().unwrap_or_default()))
                {
                    sim.remove(gvr, meta(&o, "namespace"), meta(&o, "name"));
                }
            }
        }
        self.pools(sim);
        self.claims(sim);
        self.sandboxes(sim);
        self.pods(sim);
    }

    fn template(sim: &Simulator, ns: &str, name: &str) -> Option<Value> {
        sim.all(TEMPLATES)
            .into_iter()
            .find(|t| meta(t, "namespace") == ns && meta(t, "name") == name)
    }

    /// A Sandbox from `template`, owned by `owner`.
    fn sandbox_from(template: &Value, ns: &str, name: &str, labels: Value, owner: Value) -> Value {
        json!({
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": owner},
            "spec": {"podTemplate": template["spec"]["podTemplate"].clone(), "service": true},
        })
    }

    fn pools(&self, sim: &Simulator) {
        let sandboxes = sim.all(SANDBOXES);
        for pool in sim.all(POOLS) {
            let (ns, name) = (meta(&pool, "namespace"), meta(&pool, "name"));
            let held: Vec<&Value> = sandboxes
                .iter()
                .filter(|s| owner_of(s, "SandboxWarmPool").is_some_and(|(_, u)| u == meta(&pool, "uid")))
                .collect();
            let want = usize::try_from(pool["spec"]["replicas"].as_i64().unwrap_or(0)).unwrap_or(0);
            let tname = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or_default();
            if let Some(t) = Self::template(sim, ns, tname) {
                for _ in held.len()..want {
                    let sname = format!("{name}-{:05x}", rand::random::<u32>() & 0xfffff);
                    let owner = owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool", &pool);
                    sim.put(
                        SANDBOXES,
                        Self::sandbox_from(&t, ns, &sname, json!({POOL_LABEL: name}), owner),
                    );
                }
            }
            let ready = held.iter().filter(|s| is_ready(s)).count();
            let mut next = pool.clone();
            next["status"] = json!({"replicas": held.len(), "readyReplicas": ready,
                "observedGeneration": pool["metadata"]["generation"].clone()});
            if next["status"] != pool["status"] {
                sim.put(POOLS, next);
            }
        }
    }

    fn sandboxes(&self, sim: &Simulator) {
        let pods = sim.all(PODS);
        for sb in sim.all(SANDBOXES) {
            let (ns, name) = (meta(&sb, "namespace"), meta(&sb, "name"));
            let pod = pods
                .iter()
                .find(|p| meta(p, "namespace") == ns && meta(p, "name") == name);
            let Some(pod) = pod else {
                let tpl = &sb["spec"]["podTemplate"];
                sim.put(
                    PODS,
                    json!({
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": name, "namespace": ns,
                            "labels": tpl["metadata"]["labels"].clone(),
                            "annotations": tpl["metadata"]["annotations"].clone(),
                            "ownerReferences": owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", &sb)},
                        "spec": tpl["spec"].clone(),
                        "status": {"phase": "Pending"},
                    }),
                );
                continue;
            };
            let ready = is_ready(pod);
            let mut next = sb.clone();
            next["status"] = json!({
                "conditions": [condition("Ready", ready, if ready { "DependenciesReady" } else { "DependenciesNotReady" }, "")],
                "service": name,
                "serviceFQDN": format!("{name}.{ns}.svc.cluster.local"),
                "podIPs": pod["status"]["podIPs"].as_array().map(|a| a.iter().map(|i| i["ip"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
                "selector": format!("agents.x-k8s.io/sandbox-name={name}"),
            });
            let changed = next["status"]["conditions"][0]["status"] != sb["status"]["conditions"][0]["status"]
                || next["status"]["podIPs"] != sb["status"]["podIPs"];
            if changed {
                sim.put(SANDBOXES, next);
            }
        }
    }
}

/// A fresh uid, for tests that build objects by hand.
pub fn uid() -> String {
    new_uid()
}

impl PodReadHook for Controller {
    fn after_pod_read<'a>(
        &'a self,
        sim: &'a Simulator,
        ns: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.replace_if_asked(sim, ns, name))
    }
}
