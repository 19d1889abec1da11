//! The simulator's agent-sandbox controller and kubelet, modelled on the
//! upstream controller (kubernetes-sigs/agent-sandbox, API v1beta1; see
//! `shared/reference/agent-sandbox-controller.md` for the source files each
//! point comes from) — and running REAL sandboxes as pods:
//!
//! * [`claims`]: a SandboxClaim's `additionalPodMetadata` is checked first
//!   (label domains against the `allowed-label-domains` allowlist, built-in
//!   `sandbox.users.io`; `InvalidMetadata`); then its pool and template
//!   (`WarmPoolNotFound`, `TemplateNotFound`), its `env` against the
//!   template's policy (`EnvVarsInjectionRejected`, or `ReconcilerError`
//!   for a clash or an unknown container), and it binds: a warm Sandbox
//!   that has pod IPs (Ready first, oldest first), else — after a 2 s grace
//!   — a cold one named after the claim. Its Ready is forwarded from the
//!   Sandbox in the same pass; the adopted pod gets the claim's labels
//!   LATER ([`ControllerConfig::label_delay`]). Expiry marks `ClaimExpired`
//!   first, then deletes per `shutdownPolicy` (CRD default `Retain`: the
//!   Sandbox goes, the claim stays). A claim whose Sandbox vanished binds a
//!   new one.
//! * [`sandboxes`]: a Sandbox gets a pod (named after it or its
//!   `pod-name` annotation, labelled with its name hash), a headless
//!   Service and `serviceFQDN` ONLY with `service: true`, `Ready` when the
//!   pod runs with an IP (and the Service exists where required); an
//!   evicted pod (`Failed`) is left, not replaced (`PodFailed`,
//!   `Finished`); a deleted pod is replaced (same name, new uid); expiry
//!   marks `SandboxExpired`, then deletes per policy; `Suspended` deletes
//!   the pod and keeps the rest.
//! * [`pools`]: warm pools (`generateName`, hash labels, surplus trimmed,
//!   status), and templates (the ref-hash label and the managed
//!   NetworkPolicy `<template>-network-policy`: the secure default, the
//!   template's own `networkPolicy`, or none when `Unmanaged`).
//! * Status is written only as the status subresource would: onto the
//!   object as stored at that moment ([`Simulator::update`]), so a host's
//!   concurrent patch is never overwritten. Owner references cascade as the
//!   garbage collector does.
//! * [`pods`]: every pod is a real `local`-tier sandbox (user, mount, pid,
//!   net namespaces, seccomp) running the real agent, started with the bind
//!   token its container's `NAMZU_AGENT_TOKEN` names through the downward
//!   API (the pod's uid). The pod network is simulated ([`podnet`]).
//!
//! Pod faults ([`PodFault`]) make new pods unschedulable, unable to pull
//! their image, or run the agent with no confinement at all (the host tier:
//! what a pod without the restricted security context amounts to); a pod
//! can be replaced (new uid, new IP) right after it is read, or evicted;
//! its container can be restarted (same uid and IP, a new agent process
//! on a fresh root filesystem, the volumes kept, `restartCount` up).

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

pub mod claims;
mod kubelet;
mod pods;
pub mod pools;
pub mod sandboxes;
mod volumes;

use crate::podnet::{self, PodNet};
use crate::server::{new_uid, now_rfc3339, Gvr, PodReadHook, Simulator};

pub const PODS: Gvr = ("", "v1", "pods");
/// Secrets, stored as the API stores them (`data` base64).
pub const SECRETS: Gvr = ("", "v1", "secrets");
/// ConfigMaps.
pub const CONFIG_MAPS: Gvr = ("", "v1", "configmaps");
/// PersistentVolumeClaims (of Sandboxes' volumeClaimTemplates).
pub const PVCS: Gvr = ("", "v1", "persistentvolumeclaims");
/// Events (`k8s.io/client-go/tools/events`, as the controller records them).
pub const EVENTS: Gvr = ("events.k8s.io", "v1", "events");
/// The simulated node every scheduled pod is bound to (`spec.nodeName`).
pub const NODE_NAME: &str = "sim-node";
pub const SANDBOXES: Gvr = ("agents.x-k8s.io", "v1beta1", "sandboxes");
pub const CLAIMS: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims");
pub const TEMPLATES: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates");
pub const POOLS: Gvr = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools");
pub const NETWORK_POLICIES: Gvr = ("networking.k8s.io", "v1", "networkpolicies");
pub const SERVICES: Gvr = ("", "v1", "services");
pub const CILIUM_POLICIES: Gvr = ("cilium.io", "v2", "ciliumnetworkpolicies");
pub const ADMISSION_POLICIES: Gvr = ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies");
pub const ADMISSION_BINDINGS: Gvr = (
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
);

/// The label a pool puts on the Sandboxes it holds (the pool name's hash).
pub const POOL_LABEL: &str = "agents.x-k8s.io/warm-pool-sandbox";
/// The template name's hash, on templates, Sandboxes and pods.
pub const TEMPLATE_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-template-ref-hash";
/// The Sandbox name's hash, on its pod (the Sandbox's `status.selector`).
pub const NAME_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-name-hash";
/// On an unowned PVC: a Sandbox may adopt it.
pub const ADOPTABLE_LABEL: &str = "agents.x-k8s.io/adoptable";
/// The claim's uid, on the Sandbox it binds and that Sandbox's pod.
pub const CLAIM_UID_LABEL: &str = "agents.x-k8s.io/claim-uid";
/// `warm` or `cold`: how a Sandbox came to its claim.
pub const LAUNCH_TYPE_LABEL: &str = "agents.x-k8s.io/launch-type";
/// On a claim: the Sandbox it is bound to.
pub const SANDBOX_NAME_ANNOTATION: &str = "agents.x-k8s.io/sandbox-name";
/// On a Sandbox: its pod's name.
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
/// The controller's built-in label allowlist when the ConfigMap names none.
pub const DEFAULT_LABEL_DOMAIN: &str = "sandbox.users.io";

/// The controller's `NameHash`: FNV-1a (32 bit) of a name, as 8 hex digits.
pub fn name_hash(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

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
    /// The `allowed-label-domains` key of the `agent-sandbox-config`
    /// ConfigMap as the controller reads it at start (comma or newline
    /// separated); `None` or empty: only `sandbox.users.io`.
    pub allowed_label_domains: Option<String>,
    /// How long after a warm adoption the claim's labels reach the running
    /// pod (the real controller patches them asynchronously, after the
    /// claim already reads Ready).
    pub label_delay: Duration,
    /// How long a warm pool's Sandbox may stay not Ready before it is
    /// replaced (the controller's `ReadinessGracePeriod`, 5 min); an
    /// unschedulable one is held instead, and the pool says so in an Event.
    pub pool_readiness_grace: Duration,
}

impl ControllerConfig {
    /// Pods under `state_dir` running `agent_bin`, the controller's
    /// defaults otherwise.
    pub fn new(state_dir: PathBuf, agent_bin: PathBuf) -> Self {
        Self {
            state_dir,
            agent_bin,
            tick: Duration::from_millis(10),
            allowed_label_domains: None,
            label_delay: Duration::from_millis(300),
            pool_readiness_grace: Duration::from_secs(300),
        }
    }

    /// The label allowlist the claim controller enforces.
    pub fn label_domains(&self) -> Vec<String> {
        let v: Vec<String> = self
            .allowed_label_domains
            .as_deref()
            .unwrap_or_default()
            .split([',', '\n', '\r'])
            .map(|d| d.trim().to_ascii_lowercase())
            .filter(|d| !d.is_empty())
            .collect();
        if v.is_empty() {
            vec![DEFAULT_LABEL_DOMAIN.to_owned()]
        } else {
            v
        }
    }
}

/// A running pod: its sandbox and its place on the pod network.
struct PodRuntime {
    uid: String,
    net: PodNet,
    sandbox: Sandbox,
    /// The pod's volumes on the host (its `emptyDir`s).
    volumes: PathBuf,
    /// The sandbox's anchor on the host: SIGTERM to it reaches the agent,
    /// the container's main process.
    anchor: Option<u32>,
}

/// Whether `pid` runs: present and not a zombie (the anchor is this
/// process's child, reaped only when its sandbox is destroyed).
fn running(pid: nix::unistd::Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

impl PodRuntime {
    /// A deleted pod, as a kubelet stops it: SIGTERM to the container's
    /// main process (the agent, which stops its commands and flushes the
    /// workspace), up to `grace` for it to exit, then everything killed;
    /// its connections see the close, then it leaves the network.
    async fn stop(self, grace: Duration) {
        if let Some(pid) = self.anchor.and_then(|p| i32::try_from(p).ok()) {
            let pid = nix::unistd::Pid::from_raw(pid);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
                let deadline = tokio::time::Instant::now() + grace;
                while running(pid) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let _ = self.sandbox.destroy().await;
        self.net.detach().await;
        let _ = tokio::fs::remove_dir_all(&self.volumes).await;
    }

    /// An evicted pod: off the network at once (its IP stops answering
    /// before anyone can dial it), its sandbox destroyed after.
    async fn evict(self) {
        self.net.detach().await;
        let (sb, volumes) = (self.sandbox, self.volumes);
        tokio::spawn(async move {
            let _ = sb.destroy().await;
            let _ = tokio::fs::remove_dir_all(&volumes).await;
        });
    }
}

#[derive(Default)]
struct State {
    /// `ns/name` → the pod's runtime.
    running: HashMap<String, PodRuntime>,
    /// `ns/name` of pods being started.
    starting: HashSet<String>,
    /// Pods being terminated (their runtime stopping).
    stopping: HashSet<String>,
    /// How many of the next pod reads replace the pod they read.
    replace_on_read: usize,
    /// Claim uid → when the controller first found no warm candidate.
    claim_waiting: HashMap<String, std::time::Instant>,
    /// `ns/pod` → when the adopting claim's labels may reach the pod.
    label_sync: HashMap<String, std::time::Instant>,
    /// `ns/pool` of pools last reported not progressing.
    not_progressing: HashSet<String>,
}

/// The controller (see the module docs).
pub struct Controller {
    sim: Weak<Simulator>,
    cfg: ControllerConfig,
    host: HostProvider,
    state: Mutex<State>,
    fault: Mutex<Option<PodFault>>,
    /// Bind claims without giving their pods `additionalPodMetadata`
    /// (a controller whose label allowlist drops them).
    drop_claim_labels: std::sync::atomic::AtomicBool,
    /// Transient claim reasons still to show (see [`Controller::contend`]).
    contention: Mutex<(
        std::collections::VecDeque<&'static str>,
        Duration,
        Option<std::time::Instant>,
    )>,
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
    json!([{"apiVersion": api_version, "kind": kind, "name": meta(o, "name"), "uid": meta(o, "uid"), "controller": true,
        "blockOwnerDeletion": true}])
}

/// Records an Event about `regarding` (an `events.k8s.io/v1` Event, as
/// the controller's `EventRecorder` writes it): `type_` Normal or Warning.
fn record_event(sim: &Simulator, regarding: &Value, type_: &str, reason: &str, action: &str, note: &str) {
    let (ns, name) = (meta(regarding, "namespace"), meta(regarding, "name"));
    sim.put(
        EVENTS,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": format!("{name}.{:016x}", rand::random::<u64>()), "namespace": ns},
            "eventTime": now_rfc3339(),
            "reportingController": "agent-sandbox-controller",
            "reportingInstance": "agent-sandbox-controller-sim",
            "type": type_, "reason": reason, "action": action, "note": note,
            "regarding": {"apiVersion": regarding["apiVersion"].clone(), "kind": regarding["kind"].clone(),
                "name": name, "namespace": ns, "uid": meta(regarding, "uid")}}),
    );
}

/// The `Ready` condition's reason, if there is one.
fn ready_reason(o: &Value) -> Option<&str> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?["reason"]
        .as_str()
}

/// Conditions as written: a condition whose status, reason and message
/// did not change keeps its transition time, as `SetStatusCondition` does.
fn keep_times(old: &Value, new: &mut Value) {
    let Some(list) = new.as_array_mut() else { return };
    for c in list {
        let same = old.as_array().into_iter().flatten().find(|o| {
            o["type"] == c["type"]
                && o["status"] == c["status"]
                && o["reason"] == c["reason"]
                && o["message"] == c["message"]
        });
        if let Some(o) = same {
            c["lastTransitionTime"] = o["lastTransitionTime"].clone();
        }
    }
}

/// Writes `status` onto `gvr` `ns/name` as stored now, if it changed.
fn write_status(sim: &Simulator, gvr: Gvr, ns: &str, name: &str, mut status: Value) {
    sim.update(gvr, ns, name, |o| {
        if let Some(new) = status.get_mut("conditions") {
            keep_times(&o["status"]["conditions"], new);
        }
        o["status"] = status;
    });
}

/// Whether `time` (RFC 3339) has passed.
fn passed(time: &Value, now: SystemTime) -> bool {
    time.as_str().is_some_and(|t| until(t, now).is_none())
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

impl Controller {
    /// Starts the controller on `sim` (once; later calls return the first).
    pub fn start(sim: &Arc<Simulator>, cfg: ControllerConfig) -> Arc<Controller> {
        let ctl = Arc::new(Controller {
            sim: Arc::downgrade(sim),
            host: HostProvider::with_agent(&cfg.state_dir, &cfg.agent_bin),
            cfg,
            state: Mutex::default(),
            fault: Mutex::default(),
            drop_claim_labels: std::sync::atomic::AtomicBool::new(false),
            contention: Mutex::default(),
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

    /// Enters pod `k` into `starting` unless the controller is stopped
    /// (then it starts nothing: `shutdown` may be past its wait).
    fn begin_start(&self, k: &str) -> bool {
        let mut st = self.lock();
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        st.starting.insert(k.to_owned());
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, bind claims without putting their
    /// `additionalPodMetadata` labels on the pod.
    pub fn drop_claim_pod_labels(&self, drop: bool) {
        self.drop_claim_labels.store(drop, std::sync::atomic::Ordering::SeqCst);
    }

    /// Unbound claims read these transient `Ready=False` reasons in turn,
    /// each for `hold`, before they bind — what a real controller's cache
    /// races produce (`AdoptionConflict`, `SandboxCreatePending`,
    /// `SandboxMissing`), which the single consistent store here never
    /// does on its own. A host must wait through them.
    pub fn contend(&self, reasons: &[&'static str], hold: Duration) {
        let mut c = self.contention.lock().unwrap_or_else(|p| p.into_inner());
        c.0.extend(reasons.iter().copied());
        c.1 = hold;
    }

    /// The transient reason to show now, if any, with its message.
    fn contention(&self, claim: &str) -> Option<(&'static str, String)> {
        let mut c = self.contention.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        match c.2 {
            Some(until) if now >= until => {
                c.0.pop_front();
                c.2 = None;
            }
            None if !c.0.is_empty() => c.2 = Some(now + c.1),
            _ => {}
        }
        let reason = *c.0.front()?;
        if c.2.is_none() {
            c.2 = Some(now + c.1);
        }
        let message = match reason {
            "AdoptionConflict" => format!(
                "adoption write conflict: claim {claim} already assigned sandbox {claim}-0 (conflicting concurrent write); the next pass retries from a converged view"
            ),
            "SandboxCreatePending" => "Sandbox already created; waiting for cache to converge".into(),
            _ => "Sandbox does not exist".into(),
        };
        Some((reason, message))
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
            // Only a Service has a name in cluster DNS.
            let sim = ctl.sim.upgrade()?;
            Self::lookup(&sim, SERVICES, ns, name)?;
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
        // Gone at once (its processes already are), and a new pod of that
        // name, not yet scheduled.
        if let Some(mut pod) = sim.purge(PODS, ns, name) {
            if let Some(m) = pod["metadata"].as_object_mut() {
                for k in ["uid", "deletionTimestamp", "deletionGracePeriodSeconds"] {
                    m.remove(k);
                }
            }
            if let Some(spec) = pod["spec"].as_object_mut() {
                spec.remove("nodeName");
            }
            pod["status"] = json!({"phase": "Pending"});
            sim.put(PODS, pod);
        }
    }

    /// Evicts pod `ns/name` as a kubelet under node pressure does: its
    /// processes end and it is left `Failed` (reason `Evicted`). The
    /// controller does NOT replace it: the Sandbox reads `PodFailed`.
    pub async fn evict_pod(&self, sim: &Simulator, ns: &str, name: &str) {
        sim.update(PODS, ns, name, |p| {
            p["status"] = json!({"phase": "Failed", "reason": "Evicted",
                "message": "The node was low on resource: memory.", "podIPs": []});
        });
        let old = self.lock().running.remove(&key(ns, name));
        if let Some(rt) = old {
            rt.evict().await;
        }
    }

    /// Stops reconciling and every pod's sandbox, those still starting
    /// included (test teardown).
    pub async fn shutdown(&self) {
        // Under the state's lock, as every start's entry into `starting`
        // is (see `begin_start`): a pass of the reconciler on another
        // thread either entered its start before this (and it is waited
        // for below) or sees the stop and starts nothing.
        {
            let _st = self.lock();
            self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !self.lock().starting.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all: Vec<PodRuntime> = self.lock().running.drain().map(|(_, r)| r).collect();
        for rt in all {
            rt.stop(Duration::ZERO).await;
        }
        self.release_network();
    }

    /// One pass over the store.
    fn reconcile(self: &Arc<Self>, sim: &Arc<Simulator>) {
        // Owner references cascade, as the garbage collector does: an
        // object whose owner's uid is gone goes too (claim or pool →
        // Sandbox → its pod, Service and per-sandbox policy; template →
        // its NetworkPolicy).
        for gvr in [SANDBOXES, PODS, SERVICES, PVCS, CILIUM_POLICIES, NETWORK_POLICIES] {
            let live: HashSet<String> = [CLAIMS, POOLS, SANDBOXES, TEMPLATES]
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
        self.templates(sim);
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

    fn lookup(sim: &Simulator, gvr: Gvr, ns: &str, name: &str) -> Option<Value> {
        sim.all(gvr)
            .into_iter()
            .find(|o| meta(o, "namespace") == ns && meta(o, "name") == name)
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
