//! Ports inside a sandbox, reached the way E2B's `get_host(port)` URLs
//! are: a request naming another `E2b-Sandbox-Port` than envd's is sent,
//! as HTTP/1.1, over a TCP connection to that port on the sandbox's
//! loopback (carried by the agent's link; nothing is published on the
//! host). WebSocket and other upgrades are spliced both ways.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

use super::control::E2bError;
use crate::registry::Record;
use crate::state::AppState;

/// Headers that address this server, never the service in the sandbox.
const OURS: [&str; 4] = [
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "x-access-token",
    "e2b-traffic-access-token",
];

/// Sends `req` to `port` inside the sandbox of `rec` and relays the answer.
pub async fn forward(st: AppState, rec: Record, port: u16, mut req: Request) -> Response {
    let unavailable = |m: String| E2bError(StatusCode::BAD_GATEWAY, m).into_response();
    let sb = match st.registry.sandbox(&rec.owner, &rec.id).await {
        Ok((_, sb)) => sb,
        Err(e) => return unavailable(e.message),
    };
    let conn = match sb.network().connect(port).await {
        Ok(c) => c,
        Err(e) => return unavailable(format!("port {port} inside sandbox {}: {e}", rec.id)),
    };
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(conn)).await {
        Ok(x) => x,
        Err(e) => return unavailable(format!("port {port}: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!("proxied connection: {e}");
        }
    });
    for h in OURS {
        req.headers_mut().remove(h);
    }
    let client_side = req
        .headers()
        .contains_key(http::header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    let mut resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return unavailable(format!("port {port}: {e}")),
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let upstream = hyper::upgrade::on(&mut resp);
            let metrics = st.clone();
            tokio::spawn(async move {
                let (Ok(c), Ok(u)) = (client_side.await, upstream.await) else {
                    return;
                };
                let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                if let Ok((a, b)) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    metrics.metrics.moved("tcp_in", a);
                    metrics.metrics.moved("tcp_out", b);
                }
            });
        }
    }
    resp.map(axum::body::Body::new).into_response()
}
