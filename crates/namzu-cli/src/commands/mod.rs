//! One module per command (as mini-redis's `cmd/`): this one declares them
//! and dispatches.

mod cp;
mod exec;
mod fs;
mod image;
mod lifecycle;
mod logs;
mod network;
pub mod run_once;
mod sandboxes;
mod serve;
mod sessions;
mod shell;
mod snapshot;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use namzu::Tier;

use crate::args::{parse_kv, parse_ports, parse_signal, ExecArgs, KubeArgs, NetworkAction, ResourceArgs};
use crate::fail::Fail;

#[derive(Subcommand)]
pub enum Cmd {
    /// Create a sandbox, run one command in it, destroy it.
    Run {
        /// Isolation tier.
        #[arg(long, default_value = "local")]
        tier: Tier,
        #[command(flatten)]
        resources: ResourceArgs,
        #[command(flatten)]
        kube: KubeArgs,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Create a sandbox that outlives this process; prints its id.
    Create {
        #[arg(long, default_value = "local")]
        tier: Tier,
        /// KEY=VALUE in every command's environment (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        #[command(flatten)]
        resources: ResourceArgs,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Show or change what may leave a running sandbox.
    Network {
        id: String,
        #[command(subcommand)]
        action: NetworkAction,
    },
    /// Run a command in an existing sandbox.
    Exec {
        id: String,
        /// Start it in a named session that outlives this process and return
        /// at once (read it with `namzu logs`, stop it with `namzu kill`).
        #[arg(long, requires = "session")]
        detach: bool,
        /// Name the command. Without --detach it runs in the foreground as a
        /// detachable execution: if this process dies the command goes on,
        /// and `namzu logs ID NAME --follow` picks it up (Ctrl-C still
        /// cancels it). With --detach, the session's name.
        #[arg(long = "id", value_name = "NAME")]
        session: Option<String>,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Print a detached session's or a named execution's output from an
    /// offset; --follow until it exits, then exit with its code.
    Logs {
        id: String,
        session: String,
        #[arg(long)]
        follow: bool,
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// List a sandbox's sessions.
    Sessions { id: String },
    /// Signal every process of a session (SIGKILL unless --signal says
    /// otherwise, as `docker kill`).
    Kill {
        id: String,
        session: String,
        /// KILL, TERM, INT or HUP.
        #[arg(long, short = 's', default_value = "KILL", value_parser = parse_signal)]
        signal: namzu::SessionSignal,
    },
    /// Cancel a named execution and wait until its kill is confirmed.
    Cancel { id: String, name: String },
    /// Stop every process in a sandbox but its agent: SIGTERM, then SIGKILL
    /// after --grace.
    Quiesce {
        id: String,
        /// Seconds between SIGTERM and SIGKILL.
        #[arg(long, default_value_t = 5.0)]
        grace: f64,
    },
    /// Stop every process in a sandbox but its agent, in place, until
    /// `namzu resume`; nothing new starts in it meanwhile.
    Pause { id: String },
    /// Continue what `namzu pause` stopped, or start a suspended sandbox
    /// again on its kept disk (same id).
    Resume { id: String },
    /// Keep a sandbox on disk under its id, nothing of it running, until
    /// `namzu resume` — from any later process, after a host restart too:
    /// its disk (/workspace, /tmp, /home, /root), and on microvm its memory
    /// as well (its processes go on after the resume).
    Suspend { id: String },
    /// Memory snapshots of running microVM sandboxes, and sandboxes
    /// forked from them: create, fork, ls, rm.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Make a sandbox's workspace durable (sync it to disk).
    Flush {
        id: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
    /// Files inside a sandbox: ls, stat, mkdir, rm, mv on ID:PATH.
    #[command(subcommand)]
    Fs(fs::FsCmd),
    /// Print changes under a directory of a sandbox as they happen, one
    /// line each (`KIND NAME`, a directory's name ending in `/`), until
    /// Ctrl-C or --count events.
    Watch {
        id: String,
        path: PathBuf,
        /// Beneath it too.
        #[arg(long, short = 'r')]
        recursive: bool,
        /// Exit after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Copy a file; write ID:PATH for a path inside a sandbox.
    Cp { src: String, dst: String },
    /// List sandboxes.
    Ls,
    /// An interactive shell (a pty) in a sandbox; exits with the shell's code.
    Shell {
        id: String,
        /// Keep the terminal as a persistent session with this name: this
        /// process dying only detaches it (`namzu attach` resumes it).
        #[arg(long)]
        session: Option<String>,
        /// Command instead of a login shell.
        #[arg(last = true)]
        command: Vec<OsString>,
    },
    /// Attach to a persistent terminal session (replays from --from).
    Attach {
        id: String,
        session: String,
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Forward a local TCP port to a port inside a sandbox (until Ctrl-C).
    PortForward {
        id: String,
        /// LOCAL:REMOTE, e.g. 8080:80; LOCAL 0 picks a free port.
        #[arg(value_parser = parse_ports)]
        ports: (u16, u16),
    },
    /// Manage root filesystem images.
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// Serve the HTTP API (docs/server.md): sandboxes for any language.
    Serve(serve::ServeArgs),
    /// Make an API key for `namzu serve --api-keys`: prints the key on
    /// stdout and the key file's line (its hash) on stderr.
    ApiKey {
        /// The key's owner name.
        name: String,
    },
    /// Remove sandboxes whose agent died, and their leftovers.
    Gc {
        /// Only this tier (default: every tier with local state).
        #[arg(long)]
        tier: Option<Tier>,
    },
    /// Destroy sandboxes.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// The kubernetes tier's operations: headroom, crash recovery.
    #[command(subcommand)]
    Kube(crate::kube::KubeCmd),
    /// The kubernetes tier's persistent workspaces: a named sandbox whose
    /// disk is kept across suspend and resume.
    #[command(subcommand)]
    Workspace(crate::workspace::WorkspaceCmd),
}

/// Runs one command.
pub async fn run(state_dir: Option<PathBuf>, cmd: Cmd) -> Result<ExitCode, Fail> {
    let state_dir = &state_dir;
    match cmd {
        Cmd::Run {
            tier,
            resources,
            kube,
            exec,
        } => exec::run(state_dir, tier, resources, kube, exec).await,
        Cmd::Create {
            tier,
            env,
            resources,
            kube,
        } => exec::create(state_dir, tier, env, resources, kube).await,
        Cmd::Network { id, action } => network::run(state_dir, id, action).await,
        Cmd::Exec {
            id,
            detach,
            session,
            exec,
        } => exec::exec(state_dir, id, detach, session, exec).await,
        Cmd::Logs {
            id,
            session,
            follow,
            from,
        } => logs::run(state_dir, id, session, follow, from).await,
        Cmd::Sessions { id } => sessions::list(state_dir, id).await,
        Cmd::Cancel { id, name } => sessions::cancel(state_dir, id, name).await,
        Cmd::Kill { id, session, signal } => sessions::kill(state_dir, id, session, signal).await,
        Cmd::Quiesce { id, grace } => lifecycle::quiesce(state_dir, id, grace).await,
        Cmd::Flush { id, timeout } => lifecycle::flush(state_dir, id, timeout).await,
        Cmd::Pause { id } => lifecycle::pause(state_dir, id).await,
        Cmd::Resume { id } => lifecycle::resume(state_dir, id).await,
        Cmd::Suspend { id } => lifecycle::suspend(state_dir, id).await,
        Cmd::Snapshot(cmd) => snapshot::run(state_dir, cmd).await,
        Cmd::Fs(cmd) => fs::run(state_dir, cmd).await,
        Cmd::Watch {
            id,
            path,
            recursive,
            count,
        } => fs::watch(state_dir, &id, &path, recursive, count).await,
        Cmd::Cp { src, dst } => cp::run(state_dir, src, dst).await,
        Cmd::Ls => sandboxes::list(state_dir).await,
        Cmd::Kube(cmd) => crate::kube::run(state_dir, cmd).await,
        Cmd::Workspace(cmd) => crate::workspace::run(state_dir, cmd).await,
        Cmd::Shell { id, session, command } => shell::shell(state_dir, id, session, command).await,
        Cmd::Attach { id, session, from } => shell::attach(state_dir, id, session, from).await,
        Cmd::PortForward {
            id,
            ports: (local, remote),
        } => shell::port_forward(state_dir, id, (local, remote)).await,
        Cmd::Image(cmd) => image::run(state_dir, cmd).await,
        Cmd::Serve(args) => serve::serve(state_dir.clone(), args).await,
        Cmd::ApiKey { name } => serve::api_key(&name),
        Cmd::Gc { tier } => sandboxes::gc(state_dir, tier).await,
        Cmd::Rm { ids } => sandboxes::rm(state_dir, ids).await,
    }
}
