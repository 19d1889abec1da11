//! `AgentClient`: the host's end of one link to an agent.
//!
//! It owns one HTTP/2 connection, carried over whatever byte stream a dialer
//! produces (unix socket, TCP, an inherited socket, later vsock or an exec's
//! stdio). Each new stream is authenticated with the preface before HTTP/2
//! starts. The client reads `Health` once at connect and refuses, with
//! [`Error::Unsupported`](crate::Error::Unsupported), any op whose feature the agent did not advertise —
//! before sending anything.
//!
//! This module dials, authenticates and keeps the link; the operations are
//! grouped in its children: `exec` (commands and detachable executions),
//! `executions` (listed, cancelled by id), `boot` (which agent process the
//! link reaches, and who is told when that changes),
//! `files`, `sessions` (with quiesce and flush), `terminal` and `tcp`.
//!
//! What the link does not know: who else may declare the sandbox gone (a
//! tier's lease attaches as a [`LinkGuard`]), and calls only one host
//! service makes (the egress supervisor's, through [`AgentClient::rpc_for`]).

mod back;
mod boot;
mod exec;
mod executions;
mod files;
mod hold;
mod keepalive;
mod link;
mod sessions;
mod side;
mod side_exec;
mod side_read;
mod side_write;
mod tcp;
mod terminal;

pub use crate::types::CancelOutcome;
pub use back::BackListener;
pub use boot::AgentRestartObserver;
pub use exec::ExecStream;
pub use link::{
    AgentClient, ByteStream, ClientOptions, FileInfoStream, LinkGuard, LinkStream, LinkStreamObj, WatchStream,
    WRITE_CHUNK,
};
pub use side::EgressStream;
pub use terminal::Terminal;
