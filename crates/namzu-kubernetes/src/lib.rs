#![warn(missing_docs)]

//! The `kubernetes` tier: task sandboxes on a cluster through
//! kubernetes-sigs/agent-sandbox (see `docs/kubernetes.md`).
//!
//! What a user calls:
//! * [`KubernetesOptions`]: the configuration, refused by name where it
//!   cannot work;
//! * [`provider`]: [`KubernetesProvider`] and its handle's backend,
//!   [`KubernetesSandbox`];
//! * [`KubernetesError`] and what it carries ([`acquire_error`]: the acquire
//!   failure taxonomy, [`ApiError`]);
//! * [`workspace`]: persistent workspaces — a named Sandbox with a disk
//!   kept across suspend and resume, fenced by a holder epoch;
//! * [`ops`]: crash recovery and headroom;
//! * [`link`]: the pod link's mutual-TLS credentials;
//! * [`policy`]: egress translated to the cluster's policy objects, and
//!   the check that the named one is applied as translated.
//!
//! Public only with feature `internals` (the tier's own tests and the
//! simulator use them): `crd` (the four kinds, `v1beta1`), `build` (the
//! objects sent, proven in `tests/k8s_crds.rs` to pass the real CRD
//! schemas), `api` (the one typed layer every API call goes through),
//! `acquire` (from nothing to a Ready, dialed pod inside one budget) and
//! `lease` (the shutdown time kept ahead while a handle lives).

/// A module public only with feature `internals`: the tier's building
/// blocks, which its own tests and the simulator drive directly. A user
/// calls the provider, the options, the errors and the policy types.
macro_rules! internal {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "internals")]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code)]
        mod $name;
    )*};
}

internal! {
    acquire;
    api;
    build;
    crd;
    lease;
}
pub mod acquire_error;
pub mod bound;
mod clock;
mod error;
mod labels;
pub mod link;
pub mod ops;
mod options;
pub mod policy;
pub mod provider;
pub mod rebind;
pub mod workspace;

pub use api::{ApiError, Verb};

pub use error::KubernetesError;
pub use options::*;
pub use provider::{KubernetesProvider, KubernetesSandbox};
pub use workspace::{KubernetesWorkspace, Origin, WorkspaceError, WorkspaceOptions};
