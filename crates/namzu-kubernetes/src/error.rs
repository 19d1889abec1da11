//! [`KubernetesError`]: what only the Kubernetes tier can fail with. It
//! reaches callers as [`Error::Tier`](namzu_core::Error::Tier) with
//! `tier: Kubernetes`; match it with
//! `err.tier_error::<KubernetesError>()`.

use super::acquire_error::AcquireError;
use super::api::ApiError;
use super::policy::ingress::IngressPolicyError;
use super::policy::per_sandbox::PerSandboxError;
use super::policy::union::EgressPolicyUnionError;
use super::policy::{EgressConfigError, EgressPolicyError};
use namzu_core::error::Error;
use namzu_core::spec::Tier;

/// A failure of the Kubernetes tier, by the part that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubernetesError {
    /// The API server refused or failed a request.
    #[error("kubernetes API")]
    Api(#[source] ApiError),
    /// A claim (or Sandbox) could not be acquired.
    #[error(transparent)]
    Acquire(AcquireError),
    /// The tier's egress options are inconsistent.
    #[error(transparent)]
    EgressConfig(EgressConfigError),
    /// An egress policy cannot be translated to the cluster's objects.
    #[error(transparent)]
    EgressPolicy(Box<EgressPolicyError>),
    /// A per-sandbox egress policy could not be applied.
    #[error(transparent)]
    PerSandbox(Box<PerSandboxError>),
    /// The cluster's ingress policies would let a reader reach the agent.
    #[error(transparent)]
    Ingress(Box<IngressPolicyError>),
    /// The union of the cluster's egress policies is wider than asked.
    #[error(transparent)]
    EgressUnion(Box<EgressPolicyUnionError>),
    /// The pod lacks a label an egress policy selects it by.
    #[error("pod {pod} does not carry the label {key}={value} the claim asked for, which an egress policy selects it by; it would run under whatever policy selects it instead")]
    PodLabelMissing {
        /// The pod's name.
        pod: String,
        /// The label key.
        key: String,
        /// The value that exceeded it.
        value: String,
    },
    /// The claim was bound to another Sandbox than the one it was handed
    /// out with: its Sandbox vanished and the controller bound a new, empty
    /// one. Reconnecting would hand back a stranger as this sandbox.
    #[error("sandbox {id}: claim {claim} is now bound to Sandbox {sandbox} (uid {sandbox_uid}), not the one it was handed out with (uid {recorded_sandbox_uid}); that one is gone with everything in it. Destroy this sandbox and create another")]
    Rebound {
        /// The sandbox's id.
        id: String,
        /// The claim's name.
        claim: String,
        /// The Sandbox uid recorded when the sandbox was handed out.
        recorded_sandbox_uid: String,
        /// The Sandbox the claim is bound to now.
        sandbox: String,
        /// Its uid.
        sandbox_uid: String,
    },
    /// A persistent workspace refused an operation (see `workspace`).
    #[error(transparent)]
    Workspace(Box<crate::workspace::WorkspaceError>),
    /// The agent's in-cluster name does not resolve from this host.
    #[error("sandbox {id}: the agent address {fqdn:?} does not resolve here ({cause}); a host outside the cluster needs address mode `pod-ip` and a route to the pod network")]
    AgentAddressUnresolvable {
        /// The sandbox's id.
        id: String,
        /// The name that did not resolve.
        fqdn: String,
        /// Why it did not resolve.
        cause: String,
    },
}

impl From<KubernetesError> for Error {
    fn from(e: KubernetesError) -> Self {
        Error::tier(Tier::Kubernetes, e)
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        KubernetesError::Api(e).into()
    }
}

impl From<AcquireError> for Error {
    fn from(e: AcquireError) -> Self {
        KubernetesError::Acquire(e).into()
    }
}

impl From<EgressConfigError> for Error {
    fn from(e: EgressConfigError) -> Self {
        KubernetesError::EgressConfig(e).into()
    }
}

impl From<EgressPolicyError> for Error {
    fn from(e: EgressPolicyError) -> Self {
        KubernetesError::EgressPolicy(Box::new(e)).into()
    }
}

impl From<PerSandboxError> for Error {
    fn from(e: PerSandboxError) -> Self {
        KubernetesError::PerSandbox(Box::new(e)).into()
    }
}

impl From<IngressPolicyError> for Error {
    fn from(e: IngressPolicyError) -> Self {
        KubernetesError::Ingress(Box::new(e)).into()
    }
}

impl From<EgressPolicyUnionError> for Error {
    fn from(e: EgressPolicyUnionError) -> Self {
        KubernetesError::EgressUnion(Box::new(e)).into()
    }
}

impl From<crate::workspace::WorkspaceError> for Error {
    fn from(e: crate::workspace::WorkspaceError) -> Self {
        KubernetesError::Workspace(Box::new(e)).into()
    }
}
