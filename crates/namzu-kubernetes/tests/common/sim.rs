//! Helpers the simulator's controller tests share: the API, polling, the
//! Ready condition, and objects built as a host would post them.

use std::time::{Duration, Instant};

use namzu_k8s_sim::cluster::{Cluster, NAMESPACE, TEMPLATE};
use namzu_k8s_sim::controller::TEMPLATES;
use namzu_k8s_sim::Gvr;
use namzu_kubernetes::api::{Api, Resource};
use namzu_kubernetes::crd::SandboxClaim;
use serde_json::{json, Value};

pub fn api(c: &Cluster) -> Api {
    Api::new(c.client(), Duration::from_secs(10)).unwrap()
}

pub fn claims() -> Resource {
    Resource::of::<SandboxClaim>(NAMESPACE)
}

/// Polls `f` every 20 ms until it gives `Some`, for at most `secs`.
pub async fn until<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn ready(o: &Value) -> (String, String) {
    let c = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    (
        format!(
            "{}/{}",
            c["status"].as_str().unwrap_or(""),
            c["reason"].as_str().unwrap_or("")
        ),
        c["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Waits for `gvr` `name`'s Ready condition to carry `reason`.
pub async fn reason_of(c: &Cluster, gvr: Gvr, name: &str, reason: &str) -> (String, String) {
    let got = until(10, || {
        let o = c.get(gvr, name)?;
        let r = ready(&o);
        r.0.ends_with(&format!("/{reason}")).then_some(r)
    })
    .await;
    got.unwrap_or_else(|| panic!("{name} never read {reason}: {:?}", c.get(gvr, name)))
}

pub fn claim(name: &str, pool: &str, spec: Value) -> Value {
    let mut s = json!({"warmPoolRef": {"name": pool}});
    if let (Some(s), Some(extra)) = (s.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": s})
}

/// The shipped template under another name, changed by `edit`.
pub fn template_like(c: &Cluster, name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut t = c.get(TEMPLATES, TEMPLATE).unwrap();
    let keep = json!({"name": name, "namespace": NAMESPACE});
    t["metadata"] = keep;
    t.as_object_mut().unwrap().remove("status");
    edit(&mut t);
    t
}

pub fn pool(name: &str, template: &str, replicas: i64) -> Value {
    json!({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}}})
}

pub fn sandbox(c: &Cluster, name: &str, service: Option<bool>, extra: Value) -> Value {
    let t = c.get(TEMPLATES, TEMPLATE).unwrap();
    let mut spec = json!({"podTemplate": t["spec"]["podTemplate"].clone()});
    if let Some(s) = service {
        spec["service"] = json!(s);
    }
    json_patch::merge(&mut spec, &extra);
    json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
}
