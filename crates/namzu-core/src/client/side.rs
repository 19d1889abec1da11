//! The streams of their own a link opens beside its HTTP/2 connection:
//! an egress connection's, and a streamed read's, a write's or a command's,
//! each a fresh dial presenting the link's token in its own form of the
//! preface.

use std::io::Write as _;

use namzu_proto::preface;

use super::link::*;

/// An egress connection's own stream to the agent.
pub enum EgressStream {
    /// On a unix socket, so the host can splice it; `handoff`: opened with
    /// the handoff form, so the agent's offer ([`namzu_proto::handoff`])
    /// comes first.
    Unix {
        /// The stream, past its preface.
        stream: tokio::net::UnixStream,
        /// Whether the agent's handoff offer comes first.
        handoff: bool,
    },
    /// On another transport.
    Other(Box<dyn LinkStreamObj>),
}

impl AgentClient {
    /// Opens a byte stream of its own for egress ask `ask` (the egress form
    /// of the preface): the host's end of that connection, raw, instead of
    /// an `EgressSplice` call. `None` where the link cannot dial cheaply or
    /// the agent does not offer it.
    pub async fn open_egress_stream(&self, ask: u64) -> Option<Result<EgressStream>> {
        let (dial, token) = self.inner.side.as_ref()?;
        if !self.inner.features.contains(feat::EGRESS_STREAM) {
            return None;
        }
        let endpoint = || format!("egress stream of {}", self.inner.sandbox_id);
        let opened = async {
            let connect = |source| Error::Connect {
                endpoint: endpoint(),
                source,
            };
            let refused = |source| Error::Preface {
                endpoint: endpoint(),
                source,
            };
            Ok(match dial {
                SideDial::Unix(dial, _) => {
                    let handoff = self.inner.features.contains(feat::EGRESS_HANDOFF);
                    let mut s = dial().await.map_err(connect)?;
                    namzu_proto::preface::offer_egress(&mut s, &token(), ask, handoff)
                        .await
                        .map_err(refused)?;
                    EgressStream::Unix { stream: s, handoff }
                }
                SideDial::Other(dialer) => {
                    let mut s = dialer().await.map_err(connect)?;
                    namzu_proto::preface::offer_egress(&mut s, &token(), ask, false)
                        .await
                        .map_err(refused)?;
                    EgressStream::Other(s)
                }
            })
        };
        Some(opened.await)
    }

    /// Opens a unix stream of its own for a streamed read (the read form
    /// of the preface, with `request` an encoded `ReadFileStreamRequest`).
    /// `None` where the link is not a unix socket or the agent does not
    /// offer it.
    pub(super) async fn open_side_read(&self, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        self.open_side(SideKind::Read, request).await
    }

    /// Opens a unix stream of its own for a write (the write form of the
    /// preface, with `request` an encoded `WriteBegin`); `None` as for
    /// [`Self::open_side_read`].
    pub(super) async fn open_side_write(&self, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        self.open_side(SideKind::Write, request).await
    }

    /// Opens a unix stream of its own for a command (the exec form, with
    /// `request` an encoded `ExecStart`): the agent has run it once this
    /// returns a stream; `None` as for [`Self::open_side_read`].
    pub(super) async fn open_side_exec(&self, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        self.open_side(SideKind::Exec, request).await
    }

    async fn open_side(&self, kind: SideKind, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        let (SideDial::Unix(dial, path), token) = self.inner.side.as_ref()? else {
            return None;
        };
        let (feature, what, magic) = match kind {
            SideKind::Read => (feat::FILES_READ_SIDE, "read", preface::MAGIC_READ),
            SideKind::Write => (feat::FILES_WRITE_SIDE, "write", preface::MAGIC_WRITE),
            SideKind::Exec => (feat::EXEC_SIDE, "exec", preface::MAGIC_EXEC),
        };
        if !self.inner.features.contains(feature) {
            return None;
        }
        let endpoint = || format!("{what} stream of {}", self.inner.sandbox_id);
        let refused = |source| Error::Preface {
            endpoint: endpoint(),
            source,
        };
        let opened = async {
            let bytes = preface::side_offer(magic, &token(), request).map_err(refused)?;
            let connect = |source| Error::Connect {
                endpoint: endpoint(),
                source,
            };
            let mut s = match path.as_deref().map(|p| connect_and_send(p, &bytes)) {
                Some(Ok(Some(s))) => s,
                Some(Err(e)) => return Err(connect(e)),
                Some(Ok(None)) | None => {
                    let mut s = dial().await.map_err(connect)?;
                    tokio::io::AsyncWriteExt::write_all(&mut s, &bytes)
                        .await
                        .map_err(|e| refused(preface::PrefaceError::Io(e.to_string())))?;
                    s
                }
            };
            preface::read_acceptance(&mut s).await.map_err(refused)?;
            Ok(s)
        };
        Some(opened.await)
    }
}

/// Connects to the socket at `path` and writes `bytes` (a preface and its
/// request) without a turn of the runtime: a unix connect is accepted into
/// the listener's backlog at once, and a first write of a few hundred
/// bytes fits the new socket's buffer, so neither has to wait for the
/// reactor to say the socket is ready — which, on a multi-threaded
/// runtime, is a wake-up of another thread each. `Ok(None)`: the backlog
/// is full (or the write would block); dial the usual way instead.
fn connect_and_send(path: &Path, bytes: &[u8]) -> io::Result<Option<tokio::net::UnixStream>> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    match rustix::net::connect_unix(&fd, &SocketAddrUnix::new(path)?) {
        Ok(()) => {}
        Err(rustix::io::Errno::AGAIN) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let std = std::os::unix::net::UnixStream::from(fd);
    match (&std).write(bytes) {
        Ok(n) if n == bytes.len() => tokio::net::UnixStream::from_std(std).map(Some),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Which operation a side stream carries.
#[derive(Clone, Copy)]
enum SideKind {
    Read,
    Write,
    Exec,
}
