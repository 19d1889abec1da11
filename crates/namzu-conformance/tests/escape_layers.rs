//! Each defence proven on its own: the escape suite run again with ONE
//! layer removed (a test build of the agent, `--features weaken`, built by
//! `scripts/test.sh` into `target/weaken`), and the attempts that then
//! succeed compared with the table below. A layer no attempt depends on is
//! named as such in its row's note (covered by another layer, or not
//! needed). The privilege probe is proven the same way: with a privilege
//! left in place on purpose, it must refuse the sandbox.

use std::path::PathBuf;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu::backend::docker::DockerOptions;
use namzu::backend::local::LocalProvider;
use namzu::{Provider, SandboxSpec};
use namzu_conformance::escape::suite::{self, Outcome, Report};
use namzu_conformance::{docker, Factory};

/// The weakened agent: `NAMZU_WEAKENED_AGENT`, or `target/weaken/...`
/// beside this workspace's target directory. Missing is a failure.
fn weakened_agent() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NAMZU_WEAKENED_AGENT") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<triple>/debug/deps/<test> -> target/weaken/<triple>/debug/namzu-agent
    let profile = exe.parent().and_then(|d| d.parent()).ok_or("test path")?;
    let triple = profile.parent().ok_or("test path")?;
    let target = triple.parent().ok_or("test path")?;
    let p = target
        .join("weaken")
        .join(triple.file_name().ok_or("test path")?)
        .join(profile.file_name().ok_or("test path")?)
        .join("namzu-agent");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} missing: cargo build -p namzu-agent --features weaken --target-dir target/weaken",
            p.display()
        ))
    }
}

fn weaken(layers: &str) -> SandboxSpec {
    SandboxSpec {
        env: vec![("NAMZU_TEST_WEAKEN".into(), layers.into())],
        ..Default::default()
    }
}

fn local_factory(agent: PathBuf) -> Factory {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let state = std::env::temp_dir().join(format!("namzu-escape-layers-{}-{n}", std::process::id()));
    let provider = Arc::new(LocalProvider::with_agent(state, agent));
    Arc::new(move |spec| {
        let provider = provider.clone();
        Box::pin(async move { provider.create(spec).await })
    })
}

/// What removing a layer let through, against the full build's run.
struct Diff {
    succeeded: Vec<String>,
    /// Still blocked, but by something else (the errno changed).
    moved: Vec<String>,
}

fn diff(base: &Report, weak: &Report) -> Diff {
    let mut d = Diff {
        succeeded: Vec::new(),
        moved: Vec::new(),
    };
    for (name, o) in &weak.outcomes {
        let before = base.inside.get(name).map(|l| &l.detail);
        match o {
            Outcome::Escaped(_) => d.succeeded.push(name.clone()),
            _ if weak.inside.get(name).map(|l| &l.detail) != before => d.moved.push(format!(
                "{name}: {} -> {}",
                before.map_or("?", |s| s.as_str()),
                weak.inside[name].detail
            )),
            _ => {}
        }
    }
    d.succeeded.extend(weak.host_side.iter().cloned());
    d
}

/// One row of the table: the layers removed, the attempts that must then
/// succeed (exactly), and the note printed with it.
struct Row {
    layers: &'static str,
    succeed: &'static [&'static str],
    note: &'static str,
}

/// What the seccomp filter alone stops on `local`: everything else it
/// refuses, the empty capability sets refuse too.
const LOCAL_SECCOMP: &[&str] = &[
    "add_key",
    "create a user namespace (clone)",
    "create a user namespace (clone3)",
    "create a user namespace (unshare)",
    "create an AF_VSOCK socket",
    "io_uring_setup",
    "keyctl",
    "open a perf counter",
    "userfaultfd",
];

/// What the read-only mounts and landlock stop together (each alone is
/// enough: removing one turns EROFS into landlock's EACCES, or nothing).
/// /etc/passwd is not among them: the shared curated /etc belongs to the
/// host's root, whom the sandbox does not map, so its files stay
/// unwritable with both walls gone.
const LOCAL_WRITES: &[&str] = &[
    "create a file in /",
    "create a file in a 0777 directory under a read-only mount",
    "write a 0666 file under a read-only mount",
];

const LOCAL: &[Row] = &[
    Row {
        layers: "seccomp",
        succeed: LOCAL_SECCOMP,
        note: "new user namespaces, keyrings, perf, userfaultfd, io_uring, vsock: the filter alone",
    },
    Row {
        layers: "landlock",
        succeed: &[],
        note: "no attempt depends on landlock alone: the read-only mounts refuse the same writes first (EROFS); it is the second wall (row readonly,landlock)",
    },
    Row {
        layers: "readonly",
        succeed: &[],
        note: "no attempt depends on the read-only mounts alone: landlock refuses the same writes (EROFS becomes EACCES)",
    },
    Row {
        layers: "etc",
        succeed: &["read a host /etc file the curated copy leaves out"],
        note: "the curated /etc alone keeps the host's other /etc files out (shadow stays unreadable by permissions)",
    },
    Row {
        layers: "readonly,landlock",
        succeed: LOCAL_WRITES,
        note: "with both walls gone the sandbox's root writes in its own tmpfs; the host's /usr and the shared /etc stay the host root's (EACCES)",
    },
];

const DOCKER_RUNC: &[Row] = &[
    Row {
        layers: "seccomp",
        succeed: &[
            "create a user namespace (clone)",
            "create a user namespace (clone3)",
            "create a user namespace (unshare)",
            "create an AF_VSOCK socket",
            "io_uring_setup",
            "open a perf counter",
        ],
        note: "the daemon's default profile lets these through: namzu's filter alone stops them",
    },
    Row {
        layers: "daemon",
        succeed: &[],
        note: "no attempt depends on the daemon's profile: namzu's filter refuses everything it does",
    },
    Row {
        layers: "seccomp,daemon",
        // With no filter at all, what local's filter alone stops.
        succeed: LOCAL_SECCOMP,
        note: "keyrings and userfaultfd: either filter suffices",
    },
    Row {
        layers: "readonly",
        succeed: &[
            "append to /etc/passwd",
            "create a file in /",
            "create a file under /usr",
            "open a system file for writing (/usr/lib/os-release)",
        ],
        note: "the read-only root alone: a container has no landlock behind it, and the image's files are the command's uid's",
    },
];

/// A boxed future of a trial's body.
type Body = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>>;

type Maker = Box<dyn Fn(&'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Factory, String>>>>>;

async fn table(tier: &str, rows: &[Row], make: Maker) -> Result<(), String> {
    let base = suite::run(&make("").await?, SandboxSpec::default()).await?;
    let mut wrong = Vec::new();
    for row in rows {
        let weak = suite::run(&make(row.layers).await?, weaken(row.layers)).await?;
        // The layer really was removed: the agent (or the daemon) says so.
        for layer in row.layers.split(',') {
            let sign = match layer {
                "daemon" => "unconfined",
                "readonly" if tier.starts_with("docker") => "rootfs=writable",
                _ => "REMOVED",
            };
            if !weak.hardening.iter().any(|(k, v)| format!("{k}={v}").contains(sign)) {
                return Err(format!(
                    "{}: no sign of {layer} removed in {:?}",
                    row.layers, weak.hardening
                ));
            }
        }
        let d = diff(&base, &weak);
        println!(
            "layers removed ({tier}): {:<24} then succeed: {:?} ; blocked differently: {} ; {}",
            row.layers,
            d.succeeded,
            d.moved.len(),
            row.note
        );
        for m in &d.moved {
            println!("    {m}");
        }
        let mut want: Vec<String> = row.succeed.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        let mut got = d.succeeded.clone();
        got.sort();
        if got != want {
            wrong.push(format!("{}: expected {want:?} to succeed, got {got:?}", row.layers));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("\n"))
    }
}

async fn local_layers() -> Result<(), String> {
    let agent = weakened_agent()?;
    let base = namzu::backend::find_agent_binary().map_err(|e| e.to_string())?;
    let make: Maker = Box::new(move |layers| {
        let f = local_factory(if layers.is_empty() { base.clone() } else { agent.clone() });
        Box::pin(async move { Ok(f) })
    });
    table("local", LOCAL, make).await
}

/// `daemon` in a row's layers is not the agent's: it runs the container
/// with `seccomp_profile: unconfined`; `readonly`, with a writable root.
async fn docker_layers() -> Result<(), String> {
    let agent = weakened_agent()?;
    let base = namzu::backend::find_agent_binary().map_err(|e| e.to_string())?;
    let make: Maker = Box::new(move |layers| {
        let agent = if layers.is_empty() { base.clone() } else { agent.clone() };
        Box::pin(async move {
            let has = |l: &str| layers.split(',').any(|x| x == l);
            let opts = DockerOptions {
                seccomp_profile: has("daemon").then(|| "unconfined".to_owned()),
                read_only_rootfs: has("readonly").then_some(false),
                tmpfs_bytes: Some(32 << 20),
                ..Default::default()
            };
            let name = format!("layers-{}", layers.replace(',', "-"));
            Ok(docker::factory(docker::provider_with_agent(&name, agent, opts).await?))
        })
    });
    table("docker-runc", DOCKER_RUNC, make).await
}

/// The privilege probe refuses, by name, a sandbox whose commands would
/// keep a privilege: `want` is the status field it must name.
async fn probe_refuses(f: Factory, want: &str) -> Result<(), String> {
    match f(weaken("probe-bait")).await {
        Err(namzu::Error::PrivilegeProbe { field, value, .. }) if field == want => {
            println!("privilege probe refused: {field} = {value}");
            Ok(())
        }
        Err(e) => Err(format!("refused, but not by the probe naming {want}: {e}")),
        Ok(sb) => {
            let _ = sb.destroy().await;
            Err("the probe let a sandbox with a privilege left in place through".into())
        }
    }
}

async fn local_probe() -> Result<(), String> {
    probe_refuses(local_factory(weakened_agent()?), "CapPrm").await
}

/// Under runc with the daemon's profile removed, the weakened agent
/// installs no filter at all: the probe must see `Seccomp: 0`.
async fn docker_probe() -> Result<(), String> {
    let opts = DockerOptions {
        seccomp_profile: Some("unconfined".into()),
        ..Default::default()
    };
    let p = docker::provider_with_agent("layers-probe", weakened_agent()?, opts).await?;
    let docker = p.docker().clone();
    probe_refuses(docker::factory(p), "Seccomp").await?;
    // Nothing of the refused sandbox is left behind.
    let left = docker
        .list_containers(Some(bollard::container::ListContainersOptions::<String> {
            all: true,
            filters: [("label".to_owned(), vec!["io.namzu.sandbox".to_owned()])].into(),
            ..Default::default()
        }))
        .await
        .map_err(|e| e.to_string())?;
    let ours: Vec<_> = left
        .iter()
        .filter(|c| c.names.iter().flatten().any(|n| n.contains("layers-probe")))
        .collect();
    if ours.is_empty() {
        Ok(())
    } else {
        Err(format!("containers left after the refusal: {ours:?}"))
    }
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    // The weakened agent sits in its own target directory; the egress
    // supervisor it would look for beside itself is the workspace's.
    if std::env::var_os("NAMZU_EGRESS_BIN").is_none() {
        if let Ok(agent) = namzu::backend::find_agent_binary() {
            std::env::set_var("NAMZU_EGRESS_BIN", agent.with_file_name("namzu-egress"));
        }
    }
    let rt = |f: fn() -> Body| {
        move || -> Result<(), Failed> {
            let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
            rt.block_on(f()).map_err(Failed::from)
        }
    };
    // Without a daemon the docker trials are reported ignored, unless
    // NAMZU_REQUIRE_DOCKER=1 (CI) makes that a failure.
    let reachable = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(docker::provider("layers-probe-daemon", DockerOptions::default()))
                .map(drop)
        });
    let docker_trial = |t: Trial| match &reachable {
        Err(why) if !docker::required() => t.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
        _ => t,
    };
    let trials = vec![
        Trial::test("local::each_layer_alone", rt(|| Box::pin(local_layers()))),
        docker_trial(Trial::test(
            "docker-runc::each_layer_alone",
            rt(|| Box::pin(docker_layers())),
        )),
        Trial::test(
            "local::privilege_probe_refuses_a_capable_sandbox",
            rt(|| Box::pin(local_probe())),
        ),
        docker_trial(Trial::test(
            "docker-runc::privilege_probe_refuses_an_unfiltered_sandbox",
            rt(|| Box::pin(docker_probe())),
        )),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
