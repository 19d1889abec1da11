//! A link to a sandbox its tier may hold still on purpose (a VM paused
//! whole, [`LinkGuard::held`]): how its silence is told from a dead
//! agent's, for the streams' heartbeat bounds and the link's own
//! keepalive ([`super::keepalive`]).

use super::link::*;

impl Inner {
    pub(super) fn held(&self) -> bool {
        self.guard.get().is_some_and(|g| g.held(&self.sandbox_id))
    }
}

impl super::keepalive::Peer for Inner {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
    fn held(&self) -> bool {
        Inner::held(self)
    }
    fn ping(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rpc = self.rpc.clone();
        Box::pin(async move {
            let _ = rpc.health(v1::HealthRequest { probe_child: false }).await;
        })
    }
    fn name(&self) -> &str {
        &self.sandbox_id
    }
}

impl AgentClient {
    /// Whether the sandbox is held still on purpose ([`LinkGuard::held`]).
    pub(super) fn held(&self) -> bool {
        self.inner.held()
    }

    /// `next` within `silence` (none: unbounded), where silence while the
    /// sandbox is held does not count, nor the interval in which a hold
    /// ended; `None`: the peer was silent that long outside a hold.
    pub(super) async fn within<T>(&self, silence: Option<Duration>, next: impl Future<Output = T>) -> Option<T> {
        let Some(d) = silence else {
            return Some(next.await);
        };
        tokio::pin!(next);
        let mut after_hold = false;
        loop {
            match tokio::time::timeout(d, &mut next).await {
                Ok(v) => return Some(v),
                Err(_) if self.held() => after_hold = true,
                // The hold ended within the last interval: a whole one more.
                Err(_) if std::mem::take(&mut after_hold) => {}
                Err(_) => return None,
            }
        }
    }
}
