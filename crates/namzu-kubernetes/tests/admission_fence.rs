//! The per-sandbox egress fence (`deploy/k8s/admission-fence.yaml`),
//! EVALUATED: its CEL runs in a CEL interpreter (the `cel` crate) as a
//! ValidatingAdmissionPolicy would run it — match conditions, then the
//! variables, then every validation, an evaluation error denying
//! (`failurePolicy: Fail`) — over the policies namzu writes (admitted) and
//! over the ones a host holding namzu's credentials must not get through
//! (each refused, by the rule that names it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use cel::{Context, Program, Value as Cel};
use namzu::egress::policy::{HostPattern, HostRule};
use namzu_kubernetes::bound::{Bound, BoundPod};
use namzu_kubernetes::lease::Leased;
use namzu_kubernetes::policy::per_sandbox::{policy_for, PerSandboxEgress};
use serde_json::{json, Value};

const HOST: &str = "system:serviceaccount:sandboxes:namzu-host";

fn fence() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s/admission-fence.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn eval(expr: &str, ctx: &Context) -> Result<Cel, String> {
    let p = Program::compile(expr).map_err(|e| format!("{expr}: does not compile: {e}"))?;
    p.execute(ctx).map_err(|e| format!("{expr}: {e}"))
}

/// What the API server answers `user`'s `op` on `object` (`old` for a
/// DELETE or UPDATE): `Ok` admitted, `Err` the refusing rule's message.
fn admit(user: &str, op: &str, object: Option<&Value>, old: Option<&Value>) -> Result<(), String> {
    let vap = fence();
    let spec = &vap["spec"];
    let ops = spec["matchConstraints"]["resourceRules"][0]["operations"]
        .as_array()
        .unwrap();
    if !ops.iter().any(|o| o == op) {
        return Ok(());
    }
    let mut ctx = Context::default();
    let request = json!({"operation": op, "userInfo": {"username": user}});
    ctx.add_variable("request", cel::to_value(&request).unwrap()).unwrap();
    ctx.add_variable("object", cel::to_value(object.unwrap_or(&Value::Null)).unwrap())
        .unwrap();
    ctx.add_variable("oldObject", cel::to_value(old.unwrap_or(&Value::Null)).unwrap())
        .unwrap();
    for m in spec["matchConditions"].as_array().into_iter().flatten() {
        if eval(m["expression"].as_str().unwrap(), &ctx)? != Cel::Bool(true) {
            return Ok(());
        }
    }
    let mut vars: HashMap<String, Cel> = HashMap::new();
    for v in spec["variables"].as_array().into_iter().flatten() {
        let mut inner = Context::default();
        inner.add_variable("request", cel::to_value(&request).unwrap()).unwrap();
        inner
            .add_variable("object", cel::to_value(object.unwrap_or(&Value::Null)).unwrap())
            .unwrap();
        inner
            .add_variable("oldObject", cel::to_value(old.unwrap_or(&Value::Null)).unwrap())
            .unwrap();
        let got = eval(v["expression"].as_str().unwrap(), &inner)?;
        vars.insert(v["name"].as_str().unwrap().to_owned(), got);
    }
    ctx.add_variable_from_value("variables", Cel::from(vars));
    for v in spec["validations"].as_array().unwrap() {
        let message = v["message"].as_str().unwrap().to_owned();
        match eval(v["expression"].as_str().unwrap(), &ctx) {
            Ok(Cel::Bool(true)) => {}
            Ok(_) => return Err(message),
            Err(e) => return Err(format!("{message} (evaluation error: {e})")),
        }
    }
    Ok(())
}

fn bound() -> Bound {
    Bound {
        id: "sb-1".into(),
        owner: Leased::Claim,
        owner_name: "namzu-sb-1".into(),
        owner_uid: Some("0f6a-uid".into()),
        sandbox: "namzu-pool-abcde".into(),
        sandbox_uid: Some("sbx-uid".into()),
        fqdn: None,
        pod: BoundPod {
            name: "namzu-pool-abcde".into(),
            uid: "pod-uid".into(),
            ip: None,
            labels: Default::default(),
        },
    }
}

/// What namzu writes for sandbox `sb-1`: an exact name, a domain, and a
/// host narrowed to a port.
fn written() -> Value {
    let hosts = vec![
        HostRule {
            host: HostPattern::Exact("api.example.com".into()),
            ports: None,
        },
        HostRule {
            host: HostPattern::Domain("pypi.org".into()),
            ports: Some(vec![443]),
        },
    ];
    policy_for(&PerSandboxEgress::default(), "sandboxes", &bound(), &hosts).unwrap()
}

#[test]
fn what_namzu_writes_is_admitted_create_update_and_delete() {
    let p = written();
    assert_eq!(admit(HOST, "CREATE", Some(&p), None), Ok(()), "{p:#}");
    assert_eq!(admit(HOST, "UPDATE", Some(&p), Some(&p)), Ok(()));
    assert_eq!(admit(HOST, "DELETE", None, Some(&p)), Ok(()));
    // namzu stopped writing blockOwnerDeletion (it needs rights on the
    // owner's finalizers a namespaced host should not hold).
    assert!(
        p["metadata"]["ownerReferences"][0].get("blockOwnerDeletion").is_none(),
        "{p}"
    );
    // Anyone else is not fenced by it (RBAC decides for them).
    let mut wide = p.clone();
    wide["spec"]["egress"] = json!([{"toEntities": ["world"]}]);
    assert_eq!(
        admit("system:serviceaccount:ops:admin", "CREATE", Some(&wide), None),
        Ok(())
    );
}

/// An escape: what it is, how it changes what namzu writes, and the
/// message of the rule that must refuse it.
type Escape = (&'static str, Box<dyn Fn(&mut Value)>, &'static str);

#[test]
fn every_escape_from_the_shape_is_refused_by_its_rule() {
    let cases: Vec<Escape> = vec![
        (
            "a suffix not its owner's uid",
            Box::new(|p| p["metadata"]["name"] = json!("namzu-sbx-someone-else")),
            "named namzu-sbx-<its owner's uid>",
        ),
        (
            "an owner that is not namzu's",
            Box::new(|p| p["metadata"]["ownerReferences"][0]["name"] = json!("prod-claim")),
            "of namzu's",
        ),
        (
            "two owners",
            Box::new(|p| {
                let o = p["metadata"]["ownerReferences"][0].clone();
                p["metadata"]["ownerReferences"] = json!([o.clone(), o]);
            }),
            "exactly one",
        ),
        (
            "blockOwnerDeletion",
            Box::new(|p| p["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(true)),
            "without blockOwnerDeletion",
        ),
        (
            "another sandbox's pod",
            Box::new(|p| {
                p["spec"]["endpointSelector"]["matchLabels"]["namzu.sandbox.users.io/egress-sandbox"] = json!("sb-2")
            }),
            "selects its owner's one sandbox",
        ),
        (
            "a wider selector",
            Box::new(|p| p["spec"]["endpointSelector"]["matchLabels"]["app"] = json!("x")),
            "selects its owner's one sandbox",
        ),
        (
            "an ingress section",
            Box::new(|p| p["spec"]["ingress"] = json!([{}])),
            "egress allowances only",
        ),
        (
            "a deny rule",
            Box::new(|p| p["spec"]["egressDeny"] = json!([{"toEntities": ["world"]}])),
            "egress allowances only",
        ),
        (
            "an entity",
            Box::new(|p| p["spec"]["egress"] = json!([{"toEntities": ["world"]}])),
            "only the cluster resolver and hostnames",
        ),
        (
            "an address range",
            Box::new(|p| p["spec"]["egress"] = json!([{"toCIDR": ["0.0.0.0/0"]}])),
            "only the cluster resolver and hostnames",
        ),
        (
            "ports alone",
            Box::new(|p| p["spec"]["egress"] = json!([{"toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}])),
            "each rule naming where it goes",
        ),
        (
            "the resolver on another port",
            Box::new(|p| {
                p["spec"]["egress"] = json!([{"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}],
                "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}]);
            }),
            "on port 53",
        ),
        (
            "the resolver on every port",
            Box::new(|p| {
                p["spec"]["egress"] = json!([{"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}]}]);
            }),
            "on port 53",
        ),
        (
            "another endpoint",
            Box::new(|p| {
                p["spec"]["egress"] = json!([{"toEndpoints": [{"matchLabels": {"app": "db"}}], "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}]}]}]);
            }),
            "on port 53",
        ),
        (
            "a wildcard over a TLD",
            Box::new(|p| p["spec"]["egress"] = json!([{"toFQDNs": [{"matchPattern": "*.com"}]}])),
            "at least two labels",
        ),
        (
            "a wildcard in the middle",
            Box::new(|p| p["spec"]["egress"] = json!([{"toFQDNs": [{"matchPattern": "*.*.example.com"}]}])),
            "at least two labels",
        ),
        (
            "a bare wildcard",
            Box::new(|p| p["spec"]["egress"] = json!([{"toFQDNs": [{"matchPattern": "*"}]}])),
            "at least two labels",
        ),
        (
            "a wildcard as a name",
            Box::new(|p| p["spec"]["egress"] = json!([{"toFQDNs": [{"matchName": "*.example.com"}]}])),
            "at least two labels",
        ),
    ];
    for (what, mutate, rule) in cases {
        let mut p = written();
        mutate(&mut p);
        for op in ["CREATE", "UPDATE"] {
            let r = admit(HOST, op, Some(&p), Some(&written()));
            assert!(
                matches!(&r, Err(m) if m.contains(rule)),
                "{what} ({op}) was not refused by {rule:?}: {r:?}"
            );
        }
    }
}

#[test]
fn a_delete_is_held_to_the_name_and_the_owner() {
    // The operator's baseline policy: not namzu's to delete.
    let baseline = json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "baseline-egress", "namespace": "sandboxes"},
        "spec": {"endpointSelector": {}, "egress": [{"toEntities": ["world"]}]}});
    let r = admit(HOST, "DELETE", None, Some(&baseline));
    assert!(matches!(&r, Err(m) if m.contains("of namzu's")), "{r:?}");
    // A namzu-looking name whose suffix is not its owner's uid.
    let mut forged = written();
    forged["metadata"]["name"] = json!("namzu-sbx-baseline");
    let r = admit(HOST, "DELETE", None, Some(&forged));
    assert!(matches!(&r, Err(m) if m.contains("its owner's uid")), "{r:?}");
}
