//! `namzu`: run commands in sandboxes from the shell.
//!
//! Sandboxes outlive this process: their state lives in the state directory
//! (`--state-dir`, `NAMZU_STATE_DIR`), and a later `namzu` reconnects to the
//! agent by id. Every failure prints one line to stderr and exits non-zero
//! (125 for namzu's own errors, 2 for bad usage); `run` and `exec` otherwise
//! exit with the command's code, or 128 + signal.

mod args;
mod commands;
mod fail;
mod kube;
mod providers;
mod tty;
mod ui;
mod workspace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::fail::{Fail, EXIT_NAMZU, EXIT_USAGE};

#[derive(Parser)]
#[command(
    name = "namzu",
    version,
    about = "Sandboxes for AI agents: run commands behind an isolation boundary"
)]
struct Cli {
    /// Where sandbox state lives.
    #[arg(long, global = true, env = "NAMZU_STATE_DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: commands::Cmd,
}

fn main() -> ExitCode {
    let started = namzu::timeline::now_ns();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let msg = e.render().to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ");
            eprintln!("namzu: {first} (see namzu --help)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // The directive parser (and its regex engine) only when asked for: a
    // command's start pays for neither otherwise.
    match std::env::var("NAMZU_LOG") {
        Ok(directives) => logs
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(directives)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
            )
            .init(),
        Err(_) => logs.with_max_level(tracing::Level::ERROR).init(),
    }
    tracing::trace!(target: namzu::timeline::TARGET, stage = "cli.main", mono_ns = started);
    // `run` on the local tier with nothing allowed out forks its sandbox
    // from this process: before any runtime, while it has one thread.
    if let commands::Cmd::Run {
        tier,
        resources,
        kube,
        exec,
    } = &cli.cmd
    {
        if commands::run_once::eligible(*tier, resources, kube) {
            namzu::timeline::mark("cli.runtime");
            return finish(commands::run_once::run(&cli.state_dir, resources, exec.clone()));
        }
    }
    // One thread serves every command but the server: nothing else here
    // runs work in parallel, and starting (and at exit joining) worker
    // threads costs a command's start more than it could ever give back.
    let rt = if matches!(cli.cmd, commands::Cmd::Serve(_)) {
        tokio::runtime::Runtime::new()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("namzu: cannot start: {e}");
            return ExitCode::from(EXIT_NAMZU);
        }
    };
    namzu::timeline::mark("cli.runtime");
    finish(rt.block_on(commands::run(cli.state_dir, cli.cmd)))
}

/// The exit code of a command's outcome; a failure's one line printed.
fn finish(outcome: Result<ExitCode, Fail>) -> ExitCode {
    match outcome {
        Ok(code) => {
            namzu::timeline::mark("cli.exit");
            code
        }
        Err(Fail(msg)) => {
            eprintln!("namzu: {msg}");
            ExitCode::from(EXIT_NAMZU)
        }
    }
}
