//! A sandbox starts with no network at all; allow one host live, look at
//! the policy in force, and close it again.
//!
//! ```sh
//! cargo run -p namzu --example egress_allowlist -- pypi.org
//! ```

use namzu::backend::local::LocalProvider;
use namzu::egress::EgressPolicy;
use namzu::{Provider, SandboxSpec};

#[tokio::main]
async fn main() -> namzu::Result<()> {
    let host = std::env::args().nth(1).unwrap_or_else(|| "example.com".into());
    let provider = LocalProvider::new(namzu::backend::default_state_dir())?;
    let sb = provider.create(SandboxSpec::default()).await?;
    let net = sb.network();

    let (config, open) = net.policy().await?;
    println!("at start: {:?} ({open} connections open)", config.policy);

    net.set_policy(EgressPolicy::allow_hosts([host.as_str()])?).await?;
    let (config, _) = net.policy().await?;
    println!("now: {:?}", config.policy);

    // Every command is pointed at the sandbox's egress proxy.
    let out = sb.commands().run("env | grep -i '^https_proxy='").await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));

    net.set_policy(EgressPolicy::NoNetwork).await?;
    sb.destroy().await
}
