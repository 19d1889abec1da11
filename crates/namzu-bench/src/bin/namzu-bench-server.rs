//! The HTTP API under load, next to the library, in one run (bench/server.sh):
//! N sandboxes × M commands (`true`), all sandboxes at once, on the local
//! tier — once through a live `namzu serve` (HTTP/1.1, keep-alive, one
//! connection per sandbox task), once through the library in this process.
//! Prints failures, p50 and p99 of a command's round trip for both, the
//! API's added latency, and the server's resident memory with N idle
//! sandboxes. Figures are printed, never asserted.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use namzu::backend::local::LocalProvider;
use namzu::{ExecRequest, Provider, SandboxSpec};
use tokio::io::{AsyncBufReadExt, BufReader};

type Http = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;
type AnyErr = Box<dyn std::error::Error + Send + Sync>;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

async fn call(http: &Http, method: &str, url: &str, body: &str) -> Result<(u16, Bytes), AnyErr> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let resp = http.request(req).await?;
    let status = resp.status().as_u16();
    Ok((status, resp.into_body().collect().await?.to_bytes()))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

struct Run {
    failures: usize,
    rtts: Vec<Duration>,
    wall: Duration,
}

async fn through_api(url: &str, n: usize, m: usize) -> Result<(Run, Vec<String>), AnyErr> {
    let http: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(n * 2)
        .build_http();
    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (http, url) = (http.clone(), url.to_string());
        creates.spawn(async move { call(&http, "POST", &format!("{url}/v1/sandboxes"), "{\"timeout_s\":3600}").await });
    }
    let mut ids = Vec::new();
    let mut failures = 0;
    while let Some(r) = creates.join_next().await {
        match r? {
            Ok((201, body)) => {
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                ids.push(v["id"].as_str().unwrap_or_default().to_string());
            }
            other => {
                failures += 1;
                eprintln!("create failed: {other:?}");
            }
        }
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids.clone() {
        let (http, url) = (http.clone(), url.to_string());
        tasks.spawn(async move {
            let mut rtts = Vec::with_capacity(m);
            let mut failed = 0;
            let target = format!("{url}/v1/sandboxes/{id}/commands/run");
            for _ in 0..m {
                let t = Instant::now();
                match call(&http, "POST", &target, "{\"argv\":[\"true\"]}").await {
                    Ok((200, body)) if body.windows(9).any(|w| w == b"\"code\":0,") => rtts.push(t.elapsed()),
                    other => {
                        failed += 1;
                        eprintln!("command failed: {other:?}");
                    }
                }
            }
            (rtts, failed)
        });
    }
    let mut rtts = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (r, f) = r?;
        rtts.extend(r);
        failures += f;
    }
    Ok((
        Run {
            failures,
            rtts,
            wall: started.elapsed(),
        },
        ids,
    ))
}

async fn through_library(state: &std::path::Path, n: usize, m: usize) -> Result<Run, AnyErr> {
    let provider = Arc::new(LocalProvider::new(state)?);
    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..n {
        let p = provider.clone();
        creates.spawn(async move { p.create(SandboxSpec::default()).await });
    }
    let mut sbs = Vec::new();
    let mut failures = 0;
    while let Some(r) = creates.join_next().await {
        match r? {
            Ok(sb) => sbs.push(sb),
            Err(e) => {
                failures += 1;
                eprintln!("library create failed: {e}");
            }
        }
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for sb in sbs.clone() {
        tasks.spawn(async move {
            let mut rtts = Vec::with_capacity(m);
            let mut failed = 0;
            for _ in 0..m {
                let t = Instant::now();
                match sb.commands().run(ExecRequest::new("true")).await {
                    Ok(o) if o.status.success() => rtts.push(t.elapsed()),
                    _ => failed += 1,
                }
            }
            (rtts, failed)
        });
    }
    let mut rtts = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (r, f) = r?;
        rtts.extend(r);
        failures += f;
    }
    let wall = started.elapsed();
    for sb in sbs {
        let _ = sb.destroy().await;
    }
    Ok(Run { failures, rtts, wall })
}

#[tokio::main]
async fn main() -> Result<(), AnyErr> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let m: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20);
    let exe = std::env::current_exe()?;
    let namzu = exe.with_file_name("namzu");
    let state = tempfile::tempdir()?;

    let mut server = tokio::process::Command::new(&namzu)
        .args(["serve", "--listen", "127.0.0.1:0", "--tiers", "local"])
        .args(["--max-sandboxes-per-key", &(n + 10).to_string()])
        .args(["--max-streams-per-key", &(n * 2).to_string()])
        .env("NAMZU_STATE_DIR", state.path().join("api"))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = server.id().unwrap_or(0);
    let mut out = BufReader::new(server.stdout.take().ok_or("no stdout")?).lines();
    let line = out.next_line().await?.ok_or("namzu serve did not start")?;
    let url = line.rsplit(' ').next().unwrap_or_default().to_string();
    let rss_empty = rss_kib(pid);

    let (mut api, ids) = through_api(&url, n, m).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = rss_kib(pid);
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    for id in &ids {
        let _ = call(&http, "DELETE", &format!("{url}/v1/sandboxes/{id}"), "").await;
    }
    // Unloaded: one sandbox, commands one after another.
    let (mut api1, ids1) = through_api(&url, 1, 200).await?;
    for id in &ids1 {
        let _ = call(&http, "DELETE", &format!("{url}/v1/sandboxes/{id}"), "").await;
    }
    let _ = server.kill().await;

    let mut lib = through_library(&state.path().join("lib"), n, m).await?;
    let mut lib1 = through_library(&state.path().join("lib1"), 1, 200).await?;

    println!("## HTTP API vs library: {n} local sandboxes × {m} commands (`true`), all sandboxes at once");
    println!();
    println!("| through | commands | failures | p50 round trip | p99 round trip | wall |");
    println!("|---|---|---|---|---|---|");
    let (a50, a99) = (pct(&mut api.rtts, 0.5), pct(&mut api.rtts, 0.99));
    let (l50, l99) = (pct(&mut lib.rtts, 0.5), pct(&mut lib.rtts, 0.99));
    println!(
        "| `namzu serve` (HTTP/1.1, POST …/commands/run) | {} | {} | {} | {} | {:.2} s |",
        api.rtts.len(),
        api.failures,
        ms(a50),
        ms(a99),
        api.wall.as_secs_f64()
    );
    println!(
        "| library (`commands().run`) | {} | {} | {} | {} | {:.2} s |",
        lib.rtts.len(),
        lib.failures,
        ms(l50),
        ms(l99),
        lib.wall.as_secs_f64()
    );
    println!();
    println!(
        "API's added latency per command: p50 {}, p99 {}",
        ms(a50.saturating_sub(l50)),
        ms(a99.saturating_sub(l99))
    );
    let (u50, l1) = (pct(&mut api1.rtts, 0.5), pct(&mut lib1.rtts, 0.5));
    println!(
        "unloaded (1 sandbox, 200 commands in a row): p50 {} through the API, {} through the library: {} added",
        ms(u50),
        ms(l1),
        ms(u50.saturating_sub(l1))
    );
    println!(
        "server RSS: {:.1} MiB with no sandbox, {:.1} MiB with {n} idle sandboxes",
        rss_empty as f64 / 1024.0,
        rss_idle as f64 / 1024.0
    );
    let failures = api.failures + lib.failures + api1.failures + lib1.failures;
    if failures > 0 {
        return Err(format!("{failures} failures").into());
    }
    Ok(())
}
