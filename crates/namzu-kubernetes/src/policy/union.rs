//! The UNION check. The API server unions every policy that selects a pod:
//! traffic leaves if ANY of them allows it. So checking the one named object
//! proves only that it is not the problem. This module lists every policy in
//! the namespace (and Cilium's CRD under engine `cilium`), evaluates each
//! selector against the pod's real labels, and checks every egress rule of
//! every selecting policy against what the translation allows.
//!
//! Subset is decided conservatively. A rule passes only when the check can
//! show it lies inside the translation; anything it cannot place refuses.
//! The refusals, each a [`UnionRefusal`]:
//! * `PolicyWidensEgress`: a selecting policy allows a destination the
//!   translation does not.
//! * `NoEnforcingPolicy`: nothing selecting the pod puts it in egress
//!   default-deny, so the translation bounds nothing. Skipped under
//!   allow-all.
//! * `NotEvaluable`: a collection could not be read, or a selector, peer,
//!   port or rule has a shape this cannot read.
//!
//! The refusal carries the pod's labels, every policy examined with its
//! verdict, and the collections it could not read.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde_json::Value;

use super::selectors::selects;
use super::{
    policy_resource, Engine, KubeEgressConfig, KubeEgressPolicy, PUBLIC_INTERNET_EXCEPT_V4, PUBLIC_INTERNET_EXCEPT_V6,
};
use crate::api::{Api, ApiError, Resource};
use namzu_core::egress::policy::HostPattern;

/// Which refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnionRefusal {
    /// A selecting policy allows a destination the translation does not.
    PolicyWidensEgress,
    /// Nothing selecting the pod puts it in egress default-deny.
    NoEnforcingPolicy,
    /// A collection or a policy could not be read.
    NotEvaluable,
}

/// One policy's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its selector does not select the pod.
    NotSelecting,
    /// It selects the pod, and every rule lies inside the translation.
    Inside,
    /// Rule `rule` (its index in `egress`) lets out more: `why`.
    Widens {
        /// The rule, by index.
        rule: usize,
        /// Why, for humans.
        why: String,
    },
    /// Some part of it could not be read: `why`.
    NotEvaluable {
        /// Why, for humans.
        why: String,
    },
}

/// A policy the check read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExaminedPolicy {
    /// What kind of entry.
    pub kind: String,
    /// The entry name.
    pub name: String,
    /// Whether it puts the pod in egress default-deny.
    pub enforces: bool,
    /// What the check made of it.
    pub verdict: Verdict,
}

/// A collection the check could not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadSource {
    /// The collection, as `group/plural`.
    pub resource: String,
    /// The HTTP status, if the server answered (403 and 404 are
    /// reported as such).
    pub status: Option<u16>,
    /// What went wrong, for humans.
    pub message: String,
}

/// A refused union.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "egress union check refused ({refusal:?}) for a pod labelled {pod_labels:?}: {}",
    describe(examined, unread)
)]
pub struct EgressPolicyUnionError {
    /// Why it refused.
    pub refusal: UnionRefusal,
    /// The pod's labels, as evaluated.
    pub pod_labels: BTreeMap<String, String>,
    /// Every policy examined.
    pub examined: Vec<ExaminedPolicy>,
    /// Collections that could not be read.
    pub unread: Vec<UnreadSource>,
}

fn describe(examined: &[ExaminedPolicy], unread: &[UnreadSource]) -> String {
    let mut parts: Vec<String> = examined
        .iter()
        .map(|e| format!("{} {}: {:?}", e.kind, e.name, e.verdict))
        .collect();
    parts.extend(unread.iter().map(|u| {
        format!(
            "{} unread ({}): {}",
            u.resource,
            u.status.map_or("no answer".into(), |s| s.to_string()),
            u.message
        )
    }));
    parts.join("; ")
}

/// What the translation lets out.
struct Allowance {
    all: bool,
    /// The cluster resolver, on port 53.
    dns: bool,
    /// Narrowed lookups: the DNS selectors a resolver rule may carry.
    dns_names: Option<Vec<Value>>,
    /// `public-internet`: what may not be reached.
    forbidden: Option<Vec<IpNet>>,
    /// A Cilium allowlist: each host and its port limit.
    hosts: Vec<(HostPattern, Option<Vec<u16>>)>,
}

fn allowance(cfg: &KubeEgressConfig, namespace: &str) -> Allowance {
    let mut a = Allowance {
        all: false,
        dns: false,
        dns_names: None,
        forbidden: None,
        hosts: Vec::new(),
    };
    match &cfg.policy {
        KubeEgressPolicy::AllowAll => a.all = true,
        KubeEgressPolicy::NoNetwork => {}
        KubeEgressPolicy::DenyAll => a.dns = true,
        KubeEgressPolicy::PublicInternet { except_cidrs } => {
            a.dns = true;
            let fixed = PUBLIC_INTERNET_EXCEPT_V4.iter().chain(PUBLIC_INTERNET_EXCEPT_V6.iter());
            a.forbidden = Some(
                fixed
                    .map(|s| (*s).to_owned())
                    .chain(except_cidrs.iter().cloned())
                    .filter_map(|c| c.parse().ok())
                    .collect(),
            );
        }
        KubeEgressPolicy::Static { hosts } | KubeEgressPolicy::Resolver { hosts } => {
            a.dns = true;
            let n = cfg.narrowing.clone().unwrap_or_default();
            // The translation's own DNS rule says which names resolve.
            let t = super::translate(cfg, namespace);
            if n.dns_names.is_some() {
                a.dns_names = t["spec"]["egress"][0]["toPorts"][0]["rules"]["dns"].as_array().cloned();
            }
            for h in hosts {
                let Ok(p) = HostPattern::parse(h) else { continue };
                let ports = n
                    .host_ports
                    .get(h)
                    .or(n.ports.as_ref())
                    .map(|ps| ps.iter().filter_map(|p| u16::try_from(*p).ok()).collect::<Vec<_>>());
                let ports = if n.tls_server_names && ports.is_none() {
                    Some(
                        n.tls_ports
                            .clone()
                            .unwrap_or_else(|| vec![443])
                            .iter()
                            .filter_map(|p| u16::try_from(*p).ok())
                            .collect(),
                    )
                } else {
                    ports
                };
                a.hosts.push((p, ports));
            }
        }
    }
    a
}

/// `Ok(None)`: inside; `Ok(Some(why))`: wider; `Err(why)`: unreadable.
type RuleResult = Result<Option<String>, String>;
/// One engine's rule check.
type RuleCheck = fn(&Value, &Allowance) -> RuleResult;

/// Whether an address block (minus its excepts) stays clear of what
/// `public-internet` forbids. `Ok(None)` inside, `Ok(Some(why))` wider.
fn block_inside(a: &Allowance, cidr: &str, except: &[String]) -> RuleResult {
    let net: IpNet = cidr.parse().map_err(|_| format!("a CIDR this cannot read: {cidr:?}"))?;
    let except: Vec<IpNet> = except
        .iter()
        .map(|e| {
            e.parse()
                .map_err(|_| format!("an except entry this cannot read: {e:?}"))
        })
        .collect::<Result<_, _>>()?;
    let Some(forbidden) = &a.forbidden else {
        return Ok(Some(format!("{cidr}: the translation allows no address range")));
    };
    for f in forbidden {
        let overlaps = net.contains(&f.network()) || f.contains(&net.network());
        if overlaps && !except.iter().any(|e| e.contains(f)) {
            return Ok(Some(format!("{cidr} reaches {f}, which the translation keeps out")));
        }
    }
    Ok(None)
}

/// The ports of a core rule: `None` every port; else (protocol, port).
fn core_ports(rule: &Value) -> Result<Option<Vec<(String, u16)>>, String> {
    let Some(ports) = rule.get("ports") else {
        return Ok(None);
    };
    let Some(list) = ports.as_array() else {
        return Err(format!("ports is not a list: {ports}"));
    };
    if list.is_empty() {
        return Ok(None);
    }
    list.iter()
        .map(|p| {
            if p.get("endPort").is_some() {
                return Err(format!("a port range this does not place: {p}"));
            }
            let proto = p["protocol"].as_str().unwrap_or("TCP").to_owned();
            let port = p["port"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| format!("a port this cannot read (named or absent): {p}"))?;
            Ok((proto, port))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Whether a peer is exactly the cluster resolver (core shape).
fn is_core_dns_peer(peer: &Value) -> bool {
    peer.as_object().is_some_and(|o| o.len() == 2)
        && peer["namespaceSelector"]
            == serde_json::json!({"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}})
        && peer["podSelector"] == serde_json::json!({"matchLabels": {"k8s-app": "kube-dns"}})
}

fn dns_ports_only(ports: &Option<Vec<(String, u16)>>) -> bool {
    ports.as_ref().is_some_and(|ps| {
        ps.iter()
            .all(|(proto, port)| *port == 53 && (proto == "UDP" || proto == "TCP"))
    })
}

/// A core NetworkPolicy egress rule against the allowance.
fn core_rule(rule: &Value, a: &Allowance) -> RuleResult {
    let Some(obj) = rule.as_object() else {
        return Err(format!("a rule that is not an object: {rule}"));
    };
    if let Some(k) = obj.keys().find(|k| *k != "to" && *k != "ports") {
        return Err(format!("a rule field this cannot read: {k}"));
    }
    let ports = core_ports(rule)?;
    if a.all {
        return Ok(None);
    }
    let peers = match rule.get("to") {
        None => return Ok(Some("no `to`: every destination".into())),
        Some(Value::Array(p)) if p.is_empty() => return Ok(Some("an empty `to`: every destination".into())),
        Some(Value::Array(p)) => p,
        Some(other) => return Err(format!("`to` is not a list: {other}")),
    };
    for peer in peers {
        if let Some(b) = peer.get("ipBlock") {
            let cidr = b["cidr"]
                .as_str()
                .ok_or_else(|| format!("an ipBlock without a cidr: {b}"))?;
            let except: Vec<String> = b["except"]
                .as_array()
                .map(|e| e.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default();
            if let Some(why) = block_inside(a, cidr, &except)? {
                return Ok(Some(why));
            }
        } else if is_core_dns_peer(peer) {
            if !a.dns {
                return Ok(Some("the cluster resolver: the translation lets no lookup out".into()));
            }
            if !dns_ports_only(&ports) {
                return Ok(Some("the cluster resolver on ports other than 53".into()));
            }
            if a.dns_names.is_some() {
                return Ok(Some(
                    "a plain L4 rule to the resolver: it restricts no name, and the narrowing allows only named lookups".into(),
                ));
            }
        } else if peer.get("namespaceSelector").is_some() || peer.get("podSelector").is_some() {
            return Ok(Some(format!("pods in the cluster: {peer}")));
        } else {
            return Err(format!("a peer this cannot read: {peer}"));
        }
    }
    Ok(None)
}

/// The ports of a Cilium rule's `toPorts`: `None` every port.
fn cilium_ports(rule: &Value) -> Result<Option<Vec<u16>>, String> {
    let Some(tp) = rule.get("toPorts") else { return Ok(None) };
    let list = tp.as_array().ok_or_else(|| format!("toPorts is not a list: {tp}"))?;
    let mut out = Vec::new();
    for p in list {
        for port in p["ports"]
            .as_array()
            .ok_or_else(|| format!("toPorts entry without ports: {p}"))?
        {
            if port.get("endPort").is_some() {
                return Err(format!("a port range this does not place: {port}"));
            }
            let n = match &port["port"] {
                Value::String(s) => s.parse::<u16>().ok(),
                Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
                _ => None,
            }
            .ok_or_else(|| format!("a port this cannot read: {port}"))?;
            if n == 0 {
                return Ok(None);
            }
            out.push(n);
        }
    }
    Ok(Some(out))
}

fn is_cilium_dns_endpoint(sel: &Value) -> bool {
    let Some(ml) = sel["matchLabels"].as_object() else {
        return false;
    };
    let get = |k: &str| {
        ml.get(&format!("k8s:{k}"))
            .or_else(|| ml.get(k))
            .and_then(Value::as_str)
    };
    sel.as_object().is_some_and(|o| o.len() == 1)
        && ml.len() == 2
        && get("io.kubernetes.pod.namespace") == Some("kube-system")
        && get("k8s-app") == Some("kube-dns")
}

/// Whether a `toFQDNs` selector lies inside the allowlist, and the port
/// limit of the entry it falls under.
fn fqdn_inside(sel: &Value, a: &Allowance) -> Result<Option<Option<Vec<u16>>>, String> {
    let under = |name: &str| {
        a.hosts.iter().find(|(p, _)| match p {
            HostPattern::Exact(h) => h == name,
            HostPattern::Domain(d) => name == d || name.ends_with(&format!(".{d}")),
        })
    };
    if let Some(n) = sel["matchName"].as_str() {
        return Ok(under(&n.to_ascii_lowercase()).map(|(_, ports)| ports.clone()));
    }
    if let Some(p) = sel["matchPattern"].as_str() {
        let p = p.to_ascii_lowercase();
        // Only `*.` leading a name under an allowed domain is placed.
        let found = match p.strip_prefix("*.") {
            Some(rest) if !rest.contains('*') => a
                .hosts
                .iter()
                .find(|(h, _)| matches!(h, HostPattern::Domain(d) if rest == d || rest.ends_with(&format!(".{d}")))),
            None if !p.contains('*') => under(&p),
            _ => None,
        };
        return Ok(found.map(|(_, ports)| ports.clone()));
    }
    Err(format!("a toFQDNs selector this cannot read: {sel}"))
}

/// A Cilium egress rule against the allowance.
fn cilium_rule(rule: &Value, a: &Allowance) -> RuleResult {
    let Some(obj) = rule.as_object() else {
        return Err(format!("a rule that is not an object: {rule}"));
    };
    const KNOWN: [&str; 6] = ["toEndpoints", "toCIDR", "toCIDRSet", "toFQDNs", "toEntities", "toPorts"];
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("a rule field this cannot read: {k}"));
    }
    if !KNOWN[..5].iter().any(|k| obj.contains_key(*k)) {
        return Err("a rule that names no destination".into());
    }
    let ports = cilium_ports(rule)?;
    if a.all {
        return Ok(None);
    }
    if let Some(e) = obj.get("toEntities") {
        return Ok(Some(format!("entities {e}")));
    }
    if let Some(eps) = obj.get("toEndpoints") {
        let eps = eps.as_array().ok_or("toEndpoints is not a list")?;
        for ep in eps {
            if !is_cilium_dns_endpoint(ep) {
                return Ok(Some(format!("endpoints in the cluster: {ep}")));
            }
            if !a.dns {
                return Ok(Some("the cluster resolver: the translation lets no lookup out".into()));
            }
            if !ports.as_ref().is_some_and(|p| p.iter().all(|p| *p == 53)) {
                return Ok(Some("the cluster resolver on ports other than 53".into()));
            }
            if let Some(allowed) = &a.dns_names {
                let names: Vec<Value> = rule["toPorts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|p| p["rules"]["dns"].as_array().cloned().unwrap_or_default())
                    .collect();
                let l4_only = rule["toPorts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["rules"]["dns"].as_array().is_none());
                if l4_only || names.is_empty() {
                    return Ok(Some(
                        "a resolver rule without DNS rules: it restricts no name, and the narrowing allows only named lookups".into(),
                    ));
                }
                if let Some(n) = names.iter().find(|n| !allowed.contains(n)) {
                    return Ok(Some(format!("lookups of {n}, outside the narrowed names")));
                }
            }
        }
    }
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    if let Some(c) = obj.get("toCIDR") {
        for s in c.as_array().ok_or("toCIDR is not a list")? {
            blocks.push((
                s.as_str().ok_or("a toCIDR entry that is not a string")?.to_owned(),
                Vec::new(),
            ));
        }
    }
    if let Some(c) = obj.get("toCIDRSet") {
        for s in c.as_array().ok_or("toCIDRSet is not a list")? {
            let cidr = s["cidr"]
                .as_str()
                .ok_or_else(|| format!("a toCIDRSet entry without a cidr: {s}"))?;
            let except = s["except"]
                .as_array()
                .map(|e| e.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default();
            blocks.push((cidr.to_owned(), except));
        }
    }
    for (cidr, except) in blocks {
        if let Some(why) = block_inside(a, &cidr, &except)? {
            return Ok(Some(why));
        }
    }
    if let Some(f) = obj.get("toFQDNs") {
        for sel in f.as_array().ok_or("toFQDNs is not a list")? {
            match fqdn_inside(sel, a)? {
                None => return Ok(Some(format!("names outside the allowlist: {sel}"))),
                Some(Some(limit)) => {
                    let Some(p) = &ports else {
                        return Ok(Some(format!(
                            "{sel} on every port; the allowlist limits it to {limit:?}"
                        )));
                    };
                    if let Some(x) = p.iter().find(|x| !limit.contains(x)) {
                        return Ok(Some(format!("{sel} on port {x}; the allowlist limits it to {limit:?}")));
                    }
                }
                Some(None) => {}
            }
        }
    }
    Ok(None)
}

/// Whether a policy puts its pods in egress default-deny.
fn enforces(kind: &str, policy: &Value) -> bool {
    let spec = &policy["spec"];
    if kind == "NetworkPolicy" {
        match spec["policyTypes"].as_array() {
            Some(t) => t.iter().any(|t| t == "Egress"),
            None => spec.get("egress").is_some(),
        }
    } else {
        match spec["enableDefaultDeny"]["egress"].as_bool() {
            Some(b) => b,
            None => {
                spec["egress"].as_array().is_some_and(|e| !e.is_empty())
                    || spec["egressDeny"].as_array().is_some_and(|e| !e.is_empty())
            }
        }
    }
}

/// One policy's verdict and whether it enforces, for a pod.
fn examine(
    kind: &str,
    policy: &Value,
    a: &Allowance,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> ExaminedPolicy {
    let name = policy["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let spec = &policy["spec"];
    let (selector, rule_of): (Option<&Value>, RuleCheck) = if kind == "NetworkPolicy" {
        (spec.get("podSelector"), core_rule)
    } else {
        (spec.get("endpointSelector"), cilium_rule)
    };
    let verdict = |v| ExaminedPolicy {
        kind: kind.into(),
        name: name.clone(),
        enforces: false,
        verdict: v,
    };
    if kind != "NetworkPolicy" && spec.get("endpointSelector").is_none() {
        return verdict(Verdict::NotEvaluable {
            why: "no endpointSelector (a node selector is not read)".into(),
        });
    }
    match selects(selector, labels, namespace) {
        Ok(false) => return verdict(Verdict::NotSelecting),
        Err(why) => return verdict(Verdict::NotEvaluable { why }),
        Ok(true) => {}
    }
    let rules = match &spec["egress"] {
        Value::Null => Vec::new(),
        Value::Array(r) => r.clone(),
        other => {
            return verdict(Verdict::NotEvaluable {
                why: format!("egress is not a list: {other}"),
            })
        }
    };
    let mut out = verdict(Verdict::Inside);
    out.enforces = enforces(kind, policy);
    for (i, rule) in rules.iter().enumerate() {
        match rule_of(rule, a) {
            Ok(None) => {}
            Ok(Some(why)) => {
                out.verdict = Verdict::Widens { rule: i, why };
                return out;
            }
            Err(why) => {
                out.verdict = Verdict::NotEvaluable {
                    why: format!("rule {i}: {why}"),
                };
                return out;
            }
        }
    }
    out
}

/// The policy collections to read under `engine`: core NetworkPolicy
/// always, Cilium's CRD under `cilium`.
fn collections(engine: Engine, namespace: &str) -> Vec<(String, Resource)> {
    let mut out = vec![("NetworkPolicy".to_owned(), policy_resource(Engine::Core, namespace))];
    if engine == Engine::Cilium {
        out.push((
            "CiliumNetworkPolicy".to_owned(),
            policy_resource(Engine::Cilium, namespace),
        ));
    }
    out
}

/// Every policy of every collection read under `engine`, by kind, and the
/// collections that could not be read.
pub async fn list_policies(
    api: &Api,
    engine: Engine,
    namespace: &str,
) -> (Vec<(String, Vec<Value>)>, Vec<UnreadSource>) {
    let mut lists = Vec::new();
    let mut unread = Vec::new();
    for (kind, r) in collections(engine, namespace) {
        match api.list(&r, None).await {
            Ok(v) => lists.push((kind, v["items"].as_array().cloned().unwrap_or_default())),
            Err(e) => {
                let status = match &e {
                    ApiError::Credential { status, .. } | ApiError::AlreadyGone { status, .. } => Some(*status),
                    ApiError::Api { status, .. } => *status,
                    _ => None,
                };
                unread.push(UnreadSource {
                    resource: format!("{}/{}", r.group, r.plural),
                    status,
                    message: e.to_string(),
                });
            }
        }
    }
    (lists, unread)
}

/// Evaluates the union of listed policies (by kind) for a pod; the
/// decision without any request (the listing is `verify_union`'s).
pub fn evaluate(
    cfg: &KubeEgressConfig,
    namespace: &str,
    pod_labels: &BTreeMap<String, String>,
    lists: &[(String, Vec<Value>)],
    unread: Vec<UnreadSource>,
) -> Result<(), EgressPolicyUnionError> {
    let a = allowance(cfg, namespace);
    let examined: Vec<ExaminedPolicy> = lists
        .iter()
        .flat_map(|(kind, items)| items.iter().map(|p| examine(kind, p, &a, pod_labels, namespace)))
        .collect();
    let refusal = if examined.iter().any(|e| matches!(e.verdict, Verdict::Widens { .. })) {
        Some(UnionRefusal::PolicyWidensEgress)
    } else if !unread.is_empty()
        || examined
            .iter()
            .any(|e| matches!(e.verdict, Verdict::NotEvaluable { .. }))
    {
        Some(UnionRefusal::NotEvaluable)
    } else if !a.all && !examined.iter().any(|e| e.enforces) {
        Some(UnionRefusal::NoEnforcingPolicy)
    } else {
        None
    };
    match refusal {
        None => Ok(()),
        Some(refusal) => Err(EgressPolicyUnionError {
            refusal,
            pod_labels: pod_labels.clone(),
            examined,
            unread,
        }),
    }
}

#[cfg(test)]
#[path = "union_tests.rs"]
mod tests;
