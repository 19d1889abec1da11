//! namzu's spine, shared by every tier and knowing none: the [`Sandbox`]
//! handle and the [`SandboxBackend`] trait a tier implements for it, the
//! [`Provider`] trait, the link to an agent ([`AgentClient`]), the
//! requests and results of operations, egress policy decisions, and the
//! one [`Error`] type (a tier's own failures ride in [`Error::Tier`]).
//!
//! Users depend on the `namzu` facade, which re-exports all of this with
//! the tiers; a tier crate (like `namzu-kubernetes`) depends on this one.

#![warn(missing_docs)]

pub mod check;
pub mod client;
pub mod egress;
pub mod error;
pub mod fsutil;
pub mod handle;
pub mod image;
pub mod pool;
pub mod provider;
pub mod spec;
pub mod timeline;
pub mod types;

pub use client::{AgentClient, ByteStream, CancelOutcome, ClientOptions, ExecStream, FileInfoStream, Terminal};
pub use error::{AttachRefusal, Error, Result};
pub use handle::{Commands, Files, Network, Sandbox, SandboxBackend, Sessions, Terminals};
pub use namzu_proto::{features, limits, CONTAINER_AGENT_UID};
pub use provider::Provider;
pub use spec::{Bind, Resources, SandboxInfo, SandboxSpec, SnapshotInfo, Tier};
pub use tokio_util::sync::CancellationToken;
pub use types::*;
