//! `namzu workspace`: the kubernetes tier's persistent workspaces by name
//! — create (or adopt, or resume), list, suspend, resume, and remove —
//! on the cluster kube finds, with the `--kube-*` flags of `namzu create`.
//! A workspace is reached by its name: nothing is recorded here.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::args::KubeArgs;
use crate::fail::Fail;
use namzu::backend::kubernetes::workspace::{Flush, SuspendOptions, DEFAULT_WORKSPACE_TEMPLATE};
use namzu::backend::kubernetes::{KubernetesProvider, Origin, WorkspaceOptions};

/// The workspace verbs.
#[derive(Subcommand)]
pub enum WorkspaceCmd {
    /// Create workspace NAME, or adopt it, or resume it (printing which);
    /// it keeps running after this returns.
    Create {
        name: String,
        #[command(flatten)]
        fence: Fence,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Every workspace in the namespace, without waking any.
    Ls {
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Suspend NAME: flush its disk (unless --no-flush), stop its pod,
    /// keep its disk. Returns once the pod is gone.
    Suspend {
        name: String,
        /// Do not ask the guest to flush first (the standalone suspend:
        /// nothing is dialed).
        #[arg(long = "no-flush")]
        no_flush: bool,
        #[command(flatten)]
        fence: Fence,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Resume NAME: a new pod on the same disk.
    Resume {
        name: String,
        /// Build the new pod from the template as it is now (its image,
        /// limits, env), not the copy the workspace was made with.
        #[arg(long = "refresh-template")]
        refresh_template: bool,
        #[command(flatten)]
        fence: Fence,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Delete NAME and its disk (there is no undo).
    Rm {
        name: String,
        #[command(flatten)]
        fence: Fence,
        #[command(flatten)]
        kube: KubeArgs,
    },
}

/// The holder epoch a write goes under.
#[derive(clap::Args)]
pub struct Fence {
    /// Write under this holder epoch: refused when the workspace is held
    /// at a higher one (another host took it over).
    #[arg(long, value_name = "N")]
    epoch: Option<u64>,
}

async fn provider(state_dir: &Option<PathBuf>, kube: &KubeArgs) -> Result<KubernetesProvider, Fail> {
    if kube.warm_pool.is_some() {
        return Err(Fail(
            "--warm-pool: a workspace is a Sandbox of its own, built from --template (never claimed from a pool)"
                .into(),
        ));
    }
    let mut opts = kube.options();
    opts.template_name = Some(template(kube));
    opts.link_tls = Some(kube.link_tls(state_dir)?);
    Ok(KubernetesProvider::from_env(opts).await?)
}

fn template(kube: &KubeArgs) -> String {
    kube.template
        .clone()
        .unwrap_or_else(|| DEFAULT_WORKSPACE_TEMPLATE.to_owned())
}

fn opened(kube: &KubeArgs, fence: &Fence) -> WorkspaceOptions {
    WorkspaceOptions {
        template: Some(template(kube)),
        epoch: fence.epoch,
        on_flush_notice: Some(std::sync::Arc::new(|n| {
            eprintln!("warning: suspending without a flush: {n:?}")
        })),
        ..Default::default()
    }
}

/// Opens (creates, adopts or resumes) workspace `name` and says which,
/// with the pod and guest it is bound to and whether its pod template is
/// the template's current one.
async fn open(state_dir: &Option<PathBuf>, name: &str, kube: &KubeArgs, w: WorkspaceOptions) -> Result<(), Fail> {
    let p = provider(state_dir, kube).await?;
    let ws = p.workspace(name, w).await?;
    let origin = match ws.origin() {
        Origin::Created => "created",
        Origin::AdoptedRunning => "adopted (already running)",
        Origin::Resumed => "resumed",
    };
    let id = ws.identity().await;
    let template = if ws.template_revision_current() {
        "current"
    } else {
        "behind"
    };
    println!(
        "{name}\t{origin}\tpod {}\tboot {}\ttemplate {template}",
        id.pod_uid.unwrap_or_default(),
        id.boot_id.unwrap_or_default()
    );
    Ok(())
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: WorkspaceCmd) -> Result<ExitCode, Fail> {
    match cmd {
        WorkspaceCmd::Create { name, fence, kube } => open(state_dir, &name, &kube, opened(&kube, &fence)).await?,
        WorkspaceCmd::Resume {
            name,
            refresh_template,
            fence,
            kube,
        } => {
            let w = WorkspaceOptions {
                refresh_pod_template: refresh_template,
                ..opened(&kube, &fence)
            };
            open(state_dir, &name, &kube, w).await?
        }
        WorkspaceCmd::Ls { kube } => {
            let p = provider(state_dir, &kube).await?;
            println!(
                "{:<24} {:<10} {:<20} {:>5} {:<25}",
                "NAME", "MODE", "TEMPLATE", "EPOCH", "MODE CHANGED"
            );
            for w in p.list_workspaces().await? {
                println!(
                    "{:<24} {:<10} {:<20} {:>5} {:<25}",
                    w.name,
                    w.operating_mode,
                    w.template.unwrap_or_default(),
                    w.holder_epoch.map_or("?".to_owned(), |e| e.to_string()),
                    w.mode_changed_at.unwrap_or_else(|| "never".into())
                );
            }
        }
        WorkspaceCmd::Suspend {
            name,
            no_flush,
            fence,
            kube,
        } => {
            let p = provider(state_dir, &kube).await?;
            if no_flush {
                let s = SuspendOptions {
                    epoch: fence.epoch,
                    flush: Flush::Skip,
                    quiesce: None,
                };
                p.suspend_workspace(&name, s).await?;
            } else {
                // Opening a suspended workspace would wake it: one that
                // already is suspended is left as it is.
                // Opening one that does not exist would create it.
                let found = p.list_workspaces().await?.into_iter().find(|w| w.name == name);
                let Some(found) = found else {
                    return Err(Fail(format!("no workspace {name:?} in the namespace")));
                };
                if found.operating_mode != "Suspended" {
                    let ws = p.workspace(&name, opened(&kube, &fence)).await?;
                    ws.suspend(SuspendOptions {
                        epoch: fence.epoch,
                        ..Default::default()
                    })
                    .await?;
                }
            }
            println!("{name}\tsuspended");
        }
        WorkspaceCmd::Rm { name, fence, kube } => {
            let p = provider(state_dir, &kube).await?;
            p.delete_workspace(&name, fence.epoch).await?;
            println!("{name}\tdeleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}
