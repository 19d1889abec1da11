//! Handing an egress connection's client socket to the host, so the bytes
//! cross one relay (the host's) instead of two.
//!
//! On a unix egress stream opened with the handoff form of the preface
//! (`NZE2`, offered as [`crate::features::EGRESS_HANDOFF`]), the agent's
//! first message says how the connection goes on, and may carry the
//! accepted client socket as `SCM_RIGHTS`:
//!
//! ```text
//! agent -> host:  mode: u8 | first_len: u32 big-endian | first bytes   (+ the socket, on the mode byte)
//! host -> agent:  TAKEN (1) or KEPT (0)
//! ```
//!
//! `first` is what the agent read from the client past what the proxy
//! consumed: it goes to the destination before anything else, whoever
//! relays the rest. Then, by mode and answer:
//!
//! * [`Mode::Whole`], taken: the host splices the client and the
//!   destination both ways; the agent is out of the path.
//! * [`Mode::Downstream`], taken: the host splices the destination into
//!   the client; the agent keeps sending the client's upstream bytes
//!   through the stream (it cuts a plain-HTTP request's body at its end),
//!   and closes the client when the host closes the stream.
//! * [`Mode::Keep`], or not taken: the stream carries the connection both
//!   ways, as the `NZE1` form does.
//!
//! The host takes only a connected-looking TCP socket (a stream socket of
//! an internet family): anything else a peer passes is closed and the
//! answer is KEPT. A transport that drops or refuses descriptors (gVisor's
//! host sockets) ends up KEPT too, so the agent never lets go of a client
//! the host does not hold. The host only ever reads and writes what it
//! takes; handing the host's upstream socket to the agent instead would
//! let a command that took the agent over reconnect it anywhere.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{BorrowedFd, OwnedFd};

use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::splice::{borrow, when_ready, write_all};

/// How the agent wants the connection relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No socket passed: the stream carries everything.
    Keep = 0,
    /// Both directions to the host.
    Whole = 1,
    /// The host writes the destination's bytes to the client; the
    /// client's bytes still come through the stream.
    Downstream = 2,
}

impl Mode {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Keep),
            1 => Some(Self::Whole),
            2 => Some(Self::Downstream),
            _ => None,
        }
    }
}

/// The host's answer: it holds the client now.
pub const TAKEN: u8 = 1;
/// The host's answer: the stream carries the connection.
pub const KEPT: u8 = 0;
/// Most bytes of `first` a host reads.
pub const MAX_FIRST_BYTES: usize = 1 << 20;
const HEADER: usize = 5;

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// Agent side: offers `client` to the host in `mode` with `first`, and
/// says whether the host took it. Where the transport refuses to carry a
/// descriptor, the offer goes again without one ([`Mode::Keep`]); `first`
/// over [`MAX_FIRST_BYTES`] is never inlined: the offer is then a plain
/// [`Mode::Keep`] and `first` follows it on the stream. Not taken, the
/// stream is the connection's, `first` already on it.
pub async fn give(stream: &UnixStream, client: BorrowedFd<'_>, mode: Mode, first: &[u8]) -> std::io::Result<bool> {
    let (mut offer, after) = offer(mode, first);
    let sent = match offer[0] {
        0 => 0,
        // A failed sendmsg sent nothing: whatever the transport said (it
        // carries no descriptor: EINVAL, EOPNOTSUPP, EPERM …, or the
        // stream is broken), the plain form follows, and fails in turn if
        // the stream is gone.
        _ => send_with(stream, client, &offer).await.unwrap_or(0),
    };
    if sent == 0 {
        offer[0] = Mode::Keep as u8;
    }
    // The rest of the offer, where one sendmsg took less (or none was made).
    write_all(stream, &offer[sent..]).await?;
    let mut answer = [0u8; 1];
    let n = when_ready(stream, Interest::READABLE, || {
        rustix::io::read(borrow(stream), &mut answer).map_err(std::io::Error::from)
    })
    .await?;
    match (n, answer[0]) {
        (0, _) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        (_, TAKEN) if offer[0] != Mode::Keep as u8 => Ok(true),
        (_, KEPT) => {
            write_all(stream, after).await?;
            Ok(false)
        }
        _ => Err(bad("the host's answer to a handoff is neither taken nor kept")),
    }
}

/// The offer's bytes (mode, length, `first` inline when it fits) and what
/// of `first` follows it instead: over [`MAX_FIRST_BYTES`], all of it,
/// after a plain offer.
fn offer(mode: Mode, first: &[u8]) -> (Vec<u8>, &[u8]) {
    let (mode, inline, after) = if first.len() > MAX_FIRST_BYTES {
        (Mode::Keep, &[][..], first)
    } else {
        (mode, first, &[][..])
    };
    let mut bytes = Vec::with_capacity(HEADER + inline.len());
    bytes.push(mode as u8);
    // Fits: at most MAX_FIRST_BYTES.
    bytes.extend_from_slice(&(inline.len() as u32).to_be_bytes());
    bytes.extend_from_slice(inline);
    (bytes, after)
}

/// Agent side, on a stream that cannot carry a descriptor (a VM's
/// multiplexed port, a relayed pipe) but was opened with the handoff form:
/// the plain offer ([`Mode::Keep`], `first` inline when it fits, else
/// after it) and the host's answer read. The stream is then the
/// connection's, `first` already on it.
pub async fn keep<S>(stream: &mut S, first: &[u8]) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (offer, after) = offer(Mode::Keep, first);
    stream.write_all(&offer).await?;
    stream.flush().await?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await?;
    if answer[0] != KEPT {
        return Err(bad("the host took what was not offered"));
    }
    stream.write_all(after).await?;
    stream.flush().await
}

/// One `sendmsg` of `bytes` with `client` attached.
async fn send_with(stream: &UnixStream, client: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<usize> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let fds = [client];
    when_ready(stream, Interest::WRITABLE, || {
        let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(bad("no room for a descriptor"));
        }
        sendmsg(
            borrow(stream),
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map_err(std::io::Error::from)
    })
    .await
}

/// What the host received.
#[derive(Debug)]
pub struct Offered {
    /// The client, when the host took it (and said so).
    pub client: Option<tokio::net::TcpStream>,
    /// How the agent asked for it to be relayed ([`Mode::Keep`] when not
    /// taken).
    pub mode: Mode,
    /// Bytes for the destination before anything else.
    pub first: Vec<u8>,
}

/// Host side: reads the agent's offer, takes the socket if it is one a
/// relay may hold, and answers. The caller bounds the time this takes.
pub async fn take(stream: &UnixStream) -> std::io::Result<Offered> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut head = [0u8; HEADER];
    let (mut got, passed) = when_ready(stream, Interest::READABLE, || {
        let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut head)];
        let r = recvmsg(borrow(stream), &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
        // Every descriptor is owned here, so any beyond the first closes.
        let mut fds: Vec<OwnedFd> = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = m {
                fds.extend(rights);
            }
        }
        Ok::<_, std::io::Error>((r.bytes, fds.into_iter().next()))
    })
    .await?;
    if got == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    read_exact(stream, &mut head, &mut got).await?;
    let mode = Mode::from_byte(head[0]).ok_or_else(|| bad("unknown handoff mode"))?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FIRST_BYTES {
        return Err(bad("first bytes over the bound"));
    }
    let mut first = vec![0u8; len];
    read_exact(stream, &mut first, &mut 0).await?;
    let client = match (mode, passed) {
        (Mode::Keep, _) | (_, None) => None,
        (_, Some(fd)) => relayable(fd),
    };
    write_all(stream, &[if client.is_some() { TAKEN } else { KEPT }]).await?;
    let mode = if client.is_some() { mode } else { Mode::Keep };
    Ok(Offered { client, mode, first })
}

/// `fd` as a TCP stream, if it is a stream socket of an internet family;
/// anything else is closed.
fn relayable(fd: OwnedFd) -> Option<tokio::net::TcpStream> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let is_sock = rustix::fs::fstat(&fd)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket);
    let stream = sockopt::get_socket_type(&fd).is_ok_and(|t| t == SocketType::STREAM);
    let inet = sockopt::get_socket_domain(&fd).is_ok_and(|d| d == AddressFamily::INET || d == AddressFamily::INET6);
    if !(is_sock && stream && inet) {
        return None;
    }
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(std).ok()
}

async fn read_exact(stream: &UnixStream, buf: &mut [u8], at: &mut usize) -> std::io::Result<()> {
    while *at < buf.len() {
        let n = when_ready(stream, Interest::READABLE, || {
            rustix::io::read(borrow(stream), &mut buf[*at..]).map_err(std::io::Error::from)
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        *at += n;
    }
    Ok(())
}

/// Waits until the peer closes `stream` (or it fails); what it sends
/// meanwhile is dropped. The agent's end of a downstream handoff: the
/// host closes the stream when the connection is over.
pub async fn closed(stream: &UnixStream) {
    let mut sink = [0u8; 512];
    loop {
        let r = when_ready(stream, Interest::READABLE, || {
            rustix::io::read(borrow(stream), &mut sink).map_err(std::io::Error::from)
        })
        .await;
        if !matches!(r, Ok(n) if n > 0) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// What a `give` on a task of its own said: taken or not.
    async fn taken(given: tokio::task::JoinHandle<std::io::Result<bool>>) -> bool {
        given
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let c = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (a, _) = l.accept().await.unwrap_or_else(|e| panic!("{e}"));
        (c, a)
    }

    #[tokio::test]
    async fn a_handed_socket_reaches_the_host_with_the_bytes_read_before_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (agent, host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let (mut command, accepted) = tcp_pair().await;
        let given = tokio::spawn(async move {
            let taken = give(&agent, accepted.as_fd(), Mode::Whole, b"GET / HTTP/1.1\r\n\r\n").await;
            // The agent lets go of its copy once taken.
            drop(accepted);
            taken
        });
        let offered = take(&host).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(taken(given).await);
        assert_eq!(offered.mode, Mode::Whole);
        assert_eq!(offered.first, b"GET / HTTP/1.1\r\n\r\n");
        let mut client = offered.client.unwrap_or_else(|| panic!("not taken"));
        // The host's copy is the command's peer: bytes cross both ways.
        client.write_all(b"from host").await.unwrap_or_else(|e| panic!("{e}"));
        let mut got = [0u8; 9];
        command.read_exact(&mut got).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&got, b"from host");
        command.write_all(b"up").await.unwrap_or_else(|e| panic!("{e}"));
        let mut up = [0u8; 2];
        client.read_exact(&mut up).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&up, b"up");
    }

    #[tokio::test]
    async fn anything_but_a_tcp_socket_is_closed_and_kept() {
        let (agent, host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        // A pipe is no socket a relay may hold: the host answers KEPT.
        let (r, _w) = rustix::pipe::pipe().unwrap_or_else(|e| panic!("{e}"));
        let given = tokio::spawn(async move { give(&agent, r.as_fd(), Mode::Whole, b"x").await });
        let offered = take(&host).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(offered.client.is_none());
        assert_eq!(offered.mode, Mode::Keep);
        assert_eq!(offered.first, b"x");
        assert!(!taken(given).await);
        // Nor a unix socket: a peer could pass descriptors back through it.
        let (agent, host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let (u, _u2) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let given = tokio::spawn(async move { give(&agent, u.as_fd(), Mode::Whole, b"").await });
        assert!(take(&host).await.unwrap_or_else(|e| panic!("{e}")).client.is_none());
        assert!(!taken(given).await);
    }

    #[tokio::test]
    async fn first_bytes_over_the_bound_follow_a_plain_offer() {
        use tokio::io::AsyncReadExt;
        let (agent, mut host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let (_command, accepted) = tcp_pair().await;
        let big: Vec<u8> = (0..MAX_FIRST_BYTES + 10).map(|i| (i % 253) as u8).collect();
        let big2 = big.clone();
        let given = tokio::spawn(async move { give(&agent, accepted.as_fd(), Mode::Whole, &big2).await });
        let offered = take(&host).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(offered.client.is_none());
        assert!(offered.first.is_empty());
        // The agent's end goes with its task: the stream ends after `first`.
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(rest == big, "the first bytes differ after a plain offer");
        assert!(!taken(given).await);
    }

    #[tokio::test]
    async fn a_stream_without_descriptors_makes_the_plain_offer() {
        use tokio::io::AsyncReadExt;
        let (mut agent, mut host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let given = tokio::spawn(async move {
            keep(&mut agent, b"head").await?;
            tokio::io::AsyncWriteExt::write_all(&mut agent, b" and more").await
        });
        let offered = take(&host).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(offered.client.is_none());
        assert_eq!(offered.mode, Mode::Keep);
        assert_eq!(offered.first, b"head");
        let mut rest = Vec::new();
        host.read_to_end(&mut rest).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rest, b" and more");
        given
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test]
    async fn an_oversized_or_unknown_offer_is_refused() {
        let (agent, host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let mut head = vec![9u8];
        head.extend_from_slice(&0u32.to_be_bytes());
        rustix::io::write(&agent, &head).unwrap_or_else(|e| panic!("{e}"));
        assert!(take(&host).await.is_err(), "mode 9 accepted");
        let (agent, host) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let mut head = vec![1u8];
        head.extend_from_slice(&(MAX_FIRST_BYTES as u32 + 1).to_be_bytes());
        rustix::io::write(&agent, &head).unwrap_or_else(|e| panic!("{e}"));
        assert!(take(&host).await.is_err(), "over-long first accepted");
    }
}
