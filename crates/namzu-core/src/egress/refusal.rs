//! [`Refusal`]: why one egress decision said no, each reason a variant
//! naming what was refused.

use ipnet::IpNet;
use std::net::IpAddr;

/// Why a name, a connection or an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The policy is no-network.
    #[error("the policy is no-network")]
    NoNetwork,
    /// The policy is deny-all.
    #[error("the policy is deny-all")]
    DenyAll,
    /// The host is not on the allowlist.
    #[error("{host} is not on the allowlist")]
    NotAllowlisted {
        /// The host as asked.
        host: String,
    },
    /// The port is not allowed for that host.
    #[error("{host}:{port} is not an allowed port")]
    PortNotAllowed {
        /// The host as asked.
        host: String,
        /// The port asked for.
        port: u16,
    },
    /// An IP address was asked for where only names are reached.
    #[error("{host} is an IP address; only names are reached under this policy")]
    IpLiteral {
        /// The host as asked.
        host: String,
    },
    /// Not a valid host name.
    #[error("{host} is not a host name: {reason}")]
    BadName {
        /// The host as asked.
        host: String,
        /// Why, for humans.
        reason: String,
    },
    /// The address is of a class never reached (private, loopback …).
    #[error("{address} is {class}, never reached")]
    Address {
        /// The address.
        address: IpAddr,
        /// Which non-public class it belongs to.
        class: &'static str,
    },
    /// The address lies in an excepted range.
    #[error("{address} is in the excepted {cidr}")]
    Excepted {
        /// The address.
        address: IpAddr,
        /// The range.
        cidr: IpNet,
    },
    /// `max_connections` egress connections are open or opening already.
    #[error("{limit} egress connections are open or opening already (max_connections)")]
    TooManyConnections {
        /// The limit in force.
        limit: usize,
    },
    /// Under deny-all, only the configured host names resolve.
    #[error("{host} is not among the names this deny-all sandbox may resolve (its hosts)")]
    NotListed {
        /// The host as asked.
        host: String,
    },
    /// More name queries this second than `dns_queries_per_sec` allows.
    #[error("more than {limit} name queries this second (dns_queries_per_sec)")]
    DnsRateLimited {
        /// The limit in force.
        limit: u32,
    },
}
