//! Creates and resumes that run to their end whatever becomes of their
//! caller.
//!
//! A create future dropped half way (a caller's `timeout`, a `select!` that
//! took another branch) would leave whatever it had made so far: a
//! launcher still starting, a state directory, an id range, cgroups, a
//! started sandbox no handle points at. [`finish`] runs the create as a
//! task of its own instead, and the sandbox it makes is destroyed unless a
//! caller takes it: dropped before it returns, a create leaves nothing.
//!
//! A runtime shutting down cancels that task too. What it has started by
//! then is the tier's to kill at once (the local launcher's process group
//! is, see `state::Unanswered`); a state directory left behind is a dead
//! sandbox's, which `gc` removes.

use std::future::Future;

use tracing::Instrument;

use crate::error::{Error, Result};
use crate::handle::Sandbox;

/// What stops a made sandbox at once if its create is abandoned after it
/// was made but before a caller took it, when the runtime may be too far
/// gone to run its destroy: the tier's guard, disarmed when a caller takes
/// the sandbox, dropped (and firing) otherwise.
pub(crate) trait Disarm: Send + 'static {
    fn disarm(self);
}

/// A made sandbox on its way to the caller: stopped and destroyed if
/// dropped before the caller took it (the caller went away, or the channel
/// was dropped with it still inside).
struct Unclaimed<G: Disarm> {
    made: Option<(Sandbox, G)>,
    runtime: tokio::runtime::Handle,
}

impl<G: Disarm> Unclaimed<G> {
    fn claim(mut self) -> Option<Sandbox> {
        self.made.take().map(|(sandbox, guard)| {
            guard.disarm();
            sandbox
        })
    }
}

impl<G: Disarm> Drop for Unclaimed<G> {
    fn drop(&mut self) {
        if let Some((sandbox, guard)) = self.made.take() {
            tracing::debug!(id = sandbox.id(), "its create was abandoned: destroying it");
            // Stopped now; the rest (its state, its id range …) once the
            // runtime runs the destroy — or by `gc` if it never does.
            drop(guard);
            self.runtime.spawn(async move {
                if let Err(e) = sandbox.destroy().await {
                    tracing::warn!(
                        id = sandbox.id(),
                        "could not destroy a sandbox whose create was abandoned: {e}"
                    );
                }
            });
        }
    }
}

/// Runs `create` to its end on a task of its own and returns the sandbox
/// it made, disarming its guard (see the module docs).
pub(crate) async fn finish<F, G>(create: F) -> Result<Sandbox>
where
    F: Future<Output = Result<(Sandbox, G)>> + Send + 'static,
    G: Disarm,
{
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(
        async move {
            let made = create.await.map(|m| Unclaimed { made: Some(m), runtime });
            // A caller gone by now drops it here, which destroys it.
            let _ = tx.send(made);
        }
        // The caller's span, so its logs still read as the caller's.
        .instrument(tracing::Span::current()),
    );
    match rx.await {
        Ok(made) => made.and_then(|u| {
            u.claim().ok_or_else(|| Error::State {
                id: String::new(),
                message: "a create's sandbox was taken twice".into(),
            })
        }),
        // The task sends before it ends: it panicked or was cancelled.
        Err(_) => Err(task.await.err().map_or_else(cancelled_error, cancelled)),
    }
}

/// Runs `resume` to its end on a task of its own and returns the sandbox
/// it brought back. Dropped, the resume goes on all the same, and its
/// sandbox is left running — recorded, reachable by `connect`, able to
/// suspend again — for a resume must not lose what it brings back.
pub(crate) async fn keep<F>(resume: F) -> Result<Sandbox>
where
    F: Future<Output = Result<Sandbox>> + Send + 'static,
{
    tokio::spawn(resume.instrument(tracing::Span::current()))
        .await
        .map_err(cancelled)?
}

/// A task that ended without an answer: its panic, resumed here, or its
/// runtime shutting down.
fn cancelled(e: tokio::task::JoinError) -> Error {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
    cancelled_error()
}

fn cancelled_error() -> Error {
    Error::State {
        id: String::new(),
        message: "cancelled: the runtime is shutting down".into(),
    }
}
