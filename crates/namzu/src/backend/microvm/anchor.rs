//! The VM's anchor (`namzu-vmm`): one host process per microVM, the
//! process the state directory records, as the local tier's launcher is.
//!
//! It starts the VMM with two connected sockets it keeps the other ends
//! of: the guest's serial console (copied into `console.log`, bounded and
//! rotated, so a guest that prints without end cannot fill the host's
//! disk) and the link port. Once the agent in the guest says it serves
//! (`namzu_proto::mux`), it binds `agent.sock` (0600) in the state
//! directory and carries each connection there as one stream of the
//! port: every tier's host code dials a unix socket and presents the token,
//! and so does this one. The VMM gets SIGKILL if the anchor dies; SIGTERM
//! to the anchor stops the VMM and removes the sockets.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::run_state::{RunState, RUN_SOCKET};

/// What the anchor runs, written by the provider as `anchor.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnchorSpec {
    /// The VMM binary and its arguments; the link socket is fd 3 and the
    /// console fd 4 in the VMM.
    pub argv: Vec<String>,
    /// The sandbox's state directory (agent.sock and console.log go here).
    pub dir: PathBuf,
    /// Bytes of console kept: `console.log` is rotated to
    /// `console.log.1` when it would pass this.
    pub console_max_bytes: u64,
    /// Limits of the link multiplexer.
    pub max_links: usize,
    /// How the VMM process is confined on the host.
    pub jail: super::jail::JailSpec,
    /// A memory snapshot to restore (the VMM's command line reads it on
    /// [`INCOMING_FD`]); the anchor opens it, the confined VMM need not
    /// see it.
    #[serde(default)]
    pub incoming: Option<PathBuf>,
    /// The VMM's QMP socket: with it the anchor serves the VM's run state
    /// (pause and continue, [`super::run_state`]).
    #[serde(default)]
    pub qmp: Option<PathBuf>,
}

/// The file descriptors the VMM finds its sockets on.
pub const LINK_FD: i32 = 3;
/// See [`LINK_FD`].
pub const CONSOLE_FD: i32 = 4;
/// The control port's socket (`namzu_proto::mux_sync`).
pub const CONTROL_FD: i32 = 5;
/// The memory snapshot a restoring VMM reads (`-incoming fd:6`).
pub const INCOMING_FD: i32 = 6;
/// Bytes skipped at most before the guest's session marker: an old
/// session's frames still in the port (each stream's window, at most).
const MAX_SKIP_BYTES: usize = 1 << 30;

/// Runs the anchor for the spec at `path` until the VM ends; the exit code
/// is the process's.
pub fn run(path: &Path) -> i32 {
    let spec: AnchorSpec = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{}: {e}", path.display());
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("runtime: {e}");
            return 2;
        }
    };
    match rt.block_on(anchor(spec)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e}");
            2
        }
    }
}

async fn anchor(spec: AnchorSpec) -> std::io::Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    let (link_host, link_vmm) = std::os::unix::net::UnixStream::pair()?;
    let (con_host, con_vmm) = std::os::unix::net::UnixStream::pair()?;
    let (ctl_host, ctl_vmm) = std::os::unix::net::UnixStream::pair()?;
    let mut fds: Vec<(OwnedFd, i32)> = vec![
        (link_vmm.into(), LINK_FD),
        (con_vmm.into(), CONSOLE_FD),
        (ctl_vmm.into(), CONTROL_FD),
    ];
    if let Some(mem) = &spec.incoming {
        fds.push((std::fs::File::open(mem)?.into(), INCOMING_FD));
    }
    // Read before the VMM starts: what this host's session will demand.
    let token = std::fs::read(spec.dir.join("token"))?;
    let mut child = spawn_vmm(&spec, fds)?;
    let console = tokio::spawn(copy_console(
        con_host,
        spec.dir.join("console.log"),
        spec.console_max_bytes,
    ));
    link_host.set_nonblocking(true)?;
    let link = tokio::net::UnixStream::from_std(link_host)?;
    ctl_host.set_nonblocking(true)?;
    let (ctl_read, mut ctl) = tokio::net::UnixStream::from_std(ctl_host)?.into_split();
    let limits = namzu_proto::mux::MuxLimits {
        max_streams: spec.max_links,
        ..Default::default()
    };
    let mut term = signal(SignalKind::terminate())?;
    let sock = spec.dir.join("agent.sock");
    let code = tokio::select! {
        st = child.wait() => exit_code(st?),
        _ = term.recv() => stop(&mut child).await,
        _ = state_gone(&spec.dir) => {
            tracing::warn!(dir = %spec.dir.display(), "the sandbox's state is gone: stopping its VM");
            stop(&mut child).await
        }
        served = async {
            // The session is this host's once the guest answered its sync
            // line (a restored guest leaves the session it had).
            let link = start_session(&mut ctl, ctl_read, link, token).await?;
            let (control, ready, _session) = namzu_proto::mux::client(link, limits);
            if ready.await.is_err() {
                // The port closed before the agent said it serves: the VM
                // is ending; its exit tells how.
                return std::future::pending::<std::io::Result<()>>().await;
            }
            let run = match &spec.qmp {
                Some(qmp) => {
                    let run = RunState::new(qmp.clone(), spec.dir.clone(), Box::new(ctl));
                    let listener = bind_socket(&spec.dir.join(RUN_SOCKET))?;
                    tokio::spawn(run.clone().serve(listener));
                    Some(run)
                }
                None => {
                    // Held open for the VM's life: the guest reads the port.
                    tokio::spawn(async move {
                        let _held = ctl;
                        std::future::pending::<()>().await
                    });
                    None
                }
            };
            let listener = bind_socket(&sock)?;
            tracing::info!("the guest's agent serves");
            serve_links(listener, control, run).await
        } => {
            tracing::error!(?served, "link listener ended");
            stop(&mut child).await
        }
    };
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(spec.dir.join(RUN_SOCKET));
    let _ = std::fs::remove_file(spec.dir.join(super::run_state::PAUSED_FILE));
    // The console's last words (a panic, the agent's error) are kept.
    let _ = tokio::time::timeout(Duration::from_secs(2), console).await;
    Ok(code)
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Starts this host's session (`namzu_proto::mux_sync`): the sync line on
/// the control port, then everything up to the guest's marker skipped and
/// the host's marker written. The control port is kept open for the VM's
/// life (the guest reads it for the next host's line).
async fn start_session(
    ctl: &mut tokio::net::unix::OwnedWriteHalf,
    mut ctl_read: tokio::net::unix::OwnedReadHalf,
    link: tokio::net::UnixStream,
    token: Vec<u8>,
) -> std::io::Result<namzu_proto::mux_sync::Rejoined<tokio::net::UnixStream>> {
    use namzu_proto::mux_sync::{marker, now_unix_ns, skip_to, Side, SyncLine};
    let nonce = rand::random::<u64>();
    let unix_ns = now_unix_ns();
    let seed: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
    ctl.write_all(
        &SyncLine {
            nonce,
            unix_ns,
            token,
            seed,
        }
        .encode(),
    )
    .await?;
    // Never closed by the anchor: the guest sees the port stay open.
    tokio::spawn(async move {
        let mut sink = [0u8; 256];
        while matches!(tokio::io::AsyncReadExt::read(&mut ctl_read, &mut sink).await, Ok(n) if n > 0) {}
        std::future::pending::<()>().await;
    });
    let mut link = skip_to(link, &marker(Side::Guest, nonce), MAX_SKIP_BYTES).await?;
    link.write_all(&marker(Side::Host, nonce)).await?;
    Ok(link)
}

/// SIGTERM to the VMM, then SIGKILL if it has not gone in two seconds.
async fn stop(child: &mut tokio::process::Child) -> i32 {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(_)) => 0,
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            0
        }
    }
}

/// Binds a host socket under a temporary name and renames it into place
/// once it listens with its final mode (0600): `agent.sock` appearing
/// means the guest serves and a dial succeeds.
fn bind_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}

/// Resolves when the state directory is gone: a VM whose state was removed
/// behind namzu's back (or whose create failed) is stopped by its own
/// anchor, so no VMM outlives the record that names it.
async fn state_gone(dir: &Path) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !dir.join("anchor.json").exists() {
            return;
        }
    }
}

/// Each host connection becomes one stream of the port, copied both ways
/// until both sides close; what the host sends waits in the anchor while
/// the VM is paused.
async fn serve_links(
    listener: tokio::net::UnixListener,
    control: namzu_proto::mux::Control,
    run: Option<Arc<RunState>>,
) -> std::io::Result<()> {
    while let Some((conn, _)) = namzu_proto::accept::next(|| listener.accept(), "microvm link").await {
        let mut control = control.clone();
        let run = run.clone();
        tokio::spawn(async move {
            match control.open_stream().await {
                Ok(stream) => carry(conn, stream, run).await,
                Err(e) => tracing::warn!("link refused: the port took no new stream: {e}"),
            }
        });
    }
    Ok(())
}

/// Copies one host connection and its stream both ways; bytes from the
/// host go in only while the VM runs.
async fn carry<S>(conn: tokio::net::UnixStream, stream: S, run: Option<Arc<RunState>>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let (mut from_host, mut to_host) = conn.into_split();
    let (mut from_guest, mut to_guest) = tokio::io::split(stream);
    let inward = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match from_host.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(run) = &run {
                run.wait_running().await;
            }
            if to_guest.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_guest.shutdown().await;
    };
    let outward = async {
        let _ = tokio::io::copy(&mut from_guest, &mut to_host).await;
        let _ = to_host.shutdown().await;
    };
    tokio::join!(inward, outward);
}

/// Copies the guest's console into `path`, rotating it at `max` bytes.
async fn copy_console(con: std::os::unix::net::UnixStream, path: PathBuf, max: u64) {
    use tokio::io::AsyncReadExt;
    let Ok(()) = con.set_nonblocking(true) else { return };
    let Ok(mut con) = tokio::net::UnixStream::from_std(con) else {
        return;
    };
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map(tokio::fs::File::from_std)
    };
    let Ok(mut out) = open(&path) else { return };
    let mut written = out.metadata().await.map(|m| m.len()).unwrap_or(0);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match con.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if written + n as u64 > max {
            let _ = out.flush().await;
            let _ = std::fs::rename(&path, path.with_extension("log.1"));
            let Ok(f) = open(&path) else { return };
            out = f;
            written = 0;
        }
        if out.write_all(&buf[..n]).await.is_err() {
            return;
        }
        written += n as u64;
    }
    let _ = out.flush().await;
}

/// Starts the VMM with each of `fds` on its number ([`LINK_FD`],
/// [`CONSOLE_FD`], …), confined as the spec says, killed if the anchor dies.
fn spawn_vmm(spec: &AnchorSpec, fds: Vec<(OwnedFd, i32)>) -> std::io::Result<tokio::process::Child> {
    let Some((bin, args)) = spec.argv.split_first() else {
        return Err(std::io::Error::other("empty VMM command line"));
    };
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(spec.dir.join("vmm.log"))?);
    // Above the numbers they are moved to, so no dup2 overwrites another.
    let held = fds
        .iter()
        .map(|(fd, to)| Ok((rustix::io::fcntl_dupfd_cloexec(fd, 10)?, *to)))
        .collect::<std::io::Result<Vec<_>>>()?;
    drop(fds);
    let moves: Vec<(i32, i32)> = held.iter().map(|(fd, to)| (fd.as_raw_fd(), *to)).collect();
    let jail = spec.jail.clone();
    let prepared = jail.prepare()?;
    let anchor_pid = nix::unistd::getpid().as_raw();
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (dup2, fcntl, prctl and the jail's
    // unshare/setgroups/setgid/setuid/mount syscalls), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            for &(from, to) in &moves {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // dup2 onto the same number keeps CLOEXEC; clear it.
                libc::fcntl(to, libc::F_SETFD, 0);
            }
            prepared.enter()?;
            // After the jail's setuid, which clears it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The anchor may have died before the signal was armed.
            if libc::getppid() != anchor_pid {
                return Err(std::io::Error::other("the anchor is gone"));
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    // The VMM holds its own copies now.
    drop(held);
    Ok(child)
}
