//! `namzu-agent launch`: builds a `local` sandbox and becomes its agent.
//!
//! Three processes, each with one job:
//!
//! ```text
//! L  launcher, host credentials. Binds the agent socket, forks C, writes
//!    C's uid/gid maps (only a process outside the new user namespace may
//!    map a range), then supervises: SIGTERM is forwarded to G, and when C
//!    is gone L removes the socket and exits with G's status.
//! C  unshares user, mount, pid, ipc, uts, net and cgroup namespaces, waits
//!    for its maps, becomes root of the new user namespace, forks G, and
//!    waits for it. It dies with L (PDEATHSIG).
//! G  PID 1 of the new pid namespace, root of the user namespace (an
//!    unprivileged id on the host). Builds the root filesystem and pivots
//!    into it ([`rootfs`]), brings up loopback, hardens itself ([`harden`]),
//!    then serves the agent protocol on the socket L bound. Every command
//!    inherits the hardening. When G exits the kernel kills everything
//!    left in the pid namespace.
//! ```
//!
//! Nothing is exec'd between the steps: C and G are forks of L, so the spec,
//! the token and the listening socket travel in memory and by inheritance,
//! and no path outside the sandbox has to be reachable from inside.

pub mod etc;
pub mod harden;
pub mod once;
mod restore;
pub mod rootfs;
pub mod weaken;

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use namzu_proto::launch::{IdMap, LaunchSpec};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::config::{AgentConfig, Limits};
use crate::timeline::mark;

/// A failed step of building the sandbox, named so the host can report it.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("launch spec {path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("{step}: {source}")]
    Os {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("root filesystem: {0}")]
    Rootfs(#[from] rootfs::RootfsError),
    #[error("hardening: {0}")]
    Harden(#[from] harden::HardenError),
    #[error("the sandbox's init did not start")]
    InitLost,
}

fn os(step: &'static str) -> impl Fn(nix::errno::Errno) -> LaunchError {
    move |e| LaunchError::Os { step, source: e.into() }
}

fn io(step: &'static str) -> impl Fn(std::io::Error) -> LaunchError {
    move |source| LaunchError::Os { step, source }
}

/// Runs the launcher. Returns the exit code L should exit with; the forked
/// C and G never return from here.
pub fn launch(spec_path: &Path) -> Result<i32, LaunchError> {
    let raw = std::fs::read(spec_path).map_err(|e| LaunchError::Spec {
        path: spec_path.into(),
        message: e.to_string(),
    })?;
    let spec: LaunchSpec = serde_json::from_slice(&raw).map_err(|e| LaunchError::Spec {
        path: spec_path.into(),
        message: e.to_string(),
    })?;
    let token = std::fs::read(&spec.token_file).map_err(io("read token"))?;
    let token = token.trim_ascii().to_vec();
    // Read here, on the host's side of every mount, before any fork.
    let tls = match (&spec.tcp_tls, &spec.tcp_listen) {
        (Some(files), Some(_)) => Some(files.load().map_err(|e| LaunchError::Spec {
            path: spec_path.into(),
            message: format!("the TCP port's TLS: {e}"),
        })?),
        (Some(_), None) => {
            return Err(LaunchError::Spec {
                path: spec_path.into(),
                message: "tcp_tls without tcp_listen".into(),
            })
        }
        (None, _) => None,
    };
    let link = Link { token, tls };
    mark("launch.spec-read");
    // The host view's /etc, shared read-only by every sandbox while the
    // host's files stay as they are; made here, with host credentials.
    let etc = match (&spec.etc_cache, &spec.rootfs) {
        (Some(cache), None) if !weaken::in_spec(&spec, "etc") => Some(
            etc::cached(Path::new(cache), &spec.hostname, crate::egress::RESOLV_CONF).map_err(io("the shared /etc"))?,
        ),
        _ => None,
    };
    mark("launch.etc-cached");
    let listener = crate::serve::bind_unix(Path::new(&spec.socket)).map_err(io("bind agent socket"))?;

    mark("launch.socket-bound");
    let (to_l_r, to_l_w) = std::os::unix::net::UnixStream::pair().map_err(io("pipe"))?;
    let (to_c_r, to_c_w) = std::os::unix::net::UnixStream::pair().map_err(io("pipe"))?;

    #[allow(unsafe_code)]
    // SAFETY: L is single-threaded here (no runtime, no threads started
    // yet), so the child may run arbitrary code after fork.
    let fork_c = unsafe { fork() }.map_err(os("fork"))?;
    match fork_c {
        ForkResult::Child => {
            drop((to_l_r, to_c_w));
            let serve = |fds: SandboxFds| init_g(&spec, link, listener, fds);
            c_main(&spec, etc.as_deref(), to_l_w, to_c_r, serve)
        }
        ForkResult::Parent { child } => {
            drop((to_l_w, to_c_r, listener));
            supervise(&spec, child, to_l_r, to_c_w)
        }
    }
}

/// L: maps C's ids, then waits for C, forwarding SIGTERM to G.
fn supervise(
    spec: &LaunchSpec,
    c: Pid,
    from_c: std::os::unix::net::UnixStream,
    to_c: std::os::unix::net::UnixStream,
) -> Result<i32, LaunchError> {
    let Some(g) = map_ids(spec, c, from_c, to_c)? else {
        // C failed before forking G; its status says why (logged by C).
        return Ok(wait_exit(c));
    };
    if let Some(path) = &spec.procs_file {
        // Now, while G builds the sandbox on the other core, rather than
        // by the host walking /proc once G serves. The host falls back to
        // that walk should this fail.
        if let Err(e) = write_procs(Path::new(path), &[nix::unistd::getpid(), c, g]) {
            tracing::warn!("launcher: the processes' identities: {e}");
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("supervisor runtime"))?;
    let grace = Duration::from_millis(Limits::from_env().map(|l| l.shutdown_grace_ms).unwrap_or(5_000) + 2_000);
    let code = rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut chld)) = (signal(SignalKind::terminate()), signal(SignalKind::child())) else {
            return wait_exit(c);
        };
        let mut kill_at: Option<tokio::time::Instant> = None;
        loop {
            if let Ok(st) = waitpid(c, Some(WaitPidFlag::WNOHANG)) {
                if let Some(code) = exit_code(st) {
                    return code;
                }
            }
            let deadline = kill_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = term.recv() => {
                    // G is the agent: SIGTERM makes it stop its commands and exit.
                    let _ = kill(g, Signal::SIGTERM);
                    kill_at.get_or_insert(tokio::time::Instant::now() + grace);
                }
                _ = chld.recv() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let _ = kill(g, Signal::SIGKILL);
                    let _ = kill(c, Signal::SIGKILL);
                }
            }
        }
    });
    let _ = std::fs::remove_file(&spec.socket);
    Ok(code)
}

/// Writes the identities of `pids` (pid and start time) to `path`, whole
/// or not at all (a rename).
fn write_procs(path: &Path, pids: &[Pid]) -> std::io::Result<()> {
    let start = |pid: Pid| -> std::io::Result<(u32, u64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Field 22; the command name (field 2) may hold spaces and ')'.
        let start = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(19))
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/stat has no start time")))?;
        Ok((pid.as_raw().unsigned_abs(), start))
    };
    let procs = pids.iter().map(|&p| start(p)).collect::<std::io::Result<Vec<_>>>()?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, namzu_proto::launch::procs_to_text(&procs))?;
    std::fs::rename(&tmp, path)
}

/// L's part of C's start: puts C in the sandbox's cgroups, writes its
/// uid/gid maps once it has unshared, and returns G's pid as C reports it
/// (`None`: C failed before forking G).
fn map_ids(
    spec: &LaunchSpec,
    c: Pid,
    mut from_c: std::os::unix::net::UnixStream,
    mut to_c: std::os::unix::net::UnixStream,
) -> Result<Option<Pid>, LaunchError> {
    for procs in &spec.cgroup_procs {
        std::fs::write(procs, c.as_raw().to_string()).map_err(io("join cgroup"))?;
    }
    to_c.write_all(&[1]).map_err(io("release child"))?;
    let mut b = [0u8; 1];
    from_c.read_exact(&mut b).map_err(io("wait for unshare"))?;
    let proc = PathBuf::from(format!("/proc/{c}"));
    match &spec.map_helpers {
        Some((newuidmap, newgidmap)) => {
            run_map_helper(newuidmap, c, &spec.uid_map)?;
            run_map_helper(newgidmap, c, &spec.gid_map)?;
        }
        None => {
            if spec.deny_setgroups {
                std::fs::write(proc.join("setgroups"), "deny").map_err(io("write setgroups"))?;
            }
            std::fs::write(proc.join("uid_map"), map_text(&spec.uid_map)).map_err(io("write uid_map"))?;
            std::fs::write(proc.join("gid_map"), map_text(&spec.gid_map)).map_err(io("write gid_map"))?;
        }
    }
    to_c.write_all(&[1]).map_err(io("release child"))?;
    let mut pid = [0u8; 4];
    match from_c.read_exact(&mut pid) {
        Ok(()) => Ok(Some(Pid::from_raw(i32::from_le_bytes(pid)))),
        Err(_) => Ok(None),
    }
}

/// `newuidmap PID inside outside count …`: the setuid helper checks the
/// ranges against /etc/subuid (or subgid) and writes the map for us.
fn run_map_helper(helper: &str, pid: Pid, map: &[IdMap]) -> Result<(), LaunchError> {
    let mut cmd = std::process::Command::new(helper);
    cmd.arg(pid.as_raw().to_string());
    for m in map {
        cmd.args([m.inside.to_string(), m.outside.to_string(), m.count.to_string()]);
    }
    let out = cmd.output().map_err(io("run id map helper"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LaunchError::Os {
            step: "id map helper",
            source: std::io::Error::other(format!("{helper}: {}", String::from_utf8_lossy(&out.stderr).trim())),
        })
    }
}

fn map_text(m: &[IdMap]) -> String {
    m.iter()
        .map(|l| format!("{} {} {}\n", l.inside, l.outside, l.count))
        .collect()
}

fn exit_code(st: WaitStatus) -> Option<i32> {
    match st {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

fn wait_exit(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(st) => {
                if let Some(code) = exit_code(st) {
                    return code;
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 125,
        }
    }
}

/// What a peer needs to be let in: the bind token, and the TLS the TCP
/// port is served with.
struct Link {
    token: Vec<u8>,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

/// An `O_PATH` descriptor of directory `path`, a bind source for G.
fn open_dir(path: impl AsRef<Path>, step: &'static str) -> Result<OwnedFd, LaunchError> {
    rustix::fs::open(
        path.as_ref(),
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| LaunchError::Os { step, source: e.into() })
}

/// What C opened for G before the maps took its host credentials away:
/// `O_PATH` descriptors of the workspace, the image, the shared /etc and
/// every bind source, each looked up in the new mount namespace.
pub(crate) struct SandboxFds {
    workspace: OwnedFd,
    image: Option<OwnedFd>,
    etc: Option<OwnedFd>,
    binds: Vec<OwnedFd>,
    /// What a suspend saved, to put back ([`LaunchSpec::restore`]).
    restore: Option<OwnedFd>,
}

/// C's whole life: [`child_c`], then its exit (125 for a failed setup,
/// which it logged).
fn c_main<G>(
    spec: &LaunchSpec,
    etc: Option<&Path>,
    to_l: std::os::unix::net::UnixStream,
    from_l: std::os::unix::net::UnixStream,
    g: G,
) -> !
where
    G: FnOnce(SandboxFds) -> Result<i32, LaunchError>,
{
    let code = match child_c(spec, etc, to_l, from_l, g) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("sandbox setup failed: {e}");
            125
        }
    };
    std::process::exit(code)
}

/// C: enters the new namespaces and starts G, which runs `g` (serve, or
/// run one command) and exits with what it returns.
fn child_c<G>(
    spec: &LaunchSpec,
    etc: Option<&Path>,
    mut to_l: std::os::unix::net::UnixStream,
    mut from_l: std::os::unix::net::UnixStream,
    g: G,
) -> Result<i32, LaunchError>
where
    G: FnOnce(SandboxFds) -> Result<i32, LaunchError>,
{
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(os("pdeathsig"))?;
    let l = nix::unistd::getppid();
    // Wait until L has put us in the sandbox's cgroups: the cgroup namespace
    // made below is rooted wherever we are at that moment.
    let mut gate = [0u8; 1];
    from_l.read_exact(&mut gate).map_err(io("wait for cgroups"))?;
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWCGROUP;
    unshare(flags).map_err(os("unshare namespaces"))?;
    mark("launch.unshared");
    // Opened now: the lookup lands in the new mount namespace (a bind source
    // must belong to it), and the filesystem uid is still the host's, so an
    // owner-only state directory is still traversable.
    let workspace = open_dir(&spec.workspace, "open workspace")?;
    let rootfs = spec
        .rootfs
        .as_ref()
        .map(|path| open_dir(path, "open image rootfs"))
        .transpose()?;
    let etc = etc.map(|path| open_dir(path, "open the shared /etc")).transpose()?;
    let mut binds = Vec::with_capacity(spec.binds.len());
    for b in &spec.binds {
        let fd = rustix::fs::open(
            &b.source,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| LaunchError::Os {
            step: "open bind source",
            source: e.into(),
        })?;
        binds.push(fd);
    }
    let restore = spec
        .restore
        .as_ref()
        .map(|path| {
            rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| LaunchError::Os {
                step: "open what the suspend saved",
                source: e.into(),
            })
        })
        .transpose()?;
    to_l.write_all(&[1]).map_err(io("signal unshare"))?;
    let mut b = [0u8; 1];
    from_l.read_exact(&mut b).map_err(io("wait for id maps"))?;
    mark("launch.id-mapped");
    if !spec.deny_setgroups {
        nix::unistd::setgroups(&[]).map_err(os("setgroups"))?;
    }
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresgid(root_gid, root_gid, root_gid).map_err(os("setresgid"))?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid).map_err(os("setresuid"))?;
    // The credential change cleared the parent-death signal: armed again,
    // and L checked to be still there (had it died in between, nothing
    // would ever send it).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(os("pdeathsig"))?;
    if nix::unistd::getppid() != l {
        return Err(LaunchError::InitLost);
    }

    #[allow(unsafe_code)]
    // SAFETY: C is single-threaded (a fork of the single-threaded L).
    let fork_g = unsafe { fork() }.map_err(os("fork init"))?;
    let fds = SandboxFds {
        workspace,
        image: rootfs,
        etc,
        binds,
        restore,
    };
    match fork_g {
        ForkResult::Child => {
            drop((to_l, from_l));
            let code = match nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(os("pdeathsig"))
                .and_then(|()| g(fds))
            {
                Ok(code) => code,
                Err(e) => {
                    tracing::error!("sandbox init failed: {e}");
                    125
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            // What G took (the listener, the fds) is closed here.
            drop((fds, g));
            let _ = to_l.write_all(&child.as_raw().to_le_bytes());
            Ok(wait_exit(child))
        }
    }
}

/// G's first steps, whatever it then does: the root filesystem built and
/// entered, the hostname set, loopback up.
fn enter(spec: &LaunchSpec, fds: SandboxFds) -> Result<(), LaunchError> {
    mark("launch.init-forked");
    let bind_fds: Vec<BorrowedFd<'_>> = fds.binds.iter().map(|f| f.as_fd()).collect();
    rootfs::build(
        spec,
        fds.workspace.as_fd(),
        fds.image.as_ref().map(|f| f.as_fd()),
        fds.etc.as_ref().map(|f| f.as_fd()),
        &bind_fds,
    )?;
    drop(bind_fds);
    mark("launch.rootfs-pivoted");
    if let Some(saved) = fds.restore {
        // Inside the new root, as its root: whatever the archive holds
        // lands in the sandbox's own tmpfs's and nowhere else.
        restore::unpack(std::fs::File::from(saved)).map_err(io("put back what the suspend saved"))?;
        mark("launch.restored");
    }
    drop((fds.workspace, fds.image, fds.etc, fds.binds));
    nix::unistd::sethostname(&spec.hostname).map_err(os("sethostname"))?;
    harden::loopback_up().map_err(io("bring up loopback"))?;
    Ok(())
}

/// Replaces this process's environment with the one every command
/// inherits: nothing of the host's (but the agent's log filter), a PATH,
/// HOME and LANG, the egress proxy's variables where a proxy serves
/// (`proxy`), and the spec's own.
fn command_env(spec: &LaunchSpec, proxy: bool) {
    let keep: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NAMZU_AGENT_LOG"))
        .collect();
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in keep {
        std::env::set_var(k, v);
    }
    std::env::set_var("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    std::env::set_var("HOME", "/root");
    std::env::set_var("LANG", "C.UTF-8");
    if proxy {
        for (k, v) in crate::egress::proxy_env() {
            std::env::set_var(k, v);
        }
    }
    for (k, v) in &spec.env {
        std::env::set_var(k, v);
    }
}

/// G: builds the sandbox around itself and serves.
fn init_g(spec: &LaunchSpec, link: Link, listener: UnixListener, fds: SandboxFds) -> Result<i32, LaunchError> {
    enter(spec, fds)?;
    // Bound now, while G may still bind port 53.
    let egress = crate::egress::Listeners::bind().map_err(io("bind the egress proxy and resolver"))?;
    mark("launch.network-up");
    let tcp = match &spec.tcp_listen {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr.as_str()).map_err(io("bind the agent's TCP port"))?;
            l.set_nonblocking(true).map_err(io("the agent's TCP port"))?;
            Some(std::sync::Arc::new(l))
        }
        None => None,
    };
    command_env(spec, true);

    let mut limits = Limits::default();
    for (name, value) in &spec.limits {
        limits.set(name, *value);
    }
    let mut report = harden::apply(spec)?;
    mark("launch.hardened");
    // The privilege probe's child, forked now while this process is single
    // threaded and small; Health hands its status to the host.
    let startup_child_status = crate::reaper::probe_child_status_reaped().map_err(io("privilege probe"))?;
    mark("launch.probed");
    report.extend(spec.notes.iter().cloned());
    let cfg = AgentConfig {
        roots: vec!["/workspace".into(), "/".into()],
        default_cwd: "/workspace".into(),
        token: link.token,
        limits,
        // Read after `command_env` set the sandbox's environment.
        disabled_features: crate::config::disabled_features_from_env(),
        hardening: report,
        egress: Some(egress),
        tcp,
        tls: link.tls,
        startup_child_status: Some(startup_child_status),
        dial_back: None,
    };
    let rt = crate::serve::runtime().map_err(io("runtime"))?;
    mark("launch.runtime-built");
    listener.set_nonblocking(true).map_err(io("listener"))?;
    match rt.block_on(crate::serve::serve_listener(cfg, listener)) {
        Ok(()) => Ok(0),
        Err(e) => {
            tracing::error!("agent: {e}");
            Ok(2)
        }
    }
}
