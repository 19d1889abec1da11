//! Streamed reads on a stream of their own (the read form of the
//! preface): the same request, checks and errors as `ReadFileStream`, the
//! bytes framed by [`namzu_proto::side_read`] and sent with `sendfile(2)`
//! from the page cache to the host's unix socket, never through this
//! process's memory or the link's HTTP/2 framing. At most
//! `max_side_reads` run at once; past that the host is told to use the
//! link ([`side_read::BUSY`]) and nothing is read.

use std::os::unix::net::UnixStream as StdUnix;
use std::pin::Pin;
use std::sync::Arc;

use namzu_proto::side_read::{self as frames, header};
use namzu_proto::v1::ReadFileStreamRequest;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tonic::Status;

use crate::service::AgentService;

/// Bytes promised by one data frame at most.
const FRAME_BYTES: u64 = 8 << 20;

/// Serves one side read (its preface answered) on `peer`: a unix socket,
/// or another stream, on which the read is refused.
pub async fn serve(
    service: Arc<AgentService>,
    slots: Arc<Semaphore>,
    peer: Result<tokio::net::UnixStream, Pin<Box<dyn AsyncWrite + Send>>>,
    request: Vec<u8>,
) {
    const OP: &str = "read_file_stream";
    let Some((mut unix, permit)) = admit(peer, slots, "read").await else {
        return;
    };
    let opened = async {
        service.side_fence(OP)?;
        service.side_reads_enabled(OP)?;
        let r: ReadFileStreamRequest = prost::Message::decode(request.as_slice())
            .map_err(|e| Status::invalid_argument(format!("bad read request: {e}")))?;
        let file = service.open_for_stream(OP, r.path.clone()).await?;
        Ok::<_, Status>((r, file))
    };
    let (r, file) = match opened.await {
        Ok(v) => v,
        Err(st) => {
            let _ = write_frame(&mut unix, frames::ERROR, &status_body(&st)).await;
            return;
        }
    };
    let sock = match unix.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s)) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "side read: socket unusable");
            return;
        }
    };
    let _ = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        if let Err(e) = send(&sock, &file, &r) {
            // The host gone (EPIPE), or the file failed mid-frame: the
            // stream closes without END, which the host reads as broken.
            tracing::debug!(error = %e, "side read ended early");
        }
    })
    .await;
}

/// A side stream's unix socket and its slot; `None` once the peer was told
/// why not (not a unix socket: an error; no slot left: [`frames::BUSY`]).
pub(crate) async fn admit(
    peer: Result<tokio::net::UnixStream, Pin<Box<dyn AsyncWrite + Send>>>,
    slots: Arc<Semaphore>,
    what: &str,
) -> Option<(tokio::net::UnixStream, tokio::sync::OwnedSemaphorePermit)> {
    let mut unix = match peer {
        Ok(u) => u,
        Err(mut other) => {
            let st = Status::unimplemented(format!("side {what}s are served on unix sockets only"));
            let _ = write_frame(&mut other, frames::ERROR, &status_body(&st)).await;
            return None;
        }
    };
    let Ok(permit) = slots.try_acquire_owned() else {
        tracing::debug!("side {what} refused: its limit (max_side_{what}s) at once");
        let _ = write_frame(&mut unix, frames::BUSY, &[]).await;
        return None;
    };
    Some((unix, permit))
}

pub(crate) fn status_body(st: &Status) -> Vec<u8> {
    frames::encode_status(st.code() as i32, st.message(), st.details())
}

/// Writes one whole frame.
pub(crate) async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, tag: u8, body: &[u8]) -> std::io::Result<()> {
    let mut bytes = header(tag, body.len() as u64).to_vec();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await?;
    stream.flush().await
}

/// The frames of `r` on a blocking socket: the file's size is read before
/// each frame, so a file that grows is read to its end as it is then, and
/// one that shrinks mid-frame breaks the stream rather than short it.
fn send(sock: &StdUnix, file: &std::fs::File, r: &ReadFileStreamRequest) -> std::io::Result<()> {
    use std::io::Write;
    let mut offset = r.offset;
    let end = r.length.map_or(u64::MAX, |l| r.offset.saturating_add(l));
    let mut w = sock;
    loop {
        let size = file.metadata()?.len();
        let n = size.min(end).saturating_sub(offset).min(FRAME_BYTES);
        if n == 0 {
            return w.write_all(&header(frames::END, 0));
        }
        w.write_all(&header(frames::DATA, n))?;
        let mut left = n;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(usize::MAX);
            match rustix::fs::sendfile(sock, file, Some(&mut offset), want)? {
                0 => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank mid-frame",
                    ))
                }
                k => left -= k as u64,
            }
        }
    }
}
