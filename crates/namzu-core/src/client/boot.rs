//! Which agent process a link reaches. The link learns the agent's boot id
//! at connect, again at every re-dial (the re-dial asks for the agent's
//! hello, which names it), and from every result that carries one (a
//! reservation, a started command or terminal, a cancel, a file read or
//! written, a TCP connection). Another id is another agent process — every
//! execution, session and reservation of the one before is gone — and is
//! told once to every observer, from the call that found it, before that
//! call returns. Also here: what an agent's health (or hello) says, as an
//! [`AgentInfo`].

use std::sync::{Arc, Mutex};

use namzu_proto::v1;

use crate::error::bytes_path;
use crate::types::AgentInfo;

/// Told `(previous, current)` boot ids when a link finds its agent
/// restarted. Called synchronously from the call (or re-dial) that found
/// it: it must not block.
pub type AgentRestartObserver = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// The boot id a link last saw, and who is told when it changes.
#[derive(Default)]
pub(super) struct Boot {
    current: Mutex<String>,
    observers: Mutex<Vec<AgentRestartObserver>>,
}

impl Boot {
    /// Records the id the agent answered with (an agent older than the
    /// field answers none: the one known stands) and returns it; a change
    /// is told to every observer.
    pub(super) fn saw(&self, sandbox_id: &str, id: &str) -> String {
        let previous = {
            let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if id.is_empty() || *c == id {
                return c.clone();
            }
            std::mem::replace(&mut *c, id.to_owned())
        };
        // The first id a link learns is no restart.
        if previous.is_empty() {
            return id.to_owned();
        }
        tracing::warn!(sandbox = %sandbox_id, %previous, current = %id,
            "the agent restarted: its executions, sessions and reservations are gone");
        let observers = self.observers.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for o in observers {
            o(&previous, id);
        }
        id.to_owned()
    }

    pub(super) fn observe(&self, observer: AgentRestartObserver) {
        self.observers.lock().unwrap_or_else(|p| p.into_inner()).push(observer);
    }

    pub(super) fn current(&self) -> String {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub(super) fn agent_info(h: v1::HealthResponse) -> AgentInfo {
    AgentInfo {
        protocol_version: h.protocol_version,
        agent_version: h.agent_version,
        boot_id: h.boot_id,
        features: h.features,
        retiring: h.retiring,
        paused: h.paused,
        pid: h.pid,
        rss_bytes: h.rss_bytes,
        peak_rss_bytes: h.peak_rss_bytes,
        limits: h.limits.into_iter().map(|l| (l.name, l.value)).collect(),
        ops_served: h.ops_served,
        hardening: h.hardening.into_iter().collect(),
        roots: h.roots.iter().map(|r| bytes_path(r)).collect(),
        startup: h.startup.into_iter().map(|m| (m.stage, m.monotonic_ns)).collect(),
        egress_refused_unattended: h.egress_refused_unattended,
        child_status: h.child_status,
    }
}
