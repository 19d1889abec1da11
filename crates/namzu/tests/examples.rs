//! The programs in `examples/` run as a user would run them, and say what
//! they claim to (they are built by `cargo test`; this runs them against
//! the real local tier, and the docker one where the test command brought
//! dockerd up — else it is reported ignored, with the reason).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// `target/<triple>/debug/examples/<name>`, next to this test's `deps/`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples").join(name)
}

fn run(state: &std::path::Path, name: &str, args: &[&str]) -> Output {
    let out = Command::new(example(name))
        .args(args)
        .env("NAMZU_STATE_DIR", state)
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e} (built by `cargo test`?)"));
    assert!(
        out.status.success() || name == "run_command",
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run_command_streams_and_exits_with_the_command_code() {
    let st = tempfile::tempdir().unwrap();
    let o = run(st.path(), "run_command", &["echo one; echo two >&2; exit 5"]);
    assert_eq!(stdout(&o), "one\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "two\n");
    assert_eq!(o.status.code(), Some(5));
}

fn files_writes_lists_and_reads_back() {
    let st = tempfile::tempdir().unwrap();
    let o = stdout(&run(st.path(), "files", &[]));
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(lines[0], "600     15 /workspace/notes/today.txt", "{o}");
    assert_eq!(lines[1], "hello, sandbox");
    assert_eq!(lines[2], "bytes 7..14 of 15: \"sandbox\"");
}

fn a_second_process_reattaches_to_what_the_first_started() {
    let st = tempfile::tempdir().unwrap();
    let started = stdout(&run(st.path(), "detach_reattach", &["start"]));
    let fields: Vec<&str> = started.split_whitespace().collect();
    let [id, execution, offset] = fields[..] else {
        panic!("start printed {started:?}")
    };
    assert_eq!(execution, "build-42");
    // From where the first process stopped reading: the rest, once.
    let rest = stdout(&run(st.path(), "detach_reattach", &["attach", id, execution, offset]));
    assert_eq!(rest, "line 2\nline 3\nline 4\nline 5\nexit 3\n");
    // And from the start, everything.
    let all = stdout(&run(st.path(), "detach_reattach", &["attach", id, execution]));
    assert!(all.starts_with("line 1\nline 2\n"), "{all}");
    run(st.path(), "detach_reattach", &["destroy", id]);
}

fn egress_allowlist_changes_the_policy_live() {
    let st = tempfile::tempdir().unwrap();
    let o = stdout(&run(st.path(), "egress_allowlist", &["pypi.org"]));
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(lines[0], "at start: NoNetwork (0 connections open)");
    assert!(
        lines[1].starts_with("now: Allowlist") && lines[1].contains("pypi.org"),
        "{o}"
    );
    assert!(
        lines[2]
            .to_ascii_lowercase()
            .starts_with("https_proxy=http://127.0.0.1:"),
        "{o}"
    );
}

/// The image the docker example runs: Debian's static busybox with the
/// applets the example calls, imported into the daemon unless it is there
/// (a fresh daemon has no image, and this test must not lean on another
/// test binary having made one first).
const EXAMPLE_IMAGE: &str = "namzu-test/example-busybox:1";

fn ensure_example_image() {
    let there = Command::new("docker")
        .args(["image", "inspect", EXAMPLE_IMAGE])
        .output()
        .unwrap();
    if there.status.success() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in ["sh", "uname", "id", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    std::fs::create_dir(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.path().join("etc/group"), "root:x:0:\n").unwrap();
    let import = format!(
        "tar -C '{}' -c . | docker import - {EXAMPLE_IMAGE}",
        root.path().display()
    );
    let out = Command::new("sh").args(["-c", &import]).output().unwrap();
    assert!(
        out.status.success(),
        "docker import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn docker_runs_a_command_in_a_container() {
    ensure_example_image();
    let st = tempfile::tempdir().unwrap();
    let o = stdout(&run(st.path(), "docker", &[EXAMPLE_IMAGE]));
    assert!(o.starts_with("Linux "), "{o}");
    assert!(o.contains("uid="), "{o}");
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let trial = |name: &'static str, f: fn()| {
        libtest_mimic::Trial::test(name, move || {
            std::panic::catch_unwind(f).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default()
                    .into()
            })
        })
    };
    let docker = std::env::var_os("NAMZU_REQUIRE_DOCKER").is_some();
    let trials = vec![
        trial(
            "run_command_streams_and_exits_with_the_command_code",
            run_command_streams_and_exits_with_the_command_code,
        ),
        trial("files_writes_lists_and_reads_back", files_writes_lists_and_reads_back),
        trial(
            "a_second_process_reattaches_to_what_the_first_started",
            a_second_process_reattaches_to_what_the_first_started,
        ),
        trial(
            "egress_allowlist_changes_the_policy_live",
            egress_allowlist_changes_the_policy_live,
        ),
        trial(
            "docker_runs_a_command_in_a_container",
            docker_runs_a_command_in_a_container,
        )
        .with_ignored_flag(!docker)
        .with_kind(if docker {
            ""
        } else {
            "unavailable: dockerd is brought up by scripts/test.sh (NAMZU_REQUIRE_DOCKER)"
        }),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
