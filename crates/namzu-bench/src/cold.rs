//! Whole commands next to each other, interleaved (A, B, C, A, B, C …) so
//! that the machine's drift (these VMs move by ±20 % within a minute) lands
//! on every command alike: `namzu run -- true` against `bwrap` and
//! `unshare`, and the docker tier's exec round trip through a live handle
//! against `docker exec`.

use std::time::{Duration, Instant};

use namzu::{ExecRequest, Provider, SandboxSpec};

/// bwrap running `true` with every namespace of its own: what a user
/// would run instead of `namzu run -- true`.
pub const BWRAP: &[&str] = &[
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "true",
];

/// unshare(1) making the same namespaces and running `true`.
pub const UNSHARE: &[&str] = &[
    "unshare",
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--mount",
    "--net",
    "--ipc",
    "--uts",
    "true",
];

/// A command line to time, and what it is.
pub struct Cmd {
    pub label: &'static str,
    pub argv: Vec<String>,
}

impl Cmd {
    pub fn new(label: &'static str, argv: &[&str]) -> Self {
        Self {
            label,
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Median wall time of each command over `runs` interleaved rounds (after
/// five of warm-up); `None` for one that is missing or failed.
pub fn interleaved(cmds: &[Cmd], runs: usize) -> Vec<Option<Duration>> {
    let mut times: Vec<Option<Vec<Duration>>> = cmds.iter().map(|_| Some(Vec::new())).collect();
    for round in 0..runs + 5 {
        for (c, t) in cmds.iter().zip(times.iter_mut()) {
            let Some(v) = t else { continue };
            let start = Instant::now();
            let ok = std::process::Command::new(&c.argv[0])
                .args(&c.argv[1..])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            let took = start.elapsed();
            if !ok {
                *t = None;
            } else if round >= 5 {
                v.push(took);
            }
        }
    }
    times.into_iter().map(|t| t.map(median)).collect()
}

/// Prints `namzu run -- true` (the CLI, whole) next to bwrap and unshare,
/// interleaved.
pub fn cli_cold_start(state: &std::path::Path, runs: usize) {
    let cli = std::env::current_exe()
        .map(|e| e.with_file_name("namzu"))
        .unwrap_or_default();
    let cli = cli.display().to_string();
    let state_arg = format!("--state-dir={}", state.display());
    let cmds = [
        Cmd::new("`namzu run -- true`", &[&cli, &state_arg, "run", "--", "true"]),
        Cmd::new(
            "`bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc --dev /dev true`",
            BWRAP,
        ),
        Cmd::new(
            "`unshare --user --map-root-user --pid --fork --mount --net --ipc --uts true`",
            UNSHARE,
        ),
        Cmd::new("`namzu --version` (the CLI's own start and exit)", &[&cli, "--version"]),
        Cmd::new("`bwrap --version`", &["bwrap", "--version"]),
    ];
    let t = interleaved(&cmds, runs);
    println!("## `namzu run -- true` next to bwrap and unshare ({runs} interleaved rounds, medians)");
    println!();
    println!("| command | median | vs `namzu run -- true` |");
    println!("|---|---|---|");
    let base = t.first().copied().flatten();
    for (c, d) in cmds.iter().zip(&t) {
        match (d, base) {
            (Some(d), Some(b)) => println!(
                "| {} | {:.2} ms | namzu is {:.2}x this |",
                c.label,
                d.as_secs_f64() * 1e3,
                b.as_secs_f64() / d.as_secs_f64()
            ),
            (Some(d), None) => println!("| {} | {:.2} ms | |", c.label, d.as_secs_f64() * 1e3),
            (None, _) => println!("| {} | not installed or failed | |", c.label),
        }
    }
    println!();
}

/// The docker tier's exec round trip through a live handle (the library,
/// one connection), median of `iters`, for `image` on `runtime`.
pub async fn docker_rtt(image: &str, runtime: &str, iters: usize) -> Result<Duration, Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let opts = namzu::backend::docker::DockerOptions {
        runtime: Some(runtime.to_owned()),
        ..Default::default()
    };
    let provider = namzu::backend::docker::DockerProvider::new(state.path(), opts).await?;
    let sb = provider
        .create(SandboxSpec {
            image: Some(image.to_owned()),
            ..Default::default()
        })
        .await?;
    for _ in 0..10 {
        sb.commands().run(ExecRequest::new("true")).await?;
    }
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        sb.commands().run(ExecRequest::new("true")).await?;
        v.push(t.elapsed());
    }
    sb.destroy().await?;
    Ok(median(v))
}
