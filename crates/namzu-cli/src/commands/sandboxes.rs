//! `ls`, `gc` and `rm`: the sandboxes this state directory knows.

use std::path::PathBuf;
use std::process::ExitCode;

use namzu::Tier;

use crate::fail::Fail;
use crate::providers::{provider, provider_of, used_tiers};

pub async fn list(state_dir: &Option<PathBuf>) -> Result<ExitCode, Fail> {
    println!("{:<18} {:<8} {:<6} CREATED", "ID", "TIER", "STATE");
    for tier in used_tiers(state_dir) {
        for s in provider(state_dir, tier, None).await?.list().await? {
            let state = if s.alive { "up" } else { "dead" };
            println!("{:<18} {:<8} {:<6} {}", s.id, s.tier, state, s.created_unix);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn gc(state_dir: &Option<PathBuf>, tier: Option<Tier>) -> Result<ExitCode, Fail> {
    let tiers: Vec<Tier> = match tier {
        Some(t) => vec![t],
        None => used_tiers(state_dir),
    };
    for t in tiers {
        for id in provider(state_dir, t, None).await?.gc().await? {
            println!("{id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn rm(state_dir: &Option<PathBuf>, ids: Vec<String>) -> Result<ExitCode, Fail> {
    for id in ids {
        // Unknown ids are an error here, although destroy itself is
        // idempotent: a typo should not look like success.
        let (_, p) = provider_of(state_dir, &id).await?;
        p.destroy(&id).await?;
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}
