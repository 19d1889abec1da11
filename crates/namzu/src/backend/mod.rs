//! One module per isolation boundary, plus what they share: finding the
//! agent binary, the state directory, and validating a spec.

pub mod cgroup;
pub mod host;
pub mod local;
pub(crate) mod state;

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::sandbox::{SandboxSpec, Tier};

/// Where sandboxes' state lives: `NAMZU_STATE_DIR`, else
/// `$XDG_STATE_HOME/namzu`, else `~/.local/state/namzu`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NAMZU_STATE_DIR") {
        return d.into();
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("namzu");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".local/state/namzu")
}

/// Finds `namzu-agent`: `NAMZU_AGENT_BIN`, then beside the running
/// executable, then one directory up (where cargo puts binaries relative to
/// test executables in `deps/`).
pub fn find_agent_binary() -> Result<PathBuf> {
    let mut searched = Vec::new();
    if let Some(p) = std::env::var_os("NAMZU_AGENT_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("namzu-agent");
            if p.is_file() {
                return Ok(p);
            }
            searched.push(p);
        }
    }
    Err(Error::AgentBinaryNotFound { searched })
}

/// Refuses agent-limit overrides whose name the agent does not know.
pub(crate) fn check_spec(tier: Tier, spec: &SandboxSpec) -> Result<()> {
    for (name, _) in &spec.limits {
        if !namzu_proto::limits::ALL.contains(&name.as_str()) {
            return Err(Error::OptionRefused {
                tier: tier.name().into(),
                option: format!("limits.{name}"),
                reason: format!("unknown limit; known: {}", namzu_proto::limits::ALL.join(", ")),
            });
        }
    }
    if tier == Tier::Host && !spec.binds.is_empty() {
        return Err(Error::OptionRefused {
            tier: tier.name().into(),
            option: "binds".into(),
            reason: "the host tier has no filesystem of its own to bind into".into(),
        });
    }
    for (i, b) in spec.binds.iter().enumerate() {
        let refuse = |field: &str, reason: String| Error::OptionRefused {
            tier: tier.name().into(),
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
    if tier == Tier::Host && spec.image.is_some() {
        return Err(Error::OptionRefused {
            tier: tier.name().into(),
            option: "image".into(),
            reason: "the host tier runs commands on the host's own filesystem".into(),
        });
    }
    if tier == Tier::Host {
        for (set, field) in [
            (spec.resources.memory_bytes.is_some(), "memory_bytes"),
            (spec.resources.cpus.is_some(), "cpus"),
            (spec.resources.pids.is_some(), "pids"),
        ] {
            if set {
                return Err(Error::OptionRefused {
                    tier: tier.name().into(),
                    option: format!("resources.{field}"),
                    reason: "the host tier runs commands as plain host processes and limits nothing".into(),
                });
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Resources;

    #[test]
    fn host_tier_refuses_resource_limits_by_name() {
        let spec = SandboxSpec {
            resources: Resources {
                pids: Some(10),
                ..Default::default()
            },
            ..Default::default()
        };
        match check_spec(Tier::Host, &spec) {
            Err(Error::OptionRefused { option, tier, .. }) => {
                assert_eq!(option, "resources.pids");
                assert_eq!(tier, "host");
            }
            other => panic!("{other:?}"),
        }
        assert!(check_spec(Tier::Local, &spec).is_ok());
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
