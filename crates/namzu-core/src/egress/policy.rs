//! The egress policy: what a sandbox may reach, checked at configuration
//! time (every entry canonicalised or refused by name) and decided per name
//! and per address at connection time.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::addr;
pub use super::refusal::Refusal;

/// Longest DNS name (RFC 1035, without the trailing dot).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;

/// What may leave a sandbox. Default: [`EgressPolicy::NoNetwork`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EgressPolicy {
    /// Nothing leaves, and no name resolves.
    #[default]
    NoNetwork,
    /// Names resolve; no connection leaves.
    DenyAll,
    /// Every destination but the host itself (its loopback and its own
    /// addresses).
    AllowAll,
    /// Only these hosts, each reached only at public addresses.
    Allowlist {
        /// Names the host resolves itself, to these addresses.
        hosts: Vec<HostRule>,
    },
    /// Any public address: never private, loopback, link-local, CGNAT, ULA,
    /// multicast, cloud metadata, the host's own addresses, nor
    /// `except_cidrs`.
    PublicInternet {
        /// Ranges refused besides the non-public ones.
        #[serde(default)]
        except_cidrs: Vec<IpNet>,
    },
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRule {
    /// The host name or domain.
    pub host: HostPattern,
    /// `None`: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
}

/// A canonical host name (lower case, ASCII, IDNs as punycode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostPattern {
    /// `api.example.com`: that name only.
    Exact(String),
    /// `.example.com`: the domain and every name under it.
    Domain(String),
}

/// An entry refused at configuration time; each names the entry as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Egress entry is empty.
    #[error("egress entry {entry:?} is empty")]
    Empty {
        /// The entry as given.
        entry: String,
    },
    /// Egress entry is a URL; give the host name only.
    #[error("egress entry {entry:?} is a URL; give the host name only")]
    Url {
        /// The entry as given.
        entry: String,
    },
    /// Egress entry has a port; give ports separately.
    #[error("egress entry {entry:?} has a port; give ports separately")]
    HostPort {
        /// The entry as given.
        entry: String,
    },
    /// Egress entry is a glob; write .domain for a domain and its subdomains.
    #[error("egress entry {entry:?} is a glob; write .domain for a domain and its subdomains")]
    Glob {
        /// The entry as given.
        entry: String,
    },
    /// Egress entry is an IP address; allowlists hold host names.
    #[error("egress entry {entry:?} is an IP address; allowlists hold host names")]
    IpLiteral {
        /// The entry as given.
        entry: String,
    },
    /// The entry is a public suffix: it would admit every domain under it.
    #[error("egress entry {entry:?} is the public suffix {suffix:?}: it would admit every domain under it")]
    PublicSuffix {
        /// The entry as given.
        entry: String,
        /// The public suffix it is.
        suffix: String,
    },
    /// Egress entry has an empty label.
    #[error("egress entry {entry:?} has an empty label")]
    EmptyLabel {
        /// The entry as given.
        entry: String,
    },
    /// A label of the entry is longer than 63 bytes.
    #[error("egress entry {entry:?}: label {label:?} is longer than {limit} bytes")]
    LabelTooLong {
        /// The entry as given.
        entry: String,
        /// The offending label.
        label: String,
        /// The limit in force.
        limit: usize,
    },
    /// The entry is longer than a host name may be.
    #[error("egress entry {entry:?} is longer than {limit} bytes")]
    NameTooLong {
        /// The entry as given.
        entry: String,
        /// The limit in force.
        limit: usize,
    },
    /// Egress entry has a character a host name cannot.
    #[error("egress entry {entry:?} has a character a host name cannot: {ch:?}")]
    InvalidCharacter {
        /// The entry as given.
        entry: String,
        /// The character.
        ch: char,
    },
    /// A port of the entry is outside 1-65535.
    #[error("egress entry {entry:?}: port {port} is outside 1-65535")]
    Port {
        /// The entry as given.
        entry: String,
        /// The port asked for.
        port: u32,
    },
    /// The entry is not a CIDR range.
    #[error("egress entry {entry:?} is not a CIDR")]
    Cidr {
        /// The entry as given.
        entry: String,
    },
    /// A `reach_link_local` range lies outside link-local and cloud-metadata
    /// space; it may open only those.
    #[error("reach_link_local entry {cidr} is not inside link-local or cloud-metadata space ({reason}); it opens only those")]
    NotLinkLocal {
        /// The range.
        cidr: IpNet,
        /// Why, for humans.
        reason: String,
    },
}

impl EgressPolicy {
    /// An allowlist of these hosts (`api.example.com`, or `.example.com`
    /// for a domain and every name under it), every port.
    pub fn allow_hosts<I, S>(hosts: I) -> Result<Self, PolicyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let hosts = hosts
            .into_iter()
            .map(|h| HostRule::parse(h.as_ref(), None))
            .collect::<Result<_, _>>()?;
        Ok(Self::Allowlist { hosts })
    }
}

impl HostRule {
    /// Parses an allowlist entry (`api.example.com`, `.example.com`) with
    /// optional ports.
    pub fn parse(entry: &str, ports: Option<Vec<u32>>) -> Result<Self, PolicyError> {
        let host = HostPattern::parse(entry)?;
        let ports = match ports {
            None => None,
            Some(ps) => Some(
                ps.into_iter()
                    .map(|p| {
                        u16::try_from(p).ok().filter(|p| *p != 0).ok_or(PolicyError::Port {
                            entry: entry.to_owned(),
                            port: p,
                        })
                    })
                    .collect::<Result<Vec<u16>, _>>()?,
            ),
        };
        Ok(Self { host, ports })
    }

    fn admits_name(&self, name: &str) -> bool {
        match &self.host {
            HostPattern::Exact(h) => name == h,
            HostPattern::Domain(d) => {
                name == d
                    || (name.len() > d.len()
                        && name.ends_with(d.as_str())
                        && name[..name.len() - d.len()].ends_with('.'))
            }
        }
    }

    fn admits(&self, name: &str, port: u16) -> bool {
        self.admits_name(name) && self.ports.as_ref().is_none_or(|ps| ps.contains(&port))
    }
}

impl HostPattern {
    /// Canonicalises an entry or refuses it by name; see [`PolicyError`].
    pub fn parse(entry: &str) -> Result<Self, PolicyError> {
        let own = || entry.to_owned();
        let trimmed = entry.trim();
        if trimmed.is_empty() {
            return Err(PolicyError::Empty { entry: own() });
        }
        if trimmed.contains("://") || trimmed.contains('/') {
            return Err(PolicyError::Url { entry: own() });
        }
        if trimmed.contains(['*', '?', '[', ']']) && trimmed.parse::<IpAddr>().is_err() {
            let bracketed_v6 = trimmed
                .strip_prefix('[')
                .and_then(|r| r.split(']').next())
                .is_some_and(|v| v.parse::<std::net::Ipv6Addr>().is_ok());
            if !bracketed_v6 {
                return Err(PolicyError::Glob { entry: own() });
            }
        }
        if is_ip_literal(trimmed) {
            return Err(PolicyError::IpLiteral { entry: own() });
        }
        if trimmed.contains(':') {
            return Err(PolicyError::HostPort { entry: own() });
        }
        let (domain, name) = match trimmed.strip_prefix('.') {
            Some(rest) => (true, rest),
            None => (false, trimmed),
        };
        let canonical = canonical_name(name).map_err(|e| e.with_entry(entry))?;
        if psl::domain(canonical.as_bytes()).is_none() {
            return Err(PolicyError::PublicSuffix {
                entry: own(),
                suffix: canonical,
            });
        }
        Ok(if domain {
            Self::Domain(canonical)
        } else {
            Self::Exact(canonical)
        })
    }
}

/// `1.2.3.4`, `::1`, `[::1]`, with or without a port.
fn is_ip_literal(s: &str) -> bool {
    if s.parse::<IpAddr>().is_ok() || s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let v6 = s.strip_prefix('[').and_then(|r| r.split(']').next());
    if v6.is_some_and(|v| v.parse::<std::net::Ipv6Addr>().is_ok()) {
        return true;
    }
    s.rsplit_once(':')
        .is_some_and(|(h, p)| p.parse::<u16>().is_ok() && h.parse::<std::net::Ipv4Addr>().is_ok())
}

/// Lower case, no trailing dot, IDNs as punycode; every label checked.
/// Errors carry an empty entry, filled in by the caller.
pub fn canonical_name(name: &str) -> Result<String, PolicyError> {
    let blank = String::new;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err(PolicyError::EmptyLabel { entry: blank() });
    }
    if let Some(ch) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '@' | '#' | '%' | '\\' | '"' | '\'' | ',' | ';'))
    {
        return Err(PolicyError::InvalidCharacter { entry: blank(), ch });
    }
    if name.split('.').any(str::is_empty) {
        return Err(PolicyError::EmptyLabel { entry: blank() });
    }
    let ascii = if name.is_ascii() {
        name.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii(name).map_err(|_| PolicyError::InvalidCharacter {
            entry: blank(),
            ch: name.chars().find(|c| !c.is_ascii()).unwrap_or('?'),
        })?
    };
    if ascii.len() > MAX_NAME_LEN {
        return Err(PolicyError::NameTooLong {
            entry: blank(),
            limit: MAX_NAME_LEN,
        });
    }
    for label in ascii.split('.') {
        if label.is_empty() {
            return Err(PolicyError::EmptyLabel { entry: blank() });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(PolicyError::LabelTooLong {
                entry: blank(),
                label: label.to_owned(),
                limit: MAX_LABEL_LEN,
            });
        }
        if let Some(ch) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(PolicyError::InvalidCharacter { entry: blank(), ch });
        }
    }
    Ok(ascii)
}

impl PolicyError {
    fn with_entry(self, entry: &str) -> Self {
        let e = entry.to_owned();
        match self {
            Self::Empty { .. } => Self::Empty { entry: e },
            Self::Url { .. } => Self::Url { entry: e },
            Self::HostPort { .. } => Self::HostPort { entry: e },
            Self::Glob { .. } => Self::Glob { entry: e },
            Self::IpLiteral { .. } => Self::IpLiteral { entry: e },
            Self::PublicSuffix { suffix, .. } => Self::PublicSuffix { entry: e, suffix },
            Self::EmptyLabel { .. } => Self::EmptyLabel { entry: e },
            Self::LabelTooLong { label, limit, .. } => Self::LabelTooLong { entry: e, label, limit },
            Self::NameTooLong { limit, .. } => Self::NameTooLong { entry: e, limit },
            Self::InvalidCharacter { ch, .. } => Self::InvalidCharacter { entry: e, ch },
            Self::Port { port, .. } => Self::Port { entry: e, port },
            Self::Cidr { .. } => Self::Cidr { entry: e },
            other @ Self::NotLinkLocal { .. } => other,
        }
    }
}

/// Parses `except_cidrs` entries, refusing anything that is not a CIDR.
pub fn parse_cidrs<S: AsRef<str>>(entries: &[S]) -> Result<Vec<IpNet>, PolicyError> {
    entries
        .iter()
        .map(|e| {
            let e = e.as_ref();
            e.trim()
                .parse::<IpNet>()
                .map_err(|_| PolicyError::Cidr { entry: e.to_owned() })
        })
        .collect()
}

impl EgressPolicy {
    /// Validates a policy built by hand (entries parsed elsewhere are
    /// already canonical; this re-checks them).
    pub fn validate(&self) -> Result<(), PolicyError> {
        if let Self::Allowlist { hosts } = self {
            for h in hosts {
                let entry = match &h.host {
                    HostPattern::Exact(n) => n.clone(),
                    HostPattern::Domain(d) => format!(".{d}"),
                };
                let again = HostPattern::parse(&entry)?;
                if again != h.host {
                    return Err(PolicyError::InvalidCharacter { entry, ch: '?' });
                }
                if let Some(ps) = &h.ports {
                    if ps.contains(&0) {
                        return Err(PolicyError::Port { entry, port: 0 });
                    }
                }
            }
        }
        Ok(())
    }

    /// May `name` be resolved?
    pub fn may_resolve(&self, name: &str) -> Result<String, Refusal> {
        if matches!(self, Self::NoNetwork) {
            return Err(Refusal::NoNetwork);
        }
        let canonical = canonical_name(name).map_err(|e| Refusal::BadName {
            host: name.to_owned(),
            reason: e.to_string(),
        })?;
        if let Self::Allowlist { hosts } = self {
            if !hosts.iter().any(|h| h.admits_name(&canonical)) {
                return Err(Refusal::NotAllowlisted { host: canonical });
            }
        }
        Ok(canonical)
    }

    /// May a connection to `host` (a name or an IP literal) at `port` be
    /// attempted? Addresses are checked again by [`Self::may_reach`].
    pub fn may_connect(&self, host: &str, port: u16) -> Result<Target, Refusal> {
        self.may_connect_with(host, port, &[])
    }

    /// [`Self::may_connect`], with the link-local and metadata addresses in
    /// `link_local` reachable.
    pub fn may_connect_with(&self, host: &str, port: u16, link_local: &[IpNet]) -> Result<Target, Refusal> {
        match self {
            Self::NoNetwork => return Err(Refusal::NoNetwork),
            Self::DenyAll => return Err(Refusal::DenyAll),
            _ => {}
        }
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return match self {
                Self::AllowAll | Self::PublicInternet { .. } => {
                    self.may_reach_with(ip, link_local)?;
                    Ok(Target::Address(ip))
                }
                _ => Err(Refusal::IpLiteral { host: host.to_owned() }),
            };
        }
        let name = canonical_name(host).map_err(|e| Refusal::BadName {
            host: host.to_owned(),
            reason: e.to_string(),
        })?;
        if let Self::Allowlist { hosts } = self {
            if !hosts.iter().any(|h| h.admits_name(&name)) {
                return Err(Refusal::NotAllowlisted { host: name });
            }
            if !hosts.iter().any(|h| h.admits(&name, port)) {
                return Err(Refusal::PortNotAllowed { host: name, port });
            }
        }
        Ok(Target::Name(name))
    }

    /// May this address be reached? Under an allowlist and the public
    /// internet every resolved address must be public (a permitted name
    /// resolving inside is DNS rebinding); under allow-all, anything but
    /// the host itself. Under every policy, link-local and cloud-metadata
    /// addresses are refused ([`addr::check_not_link_local`]): only
    /// [`EgressConfig::reach_link_local`](super::EgressConfig) lifts that,
    /// through [`Self::may_reach_with`].
    pub fn may_reach(&self, ip: IpAddr) -> Result<(), Refusal> {
        self.may_reach_with(ip, &[])
    }

    /// [`Self::may_reach`], with the link-local and metadata addresses in
    /// `link_local` reachable (and nothing else they contain).
    pub fn may_reach_with(&self, ip: IpAddr, link_local: &[IpNet]) -> Result<(), Refusal> {
        match self {
            Self::NoNetwork => return Err(Refusal::NoNetwork),
            Self::DenyAll => return Err(Refusal::DenyAll),
            _ => {}
        }
        if let Err(why) = addr::check_not_link_local(ip) {
            let c = addr::canonical(ip);
            return match link_local.iter().any(|n| n.contains(&c)) {
                true => Ok(()),
                false => Err(why),
            };
        }
        match self {
            Self::NoNetwork => Err(Refusal::NoNetwork),
            Self::DenyAll => Err(Refusal::DenyAll),
            Self::AllowAll => addr::check_not_host(ip),
            Self::Allowlist { .. } => addr::check_public(ip),
            Self::PublicInternet { except_cidrs } => {
                addr::check_public(ip)?;
                let ip = addr::canonical(ip);
                match except_cidrs.iter().find(|c| c.contains(&ip)) {
                    Some(cidr) => Err(Refusal::Excepted {
                        address: ip,
                        cidr: *cidr,
                    }),
                    None => Ok(()),
                }
            }
        }
    }

    /// A short name for logs and `namzu network show`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NoNetwork => "no-network",
            Self::DenyAll => "deny-all",
            Self::AllowAll => "allow-all",
            Self::Allowlist { .. } => "allowlist",
            Self::PublicInternet { .. } => "public-internet",
        }
    }
}

/// What a permitted connection goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Connect by name (the host resolves it, checking every address).
    Name(String),
    /// Connect to this address.
    Address(IpAddr),
}

#[cfg(test)]
#[path = "policy_edge_tests.rs"]
mod edge_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn p(s: &str) -> Result<HostPattern, PolicyError> {
        HostPattern::parse(s)
    }

    #[test]
    fn entries_are_canonicalised() {
        assert_eq!(
            p("API.Example.COM").unwrap(),
            HostPattern::Exact("api.example.com".into())
        );
        assert_eq!(
            p("api.example.com.").unwrap(),
            HostPattern::Exact("api.example.com".into())
        );
        assert_eq!(p(".Example.com").unwrap(), HostPattern::Domain("example.com".into()));
        assert_eq!(
            p("bücher.example").unwrap(),
            HostPattern::Exact("xn--bcher-kva.example".into())
        );
        assert_eq!(
            p("食狮.中国").unwrap(),
            HostPattern::Exact("xn--85x722f.xn--fiqs8s".into())
        );
        assert_eq!(p("svc.test").unwrap(), HostPattern::Exact("svc.test".into()));
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        type Is = fn(&PolicyError) -> bool;
        let cases: &[(&str, Is)] = &[
            ("", |e| matches!(e, PolicyError::Empty { .. })),
            ("https://api.example.com", |e| matches!(e, PolicyError::Url { .. })),
            ("api.example.com/v1", |e| matches!(e, PolicyError::Url { .. })),
            ("api.example.com:443", |e| matches!(e, PolicyError::HostPort { .. })),
            ("*.example.com", |e| matches!(e, PolicyError::Glob { .. })),
            ("api?.example.com", |e| matches!(e, PolicyError::Glob { .. })),
            ("10.0.0.1", |e| matches!(e, PolicyError::IpLiteral { .. })),
            ("10.0.0.1:80", |e| matches!(e, PolicyError::IpLiteral { .. })),
            ("::1", |e| matches!(e, PolicyError::IpLiteral { .. })),
            ("[2001:db8::1]", |e| matches!(e, PolicyError::IpLiteral { .. })),
            (
                ".com",
                |e| matches!(e, PolicyError::PublicSuffix { suffix, .. } if suffix == "com"),
            ),
            (
                ".co.uk",
                |e| matches!(e, PolicyError::PublicSuffix { suffix, .. } if suffix == "co.uk"),
            ),
            ("co.uk", |e| matches!(e, PolicyError::PublicSuffix { .. })),
            ("a..example.com", |e| matches!(e, PolicyError::EmptyLabel { .. })),
            ("..example.com", |e| matches!(e, PolicyError::EmptyLabel { .. })),
            ("bad label.example.com", |e| {
                matches!(e, PolicyError::InvalidCharacter { ch: ' ', .. })
            }),
        ];
        for (entry, ok) in cases {
            let e = p(entry).unwrap_err();
            assert!(ok(&e), "{entry:?}: {e:?}");
            let named = match &e {
                PolicyError::Empty { entry }
                | PolicyError::Url { entry }
                | PolicyError::HostPort { entry }
                | PolicyError::Glob { entry }
                | PolicyError::IpLiteral { entry }
                | PolicyError::PublicSuffix { entry, .. }
                | PolicyError::EmptyLabel { entry }
                | PolicyError::InvalidCharacter { entry, .. } => entry.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(&named, entry);
        }
        let long_label = format!("{}.example.com", "a".repeat(64));
        assert!(matches!(
            p(&long_label),
            Err(PolicyError::LabelTooLong { limit: 63, .. })
        ));
        let long_name = format!("{}example.com", "abcdefghi.".repeat(25));
        assert!(matches!(
            p(&long_name),
            Err(PolicyError::NameTooLong { limit: 253, .. })
        ));
        assert!(matches!(
            HostRule::parse("api.example.com", Some(vec![443, 70000])),
            Err(PolicyError::Port { port: 70000, .. })
        ));
        assert!(matches!(
            HostRule::parse("api.example.com", Some(vec![0])),
            Err(PolicyError::Port { port: 0, .. })
        ));
        assert!(matches!(parse_cidrs(&["10.0.0.0/8", "nope"]), Err(PolicyError::Cidr { entry }) if entry == "nope"));
    }

    fn allow(entries: &[&str]) -> EgressPolicy {
        EgressPolicy::Allowlist {
            hosts: entries.iter().map(|e| HostRule::parse(e, None).unwrap()).collect(),
        }
    }

    #[test]
    fn domains_admit_subdomains_and_not_look_alikes() {
        let pol = allow(&[".example.com", "api.other.org"]);
        for ok in [
            "example.com",
            "a.example.com",
            "a.b.example.com",
            "API.Example.com",
            "api.other.org",
        ] {
            assert!(pol.may_connect(ok, 443).is_ok(), "{ok}");
            assert!(pol.may_resolve(ok).is_ok(), "{ok}");
        }
        for no in [
            "evil-example.com",
            "example.com.evil.net",
            "notexample.com",
            "other.org",
            "x.api.other.org",
        ] {
            assert!(
                matches!(pol.may_connect(no, 443), Err(Refusal::NotAllowlisted { .. })),
                "{no}"
            );
            assert!(pol.may_resolve(no).is_err(), "{no}");
        }
        assert!(matches!(
            pol.may_connect("10.0.0.1", 443),
            Err(Refusal::IpLiteral { .. })
        ));
    }

    #[test]
    fn ports_narrow_a_host() {
        let pol = EgressPolicy::Allowlist {
            hosts: vec![HostRule::parse("api.example.com", Some(vec![443])).unwrap()],
        };
        assert!(pol.may_connect("api.example.com", 443).is_ok());
        assert!(matches!(
            pol.may_connect("api.example.com", 80),
            Err(Refusal::PortNotAllowed { port: 80, .. })
        ));
    }

    #[test]
    fn each_kind_decides_as_documented() {
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let private: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(EgressPolicy::default(), EgressPolicy::NoNetwork);
        assert!(matches!(
            EgressPolicy::NoNetwork.may_resolve("a.example.com"),
            Err(Refusal::NoNetwork)
        ));
        assert!(EgressPolicy::DenyAll.may_resolve("a.example.com").is_ok());
        assert!(matches!(
            EgressPolicy::DenyAll.may_connect("a.example.com", 443),
            Err(Refusal::DenyAll)
        ));
        assert!(EgressPolicy::AllowAll.may_connect("10.1.2.3", 22).is_ok());
        assert!(EgressPolicy::AllowAll.may_reach(private).is_ok());
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(matches!(
            EgressPolicy::AllowAll.may_reach(loopback),
            Err(Refusal::Address { class: "loopback", .. })
        ));
        assert!(matches!(
            EgressPolicy::AllowAll.may_connect("::1", 22),
            Err(Refusal::Address { .. })
        ));
        let pi = EgressPolicy::PublicInternet {
            except_cidrs: parse_cidrs(&["93.184.0.0/16"]).unwrap(),
        };
        assert!(matches!(pi.may_reach(public), Err(Refusal::Excepted { .. })));
        assert!(matches!(pi.may_connect("10.1.2.3", 80), Err(Refusal::Address { .. })));
        let pi = EgressPolicy::PublicInternet { except_cidrs: vec![] };
        assert!(pi.may_connect("93.184.216.34", 80).is_ok());
        assert!(matches!(pi.may_reach(private), Err(Refusal::Address { .. })));
        // DNS rebinding: an allowlisted name resolving inside is refused.
        assert!(matches!(
            allow(&["a.example.com"]).may_reach(private),
            Err(Refusal::Address { .. })
        ));
    }

    #[test]
    fn policies_round_trip_through_json() {
        let pol = EgressPolicy::Allowlist {
            hosts: vec![
                HostRule::parse(".example.com", None).unwrap(),
                HostRule::parse("api.other.org", Some(vec![443])).unwrap(),
            ],
        };
        let text = serde_json::to_string(&pol).unwrap();
        assert_eq!(serde_json::from_str::<EgressPolicy>(&text).unwrap(), pol);
        assert!(pol.validate().is_ok());
        let forged = EgressPolicy::Allowlist {
            hosts: vec![HostRule {
                host: HostPattern::Domain("com".into()),
                ports: None,
            }],
        };
        assert!(matches!(forged.validate(), Err(PolicyError::PublicSuffix { .. })));
    }

    /// Audit item 2: link-local and metadata addresses are refused under
    /// every policy, allow-all included, in every form; the opt-in opens
    /// exactly what it names, and never under deny-all.
    #[test]
    fn link_local_and_metadata_need_the_opt_in_under_every_policy() {
        let pi = EgressPolicy::PublicInternet { except_cidrs: vec![] };
        let policies = [EgressPolicy::AllowAll, pi.clone(), allow(&["a.example.com"])];
        let targets = [
            "169.254.169.254",
            "169.254.1.1",
            "100.100.100.200",
            "168.63.129.16",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:169.254.169.254",
            "2002:a9fe:a9fe::",
        ];
        for p in &policies {
            for t in targets {
                let ip: IpAddr = t.parse().unwrap();
                assert!(
                    matches!(p.may_reach(ip), Err(Refusal::Address { .. })),
                    "{} reached {t}",
                    p.kind()
                );
            }
        }
        for lit in ["169.254.169.254", "[fd00:ec2::254]", "100.100.100.200"] {
            assert!(EgressPolicy::AllowAll.may_connect(lit, 80).is_err(), "{lit}");
        }
        let opt_in: Vec<IpNet> = vec!["169.254.169.254/32".parse().unwrap()];
        let imds: IpAddr = "169.254.169.254".parse().unwrap();
        for p in &policies {
            assert!(p.may_reach_with(imds, &opt_in).is_ok(), "{}", p.kind());
            assert!(p.may_reach_with("169.254.1.1".parse().unwrap(), &opt_in).is_err());
            assert!(p.may_reach_with("10.0.0.1".parse().unwrap(), &opt_in).is_err() || *p == EgressPolicy::AllowAll);
        }
        assert!(EgressPolicy::AllowAll
            .may_connect_with("169.254.169.254", 80, &opt_in)
            .is_ok());
        assert!(pi.may_connect_with("169.254.169.254", 80, &opt_in).is_ok());
        assert_eq!(
            EgressPolicy::DenyAll.may_reach_with(imds, &opt_in),
            Err(Refusal::DenyAll)
        );
        assert_eq!(
            EgressPolicy::NoNetwork.may_reach_with(imds, &opt_in),
            Err(Refusal::NoNetwork)
        );

        let mut cfg = super::super::EgressConfig {
            policy: EgressPolicy::AllowAll,
            reach_link_local: opt_in,
            ..Default::default()
        };
        assert!(cfg.validate().is_ok());
        assert!(cfg.may_reach(imds).is_ok());
        cfg.reach_link_local = vec!["10.0.0.0/8".parse().unwrap()];
        assert!(matches!(cfg.validate(), Err(PolicyError::NotLinkLocal { .. })));
        cfg.reach_link_local = vec!["169.0.0.0/8".parse().unwrap()];
        assert!(matches!(cfg.validate(), Err(PolicyError::NotLinkLocal { .. })));
    }
}
