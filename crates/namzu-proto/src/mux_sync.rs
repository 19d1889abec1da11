//! The start of every multiplexed session on a microVM's port: how a new
//! host anchor (a boot, a restore from a memory snapshot, a fork of one)
//! and the guest's agent agree where the session's first byte is, and
//! what the host tells the guest before anything else.
//!
//! A port outlives the host process at its other end: after a restore the
//! guest still holds the session it had when its memory was saved, and the
//! port may still hold bytes either side wrote then. So a session never
//! starts on a bare port. The host first writes one line on the VM's
//! control port ([`SyncLine`]: a fresh nonce, the host's time, the
//! sandbox's token); the guest drops whatever session it had, writes the
//! [`marker`] for that nonce on the link port, and discards everything it
//! reads until the host's marker for the same nonce. The host discards
//! everything until the guest's marker, answers with its own, and both
//! start yamux on what follows ([`Rejoined`] gives back bytes read past a
//! marker). The host writes its marker only after it saw the guest's, so
//! the guest's old session can never swallow it.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The most bytes a control line may have; longer ones are skipped.
pub const MAX_LINE: usize = 4096;

/// What the host tells the guest at the start of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncLine {
    /// Names this session's markers; fresh per session.
    pub nonce: u64,
    /// The host's wall clock, nanoseconds since the epoch: a restored
    /// guest's clock is as old as its snapshot.
    pub unix_ns: u128,
    /// The token links must present from now on (a fork's own).
    pub token: Vec<u8>,
    /// Fresh randomness from the host, mixed into the guest's random pool
    /// and forcing its reseed: forks of one snapshot start with one and
    /// the same pool, and would otherwise draw the same bytes.
    pub seed: Vec<u8>,
}

impl SyncLine {
    /// The line, newline first (it ends whatever partial line an earlier
    /// host left) and last.
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "\nsync {:016x} {} {} {}\n",
            self.nonce,
            self.unix_ns,
            hex(&self.token),
            hex(&self.seed)
        )
        .into_bytes()
    }

    /// One line without its newline, or `None` when it is not a sync line.
    pub fn parse(line: &[u8]) -> Option<Self> {
        let line = std::str::from_utf8(line).ok()?;
        let mut f = line.trim().split(' ');
        if f.next()? != "sync" {
            return None;
        }
        let nonce = u64::from_str_radix(f.next()?, 16).ok()?;
        let unix_ns = f.next()?.parse().ok()?;
        let token = unhex(f.next()?)?;
        let seed = unhex(f.next()?)?;
        f.next().is_none().then_some(Self {
            nonce,
            unix_ns,
            token,
            seed,
        })
    }
}

/// What the host tells a guest it has just continued after a pause of its
/// whole VM: the host's wall clock, which the guest's (stopped with its
/// vCPUs) lags by the pause. No new session: the links held through the
/// pause go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockLine {
    /// The host's wall clock, nanoseconds since the epoch.
    pub unix_ns: u128,
}

impl ClockLine {
    /// The line, newline first and last (as [`SyncLine::encode`]).
    pub fn encode(&self) -> Vec<u8> {
        format!("\nclock {}\n", self.unix_ns).into_bytes()
    }

    /// One line without its newline, or `None` when it is not a clock line.
    pub fn parse(line: &[u8]) -> Option<Self> {
        let line = std::str::from_utf8(line).ok()?;
        let mut f = line.trim().split(' ');
        if f.next()? != "clock" {
            return None;
        }
        let unix_ns = f.next()?.parse().ok()?;
        f.next().is_none().then_some(Self { unix_ns })
    }
}

/// The host's wall clock now, nanoseconds since the epoch.
pub fn now_unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Which side writes a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The VM's anchor.
    Host,
    /// The agent in the guest.
    Guest,
}

/// The bytes `side` writes on the link port for session `nonce`.
pub fn marker(side: Side, nonce: u64) -> Vec<u8> {
    let who = match side {
        Side::Host => "host",
        Side::Guest => "guest",
    };
    format!("\n\0namzu-session {who} {nonce:016x}\0\n").into_bytes()
}

/// Reads `io` until `want` has gone by, discarding what came before it;
/// what was read past it comes back first from the returned stream.
/// `max_discard` bounds the bytes skipped (an old session's window is the
/// most a port can hold).
pub async fn skip_to<T>(mut io: T, want: &[u8], max_discard: usize) -> std::io::Result<Rejoined<T>>
where
    T: AsyncRead + Unpin,
{
    let mut seen: Vec<u8> = Vec::new();
    let mut discarded = 0usize;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the port closed before the session's marker",
            ));
        }
        seen.extend_from_slice(&buf[..n]);
        if let Some(at) = seen.windows(want.len()).position(|w| w == want) {
            let rest = seen.split_off(at + want.len());
            return Ok(Rejoined { head: rest, at: 0, io });
        }
        // Keep only what could still be the start of the marker.
        let keep = want.len().saturating_sub(1).min(seen.len());
        discarded += seen.len() - keep;
        seen.drain(..seen.len() - keep);
        if discarded > max_discard {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no session marker within {max_discard} bytes"),
            ));
        }
    }
}

/// A stream with bytes already read from it put back in front.
pub struct Rejoined<T> {
    head: Vec<u8>,
    at: usize,
    io: T,
}

impl<T> Rejoined<T> {
    /// `io` with `head` to be read first.
    pub fn new(head: Vec<u8>, io: T) -> Self {
        Self { head, at: 0, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rejoined<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = (self.head.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            if self.at == self.head.len() {
                self.head = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rejoined<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[test]
    fn a_sync_line_reads_back_and_nothing_else_parses() {
        let l = SyncLine {
            nonce: 0xdead_beef_0000_0001,
            unix_ns: 1_764_000_000_123_456_789,
            token: b"t\0k\xffen".to_vec(),
            seed: vec![7u8; 32],
        };
        let enc = l.encode();
        let body = enc.strip_prefix(b"\n").unwrap().strip_suffix(b"\n").unwrap();
        assert_eq!(SyncLine::parse(body), Some(l));
        for bad in [
            &b"sync 1 2"[..],
            b"sync zz 1 00",
            b"sync 1 2 0",
            b"hello 1 2 00",
            b"sync 1 2 00 extra",
        ] {
            assert_eq!(SyncLine::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_clock_line_reads_back_and_is_no_sync_line() {
        let l = ClockLine {
            unix_ns: 1_764_000_000_123_456_789,
        };
        let enc = l.encode();
        let body = enc.strip_prefix(b"\n").unwrap().strip_suffix(b"\n").unwrap();
        assert_eq!(ClockLine::parse(body), Some(l));
        assert_eq!(SyncLine::parse(body), None);
        for bad in [&b"clock"[..], b"clock x", b"clock 1 2", b"clocks 1"] {
            assert_eq!(ClockLine::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Garbage before the marker (an old session's frames, split across
    /// reads) is dropped; what follows it is read first, then the rest.
    #[tokio::test]
    async fn skip_to_drops_what_came_before_and_keeps_what_came_after() {
        let (mut w, r) = tokio::io::duplex(64);
        let m = marker(Side::Guest, 7);
        let writer = tokio::spawn(async move {
            let mut all = vec![0u8; 5000];
            all.extend_from_slice(&m[..m.len() / 2]);
            // A false start: half a marker, then garbage, then the marker.
            all.extend_from_slice(b"xx");
            all.extend_from_slice(&marker(Side::Guest, 7));
            all.extend_from_slice(b"after");
            w.write_all(&all).await.unwrap();
            w.write_all(b" and more").await.unwrap();
        });
        let mut got = skip_to(r, &marker(Side::Guest, 7), 1 << 20).await.unwrap();
        writer.await.unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).await.unwrap();
        assert_eq!(s, "after and more");
    }

    #[tokio::test]
    async fn skip_to_gives_up_past_its_bound_and_at_the_end() {
        let (mut w, r) = tokio::io::duplex(1 << 16);
        w.write_all(&[1u8; 40_000]).await.unwrap();
        let e = skip_to(r, &marker(Side::Host, 1), 10_000).await.err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let (w, r) = tokio::io::duplex(64);
        drop(w);
        let e = skip_to(r, &marker(Side::Host, 1), 10_000).await.err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
