//! [`EgressConfig`]: a sandbox's egress settings (policy, names the host
//! resolves itself, link-local opt-ins, bounds), and the decisions that
//! depend on more than the policy.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::addr;
use super::policy::{EgressPolicy, PolicyError, Refusal, Target};

/// Egress connections one sandbox may have open or opening at once, unless
/// its [`EgressConfig::max_connections`] says otherwise. Each costs the
/// supervisor a socket (a file descriptor) on the host.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Name queries one sandbox may make per second, unless its
/// [`EgressConfig::dns_queries_per_sec`] says otherwise: DNS is a channel
/// out even where nothing may connect, so its bandwidth is bounded.
pub const DEFAULT_DNS_QUERIES_PER_SEC: u32 = 20;

/// How many egress decisions a sandbox's supervisor made, by verdict,
/// since it started (a restarted supervisor counts from zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decisions {
    /// Connections let through.
    pub allowed: u64,
    /// Connections and name queries refused by the policy or a bound.
    pub refused: u64,
    /// Name queries answered.
    pub resolved: u64,
    /// Connections allowed that could not be made.
    pub failed: u64,
    /// Connections whose client socket the agent handed to the host, which
    /// then relayed them alone (not a verdict: a count of allowed ones).
    #[serde(default)]
    pub handed_over: u64,
}

/// A sandbox's egress settings: the policy, names the host resolves itself
/// (like `docker run --add-host`), consulted before the system resolver,
/// and the link-local or cloud-metadata addresses the sandbox may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressConfig {
    /// What may leave.
    #[serde(default)]
    pub policy: EgressPolicy,
    /// Names the host resolves itself, to these addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Link-local and cloud-metadata addresses ([`addr::LINK_LOCAL`]) that
    /// the policy may reach. Empty by default, and then they are refused
    /// under every policy, allow-all included: the connection would leave
    /// from the host's own network stack and reach the HOST's metadata
    /// service (its credentials). Only ranges inside that space are
    /// accepted ([`PolicyError::NotLinkLocal`]); naming one opens nothing
    /// else, and the policy still decides (deny-all reaches nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reach_link_local: Vec<IpNet>,
    /// `max_connections`: egress connections open or opening at once;
    /// `None` is [`DEFAULT_MAX_CONNECTIONS`]. One more is refused
    /// ([`Refusal::TooManyConnections`]) and logged; the host's other
    /// calls are unaffected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// `dns_queries_per_sec`: name queries per second; `None` is
    /// [`DEFAULT_DNS_QUERIES_PER_SEC`]. More are refused
    /// ([`Refusal::DnsRateLimited`]), logged once a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_queries_per_sec: Option<u32>,
}

impl EgressConfig {
    /// The policy's entries, and every `reach_link_local` range inside
    /// link-local or metadata space.
    pub fn validate(&self) -> std::result::Result<(), PolicyError> {
        self.policy.validate()?;
        match self.reach_link_local.iter().find(|n| !addr::is_link_local_net(n)) {
            Some(n) => Err(PolicyError::NotLinkLocal {
                cidr: *n,
                reason: "169.254.0.0/16, fe80::/10 and the metadata addresses are the space".into(),
            }),
            None => Ok(()),
        }
    }

    /// The connection bound in force.
    pub fn connection_limit(&self) -> usize {
        self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)
    }

    /// The query rate in force.
    pub fn dns_limit(&self) -> u32 {
        self.dns_queries_per_sec.unwrap_or(DEFAULT_DNS_QUERIES_PER_SEC)
    }

    /// [`EgressPolicy::may_resolve`], and under deny-all only the names in
    /// `hosts`: nothing may connect there, so a query for any other name
    /// could only carry data out (`<secret>.attacker.example`).
    pub fn may_resolve(&self, name: &str) -> std::result::Result<String, Refusal> {
        let canonical = self.policy.may_resolve(name)?;
        if self.policy == EgressPolicy::DenyAll && !self.hosts.contains_key(&canonical) {
            return Err(Refusal::NotListed { host: canonical });
        }
        Ok(canonical)
    }

    /// [`EgressPolicy::may_connect`] with this configuration's opt-ins.
    pub fn may_connect(&self, host: &str, port: u16) -> std::result::Result<Target, Refusal> {
        self.policy.may_connect_with(host, port, &self.reach_link_local)
    }

    /// [`EgressPolicy::may_reach`] with this configuration's opt-ins.
    pub fn may_reach(&self, ip: IpAddr) -> std::result::Result<(), Refusal> {
        self.policy.may_reach_with(ip, &self.reach_link_local)
    }
}
