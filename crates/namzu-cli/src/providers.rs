//! Which provider serves a command: by tier, or by finding the sandbox id
//! in the state directory.

use std::path::{Path, PathBuf};

use namzu::backend::docker::DockerOptions;
use namzu::backend::microvm::{MicroVmOptions, Progress};
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
    provider_with(state_dir, tier, runtime, MicroVmOptions::default()).await
}

/// The provider of `tier` for a create: the docker runtime and the microvm
/// flags given are refused by name on any other tier.
pub async fn create_provider(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    resources: &crate::args::ResourceArgs,
) -> Result<Box<dyn Provider>, Fail> {
    if tier != Tier::MicroVm && (resources.kernel.is_some() || resources.accel.is_some()) {
        return Err(Fail(format!(
            "--kernel and --accel apply to --tier microvm, not {tier}"
        )));
    }
    let microvm = MicroVmOptions {
        kernel: resources.kernel.clone(),
        accel: resources.accel.unwrap_or_default(),
        on_progress: Some(microvm_progress()),
        ..Default::default()
    };
    provider_with(state_dir, tier, resources.runtime.clone(), microvm).await
}

/// A spinner line while a microVM's base disk is built; other steps (the
/// accelerator chosen) are printed once.
fn microvm_progress() -> Progress {
    let bar = std::sync::Arc::new(std::sync::Mutex::new(None::<indicatif::ProgressBar>));
    Progress(std::sync::Arc::new(move |what: &str, done: bool| {
        let Ok(mut slot) = bar.lock() else { return };
        match (slot.take(), done) {
            // A step's last word stays on the screen (and is the only line
            // where stderr is no terminal and the spinner draws nothing).
            (b, true) => {
                if let Some(b) = b {
                    b.finish_and_clear();
                }
                eprintln!("microvm: {what}");
            }
            (Some(b), false) => {
                b.set_message(format!("microvm: {what}"));
                *slot = Some(b);
            }
            (None, false) => {
                let b = indicatif::ProgressBar::new_spinner().with_message(format!("microvm: {what}"));
                b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                if b.is_hidden() {
                    eprintln!("microvm: {what}");
                }
                b.enable_steady_tick(std::time::Duration::from_millis(120));
                *slot = Some(b);
            }
        }
    }))
}

async fn provider_with(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    runtime: Option<String>,
    microvm: MicroVmOptions,
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
        microvm,
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
const STATE_TIERS: [Tier; 4] = [Tier::Local, Tier::Host, Tier::Docker, Tier::MicroVm];

/// Tiers that have ever made a sandbox in this state directory.
pub fn used_tiers(state_dir: &Option<PathBuf>) -> Vec<Tier> {
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    STATE_TIERS
        .into_iter()
        .filter(|t| !matches!(t, Tier::Docker | Tier::MicroVm) || dir.join(t.name()).is_dir())
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
