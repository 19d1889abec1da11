//! The lease on a claimed (or directly created) sandbox: its shutdown time
//! is kept `claim_ttl` ahead, renewed every half TTL while the handle
//! lives. A failed renewal is retried on a backoff of 1 s doubling, capped
//! at min(30 s, TTL/20), each failure handed to the caller's callback (the
//! library logs nothing on its own behalf beyond `tracing`). A 404/410
//! means the object is gone: the loop stops, and the handle's next call
//! fails with [`namzu_core::Error::SandboxGone`]. Dropping the lease stops it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::api::{Api, ApiError, Resource};
use crate::clock::rfc3339_ceil;

/// Called with every failed renewal.
pub type RenewalErrorCallback = Arc<dyn Fn(&ApiError) + Send + Sync>;

/// Which object's shutdown time the lease moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leased {
    /// `spec.lifecycle.shutdownTime` of a SandboxClaim.
    Claim,
    /// `spec.shutdownTime` of a Sandbox.
    Sandbox,
}

impl Leased {
    fn patch(self, until: SystemTime) -> Value {
        let t = rfc3339_ceil(until);
        match self {
            Self::Claim => json!({"spec": {"lifecycle": {"shutdownTime": t}}}),
            Self::Sandbox => json!({"spec": {"shutdownTime": t}}),
        }
    }
}

/// The longest wait between retries of a failed renewal.
pub fn backoff_cap(ttl: Duration) -> Duration {
    (ttl / 20).min(Duration::from_secs(30))
}

/// The waits between retries: 1 s doubling, capped.
pub fn backoff(ttl: Duration) -> impl Iterator<Item = Duration> {
    let cap = backoff_cap(ttl);
    std::iter::successors(Some(Duration::from_secs(1)), |d| Some(*d * 2)).map(move |d| d.min(cap))
}

/// A running lease.
pub struct Lease {
    gone: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    release: Arc<Release>,
}

/// What giving the object back needs, from the link's guard.
struct Release {
    api: Api,
    resource: Resource,
    name: String,
    gone: Arc<AtomicBool>,
    renewal: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Release {
    /// Stops the renewal and deletes the object (in the background: the
    /// caller is inside a failing op). Every later op meets `SandboxGone`.
    fn now(&self) -> String {
        if let Some(h) = self.renewal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            h.abort();
        }
        self.gone.store(true, Ordering::SeqCst);
        let (api, resource, name) = (self.api.clone(), self.resource.clone(), self.name.clone());
        tokio::spawn(async move {
            match api.delete(&resource, &name).await {
                Ok(_) | Err(ApiError::AlreadyGone { .. }) => {
                    tracing::info!(%name, "released after an unconfirmed cancel");
                }
                Err(e) => tracing::warn!(%name, error = %e, "could not release after an unconfirmed cancel"),
            }
        });
        format!(
            "nobody can vouch for what still runs in it, so its {} {} was released and the controller deletes its pod; the lease is no longer renewed",
            self.resource.plural, self.name
        )
    }
}

impl Lease {
    /// Starts renewing `name` in `resource` every `ttl / 2`.
    pub fn start(
        api: Api,
        resource: Resource,
        name: String,
        what: Leased,
        ttl: Duration,
        on_error: Option<RenewalErrorCallback>,
    ) -> Self {
        let gone = Arc::new(AtomicBool::new(false));
        let flag = gone.clone();
        let release = Arc::new(Release {
            api: api.clone(),
            resource: resource.clone(),
            name: name.clone(),
            gone: gone.clone(),
            renewal: std::sync::Mutex::new(None),
        });
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 2).await;
                let mut waits = backoff(ttl);
                loop {
                    let patch = what.patch(SystemTime::now() + ttl);
                    match api.merge_patch(&resource, &name, &patch).await {
                        Ok(_) => break,
                        Err(ApiError::AlreadyGone { .. }) => {
                            tracing::info!(%name, "lease: the object is gone; renewal stops");
                            flag.store(true, Ordering::SeqCst);
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(%name, error = %e, "lease renewal failed");
                            if let Some(cb) = &on_error {
                                cb(&e);
                            }
                            tokio::time::sleep(waits.next().unwrap_or(Duration::from_secs(1))).await;
                        }
                    }
                }
            }
        });
        *release.renewal.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        Self { gone, task, release }
    }

    /// A guard for the sandbox's link: once a renewal finds the object
    /// gone, every operation fails with `SandboxGone`; an unconfirmed
    /// cancel releases the object.
    pub fn link_guard(&self) -> Arc<dyn namzu_core::client::LinkGuard> {
        Arc::new(Gone(self.gone.clone(), self.release.clone()))
    }

    /// `Err(SandboxGone)` once a renewal found the object gone.
    pub fn check(&self, id: &str) -> namzu_core::Result<()> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(namzu_core::Error::SandboxGone { id: id.into() });
        }
        Ok(())
    }
}

/// The flag a renewal sets, as a [`namzu_core::client::LinkGuard`], and
/// the release an unconfirmed cancel calls for.
struct Gone(Arc<AtomicBool>, Arc<Release>);

impl namzu_core::client::LinkGuard for Gone {
    fn check(&self, id: &str) -> namzu_core::Result<()> {
        if self.0.load(Ordering::SeqCst) {
            return Err(namzu_core::Error::SandboxGone { id: id.into() });
        }
        Ok(())
    }

    fn retire(&self, _id: &str) -> Option<String> {
        Some(self.1.now())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_second_and_is_capped() {
        let s = |ttl: u64, n: usize| {
            backoff(Duration::from_secs(ttl))
                .take(n)
                .map(|d| d.as_millis())
                .collect::<Vec<_>>()
        };
        assert_eq!(s(3600, 7), [1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
        assert_eq!(s(200, 5), [1000, 2000, 4000, 8000, 10_000]);
        assert_eq!(s(2, 3), [100, 100, 100]);
    }
}
