//! The conformance suite on the `host` tier (the agent as a plain child
//! process). Needs `namzu-agent` built beside the test binary
//! (`cargo build --workspace --bins`) or `NAMZU_AGENT_BIN`.

use std::path::PathBuf;
use std::sync::OnceLock;

use namzu::backend::host::HostProvider;
use namzu::Provider;

fn provider() -> namzu::Result<&'static HostProvider> {
    static P: OnceLock<HostProvider> = OnceLock::new();
    if let Some(p) = P.get() {
        return Ok(p);
    }
    let state: PathBuf = std::env::temp_dir().join(format!("namzu-conformance-host-{}", std::process::id()));
    let p = HostProvider::new(state)?;
    Ok(P.get_or_init(|| p))
}

namzu_conformance::conformance_main!("host", |spec| async move { provider()?.create(spec).await });
