//! What the E2B modules share and the server's state holds: the envd
//! version and port, tokens, the processes and watchers the server keeps,
//! the call target, and the `end` event. A leaf: it imports no other E2B
//! module and not the server state, so those may all import it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::RngCore;
use serde_json::{json, Value};

use crate::registry::Record;

/// The envd version advertised: the SDK's features up to octet-stream
/// uploads and `close_stdin` are served.
pub const ENVD_VERSION: &str = "0.5.7";

/// envd's port; any other `E2b-Sandbox-Port` is a port inside the sandbox.
pub const ENVD_PORT: &str = "49983";

/// A fresh envd access token.
pub fn new_token() -> String {
    let mut raw = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a call asks of a terminal's task.
#[derive(Debug)]
pub enum PtyInput {
    /// Bytes typed.
    Data(Bytes),
    /// New size.
    Resize(u16, u16),
    /// Close it, killing what runs in it.
    Kill,
}

/// What the server remembers of an E2B process it started: the config
/// `List` reports, and the stdin it may still feed.
pub struct Proc {
    /// The detachable execution behind it.
    pub execution_id: String,
    /// The `ProcessConfig` as given, for `List`.
    pub config: serde_json::Value,
    /// Its tag, if given.
    pub tag: Option<String>,
    /// Open stdin (started with `stdin: true`, not closed since).
    pub stdin: Option<tokio::sync::mpsc::Sender<bytes::Bytes>>,
    /// A PTY process: its terminal's task.
    pub pty: Option<tokio::sync::mpsc::Sender<PtyInput>>,
}

/// E2B processes by (sandbox id, pid).
#[derive(Default)]
pub struct Procs(pub Mutex<HashMap<(String, u32), Proc>>);

/// The sandbox an envd call is for, once its token checked.
#[derive(Clone)]
pub struct EnvdTarget(pub Record);

/// Events a polling watcher keeps between two GetWatcherEvents; past it
/// the oldest are dropped.
pub const WATCHER_BUFFER: usize = 10_000;

/// One polling watcher.
pub struct Watcher {
    /// The sandbox it watches in.
    pub sandbox: String,
    /// Events not yet fetched.
    pub events: Arc<Mutex<std::collections::VecDeque<Value>>>,
    /// The task filling it.
    pub task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polling watchers by id.
#[derive(Default)]
pub struct Watchers(pub Mutex<HashMap<String, Watcher>>);

/// The `end` event of an exit.
pub fn end_event(s: &namzu::ExitStatus) -> Value {
    let (code, status) = match (s.code, s.signal) {
        (Some(c), _) => (c, format!("exit status {c}")),
        (None, Some(9)) => (-1, "signal: killed".to_string()),
        (None, Some(sig)) => (-1, format!("signal: {sig}")),
        _ => (-1, "unknown".to_string()),
    };
    let mut end = json!({"exitCode": code, "exited": s.code.is_some(), "status": status});
    if s.timed_out {
        end["error"] = json!("the process was killed at its timeout");
    }
    json!({"event": {"end": end}})
}
