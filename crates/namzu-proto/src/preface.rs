//! The link preface: the few bytes a host sends on a fresh byte stream before
//! HTTP/2 starts, proving it holds the sandbox's bind token.
//!
//! ```text
//! host -> agent:  "NZL1" | token_len: u16 big-endian | token bytes
//! agent -> host:  0x00   (accepted; HTTP/2 starts right after)
//!
//! host -> agent:  "NZL2" | token_len: u16 big-endian | token bytes | flags: u8
//! agent -> host:  0x00 | hello_len: u32 big-endian | hello (a HealthResponse)
//!
//! host -> agent:  "NZE1" | token_len: u16 big-endian | token bytes | ask: u64 big-endian
//! agent -> host:  0x00   (accepted; the stream now carries egress ask `ask`, raw)
//!
//! host -> agent:  "NZE2" | as NZE1
//! agent -> host:  0x00   (accepted; the stream carries ask `ask` after a handoff, [`crate::handoff`])
//!
//! host -> agent:  "NZR1" / "NZW1" / "NZX1" | token_len: u16 | token | request_len: u32 | request
//! agent -> host:  0x00   (accepted; the stream carries that read's, write's or command's frames, [`crate::side_read`])
//! ```
//!
//! The second form asks the agent to say at once what `Health` would say
//! (with [`HELLO_PROBE_CHILD`] in the flags: with its probe child's status),
//! so a host learns the agent's version, features and limits in the round
//! trip that authenticates it, instead of one more call after HTTP/2 is up.
//! An agent older than it refuses the magic like any other, and the host
//! dials again with the first form.
//!
//! The third form joins the stream, unframed, to an egress connection the
//! agent asked the host for and the host made: one byte stream per egress
//! connection instead of frames on the shared link (offered as
//! [`crate::features::EGRESS_STREAM`]).
//!
//! A rejected peer gets no answer, only a closed stream: a wrong token, a wrong
//! magic and a token longer than the agent's bound are indistinguishable from
//! outside. The agent never reads more than `HEADER_LEN + max_token_bytes + 8`
//! bytes from an unauthenticated peer; the host reads at most
//! [`MAX_HELLO_BYTES`] of a hello.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Magic and version of the preface.
pub const MAGIC: [u8; 4] = *b"NZL1";
/// The preface that asks for a hello.
pub const MAGIC_HELLO: [u8; 4] = *b"NZL2";
/// The preface of an egress connection's own stream.
pub const MAGIC_EGRESS: [u8; 4] = *b"NZE1";
/// The preface of an egress connection's own unix stream on which the
/// agent may hand the client's socket over ([`crate::handoff`]).
pub const MAGIC_EGRESS_HANDOFF: [u8; 4] = *b"NZE2";
/// The read form: the token, then a big-endian u32 length and an encoded
/// `ReadFileStreamRequest`; the stream then carries that read's frames
/// ([`crate::side_read`]).
pub const MAGIC_READ: [u8; 4] = *b"NZR1";
/// The write form: as the read form, with an encoded `WriteBegin`; the
/// stream then carries that write's frames ([`crate::side_read`]).
pub const MAGIC_WRITE: [u8; 4] = *b"NZW1";
/// The exec form: as the read form, with an encoded `ExecStart`; the
/// stream then carries that command's output as frames
/// ([`crate::side_read`]).
pub const MAGIC_EXEC: [u8; 4] = *b"NZX1";
/// Hello flag: fork a probe child and report its status, as Health's
/// `probe_child` does.
pub const HELLO_PROBE_CHILD: u8 = 1;
/// Longest hello a host reads.
pub const MAX_HELLO_BYTES: usize = 1 << 20;
/// Magic plus the length field.
pub const HEADER_LEN: usize = 6;
/// The single byte the agent answers with when it accepts the link.
pub const ACCEPTED: u8 = 0;
/// Default bound on the token; configurable on the agent.
pub const DEFAULT_MAX_TOKEN_BYTES: usize = 256;

/// Why a preface was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PrefaceError {
    #[error("preface magic mismatch")]
    BadMagic,
    #[error("preface token of {len} bytes exceeds the bound of {limit} bytes")]
    TokenTooLong { len: usize, limit: usize },
    #[error("preface token is empty")]
    EmptyToken,
    #[error("preface request of {0} bytes exceeds the bound")]
    BadLength(usize),
    #[error("preface token does not match")]
    WrongToken,
    #[error("peer closed the stream during the preface")]
    Truncated,
    #[error("the agent refused the link (bad token or wrong protocol)")]
    Refused,
    #[error("i/o during the preface: {0}")]
    Io(String),
    #[error("the agent's hello is {len} bytes, over the bound of {limit}")]
    HelloTooLong { len: usize, limit: usize },
}

/// What a peer asked for in its preface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// `NZL1`: just the link.
    Plain,
    /// `NZL2`: the link, after a hello; the flags it gave.
    Hello { flags: u8 },
    /// `NZE1`: the raw stream of egress ask `ask`; `NZE2` (`handoff`):
    /// the same after the agent's handoff offer.
    Egress { ask: u64, handoff: bool },
    /// `NZR1`: a streamed read on this stream; the encoded request.
    Read { request: Vec<u8> },
    /// `NZW1`: a streamed write on this stream; the encoded `WriteBegin`.
    Write { request: Vec<u8> },
    /// `NZX1`: a command whose output travels on this stream; the encoded
    /// `ExecStart`.
    Exec { request: Vec<u8> },
}

impl Offer {
    /// Whether the stream, once accepted, carries one side operation's
    /// frames (a read, a write or a command) rather than HTTP/2 or egress.
    pub fn carries_request(&self) -> bool {
        matches!(self, Offer::Read { .. } | Offer::Write { .. } | Offer::Exec { .. })
    }
}

/// Parses a complete or partial preface held in `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((token, used)))`
/// once a whole preface is present. Errors as soon as the bytes seen so far
/// cannot become a valid preface, so a hostile peer is dropped early.
pub fn parse(buf: &[u8], max_token_bytes: usize) -> Result<Option<(&[u8], usize)>, PrefaceError> {
    let magic_seen = buf.len().min(MAGIC.len());
    if buf[..magic_seen] != MAGIC[..magic_seen] {
        return Err(PrefaceError::BadMagic);
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
    if len == 0 {
        return Err(PrefaceError::EmptyToken);
    }
    if len > max_token_bytes {
        return Err(PrefaceError::TokenTooLong {
            len,
            limit: max_token_bytes,
        });
    }
    let end = HEADER_LEN + len;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((&buf[HEADER_LEN..end], end)))
}

/// Encodes the preface for `token`. Tokens longer than `u16::MAX` are refused.
pub fn encode(token: &[u8]) -> Result<Vec<u8>, PrefaceError> {
    let len = u16::try_from(token.len()).map_err(|_| PrefaceError::TokenTooLong {
        len: token.len(),
        limit: usize::from(u16::MAX),
    })?;
    if len == 0 {
        return Err(PrefaceError::EmptyToken);
    }
    let mut out = Vec::with_capacity(HEADER_LEN + token.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(token);
    Ok(out)
}

/// Compares without an early exit, so timing does not leak a prefix match.
pub fn token_matches(expected: &[u8], got: &[u8]) -> bool {
    if expected.len() != got.len() {
        return false;
    }
    expected.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Agent side: reads one preface of either form, at most `HEADER_LEN +
/// max_token_bytes + 1` bytes, and says what it asked for if the token
/// matches. Writes nothing: the caller answers with [`answer`]. The caller
/// bounds the time this may take.
pub async fn read_offer<S>(stream: &mut S, expected: &[u8], max_token_bytes: usize) -> Result<Offer, PrefaceError>
where
    S: AsyncRead + Unpin,
{
    let mut buf = vec![0u8; HEADER_LEN];
    read_exact(stream, &mut buf).await?;
    let magic = [buf[0], buf[1], buf[2], buf[3]];
    // What follows the token: a flags byte (hello), an ask id (egress).
    let trailer = match magic {
        MAGIC_HELLO => 1,
        MAGIC_EGRESS | MAGIC_EGRESS_HANDOFF => 8,
        MAGIC_READ | MAGIC_WRITE | MAGIC_EXEC => 4,
        _ => 0,
    };
    if trailer > 0 {
        // Validated as the plain form: the rest of the header is the same.
        buf[..4].copy_from_slice(&MAGIC);
    }
    // Validates the magic and the length before reading the token.
    parse(&buf, max_token_bytes)?;
    let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
    buf.resize(HEADER_LEN + len, 0);
    read_exact(stream, &mut buf[HEADER_LEN..]).await?;
    // Read before the token is judged, so a refused peer leaves nothing
    // unread (and sees a close, not a reset).
    let mut rest = [0u8; 8];
    read_exact(stream, &mut rest[..trailer]).await?;
    let mut request = Vec::new();
    if trailer == 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > crate::side_read::MAX_REQUEST_BYTES {
            return Err(PrefaceError::BadLength(len));
        }
        request.resize(len, 0);
        read_exact(stream, &mut request).await?;
    }
    match parse(&buf, max_token_bytes)? {
        Some((token, _)) if token_matches(expected, token) => {}
        Some(_) => return Err(PrefaceError::WrongToken),
        None => return Err(PrefaceError::Truncated),
    }
    Ok(match magic {
        MAGIC_HELLO => Offer::Hello { flags: rest[0] },
        MAGIC_EGRESS | MAGIC_EGRESS_HANDOFF => Offer::Egress {
            ask: u64::from_be_bytes(rest),
            handoff: magic == MAGIC_EGRESS_HANDOFF,
        },
        MAGIC_READ => Offer::Read { request },
        MAGIC_WRITE => Offer::Write { request },
        MAGIC_EXEC => Offer::Exec { request },
        _ => Offer::Plain,
    })
}

/// Agent side: accepts the link, with `hello` when the peer asked for one.
pub async fn answer<S>(stream: &mut S, hello: Option<&[u8]>) -> Result<(), PrefaceError>
where
    S: AsyncWrite + Unpin,
{
    let mut out = vec![ACCEPTED];
    if let Some(h) = hello {
        let len = u32::try_from(h.len()).map_err(|_| PrefaceError::HelloTooLong {
            len: h.len(),
            limit: MAX_HELLO_BYTES,
        })?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(h);
    }
    stream
        .write_all(&out)
        .await
        .map_err(|e| PrefaceError::Io(e.to_string()))?;
    stream.flush().await.map_err(|e| PrefaceError::Io(e.to_string()))
}

/// Agent side: reads a plain preface and answers [`ACCEPTED`] if the token
/// matches (a hello preface is refused).
pub async fn accept<S>(stream: &mut S, expected: &[u8], max_token_bytes: usize) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match read_offer(stream, expected, max_token_bytes).await? {
        Offer::Plain => answer(stream, None).await,
        Offer::Hello { .. } | Offer::Egress { .. } | Offer::Read { .. } | Offer::Write { .. } | Offer::Exec { .. } => {
            Err(PrefaceError::BadMagic)
        }
    }
}

/// Host side: sends the preface and waits for the agent's acceptance.
pub async fn offer<S>(stream: &mut S, token: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_and_accept(stream, &encode(token)?).await
}

/// Sends a preface's bytes and waits for the acceptance byte.
async fn send_and_accept<S>(stream: &mut S, bytes: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(bytes)
        .await
        .map_err(|e| PrefaceError::Io(e.to_string()))?;
    stream.flush().await.map_err(|e| PrefaceError::Io(e.to_string()))?;
    read_accepted(stream).await
}

async fn read_accepted<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(), PrefaceError> {
    let mut answer = [0u8; 1];
    match stream.read(&mut answer).await {
        Ok(0) => Err(PrefaceError::Refused),
        Ok(_) if answer[0] == ACCEPTED => Ok(()),
        Ok(_) => Err(PrefaceError::Refused),
        // A peer that closes with bytes of ours unread resets the stream:
        // a refusal as much as a plain close.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Err(PrefaceError::Refused),
        Err(e) => Err(PrefaceError::Io(e.to_string())),
    }
}

/// Host side: sends the egress form of the preface for ask `ask` and
/// waits for the agent's acceptance; the stream is then that egress
/// connection's, raw.
pub async fn offer_egress<S>(stream: &mut S, token: &[u8], ask: u64, handoff: bool) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut bytes = encode(token)?;
    bytes[..4].copy_from_slice(if handoff { &MAGIC_EGRESS_HANDOFF } else { &MAGIC_EGRESS });
    bytes.extend_from_slice(&ask.to_be_bytes());
    send_and_accept(stream, &bytes).await
}

/// Host side: sends the read form of the preface with `request` (an
/// encoded `ReadFileStreamRequest`) and waits for the agent's acceptance;
/// the stream then carries that read's frames.
pub async fn offer_read<S>(stream: &mut S, token: &[u8], request: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    offer_side(stream, MAGIC_READ, token, request).await
}

/// Host side: the write form, with `request` an encoded `WriteBegin`.
pub async fn offer_write<S>(stream: &mut S, token: &[u8], request: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    offer_side(stream, MAGIC_WRITE, token, request).await
}

/// Host side: the exec form, with `request` an encoded `ExecStart`. The
/// agent runs the command once it has checked the token, and answers its
/// acceptance together with the first frame.
pub async fn offer_exec<S>(stream: &mut S, token: &[u8], request: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    offer_side(stream, MAGIC_EXEC, token, request).await
}

async fn offer_side<S>(stream: &mut S, magic: [u8; 4], token: &[u8], request: &[u8]) -> Result<(), PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_and_accept(stream, &side_offer(magic, token, request)?).await
}

/// The bytes of a side form of the preface (`magic` one of the read,
/// write or exec forms'), for a host that writes them itself and then
/// waits with [`read_acceptance`].
pub fn side_offer(magic: [u8; 4], token: &[u8], request: &[u8]) -> Result<Vec<u8>, PrefaceError> {
    if request.len() > crate::side_read::MAX_REQUEST_BYTES {
        return Err(PrefaceError::BadLength(request.len()));
    }
    let mut bytes = encode(token)?;
    bytes[..4].copy_from_slice(&magic);
    bytes.extend_from_slice(&(request.len() as u32).to_be_bytes());
    bytes.extend_from_slice(request);
    Ok(bytes)
}

/// Host side: the agent's answer to a preface already written;
/// [`PrefaceError::Refused`] for a refusal or a close.
pub async fn read_acceptance<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(), PrefaceError> {
    read_accepted(stream).await
}

/// Host side: sends the hello form of the preface and returns the agent's
/// hello (an encoded `HealthResponse`). [`PrefaceError::Refused`] from an
/// agent that does not know the form, as from a wrong token.
pub async fn offer_hello<S>(stream: &mut S, token: &[u8], flags: u8) -> Result<Vec<u8>, PrefaceError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut bytes = encode(token)?;
    bytes[..4].copy_from_slice(&MAGIC_HELLO);
    bytes.push(flags);
    stream
        .write_all(&bytes)
        .await
        .map_err(|e| PrefaceError::Io(e.to_string()))?;
    stream.flush().await.map_err(|e| PrefaceError::Io(e.to_string()))?;
    read_accepted(stream).await?;
    let mut len = [0u8; 4];
    read_exact(stream, &mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_HELLO_BYTES {
        return Err(PrefaceError::HelloTooLong {
            len,
            limit: MAX_HELLO_BYTES,
        });
    }
    let mut hello = vec![0u8; len];
    read_exact(stream, &mut hello).await?;
    Ok(hello)
}

async fn read_exact<S: AsyncRead + Unpin>(s: &mut S, buf: &mut [u8]) -> Result<(), PrefaceError> {
    match s.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(PrefaceError::Truncated),
        Err(e) => Err(PrefaceError::Io(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hello_preface_gets_the_hello_and_a_plain_accept_refuses_it() {
        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move {
            let offer = read_offer(&mut agent, b"tok", 16).await.unwrap();
            assert_eq!(
                offer,
                Offer::Hello {
                    flags: HELLO_PROBE_CHILD
                }
            );
            answer(&mut agent, Some(b"hello bytes")).await.unwrap();
            agent
        });
        let hello = offer_hello(&mut host, b"tok", HELLO_PROBE_CHILD).await.unwrap();
        assert_eq!(hello, b"hello bytes");
        served.await.unwrap();

        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move { accept(&mut agent, b"tok", 16).await });
        // An agent that only knows the plain form closes without a word.
        let refused = tokio::spawn(async move { offer_hello(&mut host, b"tok", 0).await });
        assert_eq!(served.await.unwrap(), Err(PrefaceError::BadMagic));
        assert_eq!(refused.await.unwrap(), Err(PrefaceError::Refused));

        for handoff in [false, true] {
            let (mut host, mut agent) = tokio::io::duplex(4096);
            let served = tokio::spawn(async move {
                let offer = read_offer(&mut agent, b"tok", 16).await.unwrap();
                answer(&mut agent, None).await.unwrap();
                offer
            });
            offer_egress(&mut host, b"tok", 0x0102_0304_0506_0708, handoff)
                .await
                .unwrap();
            assert_eq!(
                served.await.unwrap(),
                Offer::Egress {
                    ask: 0x0102_0304_0506_0708,
                    handoff
                }
            );
        }

        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move {
            let offer = read_offer(&mut agent, b"tok", 16).await.unwrap();
            answer(&mut agent, None).await.unwrap();
            offer
        });
        offer_read(&mut host, b"tok", b"encoded request").await.unwrap();
        assert_eq!(
            served.await.unwrap(),
            Offer::Read {
                request: b"encoded request".to_vec()
            }
        );

        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move {
            let offer = read_offer(&mut agent, b"tok", 16).await.unwrap();
            answer(&mut agent, None).await.unwrap();
            offer
        });
        offer_write(&mut host, b"tok", b"encoded begin").await.unwrap();
        assert_eq!(
            served.await.unwrap(),
            Offer::Write {
                request: b"encoded begin".to_vec()
            }
        );
        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move {
            let offer = read_offer(&mut agent, b"tok", 16).await.unwrap();
            answer(&mut agent, None).await.unwrap();
            offer
        });
        offer_exec(&mut host, b"tok", b"encoded start").await.unwrap();
        let offer = served.await.unwrap();
        assert!(offer.carries_request());
        assert_eq!(
            offer,
            Offer::Exec {
                request: b"encoded start".to_vec()
            }
        );
        // A request length past the bound is refused before it is read.
        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move { read_offer(&mut agent, b"tok", 16).await });
        let mut bytes = encode(b"tok").unwrap();
        bytes[..4].copy_from_slice(&MAGIC_READ);
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        tokio::io::AsyncWriteExt::write_all(&mut host, &bytes).await.unwrap();
        assert_eq!(served.await.unwrap(), Err(PrefaceError::BadLength(u32::MAX as usize)));

        let (mut host, mut agent) = tokio::io::duplex(4096);
        let served = tokio::spawn(async move { read_offer(&mut agent, b"tok", 16).await });
        let wrong = tokio::spawn(async move { offer_hello(&mut host, b"bad", 0).await });
        assert_eq!(served.await.unwrap(), Err(PrefaceError::WrongToken));
        assert_eq!(wrong.await.unwrap(), Err(PrefaceError::Refused));
    }

    #[test]
    fn round_trip() {
        let bytes = encode(b"secret").unwrap();
        assert_eq!(parse(&bytes, 16).unwrap(), Some((&b"secret"[..], bytes.len())));
    }

    #[test]
    fn partial_needs_more_and_bad_magic_fails_early() {
        let bytes = encode(b"secret").unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut], 16).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(parse(b"GET ", 16), Err(PrefaceError::BadMagic));
        assert_eq!(parse(b"N", 16).unwrap(), None);
        assert_eq!(parse(b"X", 16), Err(PrefaceError::BadMagic));
    }

    #[test]
    fn overlong_token_refused_from_header_alone() {
        let mut hdr = MAGIC.to_vec();
        hdr.extend_from_slice(&1000u16.to_be_bytes());
        assert_eq!(
            parse(&hdr, 256),
            Err(PrefaceError::TokenTooLong { len: 1000, limit: 256 })
        );
    }

    #[test]
    fn a_token_of_exactly_the_limit_is_accepted() {
        let token = [b't'; 256];
        let bytes = encode(&token).unwrap();
        assert_eq!(parse(&bytes, 256).unwrap(), Some((&token[..], bytes.len())));
        assert!(matches!(
            parse(&bytes, 255),
            Err(PrefaceError::TokenTooLong { len: 256, limit: 255 })
        ));
    }

    #[test]
    fn token_compare() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
        // Two differences that would cancel out if they were xor-ed
        // together instead of or-ed.
        assert!(!token_matches(b"ab", b"ba"));
    }

    #[tokio::test]
    async fn an_answer_other_than_accepted_is_a_refusal() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let agent = tokio::spawn(async move {
            let mut buf = vec![0u8; HEADER_LEN + 3];
            b.read_exact(&mut buf).await.unwrap();
            b.write_all(&[ACCEPTED.wrapping_add(1)]).await.unwrap();
            b
        });
        assert_eq!(within(offer(&mut a, b"tok")).await, Err(PrefaceError::Refused));
        drop(within(agent).await);
    }

    /// A peer that stops early is `Truncated`; any other read failure is
    /// `Io`, not mistaken for it.
    #[tokio::test]
    async fn early_end_and_read_errors_are_told_apart() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&encode(b"token").unwrap()[..HEADER_LEN + 2]).await.unwrap();
        drop(a);
        assert_eq!(within(accept(&mut b, b"token", 16)).await, Err(PrefaceError::Truncated));

        struct Broken;
        impl AsyncRead for Broken {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                _: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Err(std::io::Error::other("the link broke")))
            }
        }
        let mut buf = [0u8; 4];
        assert!(
            matches!(read_exact(&mut Broken, &mut buf).await, Err(PrefaceError::Io(m)) if m.contains("the link broke"))
        );
    }

    /// Bounded: a broken encoder must fail the test, not hang it.
    async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(5), f)
            .await
            .expect("the preface exchange hung")
    }

    #[tokio::test]
    async fn accept_and_offer_over_a_duplex() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let agent = tokio::spawn(async move { accept(&mut b, b"tok", 16).await });
        within(offer(&mut a, b"tok")).await.unwrap();
        within(agent).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn wrong_token_gets_no_answer() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let agent = tokio::spawn(async move {
            let r = accept(&mut b, b"tok", 16).await;
            drop(b);
            r
        });
        assert_eq!(within(offer(&mut a, b"bad")).await, Err(PrefaceError::Refused));
        assert_eq!(within(agent).await.unwrap(), Err(PrefaceError::WrongToken));
    }
}
