//! `namzu-egress`: the egress supervisor of one sandbox (see
//! `namzu::egress::supervisor`), beside the library it runs. Started by
//! the provider that created the sandbox, detached from it; prints `ready`
//! once it holds the agent's `Egress` call, logs every decision to stderr,
//! and exits when the sandbox is gone.
//!
//! It reaches its sandbox's agent through the factory's provider and
//! [`Provider::agent_link`], from the state directory alone: never through
//! `connect`, which would start the supervisor check this process is
//! itself answering.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use namzu::{Provider, Tier};

const USAGE: &str = "usage: namzu-egress --state-dir DIR --tier local|docker|microvm --id ID";

/// The arguments the spawning provider passes.
struct Args {
    /// The state directory the sandbox's provider uses.
    state_dir: PathBuf,
    /// local or docker.
    tier: String,
    id: String,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = std::ffi::OsString>) -> Result<Self, String> {
        let (mut state_dir, mut tier, mut id) = (None, None, None);
        while let Some(flag) = argv.next() {
            let value = argv.next().ok_or_else(|| format!("{flag:?} needs a value"))?;
            match flag.to_str() {
                Some("--state-dir") => state_dir = Some(PathBuf::from(value)),
                Some("--tier") => tier = Some(value.to_string_lossy().into_owned()),
                Some("--id") => id = Some(value.to_string_lossy().into_owned()),
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        match (state_dir, tier, id) {
            (Some(state_dir), Some(tier), Some(id)) => Ok(Self { state_dir, tier, id }),
            _ => Err("--state-dir, --tier and --id are required".into()),
        }
    }
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
    let args = match Args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("namzu-egress: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // One thread: a connection's setup is a chain of small steps (the ask,
    // the connect, the agent's stream, the handoff), and on a worker pool
    // each step woke another thread (measured: time to first byte 0.70-0.80
    // against 0.57-0.61 ms on one). The bytes themselves move in splice(2)
    // and with the client's socket handed over, so one thread is not what
    // bounds a download (0.69x the host's either way).
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
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
    let tier: Tier = args.tier.parse()?;
    if !matches!(tier, Tier::Local | Tier::Docker | Tier::MicroVm) {
        return Err(namzu::Error::OptionRefused {
            tier,
            option: "egress".into(),
            reason: "only local, docker and microvm sandboxes have an egress supervisor".into(),
        });
    }
    let provider: Box<dyn Provider> = namzu::factory::provider(
        tier,
        namzu::factory::ProviderOptions::default().state_dir(&args.state_dir),
    )
    .await?;
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
        || provider.agent_link(&id),
        || {
            let mut out = std::io::stdout();
            let _ = out.write_all(b"ready\n");
            let _ = out.flush();
        },
    )
    .await
}
