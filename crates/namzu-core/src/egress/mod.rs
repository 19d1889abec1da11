//! Egress: what may leave a sandbox, decided outside it.
//!
//! A sandbox has no route out. Its agent serves, on the sandbox's own
//! loopback, an HTTP CONNECT and SOCKS5 proxy and a DNS resolver, and every
//! command it starts is pointed at them (`HTTP_PROXY` and friends). Each
//! connection and each query is asked of the host over the agent link; the
//! host decides against one [`EgressPolicy`]: the name first, then, after
//! resolving it, every address again (a permitted name that resolves to a
//! private address is refused: DNS rebinding), and only then connects and
//! splices.
//!
//! This crate holds the decisions, which need no IO:
//! * [`policy`]: the policy type, entry validation, decisions;
//! * [`addr`]: which addresses are public (the host's own, watched by
//!   `host_addrs`, never);
//! * [`config`]: a sandbox's whole egress configuration.
//!
//! The service that answers the agent and the per-sandbox supervisor
//! running it are the single-host tiers' (`namzu_core::egress`).

pub mod addr;
pub mod config;
mod host_addrs;
pub mod policy;
pub mod refusal;

pub use config::{Decisions, EgressConfig, DEFAULT_DNS_QUERIES_PER_SEC, DEFAULT_MAX_CONNECTIONS};
pub use policy::{EgressPolicy, HostPattern, HostRule, PolicyError, Refusal, Target};

/// The refusal of a network-policy call on a tier without an egress
/// boundary.
pub fn no_boundary(tier: crate::Tier) -> crate::Error {
    crate::Error::OptionRefused {
        tier,
        option: "network policy".into(),
        reason: "this tier has no egress boundary".into(),
    }
}
