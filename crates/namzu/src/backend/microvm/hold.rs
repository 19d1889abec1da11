//! The host's side of a whole-VM pause ([`super::run_state`], served by
//! the anchor): a handle's `pause` and `resume` ask the anchor, and the
//! link's guard tells every operation, and the link's keepalive and
//! streams, that the VM is held still on purpose while it is paused.

use std::path::PathBuf;
use std::sync::Arc;

use super::run_state::{is_paused, request, RunReply, RUN_SOCKET};
use crate::error::{Error, Result};
use crate::types::{PauseReport, ResumeReport};

/// One VM's pause, as its handles and links see it.
pub(super) struct VmHold {
    id: String,
    dir: PathBuf,
    /// The anchor's pid: a pause outlives no anchor (one killed while its
    /// VM was paused leaves the file behind, and the VM is dead).
    anchor: u32,
}

impl VmHold {
    /// For the VM whose state is in `dir`, where its anchor serves a run
    /// state; `None` for an anchor of an older namzu (its agent pauses the
    /// processes, as on the other tiers).
    pub(super) fn of(id: &str, dir: PathBuf, anchor: u32) -> Option<Arc<Self>> {
        dir.join(RUN_SOCKET).exists().then(|| {
            Arc::new(Self {
                id: id.to_owned(),
                dir,
                anchor,
            })
        })
    }

    /// Whether the VM is paused: its anchor keeps the file, and lives.
    pub(super) fn paused(&self) -> bool {
        is_paused(&self.dir) && crate::backend::state::alive(self.anchor, &self.dir)
    }

    async fn ask(&self, verb: &str) -> Result<RunReply> {
        let failed = |message: String| Error::State {
            id: self.id.clone(),
            message: format!("{verb}: {message}"),
        };
        match request(&self.dir, verb).await {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(failed("the VM's anchor serves no run state".into())),
            Err(e) => Err(failed(e.to_string())),
        }
    }

    /// Continues the VM; how long it was paused.
    pub(super) async fn resume_vm(&self) -> Result<std::time::Duration> {
        match self.ask("resume").await? {
            RunReply::Running(paused_for) => Ok(paused_for),
            RunReply::Paused => Err(Error::State {
                id: self.id.clone(),
                message: "resume: the VM is still paused".into(),
            }),
        }
    }
}

impl namzu_core::client::LinkGuard for VmHold {
    fn check(&self, _sandbox_id: &str) -> Result<()> {
        Ok(())
    }

    fn held(&self, _sandbox_id: &str) -> bool {
        self.paused()
    }
}

#[async_trait::async_trait]
impl crate::backend::state::WholePause for VmHold {
    async fn pause(&self) -> Result<PauseReport> {
        let already = self.paused();
        match self.ask("pause").await? {
            RunReply::Paused => Ok(PauseReport {
                stopped: Vec::new(),
                rounds: u32::from(!already),
            }),
            RunReply::Running(_) => Err(Error::State {
                id: self.id.clone(),
                message: "pause: the VM still runs".into(),
            }),
        }
    }

    async fn resume(&self) -> Result<ResumeReport> {
        Ok(ResumeReport {
            continued: Vec::new(),
            paused_for: self.resume_vm().await?,
        })
    }

    fn is_paused(&self) -> bool {
        self.paused()
    }
}
