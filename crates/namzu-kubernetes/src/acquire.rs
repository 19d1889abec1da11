//! Acquire: from nothing to a Ready pod whose agent answers, inside ONE
//! readiness budget (`ready_timeout`, from the first request).
//!
//! * With a warm pool: POST a SandboxClaim, poll it until the controller
//!   binds it and calls it Ready, read the bound Sandbox once (its Service
//!   FQDN, its pod's name), then the pod (its uid — the agent's bind token —
//!   and, in `pod-ip` mode, its IP, waited for on the same budget).
//! * Without: read the SandboxTemplate, POST a Sandbox made from it, poll it
//!   until Ready, then the pod as above.
//!
//! What the budget promises: a transient read (connect, timeout, 429, 5xx)
//! is retried inside it, no sooner than the poll interval and no sooner
//! than the server's `Retry-After`; a claim the controller refused for good
//! ends it on the first read; anything else a caller must act on (401/403,
//! a 400 from admission) ends it at once. The create POST is never re-sent:
//! a POST whose answer was lost is settled by reading the object under its
//! deterministic name, and a 409 is settled the same way — what carries this
//! sandbox's label is adopted. When the budget runs out, ONE pod read names
//! Capacity or ImagePull before the cleanup DELETE. Every failure after the
//! POST gives the object back.

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::time::Instant;

use super::acquire_error::{self as ae, AcquireError, AcquireReason};
use super::api::{Api, ApiError, Resource};
use super::crd::{Sandbox, SandboxClaim, SandboxTemplate};
use super::lease::Leased;
use super::KubernetesError;
use super::{build, AddressMode, KubernetesOptions};
pub use crate::bound::{Bound, BoundPod};
use namzu_core::error::{Error, Result};

/// The annotation agent-sandbox writes on a Sandbox whose pod is named
/// otherwise (one adopted from a warm pool).
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
/// namzu's record, on its claim, of the Sandbox the claim was bound to
/// when the sandbox was handed out: a reconnect that finds another refuses.
pub const BOUND_SANDBOX_ANNOTATION: &str = "io.namzu/bound-sandbox-uid";

/// The claim (or Sandbox) behind namzu sandbox `id`: deterministic, so a
/// POST whose answer was lost can be found again, and a restarted host can
/// find what it held.
pub fn object_name(id: &str) -> String {
    format!("namzu-{id}")
}

/// What was created for a sandbox: a claim on a warm pool, or a Sandbox.
pub fn owner_resource(owner: Leased, namespace: &str) -> Resource {
    match owner {
        Leased::Claim => Resource::of::<SandboxClaim>(namespace),
        Leased::Sandbox => Resource::of::<Sandbox>(namespace),
    }
}

/// What this configuration creates: a claim when it names a pool.
pub fn owner_kind(opts: &KubernetesOptions) -> Leased {
    if opts.warm_pool_name.is_some() {
        Leased::Claim
    } else {
        Leased::Sandbox
    }
}

/// Why a poll stopped.
enum Stop {
    Deadline,
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Self::Fail(e)
    }
}

/// An API failure as the caller sees it: named by the taxonomy where it
/// fits, as itself where it does not.
fn api_failure(e: ApiError) -> Error {
    ae::from_api(&e).map_or_else(|| e.into(), Error::from)
}

/// The one readiness budget, and the failure the last poll ended on.
struct Budget {
    deadline: Instant,
    total: Duration,
    interval: Duration,
    last: Option<AcquireError>,
    /// The claim's `ReconcilerError` (reason, message) while it stands.
    reconciler: Option<(String, String)>,
}

impl Budget {
    fn new(opts: &KubernetesOptions) -> Self {
        Self {
            deadline: Instant::now() + opts.ready_timeout,
            total: opts.ready_timeout,
            interval: opts.poll_interval,
            last: None,
            reconciler: None,
        }
    }

    /// What the last reads said, once the budget is spent: a claim the
    /// controller kept failing on says so; else the last API failure.
    fn last_failure(&mut self) -> Option<AcquireError> {
        self.reconciler
            .take()
            .map(|(r, m)| ae::controller_error(&r, &m))
            .or_else(|| self.last.take())
    }

    /// One read inside the budget: `Some` is the answer; `None` is a
    /// transient failure already waited out (the caller reads again).
    async fn read(
        &mut self,
        fut: impl Future<Output = std::result::Result<Value, ApiError>>,
    ) -> std::result::Result<Option<Value>, Stop> {
        match tokio::time::timeout_at(self.deadline, fut).await {
            Err(_) => {
                // The read the budget cut short says less than the failure
                // the previous one ended on, if there was one.
                self.last.get_or_insert_with(|| {
                    AcquireError::new(
                        AcquireReason::ApiTimeout,
                        "a read was still unanswered when the readiness budget ran out",
                    )
                });
                Err(Stop::Deadline)
            }
            Ok(Ok(v)) => {
                // A failure the poll recovered from is forgotten.
                self.last = None;
                Ok(Some(v))
            }
            Ok(Err(e)) if e.is_transient() => {
                let retry_after = match &e {
                    ApiError::Api { retry_after, .. } => *retry_after,
                    _ => None,
                };
                tracing::debug!(error = %e, "readiness poll: transient failure, retrying");
                self.last =
                    Some(ae::from_api(&e).unwrap_or_else(|| AcquireError::new(AcquireReason::NotReady, e.to_string())));
                self.wait_for(ae::next_poll_delay(self.interval, retry_after)).await?;
                Ok(None)
            }
            Ok(Err(e)) => Err(Stop::Fail(api_failure(e))),
        }
    }

    /// Waits one poll interval.
    async fn wait(&mut self) -> std::result::Result<(), Stop> {
        self.wait_for(self.interval).await
    }

    async fn wait_for(&mut self, d: Duration) -> std::result::Result<(), Stop> {
        let until = Instant::now() + d;
        if until >= self.deadline {
            tokio::time::sleep_until(self.deadline).await;
            return Err(Stop::Deadline);
        }
        tokio::time::sleep_until(until).await;
        Ok(())
    }
}

/// Whether an object's `Ready` condition is `True`.
fn is_ready(v: &Value) -> bool {
    v["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Whether an object was made for sandbox `id` (its own labels say so).
fn made_for(v: &Value, id: &str) -> bool {
    v["metadata"]["labels"][build::SANDBOX_LABEL] == id
}

/// POSTs `body` once. A lost answer or a 409 is settled by one read of
/// `name`: an object made for `id` is adopted.
async fn create_once(api: &Api, r: &Resource, body: &Value, name: &str, id: &str) -> Result<()> {
    let e = match api.create(r, body).await {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let settle = match &e {
        ApiError::Conflict { .. } | ApiError::Timeout { .. } => true,
        ApiError::Api { transport, .. } => *transport,
        _ => false,
    };
    if settle {
        if let Ok(found) = api.get(r, name).await {
            if made_for(&found, id) {
                tracing::info!(%name, "create: adopting the object an earlier answer was lost for");
                return Ok(());
            }
        }
    }
    Err(api_failure(e))
}

/// Gives back what an acquire created; already gone is given back.
pub async fn release(api: &Api, opts: &KubernetesOptions, owner: Leased, name: &str) -> Result<()> {
    match api.delete(&owner_resource(owner, &opts.namespace), name).await {
        Ok(_) | Err(ApiError::AlreadyGone { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Acquires sandbox `id`: creates its claim (or Sandbox), with `env` for
/// its agent, and waits, inside the readiness budget, for a Ready pod. On
/// any failure after the POST the object is released.
pub async fn acquire(
    api: &Api,
    opts: &KubernetesOptions,
    id: &str,
    env: &[(String, String)],
    verifier: &super::policy::verify::PolicyVerifier,
) -> Result<Bound> {
    let mut b = Budget::new(opts);
    let name = object_name(id);
    let now = SystemTime::now();
    let owner = if opts.warm_pool_name.is_some() {
        let mut claim = build::claim(opts, &name, id, now);
        build::claim_env(&mut claim, opts, env);
        let body = serde_json::to_value(claim).map_err(serialize)?;
        create_once(api, &Resource::of::<SandboxClaim>(&opts.namespace), &body, &name, id).await?;
        Leased::Claim
    } else {
        let template = match read_template(api, opts, &mut b).await {
            Ok(t) => t,
            Err(Stop::Fail(e)) => return Err(e),
            Err(Stop::Deadline) => return Err(ae::at_deadline(None, b.last.take(), b.total).into()),
        };
        let mut sandbox = build::sandbox(opts, &template, &name, id, now);
        // Before the POST: the pod this Sandbox will make carries the
        // template's labels and ours.
        let labels = sandbox
            .spec
            .pod_template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        verifier.verify(api, opts, &labels).await?;
        build::sandbox_env(&mut sandbox, opts, env).map_err(|reason| Error::OptionRefused {
            tier: namzu_core::spec::Tier::Kubernetes,
            option: "env".into(),
            reason,
        })?;
        let body = serde_json::to_value(sandbox).map_err(serialize)?;
        create_once(api, &Resource::of::<Sandbox>(&opts.namespace), &body, &name, id).await?;
        Leased::Sandbox
    };
    let mut pod_hint = None;
    let failure = match wait_bound(api, opts, &mut b, (owner, &name, id), &mut pod_hint).await {
        Ok(mut bound) => match after_bind(api, opts, &mut b, &mut bound, verifier).await {
            Ok(()) => {
                record_binding(api, opts, &bound).await;
                return Ok(bound);
            }
            Err(e) => e,
        },
        Err(Stop::Fail(e)) => e,
        Err(Stop::Deadline) => {
            // After the budget, before the cleanup: what the pod says.
            let diagnosis = match &pod_hint {
                Some(p) => api
                    .get(&Resource::core("pods", &opts.namespace), p)
                    .await
                    .ok()
                    .and_then(|pod| ae::diagnose_pod(&pod)),
                None => None,
            };
            ae::at_deadline(diagnosis, b.last_failure(), b.total).into()
        }
    };
    if let Err(e) = release(api, opts, owner, &name).await {
        tracing::warn!(%name, error = %e, "acquire failed and its object could not be released");
    }
    Err(failure)
}

/// After the bind: the owner must have a uid where a per-sandbox policy
/// will be owned by it; the bound pod must carry the labels policies
/// select it by (else whatever policy does select it would govern it) —
/// waited for inside the budget, since the controller patches them onto an
/// adopted warm pod AFTER the claim reads Ready; and, for a claim, the
/// cluster's policies must close its agent port and bound its egress as
/// configured.
async fn after_bind(
    api: &Api,
    opts: &KubernetesOptions,
    b: &mut Budget,
    bound: &mut Bound,
    verifier: &super::policy::verify::PolicyVerifier,
) -> Result<()> {
    let per_sandbox = opts.egress.as_ref().is_some_and(|e| e.per_sandbox.is_some());
    if per_sandbox && bound.owner_uid.is_none() {
        return Err(super::policy::per_sandbox::PerSandboxError::OwnerUidMissing { id: bound.id.clone() }.into());
    }
    // Every label the backend asked for that a policy selects by (the
    // profile's, and the per-sandbox policy's), on either path: a
    // controller may drop what it was asked to write.
    let wanted = build::pod_labels_for(opts, &bound.id);
    let selecting = opts.egress.as_ref().into_iter().flat_map(|c| {
        let profile = c.profile.as_ref().map(|_| c.profile_label_key.clone());
        let own = c.per_sandbox.as_ref().map(|p| p.label_key.clone());
        profile.into_iter().chain(own)
    });
    let selecting: Vec<String> = selecting.collect();
    let missing = |pod: &BoundPod| {
        selecting.iter().find_map(|key| {
            let value = wanted.get(key).cloned().unwrap_or_default();
            (pod.labels.get(key) != Some(&value)).then(|| (key.clone(), value))
        })
    };
    while let Some((key, value)) = missing(&bound.pod) {
        let uid = bound.pod.uid.clone();
        let reread = match b.wait().await {
            Ok(()) => read_pod(api, opts, b, &bound.pod.name, None).await,
            Err(stop) => Err(stop),
        };
        match reread {
            // The same pod, read again; a replaced one is not this bind's.
            Ok(p) if p.uid == uid => bound.pod = p,
            Ok(_) | Err(Stop::Deadline) => {
                return Err(KubernetesError::PodLabelMissing {
                    pod: bound.pod.name.clone(),
                    key,
                    value,
                }
                .into())
            }
            Err(Stop::Fail(e)) => return Err(e),
        }
    }
    // A direct Sandbox was verified before its POST.
    if bound.owner != Leased::Claim {
        return Ok(());
    }
    verifier.verify(api, opts, &bound.pod.labels).await
}

/// Writes the bound Sandbox's uid on the claim (one PATCH; a failure only
/// leaves a later reconnect unable to tell a re-bound claim, and is logged).
async fn record_binding(api: &Api, opts: &KubernetesOptions, bound: &Bound) {
    let (Leased::Claim, Some(uid)) = (bound.owner, &bound.sandbox_uid) else {
        return;
    };
    let patch = serde_json::json!({"metadata": {"annotations": {BOUND_SANDBOX_ANNOTATION: uid}}});
    let claims = Resource::of::<SandboxClaim>(&opts.namespace);
    if let Err(e) = api.merge_patch(&claims, &bound.owner_name, &patch).await {
        tracing::warn!(claim = %bound.owner_name, error = %e, "could not record the bound Sandbox on the claim");
    }
}

fn serialize(e: serde_json::Error) -> Error {
    Error::InvalidArgument {
        op: "kubernetes acquire".into(),
        message: e.to_string(),
    }
}

async fn read_template(
    api: &Api,
    opts: &KubernetesOptions,
    b: &mut Budget,
) -> std::result::Result<SandboxTemplate, Stop> {
    let r = Resource::of::<SandboxTemplate>(&opts.namespace);
    let name = opts.template_name.clone().unwrap_or_default();
    loop {
        if let Some(v) = b.read(api.get(&r, &name)).await? {
            return serde_json::from_value(v).map_err(|e| {
                Stop::Fail(Error::InvalidArgument {
                    op: "kubernetes acquire".into(),
                    message: format!("SandboxTemplate {name:?} is not one: {e}"),
                })
            });
        }
    }
}

/// Polls until the owner (its kind, its name, the sandbox id) is bound and
/// Ready; then reads the Sandbox once and the pod until it is usable.
async fn wait_bound(
    api: &Api,
    opts: &KubernetesOptions,
    b: &mut Budget,
    (owner, name, id): (Leased, &str, &str),
    pod_hint: &mut Option<String>,
) -> std::result::Result<Bound, Stop> {
    let sandboxes = Resource::of::<Sandbox>(&opts.namespace);
    let mut owner_uid = None;
    let sandbox_name = match owner {
        Leased::Claim => {
            let claims = Resource::of::<SandboxClaim>(&opts.namespace);
            loop {
                if let Some(claim) = b.read(api.get(&claims, name)).await? {
                    if let Some(refusal) = ae::claim_refusal(&claim) {
                        return Err(Stop::Fail(refusal.into()));
                    }
                    let condition = ae::claim_condition(&claim);
                    if condition.as_ref().is_some_and(|(r, _)| r == "ClaimExpired") {
                        // Its shutdown time passed before it was ready: the
                        // controller deletes it (or its Sandbox) next.
                        return Err(Stop::Fail(
                            AcquireError::new(
                                AcquireReason::NotReady,
                                format!(
                                    "the claim expired before it was ready: claim_ttl ({:?}) is shorter than the time to ready",
                                    opts.claim_ttl
                                ),
                            )
                            .into(),
                        ));
                    }
                    b.reconciler = condition.filter(|(r, _)| r == "ReconcilerError");
                    owner_uid = claim["metadata"]["uid"]
                        .as_str()
                        .filter(|u| !u.is_empty())
                        .map(String::from);
                    if let Some(s) = claim["status"]["sandbox"]["name"].as_str().filter(|s| !s.is_empty()) {
                        pod_hint.get_or_insert_with(|| s.to_owned());
                        if is_ready(&claim) {
                            break s.to_owned();
                        }
                    }
                    b.wait().await?;
                }
            }
        }
        Leased::Sandbox => {
            *pod_hint = Some(name.to_owned());
            name.to_owned()
        }
    };
    // The Sandbox: Ready (already so, on the claim path), its address and
    // its pod's name.
    let sandbox = loop {
        if let Some(s) = b.read(api.get(&sandboxes, &sandbox_name)).await? {
            if let Some(p) = s["metadata"]["annotations"][POD_NAME_ANNOTATION].as_str() {
                *pod_hint = Some(p.to_owned());
            }
            if is_ready(&s) {
                break s;
            }
            b.wait().await?;
        }
    };
    let fqdn = sandbox["status"]["serviceFQDN"].as_str().map(String::from);
    if owner == Leased::Sandbox {
        owner_uid = sandbox["metadata"]["uid"]
            .as_str()
            .filter(|u| !u.is_empty())
            .map(String::from);
    }
    let pod_name = pod_hint.clone().unwrap_or_else(|| sandbox_name.clone());
    let pod = read_pod(api, opts, b, &pod_name, None).await?;
    let sandbox_uid = sandbox["metadata"]["uid"].as_str().map(String::from);
    Ok(Bound {
        sandbox_uid,
        id: id.into(),
        owner,
        owner_name: name.into(),
        owner_uid,
        sandbox: sandbox_name,
        fqdn,
        pod,
    })
}

/// Reads pod `name` until it is usable: live (no deletion timestamp), a
/// uid other than `not_uid`, and, in `pod-ip` mode, an IP.
async fn read_pod(
    api: &Api,
    opts: &KubernetesOptions,
    b: &mut Budget,
    name: &str,
    not_uid: Option<&str>,
) -> std::result::Result<BoundPod, Stop> {
    let pods = Resource::core("pods", &opts.namespace);
    loop {
        if let Some(pod) = b.read(api.get(&pods, name)).await? {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
            let ip = pod["status"]["podIP"].as_str().and_then(|s| s.parse::<IpAddr>().ok());
            let live = pod["metadata"]["deletionTimestamp"].is_null() && !uid.is_empty() && Some(uid) != not_uid;
            if live && (opts.address_mode == AddressMode::Service || ip.is_some()) {
                let labels = crate::labels::string_map(&pod["metadata"]["labels"]);
                return Ok(BoundPod {
                    name: name.to_owned(),
                    uid: uid.to_owned(),
                    ip,
                    labels,
                });
            }
            b.wait().await?;
        }
    }
}

/// Reads what stands behind sandbox `id` (made earlier, maybe by another
/// process) without creating anything: waits, on a fresh budget, for it to
/// be Ready and its pod usable.
pub async fn find(api: &Api, opts: &KubernetesOptions, id: &str) -> Result<Bound> {
    let mut b = Budget::new(opts);
    let name = object_name(id);
    let mut hint = None;
    match wait_bound(api, opts, &mut b, (owner_kind(opts), &name, id), &mut hint).await {
        Ok(bound) if bound.owner == Leased::Claim => {
            // The claim as it stands: bound to the Sandbox it was handed
            // out with, or — its Sandbox gone — to a new, empty one.
            let claim = api
                .get(&Resource::of::<SandboxClaim>(&opts.namespace), &name)
                .await
                .map_err(api_failure)?;
            let recorded = claim["metadata"]["annotations"][BOUND_SANDBOX_ANNOTATION].as_str();
            match (recorded, &bound.sandbox_uid) {
                (Some(was), Some(now)) if was != now => Err(KubernetesError::Rebound {
                    id: id.into(),
                    claim: name,
                    recorded_sandbox_uid: was.into(),
                    sandbox: bound.sandbox.clone(),
                    sandbox_uid: now.clone(),
                }
                .into()),
                _ => Ok(bound),
            }
        }
        Ok(bound) => Ok(bound),
        Err(Stop::Fail(e))
            if matches!(
                e.tier_error::<KubernetesError>(),
                Some(KubernetesError::Api(ApiError::AlreadyGone { .. }))
            ) =>
        {
            Err(Error::SandboxNotFound { id: id.into() })
        }
        Err(Stop::Fail(e)) => Err(e),
        Err(Stop::Deadline) => Err(ae::at_deadline(None, b.last_failure(), b.total).into()),
    }
}

/// Waits, on a fresh readiness budget, for Sandbox `name` (made by the
/// caller, for namzu id `id`) to be Ready with a live pod, and reads what
/// it is bound to. A pod being deleted is never bound: the wait goes on
/// for its replacement. At the deadline, one read of the pod names what
/// kept it (capacity, image pull), as an acquire's does.
pub(crate) async fn bind_sandbox(api: &Api, opts: &KubernetesOptions, name: &str, id: &str) -> Result<Bound> {
    let mut b = Budget::new(opts);
    let mut hint = None;
    match wait_bound(api, opts, &mut b, (Leased::Sandbox, name, id), &mut hint).await {
        Ok(bound) => Ok(bound),
        Err(Stop::Fail(e)) => Err(e),
        Err(Stop::Deadline) => {
            let pod = hint.unwrap_or_else(|| name.to_owned());
            let diagnosis = api
                .get(&Resource::core("pods", &opts.namespace), &pod)
                .await
                .ok()
                .and_then(|p| ae::diagnose_pod(&p));
            Err(ae::at_deadline(diagnosis, b.last_failure(), b.total).into())
        }
    }
}
