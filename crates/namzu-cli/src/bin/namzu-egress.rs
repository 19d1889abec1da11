//! `namzu-egress`: the egress supervisor of one sandbox (see
//! `namzu::egress::supervisor`). Started by the provider that created the
//! sandbox, detached from it; prints `ready` once it holds the agent's
//! `Egress` call, logs every decision to stderr, and exits when the sandbox
//! is gone.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::backend::local::LocalProvider;
use namzu::{Provider, Tier};

#[derive(Parser)]
#[command(name = "namzu-egress", version, about = "namzu egress supervisor (one per sandbox)")]
struct Args {
    /// The state directory the sandbox's provider uses.
    #[arg(long)]
    state_dir: PathBuf,
    /// local or docker.
    #[arg(long)]
    tier: String,
    #[arg(long)]
    id: String,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NAMZU_EGRESS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> namzu::Result<()> {
    let tier: Tier = args.tier.parse().map_err(|_| namzu::Error::OptionRefused {
        tier: args.tier.clone(),
        option: "egress".into(),
        reason: "only local and docker sandboxes have an egress supervisor".into(),
    })?;
    let provider: Box<dyn Provider> = match tier {
        Tier::Local => Box::new(LocalProvider::with_agent(&args.state_dir, "namzu-agent")),
        Tier::Docker => Box::new(DockerProvider::new(&args.state_dir, DockerOptions::default()).await?),
        other => {
            return Err(namzu::Error::OptionRefused {
                tier: other.name().into(),
                option: "egress".into(),
                reason: "this tier has no egress supervisor".into(),
            })
        }
    };
    let dir = args.state_dir.join(tier.name()).join(&args.id);
    let lock = match namzu::egress::supervisor::claim(&dir) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            tracing::info!(sandbox = %args.id, "another supervisor holds the lock; exiting");
            let mut out = std::io::stdout();
            let _ = out.write_all(b"held\n");
            let _ = out.flush();
            return Ok(());
        }
        Err(source) => {
            return Err(namzu::Error::LocalIo {
                op: "egress supervisor lock".into(),
                source,
            })
        }
    };
    match namzu::egress::supervisor::raise_nofile() {
        Ok(n) => tracing::info!(nofile = n, "open-file limit"),
        Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
    }
    let id = args.id.clone();
    namzu::egress::supervisor::run(
        &args.id,
        &dir,
        lock,
        || async { provider.connect(&id).await.map(|sb| sb.agent().clone()) },
        || {
            let mut out = std::io::stdout();
            let _ = out.write_all(b"ready\n");
            let _ = out.flush();
        },
    )
    .await
}
