//! Copying between two sockets without the bytes entering user space:
//! `splice(2)` from the source into a pipe and from the pipe into the
//! destination, driven by tokio's readiness. How an egress connection's
//! bytes cross the host's supervisor and the agent when both ends are
//! sockets of the machine (a TCP connection, a unix stream), where a
//! read-and-write copy would cost a round trip through memory per byte on
//! each side.
//!
//! Each direction has a pipe of its own (of at most [`PIPE_BYTES`]); an
//! end of stream is passed on as a half-close of the destination's write
//! side, so each direction ends on its own, as a TCP proxy's should. A
//! process out of descriptors (no pipe to be had) still moves the bytes,
//! through a buffer of [`FALLBACK_BYTES`]: the connection it already has
//! is not failed for want of two more descriptors.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use tokio::io::Interest;

/// Bytes asked of one `splice` call.
pub const PIPE_BYTES: usize = 1 << 20;

/// The buffer of a direction that could not have a pipe.
pub const FALLBACK_BYTES: usize = 64 * 1024;

/// A tokio socket whose readiness drives the copy.
pub trait Socket: AsRawFd {
    /// Waits until `interest` may be ready.
    fn ready(&self, interest: Interest) -> impl std::future::Future<Output = std::io::Result<()>> + Send;
    /// Runs `f` on the socket, clearing readiness if it would block.
    fn try_io_on<R>(&self, interest: Interest, f: impl FnOnce() -> std::io::Result<R>) -> std::io::Result<R>;
}

macro_rules! socket {
    ($t:ty) => {
        impl Socket for $t {
            async fn ready(&self, interest: Interest) -> std::io::Result<()> {
                <$t>::ready(self, interest).await.map(drop)
            }
            fn try_io_on<R>(&self, interest: Interest, f: impl FnOnce() -> std::io::Result<R>) -> std::io::Result<R> {
                self.try_io(interest, f)
            }
        }
    };
}
socket!(tokio::net::TcpStream);
socket!(tokio::net::UnixStream);

pub(crate) fn borrow(fd: &impl AsRawFd) -> BorrowedFd<'_> {
    #[allow(unsafe_code)]
    // SAFETY: the descriptor belongs to the socket borrowed here, which
    // outlives the returned borrow.
    unsafe {
        BorrowedFd::borrow_raw(fd.as_raw_fd())
    }
}

fn nonblocking_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
    // A larger pipe moves more per call; the default (64 KiB) is kept if
    // the limit (pipe-max-size) refuses.
    let _ = rustix::pipe::fcntl_setpipe_size(&w, PIPE_BYTES);
    Ok((r, w))
}

/// Moves everything `src` sends into `dst` until `src` ends, then shuts
/// `dst`'s write side. Returns the bytes moved.
pub async fn one_way<S: Socket, D: Socket>(src: &S, dst: &D) -> std::io::Result<u64> {
    relay(src, dst, nonblocking_pipe()).await
}

/// [`one_way`] with the pipe it could (or could not) have.
async fn relay<S: Socket, D: Socket>(
    src: &S,
    dst: &D,
    pipe: std::io::Result<(OwnedFd, OwnedFd)>,
) -> std::io::Result<u64> {
    use rustix::io::Errno;
    let total = match pipe {
        Ok(pipe) => spliced(src, dst, pipe).await?,
        Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::MFILE | Errno::NFILE)) => buffered(src, dst).await?,
        Err(e) => return Err(e),
    };
    let _ = rustix::net::shutdown(borrow(dst), rustix::net::Shutdown::Write);
    Ok(total)
}

/// Runs `f` once `sock` is ready for `interest`, until it does not block.
pub(crate) async fn when_ready<S: Socket, R>(
    sock: &S,
    interest: Interest,
    mut f: impl FnMut() -> std::io::Result<R>,
) -> std::io::Result<R> {
    loop {
        sock.ready(interest).await?;
        match sock.try_io_on(interest, &mut f) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn spliced<S: Socket, D: Socket>(src: &S, dst: &D, (pr, pw): (OwnedFd, OwnedFd)) -> std::io::Result<u64> {
    use rustix::pipe::{splice, SpliceFlags};
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    let mut total = 0u64;
    loop {
        let n = when_ready(src, Interest::READABLE, || {
            splice(borrow(src), None, pw.as_fd(), None, PIPE_BYTES, flags).map_err(std::io::Error::from)
        })
        .await?;
        if n == 0 {
            return Ok(total);
        }
        let mut left = n;
        while left > 0 {
            left -= when_ready(dst, Interest::WRITABLE, || {
                splice(pr.as_fd(), None, borrow(dst), None, left, flags).map_err(std::io::Error::from)
            })
            .await?;
        }
        total += n as u64;
    }
}

async fn buffered<S: Socket, D: Socket>(src: &S, dst: &D) -> std::io::Result<u64> {
    let mut buf = vec![0u8; FALLBACK_BYTES];
    let mut total = 0u64;
    loop {
        let n = when_ready(src, Interest::READABLE, || {
            rustix::io::read(borrow(src), &mut buf).map_err(std::io::Error::from)
        })
        .await?;
        if n == 0 {
            return Ok(total);
        }
        let mut at = 0;
        while at < n {
            at += when_ready(dst, Interest::WRITABLE, || {
                rustix::io::write(borrow(dst), &buf[at..n]).map_err(std::io::Error::from)
            })
            .await?;
        }
        total += n as u64;
    }
}

/// Writes all of `buf` to `dst`, waiting for room.
pub async fn write_all<D: Socket>(dst: &D, buf: &[u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        at += when_ready(dst, Interest::WRITABLE, || {
            rustix::io::write(borrow(dst), &buf[at..]).map_err(std::io::Error::from)
        })
        .await?;
    }
    Ok(())
}

/// Both directions between `a` and `b` at once, each ending on its own
/// at an end of stream; returns when both have, with the bytes each way
/// (a to b, b to a), or at the first error (a peer gone: the connection
/// is over both ways, and nothing waits on the other direction).
pub async fn both_ways<A: Socket + Sync, B: Socket + Sync>(a: &A, b: &B) -> std::io::Result<(u64, u64)> {
    futures::future::try_join(one_way(a, b), one_way(b, a)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::io::Errno;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn every_byte_crosses_both_ways_and_each_end_is_passed_on() {
        crosses(false).await;
    }

    #[tokio::test]
    async fn without_a_pipe_to_be_had_the_bytes_cross_all_the_same() {
        crosses(true).await;
    }

    /// client <-tcp-> [a | relay | b] <-unix-> server, both ways at once;
    /// `no_pipes`: as if every pipe(2) met EMFILE.
    async fn crosses(no_pipes: bool) {
        // client <-tcp-> [a | splice | b] <-unix-> server
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut client = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (a, _) = l.accept().await.unwrap_or_else(|e| panic!("{e}"));
        let (b, mut server) = tokio::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let pipe = move || {
            if no_pipes {
                Err(std::io::Error::from_raw_os_error(Errno::MFILE.raw_os_error()))
            } else {
                nonblocking_pipe()
            }
        };
        let relay =
            tokio::spawn(async move { futures::future::try_join(relay(&a, &b, pipe()), relay(&b, &a, pipe())).await });
        let up: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = up.iter().rev().copied().collect();
        let (up2, down2) = (up.clone(), down.clone());
        let server_side = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap_or_else(|e| panic!("{e}"));
            assert!(got == up2, "upstream bytes differ");
            server.write_all(&down2).await.unwrap_or_else(|e| panic!("{e}"));
            server.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        });
        client.write_all(&up).await.unwrap_or_else(|e| panic!("{e}"));
        client.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(got == down, "downstream bytes differ");
        server_side.await.unwrap_or_else(|e| panic!("{e}"));
        let (ab, ba) = relay
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((ab, ba), (up.len() as u64, down.len() as u64));
    }
}
