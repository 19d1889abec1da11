//! The `host` tier: the agent runs as a plain child process of the host.
//!
//! **This isolates nothing.** Commands run as the calling user with the
//! host's filesystem, network and processes in view. Only file operations
//! are confined (to the sandbox's workspace directory, by the agent's path
//! jail). It exists to develop and test the spine; use `local` or stronger
//! for anything untrusted.
//!
//! State lives under `<state>/host/<id>/` (see `backend::state`); the
//! workspace is the agent's jail root and default working directory.

use std::path::PathBuf;

use async_trait::async_trait;

use crate::backend::detached::Disarm;
use crate::backend::state::{now_unix, spawn_anchor, wait_for_agent, Meta, StateDir, StateSandbox, Unanswered};
use crate::backend::{check_spec, find_agent_binary, refuse_unsupported};
use crate::client::ClientOptions;
use crate::error::Result;
use crate::handle::Sandbox;
use crate::provider::Provider;
use crate::spec::{SandboxInfo, SandboxSpec, Tier};

/// Makes `host`-tier sandboxes. See the module docs: no isolation.
#[derive(Debug, Clone)]
pub struct HostProvider {
    state: StateDir,
    agent_bin: PathBuf,
    client: ClientOptions,
}

impl HostProvider {
    /// Uses `state_dir` (its `host/` subdirectory) and finds the agent with
    /// [`find_agent_binary`].
    pub fn new(state_dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self::with_agent(state_dir, find_agent_binary()?))
    }

    /// A provider using this agent binary.
    pub fn with_agent(state_dir: impl Into<PathBuf>, agent_bin: impl Into<PathBuf>) -> Self {
        Self {
            state: StateDir::new(state_dir, Tier::Host),
            agent_bin: agent_bin.into(),
            client: ClientOptions::default(),
        }
    }
}

impl HostProvider {
    /// Creates a sandbox whose agent takes `token` as its bind token (a
    /// fresh random one if `None`): how a caller that names the token
    /// elsewhere, like the Kubernetes control-plane simulator's pods (whose
    /// token is their uid), starts one.
    pub async fn create_with_token(&self, spec: SandboxSpec, token: Option<Vec<u8>>) -> Result<Sandbox> {
        // Dropped half way, a create leaves nothing (see `detached`).
        let this = self.clone();
        crate::backend::detached::finish(async move { this.create_owned(spec, token).await }).await
    }

    /// The create itself: the sandbox, and what kills its agent if it is
    /// never handed out.
    async fn create_owned(&self, spec: SandboxSpec, token: Option<Vec<u8>>) -> Result<(Sandbox, Unanswered)> {
        refusals(&spec)?;
        check_spec(Tier::Host, &spec)?;
        let (id, dir, _token, made) = self.state.create(token)?;
        let workspace = dir.join("workspace");
        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        cmd.arg("--listen")
            .arg(format!("unix:{}", dir.join("agent.sock").display()))
            .arg("--token-file")
            .arg(dir.join("token"))
            .arg("--root")
            .arg(&workspace)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", &workspace)
            .env("LANG", "C.UTF-8")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(
                spec.limits
                    .iter()
                    .map(|(k, v)| (namzu_proto::limits::env_var(k), v.to_string())),
            );
        let mut child = spawn_anchor(cmd, &dir, &id, &self.agent_bin)?;
        let unanswered = Unanswered::new(&child, true);
        let mut meta = Meta {
            id: id.clone(),
            tier: Tier::Host,
            pid: child.id().unwrap_or(0),
            created_unix: now_unix(),
            agent_bin: self.agent_bin.clone(),
            record: serde_json::Value::Null,
            procs: Vec::new(),
            suspended_unix: None,
        };
        self.state.write_meta(&dir, &meta)?;
        let client = match wait_for_agent(&self.state, &dir, &id, &mut child, &self.client).await {
            Ok(client) => client,
            Err(e) => {
                // It may have reaped the agent: its pid is no longer ours.
                unanswered.disarm();
                return Err(e);
            }
        };
        self.state.record_processes(&dir, &mut meta)?;
        made.keep();
        let anchor = meta.procs.first().copied();
        tracing::warn!(%id, "host-tier sandbox created: NOTHING is isolated");
        let sandbox = Sandbox::new(StateSandbox {
            id,
            tier: Tier::Host,
            provider: std::sync::Arc::new(self.clone()),
            client,
            _child: Some(child),
            anchor,
            egress: None,
            whole: None,
        });
        Ok((sandbox, unanswered))
    }
}

#[async_trait]
impl Provider for HostProvider {
    fn tier(&self) -> Tier {
        Tier::Host
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        self.create_with_token(spec, None).await
    }

    async fn connect(&self, id: &str) -> Result<Sandbox> {
        let (meta, client) = self.state.reattach(id, &self.client).await?;
        Ok(Sandbox::new(StateSandbox {
            id: id.into(),
            tier: Tier::Host,
            provider: std::sync::Arc::new(self.clone()),
            client,
            _child: None,
            anchor: meta.procs.first().copied(),
            egress: None,
            whole: None,
        }))
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        self.state.list()
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        self.state
            .stop(id, crate::backend::state::Stop::Graceful)
            .await
            .map(drop)
    }
}

/// What the host tier cannot honour: it runs commands as plain host
/// processes, on the host's own filesystem and network.
pub(crate) fn refusals(spec: &SandboxSpec) -> Result<()> {
    let plain = "the host tier runs commands as plain host processes and limits nothing";
    refuse_unsupported(
        Tier::Host,
        &[
            (
                spec.egress != crate::egress::EgressConfig::default(),
                "egress",
                "this tier shares the host's network; it has no egress boundary",
            ),
            (
                !spec.binds.is_empty(),
                "binds",
                "the host tier has no filesystem of its own to bind into",
            ),
            (
                spec.image.is_some(),
                "image",
                "the host tier runs commands on the host's own filesystem",
            ),
            (spec.resources.memory_bytes.is_some(), "resources.memory_bytes", plain),
            (spec.resources.cpus.is_some(), "resources.cpus", plain),
            (spec.resources.pids.is_some(), "resources.pids", plain),
            (spec.resources.disk_bytes.is_some(), "resources.disk_bytes", plain),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::spec::Resources;

    #[test]
    fn host_tier_refuses_resource_limits_by_name() {
        let spec = SandboxSpec {
            resources: Resources {
                pids: Some(10),
                ..Default::default()
            },
            ..Default::default()
        };
        match refusals(&spec) {
            Err(Error::OptionRefused { option, tier, .. }) => {
                assert_eq!(option, "resources.pids");
                assert_eq!(tier, Tier::Host);
            }
            other => panic!("{other:?}"),
        }
        assert!(namzu_core::check::check_spec(Tier::Local, &spec).is_ok());
        let disk = SandboxSpec {
            resources: Resources {
                disk_bytes: Some(64 << 20),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(
            matches!(refusals(&disk), Err(Error::OptionRefused { option, .. }) if option == "resources.disk_bytes"),
            "a disk limit the host tier cannot keep"
        );
    }

    #[tokio::test]
    async fn host_tier_refuses_suspend_resume_and_snapshots_by_name() {
        let p = HostProvider::with_agent(std::env::temp_dir().join("namzu-host-suspend"), "/nonexistent");
        for (op, got) in [
            ("suspend", p.suspend("sb-000000000001").await.err()),
            ("resume", p.resume("sb-000000000001").await.err()),
            ("snapshot", p.snapshot("sb-000000000001").await.err()),
            ("fork", p.fork("snap-000000000001").await.err()),
            ("delete_snapshot", p.delete_snapshot("snap-000000000001").await.err()),
        ] {
            assert!(
                matches!(&got, Some(Error::OptionRefused { option, tier: Tier::Host, .. }) if option == op),
                "{op}: {got:?}"
            );
        }
    }
}
