//! Which provider serves a command: by tier, or by finding the sandbox id
//! in the state directory.

use std::path::{Path, PathBuf};

use namzu::backend::docker::DockerOptions;
use namzu::factory::ProviderOptions;
use namzu::{Provider, Sandbox, Tier};

use crate::fail::Fail;
use crate::ui::progress;

/// The provider of `tier`; `runtime` is the docker runtime to create with.
pub async fn provider(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    runtime: Option<String>,
) -> Result<Box<dyn Provider>, Fail> {
    if runtime.is_some() && tier != Tier::Docker {
        return Err(Fail(format!("--runtime applies to --tier docker, not {tier}")));
    }
    if tier == Tier::Kubernetes {
        return Err(Fail(
            "--tier kubernetes needs where to acquire: --kube-namespace with --warm-pool or --template".into(),
        ));
    }
    let opts = ProviderOptions {
        state_dir: state_dir.clone(),
        docker: DockerOptions {
            runtime,
            on_pull: Some(pull_progress()),
            ..Default::default()
        },
        ..Default::default()
    };
    Ok(namzu::factory::provider(tier, opts).await?)
}

/// Draws one bar per image pull on stderr.
fn pull_progress() -> namzu::backend::docker::PullCallback {
    let bar = std::sync::Arc::new(std::sync::Mutex::new(None::<indicatif::ProgressBar>));
    std::sync::Arc::new(move |p: &namzu::backend::docker::PullProgress| {
        let Ok(mut slot) = bar.lock() else { return };
        let b = slot.get_or_insert_with(|| progress(0, "pull"));
        if let (Some(cur), Some(total)) = (p.current, p.total) {
            b.set_length(total);
            b.set_position(cur);
        }
        b.set_message(format!("pull {} {}", p.layer.as_deref().unwrap_or(""), p.status));
        if p.status.starts_with("Status:") {
            b.finish_and_clear();
        }
    })
}

/// The tiers whose sandboxes are recorded in the state directory.
const STATE_TIERS: [Tier; 3] = [Tier::Local, Tier::Host, Tier::Docker];

/// Tiers that have ever made a sandbox in this state directory.
pub fn used_tiers(state_dir: &Option<PathBuf>) -> Vec<Tier> {
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    STATE_TIERS
        .into_iter()
        .filter(|t| *t != Tier::Docker || dir.join(t.name()).is_dir())
        .collect()
}

/// The provider that knows sandbox `id`.
pub async fn provider_of(state_dir: &Option<PathBuf>, id: &str) -> Result<(Tier, Box<dyn Provider>), Fail> {
    if let Some(kube) = crate::kube::recorded(state_dir, id) {
        return Ok((Tier::Kubernetes, kube.provider(state_dir).await?));
    }
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    for tier in STATE_TIERS {
        let known = Path::new(id).file_name() == Some(std::ffi::OsStr::new(id))
            && dir.join(tier.name()).join(id).join("meta.json").is_file();
        if known {
            return Ok((tier, provider(state_dir, tier, None).await?));
        }
    }
    Err(Fail(format!("no sandbox with id {id}")))
}

pub fn warn_host(tier: Tier) {
    if tier == Tier::Host {
        eprintln!("namzu: WARNING: tier host isolates NOTHING; the command runs as you, on this machine");
    }
}

/// The sandbox `id`, reconnected through the provider that knows it.
pub async fn connect(state_dir: &Option<PathBuf>, id: &str) -> Result<Sandbox, Fail> {
    let (_, p) = provider_of(state_dir, id).await?;
    Ok(p.connect(id).await?)
}
