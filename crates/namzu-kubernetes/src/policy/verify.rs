//! The checks made before a sandbox is handed out, at the two points the
//! pod's labels are known: before a direct Sandbox's POST, after a claim's
//! bind.
//! * Ingress (on unless `Unverified`): the agent port is shown closed
//!   ([`super::ingress`]).
//! * Egress (when configured): the named object exactly as translated,
//!   then, unless `verify: named-object-only`, the union of every policy
//!   selecting the pod ([`super`], [`super::union`]).
//!
//! A pass is remembered per pod label set for at most [`PASS_TTL`]. The
//! sandbox's own id label is left out of that key, or no two pods would
//! share one. A failure is never remembered, so the next acquire reads the
//! cluster again. (A policy that selects one sandbox by its id label,
//! applied within a pass's lifetime, is therefore seen only when the pass
//! expires.)

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ingress::IngressVerification;
use super::{verify_named, Engine, Verification};
use crate::api::Api;
use crate::KubernetesOptions;

/// How long a pass stands for a label set.
pub const PASS_TTL: Duration = Duration::from_secs(300);

/// The verifier a provider keeps, with its cache of passes.
#[derive(Debug, Default)]
pub struct PolicyVerifier {
    passed: Mutex<HashMap<BTreeMap<String, String>, Instant>>,
}

impl PolicyVerifier {
    fn key(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        // The per-sandbox label names one sandbox; a pass stands for
        // every pod alike in the rest.
        let mut k = labels.clone();
        k.retain(|key, _| key != crate::policy::per_sandbox::DEFAULT_LABEL_KEY && !key.ends_with("/egress-sandbox"));
        k
    }

    fn fresh(&self, labels: &BTreeMap<String, String>) -> bool {
        let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        passed.retain(|_, at| at.elapsed() < PASS_TTL);
        passed.contains_key(&Self::key(labels))
    }

    /// Runs every configured check for a pod with `labels`.
    pub async fn verify(
        &self,
        api: &Api,
        opts: &KubernetesOptions,
        labels: &BTreeMap<String, String>,
    ) -> namzu_core::Result<()> {
        let ingress = match opts.ingress {
            IngressVerification::Verify { engine } => {
                Some(engine.unwrap_or_else(|| opts.egress.as_ref().map_or(Engine::Core, |e| e.engine)))
            }
            IngressVerification::Unverified => None,
        };
        if (ingress.is_none() && opts.egress.is_none()) || self.fresh(labels) {
            return Ok(());
        }
        // One listing serves both checks: every collection either reads.
        let union = opts.egress.as_ref().filter(|c| c.verify == Verification::Union);
        let engine = [ingress, union.map(|c| c.engine)]
            .into_iter()
            .flatten()
            .max_by_key(|e| *e == Engine::Cilium);
        let (lists, unread) = match engine {
            Some(e) => super::union::list_policies(api, e, &opts.namespace).await,
            None => Default::default(),
        };
        if let Some(engine) = ingress {
            // Under core, Cilium's collection (if read for egress) is not
            // the ingress boundary the operator named.
            let lists: Vec<_> = lists
                .iter()
                .filter(|(kind, _)| engine == Engine::Cilium || kind == "NetworkPolicy")
                .cloned()
                .collect();
            super::ingress::evaluate(&lists, unread.clone(), labels, &opts.namespace, opts.agent_port)?;
        }
        if let Some(cfg) = &opts.egress {
            verify_named(api, cfg, &opts.namespace).await?;
            if cfg.verify == Verification::Union {
                super::union::evaluate(cfg, &opts.namespace, labels, &lists, unread)?;
            }
        }
        self.passed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(labels), Instant::now());
        Ok(())
    }
}
