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

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

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
}

/// The file descriptors the VMM finds its sockets on.
pub const LINK_FD: i32 = 3;
/// See [`LINK_FD`].
pub const CONSOLE_FD: i32 = 4;

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
    let mut child = spawn_vmm(&spec, link_vmm.into(), con_vmm.into())?;
    let console = tokio::spawn(copy_console(
        con_host,
        spec.dir.join("console.log"),
        spec.console_max_bytes,
    ));
    link_host.set_nonblocking(true)?;
    let link = tokio::net::UnixStream::from_std(link_host)?;
    let limits = namzu_proto::mux::MuxLimits {
        max_streams: spec.max_links,
        ..Default::default()
    };
    let (control, ready, _session) = namzu_proto::mux::client(link, limits);
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
            if ready.await.is_err() {
                // The port closed before the agent said it serves: the VM
                // is ending; its exit tells how.
                return std::future::pending::<std::io::Result<()>>().await;
            }
            let listener = namzu_agent_socket(&sock)?;
            tracing::info!("the guest's agent serves");
            serve_links(listener, control).await
        } => {
            tracing::error!(?served, "link listener ended");
            stop(&mut child).await
        }
    };
    let _ = std::fs::remove_file(&sock);
    // The console's last words (a panic, the agent's error) are kept.
    let _ = tokio::time::timeout(Duration::from_secs(2), console).await;
    Ok(code)
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
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

/// Binds the host's socket under a temporary name and renames it into
/// place once it listens with its final mode: `agent.sock` appearing means
/// the guest serves and a dial succeeds.
fn namzu_agent_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_file_name(".agent.tmp");
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
/// until either side closes.
async fn serve_links(listener: tokio::net::UnixListener, control: namzu_proto::mux::Control) -> std::io::Result<()> {
    while let Some((mut conn, _)) = namzu_proto::accept::next(|| listener.accept(), "microvm link").await {
        let mut control = control.clone();
        tokio::spawn(async move {
            match control.open_stream().await {
                Ok(mut stream) => {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut stream).await;
                    let _ = stream.shutdown().await;
                }
                Err(e) => tracing::warn!("link refused: the port took no new stream: {e}"),
            }
        });
    }
    Ok(())
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

/// Starts the VMM with the link on fd 3 and the console on fd 4, confined
/// as the spec says, killed if the anchor dies.
fn spawn_vmm(spec: &AnchorSpec, link: OwnedFd, console: OwnedFd) -> std::io::Result<tokio::process::Child> {
    let Some((bin, args)) = spec.argv.split_first() else {
        return Err(std::io::Error::other("empty VMM command line"));
    };
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(spec.dir.join("vmm.log"))?);
    // Above the numbers they are moved to, so neither dup2 overwrites the other.
    let link = rustix::io::fcntl_dupfd_cloexec(&link, 10)?;
    let console = rustix::io::fcntl_dupfd_cloexec(&console, 10)?;
    let (link_fd, con_fd) = (link.as_raw_fd(), console.as_raw_fd());
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
            for (from, to) in [(link_fd, LINK_FD), (con_fd, CONSOLE_FD)] {
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
    drop(link);
    drop(console);
    Ok(child)
}
