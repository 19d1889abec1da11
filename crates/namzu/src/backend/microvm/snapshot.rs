//! Memory snapshots of microVMs: suspend with the VM's memory kept, and
//! forks of a running VM.
//!
//! qemu saves a VM's RAM and device state by migrating it into a file
//! descriptor ([`super::qmp::save_memory`]); a VMM started with
//! `-incoming` on that file goes on from the very instruction it stopped
//! at. Processes, executions and their logs, the page cache: all as they
//! were. The guest's first words with its new host go through a fresh
//! port session (`namzu_proto::mux_sync`), which also sets its clock and
//! hands it the sandbox's token.
//!
//! * **Suspend** saves memory into `memory.snap` beside the writable disk
//!   and ends the VM; **resume** restores it (the file is removed once the
//!   VM runs on from it: its disk has moved on). A memory file the VMM
//!   cannot load (another qemu) leaves the resume to boot the kept disk.
//! * **Snapshot** stops a running VM for as long as its memory and disk
//!   take to copy, then lets it run on; the snapshot (`<state>/microvm/
//!   .snapshots/<id>`) holds the memory file, a raw copy of the disk, and
//!   what it takes to boot the same VM. **Fork** starts a new sandbox from
//!   it on a qcow2 overlay of that disk (copy-on-write: a fork costs the
//!   blocks it writes), under its own id, token and uid slot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::qmp::{save_memory, Qmp};
use super::*;
use crate::backend::state::Stop;
use crate::spec::SnapshotInfo;

/// How long a memory save may take.
const SAVE_BOUND: Duration = Duration::from_secs(300);
/// The longest a QMP answer may take.
const QMP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a snapshot's directory records, as `snapshot.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SnapshotRecord {
    info: SnapshotInfo,
    accel: vmm::Accel,
    /// Kernel, initramfs, base disk and sizes; `rw` is the snapshot's disk.
    parts: VmParts,
    egress: crate::egress::EgressConfig,
    /// The source's guest spec (a fork's gets its own id and token).
    guest: GuestSpec,
}

fn state_err(id: &str, message: impl Into<String>) -> Error {
    Error::State {
        id: id.into(),
        message: message.into(),
    }
}

/// Runs `f` with a QMP session on the VM in `vm_dir`, on a blocking thread.
async fn with_qmp<T: Send + 'static>(
    id: &str,
    vm_dir: &Path,
    f: impl FnOnce(&mut Qmp) -> std::result::Result<T, super::qmp::QmpError> + Send + 'static,
) -> Result<T> {
    let sock = vm_dir.join("qmp.sock");
    let r = tokio::task::spawn_blocking(move || Qmp::connect(&sock, QMP_TIMEOUT).and_then(|mut q| f(&mut q)))
        .await
        .map_err(|e| state_err(id, format!("qmp task: {e}")))?;
    r.map_err(|e| state_err(id, e.to_string()))
}

/// Creates `path` (mode 0600, replacing what is there) for the VMM to
/// write a memory snapshot into.
fn memory_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Bytes `path` takes on its filesystem.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

fn run(id: &str, what: &str, cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(|e| state_err(id, format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(state_err(
        id,
        format!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    ))
}

fn qemu_img() -> Result<PathBuf> {
    crate::backend::disk::find_tool("qemu-img").map_err(|searched| {
        tier_err(MicroVmError::ToolNotFound {
            tool: "qemu-img",
            searched,
        })
    })
}

/// A raw copy of the writable disk `rw` at `to`: sparse (holes stay
/// holes) and a reflink where the filesystem shares blocks; a fork's qcow2
/// overlay is flattened.
fn copy_disk(id: &str, rw: &Path, to: &Path) -> Result<()> {
    if vmm::disk_format(rw) == "qcow2" {
        return run(
            id,
            "qemu-img convert",
            Command::new(qemu_img()?)
                .args(["convert", "-q", "-f", "qcow2", "-O", "raw", "-S", "4k"])
                .arg(rw)
                .arg(to),
        );
    }
    run(
        id,
        "copy the disk",
        Command::new("cp")
            .args(["--sparse=always", "--reflink=auto"])
            .arg(rw)
            .arg(to),
    )?;
    // Read by every fork's VMM, each under a uid of its own: readable,
    // while the snapshots' directory (0700) keeps it from anyone on the
    // host but root and the jails it is bound into.
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o644)).map_err(io("snapshot"))
}

impl MicroVmProvider {
    fn snapshots_dir(&self) -> PathBuf {
        self.state.root().join(".snapshots")
    }

    fn snapshot_dir(&self, snapshot: &str) -> Result<PathBuf> {
        let ok = !snapshot.is_empty() && snapshot.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        let dir = self.snapshots_dir().join(snapshot);
        if !ok || !dir.join("snapshot.json").is_file() {
            return Err(Error::SnapshotNotFound {
                snapshot: snapshot.into(),
            });
        }
        Ok(dir)
    }

    fn read_snapshot(&self, snapshot: &str) -> Result<(PathBuf, SnapshotRecord)> {
        let dir = self.snapshot_dir(snapshot)?;
        let text = std::fs::read(dir.join("snapshot.json")).map_err(io("snapshot"))?;
        let rec = serde_json::from_slice(&text).map_err(|e| state_err(snapshot, e.to_string()))?;
        Ok((dir, rec))
    }

    /// Suspend with memory: the disk made durable (so the kept disk boots
    /// too), the VM's memory saved beside it, the VM ended.
    pub(super) async fn suspend_with_memory(&self, id: &str, dir: &Path, meta: Meta) -> Result<()> {
        let (_, client) = self.state.reattach(id, &self.client).await?;
        client.flush(FLUSH_BOUND).await?;
        client.close();
        let vm_dir = dir.join("vm");
        let path = dir.join(MEMORY_FILE);
        let file = memory_file(&path).map_err(io("suspend"))?;
        let saved = with_qmp(id, &vm_dir, move |q| {
            let r = save_memory(q, &file, SAVE_BOUND);
            if r.is_err() {
                let _ = q.execute("cont", None);
            }
            r
        })
        .await;
        if let Err(e) = saved {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        self.state.halt(id, Stop::Kill).await?;
        let suspended = Meta {
            pid: 0,
            procs: Vec::new(),
            suspended_unix: Some(now_unix()),
            ..meta
        };
        self.state.write_meta(dir, &suspended)
    }

    /// [`Provider::snapshot`] of the microvm tier.
    pub(super) async fn snapshot_vm(&self, id: &str) -> Result<SnapshotInfo> {
        let (dir, meta) = self.state.read_meta(id)?;
        if meta.suspended_unix.is_some() {
            return Err(Error::SandboxSuspended { id: id.into() });
        }
        // Its agent is asked to flush first, which a paused VM cannot.
        if self.hold(id)?.is_some_and(|h| h.paused()) {
            return Err(Error::SandboxPaused { op: "snapshot".into() });
        }
        let record = meta.record::<VmRecord>().unwrap_or_default();
        let (Some(parts), Some(accel)) = (record.parts.clone(), record.accel) else {
            return Err(state_err(
                id,
                "made by a namzu that kept no boot parts; cannot snapshot",
            ));
        };
        let guest: GuestSpec = std::fs::read(dir.join(GUEST_SPEC))
            .map_err(io("snapshot"))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| state_err(id, e.to_string())))?;
        // The link answers (the VM is alive) before it is stopped.
        self.state.reattach(id, &self.client).await?.1.close();
        let snap_id = format!("snap-{:012x}", rand::random::<u64>() >> 16);
        std::fs::create_dir_all(self.snapshots_dir()).map_err(io("snapshot"))?;
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).map_err(io("snapshot"))
        };
        mode(&self.snapshots_dir(), 0o700)?;
        let part = self.snapshots_dir().join(format!(".{snap_id}.part"));
        std::fs::create_dir(&part).map_err(io("snapshot"))?;
        mode(&part, 0o755)?;
        let file = memory_file(&part.join("memory")).map_err(io("snapshot"))?;
        let (rw, disk, owner) = (parts.rw.clone(), part.join("disk.raw"), id.to_owned());
        let saved = with_qmp(id, &dir.join("vm"), move |q| {
            let saved = save_memory(q, &file, SAVE_BOUND).map(|n| (n, copy_disk(&owner, &rw, &disk)));
            // The VM runs on whatever happened.
            let _ = q.execute("cont", None);
            saved
        })
        .await;
        let memory_bytes = match saved {
            Ok((n, Ok(()))) => n,
            Ok((_, Err(e))) | Err(e) => {
                let _ = std::fs::remove_dir_all(&part);
                return Err(e);
            }
        };
        let info = SnapshotInfo {
            id: snap_id.clone(),
            source: id.into(),
            tier: Tier::MicroVm,
            created_unix: now_unix(),
            memory_bytes,
            disk_bytes: allocated(&part.join("disk.raw")),
        };
        let final_dir = self.snapshots_dir().join(&snap_id);
        let rec = SnapshotRecord {
            info: info.clone(),
            accel,
            parts: VmParts {
                rw: final_dir.join("disk.raw"),
                backing: None,
                ..parts
            },
            egress: crate::egress::supervisor::saved_config(&dir).map_err(io("snapshot"))?,
            guest,
        };
        let json = serde_json::to_vec_pretty(&rec).map_err(|e| state_err(id, e.to_string()))?;
        crate::fsutil::write_private(&part.join("snapshot.json"), &json).map_err(io("snapshot"))?;
        std::fs::rename(&part, &final_dir).map_err(io("snapshot"))?;
        Ok(info)
    }

    /// [`Provider::fork`] of the microvm tier.
    pub(super) async fn fork_vm(&self, snapshot: &str) -> Result<Sandbox> {
        const OP: &str = "fork";
        let (snap_dir, rec) = self.read_snapshot(snapshot)?;
        let (id, dir, token, made) = self.state.create(None)?;
        let vm_dir = dir.join("vm");
        std::fs::create_dir(&vm_dir).map_err(io(OP))?;
        let rw = vm_dir.join("rw.qcow2");
        let base = snap_dir.join("disk.raw");
        run(
            &id,
            "qemu-img create",
            Command::new(qemu_img()?)
                .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                .arg(&base)
                .arg(&rw),
        )?;
        let guest = GuestSpec {
            id: id.clone(),
            token: String::from_utf8_lossy(&token).into_owned(),
            ..rec.guest.clone()
        };
        let guest_json = serde_json::to_vec(&guest).map_err(|e| state_err(&id, e.to_string()))?;
        crate::fsutil::write_private(&dir.join(GUEST_SPEC), &guest_json).map_err(io(OP))?;
        let slot = self.claim_slot(&id, OP)?;
        let parts = VmParts {
            rw,
            backing: Some(base),
            ..rec.parts.clone()
        };
        let started = self
            .start(
                &id,
                &dir,
                &vm_dir,
                slot,
                rec.accel,
                parts,
                Some(snap_dir.join("memory")),
            )
            .await;
        let sandbox = match started {
            Ok(sb) => sb,
            Err(e) => {
                if let Some(s) = slot {
                    self.slots().release(s, &id);
                }
                return Err(e);
            }
        };
        made.keep();
        let armed = async {
            privilege_probe(&id, &sandbox.client).await?;
            self.state
                .supervisor(&id, &dir, &self.agent_bin)
                .start(&rec.egress)
                .await
        }
        .await;
        if let Err(e) = armed {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Sandbox::new(sandbox))
    }

    /// [`Provider::snapshots`] of the microvm tier.
    pub(super) fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<SnapshotInfo> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                self.read_snapshot(&name).ok().map(|(_, r)| r.info)
            })
            .collect();
        out.sort_by(|a, b| (a.created_unix, &a.id).cmp(&(b.created_unix, &b.id)));
        Ok(out)
    }

    /// [`Provider::delete_snapshot`] of the microvm tier: refused while a
    /// sandbox's disk overlays it.
    pub(super) fn remove_snapshot(&self, snapshot: &str) -> Result<()> {
        let dir = self.snapshot_dir(snapshot)?;
        let base = dir.join("disk.raw");
        let mut forks = Vec::new();
        for s in self.state.list()? {
            let Ok((_, meta)) = self.state.read_meta(&s.id) else {
                continue;
            };
            let rec = meta.record::<VmRecord>().unwrap_or_default();
            if rec.parts.and_then(|p| p.backing).as_deref() == Some(base.as_path()) {
                forks.push(s.id);
            }
        }
        if !forks.is_empty() {
            return Err(Error::SnapshotInUse {
                snapshot: snapshot.into(),
                forks,
            });
        }
        // Renamed out of the way first: a half-removed snapshot never lists.
        let gone = self.snapshots_dir().join(format!(".{snapshot}.gone"));
        std::fs::rename(&dir, &gone).map_err(io("delete_snapshot"))?;
        std::fs::remove_dir_all(&gone).map_err(io("delete_snapshot"))
    }
}
