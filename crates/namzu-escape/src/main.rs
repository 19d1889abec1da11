//! `namzu-escape`: concrete escape attempts, run INSIDE a sandbox by the
//! escape suite (like youki's runtimetest), and once on the host as their
//! positive control (`--control`). Static, so it runs in any image.
//!
//! Each attempt prints one line,
//! `attempt<TAB>NAME<TAB>succeeded|blocked|unexpected|skipped<TAB>DETAIL`
//! ([`attempt::run`]); the host side pairs each line with the control's and
//! decides proven, inconclusive or escaped. The host plants the targets (a
//! secret file, TCP, unix and abstract listeners, a marked process, a file
//! in /etc, a read-only mount) and passes their coordinates as arguments.
//!
//! Most attempts are raw system calls: that is the point of the tool, so
//! `unsafe` is allowed here crate-wide, and each call is a plain syscall on
//! arguments owned by the calling frame.
#![allow(unsafe_code)]

mod attempt;
mod host;
mod kernel;
mod modes;
mod view;

pub use attempt::Attempt;

/// Every attempt, in the order they run and print.
fn all() -> Vec<Attempt> {
    let mut v = host::attempts();
    v.extend(kernel::attempts());
    v.extend(view::attempts());
    v
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let has = |k: &str| argv.iter().any(|a| a == k);
    let get = |k: &str| {
        argv.iter()
            .position(|a| a == k)
            .and_then(|i| argv.get(i + 1))
            .cloned()
            .unwrap_or_default()
    };
    if has("--report-caps") {
        return modes::report_caps();
    }
    if has("--fork-bomb") {
        return modes::fork_bomb(get("--fork-bomb").parse().unwrap_or(100_000));
    }
    if has("--echo-server") {
        return modes::echo_server(get("--echo-server").parse().unwrap_or(7777));
    }
    if has("--mem-hog") {
        return modes::mem_hog();
    }
    if has("--cpu-burn") {
        return modes::cpu_burn(get("--cpu-burn").parse().unwrap_or(1.0));
    }
    if has("--disk-fill") {
        return modes::disk_fill(&get("--disk-fill"));
    }
    if has("--list") {
        for a in all() {
            println!("{}", a.name);
        }
        return;
    }
    let env = attempt::Env {
        control: has("--control"),
        secret: get("--secret"),
        host_path: get("--host-path"),
        tcp_port: get("--tcp").parse().unwrap_or(1),
        host_ip: get("--host-ip"),
        unix: get("--unix"),
        abstract_name: get("--abstract"),
        host_pid: get("--host-pid").parse().unwrap_or(-1),
        marker: get("--marker"),
        etc_canary: get("--etc-canary"),
        shadow_digest: get("--shadow-digest"),
        disk: get("--disk"),
        ro_dir: get("--ro-dir"),
        scratch: get("--scratch"),
        agent_pid: 1,
        agent_link: get("--agent-link"),
        agent_token: get("--agent-token"),
    };
    let only = get("--only");
    let attempts = all();
    let mut n = 0;
    for a in attempts.iter().filter(|a| only.is_empty() || a.name == only) {
        println!("{}", attempt::run(a, &env));
        n += 1;
    }
    println!("escape attempts: {n}");
}
