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

use crate::podnet::{self, PodNet};
use crate::server::{new_uid, now_rfc3339, Gvr, Simulator};

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
            return sim.controller.get().cloned().unwrap_or(ctl);
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
    pub(crate) async fn after_pod_read(&self, sim: &Simulator, ns: &str, name: &str) {
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

    fn claims(&self, sim: &Simulator) {
        let pools = sim.all(POOLS);
        for claim in sim.all(CLAIMS) {
            let ns = meta(&claim, "namespace").to_owned();
            let mut next = claim.clone();
            match claim["status"]["sandbox"]["name"].as_str() {
                Some(bound) => {
                    let sb = sim
                        .all(SANDBOXES)
                        .into_iter()
                        .find(|s| meta(s, "namespace") == ns && meta(s, "name") == bound);
                    let ready = sb.as_ref().is_some_and(is_ready);
                    next["status"]["conditions"] = json!([condition(
                        "Ready",
                        ready,
                        if ready { "SandboxReady" } else { "SandboxNotReady" },
                        ""
                    )]);
                }
                None => {
                    let pname = claim["spec"]["warmPoolRef"]["name"].as_str().unwrap_or_default();
                    let Some(pool) = pools
                        .iter()
                        .find(|p| meta(p, "namespace") == ns && meta(p, "name") == pname)
                    else {
                        next["status"]["conditions"] = json!([condition(
                            "Ready",
                            false,
                            "WarmPoolNotFound",
                            &format!("SandboxWarmPool {pname:?} not found in namespace {ns:?}")
                        )]);
                        if next != claim {
                            sim.put(CLAIMS, next);
                        }
                        continue;
                    };
                    let tname = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or_default();
                    let Some(template) = Self::template(sim, &ns, tname) else {
                        next["status"]["conditions"] = json!([condition(
                            "Ready",
                            false,
                            "TemplateNotFound",
                            &format!("SandboxTemplate {tname:?} not found")
                        )]);
                        if next != claim {
                            sim.put(CLAIMS, next);
                        }
                        continue;
                    };
                    if let Err(why) = Self::injection(&claim, &template) {
                        next["status"]["conditions"] =
                            json!([condition("Ready", false, "EnvVarsInjectionRejected", &why)]);
                        if next["status"]["conditions"][0]["reason"] != claim["status"]["conditions"][0]["reason"] {
                            sim.put(CLAIMS, next);
                        }
                        continue;
                    }
                    let bound = self.adopt(sim, &claim, pool, &template);
                    next["status"]["sandbox"] = json!({"name": bound});
                    next["status"]["conditions"] = json!([condition("Ready", false, "SandboxNotReady", "")]);
                }
            }
            if next["status"] != claim["status"] {
                // Conditions carry a transition time; only a change of
                // status proper is written.
                let same = next["status"]["sandbox"] == claim["status"]["sandbox"]
                    && next["status"]["conditions"][0]["status"] == claim["status"]["conditions"][0]["status"]
                    && next["status"]["conditions"][0]["reason"] == claim["status"]["conditions"][0]["reason"];
                if !same {
                    sim.put(CLAIMS, next);
                }
            }
        }
    }

    /// Whether the template lets `claim` inject its `env`: `Disallowed` (the
    /// default) refuses any; `Allowed` refuses a name the container already
    /// sets; `Overrides` takes all.
    fn injection(claim: &Value, template: &Value) -> Result<(), String> {
        let env = claim["spec"]["env"].as_array().cloned().unwrap_or_default();
        if env.is_empty() {
            return Ok(());
        }
        let policy = template["spec"]["envVarsInjectionPolicy"]
            .as_str()
            .unwrap_or("Disallowed");
        let containers = &template["spec"]["podTemplate"]["spec"]["containers"];
        match policy {
            "Overrides" => Ok(()),
            "Allowed" => {
                for e in &env {
                    let c = containers
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| e["containerName"].as_str().is_none_or(|n| c["name"] == n));
                    let taken = c.is_some_and(|c| {
                        c["env"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|have| have["name"] == e["name"])
                    });
                    if taken {
                        return Err(format!(
                            "env {} is set by the template and its policy is Allowed, not Overrides",
                            e["name"]
                        ));
                    }
                }
                Ok(())
            }
            _ => Err(format!(
                "the template's envVarsInjectionPolicy is {policy}; the claim asks for {} variables",
                env.len()
            )),
        }
    }

    /// Puts a claim's `env` on the agent container of a Sandbox's pod
    /// template (replacing what the template set, where allowed to).
    fn inject(sb: &mut Value, claim: &Value) {
        let Some(containers) = sb["spec"]["podTemplate"]["spec"]["containers"].as_array_mut() else {
            return;
        };
        for e in claim["spec"]["env"].as_array().into_iter().flatten() {
            let c = match e["containerName"].as_str() {
                Some(n) => containers.iter_mut().find(|c| c["name"] == n),
                None => containers.first_mut(),
            };
            let Some(c) = c else { continue };
            if !c["env"].is_array() {
                c["env"] = json!([]);
            }
            if let Some(list) = c["env"].as_array_mut() {
                list.retain(|have| have["name"] != e["name"]);
                list.push(json!({"name": e["name"].clone(), "value": e["value"].clone()}));
            }
        }
    }

    /// Binds `claim` to one of `pool`'s Sandboxes (ready first), or a cold
    /// one when none is left — or when the claim injects environment, which
    /// a running pod cannot take; returns its name.
    fn adopt(&self, sim: &Simulator, claim: &Value, pool: &Value, template: &Value) -> String {
        let ns = meta(claim, "namespace");
        let extra = if self.drop_claim_labels.load(std::sync::atomic::Ordering::SeqCst) {
            Value::Null
        } else {
            claim["spec"]["additionalPodMetadata"]["labels"].clone()
        };
        let owner = owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim);
        let mut held: Vec<Value> = sim
            .all(SANDBOXES)
            .into_iter()
            .filter(|s| owner_of(s, "SandboxWarmPool").is_some_and(|(_, u)| u == meta(pool, "uid")))
            .collect();
        held.sort_by_key(|s| !is_ready(s));
        let injects = claim["spec"]["env"].as_array().is_some_and(|e| !e.is_empty());
        if injects {
            held.clear();
        }
        let mut sb = match held.into_iter().next() {
            Some(mut s) => {
                if let Some(l) = s["metadata"]["labels"].as_object_mut() {
                    l.remove(POOL_LABEL);
                }
                s["metadata"]["ownerReferences"] = owner;
                s
            }
            None => Self::sandbox_from(
                template,
                ns,
                &format!("{}-{:05x}", meta(pool, "name"), rand::random::<u32>() & 0xfffff),
                json!({}),
                owner,
            ),
        };
        Self::inject(&mut sb, claim);
        let name = meta(&sb, "name").to_owned();
        if let Some(extra) = extra.as_object() {
            for (k, v) in extra {
                sb["spec"]["podTemplate"]["metadata"]["labels"][k] = v.clone();
            }
            // The pod already running takes them too.
            if let Some(mut pod) = sim
                .all(PODS)
                .into_iter()
                .find(|p| meta(p, "namespace") == ns && meta(p, "name") == name)
            {
                for (k, v) in extra {
                    pod["metadata"]["labels"][k] = v.clone();
                }
                sim.put(PODS, pod);
            }
        }
        sim.put(SANDBOXES, sb);
        name
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

    /// Starts a runtime for every pod without one, stops those whose pod
    /// is gone.
    fn pods(self: &Arc<Self>, sim: &Arc<Simulator>) {
        let pods = sim.all(PODS);
        let live: HashMap<String, &Value> = pods
            .iter()
            .map(|p| (key(meta(p, "namespace"), meta(p, "name")), p))
            .collect();
        let stale: Vec<PodRuntime> = {
            let mut st = self.lock();
            let gone: Vec<String> = st
                .running
                .iter()
                .filter(|(k, rt)| live.get(*k).is_none_or(|p| meta(p, "uid") != rt.uid))
                .map(|(k, _)| k.clone())
                .collect();
            gone.iter().filter_map(|k| st.running.remove(k)).collect()
        };
        for rt in stale {
            tokio::spawn(rt.stop());
        }
        for (k, pod) in live {
            let pending = pod["status"]["phase"] == "Pending" && pod["status"]["conditions"].is_null();
            if !pending {
                continue;
            }
            if self.lock().running.contains_key(&k) || self.lock().starting.contains(&k) {
                continue;
            }
            let fault = *self.fault.lock().unwrap_or_else(|p| p.into_inner());
            let mut next = pod.clone();
            match fault {
                Some(PodFault::Unschedulable) => {
                    next["status"] = json!({"phase": "Pending", "conditions": [condition("PodScheduled", false, "Unschedulable",
                        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.")]});
                    sim.put(PODS, next);
                    continue;
                }
                Some(PodFault::ImagePull) => {
                    let c = pod["spec"]["containers"][0]["name"].clone();
                    next["status"] = json!({"phase": "Pending",
                        "conditions": [condition("PodScheduled", true, "", "")],
                        "containerStatuses": [{"name": c, "ready": false, "restartCount": 0, "image": pod["spec"]["containers"][0]["image"].clone(),
                            "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff",
                            "message": "Back-off pulling image: not found"}}}]});
                    sim.put(PODS, next);
                    continue;
                }
                _ => {}
            }
            self.lock().starting.insert(k.clone());
            next["status"]["conditions"] = json!([condition("PodScheduled", true, "", "")]);
            let pod = sim.put(PODS, next);
            let ctl = self.clone();
            let sim = sim.clone();
            tokio::spawn(async move {
                let started = ctl.run_pod(&pod, fault == Some(PodFault::Unconfined)).await;
                if ctl.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(rt) = started {
                        rt.stop().await;
                    }
                } else {
                    ctl.publish(&sim, &pod, started);
                }
                ctl.lock().starting.remove(&k);
            });
        }
    }

    /// Writes a started pod's status (or its crash).
    fn publish(&self, sim: &Simulator, pod: &Value, started: Result<PodRuntime, String>) {
        let (ns, name) = (meta(pod, "namespace"), meta(pod, "name"));
        let current = sim
            .all(PODS)
            .into_iter()
            .find(|p| meta(p, "namespace") == ns && meta(p, "name") == name && meta(p, "uid") == meta(pod, "uid"));
        let container = pod["spec"]["containers"][0]["name"].clone();
        match (current, started) {
            (Some(mut cur), Ok(rt)) => {
                let ip = rt.net.ip.to_string();
                cur["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now_rfc3339(),
                    "conditions": [condition("PodScheduled", true, "", ""), condition("Initialized", true, "", ""),
                        condition("ContainersReady", true, "", ""), condition("Ready", true, "", "")],
                    "containerStatuses": [{"name": container, "ready": true, "restartCount": 0, "started": true,
                        "image": pod["spec"]["containers"][0]["image"].clone(), "imageID": "",
                        "state": {"running": {"startedAt": now_rfc3339()}}}]});
                sim.put(PODS, cur);
                self.lock().running.insert(key(ns, name), rt);
            }
            (Some(mut cur), Err(why)) => {
                cur["status"] = json!({"phase": "Pending", "conditions": [condition("PodScheduled", true, "", "")],
                    "containerStatuses": [{"name": container, "ready": false, "restartCount": 1, "image": "", "imageID": "",
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": why}}}]});
                sim.put(PODS, cur);
            }
            // The pod went away while it started.
            (None, Ok(rt)) => {
                tokio::spawn(rt.stop());
            }
            (None, Err(_)) => {}
        }
    }

    /// Runs `pod`: a sandbox whose agent takes the token the container's
    /// environment names, and a relay on a fresh pod IP at the agent port.
    async fn run_pod(&self, pod: &Value, unconfined: bool) -> Result<PodRuntime, String> {
        let c = &pod["spec"]["containers"][0];
        let token = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == namzu_kubernetes::build::TOKEN_ENV)
            .and_then(|e| match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.uid") => pod["metadata"]["uid"].as_str().map(String::from),
                Some("metadata.name") => pod["metadata"]["name"].as_str().map(String::from),
                Some(_) => None,
                None => e["value"].as_str().map(String::from),
            })
            .ok_or("no bind token: the container has no NAMZU_AGENT_TOKEN")?;
        let port = c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find_map(|a| {
                a.strip_prefix("tcp:")
                    .and_then(|r| r.rsplit(':').next()?.parse::<u16>().ok())
            })
            .unwrap_or(namzu_kubernetes::DEFAULT_AGENT_PORT);
        // The container's environment is the agent's; the agent reads its
        // limits from NAMZU_<LIMIT>, which the local tier takes as limits.
        let mut spec = SandboxSpec::default();
        for e in c["env"].as_array().into_iter().flatten() {
            let (Some(name), Some(value)) = (e["name"].as_str(), e["value"].as_str()) else {
                continue;
            };
            let limit = namzu::limits::ALL
                .iter()
                .find(|l| namzu::limits::env_var(l) == name)
                .map(|l| (*l).to_owned());
            match (limit, value.parse::<u64>()) {
                (Some(l), Ok(v)) => spec.limits.push((l, v)),
                _ => spec.env.push((name.to_owned(), value.to_owned())),
            }
        }
        let veth = self.net == podnet::Mode::Veth && !unconfined;
        let made = if unconfined {
            self.host
                .create_with_token(spec, Some(token.clone().into_bytes()))
                .await
        } else {
            let tcp = veth.then(|| format!("0.0.0.0:{port}"));
            self.local
                .create_with(spec, Some(token.clone().into_bytes()), tcp)
                .await
        };
        let sandbox: Sandbox = made.map_err(|e| e.to_string())?;
        let tier = if unconfined { "host" } else { "local" };
        let dir = self.cfg.state_dir.join(tier).join(sandbox.id());
        let net = if veth {
            podnet::attach_veth(&dir, self.id).await
        } else {
            podnet::attach_relay(dir.join("agent.sock"), port).await
        };
        let net = match net {
            Ok(n) => n,
            Err(e) => {
                let _ = sandbox.destroy().await;
                return Err(e);
            }
        };
        Ok(PodRuntime {
            uid: pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            net,
            sandbox,
        })
    }
}

/// A fresh uid, for tests that build objects by hand.
pub fn uid() -> String {
    new_uid()
}
