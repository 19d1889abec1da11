//! `namzu --tier microvm` end to end: image import, `run` with the
//! accelerator said and the base disk's progress line, `create` in one
//! process, `exec`, `cp` and a persistent terminal from others, `ls`,
//! `rm`; `--kernel`/`--accel` refused on other tiers and a missing kernel
//! named. Needs qemu and a kernel (`scripts/microvm-up.sh`, which the test
//! command runs and then requires with `NAMZU_REQUIRE_MICROVM=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

mod common;
use common::*;

fn image_tar() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/images/debian-bookworm.tar")
}

/// Why this machine cannot run the tier, if it cannot.
fn missing() -> Option<String> {
    if std::env::var_os("NAMZU_MICROVM_KERNEL").is_none() {
        return Some("NAMZU_MICROVM_KERNEL is not set (scripts/microvm-up.sh prints it)".into());
    }
    (!image_tar().is_file()).then(|| format!("{} is missing (scripts/images.sh)", image_tar().display()))
}

/// Imports the Debian image as `deb:cli` into the state at `st`.
fn import_image(st: &std::path::Path) {
    let tar = image_tar();
    let o = namzu(st, &["image", "import", tar.to_str().unwrap(), "--name", "deb:cli"]);
    assert!(o.status.success(), "{o:?}");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn a_microvm_is_made_used_from_other_processes_and_removed() {
    let st = tempfile::tempdir().unwrap();
    import_image(st.path());
    // run: the guest's own kernel answers; the choice of accelerator and
    // the base disk's build are said on stderr.
    let o = namzu(
        st.path(),
        &[
            "run",
            "--tier",
            "microvm",
            "--image",
            "deb:cli",
            "--accel",
            "auto",
            "--",
            "sh",
            "-c",
            "uname -r; id -u",
        ],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let host = text(&std::process::Command::new("uname").arg("-r").output().unwrap().stdout);
    assert_ne!(
        out.lines().next(),
        host.lines().next(),
        "the command ran on the host's kernel"
    );
    let err = text(&o.stderr);
    assert!(err.contains("microvm: accel "), "{err}");
    assert!(err.contains("built the base disk of image"), "{err}");
    // create in one process; exec, cp and ls from others.
    let o = namzu(st.path(), &["create", "--tier", "microvm", "--image", "deb:cli"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_owned();
    let o = namzu(
        st.path(),
        &["exec", &id, "--", "sh", "-c", "echo kept > /workspace/s.txt"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = namzu(st.path(), &["exec", &id, "--", "cat", "/workspace/s.txt"]);
    assert_eq!(text(&o.stdout), "kept\n");
    let local = st.path().join("down.txt");
    let o = namzu(st.path(), &["cp", &format!("{id}:s.txt"), local.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&local).unwrap(), "kept\n");
    let ls = text(&namzu(st.path(), &["ls"]).stdout);
    assert!(ls.lines().any(|l| l.contains(&id) && l.contains("microvm")), "{ls}");
    let o = namzu(st.path(), &["rm", &id]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!st.path().join("microvm").join(&id).exists());
    second_process_attaches_to_a_persistent_terminal(st.path(), &["--tier", "microvm", "--image", "deb:cli"]);
}

fn microvm_flags_are_refused_where_they_mean_nothing() {
    let st = tempfile::tempdir().unwrap();
    let o = namzu(st.path(), &["run", "--tier", "local", "--accel", "tcg", "--", "true"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("--kernel and --accel apply to --tier microvm"),
        "{}",
        text(&o.stderr)
    );
    let o = namzu(
        st.path(),
        &["run", "--tier", "microvm", "--accel", "fast", "--", "true"],
    );
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("expected auto, kvm or tcg"),
        "{}",
        text(&o.stderr)
    );
}

fn a_missing_kernel_is_named() {
    let st = tempfile::tempdir().unwrap();
    import_image(st.path());
    let o = namzu(
        st.path(),
        &[
            "run",
            "--tier",
            "microvm",
            "--image",
            "deb:cli",
            "--kernel",
            "/nonexistent/vmlinuz",
            "--",
            "true",
        ],
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("no guest kernel") && err.contains("/nonexistent/vmlinuz"),
        "{err}"
    );
}

fn main() -> std::process::ExitCode {
    use libtest_mimic::{Arguments, Trial};
    let args = Arguments::from_args();
    let unavailable = missing().filter(|_| std::env::var("NAMZU_REQUIRE_MICROVM").as_deref() != Ok("1"));
    let needs_tier = |name: &'static str, f: fn()| {
        let t = Trial::test(name, move || {
            f();
            Ok(())
        });
        match &unavailable {
            Some(why) => t.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
            None => t,
        }
    };
    let trials = vec![
        Trial::test("microvm_flags_are_refused_where_they_mean_nothing", || {
            microvm_flags_are_refused_where_they_mean_nothing();
            Ok(())
        }),
        needs_tier(
            "a_microvm_is_made_used_from_other_processes_and_removed",
            a_microvm_is_made_used_from_other_processes_and_removed,
        ),
        needs_tier("a_missing_kernel_is_named", a_missing_kernel_is_named),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
