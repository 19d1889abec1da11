//! A Kubernetes control-plane **simulator** for namzu's tests — a test
//! substrate, named as such everywhere, never a cluster. No API server can
//! run on the machines that test namzu, so this one speaks the subset of the
//! REST API the `kubernetes` backend uses, following the documented
//! semantics:
//!
//! * namespaced CRUD under `/api/v1` (pods) and `/apis/<group>/<version>`
//!   (the agent-sandbox kinds), JSON bodies;
//! * `metadata.uid`, `resourceVersion` (one counter for the store, as etcd's
//!   revision), `generation` bumped on spec changes, `creationTimestamp`,
//!   `generateName`;
//! * 404 `NotFound`, 409 `AlreadyExists` and `Conflict` (a stale
//!   `resourceVersion` in a patch or a delete precondition), 422 `Invalid`
//!   (the CRD's schema, checked as the API server does, unknown fields
//!   included, and its `x-kubernetes-validations` CEL rules
//!   ([`cel_rules`]); a failed JSON-patch `test`), 400 `BadRequest`, every
//!   error a
//!   `Status` object;
//! * merge patch (RFC 7386) and JSON patch (RFC 6902), `test` included;
//! * `?labelSelector=` on lists ([`selector`]), delete.
//!
//! Fault knobs: [`Fault`] (a chosen status — 429 with `Retry-After`, 5xx,
//! 403, 410 … — for the next N requests matching a method and a resource)
//! and [`Stall`] (a request applied at once and answered late, or never).
//!
//! [`controller`] adds the agent-sandbox controller's documented behaviour
//! (warm pools, claim binding, readiness, shutdown expiry, owner cascade,
//! pod replacement) with pods that are REAL `local` sandboxes running the
//! real agent on TCP, on a simulated pod network ([`podnet`]);
//! [`cluster`] is a ready-made cluster with the manifests namzu ships.

pub mod cel_rules;
pub mod cluster;
pub mod controller;
pub mod images;
pub mod podnet;
pub mod schema;
pub mod selector;
pub mod server;

pub use controller::{Controller, ControllerConfig, PodFault};
pub use server::{Fault, Gvr, Simulator, Stall};
