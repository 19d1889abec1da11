//! The warm pool next to cold creates, same machine, same run: N
//! sequential create + `exec true` + destroy, then M of them at once, each
//! way; and claim-to-first-exec from a full pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use namzu::backend::local::LocalProvider;
use namzu::pool::{Pool, PoolOptions};
use namzu::{ExecRequest, Provider, SandboxSpec};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// One create (or claim) + `exec true` + destroy; the time to the exec's
/// end, and the whole.
async fn once(
    make: &(dyn Fn() -> futures::future::BoxFuture<'static, namzu::Result<namzu::Sandbox>> + Sync),
) -> Result<(Duration, Duration), Box<dyn std::error::Error + Send + Sync>> {
    let t = Instant::now();
    let sb = make().await?;
    sb.commands().run(ExecRequest::new("true")).await?;
    let to_exec = t.elapsed();
    sb.destroy().await?;
    Ok((to_exec, t.elapsed()))
}

struct Run {
    wall: Duration,
    to_exec: Vec<Duration>,
}

async fn sequential(
    n: usize,
    make: &(dyn Fn() -> futures::future::BoxFuture<'static, namzu::Result<namzu::Sandbox>> + Sync),
) -> Result<Run, Box<dyn std::error::Error + Send + Sync>> {
    let t = Instant::now();
    let mut to_exec = Vec::with_capacity(n);
    for _ in 0..n {
        to_exec.push(once(make).await?.0);
    }
    Ok(Run {
        wall: t.elapsed(),
        to_exec,
    })
}

async fn concurrent(
    n: usize,
    make: Arc<dyn Fn() -> futures::future::BoxFuture<'static, namzu::Result<namzu::Sandbox>> + Send + Sync>,
) -> Result<Run, Box<dyn std::error::Error + Send + Sync>> {
    let t = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let make = make.clone();
            tokio::spawn(async move { once(&*make).await })
        })
        .collect();
    let mut to_exec = Vec::with_capacity(n);
    for task in tasks {
        to_exec.push(task.await??.0);
    }
    Ok(Run {
        wall: t.elapsed(),
        to_exec,
    })
}

fn row(what: &str, mut r: Run) {
    let n = r.to_exec.len();
    println!(
        "| {what} | {n} | {:.2} s | {} | {} | {} |",
        r.wall.as_secs_f64(),
        ms(r.wall / n as u32),
        ms(pct(&mut r.to_exec, 0.5)),
        ms(pct(&mut r.to_exec, 0.99)),
    );
}

/// Prints the pool's table: `n` sequential and `m` concurrent, each way.
pub async fn bench(n: usize, m: usize, size: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let state = tempfile::tempdir()?;
    let provider: Arc<dyn Provider> = Arc::new(LocalProvider::new(state.path())?);
    let cold: Arc<dyn Fn() -> futures::future::BoxFuture<'static, namzu::Result<namzu::Sandbox>> + Send + Sync> = {
        let p = provider.clone();
        Arc::new(move || {
            let p = p.clone();
            Box::pin(async move { p.create(SandboxSpec::default()).await })
        })
    };
    let pool = Arc::new(Pool::new(
        provider.clone(),
        SandboxSpec::default(),
        PoolOptions::default().size(size).max_starting(2),
    ));
    let warm: Arc<dyn Fn() -> futures::future::BoxFuture<'static, namzu::Result<namzu::Sandbox>> + Send + Sync> = {
        let pool = pool.clone();
        Arc::new(move || {
            let pool = pool.clone();
            Box::pin(async move { pool.claim().await })
        })
    };

    // Claim-to-first-exec from a full pool, one at a time with the pool
    // refilled between: what a caller sees while the pool keeps up.
    let mut claim = Vec::new();
    for _ in 0..50 {
        pool.filled(size, Duration::from_secs(60)).await;
        claim.push(once(&*warm).await?.0);
    }

    println!("## warm pool (local tier, pool of {size}, 2 starts at once)");
    println!();
    println!(
        "claim + first `exec true`, from a full pool: p50 {}, p99 {} (50 claims); the same from a cold create is the create + first exec line above",
        ms(pct(&mut claim, 0.5)),
        ms(pct(&mut claim, 0.99))
    );
    println!();
    println!("| what | runs | wall | per run | p50 to first exec | p99 to first exec |");
    println!("|---|---|---|---|---|---|");
    row("sequential, cold creates", sequential(n, &*cold).await?);
    pool.filled(size, Duration::from_secs(60)).await;
    let before = pool.stats();
    row("sequential, from the pool", sequential(n, &*warm).await?);
    let after = pool.stats();
    row(
        &format!("{m} at once, cold creates"),
        concurrent(m, cold.clone()).await?,
    );
    pool.filled(size, Duration::from_secs(60)).await;
    row(
        &format!("{m} at once, from the pool"),
        concurrent(m, warm.clone()).await?,
    );
    println!();
    println!(
        "sequential from the pool: {} warm, {} cold (the pool empty: creates outpaced its refill)",
        after.warm - before.warm,
        after.cold - before.cold
    );
    println!();
    drop(warm);
    if let Ok(pool) = Arc::try_unwrap(pool) {
        pool.close().await;
    }
    Ok(())
}
