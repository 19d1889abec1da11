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
pub mod client;
pub mod egress;
pub mod error;
pub mod factory;
pub mod handle;
pub mod image;
pub mod provider;
pub mod spec;
pub mod types;

pub use client::{AgentClient, ByteStream, CancelOutcome, ClientOptions, ExecStream, FileInfoStream, Terminal};
pub use error::{AttachRefusal, Error, Result};
pub use handle::{Commands, Files, Network, Sandbox, SandboxBackend, Sessions, Terminals};
pub use namzu_proto::{features, limits, CONTAINER_AGENT_UID};
pub use provider::Provider;
pub use spec::{Bind, Resources, SandboxInfo, SandboxSpec, Tier};
pub use tokio_util::sync::CancellationToken;
pub use types::*;
