//! Which agent process a link reaches. The link learns the agent's boot id
//! at connect, again at every re-dial (the re-dial asks for the agent's
//! hello, which names it), and from every result that carries one (a
//! reservation, a started command or terminal, a cancel, a file read or
//! written, a TCP connection). Another id is another agent process — every
//! execution, session and reservation of the one before is gone — and is
//! told once to every observer, from the call that found it, before that
//! call returns.

use super::link::*;

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

    pub(super) fn current(&self) -> String {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl AgentClient {
    /// The boot id of the agent this link reached last: at connect
    /// [`AgentInfo::boot_id`], then whatever a re-dial or a result said.
    pub fn boot_id(&self) -> String {
        self.inner.boot.current()
    }

    /// Adds an observer told of every agent restart this link finds (a
    /// re-dial or a result naming another boot id).
    pub fn on_agent_restart(&self, observer: AgentRestartObserver) {
        self.inner
            .boot
            .observers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(observer);
    }

    /// Records the boot id a result carried; the id of the agent that
    /// answered.
    pub(super) fn answered_by(&self, id: &str) -> String {
        self.inner.boot.saw(&self.inner.sandbox_id, id)
    }
}
