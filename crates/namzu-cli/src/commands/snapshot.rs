//! `namzu snapshot`: memory snapshots of running microVM sandboxes, and
//! new sandboxes forked from them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use namzu::Tier;

use crate::fail::Fail;
use crate::providers::{provider, provider_of};

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Save a running sandbox's memory, devices and disk as a snapshot
    /// (it runs on); prints the snapshot's id. microvm only.
    Create { id: String },
    /// Start sandboxes from a snapshot, each on a copy-on-write disk of its
    /// own with its own id and token, its processes going on from where
    /// the snapshot caught them; prints their ids.
    Fork {
        snapshot: String,
        /// How many.
        #[arg(short = 'n', long, default_value_t = 1)]
        count: u32,
    },
    /// List snapshots: id, source, memory and disk bytes, age.
    Ls,
    /// Remove a snapshot (refused while forks' disks overlay it).
    Rm { snapshot: String },
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: SnapshotCmd) -> Result<ExitCode, Fail> {
    match cmd {
        SnapshotCmd::Create { id } => {
            let (_, p) = provider_of(state_dir, &id).await?;
            let bar = crate::ui::spinner(&format!("saving {id}"));
            let info = p.snapshot(&id).await;
            bar.finish_and_clear();
            let info = info?;
            println!("{}", info.id);
            eprintln!(
                "namzu: snapshot of {id}: memory {} MiB, disk {} MiB; `namzu snapshot fork {}` starts one",
                info.memory_bytes >> 20,
                info.disk_bytes >> 20,
                info.id
            );
        }
        SnapshotCmd::Fork { snapshot, count } => {
            let p = provider(state_dir, Tier::MicroVm, None).await?;
            let bar = crate::ui::spinner(&format!("forking {snapshot}"));
            for i in 0..count {
                bar.set_message(format!("forking {snapshot} ({}/{count})", i + 1));
                let sb = p.fork(&snapshot).await;
                let sb = match sb {
                    Ok(sb) => sb,
                    Err(e) => {
                        bar.finish_and_clear();
                        return Err(e.into());
                    }
                };
                // The sandbox outlives this handle, as `namzu create`'s.
                bar.suspend(|| println!("{}", sb.id()));
            }
            bar.finish_and_clear();
        }
        SnapshotCmd::Ls => {
            let p = provider(state_dir, Tier::MicroVm, None).await?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            println!(
                "{:<20} {:<18} {:>10} {:>10} {:>8}",
                "ID", "SOURCE", "MEMORY", "DISK", "AGE"
            );
            for s in p.snapshots().await? {
                println!(
                    "{:<20} {:<18} {:>8}Mi {:>8}Mi {:>7}s",
                    s.id,
                    s.source,
                    s.memory_bytes >> 20,
                    s.disk_bytes >> 20,
                    now.saturating_sub(s.created_unix)
                );
            }
        }
        SnapshotCmd::Rm { snapshot } => {
            let p = provider(state_dir, Tier::MicroVm, None).await?;
            p.delete_snapshot(&snapshot).await?;
            eprintln!("namzu: snapshot {snapshot} removed");
        }
    }
    Ok(ExitCode::SUCCESS)
}
