//! The namzu guest agent: the one static binary that runs inside every
//! sandbox, whatever the boundary, and serves the `namzu.agent.v1` protocol
//! over a single authenticated HTTP/2 link.
//!
//! Modules, each owning one job:
//! * [`serve`](mod@serve): listeners (unix socket, TCP, inherited fd, virtio port), the preface gate,
//!   shutdown on SIGTERM;
//! * [`dial_back`]: standby connections out to host listeners, where the
//!   boundary lets the sandbox connect out but not listen (gVisor);
//! * [`service`]: the gRPC service;
//! * [`op_error`]: an operation's typed error and its status;
//! * [`fence`]: the retiring fence in front of every RPC;
//! * [`exec`]: executions — reservation, streaming, timeout, confirmed kills;
//! * [`side_exec`]: a command on a stream of its own (the exec form of the
//!   preface), beside the side reads and writes;
//! * [`reaper`]: the single `waitpid` owner (the agent is a subreaper);
//! * [`spawn`]: commands started with posix_spawn (a vfork, not a fork);
//! * [`files`]: atomic writes, bounded reads, walks — through [`jail`];
//! * [`disk`]: a workspace's raw block device, formatted only when it
//!   provably carries no filesystem, and mounted before the privilege drop;
//! * [`identity`]: the agent's own uid and its commands' user, where no
//!   user namespace separates them (containers);
//! * [`jail`]: confinement of every path beneath the configured roots;
//! * [`terminal`]: commands on a pty, and the session sweep on close;
//! * [`sessions`]: named sessions outliving any link (detached commands,
//!   persistent terminals), output in offset-addressed rings;
//! * [`tcp`]: TCP connections into the sandbox, relayed;
//! * [`heartbeat`]: the beats a streaming call sends;
//! * [`egress`]: the loopback proxy and resolver, every decision the host's;
//! * [`quiesce`]: stopping every process but the agent; flush;
//! * [`pause`]: every process but the agent stopped, and continued;
//! * [`sandbox`]: `--launch`, building a `local` sandbox around the agent;
//! * [`guest`]: the agent as a microVM's init (disks, overlay, switch root);
//! * [`port`]: a virtio-serial port as a byte stream (the microVM link);
//! * [`timeline`]: when each step of the agent's start happened (Health).

// Errors here are `tonic::Status` (fixed by the generated service trait) or
// the wire error it carries; both are built on cold paths only, so their size
// costs nothing that boxing would save.
#![allow(clippy::result_large_err)]

pub mod archive;
pub mod config;
pub mod dial_back;
pub mod disk;
pub mod egress;
pub mod exec;
pub mod exec_log;
mod exec_pipes;
pub mod fence;
pub mod files;
pub mod files_watch;
pub mod guest;
pub mod heartbeat;
pub mod identity;
pub mod jail;
pub mod op_error;
pub mod pause;
pub mod port;
pub mod port_session;
pub mod quiesce;
pub mod reaper;
pub mod relay;
pub mod sandbox;
pub mod serve;
pub mod service;
pub mod sessions;
pub mod side_exec;
mod side_read;
mod side_write;
pub mod spawn;
pub mod tcp;
pub mod terminal;
pub mod timeline;
pub mod token;

pub use config::{AgentConfig, Limits};

/// This agent process's boot id: random, drawn at its first use and the
/// same for the rest of the process. Health, the hello, and every result
/// a host may need to tie to one agent process (a reservation, a started
/// command or terminal, a cancel, a file read or written, a TCP connection)
/// carry it: a host that finds another id learns that every execution,
/// session and reservation of the agent it knew is gone.
pub fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| format!("{:032x}", rand::random::<u128>()))
}
pub use serve::{serve, serve_listener, Listen, ServeError};
