//! HTTP/1.1 framing the plain-HTTP proxy needs to forward exactly ONE
//! request per upstream connection: where a request body ends
//! (`Content-Length`, or `Transfer-Encoding: chunked` walked chunk by
//! chunk), and which `Host` the request names. Bytes a client sends after
//! its first request's body (a pipelined request to another host on the
//! same CDN, say) are never forwarded. The head itself is parsed by
//! `httparse` (hyper's parser, already in the agent for its gRPC server),
//! and so are chunk sizes.

/// How the body of a request is delimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// No body (neither header).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding, ending at the last chunk and trailers.
    Chunked(Chunked),
}

/// Why a request head was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("more than one Host header")]
    DuplicateHost,
    #[error("Host header {got:?} does not name the requested host {want:?}")]
    HostMismatch { got: String, want: String },
    #[error("Content-Length {0:?} is not one length")]
    BadLength(String),
    #[error("Transfer-Encoding {0:?}: only chunked is forwarded")]
    BadCoding(String),
    #[error("both Content-Length and Transfer-Encoding")]
    Ambiguous,
    #[error("header {0} is not text")]
    NotText(String),
}

/// `authority` (as in the URL) in a comparable form: lower case, without
/// the scheme's default port.
fn canonical_authority(a: &str, default_port: u16) -> String {
    let a = a.trim().to_ascii_lowercase();
    let suffix = format!(":{default_port}");
    match a.strip_suffix(&suffix) {
        Some(h) if !h.is_empty() && (h.starts_with('[') == h.ends_with(']')) => h.to_owned(),
        _ => a,
    }
}

/// Checks the headers of a request (as `httparse` parsed them) for
/// `authority` (the checked target): at most one Host, naming it; returns
/// the body framing.
pub fn check_head(headers: &[httparse::Header<'_>], authority: &str, default_port: u16) -> Result<Body, HeadError> {
    let want = canonical_authority(authority, default_port);
    let (mut host_seen, mut length, mut coding) = (false, None::<String>, None::<String>);
    for h in headers {
        let name = h.name.to_ascii_lowercase();
        if !matches!(name.as_str(), "host" | "content-length" | "transfer-encoding") {
            continue;
        }
        let value = std::str::from_utf8(h.value)
            .map_err(|_| HeadError::NotText(h.name.to_owned()))?
            .trim();
        match name.as_str() {
            "host" => {
                if host_seen {
                    return Err(HeadError::DuplicateHost);
                }
                host_seen = true;
                if canonical_authority(value, default_port) != want {
                    return Err(HeadError::HostMismatch {
                        got: value.to_owned(),
                        want: authority.to_owned(),
                    });
                }
            }
            "content-length" => {
                if length.as_deref().is_some_and(|l| l != value) {
                    return Err(HeadError::BadLength(value.to_owned()));
                }
                length = Some(value.to_owned());
            }
            "transfer-encoding" => coding = Some(value.to_ascii_lowercase()),
            _ => {}
        }
    }
    match (length, coding) {
        (Some(_), Some(_)) => Err(HeadError::Ambiguous),
        (None, Some(c)) if c == "chunked" => Ok(Body::Chunked(Chunked::default())),
        (None, Some(c)) => Err(HeadError::BadCoding(c)),
        (Some(l), None) => l.parse().map(Body::Length).map_err(|_| HeadError::BadLength(l)),
        (None, None) => Ok(Body::None),
    }
}

/// The state of a chunked body being walked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunked {
    state: State,
    line: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum State {
    /// Reading a chunk-size line.
    #[default]
    Size,
    /// Inside chunk data, this many bytes left, then CRLF.
    Data(u64),
    /// The CRLF after chunk data: this many bytes left.
    DataEnd(u8),
    /// Trailer lines after the last chunk, until an empty one.
    Trailers,
    Done,
}

/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 8 * 1024;

impl Body {
    /// Feeds the next `bytes` of the body; returns how many of them belong
    /// to it (the rest follow the request), or an error for a malformed
    /// chunked body.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<usize, &'static str> {
        match self {
            Body::None => Ok(0),
            Body::Length(left) => {
                let n = (*left).min(bytes.len() as u64);
                *left -= n;
                Ok(n as usize)
            }
            Body::Chunked(c) => c.feed(bytes),
        }
    }

    /// Whether the whole body has passed.
    pub fn done(&self) -> bool {
        match self {
            Body::None => true,
            Body::Length(left) => *left == 0,
            Body::Chunked(c) => c.state == State::Done,
        }
    }
}

impl Chunked {
    fn feed(&mut self, bytes: &[u8]) -> Result<usize, &'static str> {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Done => return Ok(i),
                State::Data(left) => {
                    let n = left.min((bytes.len() - i) as u64);
                    i += n as usize;
                    self.state = if left == n {
                        State::DataEnd(2)
                    } else {
                        State::Data(left - n)
                    };
                }
                State::DataEnd(k) => {
                    if bytes[i] != if k == 2 { b'\r' } else { b'\n' } {
                        return Err("chunk data not followed by CRLF");
                    }
                    i += 1;
                    self.state = if k == 2 { State::DataEnd(1) } else { State::Size };
                }
                State::Size | State::Trailers => {
                    let b = bytes[i];
                    i += 1;
                    self.line.push(b);
                    if self.line.len() > MAX_LINE {
                        return Err("chunk line too long");
                    }
                    if b != b'\n' {
                        continue;
                    }
                    let line = String::from_utf8_lossy(&self.line).trim_end().to_owned();
                    self.line.clear();
                    self.state = if self.state == State::Trailers {
                        if line.is_empty() {
                            State::Done
                        } else {
                            State::Trailers
                        }
                    } else {
                        match httparse::parse_chunk_size(format!("{line}\r\n").as_bytes()) {
                            Ok(httparse::Status::Complete((_, 0))) => State::Trailers,
                            Ok(httparse::Status::Complete((_, n))) => State::Data(n),
                            _ => return Err("bad chunk size"),
                        }
                    };
                }
            }
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A request with these header lines, through `httparse`, checked
    /// for `authority`.
    fn head_for(lines: &[&str], authority: &str) -> Result<Body, HeadError> {
        let text: String = lines.iter().map(|l| format!("{l}\r\n")).collect();
        let raw = format!("GET http://{authority}/ HTTP/1.1\r\n{text}\r\n");
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(raw.as_bytes()).unwrap().is_complete());
        check_head(req.headers, authority, 80)
    }

    fn head(lines: &[&str]) -> Result<Body, HeadError> {
        head_for(lines, "allowed.test")
    }

    #[test]
    fn host_must_name_the_checked_target() {
        assert_eq!(head(&["Host: allowed.test"]), Ok(Body::None));
        assert_eq!(head(&["host: ALLOWED.test:80"]), Ok(Body::None));
        assert_eq!(head(&[]), Ok(Body::None));
        assert!(matches!(
            head(&["Host: other.test"]),
            Err(HeadError::HostMismatch { .. })
        ));
        assert!(matches!(
            head(&["Host: allowed.test:8080"]),
            Err(HeadError::HostMismatch { .. })
        ));
        assert_eq!(
            head(&["Host: allowed.test", "Host: other.test"]),
            Err(HeadError::DuplicateHost)
        );
        assert_eq!(head_for(&["Host: [2001:db8::1]"], "[2001:db8::1]:80"), Ok(Body::None));
        // A Host that is not text names nothing.
        let mut headers = [httparse::EMPTY_HEADER; 4];
        let mut req = httparse::Request::new(&mut headers);
        let raw = b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\xff\r\n\r\n";
        assert!(req.parse(raw).unwrap().is_complete());
        assert_eq!(
            check_head(req.headers, "allowed.test", 80),
            Err(HeadError::NotText("Host".into()))
        );
    }

    #[test]
    fn bodies_are_framed() {
        assert_eq!(head(&["Content-Length: 5"]), Ok(Body::Length(5)));
        assert!(matches!(
            head(&["Content-Length: 5", "Content-Length: 6"]),
            Err(HeadError::BadLength(_))
        ));
        assert_eq!(
            head(&["Content-Length: 5", "Transfer-Encoding: chunked"]),
            Err(HeadError::Ambiguous)
        );
        assert!(matches!(
            head(&["Transfer-Encoding: gzip"]),
            Err(HeadError::BadCoding(_))
        ));
        let mut b = head(&["Content-Length: 5"]).unwrap();
        assert_eq!(b.feed(b"helloGET / HTTP/1.1"), Ok(5));
        assert!(b.done());
    }

    #[test]
    fn chunked_bodies_end_at_the_last_chunk_and_trailers() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nGET http://other.test/ HTTP/1.1\r\n";
        let end = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        // Whole, and one byte at a time.
        let mut b = head(&["Transfer-Encoding: chunked"]).unwrap();
        assert_eq!(b.feed(body), Ok(end));
        assert!(b.done());
        let mut b = head(&["Transfer-Encoding: chunked"]).unwrap();
        let mut taken = 0;
        for byte in body.iter() {
            taken += b.feed(std::slice::from_ref(byte)).unwrap();
        }
        assert_eq!(taken, end);
        let mut b = head(&["Transfer-Encoding: chunked"]).unwrap();
        assert!(b.feed(b"zz\r\n").is_err());
    }
}
