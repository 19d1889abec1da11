//! What every tier checks the same way: a spec's shared rules
//! ([`check_spec`]), a tier's own refusals ([`refuse_unsupported`]), and
//! the privilege probe run before a handle is handed out
//! ([`privilege_probe`]). Tiers call these; nothing here names a tier.

use crate::client::AgentClient;
use crate::error::{Error, Result};
use crate::spec::{SandboxSpec, Tier};

/// Checks a command's view of its own privileges: from the status the
/// link's connect-time Health brought (when it was asked for one), else
/// with a Health call of its own.
pub async fn privilege_probe(id: &str, client: &AgentClient) -> Result<()> {
    let status = match &client.info().child_status {
        s if !s.is_empty() => s.clone(),
        _ => client.probe_child_status().await?,
    };
    unprivileged(&status).map_err(|(field, value)| Error::PrivilegeProbe {
        id: id.into(),
        field,
        value,
    })
}

/// `Err((field, value))` for the first sign of privilege in a
/// `/proc/<pid>/status`: a non-empty capability set, no_new_privs unset, or
/// no seccomp filter.
pub fn unprivileged(status: &str) -> std::result::Result<(), (String, String)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let zero = |v: &str| !v.is_empty() && v.bytes().all(|b| b == b'0');
    for name in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = field(name);
        // A kernel that does not report the ambient set (gVisor) cannot
        // hold one either when nothing is permitted: ambient is a subset
        // of permitted.
        if name == "CapAmb" && v.is_empty() && zero(&field("CapPrm")) {
            continue;
        }
        if !zero(&v) {
            return Err((name.into(), v));
        }
    }
    let mut nnp = field("NoNewPrivs");
    if nnp.is_empty() {
        nnp = field("PrctlNoNewPrivs");
    }
    if nnp != "1" {
        return Err(("NoNewPrivs".into(), nnp));
    }
    let seccomp = field("Seccomp");
    if seccomp != "2" {
        return Err(("Seccomp".into(), seccomp));
    }
    Ok(())
}

/// What every tier checks of a spec: agent-limit names the agent knows,
/// environment variable names, a valid egress configuration, and bind
/// mounts of an existing source onto a clean absolute target outside
/// /proc, /dev and /sys. What a tier cannot honour at all it refuses
/// itself, with [`refuse_unsupported`].
pub fn check_spec(tier: Tier, spec: &SandboxSpec) -> Result<()> {
    for (name, _) in &spec.limits {
        if !namzu_proto::limits::ALL.contains(&name.as_str()) {
            return Err(Error::OptionRefused {
                tier,
                option: format!("limits.{name}"),
                reason: format!("unknown limit; known: {}", namzu_proto::limits::ALL.join(", ")),
            });
        }
    }
    spec.egress.validate()?;
    for (i, b) in spec.binds.iter().enumerate() {
        let refuse = |field: &str, reason: String| Error::OptionRefused {
            tier,
            option: format!("binds[{i}].{field}"),
            reason,
        };
        if let Err(e) = std::fs::metadata(&b.source) {
            return Err(refuse("source", format!("{}: {e}", b.source.display())));
        }
        let clean = b.target.is_absolute()
            && b.target
                .components()
                .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
        if !clean {
            return Err(refuse(
                "target",
                format!("{} must be an absolute path without `..`", b.target.display()),
            ));
        }
        let reserved = ["/proc", "/dev", "/sys"];
        if b.target == std::path::Path::new("/") || reserved.iter().any(|r| b.target.starts_with(r)) {
            return Err(refuse(
                "target",
                format!("{} is managed by the sandbox", b.target.display()),
            ));
        }
    }
    for (k, _) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Error::InvalidArgument {
                op: "create".into(),
                message: format!("invalid environment variable name {k:?}"),
            });
        }
    }
    Ok(())
}

/// The first spec option a tier cannot honour, refused with its name and
/// the tier's reason: each entry is (set in the spec, option, reason).
pub fn refuse_unsupported(tier: Tier, refusals: &[(bool, &str, &str)]) -> Result<()> {
    match refusals.iter().find(|(set, _, _)| *set) {
        Some((_, option, reason)) => Err(Error::OptionRefused {
            tier,
            option: (*option).into(),
            reason: (*reason).into(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HARDENED: &str = "Name:\tsh\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn a_hardened_child_passes() {
        assert_eq!(unprivileged(HARDENED), Ok(()));
    }

    #[test]
    fn any_sign_of_privilege_is_refused_naming_it() {
        let bnd = HARDENED.replace("CapBnd:\t0000000000000000", "CapBnd:\t000001ffffffffff");
        assert_eq!(unprivileged(&bnd), Err(("CapBnd".into(), "000001ffffffffff".into())));
        let nnp = HARDENED.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0");
        assert_eq!(unprivileged(&nnp), Err(("NoNewPrivs".into(), "0".into())));
        let sc = HARDENED.replace("Seccomp:\t2", "Seccomp:\t0");
        assert_eq!(unprivileged(&sc), Err(("Seccomp".into(), "0".into())));
        assert!(unprivileged("").is_err(), "an unreadable status must not pass");
        // A reported ambient set is judged on its own, even beside an
        // empty permitted set (the exemption is for a MISSING CapAmb line).
        let amb = HARDENED.replace("CapAmb:\t0000000000000000", "CapAmb:\t0000000000000400");
        assert_eq!(unprivileged(&amb), Err(("CapAmb".into(), "0000000000000400".into())));
    }

    #[test]
    fn this_unsandboxed_test_process_is_refused() {
        let me = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(unprivileged(&me).is_err());
    }

    /// gVisor's status file has no CapAmb and no NoNewPrivs; the agent
    /// appends the prctl answer, and an empty permitted set bounds ambient.
    #[test]
    fn a_gvisor_child_is_judged_by_what_it_reports() {
        let gvisor = "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nSeccomp:\t2\nPrctlNoNewPrivs:\t1\n";
        assert_eq!(unprivileged(gvisor), Ok(()));
        let nnp = gvisor.replace("PrctlNoNewPrivs:\t1", "PrctlNoNewPrivs:\t0");
        assert_eq!(unprivileged(&nnp), Err(("NoNewPrivs".into(), "0".into())));
        let prm = gvisor.replace("CapPrm:\t0000000000000000", "CapPrm:\t0000000000000001");
        assert_eq!(unprivileged(&prm), Err(("CapPrm".into(), "0000000000000001".into())));
        let no_filter = gvisor.replace("Seccomp:\t2", "Seccomp:\t0");
        assert_eq!(unprivileged(&no_filter), Err(("Seccomp".into(), "0".into())));
    }

    #[test]
    fn unknown_limit_names_are_refused() {
        let spec = SandboxSpec {
            limits: vec![("max_bananas".into(), 1)],
            ..Default::default()
        };
        assert!(
            matches!(check_spec(Tier::Local, &spec), Err(Error::OptionRefused { option, .. }) if option == "limits.max_bananas")
        );
    }
}
