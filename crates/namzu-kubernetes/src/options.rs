//! [`KubernetesOptions`]: how the tier reaches its cluster and what it
//! asks of it, every field with a default and every combination that cannot
//! work refused before a request; and the constants they default to.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use namzu_core::error::{Error, Result};

pub use crate::api::MIN_API_REQUEST_TIMEOUT;
pub use crate::lease::RenewalErrorCallback;
use crate::{crd, labels, policy};

/// The agent's TCP port inside a pod.
pub const DEFAULT_AGENT_PORT: u16 = 1024;
/// Default [`KubernetesOptions::ready_timeout`].
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`KubernetesOptions::poll_interval`].
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Default [`KubernetesOptions::api_request_timeout`].
pub const DEFAULT_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default lifetime of a claim before the controller reclaims it (renewed by the lease).
pub const DEFAULT_CLAIM_TTL: Duration = Duration::from_secs(3600);

/// What the claim path needs with everything it may turn on, as
/// (apiGroup, resource, verbs): claims made, read, renewed and annotated
/// (patch), listed (crash recovery, headroom) and given back; the pool read
/// for headroom; the bound Sandbox read for readiness and its address; pods
/// read for the uid (the bind token), the IP and the diagnosis, and listed
/// for headroom; core and Cilium policies read (the named one) and listed
/// (the ingress check, on by default, and the egress union). Nothing is
/// written but claims: per-sandbox policy writes are a Role of their own
/// (`deploy/k8s/rbac-policy-writer.yaml`, opt-in). `rbac-claimant.yaml`
/// must say exactly this, and the claim path is recorded issuing exactly
/// this (tested).
pub const CLAIMANT_RBAC: &[(&str, &str, &[&str])] = &[
    (
        crd::EXTENSIONS_GROUP,
        "sandboxclaims",
        &["create", "get", "list", "patch", "delete"],
    ),
    (crd::EXTENSIONS_GROUP, "sandboxwarmpools", &["get"]),
    (crd::AGENTS_GROUP, "sandboxes", &["get"]),
    ("", "pods", &["get", "list"]),
    ("networking.k8s.io", "networkpolicies", &["get", "list"]),
    ("cilium.io", "ciliumnetworkpolicies", &["get", "list"]),
];

/// The opt-in policy writes of per-sandbox egress
/// (`deploy/k8s/rbac-policy-writer.yaml`), bounded by the admission fence.
pub const POLICY_WRITER_RBAC: &[(&str, &str, &[&str])] =
    &[("cilium.io", "ciliumnetworkpolicies", &["create", "patch", "delete"])];

/// How the host reaches a pod's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressMode {
    /// The Sandbox's headless Service FQDN.
    #[default]
    Service,
    /// The pod's IP, read from the pod.
    PodIp,
}

/// How a Service FQDN becomes addresses. The default asks the system
/// resolver (the cluster's DNS, for a host running in the cluster).
#[derive(Clone, Default)]
pub enum NameResolution {
    /// The host's own resolver.
    #[default]
    System,
    /// A resolver of the caller's: tests, or a host with its own view of
    /// cluster DNS. `None`: the name does not resolve.
    Custom(Resolver),
    /// A resolver of the caller's that tells a temporary failure (a
    /// resolver's EAI_AGAIN) from a name that does not exist.
    Fallible(FallibleResolver),
}

/// A caller's resolver: a name's addresses, `None` if it has none.
pub type Resolver = Arc<dyn Fn(&str) -> Option<Vec<IpAddr>> + Send + Sync>;
/// A caller's resolver that says why a name has no addresses.
pub type FallibleResolver = Arc<dyn Fn(&str) -> std::result::Result<Vec<IpAddr>, Lookup> + Send + Sync>;

/// Why a name has no addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The resolver could not answer now (EAI_AGAIN): asking again may.
    Temporary(String),
    /// The name has no addresses.
    NotFound(String),
}

impl std::fmt::Display for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Temporary(m) => write!(f, "temporary failure: {m}"),
            Self::NotFound(m) => f.write_str(m),
        }
    }
}

impl std::fmt::Debug for NameResolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::System => "System",
            Self::Custom(_) => "Custom",
            Self::Fallible(_) => "Fallible",
        })
    }
}

impl NameResolution {
    /// One lookup of `fqdn`.
    pub async fn lookup(&self, fqdn: &str) -> std::result::Result<Vec<IpAddr>, Lookup> {
        let found = match self {
            Self::System => tokio::net::lookup_host((fqdn, 0))
                .await
                .map(|a| a.map(|a| a.ip()).collect::<Vec<_>>())
                .map_err(|e| {
                    // getaddrinfo's EAI_AGAIN, as the system words it.
                    let m = e.to_string();
                    if m.contains("Temporary failure") || m.contains("try again") {
                        Lookup::Temporary(m)
                    } else {
                        Lookup::NotFound(m)
                    }
                })?,
            Self::Custom(f) => f(fqdn).unwrap_or_default(),
            Self::Fallible(f) => f(fqdn)?,
        };
        if found.is_empty() {
            return Err(Lookup::NotFound("no address".into()));
        }
        Ok(found)
    }

    /// The addresses of `fqdn`, or why there are none (one lookup).
    pub async fn resolve(&self, fqdn: &str) -> std::result::Result<Vec<IpAddr>, String> {
        self.lookup(fqdn).await.map_err(|e| e.to_string())
    }

    /// The addresses of `fqdn`, a temporary failure asked again every
    /// `every` until `within` has passed; a name that does not exist ends
    /// it at once.
    pub async fn resolve_within(
        &self,
        fqdn: &str,
        within: Duration,
        every: Duration,
    ) -> std::result::Result<Vec<IpAddr>, String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.lookup(fqdn).await {
                Ok(ips) => return Ok(ips),
                Err(Lookup::Temporary(m)) if tokio::time::Instant::now() + every < deadline => {
                    tracing::debug!(%fqdn, "temporary resolver failure, asking again: {m}");
                    tokio::time::sleep(every).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// Configuration of the `kubernetes` tier.
#[derive(Clone)]
pub struct KubernetesOptions {
    /// The namespace.
    pub namespace: String,
    /// Claim from this SandboxWarmPool (the fast path).
    pub warm_pool_name: Option<String>,
    /// Without a pool: make a Sandbox from this SandboxTemplate.
    pub template_name: Option<String>,
    /// Labels put on the claim's own metadata (without a pool, the
    /// Sandbox's), never on the pod: what `release_task_sandboxes` selects.
    pub claim_labels: BTreeMap<String, String>,
    /// The container that runs the agent; `None`: the template's first.
    pub agent_container: Option<String>,
    /// The agent's TCP port in the pod.
    pub agent_port: u16,
    /// How the host reaches the pod: the Sandbox's Service name, or the pod IP.
    pub address_mode: AddressMode,
    /// The whole acquire budget: from the claim to a dialed, probed agent.
    pub ready_timeout: Duration,
    /// How often state is polled while waiting.
    pub poll_interval: Duration,
    /// Bound on one API request.
    pub api_request_timeout: Duration,
    /// How long a claim lives unless renewed.
    pub claim_ttl: Duration,
    /// How `service` addresses resolve.
    pub resolution: NameResolution,
    /// Told of every failed lease renewal.
    pub on_lease_renewal_error: Option<RenewalErrorCallback>,
    /// Told when a live handle's pod was replaced and the link followed it
    /// (see [`crate::rebind`]): what ran and was written there is gone.
    pub on_pod_replaced: Option<crate::bound::PodReplacedCallback>,
    /// The egress policy the cluster must enforce on every pod, verified
    /// before a sandbox is handed out (see [`policy`] and
    /// [`policy::union`]). `None`: nothing is verified.
    pub egress: Option<policy::KubeEgressConfig>,
    /// Whether the agent port is shown closed before a sandbox is handed
    /// out (see [`policy::ingress`]). Default: verify.
    pub ingress: policy::ingress::IngressVerification,
    /// The host's side of the pod link's mutual TLS (see [`crate::link`]).
    /// Required to acquire or reach a sandbox (the link is never
    /// plaintext; `None` is refused by name before any request); the
    /// tier's operations (capacity, release) need none.
    pub link_tls: Option<crate::link::LinkTls>,
}

impl std::fmt::Debug for KubernetesOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesOptions")
            .field("namespace", &self.namespace)
            .field("warm_pool_name", &self.warm_pool_name)
            .field("template_name", &self.template_name)
            .field("claim_labels", &self.claim_labels)
            .field("agent_container", &self.agent_container)
            .field("agent_port", &self.agent_port)
            .field("address_mode", &self.address_mode)
            .field("ready_timeout", &self.ready_timeout)
            .field("poll_interval", &self.poll_interval)
            .field("api_request_timeout", &self.api_request_timeout)
            .field("claim_ttl", &self.claim_ttl)
            .field("resolution", &self.resolution)
            .field("egress", &self.egress)
            .field("ingress", &self.ingress)
            .field("link_tls", &self.link_tls)
            .finish_non_exhaustive()
    }
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            warm_pool_name: None,
            template_name: None,
            claim_labels: BTreeMap::new(),
            agent_container: None,
            agent_port: DEFAULT_AGENT_PORT,
            address_mode: AddressMode::Service,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            api_request_timeout: DEFAULT_API_REQUEST_TIMEOUT,
            claim_ttl: DEFAULT_CLAIM_TTL,
            resolution: NameResolution::System,
            on_lease_renewal_error: None,
            on_pod_replaced: None,
            egress: None,
            ingress: policy::ingress::IngressVerification::default(),
            link_tls: None,
        }
    }
}

impl KubernetesOptions {
    /// Refuses, by field, what cannot work.
    pub fn validate(&self) -> Result<()> {
        let refuse = |option: &str, reason: String| Error::OptionRefused {
            tier: namzu_core::spec::Tier::Kubernetes,
            option: option.into(),
            reason,
        };
        if self.api_request_timeout < MIN_API_REQUEST_TIMEOUT {
            return Err(refuse(
                "api_request_timeout",
                format!(
                    "{:?} is below {MIN_API_REQUEST_TIMEOUT:?}; every request needs a bound a real API server can meet",
                    self.api_request_timeout
                ),
            ));
        }
        if self.warm_pool_name.is_none() && self.template_name.is_none() {
            return Err(refuse(
                "warm_pool_name",
                "name a SandboxWarmPool to claim from, or a SandboxTemplate to make Sandboxes from".into(),
            ));
        }
        if self.namespace.is_empty() {
            return Err(refuse("namespace", "empty".into()));
        }
        if self.agent_port == 0 {
            return Err(refuse("agent_port", "0 is not a port".into()));
        }
        if self.poll_interval.is_zero() || self.poll_interval > self.ready_timeout {
            return Err(refuse(
                "poll_interval",
                format!("must be above 0 and at most ready_timeout ({:?})", self.ready_timeout),
            ));
        }
        if self.claim_ttl < Duration::from_secs(2) {
            return Err(refuse(
                "claim_ttl",
                "below 2 s a lease cannot be renewed at half its TTL".into(),
            ));
        }
        for (k, v) in &self.claim_labels {
            labels::check_label(k, v).map_err(|reason| refuse(&format!("claim_labels.{k}"), reason))?;
        }
        if let Some(e) = &self.egress {
            e.validate()?;
        }
        Ok(())
    }
}
