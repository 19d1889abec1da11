//! The `namzu` binary on the docker tier, runc and runsc. Needs a daemon
//! (`scripts/docker-up.sh`); without one every trial is reported ignored,
//! unless `NAMZU_REQUIRE_DOCKER=1` makes that a failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use libtest_mimic::{Arguments, Trial};

mod common;
use common::*;

/// run with either runtime, create and exec, --runtime refused elsewhere.
fn runs_commands_with_either_runtime(image: &str) {
    let st = tempfile::tempdir().unwrap();
    for runtime in ["runc", "runsc"] {
        let o = namzu(
            st.path(),
            &[
                "run",
                "--tier",
                "docker",
                "--image",
                image,
                "--runtime",
                runtime,
                "--memory",
                "128m",
                "--",
                "sh",
                "-c",
                "echo out-$((1+1)); echo err >&2; exit 3",
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(3),
            "{runtime}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout), "out-2\n", "{runtime}");
        assert_eq!(stderr_lines(&o), ["err"], "{runtime}");
    }
    let id = String::from_utf8_lossy(&namzu(st.path(), &["create", "--tier", "docker", "--image", image]).stdout)
        .trim()
        .to_owned();
    assert!(id.starts_with("sb-"), "{id}");
    let o = namzu(st.path(), &["exec", &id, "--", "cat", "/proc/self/status"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("CapEff:\t0000000000000000"));
    let ls = String::from_utf8_lossy(&namzu(st.path(), &["ls"]).stdout).into_owned();
    assert!(
        ls.lines()
            .any(|l| l.starts_with(&id) && l.contains("docker") && l.contains("up")),
        "{ls}"
    );
    assert!(namzu(st.path(), &["rm", &id]).status.success());
    let o = namzu(
        st.path(),
        &["run", "--tier", "local", "--runtime", "runsc", "--", "true"],
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--runtime applies to --tier docker"));
    let o = namzu(
        st.path(),
        &[
            "run",
            "--tier",
            "docker",
            "--image",
            image,
            "--runtime",
            "nope",
            "--",
            "true",
        ],
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("\"nope\" is not registered"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `gc --tier docker` removes a sandbox whose container died and keeps a
/// live one.
fn gc_removes_a_dead_docker_sandbox(image: &str) {
    let st = tempfile::tempdir().unwrap();
    let create = || {
        let o = namzu(st.path(), &["create", "--tier", "docker", "--image", image]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let (live, dead) = (create(), create());
    let k = std::process::Command::new("docker")
        .args(["kill", &format!("namzu-{dead}")])
        .output()
        .unwrap();
    assert!(
        k.status.success(),
        "docker kill: {}",
        String::from_utf8_lossy(&k.stderr)
    );
    let o = namzu(st.path(), &["gc", "--tier", "docker"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Also any container whose host state is gone (an earlier run's):
    // never the live one.
    let removed: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect();
    assert!(removed.contains(&dead) && !removed.contains(&live), "{removed:?}");
    let gone = std::process::Command::new("docker")
        .args(["inspect", &format!("namzu-{dead}")])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the dead sandbox's container is still there");
    let ls = String::from_utf8_lossy(&namzu(st.path(), &["ls"]).stdout).into_owned();
    assert!(!ls.contains(&dead) && ls.contains(&live), "{ls}");
    let o = namzu(st.path(), &["exec", &live, "--", "true"]);
    assert!(o.status.success(), "gc touched a live sandbox");
    assert!(namzu(st.path(), &["rm", &live]).status.success());
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let image: Result<&'static str, String> = rt.block_on(async {
        let docker = bollard::Docker::connect_with_defaults()
            .map_err(|e| e.to_string())?
            .negotiate_version()
            .await
            .map_err(|e| e.to_string())?;
        namzu_conformance::docker::ensure_test_image(&docker).await
    });
    drop(rt);
    if let Err(why) = &image {
        if namzu_conformance::docker::required() {
            eprintln!("docker_cli: {why}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let mut trials = Vec::new();
    let mut add = |name: String, run: Box<dyn FnOnce(&'static str) + Send>| {
        let trial = match &image {
            Ok(img) => {
                let img: &'static str = img;
                Trial::test(name, move || {
                    run(img);
                    Ok(())
                })
            }
            Err(why) => Trial::test(name, || Ok(()))
                .with_ignored_flag(true)
                .with_kind(format!("unavailable: {why}")),
        };
        trials.push(trial);
    };
    add(
        "runs_commands_with_either_runtime".into(),
        Box::new(runs_commands_with_either_runtime),
    );
    add(
        "gc_removes_a_dead_docker_sandbox".into(),
        Box::new(gc_removes_a_dead_docker_sandbox),
    );
    for runtime in ["runc", "runsc"] {
        add(
            format!("{runtime}::a_second_process_attaches_to_a_persistent_terminal_a_killed_one_left"),
            Box::new(move |img| {
                let st = tempfile::tempdir().unwrap();
                let tier = ["--tier", "docker", "--image", img, "--runtime", runtime];
                second_process_attaches_to_a_persistent_terminal(st.path(), &tier);
            }),
        );
        add(
            format!("{runtime}::a_second_process_reattaches_to_a_named_execution_a_killed_one_left"),
            Box::new(move |img| {
                let st = tempfile::tempdir().unwrap();
                let tier = ["--tier", "docker", "--image", img, "--runtime", runtime];
                second_process_reattaches_to_a_named_execution(st.path(), &tier);
            }),
        );
    }
    libtest_mimic::run(&args, trials).exit_code()
}
