//! The guest's side of a microVM's port sessions: one multiplexed session
//! on the link port at a time, a new one each time a host anchor starts
//! one on the control port (`namzu_proto::mux_sync`).
//!
//! A VM restored from a memory snapshot wakes up inside the session its
//! old host had; its processes, executions and their logs are all there,
//! but nothing on the host speaks that session any more. The new host's
//! sync line ends it (the streams of the old links fail, as any dropped
//! link's do; what runs detached goes on), sets the clock to the host's,
//! installs the token the host names (a fork's own), and starts the next
//! session past the markers. Without a control port (an older host) the
//! one session runs on the bare port, as before.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use namzu_proto::mux::{MuxLimits, StreamHandle};
use namzu_proto::mux_sync::{marker, skip_to, Side, SyncLine, MAX_LINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::port::Port;
use crate::token::Token;

/// Serves sessions on `link` until the ports close; `admit` takes each
/// host stream.
pub async fn run<F>(link: Port, ctl: Option<Port>, limits: MuxLimits, token: Token, admit: F) -> std::io::Result<()>
where
    F: FnMut(StreamHandle) + Clone + Send + 'static,
{
    let Some(ctl) = ctl else {
        return namzu_proto::mux::serve(link, limits, admit).await;
    };
    let (tx, mut syncs) = mpsc::channel(4);
    tokio::spawn(read_syncs(ctl, tx));
    let mut next = syncs.recv().await;
    while let Some(sync) = next.take() {
        apply(&sync, &token);
        let session = session(link.clone(), sync.nonce, limits, admit.clone());
        tokio::select! {
            ended = session => {
                tracing::warn!(?ended, nonce = sync.nonce, "the host's session ended; waiting for the next");
                next = syncs.recv().await;
            }
            newer = syncs.recv() => {
                tracing::info!(nonce = sync.nonce, "a new host: the old session is dropped");
                next = newer;
            }
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the control port closed",
    ))
}

/// One session: the guest's marker out, everything up to the host's
/// marker skipped, then yamux.
async fn session<F>(mut link: Port, nonce: u64, limits: MuxLimits, admit: F) -> std::io::Result<()>
where
    F: FnMut(StreamHandle),
{
    link.write_all(&marker(Side::Guest, nonce)).await?;
    // An old session's stream may have up to a whole window in the port.
    let max_discard = limits.stream_window_bytes as usize * limits.max_streams.max(1);
    let link = skip_to(link, &marker(Side::Host, nonce), max_discard).await?;
    tracing::info!(nonce, "host session started");
    namzu_proto::mux::serve(link, limits, admit).await
}

/// The host's time and token, taken in.
fn apply(sync: &SyncLine, token: &Token) {
    if !sync.token.is_empty() {
        token.set(sync.token.clone());
    }
    let behind = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // Only a clock that lags by more than a moment is set: a fresh boot's
    // is right already; a restored one is as old as its snapshot.
    if sync.unix_ns > behind + Duration::from_secs(1).as_nanos() {
        let secs = (sync.unix_ns / 1_000_000_000) as i64;
        let nanos = (sync.unix_ns % 1_000_000_000) as i64;
        let ts = nix::sys::time::TimeSpec::new(secs, nanos);
        match nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts) {
            Ok(()) => tracing::info!(
                behind_ms = (sync.unix_ns - behind) / 1_000_000,
                "clock set to the host's"
            ),
            Err(e) => tracing::warn!("could not set the clock to the host's: {e}"),
        }
    }
}

/// Lines from the control port, the sync lines among them passed on.
async fn read_syncs(ctl: Port, tx: mpsc::Sender<SyncLine>) {
    let mut lines = tokio::io::BufReader::new(ctl);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut lines).take(MAX_LINE as u64).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') && line.len() >= MAX_LINE => {
                // Too long: skip to its end.
                let mut rest = Vec::new();
                let _ = lines.read_until(b'\n', &mut rest).await;
            }
            Ok(_) => {
                if let Some(sync) = SyncLine::parse(line.trim_ascii()) {
                    if tx.send(sync).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
