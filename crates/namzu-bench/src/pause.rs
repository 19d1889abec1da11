//! Pause and resume on the local tier: the library's `pause` + `resume`
//! of a sandbox running `procs` processes, next to the floor a user could
//! reach by hand — SIGSTOP to the same processes from the host, waiting
//! for each to show stopped, then SIGCONT (no scan, no refusal of new
//! work, no link).

use std::time::{Duration, Instant};

use namzu::backend::local::LocalProvider;
use namzu::{Provider, SandboxSpec};

use crate::{fmt_dur, median, ratio};

/// Host pids of the sandbox's processes but its agent: every descendant
/// of its launcher (`launcher`, as the host sees it) that is not the agent.
fn host_pids(launcher: u32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![launcher];
    while let Some(p) = queue.pop() {
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            queue.push(c);
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() != "namzu-agent" {
                out.push(i32::try_from(c).unwrap_or(0));
            }
        }
    }
    out
}

fn state(pid: i32) -> char {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()))
        .unwrap_or('X')
}

pub async fn bench(procs: usize, iters: usize) -> Result<(), Box<dyn std::error::Error>> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let state_dir = tempfile::tempdir()?;
    let sb = LocalProvider::new(state_dir.path())?
        .create(SandboxSpec::default())
        .await?;
    let script = format!("for i in $(seq {procs}); do sleep 1000 & done; while :; do :; done");
    let _busy = sb.commands().spawn(namzu::ExecRequest::shell(script)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let t = Instant::now();
        sb.pause().await?;
        pause.push(t.elapsed());
        let t = Instant::now();
        sb.resume().await?;
        resume.push(t.elapsed());
    }
    let meta = std::fs::read(state_dir.path().join("local").join(sb.id()).join("meta.json"))?;
    let launcher = serde_json::from_slice::<serde_json::Value>(&meta)?["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok());
    let mut raw = Vec::new();
    if let Some(launcher) = launcher {
        let pids = host_pids(launcher);
        for _ in 0..iters {
            let t = Instant::now();
            for p in &pids {
                let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
            }
            while pids.iter().any(|p| !matches!(state(*p), 'T' | 't' | 'D' | 'X')) {
                std::hint::spin_loop();
            }
            for p in &pids {
                let _ = kill(Pid::from_raw(*p), Signal::SIGCONT);
            }
            raw.push(t.elapsed());
        }
    }
    let (p, r) = (median(pause), median(resume));
    println!(
        "## pause and resume (local tier, {} processes in the sandbox, median of {iters})",
        procs + 2
    );
    println!();
    println!("| what | namzu | by hand from the host | ratio |");
    println!("|---|---|---|---|");
    if raw.is_empty() {
        println!("| pause + resume | {} + {} | (no host pid) | |", fmt_dur(p), fmt_dur(r));
    } else {
        let h = median(raw);
        println!(
            "| pause + resume | {} + {} = {} | SIGSTOP, wait stopped, SIGCONT: {} | {} |",
            fmt_dur(p),
            fmt_dur(r),
            fmt_dur(p + r),
            fmt_dur(h),
            ratio(p + r, h)
        );
    }
    println!();
    sb.destroy().await?;
    Ok(())
}
