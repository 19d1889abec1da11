//! The kubernetes tier's place in the state directory: a sandbox `namzu
//! create --tier kubernetes` made is recorded as
//! `<state>/kubernetes/<id>.json` — the flags that reach it again (its
//! [`KubeArgs`]) — so
//! `exec`, `ls`, `rm` and every command taking an id find it; `namzu kube
//! link-init`, which makes the pod link's credentials (the host's in
//! `<state>/kubernetes/link`, the cluster's as a manifest to apply); and
//! `namzu kube capacity` / `namzu kube release`, the tier's operations.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::args::KubeArgs;
use crate::fail::Fail;

use crate::args::{kube_state_dir as dir, link_dir};

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
    /// Make the pod link's mutual-TLS credentials: the host's (its key
    /// never leaves it) into --link-dir, and the cluster's ConfigMap and
    /// Secret into a manifest for `kubectl apply -f`. Refuses to replace
    /// credentials already there unless --rotate.
    LinkInit {
        /// The namespace the template's pods run in.
        #[arg(long = "kube-namespace", value_name = "NS")]
        namespace: String,
        /// Where the host's credentials go (default `<state>/kubernetes/link`).
        #[arg(long = "link-dir", value_name = "DIR")]
        link_dir: Option<PathBuf>,
        /// Where the cluster's manifest goes (mode 0600: it holds the
        /// agents' key). Default: `cluster.yaml` in the link dir.
        #[arg(long, value_name = "FILE")]
        manifest: Option<PathBuf>,
        /// Replace existing credentials (every pod must then get the new
        /// Secret: the old agents refuse the new host key).
        #[arg(long)]
        rotate: bool,
    },
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
        KubeCmd::LinkInit {
            namespace,
            link_dir: dir,
            manifest,
            rotate,
        } => {
            let dir = dir.unwrap_or_else(|| link_dir(state_dir));
            let manifest = manifest.unwrap_or_else(|| dir.join("cluster.yaml"));
            link_init(&dir, &manifest, &namespace, rotate)?;
            eprintln!(
                "host credentials in {}; apply the cluster's with: kubectl apply -f {}",
                dir.display(),
                manifest.display()
            );
        }
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

/// Makes and writes the link's credentials (see [`KubeCmd::LinkInit`]).
fn link_init(dir: &Path, manifest: &Path, namespace: &str, rotate: bool) -> Result<(), Fail> {
    use namzu::backend::kubernetes::link::{LinkCredentials, CLIENT_KEY_FILE};
    if !rotate && dir.join(CLIENT_KEY_FILE).exists() {
        return Err(Fail(format!(
            "{} already holds link credentials; --rotate replaces them",
            dir.display()
        )));
    }
    let creds = LinkCredentials::generate().map_err(|e| Fail(e.to_string()))?;
    // The manifest first: a failure leaves the old host credentials, which
    // still match the cluster's.
    creds
        .write_manifest(manifest, namespace)
        .map_err(|e| Fail(e.to_string()))?;
    creds.write_host_dir(dir).map_err(|e| Fail(e.to_string()))
}
