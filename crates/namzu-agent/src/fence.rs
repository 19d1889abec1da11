//! The retiring fence, in one place for every RPC.
//!
//! A kill the agent could not confirm leaves a process group that may
//! still be running; the agent then *retires*: it must serve nothing that
//! acts on, reads from or reports about a sandbox whose state it can no
//! longer vouch for. Only `Health` (which says `retiring`) and `Cancel`
//! (which may still confirm the kill) pass. The fence is a tower layer in
//! front of the whole gRPC service, keyed on the request path, so an RPC
//! added later is fenced without anyone remembering to.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use namzu_proto::v1::agent_error::Kind;
use tonic::body::BoxBody;
use tonic::server::NamedService;

use crate::op_error::IntoStatus;

/// The RPCs a retiring agent still serves, by method name.
pub const SERVED_WHILE_RETIRING: &[&str] = &["Health", "Cancel"];

/// Whether the agent is retiring now.
pub type Retiring = Arc<dyn Fn() -> bool + Send + Sync>;

/// The gRPC service `S` behind the fence.
#[derive(Clone)]
pub struct Fence<S> {
    inner: S,
    retiring: Retiring,
}

impl<S> Fence<S> {
    pub fn new(inner: S, retiring: Retiring) -> Self {
        Self { inner, retiring }
    }
}

impl<S: NamedService> NamedService for Fence<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for Fence<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<BoxBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
        if (self.retiring)() && !SERVED_WHILE_RETIRING.contains(&method.as_str()) {
            let status = crate::op_error::agent_err(
                Kind::Retiring,
                &method,
                "agent is retiring after an unconfirmed kill; only health and cancel are served",
            )
            .into_status();
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    /// Stands in for the generated server: counts what reaches it.
    #[derive(Clone)]
    struct Inner(Arc<AtomicUsize>);

    impl tower::Service<http::Request<()>> for Inner {
        type Response = http::Response<BoxBody>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(http::Response::new(tonic::body::empty_body())) })
        }
    }

    /// Every RPC of the protocol, read from the .proto itself so that a new
    /// one cannot escape this test.
    fn rpcs() -> Vec<String> {
        include_str!("../../namzu-proto/proto/namzu/agent/v1/agent.proto")
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap().trim().to_owned())
            .collect()
    }

    /// Audit item 9: a retiring agent refuses every RPC but Health and
    /// Cancel with a Retiring error naming the op; a healthy one serves all.
    #[tokio::test]
    async fn every_rpc_but_health_and_cancel_is_fenced() {
        use tower::ServiceExt;
        let rpcs = rpcs();
        assert_eq!(rpcs.len(), 28, "{rpcs:?}");
        let flag = Arc::new(AtomicBool::new(false));
        let reached = Arc::new(AtomicUsize::new(0));
        let f = flag.clone();
        let fence = Fence::new(Inner(reached.clone()), Arc::new(move || f.load(Ordering::SeqCst)));
        let call = |rpc: &str| {
            let req = http::Request::builder()
                .uri(format!("/namzu.agent.v1.Agent/{rpc}"))
                .body(())
                .unwrap();
            fence.clone().oneshot(req)
        };
        for rpc in &rpcs {
            call(rpc).await.unwrap();
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            rpcs.len(),
            "a healthy agent serves every RPC"
        );

        flag.store(true, Ordering::SeqCst);
        reached.store(0, Ordering::SeqCst);
        for rpc in &rpcs {
            let resp = call(rpc).await.unwrap();
            let served = SERVED_WHILE_RETIRING.contains(&rpc.as_str());
            if served {
                continue;
            }
            let status = tonic::Status::from_header_map(resp.headers()).expect("a grpc status");
            let err = namzu_proto::error_from_status(&status).expect("a typed agent error");
            assert_eq!(err.kind, Kind::Retiring as i32, "{rpc}");
            assert_eq!(err.op, *rpc);
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            SERVED_WHILE_RETIRING.len(),
            "only health and cancel reached the service"
        );
    }
}
