//! The Connect protocol with the JSON codec, as envd speaks it: unary calls
//! are a bare JSON body answered with JSON; streaming calls
//! (`application/connect+json`) carry envelopes `[flags u8][len u32 BE][json]`
//! and a stream ends with an end-stream envelope (flag 0x02) holding `{}` or
//! `{"error": {code, message}}`. Errors carry Connect's code strings.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Largest message read from a request.
pub const MAX_MESSAGE: usize = 16 << 20;

/// A Connect error: its code string and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// `not_found`, `invalid_argument`, `unauthenticated`, …
    pub code: &'static str,
    /// For a person.
    pub message: String,
}

impl ConnectError {
    /// An error with this code.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code, "message": self.message})
    }

    /// The end-stream envelope reporting this error.
    pub fn end_stream(&self) -> Bytes {
        envelope(0x02, &serde_json::json!({"error": self.json()}))
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.json())).into_response()
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> Self {
        let code = match (e.status, e.code) {
            (_, "already_exists") => "already_exists",
            (StatusCode::NOT_FOUND, _) => "not_found",
            (StatusCode::BAD_REQUEST, _) => "invalid_argument",
            (StatusCode::UNAUTHORIZED, _) => "unauthenticated",
            (StatusCode::FORBIDDEN, _) => "permission_denied",
            (StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY, _) => "failed_precondition",
            (StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS, _) => "resource_exhausted",
            (StatusCode::NOT_IMPLEMENTED, _) => "unimplemented",
            (StatusCode::GATEWAY_TIMEOUT, _) => "deadline_exceeded",
            (StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GONE, _) => "unavailable",
            _ => "internal",
        };
        Self::new(code, e.message)
    }
}

impl From<namzu::Error> for ConnectError {
    fn from(e: namzu::Error) -> Self {
        ApiError::from(e).into()
    }
}

/// One envelope.
pub fn envelope(flags: u8, msg: &serde_json::Value) -> Bytes {
    let json = serde_json::to_vec(msg).unwrap_or_default();
    let mut b = BytesMut::with_capacity(5 + json.len());
    b.put_u8(flags);
    b.put_u32(json.len() as u32);
    b.put_slice(&json);
    b.freeze()
}

/// The successful end of a stream.
pub fn end_ok() -> Bytes {
    envelope(0x02, &serde_json::json!({}))
}

/// The keepalive interval the SDK asked for (`Keepalive-Ping-Interval`,
/// seconds), if any.
pub fn keepalive(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(std::time::Duration::from_secs)
}

/// Resolves after `every`, or never when no keepalive was asked for.
pub async fn tick(every: Option<std::time::Duration>) {
    match every {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Whether the call is a streaming one.
pub fn is_streaming(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/connect+json"))
}

/// Splits the envelopes at the front of `buf`; returns the messages of
/// complete ones (flags, json) and leaves a partial one in `buf`.
pub fn split_envelopes(buf: &mut BytesMut) -> Result<Vec<(u8, Bytes)>, ConnectError> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(ConnectError::new(
                "resource_exhausted",
                format!("a message of {len} bytes is over {MAX_MESSAGE}"),
            ));
        }
        if buf.len() < 5 + len {
            break;
        }
        let flags = buf[0];
        let frame = buf.split_to(5 + len).freeze();
        out.push((flags, frame.slice(5..)));
    }
    Ok(out)
}

/// The one request message of a unary or server-streaming call.
pub fn request<T: DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<T, ConnectError> {
    let json = if is_streaming(headers) {
        let mut buf = BytesMut::from(&body[..]);
        let msgs = split_envelopes(&mut buf)?;
        match msgs.into_iter().next() {
            Some((_, m)) => m,
            None => return Err(ConnectError::new("invalid_argument", "no request message")),
        }
    } else {
        body.clone()
    };
    let json = if json.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        json
    };
    serde_json::from_slice(&json)
        .map_err(|e| ConnectError::new("invalid_argument", format!("bad request message: {e}")))
}

/// A streaming response fed by `rx` (envelopes, the end-stream one last).
pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let mut rx = rx;
    let body = axum::body::Body::from_stream(futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::convert::Infallible>))
    }));
    ([(http::header::CONTENT_TYPE, "application/connect+json")], body).into_response()
}

/// A streaming call that failed before its first message: 200 and an
/// end-stream envelope with the error, as Connect wants.
pub fn stream_error(e: ConnectError) -> Response {
    (
        [(http::header::CONTENT_TYPE, "application/connect+json")],
        e.end_stream(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_wait_for_the_rest() {
        let a = envelope(0, &serde_json::json!({"a": 1}));
        let b = end_ok();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&a);
        buf.extend_from_slice(&b[..3]);
        let got = split_envelopes(&mut buf).unwrap();
        assert_eq!(got, vec![(0, Bytes::from_static(b"{\"a\":1}"))]);
        assert_eq!(buf.len(), 3, "a partial envelope waits");
        buf.extend_from_slice(&b[3..]);
        assert_eq!(split_envelopes(&mut buf).unwrap(), vec![(2, Bytes::from_static(b"{}"))]);
        let mut huge = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(split_envelopes(&mut huge).unwrap_err().code, "resource_exhausted");
    }
}
