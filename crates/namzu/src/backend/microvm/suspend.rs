//! Suspend and resume of microVM sandboxes. A suspend keeps the VM's
//! memory as well as its disk ([`super::snapshot`]), and the resume goes
//! on from there, processes and all. Kept here is the disk's own path,
//! for a sandbox whose memory was not kept (an older namzu's suspend) or
//! cannot be loaded: everything a guest writes (its overlay's upper layer:
//! `/workspace`, `/tmp`, `/home`, …) is on its writable disk, flushed
//! from inside before the VM ends, and the resume boots the same kernel,
//! image and writable disk again under the same id; the guest's processes
//! then start afresh, as after a reboot.
//!
//! The guest's init removes its spec (the token) from the writable disk
//! once read; the resume writes it back into the unmounted image with
//! e2fsprogs (`e2fsck` replays the journal the ended VM left, then
//! `debugfs` writes the file), from the copy kept beside the token in the
//! sandbox's directory. A failed resume leaves the sandbox suspended.

use std::path::Path;
use std::process::Command;

use super::*;
use crate::backend::state::Stop;

fn state_err(id: &str, message: impl Into<String>) -> Error {
    Error::State {
        id: id.into(),
        message: message.into(),
    }
}

/// Writes `spec` into the (unmounted) writable disk `rw` at the guest's
/// spec path, replacing what is there.
fn put_guest_spec(id: &str, rw: &Path, spec: &Path) -> Result<()> {
    let debugfs = crate::backend::disk::find_tool("debugfs")
        .map_err(|searched| state_err(id, format!("debugfs (e2fsprogs) not found; looked in {searched:?}")))?;
    // The VM ended with its disk mounted: what its journal holds is not yet
    // in place, and debugfs reads past a journal. Replayed first (or the
    // guest's own replay at boot would put back the removal over the
    // write).
    let e2fsck = crate::backend::disk::find_tool("e2fsck")
        .map_err(|searched| state_err(id, format!("e2fsck (e2fsprogs) not found; looked in {searched:?}")))?;
    let fsck = Command::new(&e2fsck)
        .args(["-p", "-E", "journal_only"])
        .arg(rw)
        .output()
        .map_err(io("resume"))?;
    // 0: clean; 1: errors corrected (the journal replayed).
    if !matches!(fsck.status.code(), Some(0 | 1)) {
        return Err(state_err(
            id,
            format!(
                "e2fsck could not replay the writable disk's journal ({}): {}",
                fsck.status,
                String::from_utf8_lossy(&fsck.stderr).trim()
            ),
        ));
    }
    let target = namzu_proto::launch::GUEST_SPEC_PATH;
    let script = format!("rm {target}\nwrite {} {target}\n", spec.display());
    let cmds = rw.with_extension("debugfs");
    std::fs::write(&cmds, script).map_err(io("resume"))?;
    let out = Command::new(&debugfs).arg("-w").arg("-f").arg(&cmds).arg(rw).output();
    let _ = std::fs::remove_file(&cmds);
    let out = out.map_err(io("resume"))?;
    // debugfs says little through its status: read the file back.
    let back = Command::new(&debugfs)
        .arg("-R")
        .arg(format!("cat {target}"))
        .arg(rw)
        .output()
        .map_err(io("resume"))?;
    let want = std::fs::read(spec).map_err(io("resume"))?;
    if back.stdout != want {
        return Err(state_err(
            id,
            format!(
                "could not write the guest's spec into its disk: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

impl MicroVmProvider {
    /// [`Provider::suspend`] of the microvm tier.
    pub(super) async fn suspend_vm(&self, id: &str) -> Result<()> {
        let (dir, meta) = self.state.read_meta(id)?;
        if meta.suspended_unix.is_some() {
            return Ok(());
        }
        let record = meta.record::<VmRecord>().unwrap_or_default();
        if record.parts.is_none() || !dir.join(GUEST_SPEC).exists() {
            return Err(state_err(id, "made by a namzu that kept no boot parts; cannot suspend"));
        }
        // A paused VM continues first: its disk is flushed from inside.
        if let Some(hold) = self.hold(id)?.filter(|h| h.paused()) {
            hold.resume_vm().await?;
        }
        self.suspend_with_memory(id, &dir, meta).await
    }

    /// [`Provider::resume`] of the microvm tier.
    pub(super) async fn resume_vm(&self, id: &str) -> Result<Sandbox> {
        let (dir, suspended) = self.state.read_meta(id)?;
        if suspended.suspended_unix.is_none() {
            // A paused VM (paused by another process, say) continues.
            if let Some(hold) = self.hold(id)?.filter(|h| h.paused()) {
                hold.resume_vm().await?;
                return self.connect(id).await;
            }
            return Err(Error::NotSuspended { id: id.into() });
        }
        let record = suspended.record::<VmRecord>().unwrap_or_default();
        let (Some(parts), Some(accel)) = (record.parts.clone(), record.accel) else {
            return Err(state_err(id, "no boot parts kept"));
        };
        let egress = crate::egress::supervisor::saved_config(&dir).map_err(io("resume"))?;
        let back_to_suspended = |e: Error| {
            if let Err(w) = self.state.write_meta(&dir, &suspended) {
                tracing::warn!(%id, "could not mark a failed resume suspended again: {w}");
            }
            e
        };
        let vm_dir = dir.join("vm");
        // The last boot's sockets: their listeners are gone, and the wait
        // for the guest takes a socket that exists for one that listens.
        let clear = || {
            for stale in [
                dir.join("agent.sock"),
                dir.join(run_state::RUN_SOCKET),
                dir.join(run_state::PAUSED_FILE),
                vm_dir.join("qmp.sock"),
            ] {
                let _ = std::fs::remove_file(stale);
            }
        };
        clear();
        let memory = dir.join(MEMORY_FILE);
        let mut restored = None;
        if memory.is_file() {
            match self
                .start(
                    id,
                    &dir,
                    &vm_dir,
                    record.uid_slot,
                    accel,
                    parts.clone(),
                    Some(memory.clone()),
                )
                .await
            {
                Ok(sb) => restored = Some(sb),
                // The kept disk still boots (it was flushed before the
                // save); what ran in memory is lost, and said so.
                Err(e) => {
                    tracing::warn!(%id, "the VM's memory could not be restored; booting its disk: {e}");
                    clear();
                }
            }
            // Its disk moves on from here: the memory no longer matches it.
            let _ = std::fs::remove_file(&memory);
        }
        let sandbox = match restored {
            Some(sb) => sb,
            None => {
                put_guest_spec(id, &parts.rw, &dir.join(GUEST_SPEC)).map_err(back_to_suspended)?;
                self.start(id, &dir, &vm_dir, record.uid_slot, accel, parts, None)
                    .await
                    .map_err(back_to_suspended)?
            }
        };
        let armed = async {
            privilege_probe(id, &sandbox.client).await?;
            self.state.supervisor(id, &dir, &self.agent_bin).start(&egress).await
        }
        .await;
        if let Err(e) = armed {
            sandbox.client.close();
            let _ = self.state.halt(id, Stop::Kill).await;
            return Err(back_to_suspended(e));
        }
        // The first creation's time, not this boot's.
        if let Ok((_, mut meta)) = self.state.read_meta(id) {
            meta.created_unix = suspended.created_unix;
            self.state.write_meta(&dir, &meta)?;
        }
        Ok(Sandbox::new(sandbox))
    }
}
