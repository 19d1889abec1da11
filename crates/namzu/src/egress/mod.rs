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
//! * [`policy`]: the policy type, entry validation, decisions;
//! * [`addr`]: which addresses are public;
//! * [`service`]: the host's answers: resolve, check, connect, splice;
//!   live policy changes;
//! * [`supervisor`]: the per-sandbox host process running the service,
//!   and its control socket.

pub mod addr;
pub mod policy;
pub mod service;
pub mod supervisor;

pub use policy::{EgressPolicy, HostPattern, HostRule, PolicyError, Refusal, Target};
pub use service::EgressConfig;

/// The refusal of a network-policy call on a tier without an egress
/// boundary.
pub(crate) fn no_boundary(tier: crate::Tier) -> crate::Error {
    crate::Error::OptionRefused {
        tier,
        option: "network policy".into(),
        reason: "this tier has no egress boundary".into(),
    }
}
