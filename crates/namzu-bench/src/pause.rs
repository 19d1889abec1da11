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
    suspend_bench(iters.min(10)).await
}

/// Suspend to disk and resume from it on the local tier, with 8 MiB in
/// /tmp (archived) and 8 MiB in /workspace (kept in place), next to what
/// the resume cannot beat: a fresh sandbox's create (no files put back).
async fn suspend_bench(iters: usize) -> Result<(), Box<dyn std::error::Error>> {
    let state_dir = tempfile::tempdir()?;
    let p = LocalProvider::new(state_dir.path())?;
    let mut sb = p.create(SandboxSpec::default()).await?;
    let id = sb.id().to_owned();
    let fill = "head -c 8388608 /dev/urandom > /tmp/data; head -c 8388608 /dev/urandom > /workspace/data";
    let out = sb.commands().run(fill).await?;
    if !out.status.success() {
        return Err("could not fill the sandbox".into());
    }
    let (mut suspend, mut resume, mut size) = (Vec::new(), Vec::new(), 0u64);
    for _ in 0..iters {
        let t = Instant::now();
        sb.clone().suspend().await?;
        suspend.push(t.elapsed());
        size = std::fs::metadata(state_dir.path().join("local").join(&id).join("saved.tar"))?.len();
        let t = Instant::now();
        sb = p.resume(&id).await?;
        resume.push(t.elapsed());
    }
    sb.destroy().await?;
    let mut fresh = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let sb = p.create(SandboxSpec::default()).await?;
        fresh.push(t.elapsed());
        sb.destroy().await?;
    }
    // The disk's floor under the suspend: the same bytes written and synced.
    let bytes = vec![7u8; usize::try_from(size).unwrap_or(0)];
    let mut floor = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let path = state_dir.path().join("floor");
        std::fs::write(&path, &bytes)?;
        std::fs::File::open(&path)?.sync_all()?;
        floor.push(t.elapsed());
    }
    let (s, r, c, f) = (median(suspend), median(resume), median(fresh), median(floor));
    println!("## suspend to disk and resume (local tier, 8 MiB in /tmp and 8 MiB in /workspace, median of {iters})");
    println!();
    println!("| what | namzu | instead | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| suspend (pause, archive /tmp /home /root, end) | {} | the archive's bytes written + fsync: {} | {} |",
        fmt_dur(s),
        fmt_dur(f),
        ratio(s, f)
    );
    println!(
        "| resume from disk (launch, put back, probe) | {} | a fresh create: {} | {} |",
        fmt_dur(r),
        fmt_dur(c),
        ratio(r, c)
    );
    println!("| archive on disk | {:.1} MiB | | |", size as f64 / f64::from(1 << 20));
    println!();
    Ok(())
}
