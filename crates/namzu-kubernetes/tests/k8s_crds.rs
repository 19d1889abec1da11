//! Every object the kubernetes backend builds passes the real
//! agent-sandbox CRD schemas (copied from kubernetes-sigs/agent-sandbox
//! into `tests/fixtures/agent-sandbox-crds/`), checked as the API server
//! checks a custom resource plus strict unknown-field refusal — and the
//! check itself refuses what it should, so a pass means something.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Capabilities, Container, PodSpec, PodTemplateSpec, SeccompProfile, SecurityContext};
use namzu_k8s_sim::schema::{crd_schema, validate, Violation};
use namzu_kubernetes::crd::{Kind, NameRef, SandboxTemplate, SandboxWarmPool, VERSION};
use namzu_kubernetes::{build, AddressMode, KubernetesOptions};
use serde_json::Value;

fn crd(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agent-sandbox-crds")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// The schema of kind `K`, from its CRD.
fn schema_of<K: Kind>() -> Value {
    let file = format!("{}_{}.yaml", K::GROUP, K::PLURAL);
    let crd = crd(&file);
    assert_eq!(crd["spec"]["names"]["kind"], K::KIND, "{file}");
    crd_schema(&crd, VERSION).unwrap().clone()
}

fn violations<K: Kind + serde::Serialize>(obj: &K) -> Vec<Violation> {
    validate(&schema_of::<K>(), &serde_json::to_value(obj).unwrap())
}

/// The task template `deploy/k8s` will ship: the static agent, restricted.
fn template() -> SandboxTemplate {
    let mut t = SandboxTemplate::named("sandboxes", "namzu-task");
    t.spec.pod_template = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "agent".into(),
                image: Some("registry.example/namzu-agent:1".into()),
                args: Some(vec!["--listen".into(), "tcp:0.0.0.0:1024".into()]),
                security_context: Some(SecurityContext {
                    run_as_non_root: Some(true),
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        add: None,
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        localhost_profile: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
    };
    t
}

fn options() -> KubernetesOptions {
    KubernetesOptions {
        namespace: "sandboxes".into(),
        warm_pool_name: Some("namzu-pool".into()),
        template_name: Some("namzu-task".into()),
        claim_labels: [("team".to_owned(), "agents".to_owned())].into(),
        ..Default::default()
    }
}

#[test]
fn a_claim_passes_the_sandboxclaim_schema() {
    let now = SystemTime::now();
    let c = build::claim(&options(), "namzu-sb-0123", "sb-0123", now);
    assert_eq!(violations(&c), vec![]);
    // Claim labels and namzu's own on the claim only; no pod label at all
    // without an egress profile (nothing the controller's allowlist could
    // refuse).
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v["metadata"]["labels"],
        serde_json::json!({"team": "agents", build::SANDBOX_LABEL: "sb-0123", build::MANAGED_BY_LABEL: build::MANAGED_BY})
    );
    assert!(v["spec"]["additionalPodMetadata"].is_null(), "{v}");
    // With a profile: its label, under the one pod-label domain.
    let mut profiled = options();
    let mut egress = namzu_kubernetes::policy::KubeEgressConfig::new(
        "namzu-task",
        namzu_kubernetes::policy::KubeEgressPolicy::DenyAll,
    );
    egress.profile = Some("builders".into());
    profiled.egress = Some(egress);
    let p = serde_json::to_value(build::claim(&profiled, "namzu-sb-0123", "sb-0123", now)).unwrap();
    assert_eq!(
        p["spec"]["additionalPodMetadata"]["labels"],
        serde_json::json!({"namzu.sandbox.users.io/egress-profile": "builders"})
    );
    assert!(
        p["spec"]["additionalPodMetadata"]["labels"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| build::key_in_domain(k, build::DEFAULT_POD_LABEL_DOMAIN)),
        "{p}"
    );
    assert_eq!(v["spec"]["warmPoolRef"]["name"], "namzu-pool");
    assert_eq!(v["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    let ahead = build::until(v["spec"]["lifecycle"]["shutdownTime"].as_str().unwrap(), now).unwrap();
    // Rounded up to the second: never short of the TTL, at most a second over.
    assert!(
        ahead >= Duration::from_secs(3600) && ahead < Duration::from_secs(3601),
        "{ahead:?}"
    );
}

#[test]
fn a_sandbox_from_the_template_passes_the_sandbox_schema() {
    let t = template();
    assert_eq!(violations(&t), vec![], "the template itself");
    for mode in [AddressMode::Service, AddressMode::PodIp] {
        let opts = KubernetesOptions {
            address_mode: mode,
            ..options()
        };
        let s = build::sandbox(&opts, &t, "namzu-sb-0456", "sb-0456", SystemTime::now());
        assert_eq!(violations(&s), vec![], "{mode:?}");
        let v = serde_json::to_value(&s).unwrap();
        let agent = &v["spec"]["podTemplate"]["spec"]["containers"][0];
        let token = agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == build::TOKEN_ENV)
            .unwrap();
        assert_eq!(token["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
        assert_eq!(agent["ports"][0]["containerPort"], 1024);
        assert_eq!(v["metadata"]["labels"][build::SANDBOX_LABEL], "sb-0456");
        assert!(v["spec"]["podTemplate"]["metadata"]["labels"]
            .get(build::SANDBOX_LABEL)
            .is_none());
        assert_eq!(v["spec"]["service"], mode == AddressMode::Service);
        assert_eq!(v["spec"]["shutdownPolicy"], "Delete");
    }
}

#[test]
fn a_warm_pool_passes_the_sandboxwarmpool_schema() {
    let mut p = SandboxWarmPool::named("sandboxes", "namzu-pool");
    p.spec.replicas = Some(3);
    p.spec.sandbox_template_ref = NameRef {
        name: "namzu-task".into(),
    };
    assert_eq!(violations(&p), vec![]);
}

/// Negative controls: the same check refuses a misspelt field, a missing
/// required one, a value outside an enum and a bad date-time, by path.
#[test]
fn the_schema_check_refuses_broken_objects() {
    let c = build::claim(&options(), "namzu-sb-0789", "sb-0789", SystemTime::now());
    let schema = schema_of::<namzu_kubernetes::crd::SandboxClaim>();
    let mut v = serde_json::to_value(&c).unwrap();
    v["spec"]["warmPoolRefs"] = v["spec"]["warmPoolRef"].take();
    v["spec"].as_object_mut().unwrap().remove("warmPoolRef");
    v["spec"]["lifecycle"]["shutdownPolicy"] = "Never".into();
    v["spec"]["lifecycle"]["shutdownTime"] = "tomorrow".into();
    let got: Vec<String> = validate(&schema, &v).iter().map(ToString::to_string).collect();
    for want in [
        ".spec.warmPoolRefs: unknown field",
        ".spec: required field \"warmPoolRef\" is missing",
        ".spec.lifecycle.shutdownPolicy: \"Never\" is not one of",
        ".spec.lifecycle.shutdownTime: \"tomorrow\" is not an RFC 3339",
    ] {
        assert!(got.iter().any(|g| g.starts_with(want)), "missing {want:?} in {got:#?}");
    }
    // A pod template with a typo deep inside is caught too.
    let mut s = serde_json::to_value(build::sandbox(&options(), &template(), "x", "sb-x", SystemTime::now())).unwrap();
    s["spec"]["podTemplate"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always".into();
    let got = validate(&schema_of::<namzu_kubernetes::crd::Sandbox>(), &s);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].path, ".spec.podTemplate.spec.containers[0].imagePullPolicyy");
}

#[test]
fn options_are_refused_by_name() {
    let refused = |o: KubernetesOptions| match o.validate() {
        Err(namzu::Error::OptionRefused { option, .. }) => option,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(KubernetesOptions {
            api_request_timeout: Duration::from_millis(500),
            ..options()
        }),
        "api_request_timeout"
    );
    assert_eq!(
        refused(KubernetesOptions {
            api_request_timeout: Duration::ZERO,
            ..options()
        }),
        "api_request_timeout"
    );
    assert_eq!(
        refused(KubernetesOptions {
            warm_pool_name: None,
            template_name: None,
            ..options()
        }),
        "warm_pool_name"
    );
    assert_eq!(
        refused(KubernetesOptions {
            claim_labels: [("Bad Key".to_owned(), "v".to_owned())].into(),
            ..options()
        }),
        "claim_labels.Bad Key"
    );
    assert!(options().validate().is_ok());
}
