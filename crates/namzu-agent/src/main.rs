//! `namzu-agent`: see the library docs. Started by a namzu backend, never by
//! hand in production; the token comes from a file or `NAMZU_AGENT_TOKEN`
//! (which is removed from the environment before any command can inherit it).

use std::path::{Path, PathBuf};
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
    #[arg(long, required_unless_present_any = ["launch", "relay", "install", "archive", "unarchive"])]
    listen: Option<Listen>,
    /// Write a tar archive of these directories (repeatable; absolute
    /// paths) to stdout and exit: how the docker tier keeps a suspended
    /// container's tmpfs's (see `namzu_agent::archive`). Run as root with
    /// every process of the sandbox stopped.
    #[arg(long, conflicts_with_all = ["launch", "listen", "relay", "install"])]
    archive: Vec<PathBuf>,
    /// With --archive: the most bytes of file content to write.
    #[arg(long, default_value_t = 1 << 30)]
    archive_limit: u64,
    /// Unpack a tar archive from stdin beneath / and exit, taking only
    /// entries beneath these directories (repeatable).
    #[arg(long, conflicts_with_all = ["launch", "listen", "relay", "install", "archive"])]
    unarchive: Vec<PathBuf>,
    /// Copy this (static) agent to PATH and exit: how a pod's init
    /// container puts the agent into an `emptyDir` the workload container
    /// (any image, no shell needed) then runs it from.
    #[arg(long, conflicts_with_all = ["launch", "listen", "relay"])]
    install: Option<PathBuf>,
    /// With --install: also copy the pod link's `tls.crt` and `tls.key`
    /// from this directory (the init container's Secret mount) …
    #[arg(long, requires_all = ["install", "install_tls_to"])]
    install_tls_from: Option<PathBuf>,
    /// … into this one (mode 0400; the workload's agent removes the key).
    #[arg(long, requires = "install_tls_from")]
    install_tls_to: Option<PathBuf>,
    /// Serve the TCP link with mutual TLS: this certificate (chain) …
    #[arg(long, requires_all = ["tls_key", "tls_client_ca"])]
    tls_cert: Option<PathBuf>,
    /// … this key …
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// … and clients must present a certificate of this CA.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Remove the TLS key file once read (no command can read it later).
    #[arg(long, requires = "tls_key")]
    consume_tls_key: bool,
    /// Join stdin and stdout to the agent listening on unix:PATH, and serve
    /// nothing (a host link through `docker exec`; see `namzu_agent::relay`).
    #[arg(long, conflicts_with_all = ["launch", "listen"])]
    relay: Option<Listen>,
    /// File holding the bind token. Otherwise NAMZU_AGENT_TOKEN is used.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Remove the token file once read, so no command can read it later.
    #[arg(long, requires = "token_file")]
    consume_token: bool,
    /// Run commands as this user (a container's `User`: name, uid,
    /// name:group or uid:gid, resolved in /etc/passwd and /etc/group), and
    /// the agent as a uid of its own, keeping only what it needs to start
    /// and signal them (see `namzu_agent::identity`). Needs to start as
    /// root with CAP_SETUID, CAP_SETGID, CAP_SETPCAP and CAP_KILL.
    #[arg(long)]
    command_user: Option<String>,
    /// Before anything else (with CAP_SYS_ADMIN, dropped after): make every
    /// mount nosuid,nodev and detach /sys (see `namzu_agent::identity`).
    #[arg(long, requires = "command_user")]
    tighten_mounts: bool,
    /// Serve the loopback egress proxy and resolver (the boundary gives the
    /// agent a network namespace of its own): bound first, while the agent
    /// may still bind port 53; commands get the proxy environment; with
    /// --tighten-mounts, /etc/resolv.conf is covered with the agent's.
    #[arg(long)]
    egress: bool,
    /// Detach this mount once the socket is bound (repeatable): the host's
    /// run directory and the agent binary, where the link needs neither.
    /// Besides listening, dial out to every host listener (`*.sock`) in
    /// this directory (see `namzu_agent::dial_back`): for a boundary that
    /// lets a sandbox connect to a host socket but not listen on one.
    #[arg(long, requires = "listen")]
    dial_back: Option<PathBuf>,
    #[arg(long = "hide", requires = "command_user")]
    hide: Vec<PathBuf>,
    /// Install namzu's own seccomp filters (those of the `local` tier) on
    /// the agent and so on every command, stacked on the boundary's own;
    /// needs no_new_privs already set.
    #[arg(long)]
    seccomp: bool,
    /// KEY=VALUE reported in Health's hardening map: what the boundary
    /// that started the agent applied around it (repeatable).
    #[arg(long = "report", value_parser = parse_report)]
    reports: Vec<(String, String)>,
    /// The workspace's raw block device (a Kubernetes block-mode claim):
    /// probed, formatted only when it provably carries no filesystem, and
    /// mounted at the first --root, before every privilege is dropped
    /// (see `namzu_agent::disk`). Needs CAP_SYS_ADMIN (and CAP_CHOWN) to
    /// start with, and --command-user to drop them.
    #[arg(long = "workspace-device", requires_all = ["command_user", "roots"])]
    workspace_device: Option<PathBuf>,
    /// Directories file operations are confined to (repeatable). The first
    /// is the base of relative paths. Default: the working directory.
    #[arg(long = "root")]
    roots: Vec<PathBuf>,
    /// Default working directory of commands. Default: the first root.
    #[arg(long)]
    cwd: Option<PathBuf>,
}

/// The exit status of an `--archive` whose content would pass its limit.
const ARCHIVE_TOO_BIG: i32 = 3;

/// `--archive` (to stdout) or `--unarchive` (from stdin).
fn archive_mode(args: &Args) -> Result<(), String> {
    use std::io::Write;
    let tops = |dirs: &[PathBuf]| -> Vec<String> {
        dirs.iter()
            .map(|d| d.to_string_lossy().trim_matches('/').to_owned())
            .collect()
    };
    if !args.archive.is_empty() {
        let owned = tops(&args.archive);
        let tops: Vec<&str> = owned.iter().map(String::as_str).collect();
        let root = rustix::fs::open(
            "/",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("open /: {e}"))?;
        let out = std::io::BufWriter::new(std::io::stdout().lock());
        let maps = namzu_agent::archive::Maps::default();
        let (mut out, saved) = match namzu_agent::archive::write(&root, &tops, &maps, out, args.archive_limit) {
            Ok(done) => done,
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => {
                // Told apart from every other failure: the host names the limit.
                tracing::error!("archive: {e}");
                std::process::exit(ARCHIVE_TOO_BIG);
            }
            Err(e) => return Err(format!("archive: {e}")),
        };
        out.flush().map_err(|e| format!("archive: {e}"))?;
        tracing::info!(
            entries = saved.entries,
            bytes = saved.bytes,
            skipped = saved.skipped,
            "archived"
        );
        return Ok(());
    }
    let owned = tops(&args.unarchive);
    let tops: Vec<&str> = owned.iter().map(String::as_str).collect();
    let n = namzu_agent::archive::unpack(std::io::stdin().lock(), Path::new("/"), &tops)
        .map_err(|e| format!("unarchive: {e}"))?;
    tracing::info!(entries = n, "unarchived");
    Ok(())
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

/// Copies the running agent to `dest`: written beside it under a temporary
/// name, synced, made read-and-execute only, then renamed into place, so
/// the workload never sees half a binary.
fn install(dest: &Path) -> std::io::Result<()> {
    put(&std::fs::read("/proc/self/exe")?, dest, 0o555)
}

/// The pod link's server files (a `kubernetes.io/tls` Secret's keys),
/// copied from the init container's Secret mount into the volume the
/// workload's agent reads them from (and removes the key from).
fn install_tls(from: &Path, to: &Path) -> std::io::Result<()> {
    for name in ["tls.crt", "tls.key"] {
        let at =
            |d: &Path, e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", d.join(name).display()));
        let bytes = std::fs::read(from.join(name)).map_err(|e| at(from, e))?;
        put(&bytes, &to.join(name), 0o400).map_err(|e| at(to, e))?;
    }
    Ok(())
}

/// Writes `bytes` to `dest` under a temporary name, then renames it into
/// place with `mode`: a reader sees the whole file or none.
fn put(bytes: &[u8], dest: &Path, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = dest
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(".{}.namzu-tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn parse_report(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// The argument the guest kernel passes the agent as its init.
const GUEST_FLAG: &str = "--guest";

fn main() -> ExitCode {
    namzu_agent::timeline::mark("agent.main");
    // Launch mode is told by its first argument; decided before anything opens.
    let launching = std::env::args().any(|a| a == "--launch");
    seal_inherited_fds(launching);
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr);
    // The directive parser (and its regex engine) only when asked for: a
    // sandbox's start pays for neither otherwise.
    match std::env::var("NAMZU_AGENT_LOG") {
        Ok(directives) => logs
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(directives)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .init(),
        Err(_) => logs.with_max_level(tracing::Level::INFO).init(),
    }
    namzu_agent::timeline::mark("agent.logging");
    // `--launch SPEC` alone, how the local tier starts every sandbox, skips
    // clap: building its parser costs a cold process about 0.2 ms, a fifth
    // of this launcher's own start.
    if let [_, flag, spec] = std::env::args_os().collect::<Vec<_>>().as_slice() {
        if flag == "--launch" {
            launch(Path::new(spec));
        }
    }
    // A microVM's init: the kernel starts it as PID 1 with `--guest` (its
    // command line ends `-- --guest`). A container's PID 1 (the docker
    // tier's agent) has its own arguments and is never booted.
    let guest = std::env::args().nth(1).as_deref() == Some(GUEST_FLAG);
    if guest && std::process::id() != 1 {
        tracing::error!("{GUEST_FLAG} is the microVM init's mode: only the guest's PID 1 takes it");
        return ExitCode::from(2);
    }
    let args = if guest {
        match namzu_agent::guest::boot() {
            Ok(argv) => Args::parse_from(argv),
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::from(2);
            }
        }
    } else {
        Args::parse()
    };
    namzu_agent::timeline::mark("agent.args-parsed");
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

/// Builds a `local` sandbox from the spec at `spec` and serves in it;
/// exits with the launcher's code (the forked processes never return).
fn launch(spec: &Path) -> ! {
    // Before any thread exists: the launcher forks.
    match namzu_agent::sandbox::launch(spec) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            tracing::error!("{e}");
            std::process::exit(2)
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if let Some(dest) = &args.install {
        install(dest).map_err(|e| format!("install to {}: {e}", dest.display()))?;
        if let (Some(from), Some(to)) = (&args.install_tls_from, &args.install_tls_to) {
            install_tls(from, to).map_err(|e| format!("install the link's TLS files: {e}"))?;
        }
        return Ok(());
    }
    if !args.archive.is_empty() || !args.unarchive.is_empty() {
        return archive_mode(&args);
    }
    if let Some(spec) = &args.launch {
        launch(spec);
    }
    if let Some(target) = &args.relay {
        let Listen::Unix(path) = target else {
            return Err("--relay takes unix:PATH".into());
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        return rt
            .block_on(namzu_agent::relay::relay(path))
            .map_err(|e| format!("relay to {}: {e}", path.display()));
    }
    let Some(listen) = args.listen else {
        return Err("--listen is required".into());
    };
    // Read (and the key removed) before anything else runs here.
    let tls = match (&args.tls_cert, &args.tls_key, &args.tls_client_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            if !matches!(listen, Listen::Tcp(_)) {
                return Err("--tls-cert serves a tcp: link; this --listen is not one".into());
            }
            let path = |p: &PathBuf| p.to_string_lossy().into_owned();
            let files = namzu_proto::link_tls::ServerFiles {
                cert: path(cert),
                key: path(key),
                client_ca: path(ca),
                consume_key: args.consume_tls_key,
            };
            Some(files.load().map_err(|e| format!("the link's TLS: {e}"))?)
        }
        _ => None,
    };
    let mut reports = args.reports;
    if tls.is_some() {
        reports.push(("link".into(), "mutual-tls".into()));
    }
    if args.tighten_mounts {
        reports.push(("mounts".into(), namzu_agent::identity::tighten_mounts()));
    }
    let egress = if args.egress {
        let l = namzu_agent::egress::Listeners::bind().map_err(|e| format!("egress proxy and resolver: {e}"))?;
        for (k, v) in namzu_agent::egress::proxy_env() {
            std::env::set_var(k, v);
        }
        if args.tighten_mounts {
            reports.push(("resolver".into(), namzu_agent::egress::cover_resolv_conf()));
        }
        Some(l)
    } else {
        None
    };
    let user = match &args.command_user {
        Some(spec) => Some(namzu_agent::identity::resolve_user(spec, Path::new("/")).map_err(|e| e.to_string())?),
        None => None,
    };
    // While every capability is still held: the disk before the drop.
    if let (Some(dev), Some(at)) = (&args.workspace_device, args.roots.first()) {
        let path = std::env::var("PATH").unwrap_or_default();
        let tools = namzu_agent::disk::Tools::find(dev, &path).map_err(|e| e.to_string())?;
        let owner = user.as_ref().map(|u| (u.uid, u.gid));
        let done = namzu_agent::disk::prepare(&tools, dev, at, owner).map_err(|e| e.to_string())?;
        let how = if done.formatted { "formatted" } else { "mounted" };
        reports.push(("workspace-device".into(), format!("{} {how}", done.fstype)));
    }
    // A microVM's guest (its ports given): its clock and random pool are
    // its own to set, by a keeper started while every capability is still
    // held.
    if matches!(listen, Listen::PortFd(_, Some(_))) {
        namzu_agent::port_session::spawn_keeper().map_err(|e| format!("keeper: {e}"))?;
    }
    if let Some(user) = &user {
        namzu_agent::identity::take_agent_ids(user).map_err(|e| e.to_string())?;
    }
    let token = match (&args.token_file, std::env::var_os("NAMZU_AGENT_TOKEN")) {
        (Some(f), _) => {
            let t = std::fs::read(f).map_err(|e| format!("token file {}: {e}", f.display()))?;
            if args.consume_token {
                consume(f).map_err(|e| format!("token file {}: {e}", f.display()))?;
            }
            t
        }
        (None, Some(t)) => t.into_encoded_bytes(),
        (None, None) => return Err("no bind token: pass --token-file or set NAMZU_AGENT_TOKEN".into()),
    };
    // Still single-threaded here: no other thread can be reading the
    // environment while it changes, and ids set now are every thread's.
    std::env::remove_var("NAMZU_AGENT_TOKEN");
    if user.is_none() {
        // The agent and its commands share one uid (a pod's): removing the
        // variable leaves the token in /proc/<pid>/environ (the original
        // environment) and in memory, both open to a same-uid process while
        // the agent is dumpable. Not dumpable, /proc/<pid> is root's.
        // (With --command-user the agent has a uid of its own; see
        // identity.rs for why it stays dumpable there.)
        nix::sys::prctl::set_dumpable(false).map_err(|e| format!("set non-dumpable: {e}"))?;
        reports.push(("dumpable".into(), "no".into()));
    }
    let mut prebound = None;
    if let Some(user) = user {
        // Bound now, as the agent's own uid, so the run directory can be
        // the agent's alone and then hidden.
        if let Listen::Unix(path) = &listen {
            let l = namzu_agent::serve::bind_unix(path).map_err(|e| format!("listen on {}: {e}", path.display()))?;
            prebound = Some(l);
        }
        if !args.hide.is_empty() {
            reports.push(("hidden".into(), namzu_agent::identity::hide_mounts(&args.hide)));
        }
        // The container runs as root (to grant the agent its few
        // capabilities), so its HOME is root's; the user's own is the one
        // a command expects.
        if let (Some(home), Ok("/root")) = (&user.home, std::env::var("HOME").as_deref()) {
            if user.uid != 0 {
                std::env::set_var("HOME", home);
            }
        }
        reports.push((
            "identity".into(),
            namzu_agent::identity::finish(user).map_err(|e| e.to_string())?,
        ));
    }
    if args.seccomp {
        use namzu_agent::sandbox::{harden, weaken};
        let what = if weaken::in_process("probe-bait") {
            weaken::REMOVED.to_owned()
        } else if weaken::in_process("seccomp") {
            harden::apply_allow_all().map_err(|e| e.to_string())?;
            weaken::REMOVED.to_owned()
        } else {
            harden::apply_seccomp().map_err(|e| e.to_string())?
        };
        reports.push(("seccomp.namzu".into(), what));
    }
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
    let mut disabled_features = namzu_agent::config::disabled_features_from_env();
    // Side reads, writes and commands run on a unix socket of the host's; a link
    // that is not one (a VM's multiplexed port, TCP) has no such socket,
    // so the features are not offered there.
    if !matches!(listen, namzu_agent::serve::Listen::Unix(_)) {
        disabled_features.push(namzu_proto::features::FILES_READ_SIDE.to_owned());
        disabled_features.push(namzu_proto::features::FILES_WRITE_SIDE.to_owned());
        disabled_features.push(namzu_proto::features::EXEC_SIDE.to_owned());
    }
    let cfg = AgentConfig {
        roots,
        default_cwd,
        token,
        limits,
        disabled_features,
        hardening: reports,
        egress,
        tcp: None,
        tls,
        startup_child_status: None,
        dial_back: args.dial_back.clone(),
    };
    let rt = namzu_agent::serve::runtime().map_err(|e| e.to_string())?;
    match prebound {
        Some(l) => rt.block_on(namzu_agent::serve_listener(cfg, l)),
        None => rt.block_on(namzu_agent::serve(cfg, listen)),
    }
    .map_err(|e| e.to_string())
}

/// Removes the token file; where the directory does not let the agent
/// (a sticky run directory the host could not give it), empties it
/// instead: either way no command can read the token afterwards.
fn consume(f: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(f) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            std::fs::OpenOptions::new().write(true).truncate(true).open(f).map(drop)
        }
        Err(e) => Err(e),
    }
}
