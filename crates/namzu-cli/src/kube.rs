//! The kubernetes tier's place in the state directory: a sandbox `namzu
//! create --tier kubernetes` made is recorded as
//! `<state>/kubernetes/<id>.json` — the flags that reach it again (its
//! [`KubeArgs`]) — so
//! `exec`, `ls`, `rm` and every command taking an id find it; and `namzu
//! kube capacity` / `namzu kube release`, the tier's operations.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::args::KubeArgs;
use crate::fail::Fail;

fn dir(state_dir: &Option<PathBuf>) -> PathBuf {
    state_dir
        .clone()
        .unwrap_or_else(namzu::backend::default_state_dir)
        .join("kubernetes")
}

/// Whether `id` can name a record (a plain file name).
fn plain(id: &str) -> bool {
    !id.is_empty() && Path::new(id).file_name() == Some(std::ffi::OsStr::new(id))
}

/// Records sandbox `id`, written whole or not at all.
pub fn record(state_dir: &Option<PathBuf>, id: &str, k: &KubeArgs) -> Result<(), Fail> {
    let d = dir(state_dir);
    std::fs::create_dir_all(&d).map_err(|e| Fail(format!("{}: {e}", d.display())))?;
    let body = serde_json::to_vec_pretty(k).map_err(|e| Fail(e.to_string()))?;
    let tmp = d.join(format!(".{id}.json.tmp"));
    std::fs::write(&tmp, body)
        .and_then(|()| std::fs::rename(&tmp, d.join(format!("{id}.json"))))
        .map_err(|e| Fail(format!("recording {id} in {}: {e}", d.display())))
}

/// The flags sandbox `id` was made with, if it is a recorded kubernetes one.
pub fn recorded(state_dir: &Option<PathBuf>, id: &str) -> Option<KubeArgs> {
    if !plain(id) {
        return None;
    }
    let text = std::fs::read(dir(state_dir).join(format!("{id}.json"))).ok()?;
    serde_json::from_slice::<KubeArgs>(&text).ok()
}

/// Every recorded kubernetes sandbox.
pub fn all(state_dir: &Option<PathBuf>) -> Vec<(String, KubeArgs)> {
    let Ok(rd) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, KubeArgs)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".json").filter(|i| !i.starts_with('.'))?.to_owned();
            recorded(state_dir, &id).map(|k| (id, k))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Forgets sandbox `id` (gone, or given back).
pub fn forget(state_dir: &Option<PathBuf>, id: &str) {
    if plain(id) {
        let _ = std::fs::remove_file(dir(state_dir).join(format!("{id}.json")));
    }
}

/// The tier's operations.
#[derive(Subcommand)]
pub enum KubeCmd {
    /// The warm pool's ready and desired pods, the claims on it, and
    /// namzu's pods not yet running.
    Capacity {
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Crash recovery: give back every claim (or Sandbox) namzu made whose
    /// labels match SELECTOR (a label selector over --claim-label keys).
    Release {
        #[command(flatten)]
        kube: KubeArgs,
        #[arg(long, value_name = "SELECTOR")]
        selector: String,
    },
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: KubeCmd) -> Result<ExitCode, Fail> {
    use namzu::backend::kubernetes::{ops, KubernetesProvider};
    match cmd {
        KubeCmd::Capacity { kube } => {
            let p = KubernetesProvider::from_env(kube.options()).await?;
            let c = ops::read_task_capacity(p.api(), p.options()).await?;
            println!("warm_ready    {}", c.warm_ready);
            println!("warm_desired  {}", c.warm_desired);
            println!("active_claims {}", c.active_claims);
            println!("pending_pods  {}", c.pending_pods);
        }
        KubeCmd::Release { kube, selector } => {
            let p = KubernetesProvider::from_env(kube.options()).await?;
            for name in ops::release_task_sandboxes(p.api(), p.options(), &selector).await? {
                if let Some(id) = name.strip_prefix("namzu-") {
                    forget(state_dir, id);
                }
                println!("{name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
