#![warn(missing_docs)]

//! namzu host library: one [`Sandbox`] handle over many isolation
//! boundaries.
//!
//! A [`Provider`] per tier makes sandboxes; each sandbox runs the static
//! `namzu-agent` inside its boundary and is driven through one
//! authenticated HTTP/2 link. The handle groups what can be done inside:
//! [`Sandbox::commands`], [`Sandbox::files`], [`Sandbox::sessions`],
//! [`Sandbox::terminals`], [`Sandbox::network`]. Errors are [`Error`]
//! variants a caller can match; the library never prints (it logs through
//! `tracing`).
//!
//! This crate is the facade: the spine is `namzu-core` (re-exported here),
//! the `local` and `host` tiers and the image store live here, and the
//! other tiers come in behind cargo features (`docker`, `kubernetes`, both
//! on by default), so a user of the local tier alone compiles neither
//! bollard nor kube.
//!
//! ```no_run
//! # async fn demo() -> namzu::Result<()> {
//! use namzu::{backend::local::LocalProvider, Provider, SandboxSpec};
//! let provider = LocalProvider::new(namzu::backend::default_state_dir())?;
//! let sb = provider.create(SandboxSpec::default()).await?;
//! let out = sb.commands().run("echo hello").await?;
//! assert_eq!(&out.stdout[..], b"hello\n");
//! sb.destroy().await?;
//! # Ok(()) }
//! ```

pub mod backend;
pub mod egress;
pub mod factory;
pub mod image;

pub use namzu_core::types::*;
pub use namzu_core::{check, client, error, fsutil, handle, pool, provider, spec, timeline, types};
pub use namzu_core::{
    features, limits, AgentClient, AttachRefusal, Bind, ByteStream, CancelOutcome, CancellationToken, ClientOptions,
    Commands, Error, ExecStream, FileInfoStream, Files, Network, Provider, Resources, Result, Sandbox, SandboxBackend,
    SandboxInfo, SandboxSpec, Sessions, SnapshotInfo, Terminal, Terminals, Tier, CONTAINER_AGENT_UID,
};
