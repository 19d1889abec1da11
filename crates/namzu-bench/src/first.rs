//! `NAMZU_BENCH_ONLY=first-exec`: what the first command in a fresh
//! `local` sandbox costs next to the ones after it, and whose time that
//! is. For each of a run of fresh sandboxes: the create, then three execs
//! of `true`, each with its wall time, the CPU time and page faults of the
//! sandbox's agent (its init, the last process the launcher recorded) and
//! the CPU time of this process (every thread: the client, HTTP/2, and the
//! bench's own reads of `/proc`). Medians per column.

use std::time::{Duration, Instant};

use namzu::backend::local::LocalProvider;
use namzu::{ExecRequest, Provider, SandboxSpec};

use crate::median;

/// CPU time of every thread of `pid` (`self` for this process), from
/// `schedstat` (nanoseconds on a CPU).
fn cpu(pid: &str) -> Duration {
    let mut ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Duration::from_nanos(ns)
}

/// Minor page faults of `pid` so far (`stat`'s tenth field).
fn faults(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_comm
        .split_whitespace()
        .nth(7)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

/// One exec's figures.
#[derive(Clone, Copy, Default)]
struct Exec {
    wall: Duration,
    agent_cpu: Duration,
    agent_faults: u64,
    host_cpu: Duration,
}

pub async fn bench(sandboxes: usize) -> Result<(), Box<dyn std::error::Error>> {
    const EXECS: usize = 3;
    let state = tempfile::tempdir()?;
    let provider = LocalProvider::new(state.path())?;
    let mut creates = Vec::with_capacity(sandboxes);
    let mut rows: Vec<[Exec; EXECS]> = Vec::with_capacity(sandboxes);
    for _ in 0..sandboxes {
        let t = Instant::now();
        let sb = provider.create(SandboxSpec::default()).await?;
        creates.push(t.elapsed());
        // One sandbox at a time: its init is the last process recorded.
        let agent = provider
            .recorded_processes()
            .last()
            .map(|p| p.pid.to_string())
            .ok_or("no process recorded for the sandbox")?;
        let mut row = [Exec::default(); EXECS];
        for slot in &mut row {
            let (a0, f0, h0) = (cpu(&agent), faults(&agent), cpu("self"));
            let t = Instant::now();
            sb.commands().run(ExecRequest::new("true")).await?;
            let wall = t.elapsed();
            *slot = Exec {
                wall,
                agent_cpu: cpu(&agent).saturating_sub(a0),
                agent_faults: faults(&agent).saturating_sub(f0),
                host_cpu: cpu("self").saturating_sub(h0),
            };
        }
        sb.destroy().await?;
        rows.push(row);
    }
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
    println!("## the first command in a fresh local sandbox, {sandboxes} sandboxes, medians");
    println!();
    println!("create: {} ms", ms(median(creates)));
    println!();
    println!("| exec `true` | wall ms | agent CPU ms | agent page faults | this process's CPU ms |");
    println!("|---|---|---|---|---|");
    for i in 0..EXECS {
        let col = |f: fn(&Exec) -> Duration| median(rows.iter().map(|r| f(&r[i])).collect());
        println!(
            "| #{} | {} | {} | {} | {} |",
            i + 1,
            ms(col(|e| e.wall)),
            ms(col(|e| e.agent_cpu)),
            median(rows.iter().map(|r| r[i].agent_faults).collect()),
            ms(col(|e| e.host_cpu)),
        );
    }
    Ok(())
}
