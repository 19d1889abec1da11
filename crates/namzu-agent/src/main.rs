//! `namzu-agent`: see the library docs. Started by a namzu backend, never by
//! hand in production; the token comes from a file or `NAMZU_AGENT_TOKEN`
//! (which is removed from the environment before any command can inherit it).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use namzu_agent::{AgentConfig, Limits, Listen};

#[derive(Parser)]
#[command(name = "namzu-agent", version, about = "namzu guest agent")]
struct Args {
    /// Build a `local` sandbox from this launch spec and serve inside it
    /// (used by the host library; see `namzu_agent::sandbox`).
    #[arg(long, conflicts_with = "listen")]
    launch: Option<PathBuf>,
    /// unix:PATH, tcp:ADDR:PORT, or fd:N (an inherited connected socket).
    #[arg(long, required_unless_present = "launch")]
    listen: Option<Listen>,
    /// File holding the bind token. Otherwise NAMZU_AGENT_TOKEN is used.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Directories file operations are confined to (repeatable). The first
    /// is the base of relative paths. Default: the working directory.
    #[arg(long = "root")]
    roots: Vec<PathBuf>,
    /// Default working directory of commands. Default: the first root.
    #[arg(long)]
    cwd: Option<PathBuf>,
}

/// Keeps descriptors the starting process left open from reaching commands:
/// marks every fd >= 3 close-on-exec (the launcher closes them outright,
/// since its sandbox init is a fork, not an exec).
fn seal_inherited_fds(close: bool) {
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    let flags = if close { 0 } else { CLOSE_RANGE_CLOEXEC };
    #[allow(unsafe_code)]
    // SAFETY: close_range(2) on fds this process has not opened yet (it runs
    // first thing in main); no Rust object owns any of them.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, flags) };
    if r < 0 {
        tracing::warn!("close_range failed: {}", std::io::Error::last_os_error());
    }
}

fn main() -> ExitCode {
    // Launch mode is told by its first argument; decided before anything opens.
    let launching = std::env::args().any(|a| a == "--launch");
    seal_inherited_fds(launching);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NAMZU_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let args = Args::parse();
    if let Some(spec) = &args.launch {
        // Before any thread exists: the launcher forks.
        let code = namzu_agent::sandbox::launch(spec).map_err(|e| e.to_string())?;
        std::process::exit(code);
    }
    let Some(listen) = args.listen else {
        return Err("--listen is required".into());
    };
    let token = match (&args.token_file, std::env::var_os("NAMZU_AGENT_TOKEN")) {
        (Some(f), _) => std::fs::read(f).map_err(|e| format!("token file {}: {e}", f.display()))?,
        (None, Some(t)) => t.into_encoded_bytes(),
        (None, None) => return Err("no bind token: pass --token-file or set NAMZU_AGENT_TOKEN".into()),
    };
    // Still single-threaded here: no other thread can be reading the
    // environment while it changes.
    std::env::remove_var("NAMZU_AGENT_TOKEN");
    let token = token.trim_ascii().to_vec();
    if token.is_empty() {
        return Err("the bind token is empty".into());
    }
    let limits = Limits::from_env().map_err(|e| e.to_string())?;
    let roots = if args.roots.is_empty() {
        vec![std::env::current_dir().map_err(|e| e.to_string())?]
    } else {
        args.roots
    };
    let default_cwd = args.cwd.unwrap_or_else(|| roots[0].clone());
    let disabled_features = std::env::var("NAMZU_DISABLED_FEATURES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect();
    let cfg = AgentConfig {
        roots,
        default_cwd,
        token,
        limits,
        disabled_features,
        hardening: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(namzu_agent::serve(cfg, listen)).map_err(|e| e.to_string())
}
