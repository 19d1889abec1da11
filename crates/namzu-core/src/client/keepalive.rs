//! The keepalive of a holdable link ([`ClientOptions::holdable`]): a
//! sandbox that may be held still on purpose (a VM paused whole) answers
//! nothing for as long as the hold lasts, and HTTP/2's own keepalive would
//! take that for a dead peer and drop every stream on the link. This one
//! pings with `Health` every interval, never while the sandbox is held,
//! and cuts the connection (its reads and writes fail, so every call on it
//! ends as HTTP/2's keepalive would end them) only when a ping goes
//! unanswered for two intervals and the sandbox is not held at either's
//! end: a dead peer is found within three intervals.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// What the keepalive asks of the link it keeps.
pub(super) trait Peer: Send + Sync + 'static {
    /// The link was closed: the keepalive ends.
    fn closed(&self) -> bool;
    /// The sandbox is held still on purpose.
    fn held(&self) -> bool;
    /// One ping; resolves when the agent answers (whatever it says).
    fn ping(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// The sandbox's id, for the log.
    fn name(&self) -> &str;
}

/// Cuts the link's connections: each is made through [`Cutter::wrap`].
#[derive(Clone, Default)]
pub(super) struct Cutter(Arc<Mutex<CancellationToken>>);

impl Cutter {
    /// `io`, failing from the next cut on.
    pub(super) fn wrap<S>(&self, io: S) -> Cut<S> {
        let token = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Cut {
            io,
            cut: Box::pin(token.cancelled_owned()),
        }
    }

    /// Fails every connection made so far; later ones are new.
    fn cut(&self) {
        let old = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        old.cancel();
    }
}

/// A connection [`Cutter::cut`] can fail.
pub(super) struct Cut<S> {
    io: S,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<S> Cut<S> {
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        match self.cut.poll_unpin(cx) {
            Poll::Ready(()) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "keepalive: the agent answered no ping",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Cut<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cut<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Pings the link behind `link` every `every` until it is dropped or
/// closed; see the module's words.
pub(super) fn spawn<P: Peer>(link: Weak<P>, every: Duration, cutter: Cutter) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(peer) = link.upgrade() else { return };
            if peer.closed() {
                return;
            }
            if peer.held() {
                continue;
            }
            let mut ping = peer.ping();
            drop(peer);
            if tokio::time::timeout(every, &mut ping).await.is_ok() {
                continue;
            }
            // A hold that began while the ping waited explains its silence;
            // one that ended since gets the ping another interval.
            if link.upgrade().is_none_or(|p| p.held()) {
                continue;
            }
            if tokio::time::timeout(every, &mut ping).await.is_ok() {
                continue;
            }
            let Some(peer) = link.upgrade() else { return };
            if peer.held() {
                continue;
            }
            tracing::warn!(
                sandbox = %peer.name(),
                "no answer to a keepalive ping in {every:?}: the connection is dropped"
            );
            cutter.cut();
        }
    });
}
