//! `network show|set`: a running sandbox's egress policy.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::args::NetworkAction;
use crate::fail::Fail;
use crate::providers::connect;

pub async fn run(state_dir: &Option<PathBuf>, id: String, action: NetworkAction) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    match action {
        NetworkAction::Set { network } => {
            if !network.egress_hosts.is_empty()
                || !network.reach_link_local.is_empty()
                || network.egress_max_connections.is_some()
                || network.dns_queries_per_sec.is_some()
            {
                return Err(Fail(
                    "--egress-host, --reach-link-local, --egress-max-connections and --dns-queries-per-sec are set at create; `network set` changes the policy"
                        .into(),
                ));
            }
            let policy = network
                .policy()?
                .ok_or_else(|| Fail("say what to allow: --network, or --allow-host".into()))?;
            sb.network().set_policy(policy).await?;
        }
        NetworkAction::Show => {
            let (config, open) = sb.network().policy().await?;
            let mut v = serde_json::to_value(&config).map_err(|e| Fail(e.to_string()))?;
            v["open_connections"] = serde_json::Value::from(open);
            println!("{}", serde_json::to_string_pretty(&v).map_err(|e| Fail(e.to_string()))?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
