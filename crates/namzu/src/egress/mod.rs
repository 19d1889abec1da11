//! Egress on the single-host tiers: the policy types and decisions are
//! `namzu_core::egress`'s (re-exported here); this module adds the host
//! side that enforces them.
//!
//! * [`service`]: the host's answers: resolve, check, connect, splice;
//!   live policy changes;
//! * [`supervisor`]: the per-sandbox host process running the service,
//!   and its control socket.

pub use namzu_core::egress::*;

pub mod service;
pub mod supervisor;
