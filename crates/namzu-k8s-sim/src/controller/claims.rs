//! Claims, as `extensions/controllers/sandboxclaim_controller.go` keeps
//! them: metadata checked before anything else, pool and template looked
//! up, environment injection judged by the template's policy, then a warm
//! Sandbox adopted (only one with pod IPs; after a 2 s grace, a cold one
//! instead), expiry in two steps, and a status whose Ready is the bound
//! Sandbox's own.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::pools::blueprint_pod;
use super::*;

/// How long a claim waits for a warm candidate with pod IPs before it
/// cold-starts.
pub const WARM_GRACE: Duration = Duration::from_secs(2);

/// A claim's refusal: its `Ready` reason and message.
type Refusal = (&'static str, String);

/// Domains whose annotations a claim may not set.
const RESTRICTED_DOMAINS: [&str; 3] = ["kubernetes.io", "k8s.io", "agents.x-k8s.io"];

fn under(domain: &str, of: &str) -> bool {
    domain == of || domain.ends_with(&format!(".{of}"))
}

/// The controller's check of `additionalPodMetadata`: label keys need a
/// domain prefix inside the allowlist; `app=sandbox-router` is refused;
/// annotations may not use a restricted domain.
pub fn validate_metadata(md: &Value, allowed: &[String]) -> Result<(), String> {
    for (k, v) in md["labels"].as_object().into_iter().flatten() {
        let value = v.as_str().unwrap_or_default();
        let check = || -> Result<(), String> {
            namzu_kubernetes::build::check_label(k, "").map_err(|e| format!("invalid label key: {k:?}: {e}"))?;
            if k.eq_ignore_ascii_case("app") && value.eq_ignore_ascii_case("sandbox-router") {
                return Err(format!(
                    "restricted system label value: {k:?}={value:?} is not allowed in AdditionalPodMetadata"
                ));
            }
            let Some((domain, _)) = k.split_once('/') else {
                return Err(format!("label {k:?} must have a domain prefix (e.g. 'sandbox.users.io/my-label') to prevent opting into unintended policy domains"));
            };
            let domain = domain.to_ascii_lowercase();
            if !allowed.iter().any(|d| under(&domain, d)) {
                return Err(format!("label domain {domain:?} is not in the allowlist"));
            }
            namzu_kubernetes::build::check_label("v", value)
                .map_err(|_| format!("invalid label value: {value:?} does not match allowed pattern"))
        };
        check().map_err(|e| format!("failed to validate label {k:?}: {e}"))?;
    }
    for k in md["annotations"].as_object().into_iter().flatten().map(|(k, _)| k) {
        let domain = k
            .split_once('/')
            .map(|(d, _)| d.to_ascii_lowercase())
            .unwrap_or_default();
        if RESTRICTED_DOMAINS.iter().any(|d| under(&domain, d)) {
            return Err(format!(
                "failed to validate annotation {k:?}: restricted system domain: {k:?} is not allowed in AdditionalPodMetadata"
            ));
        }
    }
    Ok(())
}

/// Whether the template lets `claim` inject its `env`, and how the
/// controller says no: `EnvVarsInjectionRejected` (terminal) for a policy
/// that forbids it, `ReconcilerError` (retried) for a clash or an unknown
/// container.
fn injection(claim: &Value, template: &Value) -> Result<(), Refusal> {
    let env = claim["spec"]["env"].as_array().cloned().unwrap_or_default();
    if env.is_empty() {
        return Ok(());
    }
    let policy = template["spec"]["envVarsInjectionPolicy"]
        .as_str()
        .unwrap_or("Disallowed");
    if policy != "Allowed" && policy != "Overrides" {
        return Err((
            "EnvVarsInjectionRejected",
            "environment variable injection rejected: environment variable injection is not allowed by the template policy".into(),
        ));
    }
    let containers = template["spec"]["podTemplate"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for e in &env {
        let c = match e["containerName"].as_str() {
            Some(n) => containers.iter().find(|c| c["name"] == n),
            None => containers.first(),
        };
        let Some(c) = c else {
            return Err((
                "ReconcilerError",
                format!(
                    "Error seen: target container {:?} not found in template for environment variable {}",
                    e["containerName"].as_str().unwrap_or_default(),
                    e["name"]
                ),
            ));
        };
        if policy == "Allowed" {
            if !c["envFrom"].is_null() {
                return Err(("EnvVarsInjectionRejected", format!(
                    "environment variable injection rejected: container {} uses EnvFrom sources; Allowed policy cannot safely prevent overriding EnvFrom-provided variables",
                    c["name"]
                )));
            }
            if c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|have| have["name"] == e["name"])
            {
                return Err((
                    "ReconcilerError",
                    format!(
                        "Error seen: environment variable override is not allowed by the template policy for variable {}",
                        e["name"]
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Puts a claim's `env` on the containers of a pod template.
fn inject(pod: &mut Value, claim: &Value) {
    let Some(containers) = pod["spec"]["containers"].as_array_mut() else {
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

/// Whether `claim` has expired (`lifecycle.TimeLeft`): at the earlier of
/// its `shutdownTime` and, with `ttlSecondsAfterFinished`, that long after
/// its mirrored `Finished` condition turned True.
fn expired(claim: &Value, now: SystemTime) -> bool {
    let l = &claim["spec"]["lifecycle"];
    if passed(&l["shutdownTime"], now) {
        return true;
    }
    let Some(ttl) = l["ttlSecondsAfterFinished"].as_u64() else {
        return false;
    };
    let finished_at = claim["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Finished" && c["status"] == "True")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(|t| k8s_openapi::chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(SystemTime::from);
    finished_at.is_some_and(|at| at + Duration::from_secs(ttl) <= now)
}

/// The template's volumeClaimTemplates with the claim's, as the template's
/// `volumeClaimTemplatesPolicy` lets them merge (`mergeVolumeClaimTemplates`):
/// `Disallowed` (the default) refuses any, `Allowed` appends new names
/// only, `Overrides` replaces by name and appends the rest.
fn merged_vcts(claim: &Value, template: &Value) -> Result<Value, Refusal> {
    let tpl = template["spec"]["volumeClaimTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let wanted = claim["spec"]["volumeClaimTemplates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if wanted.is_empty() {
        return Ok(Value::Array(tpl));
    }
    let refuse = |m: String| {
        (
            "VolumeClaimTemplatesError",
            format!("failed to merge volume claim templates: {m}"),
        )
    };
    let name = |v: &Value| v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    match template["spec"]["volumeClaimTemplatesPolicy"]
        .as_str()
        .unwrap_or_default()
    {
        "Allowed" => {
            if let Some(v) = wanted.iter().find(|v| tpl.iter().any(|t| name(t) == name(v))) {
                return Err(refuse(format!(
                    "overriding volume claim templates is forbidden by the template: cannot override template volume {:?}",
                    name(v)
                )));
            }
            Ok(Value::Array(tpl.into_iter().chain(wanted).collect()))
        }
        "Overrides" => {
            let mut out: Vec<Value> = tpl
                .iter()
                .map(|t| wanted.iter().find(|v| name(v) == name(t)).unwrap_or(t).clone())
                .collect();
            out.extend(
                wanted
                    .iter()
                    .filter(|v| !tpl.iter().any(|t| name(t) == name(v)))
                    .cloned(),
            );
            Ok(Value::Array(out))
        }
        _ => Err(refuse("volume claim templates are disallowed by the template".into())),
    }
}

impl Controller {
    pub(super) fn claims(&self, sim: &Simulator) {
        let now = SystemTime::now();
        for claim in sim.all(CLAIMS) {
            if !claim["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let (ns, name) = (meta(&claim, "namespace"), meta(&claim, "name"));
            let l = &claim["spec"]["lifecycle"];
            if expired(&claim, now) {
                // First marked, then deleted per policy.
                if ready_reason(&claim) != Some("ClaimExpired") {
                    // Only Ready changes: Finished, which a TTL counts
                    // from, stays.
                    let mut status = claim["status"].clone();
                    let mut conds = status["conditions"].as_array().cloned().unwrap_or_default();
                    conds.retain(|c| c["type"] != "Ready");
                    conds.insert(
                        0,
                        condition(
                            "Ready",
                            false,
                            "ClaimExpired",
                            "Claim expired. Sandbox cleanup initiated.",
                        ),
                    );
                    status["conditions"] = Value::Array(conds);
                    write_status(sim, CLAIMS, ns, name, status);
                    record_event(sim, &claim, "Normal", "ClaimExpired", "Claim Expired", "Claim expired");
                    continue;
                }
                match l["shutdownPolicy"].as_str() {
                    Some(policy @ ("Delete" | "DeleteForeground")) => {
                        record_event(
                            sim,
                            &claim,
                            "Normal",
                            "ClaimExpired",
                            "Deleting",
                            &format!("Deleting Claim (ShutdownPolicy={policy})"),
                        );
                        sim.remove(CLAIMS, ns, name);
                    }
                    // Retain (the default): the Sandbox goes, the claim stays.
                    _ => {
                        if let Some(sb) = self.bound(sim, &claim) {
                            sim.remove(SANDBOXES, ns, meta(&sb, "name"));
                        }
                        let mut status = claim["status"].clone();
                        status["sandbox"] = json!({});
                        write_status(sim, CLAIMS, ns, name, status);
                    }
                }
                continue;
            }
            if self.bound(sim, &claim).is_none() {
                if let Some((reason, message)) = self.contention(name) {
                    write_status(
                        sim,
                        CLAIMS,
                        ns,
                        name,
                        json!({"conditions": [condition("Ready", false, reason, &message)]}),
                    );
                    continue;
                }
            }
            let mut status = json!({});
            match self.claim_active(sim, &claim) {
                Ok(None) => continue,
                Ok(Some(sb)) => {
                    let ready = if ready_reason(&sb) == Some("SandboxExpired") {
                        condition(
                            "Ready",
                            false,
                            "SandboxExpired",
                            "Underlying Sandbox resource has expired independently of the Claim.",
                        )
                    } else {
                        sb["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|c| c["type"] == "Ready")
                            .cloned()
                            .unwrap_or_else(|| condition("Ready", false, "SandboxNotReady", "Sandbox is not ready"))
                    };
                    // The Sandbox's Finished condition, mirrored
                    // (`syncFinishedCondition`): what a TTL counts from.
                    let finished = sb["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["type"] == "Finished")
                        .cloned();
                    status["conditions"] = json!([ready]);
                    if let (Some(f), Some(list)) = (finished, status["conditions"].as_array_mut()) {
                        list.push(f);
                    }
                    status["sandbox"] = json!({"name": meta(&sb, "name"), "podIPs": sb["status"]["podIPs"].clone()});
                }
                Err((reason, message)) => {
                    status["conditions"] = json!([condition("Ready", false, reason, &message)]);
                }
            }
            write_status(sim, CLAIMS, ns, name, status);
        }
    }

    /// The Sandbox this claim controls, if one stands.
    fn bound(&self, sim: &Simulator, claim: &Value) -> Option<Value> {
        let ns = meta(claim, "namespace");
        let named = claim["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION]
            .as_str()
            .unwrap_or(meta(claim, "name"));
        Self::lookup(sim, SANDBOXES, ns, named)
            .filter(|s| owner_of(s, "SandboxClaim").is_some_and(|(_, u)| u == meta(claim, "uid")))
    }

    /// The claim's Sandbox: found, adopted or made; `Ok(None)` while it
    /// waits for a warm candidate to get pod IPs.
    fn claim_active(&self, sim: &Simulator, claim: &Value) -> Result<Option<Value>, Refusal> {
        let ns = meta(claim, "namespace");
        validate_metadata(&claim["spec"]["additionalPodMetadata"], &self.cfg.label_domains())
            .map_err(|e| ("InvalidMetadata", format!("invalid additionalPodMetadata: {e}")))?;
        if let Some(sb) = self.bound(sim, claim) {
            return Ok(Some(sb));
        }
        let pname = claim["spec"]["warmPoolRef"]["name"].as_str().unwrap_or_default();
        let pool = Self::lookup(sim, POOLS, ns, pname)
            .ok_or_else(|| ("WarmPoolNotFound", format!("SandboxWarmPool {pname:?} not found")))?;
        let tname = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or_default();
        let template = Self::template(sim, ns, tname).ok_or_else(|| {
            (
                "TemplateNotFound",
                format!("failed to get sandbox template {ns:?}/{tname:?}"),
            )
        })?;
        injection(claim, &template)?;
        let vcts = merged_vcts(claim, &template)?;
        let extra: Map<String, Value> = if self.drop_claim_labels.load(std::sync::atomic::Ordering::SeqCst) {
            Map::new()
        } else {
            claim["spec"]["additionalPodMetadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default()
        };
        for (k, v) in &extra {
            let have = &template["spec"]["podTemplate"]["metadata"]["labels"][k];
            if !have.is_null() && have != v {
                return Err(("ReconcilerError", format!(
                    "Error seen: metadata override conflict: label {k:?} is defined in template with value {have}, but claim requests {v}"
                )));
            }
        }
        let cold_only = claim["spec"]["env"].as_array().is_some_and(|e| !e.is_empty())
            || claim["spec"]["volumeClaimTemplates"]
                .as_array()
                .is_some_and(|v| !v.is_empty());
        let sb = if cold_only {
            self.cold(sim, claim, &template, &extra, &vcts)
        } else {
            match self.candidate(sim, &pool) {
                Some(c) => self.adopt(sim, claim, &c, &template, &extra),
                None => {
                    let first = *self
                        .lock()
                        .claim_waiting
                        .entry(meta(claim, "uid").to_owned())
                        .or_insert_with(Instant::now);
                    if first.elapsed() < WARM_GRACE {
                        return Ok(None);
                    }
                    self.cold(sim, claim, &template, &extra, &vcts)
                }
            }
        };
        self.lock().claim_waiting.remove(meta(claim, "uid"));
        let sname = meta(&sb, "name").to_owned();
        sim.update(CLAIMS, ns, meta(claim, "name"), |c| {
            if !c["metadata"]["annotations"].is_object() {
                c["metadata"]["annotations"] = json!({});
            }
            c["metadata"]["annotations"][SANDBOX_NAME_ANNOTATION] = json!(sname);
        });
        Ok(Some(sb))
    }

    /// The pool's best warm Sandbox: labelled as the pool's, not being
    /// deleted, WITH pod IPs; Ready first, then the oldest.
    fn candidate(&self, sim: &Simulator, pool: &Value) -> Option<Value> {
        let mut held: Vec<Value> = sim
            .all(SANDBOXES)
            .into_iter()
            .filter(|s| owner_of(s, "SandboxWarmPool").is_some_and(|(_, u)| u == meta(pool, "uid")))
            .filter(|s| {
                !s["metadata"]["labels"][POOL_LABEL].is_null()
                    && !s["metadata"]["labels"][TEMPLATE_HASH_LABEL].is_null()
            })
            .filter(|s| s["metadata"]["deletionTimestamp"].is_null())
            .filter(|s| s["status"]["podIPs"].as_array().is_some_and(|a| !a.is_empty()))
            .collect();
        held.sort_by(|a, b| {
            is_ready(b)
                .cmp(&is_ready(a))
                .then_with(|| meta(a, "creationTimestamp").cmp(meta(b, "creationTimestamp")))
        });
        held.into_iter().next()
    }

    /// Adopts warm Sandbox `sb` for `claim`: pool labels off, the claim as
    /// its controller, its pod template rebuilt with the claim's labels —
    /// which reach the RUNNING pod only after the label delay.
    fn adopt(&self, sim: &Simulator, claim: &Value, sb: &Value, template: &Value, extra: &Map<String, Value>) -> Value {
        let (ns, name) = (meta(sb, "namespace"), meta(sb, "name"));
        let mut labels = Map::new();
        labels.insert(CLAIM_UID_LABEL.into(), json!(meta(claim, "uid")));
        labels.extend(extra.clone());
        let pod = blueprint_pod(template, &labels);
        let owner = owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim);
        let pod_name = sb["metadata"]["annotations"][POD_NAME_ANNOTATION]
            .as_str()
            .unwrap_or(name)
            .to_owned();
        self.lock()
            .label_sync
            .insert(key(ns, &pod_name), Instant::now() + self.cfg.label_delay);
        let claim_uid = meta(claim, "uid").to_owned();
        sim.update(SANDBOXES, ns, name, |s| {
            if let Some(l) = s["metadata"]["labels"].as_object_mut() {
                l.remove(POOL_LABEL);
                l.insert(LAUNCH_TYPE_LABEL.into(), json!("warm"));
                l.insert(CLAIM_UID_LABEL.into(), json!(claim_uid));
            }
            if !s["metadata"]["annotations"].is_object() {
                s["metadata"]["annotations"] = json!({});
            }
            s["metadata"]["annotations"][POD_NAME_ANNOTATION] = json!(pod_name);
            s["metadata"]["ownerReferences"] = owner;
            s["spec"]["podTemplate"]["metadata"] = pod["metadata"].clone();
        });
        record_event(
            sim,
            claim,
            "Normal",
            "SandboxAdopted",
            "Adoption",
            &format!("Adopted warm pool Sandbox {name:?}"),
        );
        sim.object(SANDBOXES.0, SANDBOXES.1, SANDBOXES.2, ns, name)
            .unwrap_or_else(|| sb.clone())
    }

    /// A cold Sandbox named after `claim`, from the template's whole
    /// blueprint, with the claim's labels and environment.
    fn cold(
        &self,
        sim: &Simulator,
        claim: &Value,
        template: &Value,
        extra: &Map<String, Value>,
        vcts: &Value,
    ) -> Value {
        let (ns, name) = (meta(claim, "namespace"), meta(claim, "name"));
        let mut labels = Map::new();
        labels.insert(CLAIM_UID_LABEL.into(), json!(meta(claim, "uid")));
        labels.extend(extra.clone());
        let mut pod = blueprint_pod(template, &labels);
        inject(&mut pod, claim);
        sim.put(
            SANDBOXES,
            json!({
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {CLAIM_UID_LABEL: meta(claim, "uid"), LAUNCH_TYPE_LABEL: "cold",
                        TEMPLATE_HASH_LABEL: name_hash(meta(template, "name"))},
                    "ownerReferences": owner_ref("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", claim)},
                "spec": {"podTemplate": pod, "service": template["spec"]["service"].clone(),
                    "volumeClaimTemplates": vcts.clone()},
            }),
        )
    }
}
