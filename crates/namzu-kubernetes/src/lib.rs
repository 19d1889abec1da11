#![warn(missing_docs)]

//! The `kubernetes` tier: task sandboxes on a cluster through
//! kubernetes-sigs/agent-sandbox (see `docs/kubernetes.md`).
//!
//! * [`crd`]: Rust types for the four kinds, version `v1beta1`;
//! * [`KubernetesOptions`]: the configuration, refused by name where it
//!   cannot work;
//! * [`build`]: the objects the backend sends (a claim on a warm pool, or a
//!   Sandbox from a template), proven in `tests/k8s_crds.rs` to pass the real
//!   CRD schemas;
//!   (the structural OpenAPI check is the simulator's, `namzu_k8s_sim::schema`);
//! * [`api`]: the one typed layer every API call goes through — bounded,
//!   typed errors, a record of (group, resource, verb);
//! * [`acquire`]: from nothing to a Ready, dialed pod inside one budget;
//!   [`acquire_error`]: the failure taxonomy;
//! * [`lease`]: the shutdown time kept ahead while a handle lives;
//! * [`provider`]: [`KubernetesProvider`] and its handle;
//! * [`ops`]: crash recovery and headroom;
//! * [`policy`]: egress translated to the cluster's policy objects, and
//!   the check that the named one is applied as translated.

pub mod acquire;
pub mod acquire_error;
pub mod api;
pub mod bound;
pub mod build;
mod clock;
pub mod crd;
mod error;
mod labels;
pub mod lease;
pub mod ops;
mod options;
pub mod policy;
pub mod provider;

pub use error::KubernetesError;
pub use options::*;
pub use provider::{KubernetesProvider, KubernetesSandbox};
