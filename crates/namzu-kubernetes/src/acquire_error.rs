//! Why an acquire failed, in a field a host can act on: the reasons, what
//! is retryable, and the three places a reason comes from — an API failure
//! during the readiness poll, a claim the controller refused for good, and
//! the one pod read made after the budget ran out. A refusal this cannot
//! honestly name (a 400 from admission, a malformed template) is not filed
//! under the least wrong reason: it travels as its own error.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::api::ApiError;

/// Claim `Ready` reasons that mean decided, not not-yet: meeting one ends
/// the acquire on the first read.
pub const TERMINAL_CLAIM_REASONS: [&str; 5] = [
    "WarmPoolNotFound",
    "TemplateNotFound",
    "InvalidMetadata",
    "EnvVarsInjectionRejected",
    "VolumeClaimTemplatesError",
];

/// What a `ReconcilerError` says when the claim itself is at fault: the
/// controller retries it with backoff, but it cannot pass until the claim
/// (or its template) changes — an env name the template sets under policy
/// `Allowed`, an unknown container, a pod label the template sets
/// otherwise.
const CLAIM_FAULTS: [&str; 3] = [
    "environment variable override is not allowed",
    "not found in template for environment variable",
    "metadata override conflict",
];

/// Container waiting reasons that mean the container cannot start as the
/// template has it (a command the image lacks, an init container that
/// fails).
const CONTAINER_REASONS: [&str; 4] = [
    "CrashLoopBackOff",
    "RunContainerError",
    "CreateContainerError",
    "CreateContainerConfigError",
];

/// Container waiting reasons that mean the image cannot be had.
const IMAGE_PULL_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Why an acquire failed, in the taxonomy the seeds use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReason {
    /// The API server could not be reached.
    ApiUnreachable,
    /// A request outlived `api_request_timeout`.
    ApiTimeout,
    /// The credentials were refused (401/403).
    Forbidden,
    /// The controller refused the claim for good.
    ClaimRejected,
    /// The pod could not be scheduled.
    Capacity,
    /// The pod's image could not be pulled.
    ImagePull,
    /// A container of the pod cannot start (its command is missing from
    /// its image, an init container fails …): the template's to fix.
    ContainerError,
    /// The controller kept failing to reconcile the claim
    /// (`ReconcilerError`) for a reason namzu cannot name.
    ControllerError,
    /// The budget ran out with nothing more specific to say.
    NotReady,
}

impl AcquireReason {
    /// Whether trying again later can succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::ApiUnreachable | Self::ApiTimeout | Self::Capacity | Self::NotReady | Self::ControllerError
        )
    }
}

/// A failed acquire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("acquire failed ({reason:?}, {}): {cause}{}", if *retryable { "retryable" } else { "not retryable" },
        controller_reason.as_ref().map_or(String::new(), |r| format!(" [controller: {r}: {}]", controller_message.clone().unwrap_or_default())))]
pub struct AcquireError {
    /// Why, for humans.
    pub reason: AcquireReason,
    /// Trying again later may succeed.
    pub retryable: bool,
    /// What happened, as the failure itself said it.
    pub cause: String,
    /// The controller's own words, when it refused the claim.
    pub controller_reason: Option<String>,
    /// The controller's own message, when its status carried one.
    pub controller_message: Option<String>,
    /// What in the claim was refused, where namzu can tell.
    pub rejection: Option<ClaimRejection>,
}

/// What in a refused claim the controller objected to, and what moves it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimRejection {
    /// `InvalidMetadata`: the pod labels namzu asked for are outside the
    /// controller's `allowed-label-domains`.
    PodLabelsRejected {
        /// The pod labels the claim sent.
        labels: BTreeMap<String, String>,
        /// The option that moves them (its domain must be allowed by the
        /// controller's `agent-sandbox-config` ConfigMap).
        option: &'static str,
    },
}

impl AcquireError {
    /// An error of `reason`, with what caused it.
    pub fn new(reason: AcquireReason, cause: impl Into<String>) -> Self {
        Self {
            reason,
            retryable: reason.retryable(),
            cause: cause.into(),
            controller_reason: None,
            controller_message: None,
            rejection: None,
        }
    }
}

/// An API failure during acquire, if the taxonomy names it; `None` leaves
/// it to travel as itself.
pub fn from_api(e: &ApiError) -> Option<AcquireError> {
    let reason = match e {
        ApiError::Timeout { .. } => AcquireReason::ApiTimeout,
        ApiError::Api { transport: true, .. } => AcquireReason::ApiUnreachable,
        ApiError::Credential { .. } => AcquireReason::Forbidden,
        _ => return None,
    };
    Some(AcquireError::new(reason, e.to_string()))
}

/// The claim's `Ready` condition when it is `False`: (reason, message).
pub fn claim_condition(claim: &Value) -> Option<(String, String)> {
    let ready = claim["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    if ready["status"] == "True" {
        return None;
    }
    Some((
        ready["reason"].as_str()?.to_owned(),
        ready["message"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// The claim's `Ready` condition, if it carries a terminal reason — or a
/// `ReconcilerError` whose message shows the claim itself at fault.
pub fn claim_refusal(claim: &Value) -> Option<AcquireError> {
    let (reason, message) = claim_condition(claim)?;
    let claim_fault = reason == "ReconcilerError" && CLAIM_FAULTS.iter().any(|f| message.contains(f));
    if !TERMINAL_CLAIM_REASONS.contains(&reason.as_str()) && !claim_fault {
        return None;
    }
    let sent: BTreeMap<String, String> = crate::labels::string_map(&claim["spec"]["additionalPodMetadata"]["labels"]);
    let rejection = (reason == "InvalidMetadata" && message.contains("label") && !sent.is_empty()).then(|| {
        ClaimRejection::PodLabelsRejected {
            labels: sent.clone(),
            option: "egress.pod_label_domain",
        }
    });
    let hint = if rejection.is_some() {
        format!(
            "; namzu sent pod labels {:?}: allow their domain in the controller's agent-sandbox-config ConfigMap (allowed-label-domains), or move them with KubeEgressConfig::with_pod_label_domain",
            sent.keys().collect::<Vec<_>>()
        )
    } else {
        String::new()
    };
    Some(AcquireError {
        controller_reason: Some(reason.clone()),
        controller_message: Some(message.clone()),
        rejection,
        ..AcquireError::new(
            AcquireReason::ClaimRejected,
            format!("the controller refused the claim: {reason}: {message}{hint}"),
        )
    })
}

/// What a claim that was still failing to reconcile when the budget ran
/// out says: never a bare not-ready.
pub fn controller_error(reason: &str, message: &str) -> AcquireError {
    AcquireError {
        controller_reason: Some(reason.to_owned()),
        controller_message: Some(message.to_owned()),
        ..AcquireError::new(
            AcquireReason::ControllerError,
            format!("the controller kept failing to reconcile the claim: {reason}: {message}"),
        )
    }
}

/// What one pod read says about a pod that never became ready.
pub fn diagnose_pod(pod: &Value) -> Option<AcquireError> {
    let unschedulable = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable");
    if let Some(c) = unschedulable {
        return Some(AcquireError::new(
            AcquireReason::Capacity,
            format!(
                "the pod cannot be scheduled: {}",
                c["message"].as_str().unwrap_or_default()
            ),
        ));
    }
    let statuses = ["initContainerStatuses", "containerStatuses"];
    let waiting = || {
        statuses
            .iter()
            .flat_map(|s| pod["status"][*s].as_array().cloned().unwrap_or_default())
            .filter_map(|cs| {
                let w = &cs["state"]["waiting"];
                let reason = w["reason"].as_str()?.to_owned();
                Some((
                    cs["name"].as_str().unwrap_or_default().to_owned(),
                    reason,
                    w["message"].as_str().unwrap_or_default().to_owned(),
                ))
            })
    };
    if let Some((name, r, m)) = waiting().find(|(_, r, _)| IMAGE_PULL_REASONS.contains(&r.as_str())) {
        return Some(AcquireError::new(
            AcquireReason::ImagePull,
            format!("container {name} cannot get its image: {r}: {m}"),
        ));
    }
    if let Some((name, r, m)) = waiting().find(|(_, r, _)| CONTAINER_REASONS.contains(&r.as_str())) {
        return Some(AcquireError::new(
            AcquireReason::ContainerError,
            format!("container {name} cannot start: {r}: {m}"),
        ));
    }
    None
}

/// How long to wait before the next readiness poll: the interval, or the
/// server's `Retry-After` when that is longer — never shorter.
pub fn next_poll_delay(interval: Duration, retry_after: Option<Duration>) -> Duration {
    retry_after.map_or(interval, |r| r.max(interval))
}

/// The error once the budget is spent: what the pod says decides; else the
/// API failure the LAST poll ended on (one the poll recovered from is
/// forgotten); else not-ready.
pub fn at_deadline(
    pod: Option<AcquireError>,
    last_poll_failure: Option<AcquireError>,
    budget: Duration,
) -> AcquireError {
    pod.or(last_poll_failure)
        .unwrap_or_else(|| AcquireError::new(AcquireReason::NotReady, format!("not ready within {budget:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn terminal_claim_reasons_end_the_acquire_and_others_do_not() {
        let claim = |status: &str, reason: &str| {
            json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                "message": "warm pool \"nope\" not found", "lastTransitionTime": "2026-11-29T00:00:00Z"}]}})
        };
        let e = claim_refusal(&claim("False", "WarmPoolNotFound")).unwrap();
        assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false));
        assert_eq!(e.controller_reason.as_deref(), Some("WarmPoolNotFound"));
        assert_eq!(e.controller_message.as_deref(), Some("warm pool \"nope\" not found"));
        for r in TERMINAL_CLAIM_REASONS {
            assert!(claim_refusal(&claim("False", r)).is_some(), "{r}");
        }
        // Not yet, or unknown: never guessed at.
        assert_eq!(claim_refusal(&claim("False", "SandboxNotReady")), None);
        assert_eq!(claim_refusal(&claim("True", "WarmPoolNotFound")), None);
        assert_eq!(claim_refusal(&json!({})), None);
    }

    #[test]
    fn reconciler_errors_are_refusals_only_where_the_claim_is_at_fault() {
        let claim = |reason: &str, message: &str| {
            json!({"spec": {"additionalPodMetadata": {"labels": {"namzu.sandbox.users.io/egress-profile": "b"}}},
                "status": {"conditions": [{"type": "Ready", "status": "False", "reason": reason, "message": message}]}})
        };
        let clash = claim(
            "ReconcilerError",
            "Error seen: environment variable override is not allowed by the template policy for variable \"X\"",
        );
        let e = claim_refusal(&clash).unwrap();
        assert_eq!((e.reason, e.retryable), (AcquireReason::ClaimRejected, false));
        assert_eq!(e.controller_reason.as_deref(), Some("ReconcilerError"));
        // A conflict the controller will get past is waited out …
        let transient = claim("ReconcilerError", "Error seen: the object has been modified");
        assert_eq!(claim_refusal(&transient), None);
        // … and named as the controller's if the budget runs out on it.
        let (r, m) = claim_condition(&transient).unwrap();
        let d = controller_error(&r, &m);
        assert_eq!((d.reason, d.retryable), (AcquireReason::ControllerError, true));
        assert!(d.to_string().contains("the object has been modified"), "{d}");
        // InvalidMetadata on labels namzu sent: typed, with what moves them.
        let refused = claim(
            "InvalidMetadata",
            "invalid additionalPodMetadata: failed to validate label \"namzu.sandbox.users.io/egress-profile\": label domain \"namzu.sandbox.users.io\" is not in the allowlist",
        );
        let e = claim_refusal(&refused).unwrap();
        match &e.rejection {
            Some(ClaimRejection::PodLabelsRejected { labels, option }) => {
                assert_eq!(labels.len(), 1);
                assert_eq!(*option, "egress.pod_label_domain");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.cause.contains("allowed-label-domains"), "{e}");
    }

    #[test]
    fn the_pod_read_names_capacity_and_image_pull() {
        let unschedulable = json!({"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}]}});
        let e = diagnose_pod(&unschedulable).unwrap();
        assert_eq!((e.reason, e.retryable), (AcquireReason::Capacity, true));
        assert!(e.cause.contains("Insufficient cpu"));
        let pull = json!({"status": {"phase": "Pending", "containerStatuses": [{"name": "agent",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}});
        let e = diagnose_pod(&pull).unwrap();
        assert_eq!((e.reason, e.retryable), (AcquireReason::ImagePull, false));
        assert!(e.cause.contains("agent") && e.cause.contains("ImagePullBackOff"));
        let starting = json!({"status": {"phase": "Pending", "containerStatuses": [{"name": "agent",
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}});
        assert_eq!(diagnose_pod(&starting), None);
    }

    #[test]
    fn api_failures_are_named_only_where_the_taxonomy_fits() {
        let path = "/apis/x".to_owned();
        let t = from_api(&ApiError::Timeout {
            verb: super::super::api::Verb::Get,
            path: path.clone(),
            bound: Duration::from_secs(1),
        })
        .unwrap();
        assert_eq!((t.reason, t.retryable), (AcquireReason::ApiTimeout, true));
        let u = from_api(&ApiError::Api {
            verb: super::super::api::Verb::Get,
            path: path.clone(),
            status: None,
            retry_after: None,
            transport: true,
            message: "connection refused".into(),
        })
        .unwrap();
        assert_eq!((u.reason, u.retryable), (AcquireReason::ApiUnreachable, true));
        let f = from_api(&ApiError::Credential {
            verb: super::super::api::Verb::Create,
            path: path.clone(),
            status: 403,
            message: "forbidden".into(),
        })
        .unwrap();
        assert_eq!((f.reason, f.retryable), (AcquireReason::Forbidden, false));
        // A 400 from admission travels as itself.
        let bad = ApiError::Api {
            verb: super::super::api::Verb::Create,
            path,
            status: Some(400),
            retry_after: None,
            transport: false,
            message: "admission webhook denied".into(),
        };
        assert_eq!(from_api(&bad), None);
    }

    #[test]
    fn retry_after_only_slows_the_poll_and_the_pod_decides_at_the_deadline() {
        let i = Duration::from_millis(50);
        assert_eq!(next_poll_delay(i, None), i);
        assert_eq!(next_poll_delay(i, Some(Duration::from_secs(3))), Duration::from_secs(3));
        assert_eq!(next_poll_delay(i, Some(Duration::ZERO)), i);
        let budget = Duration::from_secs(60);
        let pod = AcquireError::new(AcquireReason::Capacity, "unschedulable");
        let api = AcquireError::new(AcquireReason::ApiUnreachable, "refused");
        assert_eq!(
            at_deadline(Some(pod.clone()), Some(api.clone()), budget).reason,
            AcquireReason::Capacity
        );
        assert_eq!(
            at_deadline(None, Some(api), budget).reason,
            AcquireReason::ApiUnreachable
        );
        let nr = at_deadline(None, None, budget);
        assert_eq!((nr.reason, nr.retryable), (AcquireReason::NotReady, true));
    }
}
