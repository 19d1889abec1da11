//! Egress verification before a sandbox is handed out: the named object
//! exactly as translated, then (unless `verify: named-object-only`) the
//! union of every policy selecting the pod. A pass is remembered per pod
//! label set — the sandbox's own id label left out, or no two pods would
//! share one — for at most [`PASS_TTL`]; a failure is never remembered, so
//! the next acquire reads the cluster again. (So a policy that selects one
//! sandbox by its id label, applied within a pass's lifetime, is seen only
//! when the pass expires.)

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::api::Api;
use super::netpol::{verify_named, KubeEgressConfig, Verification};

/// How long a pass stands for a label set.
pub const PASS_TTL: Duration = Duration::from_secs(300);

/// The verifier a provider keeps, with its cache of passes.
#[derive(Debug, Default)]
pub struct EgressVerifier {
    passed: Mutex<HashMap<BTreeMap<String, String>, Instant>>,
}

impl EgressVerifier {
    fn key(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut k = labels.clone();
        k.remove(super::build::SANDBOX_LABEL);
        k
    }

    fn fresh(&self, labels: &BTreeMap<String, String>) -> bool {
        let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        passed.retain(|_, at| at.elapsed() < PASS_TTL);
        passed.contains_key(&Self::key(labels))
    }

    /// Verifies the egress bound of a pod with `labels` in `namespace`.
    pub async fn verify(
        &self,
        api: &Api,
        cfg: &KubeEgressConfig,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> crate::Result<()> {
        if self.fresh(labels) {
            return Ok(());
        }
        verify_named(api, cfg, namespace).await?;
        if cfg.verify == Verification::Union {
            super::egress_union::verify_union(api, cfg, namespace, labels).await?;
        }
        self.passed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(labels), Instant::now());
        Ok(())
    }
}
