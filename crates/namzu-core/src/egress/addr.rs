//! Which addresses count as "public": the check every resolved address of
//! every permitted name goes through again before a connection is made.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::refusal::Refusal;

/// Ranges never reached under an allowlist or the public internet, each
/// with what it is. IPv6 forms that carry an IPv4 address are judged by the
/// IPv4 address inside them too ([`embedded_v4`]).
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
    // RFC 8215: local-use NAT64, where the IPv4 address sits at a place
    // only the local translator knows; never public.
    ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
    ("fc00::/7", "unique local (ULA; AWS metadata fd00:ec2::254 included)"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// Refused under EVERY policy, allow-all included, unless named in
/// `EgressConfig::reach_link_local`: link-local space and the well-known
/// cloud metadata addresses. The egress connection leaves from the host's
/// own network stack, so a metadata service's hop limit (IMDSv2) does not
/// stop it: only this refusal does.
pub const LINK_LOCAL: &[(&str, &str)] = &[
    ("169.254.0.0/16", "link-local (cloud metadata 169.254.169.254 included)"),
    ("fe80::/10", "link-local"),
    ("fd00:ec2::254/128", "a cloud metadata address (AWS, IPv6)"),
    ("100.100.100.200/32", "a cloud metadata address (Alibaba Cloud)"),
    ("168.63.129.16/32", "a cloud metadata address (Azure)"),
];

/// The IPv4 addresses an IPv6 address carries, by its form:
/// IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d` (deprecated,
/// but routed by some stacks), NAT64 `64:ff9b::a.b.c.d`, 6to4
/// `2002:AABB:CCDD::/48`, and Teredo `2001:0::/32` (its server, and its
/// client's public address stored inverted in the last 32 bits). An IPv4
/// address carries itself; other IPv6 addresses carry none.
pub fn embedded_v4(ip: IpAddr) -> Vec<Ipv4Addr> {
    let v6 = match ip {
        IpAddr::V4(v4) => return vec![v4],
        IpAddr::V6(v6) => v6,
    };
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return vec![v4];
    }
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => vec![v4(hi, lo)],
        // ::a.b.c.d, but not :: and ::1 (which are themselves).
        [0, 0, 0, 0, 0, 0, hi, lo] if (hi, lo) > (0, 1) => vec![v4(hi, lo)],
        [0x2002, hi, lo, ..] => vec![v4(hi, lo)],
        [0x2001, 0, shi, slo, _, _, chi, clo] => vec![v4(!chi, !clo), v4(shi, slo)],
        _ => Vec::new(),
    }
}

/// The IPv4 address an IPv6 address stands for (the first of
/// [`embedded_v4`]); any other address unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match embedded_v4(ip).first() {
        Some(v4) => IpAddr::V4(*v4),
        None => ip,
    }
}

fn class_in(table: &[(&str, &'static str)], ip: IpAddr) -> Option<&'static str> {
    let mut forms: Vec<IpAddr> = vec![ip];
    forms.extend(embedded_v4(ip).into_iter().map(IpAddr::V4));
    table.iter().find_map(|(cidr, what)| {
        let net = cidr.parse::<IpNet>().ok()?;
        forms.iter().any(|f| net.contains(f)).then_some(*what)
    })
}

/// What a non-public address is, or `None` for a public one. Every form
/// of the address counts: an IPv6 address is non-public when it, or any
/// IPv4 address it carries, is.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    if let Some(what) = class_in(NEVER, ip) {
        return Some(what);
    }
    let hosts = host_addresses();
    let own = std::iter::once(ip)
        .chain(embedded_v4(ip).into_iter().map(IpAddr::V4))
        .any(|f| hosts.contains(&f));
    own.then_some("one of the host's own addresses")
}

/// `Ok` unless `ip` (in any of its forms) is link-local or a cloud
/// metadata address ([`LINK_LOCAL`]).
pub fn check_not_link_local(ip: IpAddr) -> Result<(), Refusal> {
    match class_in(LINK_LOCAL, ip) {
        None => Ok(()),
        Some(class) => Err(Refusal::Address {
            address: canonical(ip),
            class,
        }),
    }
}

/// Whether `net` lies wholly inside link-local or metadata space, the only
/// space `reach_link_local` may open.
pub fn is_link_local_net(net: &IpNet) -> bool {
    LINK_LOCAL
        .iter()
        .filter_map(|(cidr, _)| cidr.parse::<IpNet>().ok())
        .any(|n| n.contains(net))
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
    let forms: Vec<IpAddr> = std::iter::once(ip)
        .chain(embedded_v4(ip).into_iter().map(IpAddr::V4))
        .collect();
    let hosts = host_addresses();
    let ip = canonical(ip);
    let class = if forms.iter().any(|f| f.is_loopback()) {
        "loopback"
    } else if forms.iter().any(|f| f.is_unspecified()) {
        "unspecified"
    } else if forms.iter().any(|f| hosts.contains(f)) {
        "one of the host's own addresses"
    } else {
        return Ok(());
    };
    Err(Refusal::Address { address: ip, class })
}

/// Every address on the host's interfaces, as of now (interfaces change;
/// [`super::host_addrs`] re-reads them when they do).
fn host_addresses() -> Vec<IpAddr> {
    super::host_addrs::current()
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

    /// Item 15 of the audit: every IPv6 form that carries an IPv4 address
    /// is judged by it (and by the address itself).
    #[test]
    fn ipv6_forms_carrying_ipv4_are_judged_by_it() {
        for (ip, class) in [
            ("::a9fe:a9fe", "link-local"),       // IPv4-compatible 169.254.169.254
            ("::7f00:1", "loopback"),            // IPv4-compatible 127.0.0.1
            ("::a00:1", "private"),              // IPv4-compatible 10.0.0.1
            ("2002:a9fe:a9fe::1", "link-local"), // 6to4 of 169.254.169.254
            ("2002:c0a8:101::", "private"),      // 6to4 of 192.168.1.1
            ("2002:7f00:1::", "loopback"),       // 6to4 of 127.0.0.1
            // Teredo: server 1.1.1.1 public, client 10.0.0.1 (inverted).
            ("2001:0:101:101::f5ff:fffe", "private"),
            // Teredo: server 169.254.169.254, client 1.1.1.1.
            ("2001:0:a9fe:a9fe::fefe:fefe", "link-local"),
            ("64:ff9b:1::a9fe:a9fe", "local-use NAT64"),
            ("64:ff9b:1:ffff::1", "local-use NAT64"),
        ] {
            let got = classify(v6(ip));
            assert!(got.is_some_and(|c| c.contains(class)), "{ip}: {got:?}");
        }
        // The same forms around public IPv4 addresses stay public.
        for ip in ["::101:101", "2002:101:101::1", "2001:0:101:101::fefe:fefe"] {
            assert_eq!(classify(v6(ip)), None, "{ip}");
        }
        assert_eq!(canonical(v6("2002:a9fe:a9fe::1")), IpAddr::from([169, 254, 169, 254]));
        assert_eq!(canonical(v6("::a9fe:a9fe")), IpAddr::from([169, 254, 169, 254]));
        assert_eq!(canonical(v6("2001:0:101:101::f5ff:fffe")), IpAddr::from([10, 0, 0, 1]));
    }

    #[test]
    fn link_local_and_metadata_addresses_are_named_in_every_form() {
        for ip in ["169.254.169.254", "169.254.1.1", "100.100.100.200", "168.63.129.16"] {
            assert!(check_not_link_local(ip.parse().unwrap()).is_err(), "{ip}");
        }
        for ip in [
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::a9fe:a9fe",
            "2002:a9fe:a9fe::",
        ] {
            assert!(check_not_link_local(v6(ip)).is_err(), "{ip}");
        }
        for ip in ["100.100.100.201", "10.0.0.1", "1.1.1.1"] {
            assert!(check_not_link_local(ip.parse().unwrap()).is_ok(), "{ip}");
        }
        assert!(check_not_link_local(v6("fd00:ec2::253")).is_ok());
        assert!(is_link_local_net(&"169.254.169.254/32".parse().unwrap()));
        assert!(is_link_local_net(&"fd00:ec2::254/128".parse().unwrap()));
        assert!(!is_link_local_net(&"169.0.0.0/8".parse().unwrap()));
        assert!(!is_link_local_net(&"10.0.0.0/8".parse().unwrap()));
    }

    /// The host's own addresses are never public, and there are some
    /// (a host_addresses() that returned nothing would pass the rest).
    #[test]
    fn the_hosts_own_addresses_are_never_public() {
        assert!(!host_addresses().is_empty(), "no interface address was read");
        assert!(host_addresses().iter().any(|a| a.is_loopback()));
        for ip in host_addresses() {
            assert!(classify(ip).is_some(), "{ip}");
        }
    }
}
