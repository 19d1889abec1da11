//! What the egress cases share: the environment they run against, sandboxes
//! made with a policy, and the shell and curl they drive inside.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use namzu::egress::{EgressConfig, EgressPolicy, HostRule};
use namzu::{Sandbox, SandboxSpec};

use crate::netlab::NetLab;
use crate::util::Ctx;
use crate::Factory;

/// What the cases run against.
#[derive(Clone)]
pub struct Env {
    pub factory: Factory,
    /// The lab's TLS certificate, trusted by curl inside.
    pub cert: Vec<u8>,
    /// Where a sandbox's egress decisions are logged, by id (its state
    /// directory holds the supervisor's pid file too).
    pub log_of: Arc<dyn Fn(&str) -> PathBuf + Send + Sync>,
    /// The provider's `connect`, by id.
    pub connect: Connect,
    /// The running lab.
    pub lab: crate::netlab::LabHandle,
    /// Whether the host must be handed allowed connections' client
    /// sockets: the agent's link is a unix socket of the host's kernel.
    pub handoff: bool,
}

/// A provider's `connect`, by id.
pub type Connect = Arc<dyn Fn(String) -> crate::BoxFut<namzu::Result<Sandbox>> + Send + Sync>;

pub fn allow(entries: &[&str]) -> EgressPolicy {
    EgressPolicy::Allowlist {
        hosts: entries.iter().map(|e| HostRule::parse(e, None).unwrap()).collect(),
    }
}

pub(super) async fn sandbox(env: &Env, policy: EgressPolicy) -> Result<Sandbox, String> {
    sandbox_with(env, policy, Vec::new()).await
}

pub(super) async fn sandbox_with(
    env: &Env,
    policy: EgressPolicy,
    reach_link_local: Vec<ipnet::IpNet>,
) -> Result<Sandbox, String> {
    sandbox_of(
        env,
        EgressConfig {
            policy,
            reach_link_local,
            ..Default::default()
        },
    )
    .await
}

/// A sandbox with `config`, the lab's names added to its hosts.
pub(super) async fn sandbox_of(env: &Env, mut config: EgressConfig) -> Result<Sandbox, String> {
    config.hosts.extend(NetLab::hosts());
    let sb = (env.factory)(SandboxSpec {
        egress: config,
        ..Default::default()
    })
    .await
    .ctx("create")?;
    sb.files()
        .write(Path::new("/workspace/ca.pem"), env.cert.clone())
        .await
        .map_err(|e| format!("write ca.pem: {e}"))?;
    Ok(sb)
}

/// (exit code, stdout, stderr) of a shell script.
pub async fn sh(sb: &Sandbox, script: &str) -> (i32, String, String) {
    let o = sb.commands().run(script).await.unwrap();
    (
        o.status.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// [`sh`] on a task of its own, for a command that runs while the case
/// goes on (a stream, a flood).
pub fn in_background(sb: &Sandbox, script: String) -> tokio::task::JoinHandle<(i32, String, String)> {
    let sb = sb.clone();
    tokio::spawn(async move { sh(&sb, &script).await })
}

/// What curl got: "<http code> <proxy CONNECT code>" and the body.
pub async fn curl(sb: &Sandbox, args: &str) -> (String, String) {
    let (_, out, _) = sh(
        sb,
        &format!("curl -s -m 10 --cacert /workspace/ca.pem -w '\\n%{{http_code}} %{{http_connect}}' {args}"),
    )
    .await;
    let (body, codes) = out.rsplit_once('\n').unwrap_or(("", &out));
    (codes.to_owned(), body.to_owned())
}

pub(super) fn check(what: &str, ok: bool, detail: impl std::fmt::Debug) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: {detail:?}"))
    }
}
