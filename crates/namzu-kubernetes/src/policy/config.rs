//! The tier's egress configuration ([`KubeEgressConfig`]) and its
//! validation: every refusal an [`EgressConfigError`] naming the field.

use crate::api::Resource;
use crate::labels::{MANAGED_BY, MANAGED_BY_LABEL};
use namzu_core::egress::policy::HostPattern;
use std::collections::BTreeMap;

/// The label an egress profile is written under by default.
pub const DEFAULT_PROFILE_LABEL_KEY: &str = "namzu.sandbox.users.io/egress-profile";

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
    /// Everything may leave.
    AllowAll,
    /// Nothing leaves, the cluster resolver included.
    NoNetwork,
    /// The internet, never the private, CGNAT, link-local, loopback or
    /// metadata ranges, nor `except_cidrs`.
    PublicInternet {
        /// Ranges refused besides the non-public ones.
        except_cidrs: Vec<String>,
    },
    /// A fixed hostname allowlist (`api.example.com`, `.example.com`).
    Static {
        /// Names the host resolves itself, to these addresses.
        hosts: Vec<String>,
    },
    /// The names a host-side resolver admits, enumerated for the cluster.
    Resolver {
        /// Names the host resolves itself, to these addresses.
        hosts: Vec<String>,
    },
}

impl KubeEgressPolicy {
    /// What kind of entry.
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
    /// The cluster's DNS domain (`cluster.local`).
    pub cluster_domain: String,
    /// The pod's resolver search suffixes, which Cilium must allow too.
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
    /// What may leave.
    pub policy: KubeEgressPolicy,
    /// Which policy engine enforces it.
    pub engine: Engine,
    /// Cilium-only narrowing of an allowlist (ports, TLS names, DNS names).
    pub narrowing: Option<CiliumNarrowing>,
    /// The template the policy belongs to: its name is
    /// `<template>-egress`, or `<template>-<profile>-egress`.
    pub template: String,
    /// A profile: its label goes on the claim's pod metadata and into the
    /// policy's selector.
    pub profile: Option<String>,
    /// The pod label key the profile is selected by; under
    /// `pod_label_domain`.
    pub profile_label_key: String,
    /// The ONE domain of the pod labels namzu asks the controller for (the
    /// profile's and the per-sandbox policy's): it must be in the
    /// controller's `allowed-label-domains`. Set it with
    /// [`KubeEgressConfig::with_pod_label_domain`], which moves both keys.
    pub pod_label_domain: String,
    /// Whether the applied policy is checked before a sandbox is handed out.
    pub verify: Verification,
    /// A CiliumNetworkPolicy per sandbox, written by
    /// `Sandbox::set_network_policy` (see [`super::per_sandbox`]).
    pub per_sandbox: Option<super::per_sandbox::PerSandboxEgress>,
}

impl KubeEgressConfig {
    /// The configuration of `template`'s policy, with defaults.
    pub fn new(template: &str, policy: KubeEgressPolicy) -> Self {
        Self {
            policy,
            engine: Engine::Core,
            narrowing: None,
            template: template.into(),
            profile: None,
            profile_label_key: DEFAULT_PROFILE_LABEL_KEY.into(),
            pod_label_domain: crate::labels::DEFAULT_POD_LABEL_DOMAIN.into(),
            verify: Verification::Union,
            per_sandbox: None,
        }
    }

    /// This configuration with its pod labels under `domain`:
    /// `<domain>/egress-profile` and `<domain>/egress-sandbox`.
    #[must_use]
    pub fn with_pod_label_domain(mut self, domain: &str) -> Self {
        self.pod_label_domain = domain.into();
        self.profile_label_key = format!("{domain}/egress-profile");
        if let Some(ps) = &mut self.per_sandbox {
            ps.label_key = format!("{domain}/egress-sandbox");
        }
        self
    }
}

/// A configuration refused at construction, naming what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressConfigError {
    #[error(
        "egress policy {policy} is a hostname allowlist: core NetworkPolicy has no notion of a name; use engine cilium"
    )]
    /// A hostname allowlist under the core engine, which has no names.
    HostnamesNeedCilium {
        /// What may leave.
        policy: &'static str,
    },
    /// Egress narrowing () needs a hostname allowlist enforced by Cilium.
    #[error("egress narrowing ({field}) needs a hostname allowlist enforced by Cilium: {reason}")]
    NarrowingUnsupported {
        /// The status field that showed privilege.
        field: &'static str,
        /// Why, for humans.
        reason: String,
    },
    /// Egress is an empty port list: omit it for no limit.
    #[error("egress {field} is an empty port list: omit it for no limit")]
    EmptyPortList {
        /// The status field that showed privilege.
        field: String,
    },
    /// Egress : port is outside 1-65535.
    #[error("egress {field}: port {port} is outside 1-65535")]
    PortOutOfRange {
        /// The status field that showed privilege.
        field: String,
        /// The port inside the sandbox.
        port: u32,
    },
    /// Egress host : TLS server names need exact hosts; a .domain entry cannot carry one.
    #[error("egress host {entry:?}: TLS server names need exact hosts; a .domain entry cannot carry one")]
    TlsServerNameOnDomain {
        /// The entry as the layer names it.
        entry: String,
    },
    /// Egress except_cidrs entry is not a CIDR.
    #[error("egress except_cidrs entry {entry:?} is not a CIDR")]
    NotACidr {
        /// The entry as the layer names it.
        entry: String,
    },
    /// Egress host.
    #[error("egress host {entry:?}: {reason}")]
    BadHost {
        /// The entry as the layer names it.
        entry: String,
        /// Why, for humans.
        reason: String,
    },
    /// Egress.
    #[error("egress {field}: {reason}")]
    BadField {
        /// The status field that showed privilege.
        field: &'static str,
        /// Why, for humans.
        reason: String,
    },
}

fn label_ok(field: &'static str, key: &str, value: &str) -> Result<(), EgressConfigError> {
    crate::labels::check_label(key, value).map_err(|reason| EgressConfigError::BadField { field, reason })
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
        label_ok("pod_label_domain", &format!("{}/x", self.pod_label_domain), "")?;
        let in_domain = |field: &'static str, key: &str| {
            if crate::labels::key_in_domain(key, &self.pod_label_domain) {
                Ok(())
            } else {
                Err(EgressConfigError::BadField {
                    field,
                    reason: format!(
                        "pod label {key:?} is outside pod_label_domain {:?}: the agent-sandbox controller refuses pod labels outside its allowed-label-domains; use with_pod_label_domain",
                        self.pod_label_domain
                    ),
                })
            }
        };
        // namzu's own keys name its objects; a profile under one of them
        // would be read as an id or a marker.
        let own = [crate::labels::SANDBOX_LABEL, crate::labels::MANAGED_BY_LABEL];
        if let Some(p) = &self.profile {
            label_ok("profile", &self.profile_label_key, p)?;
            in_domain("profile_label_key", &self.profile_label_key)?;
            let clash = own.contains(&self.profile_label_key.as_str())
                || self
                    .per_sandbox
                    .as_ref()
                    .is_some_and(|ps| ps.label_key == self.profile_label_key);
            if clash {
                return Err(EgressConfigError::BadField {
                    field: "profile_label_key",
                    reason: format!("{:?} is one of namzu's own label keys", self.profile_label_key),
                });
            }
        }
        let name = self.policy_name();
        if name.len() > 253 {
            return Err(EgressConfigError::BadField {
                field: "template",
                reason: format!(
                    "the policy name {name:?} is {} characters; an object name is at most 253",
                    name.len()
                ),
            });
        }
        if let Some(ps) = &self.per_sandbox {
            if self.engine != Engine::Cilium {
                return Err(EgressConfigError::BadField {
                    field: "per_sandbox",
                    reason: "a per-sandbox policy is a CiliumNetworkPolicy; the engine must be cilium".into(),
                });
            }
            label_ok("per_sandbox.label_key", &ps.label_key, "sb-0")?;
            in_domain("per_sandbox.label_key", &ps.label_key)?;
            if [crate::labels::SANDBOX_LABEL, crate::labels::MANAGED_BY_LABEL].contains(&ps.label_key.as_str()) {
                return Err(EgressConfigError::BadField {
                    field: "per_sandbox.label_key",
                    reason: format!("{:?} is one of namzu's own label keys", ps.label_key),
                });
            }
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

/// The pod label a per-sandbox policy selects (its value: the sandbox id).
pub const DEFAULT_LABEL_KEY: &str = "namzu.sandbox.users.io/egress-sandbox";
/// Every per-sandbox policy's name starts so (the fence checks it).
pub const POLICY_NAME_PREFIX: &str = "namzu-sbx-";
/// The shipped fence's policy and binding name.
pub const DEFAULT_FENCE: &str = "namzu-per-sandbox-egress";

/// How per-sandbox policies are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerSandboxEgress {
    /// The pod label key the per-sandbox policy selects by.
    pub label_key: String,
    /// Narrowing applied to every per-sandbox allowlist.
    pub narrowing: Option<CiliumNarrowing>,
    /// The ValidatingAdmissionPolicy, and its binding, that must exist.
    pub fence_policy: String,
    /// The admission-policy binding that fences the label.
    pub fence_binding: String,
}

impl Default for PerSandboxEgress {
    fn default() -> Self {
        Self {
            label_key: DEFAULT_LABEL_KEY.into(),
            narrowing: None,
            fence_policy: DEFAULT_FENCE.into(),
            fence_binding: DEFAULT_FENCE.into(),
        }
    }
}

impl PerSandboxEgress {
    /// Refuses a label key or binding the API server would refuse.
    pub fn validate(&self) -> Result<(), EgressConfigError> {
        if self.fence_policy.is_empty() || self.fence_binding.is_empty() {
            return Err(EgressConfigError::BadField {
                field: "per_sandbox.fence",
                reason: "the admission fence's names are empty".into(),
            });
        }
        if let Some(n) = &self.narrowing {
            if let Some(p) = &n.ports {
                check_ports("per_sandbox.narrowing.ports".into(), p)?;
            }
            if let Some(p) = &n.tls_ports {
                check_ports("per_sandbox.narrowing.tls_ports".into(), p)?;
            }
            if !n.host_ports.is_empty() {
                return Err(EgressConfigError::BadField {
                    field: "per_sandbox.narrowing.host_ports",
                    reason: "per-sandbox hosts carry their own ports (HOST=PORTS); host_ports has no hosts to name"
                        .into(),
                });
            }
        }
        Ok(())
    }
}
