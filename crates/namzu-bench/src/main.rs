//! Measures namzu next to what a user would do without it, on this machine,
//! in one run, and prints a table of ratios. Never part of the tests: these
//! machines are shared and noisy, so figures are reported, not asserted.
//!
//! * exec round trip of `true` on a live sandbox vs fork+exec of `true`;
//! * 1 GiB written into a sandbox (atomic, fsynced) vs the same bytes over a
//!   raw unix socket into a file, fsynced;
//! * 1 GiB streamed out of a sandbox vs a file sent over a raw unix socket;
//! * the agent's idle resident memory.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use namzu::backend::host::HostProvider;
use namzu::{ExecRequest, Provider, SandboxSpec, WriteOptions};
use tokio::io::AsyncReadExt;

const GIB: u64 = 1 << 30;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fmt_dur(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn rate(d: Duration) -> String {
    format!("{:.0} MiB/s", (GIB as f64 / (1 << 20) as f64) / d.as_secs_f64())
}

/// A raw copy of `len` zero bytes over a unix socket into `dst`, fsynced.
fn raw_socket_write(dst: &Path, len: u64) -> std::io::Result<Duration> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let t0 = Instant::now();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let buf = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            a.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let mut f = std::fs::File::create(dst)?;
    std::io::copy(&mut (&mut b).take(len), &mut f)?;
    f.sync_all()?;
    sender.join().map_err(|_| std::io::Error::other("sender panicked"))??;
    Ok(t0.elapsed())
}

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: usize = std::env::var("NAMZU_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let state = tempfile::tempdir()?;
    let provider = HostProvider::new(state.path())?;
    let sb = provider.create(SandboxSpec::default()).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = sb.agent().health().await?;

    // Warm both paths.
    for _ in 0..20 {
        sb.exec(ExecRequest::new("true")).await?;
        std::process::Command::new("true").status()?;
    }
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        sb.exec(ExecRequest::new("true")).await?;
        ns.push(t.elapsed());
    }
    let mut host = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        host.push(t.elapsed());
    }
    let (exec_ns, exec_host) = (median(ns), median(host));

    let t = Instant::now();
    let zeros = tokio::io::repeat(0).take(GIB);
    sb.write_file_from(Path::new("big"), Box::new(zeros), WriteOptions::default())
        .await?;
    let write_ns = t.elapsed();
    let raw_file = state.path().join("raw.bin");
    let write_raw = raw_socket_write(&raw_file, GIB)?;

    let t = Instant::now();
    let mut s = sb.read_file_stream(Path::new("big"), None).await?;
    let mut got = 0u64;
    while let Some(c) = s.next().await {
        got += c?.len() as u64;
    }
    let read_ns = t.elapsed();
    assert_eq!(got, GIB);
    let read_raw = raw_socket_read(&raw_file)?;
    let after = sb.agent().health().await?;
    sb.destroy().await?;

    println!("namzu benchmark (host tier, release build, {iters} exec iterations, medians)");
    println!();
    println!("| what | namzu | alternative | alternative is | ratio |");
    println!("|---|---|---|---|---|");
    println!(
        "| exec `true`, round trip | {} | {} | fork+exec on the host | {:.1}x |",
        fmt_dur(exec_ns),
        fmt_dur(exec_host),
        exec_ns.as_secs_f64() / exec_host.as_secs_f64()
    );
    println!(
        "| write 1 GiB (atomic, fsynced) | {} ({}) | {} ({}) | raw unix-socket copy into a file + fsync | {:.2}x |",
        fmt_dur(write_ns),
        rate(write_ns),
        fmt_dur(write_raw),
        rate(write_raw),
        write_ns.as_secs_f64() / write_raw.as_secs_f64()
    );
    println!(
        "| read 1 GiB (streamed) | {} ({}) | {} ({}) | raw unix-socket send of the file | {:.2}x |",
        fmt_dur(read_ns),
        rate(read_ns),
        fmt_dur(read_raw),
        rate(read_raw),
        read_ns.as_secs_f64() / read_raw.as_secs_f64()
    );
    println!(
        "| agent RSS | idle {} KiB, peak after 2 GiB moved {} KiB | | | |",
        idle.rss_bytes >> 10,
        after.peak_rss_bytes >> 10
    );
    Ok(())
}
