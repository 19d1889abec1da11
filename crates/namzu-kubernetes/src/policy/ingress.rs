//! Ingress verification, on by default. The agent port is the way into a
//! sandbox, and the bind token should not be the only thing in the way. So
//! before a sandbox is handed out, the namespace's policies are listed and
//! evaluated against the pod's real labels (never a policy's name). The
//! check passes only when at least one ingress-enforcing policy selects
//! the pod and none of the selecting policies admits a wide-open peer on
//! the agent port. Policies union: one open rule fails the check however
//! many closed ones sit beside it.
//!
//! A wide-open peer is any of:
//! * no `from`, or an empty one;
//! * an address block of prefix 0;
//! * every namespace (`namespaceSelector: {}` without a narrower
//!   `podSelector`);
//! * every pod of the namespace (`podSelector: {}` alone);
//! * under Cilium, every endpoint (`fromEndpoints: [{}]`) or a broad
//!   entity (`all`, `world`, `cluster`, `host`, `remote-node`, …).
//!
//! Cilium's `enableDefaultDeny: { ingress: false }` never counts as
//! coverage: it allows without isolating.
//!
//! Fields are read defensively: an unexpected shape refuses, never reads as
//! empty. `IngressVerification::Unverified` opts out on purpose and issues
//! no request.

use std::collections::BTreeMap;

use serde_json::Value;

use super::selectors::selects;
use super::union::UnreadSource;
use super::Engine;
use crate::build::AGENT_PORT_NAME;

/// Whether, and against which policy resources, the agent port is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressVerification {
    /// Check; `engine` `None` follows the egress engine, else core.
    Verify {
        /// Only this engine's policies (`None`: every engine).
        engine: Option<Engine>,
    },
    /// The boundary is somewhere a namespaced Role cannot read (a
    /// cluster-scoped policy, a mesh, a cloud security group): read nothing.
    Unverified,
}

impl Default for IngressVerification {
    fn default() -> Self {
        Self::Verify { engine: None }
    }
}

/// Why the ingress check refused a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressRefusal {
    /// A selecting policy admits a wide-open peer on the agent port.
    AgentPortOpen,
    /// No ingress-enforcing policy selects the pod.
    NoCoveringPolicy,
    /// A collection, a selector, a peer or a port could not be read.
    NotEvaluable,
}

/// What the ingress check made of one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IngressVerdict {
    /// It does not select the pod.
    NotSelecting,
    /// Selects the pod and isolates it for ingress; opens nothing wide.
    Covers,
    /// Selects the pod but does not isolate it for ingress.
    DoesNotIsolate,
    /// Rule `rule` admits a wide-open peer on the agent port: `why`.
    Opens {
        /// The rule, by index.
        rule: usize,
        /// Why, for humans.
        why: String,
    },
    /// It has a shape the check cannot read.
    NotEvaluable {
        /// Why, for humans.
        why: String,
    },
}

/// One policy the ingress check looked at, and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExaminedIngressPolicy {
    /// What kind of entry.
    pub kind: String,
    /// The entry name.
    pub name: String,
    /// What the check made of it.
    pub verdict: IngressVerdict,
}

/// The agent port is not shown closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ingress check refused ({refusal:?}): agent port {port} of a pod labelled {pod_labels:?}: {}",
    examined.iter().map(|e| format!("{} {}: {:?}", e.kind, e.name, e.verdict))
        .chain(unread.iter().map(|u| format!("{} unread ({:?}): {}", u.resource, u.status, u.message)))
        .collect::<Vec<_>>().join("; "))]
pub struct IngressPolicyError {
    /// Why it refused.
    pub refusal: IngressRefusal,
    /// The pod's labels, as evaluated.
    pub pod_labels: BTreeMap<String, String>,
    /// The port inside the sandbox.
    pub port: u16,
    /// Every policy examined.
    pub examined: Vec<ExaminedIngressPolicy>,
    /// Collections that could not be read.
    pub unread: Vec<UnreadSource>,
}

type Read = Result<Option<String>, String>;

/// Whether a core port entry list reaches `port`: `None`/empty is every port.
fn core_ports_reach(ports: Option<&Value>, port: u16) -> Result<bool, String> {
    let Some(ports) = ports else { return Ok(true) };
    let list = ports
        .as_array()
        .ok_or_else(|| format!("ports is not a list: {ports}"))?;
    if list.is_empty() {
        return Ok(true);
    }
    for p in list {
        let proto = p.get("protocol").map_or(Some("TCP"), Value::as_str);
        if proto.is_none() {
            return Err(format!("a protocol this cannot read: {p}"));
        }
        if proto != Some("TCP") {
            continue;
        }
        let hit = match p.get("port") {
            None => true,
            Some(Value::Number(n)) => {
                let lo = n.as_u64().ok_or_else(|| format!("a port this cannot read: {p}"))?;
                let hi = match p.get("endPort") {
                    None => lo,
                    Some(e) => e.as_u64().ok_or_else(|| format!("an endPort this cannot read: {p}"))?,
                };
                (lo..=hi).contains(&u64::from(port))
            }
            Some(Value::String(name)) => name == AGENT_PORT_NAME,
            Some(other) => return Err(format!("a port this cannot read: {other}")),
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

fn is_empty_selector(v: &Value) -> Result<bool, String> {
    let o = v
        .as_object()
        .ok_or_else(|| format!("a selector that is not an object: {v}"))?;
    let empty = |k: &str| match o.get(k) {
        None => Ok(true),
        Some(Value::Object(m)) => Ok(m.is_empty()),
        Some(Value::Array(a)) => Ok(a.is_empty()),
        Some(other) => Err(format!("{k} of an unexpected shape: {other}")),
    };
    Ok(empty("matchLabels")? && empty("matchExpressions")?)
}

fn block_is_wide(cidr: &Value) -> Result<bool, String> {
    let c = cidr
        .as_str()
        .ok_or_else(|| format!("a CIDR that is not a string: {cidr}"))?;
    let net: ipnet::IpNet = c.parse().map_err(|_| format!("a CIDR this cannot read: {c}"))?;
    Ok(net.prefix_len() == 0)
}

/// A core ingress rule: `Ok(Some(why))` when it admits a wide-open peer
/// on the agent port.
fn core_rule(rule: &Value, port: u16) -> Read {
    let o = rule
        .as_object()
        .ok_or_else(|| format!("a rule that is not an object: {rule}"))?;
    if let Some(k) = o.keys().find(|k| *k != "from" && *k != "ports") {
        return Err(format!("a rule field this cannot read: {k}"));
    }
    if !core_ports_reach(o.get("ports"), port)? {
        return Ok(None);
    }
    let peers = match o.get("from") {
        None => return Ok(Some("no `from`: every source".into())),
        Some(Value::Array(p)) if p.is_empty() => return Ok(Some("an empty `from`: every source".into())),
        Some(Value::Array(p)) => p,
        Some(other) => return Err(format!("`from` is not a list: {other}")),
    };
    for peer in peers {
        let po = peer
            .as_object()
            .ok_or_else(|| format!("a peer that is not an object: {peer}"))?;
        if let Some(k) = po
            .keys()
            .find(|k| !["ipBlock", "namespaceSelector", "podSelector"].contains(&k.as_str()))
        {
            return Err(format!("a peer field this cannot read: {k}"));
        }
        if let Some(b) = po.get("ipBlock") {
            if block_is_wide(&b["cidr"])? {
                return Ok(Some(format!("every address: {b}")));
            }
            continue;
        }
        let ns_all = po.get("namespaceSelector").map(is_empty_selector).transpose()?;
        let pods_all = po.get("podSelector").map(is_empty_selector).transpose()?;
        match (ns_all, pods_all) {
            (Some(true), None | Some(true)) => return Ok(Some(format!("every namespace: {peer}"))),
            (None, Some(true)) => return Ok(Some(format!("every pod in the namespace: {peer}"))),
            _ => {}
        }
    }
    Ok(None)
}

/// Cilium entities that admit more than one known host.
const WIDE_ENTITIES: [&str; 8] = [
    "all",
    "world",
    "cluster",
    "host",
    "remote-node",
    "init",
    "unmanaged",
    "ingress",
];

fn cilium_ports_reach(rule: &Value, port: u16) -> Result<bool, String> {
    let Some(tp) = rule.get("toPorts") else { return Ok(true) };
    let list = tp.as_array().ok_or_else(|| format!("toPorts is not a list: {tp}"))?;
    if list.is_empty() {
        return Ok(true);
    }
    for entry in list {
        let ports = entry["ports"]
            .as_array()
            .ok_or_else(|| format!("a toPorts entry without ports: {entry}"))?;
        for p in ports {
            let proto = p["protocol"].as_str().unwrap_or("ANY");
            if !["TCP", "ANY"].contains(&proto) {
                continue;
            }
            let hit = match &p["port"] {
                Value::String(s) if s == AGENT_PORT_NAME => true,
                Value::String(s) => {
                    let lo: u32 = s.parse().map_err(|_| format!("a port this cannot read: {p}"))?;
                    let hi = p["endPort"]
                        .as_u64()
                        .map_or(lo, |e| u32::try_from(e).unwrap_or(u32::MAX));
                    lo == 0 || (lo..=hi).contains(&u32::from(port))
                }
                Value::Number(n) => n.as_u64() == Some(u64::from(port)) || n.as_u64() == Some(0),
                Value::Null => true,
                other => return Err(format!("a port this cannot read: {other}")),
            };
            if hit {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A Cilium ingress rule.
fn cilium_rule(rule: &Value, port: u16) -> Read {
    let o = rule
        .as_object()
        .ok_or_else(|| format!("a rule that is not an object: {rule}"))?;
    const KNOWN: [&str; 5] = ["fromEndpoints", "fromCIDR", "fromCIDRSet", "fromEntities", "toPorts"];
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("a rule field this cannot read: {k}"));
    }
    if !cilium_ports_reach(rule, port)? {
        return Ok(None);
    }
    if !KNOWN[..4].iter().any(|k| o.contains_key(*k)) {
        return Ok(Some("a rule naming no source: every source".into()));
    }
    if let Some(e) = o.get("fromEntities") {
        let list = e.as_array().ok_or_else(|| format!("fromEntities is not a list: {e}"))?;
        for ent in list {
            let ent = ent
                .as_str()
                .ok_or_else(|| format!("an entity that is not a string: {ent}"))?;
            if WIDE_ENTITIES.contains(&ent) {
                return Ok(Some(format!("the entity {ent}")));
            }
        }
    }
    if let Some(eps) = o.get("fromEndpoints") {
        let list = eps
            .as_array()
            .ok_or_else(|| format!("fromEndpoints is not a list: {eps}"))?;
        for ep in list {
            if is_empty_selector(ep)? {
                return Ok(Some("every endpoint: fromEndpoints [{}]".into()));
            }
        }
    }
    if let Some(c) = o.get("fromCIDR") {
        let list = c.as_array().ok_or_else(|| format!("fromCIDR is not a list: {c}"))?;
        for cidr in list {
            if block_is_wide(cidr)? {
                return Ok(Some(format!("every address: {cidr}")));
            }
        }
    }
    if let Some(c) = o.get("fromCIDRSet") {
        let list = c.as_array().ok_or_else(|| format!("fromCIDRSet is not a list: {c}"))?;
        for set in list {
            if block_is_wide(&set["cidr"])? {
                return Ok(Some(format!("every address: {set}")));
            }
        }
    }
    Ok(None)
}

/// Whether a selecting policy isolates the pod for ingress.
fn isolates(kind: &str, spec: &Value) -> bool {
    if kind == "NetworkPolicy" {
        // Without policyTypes, Ingress is always implied.
        spec["policyTypes"]
            .as_array()
            .is_none_or(|t| t.iter().any(|t| t == "Ingress"))
    } else {
        match spec["enableDefaultDeny"]["ingress"].as_bool() {
            Some(false) => false,
            Some(true) => true,
            None => {
                spec["ingress"].as_array().is_some_and(|r| !r.is_empty())
                    || spec["ingressDeny"].as_array().is_some_and(|r| !r.is_empty())
            }
        }
    }
}

fn examine(
    kind: &str,
    p: &Value,
    labels: &BTreeMap<String, String>,
    namespace: &str,
    port: u16,
) -> ExaminedIngressPolicy {
    let name = p["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let spec = &p["spec"];
    let out = |verdict| ExaminedIngressPolicy {
        kind: kind.into(),
        name: name.clone(),
        verdict,
    };
    let selector = if kind == "NetworkPolicy" {
        spec.get("podSelector")
    } else {
        match spec.get("endpointSelector") {
            Some(s) => Some(s),
            None => {
                return out(IngressVerdict::NotEvaluable {
                    why: "no endpointSelector (a node selector is not read)".into(),
                })
            }
        }
    };
    match selects(selector, labels, namespace) {
        Ok(false) => return out(IngressVerdict::NotSelecting),
        Err(why) => return out(IngressVerdict::NotEvaluable { why }),
        Ok(true) => {}
    }
    let rules = match &spec["ingress"] {
        Value::Null => Vec::new(),
        Value::Array(r) => r.clone(),
        other => {
            return out(IngressVerdict::NotEvaluable {
                why: format!("ingress is not a list of rules: {other}"),
            })
        }
    };
    let check: fn(&Value, u16) -> Read = if kind == "NetworkPolicy" {
        core_rule
    } else {
        cilium_rule
    };
    for (i, rule) in rules.iter().enumerate() {
        match check(rule, port) {
            Ok(None) => {}
            Ok(Some(why)) => return out(IngressVerdict::Opens { rule: i, why }),
            Err(why) => {
                return out(IngressVerdict::NotEvaluable {
                    why: format!("rule {i}: {why}"),
                })
            }
        }
    }
    if isolates(kind, spec) {
        out(IngressVerdict::Covers)
    } else {
        out(IngressVerdict::DoesNotIsolate)
    }
}

/// The decision on listed policies, without any request.
pub fn evaluate(
    lists: &[(String, Vec<Value>)],
    unread: Vec<UnreadSource>,
    labels: &BTreeMap<String, String>,
    namespace: &str,
    port: u16,
) -> Result<(), IngressPolicyError> {
    let examined: Vec<ExaminedIngressPolicy> = lists
        .iter()
        .flat_map(|(kind, items)| items.iter().map(|p| examine(kind, p, labels, namespace, port)))
        .collect();
    let refusal = if examined
        .iter()
        .any(|e| matches!(e.verdict, IngressVerdict::Opens { .. }))
    {
        Some(IngressRefusal::AgentPortOpen)
    } else if !unread.is_empty()
        || examined
            .iter()
            .any(|e| matches!(e.verdict, IngressVerdict::NotEvaluable { .. }))
    {
        Some(IngressRefusal::NotEvaluable)
    } else if !examined.iter().any(|e| e.verdict == IngressVerdict::Covers) {
        Some(IngressRefusal::NoCoveringPolicy)
    } else {
        None
    };
    match refusal {
        None => Ok(()),
        Some(refusal) => Err(IngressPolicyError {
            refusal,
            pod_labels: labels.clone(),
            port,
            examined,
            unread,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels() -> BTreeMap<String, String> {
        BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "namzu".to_owned())])
    }

    fn shipped() -> Value {
        json!({"kind": "NetworkPolicy", "metadata": {"name": "namzu-agent-port"}, "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "namzu"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "namzu-host"}}}],
                "ports": [{"protocol": "TCP", "port": 1024}]}]}})
    }

    fn core(ingress: Value) -> Value {
        json!({"kind": "NetworkPolicy", "metadata": {"name": "extra"}, "spec": {
            "podSelector": {}, "policyTypes": ["Ingress"], "ingress": ingress}})
    }

    fn run(core_items: Vec<Value>, cilium_items: Option<Vec<Value>>) -> Result<(), IngressPolicyError> {
        let mut lists = vec![("NetworkPolicy".to_owned(), core_items)];
        if let Some(c) = cilium_items {
            lists.push(("CiliumNetworkPolicy".to_owned(), c));
        }
        evaluate(&lists, vec![], &labels(), "sandboxes", 1024)
    }

    fn refusal(r: Result<(), IngressPolicyError>) -> IngressRefusal {
        r.expect_err("passed").refusal
    }

    #[test]
    fn the_shipped_policy_covers_the_agent_port() {
        assert_eq!(run(vec![shipped()], None), Ok(()));
    }

    #[test]
    fn no_policy_or_one_that_does_not_isolate_is_no_coverage() {
        assert_eq!(refusal(run(vec![], None)), IngressRefusal::NoCoveringPolicy);
        let egress_only = json!({"kind": "NetworkPolicy", "metadata": {"name": "e"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"]}});
        assert_eq!(refusal(run(vec![egress_only], None)), IngressRefusal::NoCoveringPolicy);
        let elsewhere = json!({"kind": "NetworkPolicy", "metadata": {"name": "w"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}});
        assert_eq!(refusal(run(vec![elsewhere], None)), IngressRefusal::NoCoveringPolicy);
        // Cilium's enableDefaultDeny ingress false never counts.
        let no_isolation = json!({"kind": "CiliumNetworkPolicy", "metadata": {"name": "c"}, "spec": {
            "endpointSelector": {}, "enableDefaultDeny": {"ingress": false},
            "ingress": [{"fromEndpoints": [{"matchLabels": {"app": "x"}}]}]}});
        assert_eq!(
            refusal(run(vec![], Some(vec![no_isolation]))),
            IngressRefusal::NoCoveringPolicy
        );
    }

    #[test]
    fn one_wide_open_rule_beside_the_shipped_policy_opens_the_port() {
        for (rule, what) in [
            (json!([{}]), "every source"),
            (json!([{"from": []}]), "every source"),
            (json!([{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]), "every address"),
            (json!([{"from": [{"namespaceSelector": {}}]}]), "every namespace"),
            (json!([{"from": [{"podSelector": {}}]}]), "every pod"),
            (
                json!([{"from": [{"podSelector": {}}], "ports": [{"port": "namzu-agent"}]}]),
                "every pod",
            ),
            (
                json!([{"from": [{"podSelector": {}}], "ports": [{"port": 1000, "endPort": 2000}]}]),
                "every pod",
            ),
        ] {
            let e = run(vec![shipped(), core(rule.clone())], None).unwrap_err();
            assert_eq!(e.refusal, IngressRefusal::AgentPortOpen, "{rule}");
            assert!(
                matches!(&e.examined[1].verdict, IngressVerdict::Opens { why, .. } if why.contains(what)),
                "{rule}: {e}"
            );
            assert_eq!(e.port, 1024);
        }
        // Wide open on another port, or narrow on this one: fine.
        assert_eq!(
            run(vec![shipped(), core(json!([{"ports": [{"port": 8080}]}]))], None),
            Ok(())
        );
        assert_eq!(
            run(
                vec![
                    shipped(),
                    core(json!([{"from": [{"ipBlock": {"cidr": "10.0.0.5/32"}}]}]))
                ],
                None
            ),
            Ok(())
        );
        let cilium_world = json!({"kind": "CiliumNetworkPolicy", "metadata": {"name": "w"}, "spec": {
            "endpointSelector": {"matchLabels": {"k8s:app.kubernetes.io/managed-by": "namzu"}},
            "ingress": [{"fromEntities": ["world"]}]}});
        assert_eq!(
            refusal(run(vec![shipped()], Some(vec![cilium_world]))),
            IngressRefusal::AgentPortOpen
        );
    }

    #[test]
    fn shapes_it_cannot_read_refuse() {
        let string_cidr = json!({"kind": "CiliumNetworkPolicy", "metadata": {"name": "s"}, "spec": {
            "endpointSelector": {}, "ingress": [{"fromCIDR": "0.0.0.0/0"}]}});
        assert_eq!(
            refusal(run(vec![shipped()], Some(vec![string_cidr]))),
            IngressRefusal::NotEvaluable
        );
        let odd_ingress = json!({"kind": "NetworkPolicy", "metadata": {"name": "o"},
            "spec": {"podSelector": {}, "ingress": {"from": []}}});
        assert_eq!(
            refusal(run(vec![shipped(), odd_ingress], None)),
            IngressRefusal::NotEvaluable
        );
        let odd_selector = json!({"kind": "NetworkPolicy", "metadata": {"name": "o"},
            "spec": {"podSelector": "all", "policyTypes": ["Ingress"]}});
        assert_eq!(
            refusal(run(vec![shipped(), odd_selector], None)),
            IngressRefusal::NotEvaluable
        );
        let unread = vec![UnreadSource {
            resource: "cilium.io/ciliumnetworkpolicies".into(),
            status: Some(404),
            message: "the server could not find the requested resource".into(),
        }];
        let e = evaluate(
            &[("NetworkPolicy".into(), vec![shipped()])],
            unread,
            &labels(),
            "sandboxes",
            1024,
        )
        .unwrap_err();
        assert_eq!(e.refusal, IngressRefusal::NotEvaluable);
        assert_eq!(e.unread[0].status, Some(404));
    }
}
