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
use namzu_proto::mux_sync::{marker, skip_to, ClockLine, Side, SyncLine, MAX_LINE};
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

/// The host's token, time and seed, taken in.
fn apply(sync: &SyncLine, token: &Token) {
    if !sync.token.is_empty() {
        token.set(sync.token.clone());
    }
    to_keeper(sync.unix_ns, &sync.seed);
}

/// Has the keeper set the clock to `host_ns` where the guest's lags by
/// more than a moment (a fresh boot's is right already; a restored or
/// continued one is as old as its snapshot or pause), and reseed the
/// random pool with `seed` (none: left as it is).
fn to_keeper(host_ns: u128, seed: &[u8]) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let set_to = if host_ns > now + Duration::from_secs(1).as_nanos() {
        host_ns
    } else {
        0
    };
    if set_to == 0 && seed.is_empty() {
        return;
    }
    let mut record = [0u8; KEEPER_RECORD];
    record[..16].copy_from_slice(&set_to.to_le_bytes());
    let n = seed.len().min(SEED_BYTES);
    record[16..16 + n].copy_from_slice(&seed[..n]);
    let sent = KEEPER
        .get()
        .ok_or_else(|| std::io::Error::other("no keeper"))
        .and_then(|k| {
            use std::io::Write;
            k.lock().unwrap_or_else(|p| p.into_inner()).write_all(&record)
        });
    match sent {
        Ok(()) if set_to > 0 => tracing::info!(
            behind_ms = (set_to - now) / 1_000_000,
            reseeded = !seed.is_empty(),
            "clock set to the host's"
        ),
        Ok(()) => tracing::debug!("random pool reseeded"),
        Err(e) => tracing::warn!("could not set the clock or reseed the random pool: {e}"),
    }
}

/// Lines from the control port: sync lines passed on, clock lines (a VM
/// continued after a pause) taken in at once.
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
                if let Some(clock) = ClockLine::parse(line.trim_ascii()) {
                    to_keeper(clock.unix_ns, &[]);
                } else if let Some(sync) = SyncLine::parse(line.trim_ascii()) {
                    if tx.send(sync).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Bytes of host randomness a record carries.
const SEED_BYTES: usize = 32;
/// One record on the keeper's pipe: the time to set (ns, little-endian;
/// 0: leave the clock) and the seed (all zero: no reseed).
const KEEPER_RECORD: usize = 16 + SEED_BYTES;
/// `_IOW('R', 0x03, int[2])`: add entropy to the kernel's pool, credited.
const RNDADDENTROPY: u64 = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the kernel's CRNG from its pool now.
const RNDRESEEDCRNG: u64 = 0x5207;

/// Where [`apply`] sends the host's time and seed: the keeper's pipe.
static KEEPER: std::sync::OnceLock<std::sync::Mutex<std::fs::File>> = std::sync::OnceLock::new();

/// Starts the guest's keeper: a child that keeps CAP_SYS_TIME and
/// CAP_SYS_ADMIN and nothing else, outside the agent's seccomp filter, and
/// for each record the agent writes on its pipe sets the clock and
/// reseeds the kernel's random generator. The agent itself drops every
/// capability but a few and forbids clock_settime to itself and its
/// commands; a VM's clock is its own, a restored one must be set, and
/// forks of one snapshot must not share a random stream. Call before the
/// agent drops capabilities or installs seccomp, with one thread.
pub fn spawn_keeper() -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let (r, w) = std::io::pipe()?;
    #[allow(unsafe_code)]
    // SAFETY: the process is single-threaded (the caller's promise), so
    // the child may allocate and run ordinary code before it exits.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(r);
            let _ = KEEPER.set(std::sync::Mutex::new(std::fs::File::from(std::os::fd::OwnedFd::from(
                w,
            ))));
            Ok(())
        }
        nix::unistd::ForkResult::Child => {
            drop(w);
            let fd = r.into_raw_fd();
            let code = match keep_clock(fd) {
                Ok(()) => 0,
                Err(e) => {
                    tracing::warn!("keeper: {e}");
                    1
                }
            };
            std::process::exit(code)
        }
    }
}

fn keep_clock(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    use std::io::Read;
    #[allow(unsafe_code)]
    // SAFETY: plain syscalls on this process's own descriptors and state.
    unsafe {
        // Only the pipe stays open (the ports, the console, the disks'
        // descriptors are the agent's).
        if libc::dup2(fd, 3) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::prctl(libc::PR_SET_NAME, c"namzu-keeper".as_ptr());
        // Not dumpable: a command under the same uid can neither ptrace
        // it nor read its memory.
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
    use caps::{CapSet, Capability};
    let ce = |e: caps::errors::CapsError| std::io::Error::other(e.to_string());
    let only: caps::CapsHashSet = [Capability::CAP_SYS_TIME, Capability::CAP_SYS_ADMIN]
        .into_iter()
        .collect();
    for cap in caps::all() {
        if !only.contains(&cap) {
            let _ = caps::drop(None, CapSet::Bounding, cap);
        }
    }
    caps::clear(None, CapSet::Inheritable).map_err(ce)?;
    caps::set(None, CapSet::Effective, &only).map_err(ce)?;
    caps::set(None, CapSet::Permitted, &only).map_err(ce)?;
    #[allow(unsafe_code)]
    // SAFETY: fd 3 is the pipe, dup'ed above; owned from here on.
    let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(3) };
    let mut b = [0u8; KEEPER_RECORD];
    while pipe.read_exact(&mut b).is_ok() {
        let mut ns = [0u8; 16];
        ns.copy_from_slice(&b[..16]);
        let ns = u128::from_le_bytes(ns);
        if ns > 0 {
            let ts = nix::sys::time::TimeSpec::new((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as i64);
            let _ = nix::time::clock_settime(nix::time::ClockId::CLOCK_REALTIME, ts);
        }
        // A clock record carries no seed: zeros are no entropy to credit.
        if b[16..].iter().any(|&x| x != 0) {
            reseed(&b[16..]);
        }
    }
    Ok(())
}

/// Mixes `seed` into the kernel's pool (credited) and reseeds its CRNG.
fn reseed(seed: &[u8]) {
    use std::os::fd::AsRawFd;
    let Ok(dev) = std::fs::OpenOptions::new().write(true).open("/dev/urandom") else {
        return;
    };
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&((seed.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(seed.len() as i32).to_ne_bytes());
    info.extend_from_slice(seed);
    #[allow(unsafe_code)]
    // SAFETY: both ioctls read only the buffer given, which outlives them.
    unsafe {
        libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr());
        libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG as _);
    }
}
