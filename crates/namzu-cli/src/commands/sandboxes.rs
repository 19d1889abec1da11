//! `ls`, `gc` and `rm`: the sandboxes this state directory knows.

use std::path::PathBuf;
use std::process::ExitCode;

use namzu::Tier;

use crate::fail::Fail;
use crate::providers::{provider, provider_of, used_tiers};

pub async fn list(state_dir: &Option<PathBuf>) -> Result<ExitCode, Fail> {
    println!("{:<18} {:<8} {:<9} CREATED", "ID", "TIER", "STATE");
    for tier in used_tiers(state_dir) {
        for s in provider(state_dir, tier, None).await?.list().await? {
            let state = match (s.alive, s.suspended) {
                (true, _) => "up",
                (false, true) => "suspended",
                (false, false) => "dead",
            };
            println!("{:<18} {:<8} {:<9} {}", s.id, s.tier, state, s.created_unix);
        }
    }
    // Kubernetes sandboxes this state directory made, asked of their
    // cluster once per place they were made in.
    let recorded = crate::kube::all(state_dir);
    let mut places: Vec<crate::args::KubeArgs> = Vec::new();
    for (_, k) in &recorded {
        if !places.contains(k) {
            places.push(k.clone());
        }
    }
    for place in places {
        let listed = match place.provider(state_dir).await {
            Ok(p) => p.list().await,
            Err(e) => Err(namzu::Error::InvalidArgument {
                op: "ls".into(),
                message: e.0,
            }),
        };
        let listed = listed.unwrap_or_else(|e| {
            eprintln!(
                "namzu: kubernetes ({}): {e}",
                place.namespace.as_deref().unwrap_or("default")
            );
            Vec::new()
        });
        for (id, _) in recorded.iter().filter(|(_, k)| *k == place) {
            let (state, created) = match listed.iter().find(|s| &s.id == id) {
                Some(s) => (if s.alive { "up" } else { "down" }, s.created_unix),
                None => ("?", 0),
            };
            println!("{:<18} {:<8} {:<9} {}", id, Tier::Kubernetes, state, created);
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
        let (tier, p) = provider_of(state_dir, &id).await?;
        p.destroy(&id).await?;
        if tier == Tier::Kubernetes {
            crate::kube::forget(state_dir, &id);
        }
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}
