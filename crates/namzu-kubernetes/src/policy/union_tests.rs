//! The union check, tested.

use super::*;
use crate::policy::{translate, CiliumNarrowing, DnsNames};
use serde_json::json;

const NS: &str = "sandboxes";

fn pod() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".to_owned(), "namzu".to_owned()),
        ("io.namzu/sandbox".to_owned(), "sb-1".to_owned()),
    ])
}

fn cfg(policy: KubeEgressPolicy) -> KubeEgressConfig {
    KubeEgressConfig::new("namzu-task", policy)
}

fn cilium(policy: KubeEgressPolicy, narrowing: Option<CiliumNarrowing>) -> KubeEgressConfig {
    KubeEgressConfig {
        engine: Engine::Cilium,
        narrowing,
        ..cfg(policy)
    }
}

/// The union of the translation and `others` (core policies, and
/// Cilium ones under that engine).
fn union(c: &KubeEgressConfig, others: Vec<Value>) -> Result<(), EgressPolicyUnionError> {
    let t = translate(c, NS);
    let (mut core, mut cnp) = (Vec::new(), Vec::new());
    for p in std::iter::once(t).chain(others) {
        if p["kind"] == "NetworkPolicy" {
            core.push(p);
        } else {
            cnp.push(p);
        }
    }
    let mut lists = vec![("NetworkPolicy".to_owned(), core)];
    if c.engine == Engine::Cilium {
        lists.push(("CiliumNetworkPolicy".to_owned(), cnp));
    }
    evaluate(c, NS, &pod(), &lists, Vec::new())
}

fn netpol(name: &str, selector: Value, egress: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": NS},
        "spec": {"podSelector": selector, "policyTypes": ["Egress"], "egress": egress}})
}

fn cnp(name: &str, egress: Value) -> Value {
    json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": {"name": name, "namespace": NS},
        "spec": {"endpointSelector": {"matchLabels": {"k8s:app.kubernetes.io/managed-by": "namzu"}}, "egress": egress}})
}

fn refusal(r: Result<(), EgressPolicyUnionError>) -> UnionRefusal {
    r.expect_err("the union passed").refusal
}

#[test]
fn every_translation_lies_inside_itself_and_enforces() {
    let hosts = vec!["api.example.com".to_owned(), ".pkg.dev".to_owned()];
    let narrowed = CiliumNarrowing {
        ports: Some(vec![443]),
        dns_names: Some(DnsNames::default()),
        ..Default::default()
    };
    let all = [
        cfg(KubeEgressPolicy::DenyAll),
        cfg(KubeEgressPolicy::AllowAll),
        cfg(KubeEgressPolicy::NoNetwork),
        cfg(KubeEgressPolicy::PublicInternet {
            except_cidrs: vec!["203.0.113.0/24".into()],
        }),
        cilium(KubeEgressPolicy::DenyAll, None),
        cilium(KubeEgressPolicy::AllowAll, None),
        cilium(KubeEgressPolicy::NoNetwork, None),
        cilium(KubeEgressPolicy::PublicInternet { except_cidrs: vec![] }, None),
        cilium(KubeEgressPolicy::Static { hosts: hosts.clone() }, None),
        cilium(KubeEgressPolicy::Static { hosts }, Some(narrowed)),
    ];
    for c in all {
        c.validate().unwrap();
        assert_eq!(union(&c, vec![]), Ok(()), "{:?} {:?}", c.engine, c.policy);
    }
}

#[test]
fn a_second_policy_that_lets_out_more_is_named() {
    let c = cfg(KubeEgressPolicy::DenyAll);
    let wide = netpol(
        "placeholder",
        json!({}),
        json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]),
    );
    let e = union(&c, vec![wide]).unwrap_err();
    assert_eq!(e.refusal, UnionRefusal::PolicyWidensEgress);
    assert_eq!(e.pod_labels, pod());
    assert_eq!(e.examined.len(), 2);
    assert_eq!(e.examined[0].verdict, Verdict::Inside);
    assert!(matches!(&e.examined[1].verdict, Verdict::Widens { rule: 0, why } if why.contains("0.0.0.0/0")));
    // A policy selecting other pods is read and let be.
    let other = netpol(
        "others",
        json!({"matchLabels": {"app": "web"}}),
        json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]),
    );
    assert_eq!(union(&c, vec![other]), Ok(()));
    // Every destination, and pods in the cluster, widen too.
    assert_eq!(
        refusal(union(&c, vec![netpol("open", json!({}), json!([{}]))])),
        UnionRefusal::PolicyWidensEgress
    );
    let pods = netpol("pods", json!({}), json!([{"to": [{"podSelector": {}}]}]));
    assert_eq!(refusal(union(&c, vec![pods])), UnionRefusal::PolicyWidensEgress);
    // The resolver on another port widens; on 53 it is inside.
    let dns = |port: u16| {
        netpol(
            "dns",
            json!({}),
            json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": [{"protocol": "TCP", "port": port}]}]),
        )
    };
    assert_eq!(union(&c, vec![dns(53)]), Ok(()));
    assert_eq!(refusal(union(&c, vec![dns(80)])), UnionRefusal::PolicyWidensEgress);
}

#[test]
fn public_internet_refuses_the_controller_default_that_leaves_cgnat_and_metadata_open() {
    let c = cfg(KubeEgressPolicy::PublicInternet { except_cidrs: vec![] });
    // agent-sandbox's default when a template omits networkPolicy.
    let controller_default = netpol(
        "namzu-task-managed",
        json!({}),
        json!([{"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
            "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]}}]}]),
    );
    let e = union(&c, vec![controller_default]).unwrap_err();
    assert!(
        matches!(&e.examined[1].verdict, Verdict::Widens { why, .. } if why.contains("100.64.0.0/10")),
        "{e}"
    );
    let one_host = netpol("one", json!({}), json!([{"to": [{"ipBlock": {"cidr": "8.8.8.8/32"}}]}]));
    assert_eq!(union(&c, vec![one_host]), Ok(()));
    let private = netpol(
        "private",
        json!({}),
        json!([{"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}]),
    );
    assert_eq!(refusal(union(&c, vec![private])), UnionRefusal::PolicyWidensEgress);
}

#[test]
fn no_network_admits_no_rule_at_all() {
    let c = cfg(KubeEgressPolicy::NoNetwork);
    let dns = translate(&cfg(KubeEgressPolicy::DenyAll), NS);
    let mut dns = dns;
    dns["metadata"]["name"] = json!("dns-only");
    assert_eq!(refusal(union(&c, vec![dns])), UnionRefusal::PolicyWidensEgress);
}

#[test]
fn without_an_enforcing_policy_the_translation_bounds_nothing() {
    let c = cfg(KubeEgressPolicy::DenyAll);
    let none = evaluate(&c, NS, &pod(), &[("NetworkPolicy".into(), vec![])], vec![]);
    assert_eq!(refusal(none), UnionRefusal::NoEnforcingPolicy);
    // An ingress-only policy selecting the pod enforces no egress.
    let ingress_only = json!({"kind": "NetworkPolicy", "metadata": {"name": "in"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
    let r = evaluate(&c, NS, &pod(), &[("NetworkPolicy".into(), vec![ingress_only])], vec![]);
    assert_eq!(refusal(r), UnionRefusal::NoEnforcingPolicy);
    // allow-all needs none.
    let open = cfg(KubeEgressPolicy::AllowAll);
    assert_eq!(
        evaluate(&open, NS, &pod(), &[("NetworkPolicy".into(), vec![])], vec![]),
        Ok(())
    );
}

#[test]
fn what_cannot_be_read_refuses_and_says_what() {
    let c = cfg(KubeEgressPolicy::DenyAll);
    let odd_peer = netpol("odd", json!({}), json!([{"to": [{"serviceAccount": "x"}]}]));
    let e = union(&c, vec![odd_peer]).unwrap_err();
    assert_eq!(e.refusal, UnionRefusal::NotEvaluable);
    let odd_selector = netpol(
        "sel",
        json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        json!([]),
    );
    assert_eq!(refusal(union(&c, vec![odd_selector])), UnionRefusal::NotEvaluable);
    let named_port = netpol(
        "named",
        json!({}),
        json!([{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "http"}]}]),
    );
    assert_eq!(refusal(union(&c, vec![named_port])), UnionRefusal::NotEvaluable);
    let t = translate(&c, NS);
    let unread = vec![UnreadSource {
        resource: "networking.k8s.io/networkpolicies".into(),
        status: Some(403),
        message: "forbidden".into(),
    }];
    let e = evaluate(&c, NS, &pod(), &[("NetworkPolicy".into(), vec![t])], unread.clone()).unwrap_err();
    assert_eq!((e.refusal, e.unread), (UnionRefusal::NotEvaluable, unread));
}

#[test]
fn cilium_allowlists_track_names_ports_and_dns_narrowing() {
    let narrowing = CiliumNarrowing {
        ports: Some(vec![443]),
        dns_names: Some(DnsNames::default()),
        ..Default::default()
    };
    let c = cilium(
        KubeEgressPolicy::Static {
            hosts: vec!["api.example.com".into(), ".pkg.dev".into()],
        },
        Some(narrowing),
    );
    let fqdn = |sel: Value, ports: Option<Vec<&str>>| {
        let mut rule = json!({"toFQDNs": [sel]});
        if let Some(ps) = ports {
            rule["toPorts"] =
                json!([{"ports": ps.iter().map(|p| json!({"port": p, "protocol": "TCP"})).collect::<Vec<_>>()}]);
        }
        cnp("extra", json!([rule]))
    };
    assert_eq!(
        union(
            &c,
            vec![fqdn(json!({"matchName": "api.example.com"}), Some(vec!["443"]))]
        ),
        Ok(())
    );
    assert_eq!(
        union(&c, vec![fqdn(json!({"matchPattern": "*.pkg.dev"}), Some(vec!["443"]))]),
        Ok(())
    );
    for (sel, ports) in [
        (json!({"matchName": "api.example.com"}), None),
        (json!({"matchName": "api.example.com"}), Some(vec!["22"])),
        (json!({"matchName": "evil.example.com"}), Some(vec!["443"])),
        (json!({"matchPattern": "*"}), Some(vec!["443"])),
        (json!({"matchPattern": "*.dev"}), Some(vec!["443"])),
    ] {
        assert_eq!(
            refusal(union(&c, vec![fqdn(sel.clone(), ports.clone())])),
            UnionRefusal::PolicyWidensEgress,
            "{sel} {ports:?}"
        );
    }
    // A plain L4 rule to the resolver defeats named lookups.
    let plain_dns = translate(&cfg(KubeEgressPolicy::DenyAll), NS);
    let e = union(&c, vec![plain_dns]).unwrap_err();
    assert!(
        matches!(&e.examined[0].verdict, Verdict::Widens { why, .. } if why.contains("restricts no name")),
        "{e}"
    );
    // World entities widen anything but allow-all.
    assert_eq!(
        refusal(union(&c, vec![cnp("world", json!([{"toEntities": ["world"]}]))])),
        UnionRefusal::PolicyWidensEgress
    );
}
