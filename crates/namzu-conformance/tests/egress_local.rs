//! Egress on the `local` tier, on a real network (`namzu_conformance::netlab`:
//! a network namespace, veth, real HTTP, stream and TLS servers). Every
//! refusal is shown next to a positive control through the same path, so a
//! "blocked" result cannot come from a network that was never there.
//!
//! Needs root, iproute2, curl and openssl (`scripts/net-up.sh`); without
//! them every test is reported ignored, unless `NAMZU_REQUIRE_NET=1` makes
//! that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::local::LocalProvider;
use namzu::egress::{EgressConfig, EgressPolicy, HostPattern, HostRule, PolicyError};
use namzu::{Error, ExecRequest, Provider, Sandbox, SandboxSpec};
use namzu_conformance::netlab::{NetLab, PRIVATE, PUB1, PUB2, STREAM_PORT};

fn state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("namzu-egress-local-{}", std::process::id()))
}

fn provider() -> &'static LocalProvider {
    static P: OnceLock<LocalProvider> = OnceLock::new();
    P.get_or_init(|| LocalProvider::new(state_dir()).expect("agent binary"))
}

fn allow(entries: &[&str]) -> EgressPolicy {
    EgressPolicy::Allowlist {
        hosts: entries.iter().map(|e| HostRule::parse(e, None).unwrap()).collect(),
    }
}

async fn sandbox(policy: EgressPolicy, cert: &[u8]) -> Box<dyn Sandbox> {
    let sb = provider()
        .create(SandboxSpec {
            egress: EgressConfig {
                policy,
                hosts: NetLab::hosts(),
            },
            ..Default::default()
        })
        .await
        .unwrap();
    sb.write_file(Path::new("/workspace/ca.pem"), cert.to_vec().into(), Default::default())
        .await
        .unwrap();
    sb
}

/// (exit code, stdout, stderr) of a shell script.
async fn sh(sb: &dyn Sandbox, script: &str) -> (i32, String, String) {
    let o = sb.exec(ExecRequest::shell(script)).await.unwrap();
    (
        o.status.code.unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// What curl got: "<http code> <proxy CONNECT code>" and the body.
async fn curl(sb: &dyn Sandbox, args: &str) -> (String, String) {
    let (_, out, _) = sh(
        sb,
        &format!("curl -s -m 10 --cacert /workspace/ca.pem -w '\\n%{{http_code}} %{{http_connect}}' {args}"),
    )
    .await;
    let (body, codes) = out.rsplit_once('\n').unwrap_or(("", &out));
    (codes.to_owned(), body.to_owned())
}

fn check(what: &str, ok: bool, detail: impl std::fmt::Debug) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: {detail:?}"))
    }
}

async fn allowlist_admits_its_names_and_refuses_the_rest(cert: Vec<u8>) -> Result<(), String> {
    let sb = sandbox(allow(&[".allowed.test"]), &cert).await;
    // Positive controls first: the same proxy path reaches the lab.
    let (codes, body) = curl(sb.as_ref(), "http://allowed.test/").await;
    check(
        "allowed name",
        codes.starts_with("200") && body.trim() == format!("served by {PUB1}:80"),
        (&codes, &body),
    )?;
    let (codes, body) = curl(sb.as_ref(), "http://api.allowed.test/").await;
    check(
        "subdomain of .allowed.test",
        codes.starts_with("200") && body.contains(PUB2),
        (&codes, &body),
    )?;
    let (codes, body) = curl(sb.as_ref(), "https://tls.allowed.test/").await;
    check(
        "TLS through CONNECT, name verified",
        codes == "200 200" && body.contains("s_server"),
        (&codes, body.len()),
    )?;
    let (codes, body) = curl(sb.as_ref(), "--proxy socks5h://127.0.0.1:1080 http://allowed.test/").await;
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
        let (codes, body) = curl(sb.as_ref(), url).await;
        check(
            url,
            codes.starts_with("403") && body.contains("refused"),
            (&codes, &body),
        )?;
    }
    let (codes, _) = curl(sb.as_ref(), "https://other.test/").await;
    check("CONNECT to other.test", codes == "000 403", &codes)?;
    // A permitted name that resolves inside: DNS rebinding.
    let (codes, body) = curl(sb.as_ref(), "http://internal.allowed.test/").await;
    check(
        "name resolving to a private address",
        codes.starts_with("403") && body.contains(PRIVATE),
        (&codes, &body),
    )?;
    let (code, out, err) = sh(
        sb.as_ref(),
        "curl -s -m 10 --proxy socks5h://127.0.0.1:1080 http://other.test/",
    )
    .await;
    check("SOCKS5 refusal", code != 0 && out.is_empty(), (code, &out, &err))?;
    // Every decision is in the supervisor's log, with the sandbox's id.
    let log = std::fs::read_to_string(state_dir().join("local").join(sb.id()).join("egress.log")).unwrap_or_default();
    check(
        "decision log",
        log.lines()
            .any(|l| l.contains(sb.id()) && l.contains("other.test") && l.contains("refused"))
            && log.lines().any(|l| l.contains("allowed.test") && l.contains("allowed")),
        &log,
    )?;
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn ports_narrow_an_allowlisted_host(cert: Vec<u8>) -> Result<(), String> {
    let policy = EgressPolicy::Allowlist {
        hosts: vec![HostRule::parse("allowed.test", Some(vec![80])).unwrap()],
    };
    let sb = sandbox(policy, &cert).await;
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test/").await;
    check("port 80", codes.starts_with("200"), &codes)?;
    let (codes, body) = curl(sb.as_ref(), "http://allowed.test:8080/").await;
    check(
        "port 8080",
        codes.starts_with("403") && body.contains("8080"),
        (&codes, &body),
    )?;
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn public_internet_never_reaches_inside(cert: Vec<u8>) -> Result<(), String> {
    let sb = sandbox(
        EgressPolicy::PublicInternet {
            except_cidrs: namzu::egress::policy::parse_cidrs(&[format!("{PUB2}/32")]).unwrap(),
        },
        &cert,
    )
    .await;
    let (codes, body) = curl(sb.as_ref(), &format!("http://{PUB1}/")).await;
    check(
        "public IP literal",
        codes.starts_with("200") && body.contains(PUB1),
        (&codes, &body),
    )?;
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test:8080/").await;
    check("public name", codes.starts_with("200"), &codes)?;
    for url in [
        "http://internal.allowed.test/",
        &format!("http://{PRIVATE}/"),
        "http://api.allowed.test/",
    ] {
        let (codes, body) = curl(sb.as_ref(), url).await;
        check(url, codes.starts_with("403"), (&codes, &body))?;
    }
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn traffic_that_ignores_the_proxy_has_no_route(cert: Vec<u8>) -> Result<(), String> {
    let sb = sandbox(EgressPolicy::AllowAll, &cert).await;
    let (codes, _) = curl(sb.as_ref(), &format!("http://{PUB1}/")).await;
    check("through the proxy", codes.starts_with("200"), &codes)?;
    let (code, out, err) = sh(sb.as_ref(), &format!("curl -sS -m 5 --noproxy '*' http://{PUB1}/")).await;
    // 7: could not connect (no route), not a timeout and not a response.
    check("raw TCP", code == 7 && out.is_empty(), (code, &out, &err))?;
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn no_network_resolves_nothing_and_deny_all_only_resolves(cert: Vec<u8>) -> Result<(), String> {
    let sb = sandbox(EgressPolicy::NoNetwork, &cert).await;
    let (code, out, _) = sh(sb.as_ref(), "getent hosts allowed.test").await;
    check("no-network resolves nothing", code == 2 && out.is_empty(), (code, &out))?;
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test/").await;
    check("no-network connects nowhere", codes.starts_with("403"), &codes)?;
    sb.destroy().await.map_err(|e| e.to_string())?;

    let sb = sandbox(EgressPolicy::DenyAll, &cert).await;
    let (code, out, _) = sh(sb.as_ref(), "getent hosts allowed.test").await;
    check("deny-all resolves", code == 0 && out.starts_with(PUB1), (code, &out))?;
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test/").await;
    check("deny-all connects nowhere", codes.starts_with("403"), &codes)?;
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn a_live_change_applies_at_once_and_closes_refused_connections(cert: Vec<u8>) -> Result<(), String> {
    let sb: Arc<dyn Sandbox> = Arc::from(sandbox(allow(&[".allowed.test"]), &cert).await);
    let (codes, _) = curl(sb.as_ref(), "http://other.test/").await;
    check("other.test before", codes.starts_with("403"), &codes)?;
    // A connection that stays open: a tick every 100 ms, for up to 60 s.
    let streaming = {
        let sb = sb.clone();
        tokio::spawn(async move {
            sh(
                sb.as_ref(),
                &format!("curl -sN -m 60 http://allowed.test:{STREAM_PORT}/; echo rc=$?"),
            )
            .await
        })
    };
    let mut open = 0;
    for _ in 0..100 {
        open = sb.network_policy().await.map_err(|e| e.to_string())?.1;
        if open > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check("the stream is open", open == 1, open)?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sb.set_network_policy(allow(&["other.test"]))
        .await
        .map_err(|e| e.to_string())?;
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
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test/").await;
    check("allowed.test after", codes.starts_with("403"), &codes)?;
    let (codes, body) = curl(sb.as_ref(), "http://other.test/").await;
    check(
        "other.test after",
        codes.starts_with("200") && body.contains(PUB2),
        (&codes, &body),
    )?;
    let (config, open) = sb.network_policy().await.map_err(|e| e.to_string())?;
    check(
        "policy shown",
        config.policy == allow(&["other.test"]) && open == 0,
        (&config.policy, open),
    )?;
    sb.destroy().await.map_err(|e| e.to_string())
}

async fn bad_policies_are_refused_by_name(cert: Vec<u8>) -> Result<(), String> {
    let forged = EgressPolicy::Allowlist {
        hosts: vec![HostRule {
            host: HostPattern::Domain("com".into()),
            ports: None,
        }],
    };
    let err = provider()
        .create(SandboxSpec {
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
    let sb = sandbox(allow(&["allowed.test"]), &cert).await;
    let err = sb.set_network_policy(forged).await.err();
    check(
        "set_network_policy",
        matches!(&err, Some(Error::EgressPolicy(PolicyError::PublicSuffix { .. }))),
        &err,
    )?;
    // The old policy still holds.
    let (codes, _) = curl(sb.as_ref(), "http://allowed.test/").await;
    check("old policy kept", codes.starts_with("200"), &codes)?;
    sb.destroy().await.map_err(|e| e.to_string())
}

type Body = fn(Vec<u8>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let lab = NetLab::start();
    if let Err(why) = &lab {
        if std::env::var_os("NAMZU_REQUIRE_NET").is_some() {
            eprintln!("egress_local: {why}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let cert = lab.as_ref().map(|l| l.tls_cert.clone()).unwrap_or_default();
    let tests: Vec<(&str, Body)> = vec![
        ("allowlist_admits_its_names_and_refuses_the_rest", |c| {
            Box::pin(allowlist_admits_its_names_and_refuses_the_rest(c))
        }),
        ("ports_narrow_an_allowlisted_host", |c| {
            Box::pin(ports_narrow_an_allowlisted_host(c))
        }),
        ("public_internet_never_reaches_inside", |c| {
            Box::pin(public_internet_never_reaches_inside(c))
        }),
        ("traffic_that_ignores_the_proxy_has_no_route", |c| {
            Box::pin(traffic_that_ignores_the_proxy_has_no_route(c))
        }),
        ("no_network_resolves_nothing_and_deny_all_only_resolves", |c| {
            Box::pin(no_network_resolves_nothing_and_deny_all_only_resolves(c))
        }),
        ("a_live_change_applies_at_once_and_closes_refused_connections", |c| {
            Box::pin(a_live_change_applies_at_once_and_closes_refused_connections(c))
        }),
        ("bad_policies_are_refused_by_name", |c| {
            Box::pin(bad_policies_are_refused_by_name(c))
        }),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, body)| {
            let cert = cert.clone();
            let t = Trial::test(name, move || {
                let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(body(cert)).map_err(Failed::from)
            });
            match &lab {
                Err(why) => t.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
                Ok(_) => t,
            }
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    drop(lab);
    let _ = std::fs::remove_dir_all(state_dir());
    conclusion.exit_code()
}
