//! A virtio-serial port (`/dev/vportNpM`) as an async byte stream: the one
//! stream a microVM's link travels on (see `namzu_proto::mux`).
//!
//! The device is opened non-blocking and driven by readiness (`AsyncFd`),
//! so reads and writes go on at once, as a socket's do; the console driver
//! answers `EAGAIN` when its queue is full or empty, and poll when it moves.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An open port; clones share it (a session holds one, the loop that
/// starts sessions another).
#[derive(Clone)]
pub struct Port(std::sync::Arc<AsyncFd<File>>);

/// Opens the port at `path` (exclusive: the driver admits one opener)
/// and returns its descriptor, for [`Port::from_fd`] once a runtime runs.
pub fn open_fd(path: &Path) -> std::io::Result<std::os::fd::RawFd> {
    use std::os::fd::IntoRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    Ok(f.into_raw_fd())
}

impl Port {
    /// The port open on `fd` ([`open_fd`]), owned from here on.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> std::io::Result<Self> {
        let f = std::fs::File::from(fd);
        #[allow(unsafe_code)]
        // SAFETY: `f` is an open File this AsyncFd owns for its whole life;
        // its descriptor never changes.
        let fd = unsafe { AsyncFd::register(f) }.map_err(std::io::Error::from)?;
        Ok(Self(std::sync::Arc::new(fd)))
    }
}

/// The device node of the port named `name` (its `virtserialport` name):
/// `/dev/<vportNpM>` whose `/sys/class/virtio-ports/<vportNpM>/name` holds
/// it. No udev runs in the guest to make `/dev/virtio-ports/NAME`.
pub fn find(name: &str) -> Option<PathBuf> {
    let dir = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    dir.flatten().find_map(|e| {
        let got = std::fs::read_to_string(e.path().join("name")).ok()?;
        (got.trim() == name).then(|| Path::new("/dev").join(e.file_name()))
    })
}

/// [`find`], polled until the port appears (the driver adds ports as the
/// host announces them, after the module loaded) or `within` passes.
pub fn wait_for(name: &str, within: std::time::Duration) -> std::io::Result<PathBuf> {
    let start = std::time::Instant::now();
    loop {
        if let Some(p) = find(name).filter(|p| p.exists()) {
            return Ok(p);
        }
        if start.elapsed() > within {
            let seen: Vec<String> = std::fs::read_dir("/sys/class/virtio-ports")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| {
                    let n = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                    format!("{}={}", e.file_name().to_string_lossy(), n.trim())
                })
                .collect();
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no virtio port named {name} after {within:?} (ports: {seen:?})"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl AsyncRead for Port {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|f| f.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Port {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|f| f.get_ref().write(data)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
