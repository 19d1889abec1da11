//! Which addresses count as "public": the check every resolved address of
//! every permitted name goes through again before a connection is made.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::policy::Refusal;

/// Ranges never reached under an allowlist or the public internet, each
/// with what it is. IPv4-mapped and NAT64 IPv6 addresses are judged by the
/// IPv4 address inside them.
const NEVER: &[(&str, &str)] = &[
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata included)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("168.63.129.16/32", "a cloud metadata address (Azure)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fc00::/7", "unique local (ULA; AWS metadata fd00:ec2::254 included)"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`) or NAT64
/// (`64:ff9b::a.b.c.d`) address; any other address unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return IpAddr::V4(Ipv4Addr::new(a, b, c, d));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// What a non-public address is, or `None` for a public one.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    let ip = canonical(ip);
    for (cidr, what) in NEVER {
        if cidr.parse::<IpNet>().is_ok_and(|n| n.contains(&ip)) {
            return Some(what);
        }
    }
    if host_addresses().contains(&ip) {
        return Some("one of the host's own addresses");
    }
    None
}

/// `Ok` for a public address, else the refusal naming its class.
pub fn check_public(ip: IpAddr) -> Result<(), Refusal> {
    match classify(ip) {
        None => Ok(()),
        Some(class) => Err(Refusal::Address {
            address: canonical(ip),
            class,
        }),
    }
}

/// `Ok` unless `ip` is the host itself (loopback, unspecified, or one of
/// its own addresses): even under allow-all a sandbox does not reach the
/// services of the machine it runs on, as a container on a bridge does not.
pub fn check_not_host(ip: IpAddr) -> Result<(), Refusal> {
    let ip = canonical(ip);
    let class = if ip.is_loopback() {
        "loopback"
    } else if ip.is_unspecified() {
        "unspecified"
    } else if host_addresses().contains(&ip) {
        "one of the host's own addresses"
    } else {
        return Ok(());
    };
    Err(Refusal::Address { address: ip, class })
}

/// Every address on the host's interfaces, read now (interfaces change).
fn host_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// An IPv6 address from text, for tests.
#[cfg(test)]
fn v6(s: &str) -> IpAddr {
    IpAddr::V6(
        s.parse::<std::net::Ipv6Addr>()
            .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn inside_addresses_are_named_and_public_ones_pass() {
        for (ip, class) in [
            ("10.1.2.3", "private"),
            ("172.20.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.100.0.1", "carrier-grade"),
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("168.63.129.16", "metadata"),
            ("224.0.0.251", "multicast"),
            ("0.1.2.3", "this network"),
        ] {
            let got = classify(ip.parse().unwrap());
            assert!(got.is_some_and(|c| c.contains(class)), "{ip}: {got:?}");
        }
        for (ip, class) in [
            ("::1", "loopback"),
            ("fd00:ec2::254", "unique local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            let got = classify(v6(ip));
            assert!(got.is_some_and(|c| c.contains(class)), "{ip}: {got:?}");
        }
        for ip in ["93.184.216.34", "203.0.113.7", "1.1.1.1"] {
            assert_eq!(classify(ip.parse().unwrap()), None, "{ip}");
        }
        assert_eq!(classify(v6("2606:4700::1111")), None);
    }

    #[test]
    fn the_hosts_own_addresses_are_never_public() {
        for ip in host_addresses() {
            assert!(classify(ip).is_some(), "{ip}");
        }
    }
}
