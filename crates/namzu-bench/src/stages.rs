//! Where a cold start spends its time, stage by stage: every mark the
//! library (`namzu::timeline`), the agent (Health's `startup`) and the CLI
//! make, lined up on `CLOCK_MONOTONIC`, each stage's cost being the time
//! since the mark before it, median over the runs.
//!
//! The library's marks are caught in this process by a `tracing` layer;
//! the CLI's are read off its stderr (`NAMZU_LOG=namzu::timeline=trace`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

static MARKS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Collects `namzu::timeline` events into [`MARKS`].
pub struct Collector;

#[derive(Default)]
struct Mark {
    stage: Option<String>,
    ns: Option<u64>,
}

impl Visit for Mark {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "stage" {
            self.stage = Some(value.to_owned());
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "mono_ns" {
            self.ns = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "stage" {
            self.stage = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Collector {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != namzu::timeline::TARGET {
            return;
        }
        let mut m = Mark::default();
        event.record(&mut m);
        if let (Some(stage), Some(ns)) = (m.stage, m.ns) {
            MARKS.lock().unwrap_or_else(|p| p.into_inner()).push((stage, ns));
        }
    }
}

/// Installs the collector as the global subscriber (TRACE for the
/// timeline target only).
pub fn install() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::filter::Targets::new().with_target(namzu::timeline::TARGET, tracing::Level::TRACE);
    let _ = tracing_subscriber::registry()
        .with(Collector.with_filter(filter))
        .try_init();
}

/// Marks a stage of the benchmark itself (the caller's own steps).
pub fn mark(stage: &str) {
    MARKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((stage.to_owned(), namzu::timeline::now_ns()));
}

/// Takes every mark collected so far.
pub fn take() -> Vec<(String, u64)> {
    std::mem::take(&mut *MARKS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Parses the timeline lines of a CLI's stderr.
pub fn parse_cli(stderr: &str) -> Vec<(String, u64)> {
    stderr
        .lines()
        .filter(|l| l.contains(namzu::timeline::TARGET))
        .filter_map(|l| {
            let field = |name: &str| {
                let at = l.find(&format!("{name}="))? + name.len() + 1;
                let rest = &l[at..];
                let end = rest.find(' ').unwrap_or(rest.len());
                Some(rest[..end].trim_matches('"').to_owned())
            };
            Some((field("stage")?, field("mono_ns")?.parse().ok()?))
        })
        .collect()
}

/// Per-stage costs over many runs: each run's marks sorted by time, a
/// stage costing the time since the mark before it.
#[derive(Default)]
pub struct Table {
    order: Vec<String>,
    costs: BTreeMap<String, Vec<Duration>>,
    totals: Vec<Duration>,
}

impl Table {
    /// Adds one run.
    pub fn add(&mut self, mut marks: Vec<(String, u64)>) {
        marks.sort_by_key(|(_, ns)| *ns);
        let (Some(first), Some(last)) = (marks.first(), marks.last()) else {
            return;
        };
        self.totals.push(Duration::from_nanos(last.1 - first.1));
        for w in marks.windows(2) {
            let (stage, cost) = (&w[1].0, Duration::from_nanos(w[1].1 - w[0].1));
            if !self.costs.contains_key(stage) {
                self.order.push(stage.clone());
            }
            self.costs.entry(stage.clone()).or_default().push(cost);
        }
    }

    /// The median total and, per stage in first-seen order, its median cost.
    pub fn medians(&self) -> (Duration, Vec<(String, Duration)>) {
        let med = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            v.get(v.len() / 2).copied().unwrap_or_default()
        };
        let rows = self.order.iter().map(|s| (s.clone(), med(&self.costs[s]))).collect();
        (med(&self.totals), rows)
    }

    /// Prints the table in markdown.
    pub fn print(&self, title: &str, what: &dyn Fn(&str) -> &'static str) {
        let (total, rows) = self.medians();
        println!(
            "### {title}: {} runs, median total {:.2} ms",
            self.totals.len(),
            total.as_secs_f64() * 1e3
        );
        println!();
        println!("| stage (ends at) | median ms | what it covers |");
        println!("|---|---|---|");
        for (stage, d) in rows {
            println!("| `{stage}` | {:.3} | {} |", d.as_secs_f64() * 1e3, what(&stage));
        }
        println!();
    }
}

/// What the time before a mark covers.
pub fn describe(stage: &str) -> &'static str {
    match stage {
        "cli.main" => "exec of the CLI binary to its main (loader, relocations)",
        "cli.runtime" => "argument parsing, logging, the tokio runtime",
        "create.begin" => "the provider (agent binary found, state directory)",
        "create.state-dir" => "sandbox directory, workspace and token",
        "create.uid-slot" => "a host id range claimed",
        "create.cgroups" => "cgroups made (only with limits)",
        "create.spec-written" => "launch spec serialised and written",
        "create.launcher-spawned" => "fork+exec of the launcher returns",
        "agent.main" => "the launcher's exec to its main",
        "agent.logging" => "the agent's log subscriber",
        "agent.args-parsed" => "the agent's arguments (not on the launch path)",
        "launch.spec-read" => "spec and token read, TLS loaded",
        "launch.etc-cached" => "the shared read-only /etc found (made once per host state)",
        "launch.socket-bound" => "the agent socket bound",
        "launch.unshared" => "fork, cgroup join, unshare of seven namespaces",
        "launch.id-mapped" => "uid/gid maps written by the launcher",
        "launch.init-forked" => "setresuid, fork of the sandbox's init",
        "rootfs.private" => "mounts made private, the new root's tmpfs",
        "rootfs.host-dirs" => "/usr, /bin, /lib… bound read-only",
        "rootfs.image-or-etc" => "the curated /etc (or the image's entries)",
        "rootfs.binds" => "tmpfs dirs, the workspace, requested binds",
        "rootfs.dev" => "a minimal /dev",
        "rootfs.proc" => "/proc mounted and masked",
        "rootfs.pivot" => "pivot_root",
        "rootfs.detached" => "the host's mounts detached",
        "launch.rootfs-pivoted" => "hostname set",
        "launch.network-up" => "loopback up, proxy and resolver bound",
        "harden.landlock" => "rlimits, no_new_privs, landlock",
        "harden.capabilities" => "every capability set emptied",
        "harden.seccomp-compiled" => "seccomp filters compiled to BPF",
        "launch.hardened" => "seccomp filters installed",
        "launch.probed" => "the privilege probe's child forked and read",
        "launch.runtime-built" => "the agent's tokio runtime",
        "agent.serving" => "jail, reaper, service ready; accepting",
        "link.dialed" => "the host's connect (polling for the socket)",
        "link.preface-accepted" => "token preface, agent's answer",
        "link.http2-up" => "HTTP/2 handshake",
        "link.health" => "Health at connect",
        "link.hello" => "the agent's hello (what Health would say) read by the host",
        "create.processes-recorded" => "the sandbox's processes recorded by identity (as the launcher wrote them)",
        "create.privilege-probe" => "privilege probe (a forked child's status)",
        "create.egress-supervisor" => "egress supervisor started and holding its call",
        "bench.exec-done" | "cli.command-done" => "the first command, `true`",
        "destroy.begin" => "handle closed, state read",
        "destroy.anchor-exited" => "SIGTERM to the anchor until it is gone",
        "destroy.leftovers-killed" => "recorded processes checked",
        "destroy.end" => "state directory removed, id range released",
        "cli.exit" => "the CLI's own end",
        "bench.cli-exited" => "process exit, reaped by the caller",
        _ => "",
    }
}
