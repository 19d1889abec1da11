//! Suspend and resume of docker sandboxes: `docker stop` with the
//! container, its workspace (and disk) and its state directory kept, and
//! `docker start` of the same container under the same id.
//!
//! The container's root is read-only and its writable paths are tmpfs's,
//! which a stop empties: the suspend archives them first (all but `/run`,
//! runtime state that starts empty as after a reboot) with the sandbox
//! paused, and the resume puts them back before the handle is handed out.
//! Who reads and writes them must be able to read every command's files
//! whatever their modes, and give unpacked files back to their owners:
//! * under runc, the host itself (root), through the container's
//!   `/proc/<pid>/root` — the container keeps no capability for it;
//! * under gVisor, whose tmpfs's live in the Sentry's memory out of the
//!   host's reach, the agent's binary in a `docker exec` as root
//!   (`--archive` / `--unarchive`), with the file capabilities a gVisor
//!   container holds for its agent anyway (`GVISOR_FILE_CAPS`).
//!
//! Either way the walk and the unpack are `namzu_agent::archive`'s: no
//! symlink followed, no mount crossed, a bounded archive, nothing
//! unpacked outside the archived paths. The archive is `<dir>/saved.tar`
//! on the host.
//!
//! A failed suspend resumes the sandbox where it was; a failed resume
//! stops the container again and leaves it suspended, archive kept.

use std::path::Path;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::*;

/// The archive of the writable tmpfs's, in the sandbox's directory.
const SAVED: &str = "saved.tar";
/// The agent's exit status for an archive over its limit (its `main`).
const ARCHIVE_TOO_BIG: i64 = 3;
/// How long `docker stop` waits before SIGKILL.
const STOP_GRACE_SECS: i64 = 5;

fn io(op: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::LocalIo { op: op.into(), source }
}

impl DockerProvider {
    /// The tmpfs's a suspend keeps: the writable paths but `/run`.
    fn kept_paths(&self) -> Vec<String> {
        if self.opts.read_only_rootfs == Some(false) {
            // A writable root is the container's own layer, which a stop keeps.
            return Vec::new();
        }
        self.opts.writable_paths().into_iter().filter(|p| p != "/run").collect()
    }

    /// Runs the agent binary in `container` as root, privileged, with
    /// `args`; `input` goes to its stdin, its stdout to `out`. Returns its
    /// exit code and what it said on stderr.
    async fn agent_exec(
        &self,
        container: &str,
        args: Vec<String>,
        input: Option<Vec<u8>>,
        mut out: Option<&mut tokio::fs::File>,
    ) -> Result<(i64, String)> {
        let mut cmd = vec![link::AGENT_PATH.to_owned()];
        cmd.extend(args);
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdin: Some(input.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(cmd),
                    user: Some("0".to_owned()),
                    ..Default::default()
                },
            )
            .await
            .map_err(daemon_err("suspend exec"))?;
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(1 << 20),
                }),
            )
            .await
            .map_err(daemon_err("suspend exec"))?;
        let StartExecResults::Attached {
            mut output,
            input: mut stdin,
        } = started
        else {
            return Err(DockerError::Daemon {
                op: "suspend exec".into(),
                message: "the daemon started it detached".into(),
            }
            .into());
        };
        let feed = async move {
            if let Some(bytes) = input {
                stdin.write_all(&bytes).await?;
            }
            stdin.shutdown().await
        };
        let drain = async {
            let mut said = String::new();
            while let Some(frame) = output.next().await {
                match frame.map_err(daemon_err("suspend exec"))? {
                    bollard::container::LogOutput::StdOut { message } => {
                        if let Some(f) = out.as_mut() {
                            f.write_all(&message).await.map_err(io("suspend"))?;
                        }
                    }
                    bollard::container::LogOutput::StdErr { message } if said.len() < 64 << 10 => {
                        said.push_str(&String::from_utf8_lossy(&message));
                    }
                    _ => {}
                }
            }
            Ok::<_, Error>(said)
        };
        let (fed, said) = tokio::join!(feed, drain);
        let said = said?;
        fed.map_err(io("resume"))?;
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(daemon_err("suspend exec"))?
            .exit_code
            .unwrap_or(-1);
        Ok((code, said.trim().to_owned()))
    }

    /// The container's init as the host sees it, where the host can reach
    /// its files (runc); `None` under gVisor.
    async fn host_reach(&self, cm: &ContainerMeta) -> Result<Option<u32>> {
        if is_gvisor(cm.runtime.as_deref()) {
            return Ok(None);
        }
        let c = self
            .docker
            .inspect_container(&cm.container_id, None)
            .await
            .map_err(daemon_err("inspect container"))?;
        match c.state.and_then(|s| s.pid).filter(|p| *p > 0) {
            Some(pid) => Ok(u32::try_from(pid).ok()),
            None => Err(Error::SandboxDead {
                id: cm.container_id.clone(),
            }),
        }
    }

    /// The kept paths as archive tops (no leading `/`).
    fn tops(&self) -> Vec<String> {
        self.kept_paths()
            .iter()
            .map(|p| p.trim_start_matches('/').to_owned())
            .collect()
    }

    /// Archives the kept paths of the container into `<dir>/saved.tar`.
    async fn archive(&self, dir: &Path, cm: &ContainerMeta) -> Result<()> {
        const OP: &str = "suspend";
        let tmp = dir.join("saved.tar.tmp");
        let mut file = tokio::fs::File::create(&tmp).await.map_err(io(OP))?;
        let limit = self.opts.tmpfs_bytes.unwrap_or(256 << 20) * self.kept_paths().len() as u64;
        let ran = match self.host_reach(cm).await? {
            Some(pid) => {
                let tops = self.tops();
                let out = file.try_clone().await.map_err(io(OP))?.into_std().await;
                let walked = tokio::task::spawn_blocking(move || {
                    let root = rustix::fs::open(
                        format!("/proc/{pid}/root"),
                        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    )?;
                    let tops: Vec<&str> = tops.iter().map(String::as_str).collect();
                    let maps = namzu_agent::archive::Maps::default();
                    let out = std::io::BufWriter::new(out);
                    namzu_agent::archive::write(&root, &tops, &maps, out, limit).map(drop)
                })
                .await
                .map_err(|e| io(OP)(std::io::Error::other(e)))?;
                match walked {
                    Ok(()) => Ok((0, String::new())),
                    Err(e) if e.kind() == std::io::ErrorKind::StorageFull => Ok((ARCHIVE_TOO_BIG, String::new())),
                    Err(e) => Ok((-1, e.to_string())),
                }
            }
            None => {
                let mut args: Vec<String> = Vec::new();
                for p in self.kept_paths() {
                    args.extend(["--archive".to_owned(), p]);
                }
                args.extend(["--archive-limit".to_owned(), limit.to_string()]);
                self.agent_exec(&cm.container_id, args, None, Some(&mut file)).await
            }
        };
        let ran = match ran {
            Ok((0, _)) => file.sync_all().await.map_err(io(OP)),
            Ok((ARCHIVE_TOO_BIG, _)) => Err(Error::LimitExceeded {
                op: OP.into(),
                limit: "suspend_archive_bytes".into(),
                value: limit,
                path: None,
            }),
            Ok((code, said)) => Err(DockerError::Daemon {
                op: "archive the writable paths".into(),
                message: format!("exited with {code}: {said}"),
            }
            .into()),
            Err(e) => Err(e),
        };
        drop(file);
        match ran {
            Ok(()) => std::fs::rename(&tmp, dir.join(SAVED)).map_err(io(OP)),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Puts the archive back into the (started) container.
    async fn unarchive(&self, archive: &Path, cm: &ContainerMeta) -> Result<()> {
        const OP: &str = "resume";
        let put = match self.host_reach(cm).await? {
            Some(pid) => {
                let tops = self.tops();
                let archive = archive.to_path_buf();
                let unpacked = tokio::task::spawn_blocking(move || {
                    let tops: Vec<&str> = tops.iter().map(String::as_str).collect();
                    let file = std::fs::File::open(&archive)?;
                    namzu_agent::archive::unpack(file, Path::new(&format!("/proc/{pid}/root")), &tops)
                })
                .await
                .map_err(|e| io(OP)(std::io::Error::other(e)))?;
                match unpacked {
                    Ok(_) => (0, String::new()),
                    Err(e) => (-1, e.to_string()),
                }
            }
            None => {
                let bytes = tokio::fs::read(archive).await.map_err(io(OP))?;
                let mut args = Vec::new();
                for p in self.kept_paths() {
                    args.extend(["--unarchive".to_owned(), p]);
                }
                self.agent_exec(&cm.container_id, args, Some(bytes), None).await?
            }
        };
        match put {
            (0, _) => Ok(()),
            (code, said) => Err(DockerError::Daemon {
                op: "put back the writable paths".into(),
                message: format!("exited with {code}: {said}"),
            }
            .into()),
        }
    }

    /// [`Provider::suspend`] of the docker tier.
    pub(super) async fn suspend_sandbox(&self, id: &str) -> Result<()> {
        const OP: &str = "suspend";
        let (dir, meta) = self.state.read_meta(id)?;
        if meta.suspended_unix.is_some() {
            return Ok(());
        }
        let cm = meta.record::<ContainerMeta>().ok_or_else(|| Error::State {
            id: id.into(),
            message: "no container recorded".into(),
        })?;
        let client = self.agent_link(id).await?;
        client.pause().await?;
        if !self.kept_paths().is_empty() {
            if let Err(e) = self.archive(&dir, &cm).await {
                if let Err(r) = client.resume().await {
                    tracing::warn!(%id, "a failed suspend could not resume the sandbox: {r}");
                }
                return Err(e);
            }
        }
        client.close();
        crate::egress::supervisor::stop(&dir);
        self.back.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        self.docker
            .stop_container(
                &cm.container_id,
                Some(bollard::container::StopContainerOptions { t: STOP_GRACE_SECS }),
            )
            .await
            .map_err(daemon_err("stop container"))?;
        let ws = std::fs::File::open(dir.join("workspace")).map_err(io(OP))?;
        rustix::fs::syncfs(&ws).map_err(|e| io(OP)(e.into()))?;
        drop(ws);
        let suspended = Meta {
            suspended_unix: Some(now_unix()),
            ..meta
        };
        self.state.write_meta(&dir, &suspended)?;
        crate::backend::disk::unmount(&dir);
        Ok(())
    }

    /// [`Provider::resume`] of the docker tier.
    pub(super) async fn resume_sandbox(&self, id: &str) -> Result<Sandbox> {
        const OP: &str = "resume";
        let (dir, suspended) = self.state.read_meta(id)?;
        if suspended.suspended_unix.is_none() {
            return Err(Error::NotSuspended { id: id.into() });
        }
        let mut cm = suspended.record::<ContainerMeta>().ok_or_else(|| Error::State {
            id: id.into(),
            message: "no container recorded".into(),
        })?;
        let egress = crate::egress::supervisor::saved_config(&dir).map_err(io(OP))?;
        let started = async {
            crate::backend::disk::mount(&dir)?;
            self.prepare_run(&dir)?;
            self.docker
                .start_container::<String>(&cm.container_id, None)
                .await
                .map_err(daemon_err("start container"))?;
            let token = std::fs::read(dir.join("token")).map_err(io(OP))?;
            let client = self.wait_for_agent(id, &dir, &mut cm, &token).await?;
            let archive = dir.join(SAVED);
            if archive.exists() {
                self.unarchive(&archive, &cm).await?;
            }
            privilege_probe(id, &client).await?;
            self.state.supervisor(id, &dir, &self.agent_bin).start(&egress).await?;
            Ok::<_, Error>(client)
        }
        .await;
        let client = match started {
            Ok(c) => c,
            Err(e) => {
                // Back to suspended: the container stopped, archive and disk kept.
                crate::egress::supervisor::stop(&dir);
                let stop = bollard::container::StopContainerOptions { t: STOP_GRACE_SECS };
                if let Err(s) = self.docker.stop_container(&cm.container_id, Some(stop)).await {
                    tracing::warn!(%id, "could not stop the container of a failed resume: {s}");
                }
                crate::backend::disk::unmount(&dir);
                return Err(e);
            }
        };
        let resumed = Meta {
            suspended_unix: None,
            record: serde_json::to_value(&cm).unwrap_or_default(),
            ..suspended
        };
        self.state.write_meta(&dir, &resumed)?;
        if let Err(e) = std::fs::remove_file(dir.join(SAVED)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(%id, "could not remove the restored archive: {e}");
            }
        }
        Ok(self.sandbox(id, client))
    }
}
