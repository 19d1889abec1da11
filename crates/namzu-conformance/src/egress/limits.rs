//! The agent's own egress bounds, each set low on one sandbox and hit:
//! `egress_max_head_bytes` (the proxy's request head), and, with the host's
//! supervisor stopped so that no decision comes, `egress_decision_timeout_ms`
//! and `egress_max_pending`. Also the proxy environment every command gets.

use std::time::{Duration, Instant};

use namzu::egress::EgressConfig;
use namzu::{Sandbox, SandboxSpec};

use super::common::{allow, check, curl, sh, Env};
use crate::netlab::NetLab;
use crate::util::Ctx;
use crate::Outcome;

/// The supervisor's pid, from the sandbox's state directory.
pub(super) fn supervisor_pid(env: &Env, id: &str) -> Result<nix::unistd::Pid, String> {
    let log = (env.log_of)(id);
    let dir = log.parent().ok_or("no state directory")?;
    let pid: i32 = std::fs::read_to_string(dir.join("egress.pid"))
        .map_err(|e| e.to_string())?
        .trim()
        .parse()
        .map_err(|e| format!("pid: {e}"))?;
    Ok(nix::unistd::Pid::from_raw(pid))
}

/// Continues a stopped supervisor on every way out.
struct Stopped(nix::unistd::Pid);
impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

pub async fn the_agents_egress_limits_hold(env: &Env) -> Outcome {
    let mut config = EgressConfig {
        policy: allow(&[".allowed.test"]),
        ..Default::default()
    };
    config.hosts.extend(NetLab::hosts());
    let sb = (env.factory)(SandboxSpec {
        egress: config,
        limits: vec![
            ("egress_max_head_bytes".into(), 2048),
            ("egress_decision_timeout_ms".into(), 700),
            ("egress_max_pending".into(), 2),
        ],
        ..Default::default()
    })
    .await
    .ctx("create")?;
    let r = limits_hold(env, &sb).await;
    sb.destroy().await.ctx("destroy")?;
    r
}

async fn limits_hold(env: &Env, sb: &Sandbox) -> Outcome {
    let (codes, _) = curl(sb, "http://allowed.test/").await;
    check("control", codes.starts_with("200"), &codes)?;
    let big = "x".repeat(3000);
    let (codes, _) = curl(sb, &format!("-H 'X-Big: {big}' http://allowed.test/")).await;
    check("a head over egress_max_head_bytes", codes.starts_with("431"), &codes)?;
    let (codes, _) = curl(sb, &format!("-H 'X-Small: {}' http://allowed.test/", &big[..1000])).await;
    check("a head under it", codes.starts_with("200"), &codes)?;
    // Small, but more header fields than the parser takes (100).
    let many: String = (0..101).map(|i| format!("-H 'X-{i}: 1' ")).collect();
    let (codes, _) = curl(sb, &format!("{many}http://allowed.test/")).await;
    check("a head of 101 fields", codes.starts_with("431"), &codes)?;

    let pid = supervisor_pid(env, sb.id())?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).map_err(|e| e.to_string())?;
    let stopped = Stopped(pid);
    let t0 = Instant::now();
    let (codes, body) = curl(sb, "http://allowed.test/").await;
    let took = t0.elapsed();
    check(
        "no decision within egress_decision_timeout_ms",
        codes.starts_with("502") && body.contains("egress_decision_timeout_ms") && took < Duration::from_secs(8),
        (&codes, &body, took),
    )?;
    let (_, out, _) = sh(
        sb,
        "for i in 1 2 3 4 5 6; do curl -s -m 10 http://allowed.test/ > /tmp/p$i 2>&1 & done; wait; cat /tmp/p*",
    )
    .await;
    let over = out.lines().filter(|l| l.contains("egress_max_pending")).count();
    let timed_out = out.lines().filter(|l| l.contains("egress_decision_timeout_ms")).count();
    check(
        "past egress_max_pending refused at once, the rest timed out",
        over >= 1 && timed_out >= 1 && over + timed_out == 6,
        &out,
    )?;
    drop(stopped);
    let (codes, _) = curl(sb, "http://allowed.test/").await;
    check("after the supervisor continues", codes.starts_with("200"), &codes)?;
    Ok(())
}

pub async fn commands_get_the_proxy_environment(env: &Env) -> Outcome {
    let sb = super::common::sandbox(env, allow(&["allowed.test"])).await?;
    let (_, out, _) = sh(&sb, "env | grep -i '_proxy=' | sort").await;
    let got: Vec<&str> = out.lines().collect();
    let want = [
        "ALL_PROXY=socks5h://127.0.0.1:1080",
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "all_proxy=socks5h://127.0.0.1:1080",
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
    ];
    check("the proxy environment", got == want, &got)?;
    sb.destroy().await.ctx("destroy")
}
