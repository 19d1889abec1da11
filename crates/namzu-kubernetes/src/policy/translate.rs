//! The configuration translated to the object the cluster enforces: a
//! core `NetworkPolicy` or a `CiliumNetworkPolicy`.

use super::config::*;
use namzu_core::egress::policy::HostPattern;
use serde_json::{json, Map, Value};

/// The cluster resolver, as a core egress rule.
pub(super) fn core_dns_rule() -> Value {
    json!({
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}
        }],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    })
}

/// The cluster resolver, as a Cilium egress rule whose DNS visibility
/// admits `dns` (a `matchPattern: "*"` unless narrowed).
pub(crate) fn cilium_dns_rule(dns: Vec<Value>) -> Value {
    json!({
        "toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}],
        "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": dns}}]
    })
}

/// The except lists of `public-internet`: the fixed ranges, then the
/// caller's, each routed to the block of its own family.
fn public_except(extra: &[String]) -> (Vec<String>, Vec<String>) {
    let mut v4: Vec<String> = PUBLIC_INTERNET_EXCEPT_V4.iter().map(|s| (*s).to_owned()).collect();
    let mut v6: Vec<String> = PUBLIC_INTERNET_EXCEPT_V6.iter().map(|s| (*s).to_owned()).collect();
    for c in extra {
        match c.parse::<ipnet::IpNet>() {
            Ok(ipnet::IpNet::V4(n)) => v4.push(n.to_string()),
            Ok(ipnet::IpNet::V6(n)) => v6.push(n.to_string()),
            Err(_) => {}
        }
    }
    (v4, v6)
}

fn port_list(ports: &[u32]) -> Value {
    Value::Array(
        ports
            .iter()
            .map(|p| json!({"port": p.to_string(), "protocol": "TCP"}))
            .collect(),
    )
}

/// `toFQDNs` selectors for one allowlist entry.
fn fqdn_selectors(p: &HostPattern) -> Vec<Value> {
    match p {
        HostPattern::Exact(h) => vec![json!({"matchName": h})],
        HostPattern::Domain(d) => vec![json!({"matchName": d}), json!({"matchPattern": format!("*.{d}")})],
    }
}

/// The DNS names a narrowed allowlist may look up: each host as is and
/// under every search suffix the pod's resolver appends.
pub(crate) fn dns_selectors(hosts: &[(String, HostPattern)], d: &DnsNames, namespace: &str) -> Vec<Value> {
    let ns = d.namespace.as_deref().unwrap_or(namespace);
    let mut suffixes = vec![
        String::new(),
        format!(".{ns}.svc.{}", d.cluster_domain),
        format!(".svc.{}", d.cluster_domain),
        format!(".{}", d.cluster_domain),
    ];
    suffixes.extend(d.search_suffixes.iter().map(|s| format!(".{s}")));
    let mut out = Vec::new();
    for (_, p) in hosts {
        for s in &suffixes {
            match p {
                HostPattern::Exact(h) => out.push(json!({"matchName": format!("{h}{s}")})),
                HostPattern::Domain(dm) => {
                    out.push(json!({"matchName": format!("{dm}{s}")}));
                    out.push(json!({"matchPattern": format!("*.{dm}{s}")}));
                }
            }
        }
    }
    out
}

/// The hostname rules of a Cilium allowlist: one shared `toFQDNs` rule
/// unnarrowed; one rule per host with its ports (and SNI) when narrowed.
pub(crate) fn cilium_host_rules(hosts: &[(String, HostPattern)], n: Option<&CiliumNarrowing>) -> Vec<Value> {
    let per_host = n.is_some_and(|n| n.ports.is_some() || !n.host_ports.is_empty() || n.tls_server_names);
    if !per_host {
        let all: Vec<Value> = hosts.iter().flat_map(|(_, p)| fqdn_selectors(p)).collect();
        return vec![json!({"toFQDNs": all})];
    }
    let n = n.cloned().unwrap_or_default();
    let tls = n.tls_ports.clone().unwrap_or_else(|| vec![443]);
    hosts
        .iter()
        .map(|(entry, p)| {
            let ports = n.host_ports.get(entry).or(n.ports.as_ref()).cloned();
            let mut rule = Map::new();
            rule.insert("toFQDNs".into(), Value::Array(fqdn_selectors(p)));
            let to_ports = match (&ports, n.tls_server_names, p) {
                (_, true, HostPattern::Exact(h)) => {
                    // SNI needs a port to attach to: a host with no port of
                    // its own is limited to the TLS ports.
                    let ports = ports.clone().unwrap_or_else(|| tls.clone());
                    let (with_sni, plain): (Vec<u32>, Vec<u32>) = ports.iter().partition(|p| tls.contains(p));
                    let mut v = Vec::new();
                    if !with_sni.is_empty() {
                        v.push(json!({"ports": port_list(&with_sni), "serverNames": [h]}));
                    }
                    if !plain.is_empty() {
                        v.push(json!({"ports": port_list(&plain)}));
                    }
                    Some(v)
                }
                (Some(ports), _, _) => Some(vec![json!({"ports": port_list(ports)})]),
                (None, _, _) => None,
            };
            if let Some(tp) = to_ports {
                rule.insert("toPorts".into(), Value::Array(tp));
            }
            Value::Object(rule)
        })
        .collect()
}

/// The object this configuration asks the cluster to enforce, in
/// `namespace`. The configuration must have passed [`KubeEgressConfig::validate`].
pub fn translate(cfg: &KubeEgressConfig, namespace: &str) -> Value {
    let labels = Value::Object(
        cfg.selector_labels()
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    );
    let metadata = json!({"name": cfg.policy_name(), "namespace": namespace});
    match cfg.engine {
        Engine::Core => {
            let mut spec = json!({"podSelector": {"matchLabels": labels}, "policyTypes": ["Egress"]});
            let egress = match &cfg.policy {
                KubeEgressPolicy::DenyAll => Some(vec![core_dns_rule()]),
                KubeEgressPolicy::AllowAll => Some(vec![json!({})]),
                KubeEgressPolicy::NoNetwork => None,
                KubeEgressPolicy::PublicInternet { except_cidrs } => {
                    let (v4, v6) = public_except(except_cidrs);
                    Some(vec![
                        core_dns_rule(),
                        json!({"to": [
                            {"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
                            {"ipBlock": {"cidr": "::/0", "except": v6}}
                        ]}),
                    ])
                }
                // Refused by validate under core.
                KubeEgressPolicy::Static { .. } | KubeEgressPolicy::Resolver { .. } => Some(vec![]),
            };
            if let Some(e) = egress {
                spec["egress"] = Value::Array(e);
            }
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec})
        }
        Engine::Cilium => {
            let any_name = vec![json!({"matchPattern": "*"})];
            let mut spec = json!({"endpointSelector": {"matchLabels": labels}});
            let egress = match &cfg.policy {
                KubeEgressPolicy::DenyAll => vec![cilium_dns_rule(any_name)],
                KubeEgressPolicy::AllowAll => vec![json!({"toEntities": ["all"]})],
                KubeEgressPolicy::NoNetwork => {
                    spec["enableDefaultDeny"] = json!({"egress": true, "ingress": false});
                    vec![]
                }
                KubeEgressPolicy::PublicInternet { except_cidrs } => {
                    let (v4, v6) = public_except(except_cidrs);
                    vec![
                        cilium_dns_rule(any_name),
                        json!({"toCIDRSet": [
                            {"cidr": "0.0.0.0/0", "except": v4},
                            {"cidr": "::/0", "except": v6}
                        ]}),
                    ]
                }
                KubeEgressPolicy::Static { hosts } | KubeEgressPolicy::Resolver { hosts } => {
                    let parsed = parse_hosts(hosts).unwrap_or_default();
                    let n = cfg.narrowing.as_ref();
                    let dns = match n.and_then(|n| n.dns_names.as_ref()) {
                        Some(d) => dns_selectors(&parsed, d, namespace),
                        None => any_name,
                    };
                    let mut rules = vec![cilium_dns_rule(dns)];
                    rules.extend(cilium_host_rules(&parsed, n));
                    rules
                }
            };
            spec["egress"] = Value::Array(egress);
            json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": metadata, "spec": spec})
        }
    }
}
