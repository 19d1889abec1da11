//! Helpers for cases: sandbox lifetime, deterministic data, assertions.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use namzu::{Sandbox, SandboxSpec};
use tokio::io::{AsyncRead, ReadBuf};

use crate::{Factory, Outcome};

/// Fails the case with a formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("{} (at {}:{})", format!($($fmt)+), file!(), line!()));
        }
    };
}

/// Converts any error into a case failure with context.
pub trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::error::Error> Ctx<T> for Result<T, E> {
    /// The error and every cause beneath it (a tier's own error is the
    /// cause of `Error::Tier`).
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| {
            let mut msg = format!("{what}: {e}");
            let mut cause = e.source();
            while let Some(c) = cause {
                msg.push_str(&format!(": {c}"));
                cause = c.source();
            }
            msg
        })
    }
}

/// Creates a sandbox, runs `body`, and destroys it whatever the outcome.
pub async fn with_sandbox<F, Fut, T>(factory: &Factory, spec: SandboxSpec, body: F) -> Result<T, String>
where
    F: FnOnce(Sandbox) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let sb: Sandbox = factory(spec).await.ctx("create sandbox")?;
    let result = body(sb.clone()).await;
    let destroyed = sb.destroy().await.ctx("destroy");
    match (result, destroyed) {
        (Ok(v), Ok(())) => Ok(v),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// The byte at `pos` of the deterministic test pattern `seed`.
#[inline]
pub fn pattern_byte(seed: u64, pos: u64) -> u8 {
    // splitmix64 of the 8-byte block, then the byte within it.
    let mut z = seed.wrapping_add((pos / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z.to_le_bytes()[(pos % 8) as usize]
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| pattern_byte(seed, i)).collect()
}

/// An `AsyncRead` yielding `len` pattern bytes, optionally failing with an
/// I/O error once `fail_at` bytes have been produced.
pub struct PatternReader {
    seed: u64,
    pos: u64,
    len: u64,
    fail_at: Option<u64>,
    /// At this offset: say so on the first channel, then wait for the
    /// second before producing another byte.
    pause_at: Option<(
        u64,
        Option<tokio::sync::oneshot::Sender<()>>,
        tokio::sync::oneshot::Receiver<()>,
    )>,
}

impl PatternReader {
    pub fn new(seed: u64, len: u64) -> Self {
        Self {
            seed,
            pos: 0,
            len,
            fail_at: None,
            pause_at: None,
        }
    }
    pub fn failing_at(mut self, at: u64) -> Self {
        self.fail_at = Some(at);
        self
    }
    /// Stops at `at` bytes: `paused` fires when it gets there, and it goes
    /// on once `resume` does (or its sender is dropped).
    pub fn pausing_at(
        mut self,
        at: u64,
        paused: tokio::sync::oneshot::Sender<()>,
        resume: tokio::sync::oneshot::Receiver<()>,
    ) -> Self {
        self.pause_at = Some((at, Some(paused), resume));
        self
    }
}

impl AsyncRead for PatternReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if let Some(at) = self.fail_at {
            if self.pos >= at {
                return Poll::Ready(Err(std::io::Error::other("injected read failure")));
            }
        }
        let pos = self.pos;
        if let Some((at, paused, resume)) = &mut self.pause_at {
            if pos >= *at {
                if let Some(tx) = paused.take() {
                    let _ = tx.send(());
                }
                match Pin::new(resume).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(_) => self.pause_at = None,
                }
            }
        }
        let stop = self.pause_at.as_ref().map_or(self.len, |(at, _, _)| *at);
        let end = self.fail_at.map_or(stop, |f| f.min(stop)).min(self.len);
        let n = (end - self.pos).min(buf.remaining() as u64).min(256 * 1024) as usize;
        let (seed, start) = (self.seed, self.pos);
        let dst = buf.initialize_unfilled_to(n);
        for (i, b) in dst.iter_mut().enumerate() {
            *b = pattern_byte(seed, start + i as u64);
        }
        buf.advance(n);
        self.pos += n as u64;
        Poll::Ready(Ok(()))
    }
}

/// Checks that `data`, found at `offset`, matches the pattern.
pub fn check_pattern(seed: u64, offset: u64, data: &[u8]) -> Outcome {
    for (i, b) in data.iter().enumerate() {
        let pos = offset + i as u64;
        if *b != pattern_byte(seed, pos) {
            return Err(format!("byte {pos} differs from the pattern"));
        }
    }
    Ok(())
}
