//! Measures namzu next to what a user would do without it, on this machine,
//! in one run, and prints tables of ratios. Never part of the tests: these
//! machines are shared and noisy, so figures are reported, not asserted.
//!
//! Host tier (the spine):
//! * exec round trip of `true` on a live sandbox vs fork+exec of `true`;
//! * 1 GiB written into a sandbox (atomic, fsynced) vs the same bytes over a
//!   raw unix socket into a file, fsynced;
//! * 1 GiB streamed out of a sandbox vs a file sent over a raw unix socket;
//! * the agent's idle resident memory.
//!
//! Warm pool: claim to first exec; 1,000 sequential and 100 concurrent
//! create + exec + destroy with and without it.
//!
//! Local tier (namespaces):
//! * create + first `exec true` vs `bwrap … true` and `unshare … true`;
//! * exec round trip of `true` vs fork+exec on the host;
//! * host memory (PSS) of 100 idle sandboxes;
//! * pause + resume of a sandbox running 22 processes vs SIGSTOP, wait
//!   and SIGCONT of the same processes from the host.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use namzu::backend::host::HostProvider;
use namzu::backend::local::LocalProvider;
use namzu::{ExecRequest, Provider, Sandbox, SandboxSpec, WriteOptions};
use tokio::io::AsyncReadExt;

mod cold;
mod first;
mod pause;
mod pool;
mod raw;
mod stages;
use raw::raw_socket_write;

const GIB: u64 = 1 << 30;

/// The middle value (the upper one of an even count); `v` is not empty.
fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

fn fmt_dur(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn rate(d: Duration) -> String {
    format!("{:.0} MiB/s", (GIB as f64 / (1 << 20) as f64) / d.as_secs_f64())
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}

/// A raw copy of `len` zero bytes over a unix socket into `dst`, fsynced.
/// A raw send of `src` over a unix socket, read and discarded.
fn raw_socket_read(src: &Path) -> std::io::Result<Duration> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let src = src.to_path_buf();
    let t0 = Instant::now();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let mut f = std::fs::File::open(src)?;
        std::io::copy(&mut f, &mut a)?;
        Ok(())
    });
    std::io::copy(&mut b, &mut std::io::sink())?;
    sender.join().map_err(|_| std::io::Error::other("sender panicked"))??;
    Ok(t0.elapsed())
}

/// Median exec round trip of `true` in `sb`, and of fork+exec on the host,
/// one of each in turn so the machine's drift falls on both alike.
async fn exec_rtt(sb: &Sandbox, iters: usize) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    for _ in 0..20 {
        sb.commands().run(ExecRequest::new("true")).await?;
        std::process::Command::new("true").status()?;
    }
    let (mut ns, mut host) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        let t = Instant::now();
        sb.commands().run(ExecRequest::new("true")).await?;
        ns.push(t.elapsed());
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        host.push(t.elapsed());
    }
    Ok((median(ns), median(host)))
}

async fn host_tier(iters: usize) -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let provider = HostProvider::new(state.path())?;
    let sb = provider.create(SandboxSpec::default()).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = sb.agent().health().await?;
    let (exec_ns, exec_host) = exec_rtt(&sb, iters).await?;

    let t = Instant::now();
    let zeros = tokio::io::repeat(0).take(GIB);
    sb.files()
        .write_from(Path::new("big"), Box::new(zeros), WriteOptions::default())
        .await?;
    let write_ns = t.elapsed();
    let raw_file = state.path().join("raw.bin");
    let write_raw = raw_socket_write(&raw_file, GIB)?;

    let t = Instant::now();
    let mut s = sb.files().stream(Path::new("big")).await?;
    let mut got = 0u64;
    while let Some(c) = s.next().await {
        got += c?.len() as u64;
    }
    let read_ns = t.elapsed();
    assert_eq!(got, GIB);
    let read_raw = raw_socket_read(&raw_file)?;
    let after = sb.agent().health().await?;
    sb.destroy().await?;

    println!("## host tier (spine), {iters} exec iterations, medians");
    println!();
    println!("| what | namzu | alternative | alternative is | ratio |");
    println!("|---|---|---|---|---|");
    println!(
        "| exec `true`, round trip | {} | {} | fork+exec on the host, in turn | {} |",
        fmt_dur(exec_ns),
        fmt_dur(exec_host),
        ratio(exec_ns, exec_host)
    );
    println!(
        "| write 1 GiB (atomic, fsynced) | {} ({}) | {} ({}) | raw unix-socket copy into a file + fsync | {} |",
        fmt_dur(write_ns),
        rate(write_ns),
        fmt_dur(write_raw),
        rate(write_raw),
        ratio(write_ns, write_raw)
    );
    println!(
        "| read 1 GiB (streamed) | {} ({}) | {} ({}) | raw unix-socket send of the file | {} |",
        fmt_dur(read_ns),
        rate(read_ns),
        fmt_dur(read_raw),
        rate(read_raw),
        ratio(read_ns, read_raw)
    );
    println!(
        "| agent RSS | idle {} KiB, peak after 2 GiB moved {} KiB | | | |",
        idle.rss_bytes >> 10,
        after.peak_rss_bytes >> 10
    );
    println!();
    Ok(())
}

/// Median wall time of running a whole command line.
fn time_command(argv: &[&str], iters: usize) -> Option<Duration> {
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let st = std::process::Command::new(argv[0]).args(&argv[1..]).status().ok()?;
        if !st.success() {
            return None;
        }
        v.push(t.elapsed());
    }
    Some(median(v))
}

/// PSS of `pid` and all its descendants, in KiB.
fn tree_pss_kib(pid: u32) -> u64 {
    let mut total = 0;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")) {
            total += s
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(ch) = std::fs::read_to_string(t.path().join("children")) {
                    stack.extend(ch.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
                }
            }
        }
    }
    total
}

async fn local_tier(iters: usize) -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let provider = LocalProvider::new(state.path())?;
    let n = iters.min(50);
    let mut creates = Vec::with_capacity(n);
    let mut destroys = Vec::with_capacity(n);
    let (mut bwraps, mut unshares) = (Some(Vec::with_capacity(n)), Some(Vec::with_capacity(n)));
    // Round by round, so the machine's drift (this VM's moves ±20 % within
    // minutes) weighs on namzu and the alternatives alike.
    for _ in 0..n {
        let t = Instant::now();
        let sb = provider.create(SandboxSpec::default()).await?;
        sb.commands().run(ExecRequest::new("true")).await?;
        creates.push(t.elapsed());
        let t = Instant::now();
        sb.destroy().await?;
        destroys.push(t.elapsed());
        for (alt, argv) in [(&mut bwraps, cold::BWRAP), (&mut unshares, cold::UNSHARE)] {
            if let Some(v) = alt.as_mut() {
                match time_command(argv, 1) {
                    Some(d) => v.push(d),
                    None => *alt = None,
                }
            }
        }
    }
    let create = median(creates);
    let destroy = median(destroys);
    let (bwrap, unshare) = (bwraps.map(median), unshares.map(median));

    let sb = provider.create(SandboxSpec::default()).await?;
    // Its own VmRSS, before any command: what a start leaves mapped.
    let idle_rss = sb.agent().health().await?.rss_bytes;
    let (exec_ns, exec_host) = exec_rtt(&sb, iters).await?;
    sb.destroy().await?;

    let mut idle = Vec::with_capacity(100);
    for _ in 0..100 {
        idle.push(provider.create(SandboxSpec::default()).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut pss = 0;
    for info in provider.list().await? {
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(
            state.path().join("local").join(&info.id).join("meta.json"),
        )?)?;
        pss += tree_pss_kib(meta["pid"].as_u64().unwrap_or(0) as u32);
    }
    for sb in idle {
        sb.destroy().await?;
    }

    println!("## local tier (namespaces, seccomp, landlock), medians");
    println!();
    println!("| what | namzu | alternative | ratio |");
    println!("|---|---|---|---|");
    let alt = |name: &str, d: Option<Duration>| match d {
        Some(d) => println!(
            "| create + first `exec true` | {} | {name}: {} | {} |",
            fmt_dur(create),
            fmt_dur(d),
            ratio(create, d)
        ),
        None => println!(
            "| create + first `exec true` | {} | {name}: not installed or failed | |",
            fmt_dur(create)
        ),
    };
    alt("`bwrap --unshare-all … true`", bwrap);
    alt(
        "`unshare --user --map-root-user --pid --fork --mount --net --ipc --uts true`",
        unshare,
    );
    println!("| destroy | {} | | |", fmt_dur(destroy));
    println!(
        "| exec `true`, round trip, live sandbox | {} | fork+exec on the host, in turn: {} | {} |",
        fmt_dur(exec_ns),
        fmt_dur(exec_host),
        ratio(exec_ns, exec_host)
    );
    println!("| in-sandbox agent RSS, idle (VmRSS) | {} KiB | | |", idle_rss >> 10);
    println!(
        "| host memory of 100 idle sandboxes (PSS, launcher + init + agent) | {} MiB ({} KiB each) | | |",
        pss >> 10,
        pss / 100
    );
    println!();
    Ok(())
}

/// Create + first `exec true` with this build's agent (A) and another
/// (B), alternating, with `unshare … true` between them: how a change to
/// the agent moves the cold start, free of the machine's drift. The host
/// side is this build's for both.
async fn agent_ab(other: std::path::PathBuf, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let a = LocalProvider::new(state.path())?;
    let b = LocalProvider::with_agent(state.path(), &other);
    let (mut ta, mut tb, mut tu) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n + 3 {
        for (p, v) in [(&a, &mut ta), (&b, &mut tb)] {
            let t = Instant::now();
            let sb = p.create(SandboxSpec::default()).await?;
            sb.commands().run(ExecRequest::new("true")).await?;
            let d = t.elapsed();
            sb.destroy().await?;
            if i >= 3 {
                v.push(d);
            }
        }
        if let Some(d) = time_command(cold::UNSHARE, 1) {
            tu.push(d);
        }
    }
    let (ma, mb) = (median(ta), median(tb));
    let mu = (!tu.is_empty()).then(|| median(tu));
    println!(
        "## create + first `exec true`, this agent (A) against {} (B), {n} rounds",
        other.display()
    );
    println!();
    println!("| agent | median | against unshare |");
    println!("|---|---|---|");
    for (name, m) in [("A", ma), ("B", mb)] {
        let r = mu.map(|u| ratio(m, u)).unwrap_or_default();
        println!("| {name} | {} | {r} |", fmt_dur(m));
    }
    if let Some(u) = mu {
        println!("| `unshare … true` | {} | |", fmt_dur(u));
    }
    println!();
    exec_ab(&a, &b, &other, n).await
}

/// The exec round trip of `true` in a live sandbox of each agent, and
/// fork+exec on the host, one of each in turn so the machine's drift falls
/// on all three alike (after 25 of each to warm up): the median of each.
async fn exec_ab(
    a: &LocalProvider,
    b: &LocalProvider,
    other: &Path,
    n: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (sa, sb) = (
        a.create(SandboxSpec::default()).await?,
        b.create(SandboxSpec::default()).await?,
    );
    let (mut ta, mut tb, mut th) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n.max(100) + 25 {
        for (s, v) in [(&sa, &mut ta), (&sb, &mut tb)] {
            let t = Instant::now();
            s.commands().run(ExecRequest::new("true")).await?;
            if i >= 25 {
                v.push(t.elapsed());
            }
        }
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        if i >= 25 {
            th.push(t.elapsed());
        }
    }
    sa.destroy().await?;
    sb.destroy().await?;
    let count = ta.len();
    let (ma, mb, mh) = (median(ta), median(tb), median(th));
    println!(
        "## exec `true` round trip, this agent (A) against {} (B), {count} each, interleaved",
        other.display()
    );
    println!();
    println!("| agent | median | against host fork+exec |");
    println!("|---|---|---|");
    for (name, m) in [("A", ma), ("B", mb)] {
        println!("| {name} | {} | {} |", fmt_dur(m), ratio(m, mh));
    }
    println!("| host fork+exec | {} | |", fmt_dur(mh));
    println!();
    Ok(())
}

/// The cold start, stage by stage: `namzu run -- true` through the CLI and
/// create + `exec true` + destroy through the library, each mark's cost
/// the time since the one before it.
async fn startup_stages(runs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let provider = LocalProvider::new(state.path())?;
    let mut lib = stages::Table::default();
    for i in 0..runs + 3 {
        stages::take();
        stages::mark("bench.create");
        let sb = provider.create(SandboxSpec::default()).await?;
        sb.commands().run(ExecRequest::new("true")).await?;
        stages::mark("bench.exec-done");
        sb.destroy().await?;
        if i >= 3 {
            lib.add(stages::take());
        }
    }
    let cli = std::env::current_exe()?.with_file_name("namzu");
    let mut whole = stages::Table::default();
    for i in 0..runs + 3 {
        let t0 = namzu::timeline::now_ns();
        let out = std::process::Command::new(&cli)
            .args(["run", "--", "true"])
            .env("NAMZU_STATE_DIR", state.path())
            .env("NAMZU_LOG", "namzu::timeline=trace")
            .output()?;
        let t1 = namzu::timeline::now_ns();
        if !out.status.success() {
            return Err(format!("namzu run failed: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let mut marks = stages::parse_cli(&String::from_utf8_lossy(&out.stderr));
        marks.push(("bench.spawn".into(), t0));
        marks.push(("bench.cli-exited".into(), t1));
        if i >= 3 {
            whole.add(marks);
        }
    }
    println!("## where a cold start spends its time (local tier)");
    println!();
    whole.print("`namzu run -- true`, the whole CLI", &stages::describe);
    lib.print("library: create + `exec true` + destroy", &stages::describe);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = if std::env::var("NAMZU_BENCH_RT").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Runtime::new()?
    };
    rt.block_on(bench())
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    stages::install();
    let iters: usize = std::env::var("NAMZU_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    // `NAMZU_BENCH_ONLY=exec-loop`: one local sandbox running `true` in a
    // loop and nothing else, to profile the exec path with perf.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("health-loop") {
        let state = tempfile::tempdir()?;
        let sb = LocalProvider::new(state.path())?.create(SandboxSpec::default()).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        for _ in 0..iters {
            sb.agent().health().await?;
        }
        println!("{iters} health calls, {} each", fmt_dur(t.elapsed() / iters as u32));
        sb.destroy().await?;
        return Ok(());
    }
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("exec-loop") {
        let state = tempfile::tempdir()?;
        let sb = LocalProvider::new(state.path())?.create(SandboxSpec::default()).await?;
        let t = Instant::now();
        for _ in 0..iters {
            sb.commands().run(ExecRequest::new("true")).await?;
        }
        println!("{iters} execs, {} each", fmt_dur(t.elapsed() / iters as u32));
        let t = Instant::now();
        for _ in 0..iters {
            sb.agent().health().await?;
        }
        println!("{iters} health calls, {} each", fmt_dur(t.elapsed() / iters as u32));
        let t = Instant::now();
        for _ in 0..iters {
            std::process::Command::new("true").status()?;
        }
        println!("{iters} host fork+exec, {} each", fmt_dur(t.elapsed() / iters as u32));
        sb.destroy().await?;
        return Ok(());
    }
    // `NAMZU_BENCH_ONLY=docker-rtt`: the docker tier's exec round trip
    // through a live handle, for bench/docker.sh to print next to `docker
    // exec` (image and runtime from NAMZU_BENCH_DOCKER_IMAGE and
    // NAMZU_BENCH_DOCKER_RUNTIME).
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("docker-rtt") {
        let image = std::env::var("NAMZU_BENCH_DOCKER_IMAGE")?;
        let runtime = std::env::var("NAMZU_BENCH_DOCKER_RUNTIME").unwrap_or_else(|_| "runc".into());
        let d = cold::docker_rtt(&image, &runtime, iters.min(200)).await?;
        println!("{}", d.as_micros());
        return Ok(());
    }
    let fast = std::env::current_exe().is_ok_and(|p| p.components().any(|c| c.as_os_str() == "fast"));
    println!(
        "# namzu benchmark ({})",
        if fast {
            "optimised build without LTO"
        } else {
            "release build"
        }
    );
    println!();
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("cold") {
        let state = tempfile::tempdir()?;
        cold::cli_cold_start(state.path(), iters.min(300));
        return Ok(());
    }
    // `NAMZU_BENCH_ONLY=first-exec`: the first command of a fresh sandbox
    // next to the ones after it, with the agent's CPU and faults.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("first-exec") {
        return first::bench(iters.min(100)).await;
    }
    // `NAMZU_BENCH_ONLY=stages`: where a cold start's time goes, only.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("stages") {
        return startup_stages(30).await;
    }
    // `NAMZU_BENCH_ONLY=agent-ab NAMZU_BENCH_AGENT_B=PATH`: this build's
    // agent against another, create + first exec round by round.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("agent-ab") {
        let other = std::env::var_os("NAMZU_BENCH_AGENT_B").ok_or("NAMZU_BENCH_AGENT_B: the other agent binary")?;
        return agent_ab(other.into(), iters.min(200)).await;
    }
    // `NAMZU_BENCH_ONLY=local`: the local tier's create, exec and memory.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("local") {
        return local_tier(iters).await;
    }
    // `NAMZU_BENCH_ONLY=pause`: pause and resume on the local tier only.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("pause") {
        return pause::bench(20, iters.min(50)).await;
    }
    // `NAMZU_BENCH_ONLY=host`: the host tier's exec and file figures only.
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() == Ok("host") {
        return host_tier(iters).await;
    }
    startup_stages(30).await?;
    {
        let state = tempfile::tempdir()?;
        cold::cli_cold_start(state.path(), 100);
    }
    if std::env::var("NAMZU_BENCH_ONLY").as_deref() != Ok("no-pool") {
        let n = std::env::var("NAMZU_BENCH_POOL_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        pool::bench(n, 100, 8).await.map_err(|e| e.to_string())?;
    }
    local_tier(iters).await?;
    pause::bench(20, 50).await?;
    host_tier(iters).await?;
    Ok(())
}
