//! One module per isolation boundary, plus what they share: finding the
//! agent binary, the state directory, and validating a spec.

pub mod cgroup;
pub(crate) mod detached;
pub mod disk;
#[cfg(feature = "docker")]
pub mod docker;
pub mod host;
#[cfg(feature = "kubernetes")]
pub use namzu_kubernetes as kubernetes;
pub mod local;
pub mod microvm;
pub mod procid;
pub(crate) mod state;
pub mod uid_slots;

use std::path::PathBuf;

use crate::error::{Error, Result};
pub(crate) use namzu_core::check::{check_spec, privilege_probe, refuse_unsupported};

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
