//! `deploy/k8s/`: the manifests an operator applies. The template and the
//! warm pool pass the real CRD schemas; the template is restricted; the
//! network policy closes the agent port; and the claimant Role says exactly
//! `CLAIMANT_RBAC`, compared as sets of (group, resource, verb) in both
//! directions, with the full Role a superset of it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

use namzu_k8s_sim::schema::{crd_schema, validate};
use namzu_kubernetes::CLAIMANT_RBAC;
use serde_json::Value;

/// Every document of a YAML file.
fn documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect()
}

/// A file's first document.
fn yaml(path: &Path) -> Value {
    documents(path).remove(0)
}

fn manifest(name: &str) -> Value {
    yaml(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/k8s")
            .join(name),
    )
}

fn schema(crd_file: &str) -> Value {
    let crd = yaml(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/agent-sandbox-crds")
            .join(crd_file),
    );
    crd_schema(&crd, "v1beta1").unwrap().clone()
}

#[test]
fn the_template_and_the_pool_pass_the_crd_schemas() {
    let t = manifest("sandboxtemplate-task.yaml");
    assert_eq!(
        validate(&schema("extensions.agents.x-k8s.io_sandboxtemplates.yaml"), &t),
        vec![]
    );
    for file in ["sandboxtemplate-workspace.yaml", "sandboxtemplate-workspace-block.yaml"] {
        let w = manifest(file);
        assert_eq!(
            validate(&schema("extensions.agents.x-k8s.io_sandboxtemplates.yaml"), &w),
            vec![],
            "{file}"
        );
        // And the workspace backend builds on its disk.
        namzu_kubernetes::workspace::object::check_disk("w", file, &w["spec"]).unwrap();
    }
    let p = manifest("sandboxwarmpool.yaml");
    assert_eq!(
        validate(&schema("extensions.agents.x-k8s.io_sandboxwarmpools.yaml"), &p),
        vec![]
    );
    assert_eq!(p["spec"]["sandboxTemplateRef"]["name"], t["metadata"]["name"]);
}

/// The workspace template is the task template's pod with /workspace on
/// a claim of its own: every restriction below is checked on both.
#[test]
fn the_workspace_template_is_the_task_pod_with_its_workspace_on_a_claim() {
    let (t, w) = (
        manifest("sandboxtemplate-task.yaml"),
        manifest("sandboxtemplate-workspace.yaml"),
    );
    assert_eq!(
        w["metadata"]["name"],
        namzu_kubernetes::workspace::DEFAULT_WORKSPACE_TEMPLATE
    );
    let claims = w["spec"]["volumeClaimTemplates"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["metadata"]["name"], "workspace");
    let volumes = |m: &serde_json::Value| -> Vec<String> {
        m["spec"]["podTemplate"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut task_volumes = volumes(&t);
    task_volumes.retain(|v| v != "workspace");
    assert_eq!(
        volumes(&w),
        task_volumes,
        "the claim replaces the emptyDir, nothing else"
    );
    // The same containers, but for the agent's shutdown deadline (see
    // the grace-period test below).
    let mut containers = w["spec"]["podTemplate"]["spec"]["containers"].clone();
    containers[0]["env"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != "NAMZU_AGENT_SHUTDOWN_DEADLINE_MS");
    assert_eq!(
        containers, t["spec"]["podTemplate"]["spec"]["containers"],
        "the same containers"
    );
    assert_eq!(
        w["spec"]["podTemplate"]["spec"]["securityContext"],
        t["spec"]["podTemplate"]["spec"]["securityContext"]
    );
}

/// A stopping workspace pod flushes its disk before the kubelet's SIGKILL:
/// the agent's quiesce round and its shutdown flush fit in its shutdown
/// deadline (as the template sets it), and the deadline in the pod's
/// grace period with a margin for the kubelet; the suspend's own flush is
/// the same bound, and a suspend waits longer than the grace period.
#[test]
fn a_stopping_workspace_pod_flushes_inside_its_grace_period() {
    let w = manifest("sandboxtemplate-workspace.yaml");
    let pod = &w["spec"]["podTemplate"]["spec"];
    let grace_ms = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("an explicit grace period")
        * 1000;
    let env = |name: &str| {
        pod["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(|v| v.parse::<u64>().unwrap())
    };
    let defaults = namzu_agent::config::Limits::default();
    let var = |limit: &str| namzu_proto::limits::env_var(limit);
    let deadline =
        env(&var(namzu_proto::limits::AGENT_SHUTDOWN_DEADLINE_MS)).unwrap_or(defaults.agent_shutdown_deadline_ms);
    let quiesce = env(&var(namzu_proto::limits::SHUTDOWN_GRACE_MS)).unwrap_or(defaults.shutdown_grace_ms);
    let flush = u64::try_from(namzu_agent::quiesce::SHUTDOWN_FLUSH_TIMEOUT.as_millis()).unwrap();
    // One quiesce round and the flush, with a second for the rest.
    assert!(
        quiesce + flush + 1000 <= deadline,
        "quiesce {quiesce} + flush {flush} over the deadline {deadline}"
    );
    // The kubelet's SIGKILL after the grace period: 5 s of margin at least.
    assert!(
        deadline + 5000 <= grace_ms,
        "deadline {deadline} too close to the grace period {grace_ms}"
    );
    assert_eq!(
        namzu_kubernetes::workspace::DEFAULT_FLUSH_TIMEOUT,
        namzu_agent::quiesce::SHUTDOWN_FLUSH_TIMEOUT
    );
    let suspend_wait = namzu_kubernetes::DEFAULT_READY_TIMEOUT.as_millis() as u64;
    assert!(suspend_wait > grace_ms, "a suspend gives up before the pod may stop");
}

/// The block-mode workspace: the device handed to the agent that
/// prepares it, the only capabilities it starts with the ones it needs to
/// mount and to drop to its own uid, and the drop asked for.
#[test]
fn the_block_workspace_template_grants_only_what_preparing_the_device_needs() {
    let w = manifest("sandboxtemplate-workspace-block.yaml");
    assert_eq!(w["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"], "Block");
    let agent = &w["spec"]["podTemplate"]["spec"]["containers"][0];
    let sc = &agent["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let mut added: Vec<&str> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    added.sort_unstable();
    assert_eq!(added, ["CHOWN", "KILL", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN"]);
    let args: Vec<&str> = agent["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let after = |flag: &str| args.iter().position(|a| *a == flag).map(|i| args[i + 1]);
    assert_eq!(after("--workspace-device"), Some("/dev/namzu-workspace"));
    assert!(after("--command-user").is_some(), "the agent must drop its privileges");
    // The init container is the task template's, unprivileged.
    assert_eq!(
        w["spec"]["podTemplate"]["spec"]["initContainers"],
        manifest("sandboxtemplate-workspace.yaml")["spec"]["podTemplate"]["spec"]["initContainers"]
    );
}

#[test]
fn the_template_is_restricted_and_gives_the_agent_its_token() {
    let t = manifest("sandboxtemplate-task.yaml");
    let pod = &t["spec"]["podTemplate"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let containers = pod["containers"].as_array().unwrap();
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{}", c["name"]);
        assert!(sc["capabilities"].get("add").is_none(), "{}", c["name"]);
        assert_ne!(sc["privileged"], true);
    }
    let agent = &containers[0];
    let token = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NAMZU_AGENT_TOKEN")
        .unwrap();
    assert_eq!(token["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
    assert_eq!(agent["ports"][0]["containerPort"], 1024);
    assert_eq!(
        t["spec"]["podTemplate"]["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "namzu"
    );
}

/// The link's files: the Secret (the agents' key) mounted by the init
/// container alone, the key removed by the agent once read, the CA from
/// the ConfigMap, and the names `namzu kube link-init` writes.
#[test]
fn the_template_wires_the_link_tls_so_no_command_sees_a_key() {
    use namzu_kubernetes::link::{CA_CONFIGMAP, CA_KEY, SERVER_SECRET};
    let t = manifest("sandboxtemplate-task.yaml");
    let pod = &t["spec"]["podTemplate"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap().clone();
    let secret = volume("namzu-link-secret");
    assert_eq!(secret["secret"]["secretName"], SERVER_SECRET);
    assert_eq!(secret["secret"]["defaultMode"], 0o440);
    assert_eq!(volume("namzu-link-ca")["configMap"]["name"], CA_CONFIGMAP);
    assert_eq!(volume("namzu-link")["emptyDir"]["medium"], "Memory");
    let mounts = |c: &serde_json::Value| -> Vec<String> {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let init = &pod["initContainers"][0];
    let agent = &pod["containers"][0];
    assert!(mounts(init).contains(&"namzu-link-secret".to_owned()));
    assert!(
        !mounts(agent).contains(&"namzu-link-secret".to_owned()),
        "the workload mounts the Secret"
    );
    let args = |c: &serde_json::Value, k: &str| -> Vec<String> {
        c[k].as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let install = args(init, "command");
    assert!(install
        .windows(2)
        .any(|w| w == ["--install-tls-from", "/namzu-link-secret"]));
    assert!(install.windows(2).any(|w| w == ["--install-tls-to", "/namzu-link"]));
    let serve = args(agent, "args");
    assert!(serve.contains(&"--consume-tls-key".to_owned()), "{serve:?}");
    assert!(serve.windows(2).any(|w| w == ["--tls-key", "/namzu-link/tls.key"]));
    assert!(serve
        .windows(2)
        .any(|w| w[0] == "--tls-client-ca" && w[1] == format!("/etc/namzu-link/{CA_KEY}")));
}

#[test]
fn the_network_policy_closes_the_agent_port_to_all_but_the_host() {
    let np = manifest("networkpolicy.yaml");
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"],
        "namzu"
    );
    let rules = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let from = rules[0]["from"].as_array().unwrap();
    // Only a pod selector: no ipBlock, no namespace-wide peer.
    assert!(from
        .iter()
        .all(|p| p.get("podSelector").is_some() && p.get("ipBlock").is_none() && p.get("namespaceSelector").is_none()));
    assert_eq!(
        rules[0]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 1024}])
    );
}

fn role_set(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in role["rules"].as_array().unwrap() {
        for g in r["apiGroups"].as_array().unwrap() {
            for res in r["resources"].as_array().unwrap() {
                for v in r["verbs"].as_array().unwrap() {
                    out.insert((
                        g.as_str().unwrap().to_owned(),
                        res.as_str().unwrap().to_owned(),
                        v.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn the_claimant_role_is_exactly_the_constant_and_the_full_role_covers_it() {
    let constant: BTreeSet<(String, String, String)> = CLAIMANT_RBAC
        .iter()
        .flat_map(|(g, r, vs)| {
            vs.iter()
                .map(move |v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect();
    let claimant = role_set(&manifest("rbac-claimant.yaml"));
    let missing: Vec<_> = constant.difference(&claimant).collect();
    let extra: Vec<_> = claimant.difference(&constant).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "manifest lacks {missing:?}, grants beyond {extra:?}"
    );
    let full = role_set(&manifest("rbac.yaml"));
    let uncovered: Vec<_> = constant.difference(&full).collect();
    assert!(uncovered.is_empty(), "the full Role lacks {uncovered:?}");
}

#[test]
fn the_admission_fence_bounds_per_sandbox_policies_and_is_readable_by_name_only() {
    use namzu_kubernetes::policy::per_sandbox::{DEFAULT_FENCE, DEFAULT_LABEL_KEY, POLICY_NAME_PREFIX};
    let vap = manifest("admission-fence.yaml");
    assert_eq!(vap["kind"], "ValidatingAdmissionPolicy");
    assert_eq!(vap["metadata"]["name"], DEFAULT_FENCE);
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    let rule = &vap["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["apiGroups"], serde_json::json!(["cilium.io"]));
    assert_eq!(rule["resources"], serde_json::json!(["ciliumnetworkpolicies"]));
    assert_eq!(rule["operations"], serde_json::json!(["CREATE", "UPDATE", "DELETE"]));
    let cel: Vec<&str> = vap["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["expression"].as_str().unwrap())
        .collect();
    // The constants the backend writes by are the ones the fence names.
    assert!(cel.iter().any(|e| e.contains(&format!("'{POLICY_NAME_PREFIX}' + "))));
    assert!(cel.iter().any(|e| e.contains(&format!("'{DEFAULT_LABEL_KEY}'"))));
    let binding = manifest("admission-fence-binding.yaml");
    assert_eq!(binding["metadata"]["name"], DEFAULT_FENCE);
    assert_eq!(binding["spec"]["policyName"], DEFAULT_FENCE);
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    let reader = manifest("rbac-fence-reader.yaml");
    assert_eq!(reader["kind"], "ClusterRole");
    let r = &reader["rules"];
    assert_eq!(r.as_array().unwrap().len(), 1);
    assert_eq!(r[0]["verbs"], serde_json::json!(["get"]));
    assert_eq!(r[0]["resourceNames"], serde_json::json!([DEFAULT_FENCE]));
    // The writes it fences are the opt-in writer Role's.
    let writer = role_set(&manifest("rbac-policy-writer.yaml"));
    for verb in ["create", "patch", "delete"] {
        assert!(
            writer.contains(&("cilium.io".into(), "ciliumnetworkpolicies".into(), verb.into())),
            "{verb}"
        );
    }
}

#[test]
fn the_shipped_controller_config_admits_the_pod_labels_namzu_sends_by_default() {
    use namzu_k8s_sim::controller::claims::validate_metadata;
    use namzu_k8s_sim::controller::ControllerConfig;
    use namzu_kubernetes::policy::per_sandbox::PerSandboxEgress;
    use namzu_kubernetes::policy::{Engine, KubeEgressConfig, KubeEgressPolicy};
    use namzu_kubernetes::{build, KubernetesOptions};
    let cm = manifest("agent-sandbox-config.yaml");
    assert_eq!(
        (cm["kind"].as_str(), cm["metadata"]["name"].as_str()),
        (Some("ConfigMap"), Some("agent-sandbox-config"))
    );
    let allowed = ControllerConfig {
        allowed_label_domains: cm["data"]["allowed-label-domains"].as_str().map(String::from),
        ..ControllerConfig::new("/x".into(), "/x".into())
    }
    .label_domains();
    // Every pod label namzu can ask for by default: a profile and a
    // per-sandbox selector.
    let mut egress = KubeEgressConfig::new("namzu-task", KubeEgressPolicy::DenyAll);
    egress.engine = Engine::Cilium;
    egress.profile = Some("builders".into());
    egress.per_sandbox = Some(PerSandboxEgress::default());
    let opts = KubernetesOptions {
        warm_pool_name: Some("namzu-pool".into()),
        egress: Some(egress),
        ..Default::default()
    };
    let claim = serde_json::to_value(build::claim(&opts, "namzu-sb-1", "sb-1", std::time::SystemTime::now())).unwrap();
    let md = &claim["spec"]["additionalPodMetadata"];
    assert_eq!(md["labels"].as_object().unwrap().len(), 2, "{md}");
    assert_eq!(validate_metadata(md, &allowed), Ok(()));
    // … and the same under the controller's built-in default.
    assert_eq!(validate_metadata(md, &["sandbox.users.io".to_owned()]), Ok(()));
    // The labels namzu used to send are exactly what it refuses.
    let old = serde_json::json!({"labels": {"io.namzu/sandbox": "sb-1", "app.kubernetes.io/managed-by": "namzu"}});
    assert!(validate_metadata(&old, &allowed).is_err());
}

#[test]
fn every_role_is_bound_to_the_one_service_account_the_fence_names() {
    let sa = manifest("serviceaccount.yaml");
    assert_eq!(sa["kind"], "ServiceAccount");
    let (name, ns) = (
        sa["metadata"]["name"].as_str().unwrap(),
        sa["metadata"]["namespace"].as_str().unwrap(),
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s");
    for file in [
        "rbac.yaml",
        "rbac-claimant.yaml",
        "rbac-policy-writer.yaml",
        "rbac-fence-reader.yaml",
    ] {
        let docs = documents(&dir.join(file));
        assert_eq!(docs.len(), 2, "{file}: a Role and its binding");
        let (role, binding) = (&docs[0], &docs[1]);
        let kind = role["kind"].as_str().unwrap();
        assert_eq!(binding["kind"], format!("{kind}Binding"), "{file}");
        assert_eq!(binding["roleRef"]["kind"], kind, "{file}");
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"], "{file}");
        assert_eq!(
            binding["metadata"]["namespace"], role["metadata"]["namespace"],
            "{file}"
        );
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]),
            "{file}"
        );
    }
    // The fence fences exactly that account.
    let fence = manifest("admission-fence.yaml");
    let cond = fence["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(cond.contains(&format!("'system:serviceaccount:{ns}:{name}'")), "{cond}");
    // Policy writes live in the opt-in Role alone: neither default Role
    // can write, or delete, a policy (the operator's baseline included).
    let writes = ["create", "update", "patch", "delete", "deletecollection"];
    for file in ["rbac.yaml", "rbac-claimant.yaml"] {
        for (g, r, v) in role_set(&manifest(file)) {
            let policy = r == "networkpolicies" || r == "ciliumnetworkpolicies";
            assert!(
                !(policy && writes.contains(&v.as_str())),
                "{file} grants {v} on {g}/{r}"
            );
        }
    }
    let writer: BTreeSet<(String, String, String)> = namzu_kubernetes::POLICY_WRITER_RBAC
        .iter()
        .flat_map(|(g, r, vs)| {
            vs.iter()
                .map(move |v| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        })
        .collect();
    assert_eq!(role_set(&manifest("rbac-policy-writer.yaml")), writer);
}
