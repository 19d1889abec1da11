//! `namzu-agent --relay unix:PATH`: joins its stdin and stdout to the
//! agent's socket.
//!
//! Where the host cannot reach the agent's socket — a runtime like gVisor
//! keeps a socket made inside the sandbox out of the host's view — each
//! host link is a `docker exec` of this relay inside the container, whose
//! stdio the Engine API hijacks. The relay adds nothing to the protocol:
//! the preface and HTTP/2 pass through it byte for byte. It ends when the
//! agent closes its side; the host closing its side half-closes toward the
//! agent and lets the answer drain.
//!
//! Before a single byte goes to the socket, the relay checks who holds its
//! other end (SO_PEERCRED): it must be the relay's own uid, which is the
//! agent's (the host runs relays as the agent's uid). A command that
//! managed to put its own socket at the path would otherwise receive the
//! host's preface and bind token.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Bytes one relay read may move.
const RELAY_BUF: usize = 1 << 20;

type Reader = Box<dyn AsyncRead + Unpin + Send>;
type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// Our stdin, read without a blocking thread when it is a pipe.
fn stdin() -> Reader {
    let fd = std::io::stdin().as_raw_fd();
    #[allow(unsafe_code)]
    // SAFETY: fd 0 is open for the life of the process and nothing else in
    // the relay reads it; ownership moves into the pipe reader.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    match tokio::net::unix::pipe::Receiver::from_owned_fd(owned) {
        Ok(r) => Box::new(r),
        Err(_) => Box::new(tokio::io::stdin()),
    }
}

/// Our stdout, written without a blocking thread when it is a pipe.
fn stdout() -> Writer {
    let fd = std::io::stdout().as_raw_fd();
    #[allow(unsafe_code)]
    // SAFETY: as for stdin: fd 1 is open and only the relay writes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    match tokio::net::unix::pipe::Sender::from_owned_fd(owned) {
        Ok(w) => Box::new(w),
        Err(_) => Box::new(tokio::io::stdout()),
    }
}

/// The socket at `path`, connected, if the agent's uid holds its other end.
pub async fn connect_to_agent(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let sock = tokio::net::UnixStream::connect(path).await?;
    let peer = sock.peer_cred()?.uid();
    let me = rustix::process::geteuid().as_raw();
    if peer != me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is held by uid {peer}, not the agent's uid {me}: refusing to relay",
                path.display()
            ),
        ));
    }
    Ok(sock)
}

pub async fn relay(path: &Path) -> std::io::Result<()> {
    let sock = connect_to_agent(path).await?;
    let (mut from_agent, mut to_agent) = sock.into_split();
    let (mut input, mut output) = (stdin(), stdout());
    // Big reads: under gVisor's ptrace platform every syscall is costly,
    // and the default 8 KiB copy made a 1 GiB upload 14x slower than
    // `docker cp`.
    let mut input = tokio::io::BufReader::with_capacity(RELAY_BUF, &mut input);
    let mut from_agent = tokio::io::BufReader::with_capacity(RELAY_BUF, &mut from_agent);
    let up = async {
        let r = tokio::io::copy_buf(&mut input, &mut to_agent).await;
        let _ = to_agent.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy_buf(&mut from_agent, &mut output).await;
        let _ = output.flush().await;
        r
    };
    tokio::pin!(up, down);
    tokio::select! {
        r = &mut down => r.map(drop),
        r = &mut up => {
            r?;
            down.await.map(drop)
        }
    }
}
