//! The conformance suite on the `local` tier: real user, mount, pid, ipc,
//! uts, net and cgroup namespaces, seccomp, landlock, no capabilities.
//! Needs `namzu-agent` built beside the test binary (`cargo build
//! --workspace --bins`) or `NAMZU_AGENT_BIN`.

use std::path::PathBuf;
use std::sync::OnceLock;

use namzu::backend::local::LocalProvider;
use namzu::Provider;

fn provider() -> namzu::Result<&'static LocalProvider> {
    static P: OnceLock<LocalProvider> = OnceLock::new();
    if let Some(p) = P.get() {
        return Ok(p);
    }
    let state: PathBuf = std::env::temp_dir().join(format!("namzu-conformance-local-{}", std::process::id()));
    let p = LocalProvider::new(state)?;
    Ok(P.get_or_init(|| p))
}

// Suspend and the disk limit are the tier's; the disk limit needs root
// (a loop-mounted image), which CI runs as.
namzu_conformance::conformance_main!(
    "local",
    |spec| async move { provider()?.create(spec).await },
    resume = |id: String| async move { provider()?.resume(&id).await },
    disk_limit = nix::unistd::geteuid().is_root()
);
