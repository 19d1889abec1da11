//! Sandboxes, as `controllers/sandbox_controller.go` keeps them: a pod
//! (named after the Sandbox or its `pod-name` annotation, labelled with the
//! name hash), a headless Service only when `service: true`, the claim's
//! labels carried to a running pod once allowed, the PVCs of its
//! volumeClaimTemplates (kept through expiry and suspension; gone with the
//! Sandbox), expiry, suspension, and a status computed from what stands.

use serde_json::{json, Value};

use super::*;

/// The PVC a volumeClaimTemplate names for this Sandbox.
fn pvc_name(vct: &Value, sb: &Value) -> String {
    format!(
        "{}-{}",
        vct["metadata"]["name"].as_str().unwrap_or_default(),
        meta(sb, "name")
    )
}

/// The pod's volumes: the pod template's, a volumeClaimTemplate's PVC
/// taking the place of a volume of its name (`MergeVolumeClaimVolumes`).
fn volumes(sb: &Value) -> Value {
    let vcts = sb["spec"]["volumeClaimTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let claimed: Vec<Value> = vcts
        .iter()
        .map(
            |v| json!({"name": v["metadata"]["name"].clone(), "persistentVolumeClaim": {"claimName": pvc_name(v, sb)}}),
        )
        .collect();
    let mut out: Vec<Value> = sb["spec"]["podTemplate"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| !claimed.iter().any(|c| c["name"] == v["name"]))
        .cloned()
        .collect();
    out.extend(claimed);
    Value::Array(out)
}

/// Makes (or adopts) the PVC of every volumeClaimTemplate, as
/// `reconcilePVCs`: one the Sandbox controls is kept; an unowned one is
/// adopted only with the pool's `adoptable` label or the Sandbox's
/// tracking label; one owned by anything else stops the Sandbox.
fn reconcile_pvcs(sim: &Simulator, sb: &Value) -> Result<(), String> {
    let (ns, name) = (meta(sb, "namespace"), meta(sb, "name"));
    let hash = name_hash(name);
    for vct in sb["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
        let pvc = pvc_name(vct, sb);
        match sim.object(PVCS.0, PVCS.1, PVCS.2, ns, &pvc) {
            Some(have) => {
                let controller = have["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["controller"] == true)
                    .cloned();
                match controller {
                    Some(r) if r["uid"] == meta(sb, "uid") => {}
                    Some(r) => {
                        return Err(format!(
                            "PVC {pvc:?} is owned by {}/{} (UID: {}), not by sandbox {name:?}",
                            r["kind"].as_str().unwrap_or_default(),
                            r["name"].as_str().unwrap_or_default(),
                            r["uid"].as_str().unwrap_or_default()
                        ))
                    }
                    None => {
                        let l = &have["metadata"]["labels"];
                        if l[ADOPTABLE_LABEL] != "true" && l[NAME_HASH_LABEL] != json!(hash) {
                            return Err(format!(
                                "cannot adopt unowned PVC {pvc:?}: missing required pool authorization label ({ADOPTABLE_LABEL:?}) or sandbox tracking label ({NAME_HASH_LABEL:?})"
                            ));
                        }
                        let owner = owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb);
                        sim.update(PVCS, ns, &pvc, |p| {
                            let mut refs = p["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
                            refs.extend(owner.as_array().cloned().unwrap_or_default());
                            p["metadata"]["ownerReferences"] = Value::Array(refs);
                        });
                    }
                }
            }
            None => {
                let mut labels = vct["metadata"]["labels"].clone();
                if !labels.is_object() {
                    labels = json!({});
                }
                labels[NAME_HASH_LABEL] = json!(hash);
                sim.put(
                    PVCS,
                    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": pvc, "namespace": ns, "labels": labels,
                            "annotations": vct["metadata"]["annotations"].clone(),
                            "ownerReferences": owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb)},
                        "spec": vct["spec"].clone(),
                        "status": {"phase": "Bound"}}),
                );
            }
        }
    }
    Ok(())
}

/// The pod a Sandbox's pod template makes.
fn pod_object(sb: &Value, name: &str) -> Value {
    let tpl = &sb["spec"]["podTemplate"];
    let mut spec = tpl["spec"].clone();
    if sb["spec"]["volumeClaimTemplates"]
        .as_array()
        .is_some_and(|v| !v.is_empty())
    {
        spec["volumes"] = volumes(sb);
    }
    let mut labels = tpl["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[NAME_HASH_LABEL] = json!(name_hash(meta(sb, "name")));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta(sb, "namespace"), "labels": labels,
            "annotations": tpl["metadata"]["annotations"].clone(),
            "ownerReferences": owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb)},
        "spec": spec,
        "status": {"phase": "Pending"},
    })
}

/// The headless Service of a Sandbox: its pod by name hash, the
/// containers' ports.
fn service_object(sb: &Value) -> Value {
    let ports: Vec<Value> = sb["spec"]["podTemplate"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| json!({"name": p["name"].clone(), "port": p["containerPort"].clone(), "protocol": "TCP"}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": meta(sb, "name"), "namespace": meta(sb, "namespace"),
            "ownerReferences": owner_ref("agents.x-k8s.io/v1beta1", "Sandbox", sb)},
        "spec": {"clusterIP": "None", "selector": {NAME_HASH_LABEL: name_hash(meta(sb, "name"))}, "ports": ports},
    })
}

/// Writes the Sandbox's status as `Ready=False` for `reason` alone.
fn not_ready(sim: &Simulator, ns: &str, name: &str, reason: &str, msg: &str) {
    write_status(
        sim,
        SANDBOXES,
        ns,
        name,
        json!({"conditions": [condition("Ready", false, reason, msg)]}),
    );
}

/// The pod's `PodScheduled` condition, mirrored (status, reason and
/// message verbatim; an empty reason becomes `PodScheduled` when True,
/// else `PodSchedulingUnknown`), as `computePodScheduledCondition`.
fn pod_scheduled(pod: &Value) -> Value {
    let Some(c) = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled")
    else {
        return json!({"type": "PodScheduled", "status": "Unknown", "reason": "PodSchedulingUnknown",
            "message": "Pod has not reported a PodScheduled condition yet", "lastTransitionTime": now_rfc3339()});
    };
    let status = c["status"].as_str().unwrap_or("Unknown");
    let reason = match c["reason"].as_str().filter(|r| !r.is_empty()) {
        Some(r) => r,
        None if status == "True" => "PodScheduled",
        None => "PodSchedulingUnknown",
    };
    json!({"type": "PodScheduled", "status": status, "reason": reason,
        "message": c["message"].clone(), "lastTransitionTime": now_rfc3339()})
}

/// The Sandbox's `Ready` condition from its pod and Service.
fn ready_condition(sb: &Value, pod: Option<&Value>, has_service: bool) -> Value {
    if let Some(p) = pod {
        match p["status"]["phase"].as_str() {
            Some("Succeeded") => return condition("Ready", false, "PodSucceeded", "Pod completed successfully"),
            Some("Failed") => return condition("Ready", false, "PodFailed", "Pod failed"),
            _ => {}
        }
    }
    let (mut message, pod_ready) = match pod {
        None => ("Pod does not exist".to_owned(), false),
        Some(p) if p["status"]["phase"] == "Running" => {
            if !is_ready(p) {
                ("Pod is Running but not Ready".to_owned(), false)
            } else if p["status"]["podIPs"].as_array().is_none_or(Vec::is_empty) {
                ("Pod is Ready but has no podIPs yet".to_owned(), false)
            } else {
                ("Pod is Ready".to_owned(), true)
            }
        }
        Some(p) => (
            format!(
                "Pod exists with phase: {}",
                p["status"]["phase"].as_str().unwrap_or_default()
            ),
            false,
        ),
    };
    let svc_ready = match sb["spec"]["service"].as_bool() {
        Some(true) => {
            message += if has_service {
                "; Service Exists"
            } else {
                "; Service does not exist"
            };
            has_service
        }
        _ => true,
    };
    if pod_ready && svc_ready {
        condition("Ready", true, "DependenciesReady", &message)
    } else {
        condition("Ready", false, "DependenciesNotReady", &message)
    }
}

impl Controller {
    pub(super) fn sandboxes(&self, sim: &Simulator) {
        let now = SystemTime::now();
        let pods = sim.all(PODS);
        let services = sim.all(SERVICES);
        for sb in sim.all(SANDBOXES) {
            let (ns, name) = (meta(&sb, "namespace"), meta(&sb, "name"));
            let pod_name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
                .as_str()
                .unwrap_or(name)
                .to_owned();
            let owned_by_sb = |o: &&Value| owner_of(o, "Sandbox").is_some_and(|(_, u)| u == meta(&sb, "uid"));
            let pod = pods
                .iter()
                .find(|p| meta(p, "namespace") == ns && meta(p, "name") == pod_name)
                .filter(owned_by_sb);
            let svc = services
                .iter()
                .find(|s| meta(s, "namespace") == ns && meta(s, "name") == name)
                .filter(owned_by_sb);
            // Expiry: the pod and Service go; the Sandbox too under Delete,
            // else it stays, marked.
            if passed(&sb["spec"]["shutdownTime"], now) {
                if pod.is_some() {
                    sim.remove(PODS, ns, &pod_name);
                }
                if svc.is_some() {
                    sim.remove(SERVICES, ns, name);
                }
                if sb["spec"]["shutdownPolicy"] == "Delete" {
                    sim.remove(SANDBOXES, ns, name);
                } else {
                    let mut conds = sb["status"]["conditions"].as_array().cloned().unwrap_or_default();
                    conds.retain(|c| c["type"] != "Ready");
                    conds.push(condition("Ready", false, "SandboxExpired", "Sandbox has expired"));
                    write_status(sim, SANDBOXES, ns, name, json!({"conditions": conds}));
                }
                continue;
            }
            if sb["spec"]["operatingMode"] == "Suspended" {
                if pod.is_some() {
                    sim.remove(PODS, ns, &pod_name);
                }
                if !sb["metadata"]["annotations"][POD_NAME_ANNOTATION].is_null() {
                    sim.update(SANDBOXES, ns, name, |o| {
                        if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                            a.remove(POD_NAME_ANNOTATION);
                        }
                    });
                }
                let msg = if pod.is_some() {
                    "Sandbox is suspending"
                } else {
                    "Sandbox is suspended"
                };
                write_status(
                    sim,
                    SANDBOXES,
                    ns,
                    name,
                    json!({"conditions": [condition("Ready", false, "SandboxSuspended", msg),
                        condition("Suspended", pod.is_none(), if pod.is_none() { "PodTerminated" } else { "PodTerminating" }, "")],
                        "selector": format!("{NAME_HASH_LABEL}={}", name_hash(name))}),
                );
                continue;
            }
            // More than one pod controlled by this Sandbox: it refuses to
            // choose or make one, and says so (the Event once per entry).
            let owned = pods
                .iter()
                .filter(|p| meta(p, "namespace") == ns)
                .filter(|p| {
                    p["metadata"]["ownerReferences"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|r| r["controller"] == true && r["uid"] == meta(&sb, "uid"))
                })
                .count();
            if owned > 1 {
                let msg = format!(
                    "multiple Pods ({owned}) are controlled by this Sandbox; refusing to choose or create a Pod"
                );
                if ready_reason(&sb) != Some("MultiplePods") {
                    record_event(sim, &sb, "Warning", "MultiplePods", "Reconciling", &msg);
                }
                not_ready(sim, ns, name, "MultiplePods", &msg);
                continue;
            }
            if let Err(e) = reconcile_pvcs(sim, &sb) {
                let msg = format!("Error seen: {e}");
                not_ready(sim, ns, name, "ReconcilerError", &msg);
                continue;
            }
            let Some(pod) = pod else {
                // No pod (never made, or deleted): a new one of that name.
                sim.put(PODS, pod_object(&sb, &pod_name));
                continue;
            };
            let wants_service = sb["spec"]["service"] == true;
            if wants_service && svc.is_none() {
                // A Service's name is a DNS label: a Sandbox named longer
                // than 63 characters cannot have one.
                if let Some(why) = crate::schema::dns_label(name) {
                    let msg = format!(
                        "Error seen: failed to create service: Service {name:?} is invalid: metadata.name: {why}"
                    );
                    not_ready(sim, ns, name, "ReconcilerError", &msg);
                    continue;
                }
                sim.put(SERVICES, service_object(&sb));
            }
            self.sync_pod_labels(sim, &sb, pod);
            let mut conditions = vec![
                condition("Suspended", false, "NotSuspended", "Sandbox is not suspended"),
                pod_scheduled(pod),
                ready_condition(&sb, Some(pod), svc.is_some()),
            ];
            if let Some(phase @ ("Failed" | "Succeeded")) = pod["status"]["phase"].as_str() {
                let reason = if phase == "Failed" { "PodFailed" } else { "PodSucceeded" };
                conditions.push(condition("Finished", true, reason, ""));
            }
            let mut status = json!({
                "conditions": conditions,
                "podIPs": pod["status"]["podIPs"].as_array().map(|a| a.iter().map(|i| i["ip"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
                "selector": format!("{NAME_HASH_LABEL}={}", name_hash(name)),
            });
            if svc.is_some() {
                status["service"] = json!(name);
                status["serviceFQDN"] = json!(format!("{name}.{ns}.svc.cluster.local"));
            }
            write_status(sim, SANDBOXES, ns, name, status);
        }
    }

    /// Carries the pod template's labels onto the running pod — for an
    /// adopted warm pod, only once the adoption's delay has passed (the
    /// real controller patches them after the claim reads Ready).
    fn sync_pod_labels(&self, sim: &Simulator, sb: &Value, pod: &Value) {
        let want = sb["spec"]["podTemplate"]["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let missing = want.iter().any(|(k, v)| pod["metadata"]["labels"][k] != *v);
        if !missing {
            return;
        }
        let k = key(meta(pod, "namespace"), meta(pod, "name"));
        {
            let mut st = self.lock();
            match st.label_sync.get(&k) {
                Some(at) if *at > std::time::Instant::now() => return,
                _ => {
                    st.label_sync.remove(&k);
                }
            }
        }
        sim.update(PODS, meta(pod, "namespace"), meta(pod, "name"), |p| {
            if !p["metadata"]["labels"].is_object() {
                p["metadata"]["labels"] = json!({});
            }
            for (k, v) in &want {
                p["metadata"]["labels"][k] = v.clone();
            }
        });
    }
}
