//! Egress on a cluster: the backend's egress configuration translated into
//! the object the cluster enforces — a core `NetworkPolicy` (engine `core`)
//! or a `CiliumNetworkPolicy` (engine `cilium`) — and the check that the
//! named object is applied exactly as translated.
//!
//! What each engine can say: hostname allowlists exist only under Cilium
//! (core NetworkPolicy has no notion of a name); narrowing (ports, TLS
//! server names, DNS names) only means something next to a Cilium hostname
//! allowlist. Everything else is refused at construction, each refusal a
//! variant of [`EgressConfigError`] naming the field or entry.
//!
//! `deny-all` and `allow-all` translate to fixed shapes pinned by deep
//! equality in the tests: verification of an applied object is an exact
//! match, so changing either would fail every create on clusters that
//! applied the old one.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::api::{Api, ApiError, Resource};
use super::build::{MANAGED_BY, MANAGED_BY_LABEL};
use namzu_core::egress::policy::HostPattern;

/// The label an egress profile is written under by default.
pub const DEFAULT_PROFILE_LABEL_KEY: &str = "io.namzu/egress-profile";

/// IPv4 ranges `public-internet` never reaches: private, CGNAT,
/// link-local (instance metadata), loopback, and Azure's platform endpoint.
pub const PUBLIC_INTERNET_EXCEPT_V4: [&str; 7] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
    "168.63.129.16/32",
];
/// IPv6 ranges `public-internet` never reaches: ULA, link-local, loopback.
pub const PUBLIC_INTERNET_EXCEPT_V6: [&str; 3] = ["fc00::/7", "fe80::/10", "::1/128"];

/// Which policy object the cluster enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// `networking.k8s.io/v1` NetworkPolicy.
    #[default]
    Core,
    /// `cilium.io/v2` CiliumNetworkPolicy.
    Cilium,
}

/// What may leave a task sandbox's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeEgressPolicy {
    /// Names resolve through the cluster resolver; nothing else leaves.
    DenyAll,
    AllowAll,
    /// Nothing leaves, the cluster resolver included.
    NoNetwork,
    /// The internet, never the private, CGNAT, link-local, loopback or
    /// metadata ranges, nor `except_cidrs`.
    PublicInternet {
        except_cidrs: Vec<String>,
    },
    /// A fixed hostname allowlist (`api.example.com`, `.example.com`).
    Static {
        hosts: Vec<String>,
    },
    /// The names a host-side resolver admits, enumerated for the cluster.
    Resolver {
        hosts: Vec<String>,
    },
}

impl KubeEgressPolicy {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::DenyAll => "deny-all",
            Self::AllowAll => "allow-all",
            Self::NoNetwork => "no-network",
            Self::PublicInternet { .. } => "public-internet",
            Self::Static { .. } => "static",
            Self::Resolver { .. } => "resolver",
        }
    }

    fn hosts(&self) -> Option<&[String]> {
        match self {
            Self::Static { hosts } | Self::Resolver { hosts } => Some(hosts),
            _ => None,
        }
    }
}

/// Cilium-only narrowing of a hostname allowlist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CiliumNarrowing {
    /// Ports every host is limited to (`None`: no limit).
    pub ports: Option<Vec<u32>>,
    /// Per-host ports, overriding `ports`.
    pub host_ports: BTreeMap<String, Vec<u32>>,
    /// SNI enforcement: each host's TLS ports carry `serverNames: [host]`.
    pub tls_server_names: bool,
    /// The TLS ports (default `[443]`).
    pub tls_ports: Option<Vec<u32>>,
    /// Lookups limited to the allowed names (and their cluster search
    /// variants) instead of any name.
    pub dns_names: Option<DnsNames>,
}

/// The search suffixes a pod's resolver appends, for exact DNS names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsNames {
    /// The pod's namespace (default: the backend's).
    pub namespace: Option<String>,
    pub cluster_domain: String,
    pub search_suffixes: Vec<String>,
}

impl Default for DnsNames {
    fn default() -> Self {
        Self {
            namespace: None,
            cluster_domain: "cluster.local".into(),
            search_suffixes: Vec::new(),
        }
    }
}

/// How the applied policy is verified before a sandbox is handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verification {
    /// The named object, then every policy selecting the pod.
    #[default]
    Union,
    /// The named object only, on purpose.
    NamedObjectOnly,
}

/// The backend's egress configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeEgressConfig {
    pub policy: KubeEgressPolicy,
    pub engine: Engine,
    pub narrowing: Option<CiliumNarrowing>,
    /// The template the policy belongs to: its name is
    /// `<template>-egress`, or `<template>-<profile>-egress`.
    pub template: String,
    /// A profile: its label goes on the claim's pod metadata and into the
    /// policy's selector.
    pub profile: Option<String>,
    pub profile_label_key: String,
    pub verify: Verification,
    /// A CiliumNetworkPolicy per sandbox, written by
    /// `Sandbox::set_network_policy` (see [`super::per_sandbox`]).
    pub per_sandbox: Option<super::per_sandbox::PerSandboxEgress>,
}

impl KubeEgressConfig {
    pub fn new(template: &str, policy: KubeEgressPolicy) -> Self {
        Self {
            policy,
            engine: Engine::Core,
            narrowing: None,
            template: template.into(),
            profile: None,
            profile_label_key: DEFAULT_PROFILE_LABEL_KEY.into(),
            verify: Verification::Union,
            per_sandbox: None,
        }
    }
}

/// A configuration refused at construction, naming what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressConfigError {
    #[error(
        "egress policy {policy} is a hostname allowlist: core NetworkPolicy has no notion of a name; use engine cilium"
    )]
    HostnamesNeedCilium { policy: &'static str },
    #[error("egress narrowing ({field}) needs a hostname allowlist enforced by Cilium: {reason}")]
    NarrowingUnsupported { field: &'static str, reason: String },
    #[error("egress {field} is an empty port list: omit it for no limit")]
    EmptyPortList { field: String },
    #[error("egress {field}: port {port} is outside 1-65535")]
    PortOutOfRange { field: String, port: u32 },
    #[error("egress host {entry:?}: TLS server names need exact hosts; a .domain entry cannot carry one")]
    TlsServerNameOnDomain { entry: String },
    #[error("egress except_cidrs entry {entry:?} is not a CIDR")]
    NotACidr { entry: String },
    #[error("egress host {entry:?}: {reason}")]
    BadHost { entry: String, reason: String },
    #[error("egress {field}: {reason}")]
    BadField { field: &'static str, reason: String },
}

pub(crate) fn check_ports(field: String, ports: &[u32]) -> Result<Vec<u16>, EgressConfigError> {
    if ports.is_empty() {
        return Err(EgressConfigError::EmptyPortList { field });
    }
    ports
        .iter()
        .map(|&p| {
            u16::try_from(p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| EgressConfigError::PortOutOfRange {
                    field: field.clone(),
                    port: p,
                })
        })
        .collect()
}

/// The hosts of an allowlist, parsed (canonical, punycode).
pub(crate) fn parse_hosts(hosts: &[String]) -> Result<Vec<(String, HostPattern)>, EgressConfigError> {
    hosts
        .iter()
        .map(|h| {
            HostPattern::parse(h)
                .map(|p| (h.clone(), p))
                .map_err(|e| EgressConfigError::BadHost {
                    entry: h.clone(),
                    reason: e.to_string(),
                })
        })
        .collect()
}

fn label_ok(field: &'static str, key: &str, value: &str) -> Result<(), EgressConfigError> {
    super::build::check_label(key, value).map_err(|reason| EgressConfigError::BadField { field, reason })
}

impl KubeEgressConfig {
    /// Refuses, by field or entry, what the engine cannot enforce.
    pub fn validate(&self) -> Result<(), EgressConfigError> {
        if self.template.is_empty() {
            return Err(EgressConfigError::BadField {
                field: "template",
                reason: "the policy is named after its template; name it".into(),
            });
        }
        if let Some(p) = &self.profile {
            label_ok("profile", &self.profile_label_key, p)?;
        }
        if let Some(ps) = &self.per_sandbox {
            if self.engine != Engine::Cilium {
                return Err(EgressConfigError::BadField {
                    field: "per_sandbox",
                    reason: "a per-sandbox policy is a CiliumNetworkPolicy; the engine must be cilium".into(),
                });
            }
            label_ok("per_sandbox.label_key", &ps.label_key, "sb-0")?;
            ps.validate()?;
        }
        match &self.policy {
            KubeEgressPolicy::PublicInternet { except_cidrs } => {
                for c in except_cidrs {
                    c.parse::<ipnet::IpNet>()
                        .map_err(|_| EgressConfigError::NotACidr { entry: c.clone() })?;
                }
            }
            KubeEgressPolicy::Static { hosts } | KubeEgressPolicy::Resolver { hosts } => {
                if self.engine == Engine::Core {
                    return Err(EgressConfigError::HostnamesNeedCilium {
                        policy: self.policy.kind(),
                    });
                }
                parse_hosts(hosts)?;
            }
            _ => {}
        }
        let Some(n) = &self.narrowing else { return Ok(()) };
        let field = if n.ports.is_some() {
            "ports"
        } else if !n.host_ports.is_empty() {
            "host_ports"
        } else if n.tls_server_names || n.tls_ports.is_some() {
            "tls_server_names"
        } else if n.dns_names.is_some() {
            "dns_names"
        } else {
            return Ok(());
        };
        if self.engine == Engine::Core {
            return Err(EgressConfigError::NarrowingUnsupported {
                field,
                reason: "the engine is core".into(),
            });
        }
        let Some(hosts) = self.policy.hosts() else {
            return Err(EgressConfigError::NarrowingUnsupported {
                field,
                reason: format!("the policy is {}", self.policy.kind()),
            });
        };
        if let Some(p) = &n.ports {
            check_ports("narrowing.ports".into(), p)?;
        }
        if let Some(p) = &n.tls_ports {
            check_ports("narrowing.tls_ports".into(), p)?;
        }
        let parsed = parse_hosts(hosts)?;
        for (host, ports) in &n.host_ports {
            check_ports(format!("narrowing.host_ports[{host}]"), ports)?;
            if !hosts.contains(host) {
                return Err(EgressConfigError::BadHost {
                    entry: host.clone(),
                    reason: "host_ports names a host the allowlist does not".into(),
                });
            }
        }
        if n.tls_server_names {
            if let Some((entry, _)) = parsed.iter().find(|(_, p)| matches!(p, HostPattern::Domain(_))) {
                return Err(EgressConfigError::TlsServerNameOnDomain { entry: entry.clone() });
            }
        }
        if let Some(d) = &n.dns_names {
            if d.cluster_domain.is_empty() || d.search_suffixes.iter().any(String::is_empty) {
                return Err(EgressConfigError::BadField {
                    field: "narrowing.dns_names",
                    reason: "an empty cluster domain or search suffix".into(),
                });
            }
        }
        Ok(())
    }

    /// The policy object's name.
    pub fn policy_name(&self) -> String {
        match &self.profile {
            Some(p) => format!("{}-{p}-egress", self.template),
            None => format!("{}-egress", self.template),
        }
    }

    /// The pod labels the policy selects.
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())]);
        if let Some(p) = &self.profile {
            l.insert(self.profile_label_key.clone(), p.clone());
        }
        l
    }

    /// The policy resource under this engine.
    pub fn resource(&self, namespace: &str) -> Resource {
        policy_resource(self.engine, namespace)
    }
}

/// The policy resource of `engine` in `namespace`.
pub fn policy_resource(engine: Engine, namespace: &str) -> Resource {
    let (group, version, plural) = match engine {
        Engine::Core => ("networking.k8s.io", "v1", "networkpolicies"),
        Engine::Cilium => ("cilium.io", "v2", "ciliumnetworkpolicies"),
    };
    Resource {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        namespace: namespace.into(),
    }
}

/// The cluster resolver, as a core egress rule.
fn core_dns_rule() -> Value {
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

/// Why the named policy does not stand as translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressPolicyError {
    #[error("egress policy {kind} {namespace}/{name} is not applied; apply the translation of the backend's egress configuration")]
    NotApplied {
        kind: String,
        namespace: String,
        name: String,
    },
    #[error("egress policy {kind} {namespace}/{name} differs from the translation at {path}: expected {expected}, found {found}")]
    Mismatch {
        kind: String,
        namespace: String,
        name: String,
        /// The first difference, as a JSON pointer into `spec`.
        path: String,
        expected: String,
        found: String,
    },
}

/// The first place `found` differs from `want`, as (pointer, want, found).
pub fn first_difference(want: &Value, found: &Value, at: &str) -> Option<(String, String, String)> {
    match (want, found) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                first_difference(x, y, &format!("{at}/{k}"))
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{at}/{i}"))),
        _ if want == found => None,
        _ => Some((at.to_owned(), want.to_string(), found.to_string())),
    }
}

/// Reads the named policy and requires its `spec` to equal the
/// translation's. A 404 is [`EgressPolicyError::NotApplied`]; any other
/// API failure travels as itself.
pub async fn verify_named(api: &Api, cfg: &KubeEgressConfig, namespace: &str) -> namzu_core::Result<()> {
    let want = translate(cfg, namespace);
    let r = cfg.resource(namespace);
    let kind = want["kind"].as_str().unwrap_or_default().to_owned();
    let name = cfg.policy_name();
    let found = match api.get(&r, &name).await {
        Ok(v) => v,
        Err(ApiError::AlreadyGone { .. }) => {
            return Err(EgressPolicyError::NotApplied {
                kind,
                namespace: namespace.into(),
                name,
            }
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    match first_difference(&want["spec"], &found["spec"], "/spec") {
        None => Ok(()),
        Some((path, expected, found)) => Err(EgressPolicyError::Mismatch {
            kind,
            namespace: namespace.into(),
            name,
            path,
            expected,
            found,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
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
            json!({"app.kubernetes.io/managed-by": "namzu", "io.namzu/egress-profile": "builders"})
        );
        c.profile = Some("Not a label!".into());
        assert!(matches!(
            c.validate(),
            Err(EgressConfigError::BadField { field: "profile", .. })
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
}
