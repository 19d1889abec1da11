//! namzu host library: one [`Sandbox`] API over many isolation boundaries.
//!
//! A [`Provider`] per tier makes sandboxes; each sandbox runs the static
//! `namzu-agent` inside its boundary and is driven through an
//! [`AgentClient`] over one authenticated HTTP/2 link. Errors are
//! [`Error`] variants a caller can match; the library never prints (it logs
//! through `tracing`).
//!
//! ```no_run
//! # async fn demo() -> namzu::Result<()> {
//! use namzu::{backend::host::HostProvider, ExecRequest, Provider, SandboxSpec};
//! let provider = HostProvider::new(namzu::backend::default_state_dir())?;
//! let sb = provider.create(SandboxSpec::default()).await?;
//! let out = sb.exec(ExecRequest::shell("echo hello")).await?;
//! assert_eq!(&out.stdout[..], b"hello\n");
//! sb.destroy().await?;
//! # Ok(()) }
//! ```

pub mod backend;
pub mod client;
pub mod egress;
pub mod error;
pub mod image;
pub mod sandbox;
pub mod types;

pub use client::{AgentClient, ByteStream, CancelOutcome, ClientOptions, ExecStream, FileInfoStream, Terminal};
pub use error::{AttachRefusal, Error, Result};
pub use namzu_proto::{features, limits, CONTAINER_AGENT_UID};
pub use sandbox::{Bind, Provider, Resources, Sandbox, SandboxInfo, SandboxSpec, Tier};
pub use tokio_util::sync::CancellationToken;
pub use types::*;
