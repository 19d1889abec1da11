//! The policy engine: what may leave (and reach) a task sandbox's pod,
//! said in the cluster's own policy objects and checked against what the
//! cluster actually applies.
//!
//! Egress on a cluster: the backend's egress configuration translated into
//! the object the cluster enforces — a core `NetworkPolicy` (engine `core`)
//! or a `CiliumNetworkPolicy` (engine `cilium`) — and the check that the
//! named object is applied exactly as translated.
//!
//! What each engine can say: hostname allowlists exist only under Cilium
//! (core NetworkPolicy has no notion of a name); narrowing (ports, TLS
//! server names, DNS names) only means something next to a Cilium hostname
//! allowlist. Everything else is refused at construction, each refusal a
//! variant of [`EgressConfigError`] naming the field or entry.
//!
//! `deny-all` and `allow-all` translate to fixed shapes pinned by deep
//! equality in the tests: verification of an applied object is an exact
//! match, so changing either would fail every create on clusters that
//! applied the old one.
//!
//! * [`config`]: the tier's egress configuration and its validation;
//! * [`mod@translate`]: that configuration as a `NetworkPolicy` or
//!   `CiliumNetworkPolicy`;
//! * [`applied`]: the named object checked against the translation;
//! * [`union`]: every policy selecting the pod, checked together;
//! * [`ingress`]: who may reach the agent's port;
//! * [`per_sandbox`]: a sandbox's own hostname allowlist;
//! * [`verify`]: when those checks run (once per template, cached);
//! * [`selectors`]: label selectors evaluated against a pod's labels.

pub mod applied;
pub mod config;
pub mod ingress;
pub mod per_sandbox;
pub mod selectors;
pub mod translate;
pub mod union;
pub mod verify;

pub use applied::*;
pub use config::*;
pub use translate::*;

#[cfg(test)]
#[path = "netpol_tests.rs"]
mod tests;
