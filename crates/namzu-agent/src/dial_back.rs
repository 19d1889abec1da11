//! Dialing the host back: for a boundary that lets a sandbox connect to a
//! host unix socket but not listen on one (gVisor with `--host-uds=open`: a
//! socket bound inside the Sentry never shows on the host).
//!
//! Every host process that wants this agent binds a socket of its own, any
//! name, in a directory both see (`--dial-back DIR`). The agent scans
//! DIR every `dial_back_scan_ms` and keeps a few *standby* connections to
//! each listener it finds (at most `max_dial_back_hosts` listeners). A standby
//! answers the host's challenge ([`namzu_proto::back`]: proof of the token,
//! never the token itself), then waits, idle, until the host speaks; from
//! there it is a fresh stream like any accepted one, handed to the same gate
//! (preface, token, link / egress / read forms). The moment a standby is
//! taken, another is dialed.
//!
//! A listener that refuses (its host died) is removed, so the directory does
//! not fill with leftovers. A boundary that refuses the connect itself
//! (EPERM: runsc without `--host-uds=open`) gets [`UNSUPPORTED`] written in
//! DIR with the error, which tells the host to reach the agent another way.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::task::JoinHandle;

pub use namzu_proto::back::UNSUPPORTED;
/// Standby connections kept per listener: one being taken while the other
/// waits, so two dials in a row need not wait for a scan.
const STANDBY: usize = 2;

/// What [`run`] needs.
#[derive(Clone)]
pub struct DialBack {
    pub dir: PathBuf,
    pub scan: Duration,
    pub max_hosts: usize,
    pub token: crate::token::Token,
    /// Bound on answering one challenge.
    pub deadline: Duration,
}

/// Scans for listeners and keeps standbys to each, forever; `admit` takes a
/// standby the host began to speak on.
pub async fn run<A>(cfg: DialBack, admit: A)
where
    A: Fn(UnixStream) + Clone + Send + Sync + 'static,
{
    tracing::info!(dir = %cfg.dir.display(), "dialing hosts back");
    let mut hosts: HashMap<OsString, JoinHandle<()>> = HashMap::new();
    let mut full_told = false;
    loop {
        hosts.retain(|_, h| !h.is_finished());
        if let Ok(entries) = std::fs::read_dir(&cfg.dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let socket = e.file_type().is_ok_and(|t| {
                    use std::os::unix::fs::FileTypeExt;
                    t.is_socket()
                });
                if !socket || hosts.contains_key(&name) {
                    continue;
                }
                if hosts.len() >= cfg.max_hosts {
                    if !full_told {
                        tracing::warn!(
                            max = cfg.max_hosts,
                            "more host listeners than max_dial_back_hosts; the rest wait"
                        );
                        full_told = true;
                    }
                    break;
                }
                full_told = false;
                let task = tokio::spawn(serve_host(cfg.clone(), e.path(), admit.clone()));
                hosts.insert(name, task);
            }
        }
        tokio::time::sleep(cfg.scan).await;
    }
}

/// Keeps [`STANDBY`] connections to one listener until it is gone.
async fn serve_host<A>(cfg: DialBack, path: PathBuf, admit: A)
where
    A: Fn(UnixStream) + Clone + Send + Sync + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..STANDBY {
        set.spawn(standby(cfg.clone(), path.clone(), admit.clone()));
    }
    while set.join_next().await.is_some() {}
    tracing::debug!(path = %path.display(), "host listener gone");
}

async fn standby<A>(cfg: DialBack, path: PathBuf, admit: A)
where
    A: Fn(UnixStream),
{
    let mut failures = 0u32;
    loop {
        let mut s = match UnixStream::connect(&path).await {
            Ok(s) => s,
            Err(e) => {
                match e.kind() {
                    // Its host died and left the file: nobody will listen there again.
                    std::io::ErrorKind::ConnectionRefused => {
                        let _ = std::fs::remove_file(&path);
                    }
                    std::io::ErrorKind::NotFound => {}
                    std::io::ErrorKind::PermissionDenied => mark_unsupported(&cfg.dir, &e),
                    _ => {
                        failures += 1;
                        if failures < 3 {
                            tokio::time::sleep(cfg.scan).await;
                            continue;
                        }
                        tracing::warn!(path = %path.display(), error = %e, "cannot dial the host back");
                    }
                }
                return;
            }
        };
        failures = 0;
        match tokio::time::timeout(cfg.deadline, namzu_proto::back::answer(&mut s, &cfg.token.get())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "host challenge failed");
                tokio::time::sleep(cfg.scan).await;
                continue;
            }
            Err(_) => {
                tracing::warn!(path = %path.display(), "host challenge timed out");
                continue;
            }
        }
        // Idle until the host speaks, however long: a standby is waiting
        // for the host's next dial, not for a preface in flight.
        if spoken(&s).await {
            admit(s);
        }
    }
}

/// Waits until the host sends its first byte on a standby (true) or closes
/// it unused (false: it exited). Peeks, so the gate reads the preface whole.
async fn spoken(s: &UnixStream) -> bool {
    loop {
        if s.readable().await.is_err() {
            return false;
        }
        // Through try_io, so a spurious wake-up (readiness left over from
        // the challenge) clears the readiness instead of spinning.
        let peeked = s.try_io(tokio::io::Interest::READABLE, || {
            let mut b = [0u8; 1];
            rustix::net::recv(
                s.as_fd(),
                &mut b,
                rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
            )
            .map_err(std::io::Error::from)
        });
        match peeked {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return false,
        }
    }
}

fn mark_unsupported(dir: &Path, e: &std::io::Error) {
    tracing::warn!(error = %e, "the boundary does not let the agent dial the host back");
    let _ = std::fs::write(dir.join(UNSUPPORTED), format!("connect: {e}\n"));
}
