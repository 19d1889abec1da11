//! The translation, configuration and applied-object checks, tested.

use std::collections::BTreeMap;

use serde_json::json;

use super::translate::core_dns_rule;
use super::*;

fn cfg(policy: KubeEgressPolicy) -> KubeEgressConfig {
    KubeEgressConfig::new("namzu-task", policy)
}

#[test]
fn deny_all_and_allow_all_are_pinned() {
    assert_eq!(
        translate(&cfg(KubeEgressPolicy::DenyAll), "sandboxes"),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "namzu-task-egress", "namespace": "sandboxes"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "namzu"}},
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}
                    }],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
                }]
            }
        })
    );
    assert_eq!(
        translate(&cfg(KubeEgressPolicy::AllowAll), "sandboxes"),
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "namzu-task-egress", "namespace": "sandboxes"},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "namzu"}},
                "policyTypes": ["Egress"],
                "egress": [{}]
            }
        })
    );
}

#[test]
fn no_network_has_no_rule_and_public_internet_routes_extra_cidrs_by_family() {
    let nn = translate(&cfg(KubeEgressPolicy::NoNetwork), "ns");
    assert_eq!(nn["spec"]["policyTypes"], json!(["Egress"]));
    assert!(nn["spec"].get("egress").is_none(), "{nn}");
    let pi = translate(
        &cfg(KubeEgressPolicy::PublicInternet {
            except_cidrs: vec!["203.0.113.0/24".into(), "2001:db8::/32".into()],
        }),
        "ns",
    );
    let to = &pi["spec"]["egress"][1]["to"];
    assert_eq!(to[0]["ipBlock"]["cidr"], "0.0.0.0/0");
    let v4: Vec<&str> = to[0]["ipBlock"]["except"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        v4,
        [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "127.0.0.0/8",
            "168.63.129.16/32",
            "203.0.113.0/24"
        ]
    );
    assert_eq!(to[1]["ipBlock"]["cidr"], "::/0");
    assert_eq!(
        to[1]["ipBlock"]["except"],
        json!(["fc00::/7", "fe80::/10", "::1/128", "2001:db8::/32"])
    );
    assert_eq!(pi["spec"]["egress"][0], core_dns_rule());
    let bad = cfg(KubeEgressPolicy::PublicInternet {
        except_cidrs: vec!["10.0.0.1".into()],
    });
    assert_eq!(
        bad.validate(),
        Err(EgressConfigError::NotACidr {
            entry: "10.0.0.1".into()
        })
    );
}

#[test]
fn hostname_allowlists_need_cilium_and_translate_to_fqdn_rules() {
    let hosts = vec!["api.example.com".into(), ".pkg.dev".into()];
    let core = cfg(KubeEgressPolicy::Static { hosts: hosts.clone() });
    assert_eq!(
        core.validate(),
        Err(EgressConfigError::HostnamesNeedCilium { policy: "static" })
    );
    let mut c = cfg(KubeEgressPolicy::Resolver { hosts });
    c.engine = Engine::Cilium;
    c.validate().unwrap();
    let t = translate(&c, "ns");
    assert_eq!(t["kind"], "CiliumNetworkPolicy");
    assert_eq!(
        t["spec"]["egress"][1],
        json!({"toFQDNs": [
            {"matchName": "api.example.com"},
            {"matchName": "pkg.dev"},
            {"matchPattern": "*.pkg.dev"}
        ]})
    );
    assert_eq!(
        t["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"],
        json!([{"matchPattern": "*"}])
    );
    let mut bad = c.clone();
    bad.policy = KubeEgressPolicy::Static {
        hosts: vec!["https://api.example.com/".into()],
    };
    assert!(matches!(bad.validate(), Err(EgressConfigError::BadHost { .. })));
}

#[test]
fn narrowing_is_refused_where_it_means_nothing_and_shapes_rules_where_it_does() {
    let narrowing = CiliumNarrowing {
        ports: Some(vec![443]),
        ..Default::default()
    };
    let mut core = cfg(KubeEgressPolicy::DenyAll);
    core.narrowing = Some(narrowing.clone());
    assert!(matches!(
        core.validate(),
        Err(EgressConfigError::NarrowingUnsupported { field: "ports", .. })
    ));
    core.engine = Engine::Cilium;
    assert!(matches!(
        core.validate(),
        Err(EgressConfigError::NarrowingUnsupported { field: "ports", reason }) if reason.contains("deny-all")
    ));
    let mut c = cfg(KubeEgressPolicy::Static {
        hosts: vec!["api.example.com".into(), "git.example.com".into()],
    });
    c.engine = Engine::Cilium;
    for (ports, err) in [(vec![], "empty"), (vec![0], "outside"), (vec![70_000], "outside")] {
        c.narrowing = Some(CiliumNarrowing {
            ports: Some(ports),
            ..Default::default()
        });
        assert!(c.validate().unwrap_err().to_string().contains(err));
    }
    c.narrowing = Some(CiliumNarrowing {
        ports: Some(vec![443]),
        host_ports: BTreeMap::from([("git.example.com".into(), vec![22, 443])]),
        tls_server_names: true,
        dns_names: Some(DnsNames::default()),
        ..Default::default()
    });
    c.validate().unwrap();
    let t = translate(&c, "sandboxes");
    let e = &t["spec"]["egress"];
    assert_eq!(
        e[1],
        json!({"toFQDNs": [{"matchName": "api.example.com"}],
            "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}], "serverNames": ["api.example.com"]}]})
    );
    assert_eq!(
        e[2],
        json!({"toFQDNs": [{"matchName": "git.example.com"}],
            "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}], "serverNames": ["git.example.com"]},
                        {"ports": [{"port": "22", "protocol": "TCP"}]}]})
    );
    let dns = e[0]["toPorts"][0]["rules"]["dns"].as_array().unwrap();
    assert!(dns.contains(&json!({"matchName": "api.example.com"})));
    assert!(dns.contains(&json!({"matchName": "api.example.com.sandboxes.svc.cluster.local"})));
    assert!(!dns.contains(&json!({"matchPattern": "*"})));
    // SNI needs exact names.
    c.policy = KubeEgressPolicy::Static {
        hosts: vec![".example.com".into()],
    };
    c.narrowing = Some(CiliumNarrowing {
        tls_server_names: true,
        ..Default::default()
    });
    assert_eq!(
        c.validate(),
        Err(EgressConfigError::TlsServerNameOnDomain {
            entry: ".example.com".into()
        })
    );
}

#[test]
fn a_profile_names_the_policy_and_joins_its_selector() {
    let mut c = cfg(KubeEgressPolicy::DenyAll);
    c.profile = Some("builders".into());
    c.validate().unwrap();
    let t = translate(&c, "ns");
    assert_eq!(t["metadata"]["name"], "namzu-task-builders-egress");
    assert_eq!(
        t["spec"]["podSelector"]["matchLabels"],
        json!({"app.kubernetes.io/managed-by": "namzu", "namzu.sandbox.users.io/egress-profile": "builders"})
    );
    c.profile = Some("Not a label!".into());
    assert!(matches!(
        c.validate(),
        Err(EgressConfigError::BadField { field: "profile", .. })
    ));
}

#[test]
fn pod_label_keys_live_under_one_domain_and_never_collide() {
    use crate::policy::per_sandbox::PerSandboxEgress;
    let mut c = cfg(KubeEgressPolicy::DenyAll);
    c.engine = Engine::Cilium;
    c.profile = Some("builders".into());
    c.per_sandbox = Some(PerSandboxEgress::default());
    c.validate().unwrap();
    // A key outside the domain: the controller would refuse the claim.
    let mut outside = c.clone();
    outside.profile_label_key = "io.namzu/egress-profile".into();
    let e = outside.validate().unwrap_err();
    assert!(
        matches!(&e, EgressConfigError::BadField { field: "profile_label_key", reason } if reason.contains("allowed-label-domains")),
        "{e}"
    );
    // Moving the domain moves both keys; a subdomain of it is inside.
    let moved = c.clone().with_pod_label_domain("labels.example.com");
    assert_eq!(moved.profile_label_key, "labels.example.com/egress-profile");
    assert_eq!(
        moved.per_sandbox.as_ref().unwrap().label_key,
        "labels.example.com/egress-sandbox"
    );
    moved.validate().unwrap();
    let mut sub = moved.clone();
    sub.profile_label_key = "team.labels.example.com/profile".into();
    sub.validate().unwrap();
    // The profile's key may not be the per-sandbox one, nor namzu's own.
    let mut clash = moved.clone();
    clash.profile_label_key = "labels.example.com/egress-sandbox".into();
    assert!(matches!(
        clash.validate(),
        Err(EgressConfigError::BadField {
            field: "profile_label_key",
            ..
        })
    ));
    let mut own = c.clone().with_pod_label_domain("io.namzu");
    own.profile_label_key = crate::labels::SANDBOX_LABEL.into();
    assert!(matches!(
        own.validate(),
        Err(EgressConfigError::BadField {
            field: "profile_label_key",
            ..
        })
    ));
    // A domain that is not a DNS subdomain is refused by its field.
    let bad = c.clone().with_pod_label_domain("Not_A_Domain");
    assert!(matches!(
        bad.validate(),
        Err(EgressConfigError::BadField {
            field: "pod_label_domain",
            ..
        })
    ));
    // A policy name past 253 characters is no object name.
    let mut long = c.clone();
    long.template = "t".repeat(250);
    assert!(matches!(
        long.validate(),
        Err(EgressConfigError::BadField { field: "template", .. })
    ));
}

#[test]
fn the_first_difference_is_named_by_pointer() {
    let a = json!({"egress": [{"ports": [{"port": 53}]}], "policyTypes": ["Egress"]});
    let b = json!({"egress": [{"ports": [{"port": 54}]}], "policyTypes": ["Egress"]});
    assert_eq!(
        first_difference(&a, &b, "/spec"),
        Some(("/spec/egress/0/ports/0/port".into(), "53".into(), "54".into()))
    );
    assert_eq!(first_difference(&a, &a, "/spec"), None);
    let shorter = json!({"egress": [], "policyTypes": ["Egress"]});
    assert_eq!(first_difference(&a, &shorter, "/spec").unwrap().0, "/spec/egress");
}
