//! `namzu serve`: the HTTP API over the namzu library, so any language can
//! drive sandboxes. The server is one more user of the library's handle
//! API ([`namzu::Sandbox`]); it adds what a shared service needs:
//!
//! * [`keys`]: API keys, stored hashed and compared in constant time; every
//!   sandbox belongs to the key that made it ([`registry`]).
//! * [`config::Limits`]: a named, configurable bound on bodies, uploads,
//!   header time, streams and sandboxes per key, and connections.
//! * [`api`]: the routes, and the OpenAPI 3.1 document generated from them.
//! * [`metrics`]: Prometheus text at `/metrics`.
//! * [`server`]: HTTP/1.1, h2c, TLS, graceful shutdown.
//! * [`e2b`]: the wire the E2B SDKs speak, on the same listener.
//!
//! Sandboxes outlive the server: it keeps its records under
//! `<state>/server/`, and a restarted server serves them again; commands
//! are detachable executions, re-attached by offset.

#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod e2b;
pub mod error;
pub mod keys;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod state;
pub mod urlenc;

pub use config::{Limits, ServerConfig, Template, TlsFiles};
pub use error::{ApiError, ErrorBody};
pub use keys::{new_key, ApiKeys};
pub use server::{serve, ServeError};
