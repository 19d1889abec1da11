//! The claim side of the controller: binding a claim to a warm pool's
//! Sandbox (adoption) or a new one, and the claim's environment and labels
//! injected into the pod template as the controller allows.

use serde_json::{json, Value};

use super::*;

impl Controller {
    pub(super) fn claims(&self, sim: &Simulator) {
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
}
