//! Edges the mutation run (scripts/mutants.sh) showed no test pinned:
//! exact length bounds, the characters refused and which one is named, the
//! policy kinds shown to users, and no-network refusing before anything
//! else is looked at.

#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn length_bounds_are_inclusive() {
    let label = "a".repeat(MAX_LABEL_LEN);
    assert_eq!(
        canonical_name(&format!("{label}.example")).unwrap(),
        format!("{label}.example")
    );
    assert!(matches!(
        canonical_name(&format!("a{label}.example")),
        Err(PolicyError::LabelTooLong {
            limit: MAX_LABEL_LEN,
            ..
        })
    ));
    // 253 characters exactly: four 62-character labels and a 1-character one.
    let l62 = "b".repeat(62);
    let name = format!("{l62}.{l62}.{l62}.{l62}.c");
    assert_eq!(name.len(), MAX_NAME_LEN);
    assert_eq!(canonical_name(&name).unwrap(), name);
    assert!(matches!(
        canonical_name(&format!("d{name}")),
        Err(PolicyError::NameTooLong {
            limit: MAX_NAME_LEN,
            ..
        })
    ));
}

#[test]
fn refused_characters_are_named() {
    let ch = |name: &str| match canonical_name(name) {
        Err(PolicyError::InvalidCharacter { ch, .. }) => Some(ch),
        _ => None,
    };
    // A no-break space is refused as itself (IDNA would map it to a space).
    assert_eq!(ch("a\u{a0}b.example"), Some('\u{a0}'));
    assert_eq!(ch("a\u{7}b.example"), Some('\u{7}'));
    assert_eq!(ch("a@b.example"), Some('@'));
    assert_eq!(ch("a+b.example"), Some('+'));
    // What IDNA refuses is named by its first non-ASCII character.
    assert_eq!(ch("ab\u{ffff}.example"), Some('\u{ffff}'));
    // Underscores are allowed (service labels).
    assert_eq!(canonical_name("_dmarc.example").unwrap(), "_dmarc.example");
}

#[test]
fn kinds_are_the_names_users_see() {
    let list = EgressPolicy::Allowlist { hosts: Vec::new() };
    let public = EgressPolicy::PublicInternet {
        except_cidrs: Vec::new(),
    };
    let kinds: Vec<&str> = [
        EgressPolicy::NoNetwork,
        EgressPolicy::DenyAll,
        EgressPolicy::AllowAll,
        list,
        public,
    ]
    .iter()
    .map(EgressPolicy::kind)
    .collect();
    assert_eq!(
        kinds,
        ["no-network", "deny-all", "allow-all", "allowlist", "public-internet"]
    );
}

#[test]
fn no_network_refuses_every_destination_as_no_network() {
    for host in [
        "example.com",
        "93.184.216.34",
        "[2001:db8::1]",
        "localhost",
        "not a name",
    ] {
        assert_eq!(
            EgressPolicy::NoNetwork.may_connect(host, 443).err(),
            Some(Refusal::NoNetwork),
            "{host}"
        );
    }
}
