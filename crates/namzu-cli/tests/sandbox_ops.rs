//! `namzu fs`, `quiesce`, `flush` and `kill` on a live local sandbox, end
//! to end through the binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn create(st: &std::path::Path) -> String {
    let o = namzu(st, &["create"]);
    assert!(o.status.success(), "{}", err(&o));
    out(&o).trim().to_owned()
}

#[test]
fn fs_commands_change_and_show_files_inside_a_sandbox() {
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let at = |p: &str| format!("{id}:{p}");

    let o = namzu(st.path(), &["fs", "mkdir", &at("/workspace/a/b")]);
    assert_eq!(o.status.code(), Some(125), "a missing parent without -p: {}", err(&o));
    assert!(err(&o).contains("no such file"), "{}", err(&o));
    assert!(namzu(st.path(), &["fs", "mkdir", "-p", &at("/workspace/a/b")])
        .status
        .success());
    let o = namzu(st.path(), &["fs", "mkdir", &at("/workspace/a/b")]);
    assert!(err(&o).contains("already exists"), "{}", err(&o));

    let o = namzu(
        st.path(),
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "printf 12345 > a/b/f.txt; ln -s f.txt a/b/l",
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = namzu(st.path(), &["fs", "ls", &at("/workspace/a/b")]);
    assert!(o.status.success(), "{}", err(&o));
    let rows: Vec<Vec<String>> = out(&o)
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{}", out(&o));
    assert!(
        rows[0][0].starts_with('-') && rows[0][1] == "5" && rows[0][3] == "f.txt",
        "{rows:?}"
    );
    assert!(
        rows[1][0].starts_with('l') && rows[1][3] == "l" && rows[1][5] == "f.txt",
        "{rows:?}"
    );
    let o = namzu(st.path(), &["fs", "stat", &at("/workspace/a")]);
    assert!(out(&o).starts_with("d0755 "), "{}", out(&o));

    assert!(namzu(
        st.path(),
        &["fs", "mv", &at("/workspace/a/b/f.txt"), &at("/workspace/g.txt")]
    )
    .status
    .success());
    let o = namzu(st.path(), &["exec", &id, "--", "cat", "g.txt"]);
    assert_eq!(out(&o), "12345");
    let o = namzu(
        st.path(),
        &["fs", "mv", &at("/workspace/g.txt"), "sb-other:/workspace/g.txt"],
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(err(&o).contains("different sandboxes"), "{}", err(&o));

    let o = namzu(st.path(), &["fs", "rm", &at("/workspace/a")]);
    assert!(
        err(&o).contains("not empty"),
        "rm without -r of a full directory: {}",
        err(&o)
    );
    assert!(namzu(st.path(), &["fs", "rm", "-r", &at("/workspace/a")])
        .status
        .success());
    let o = namzu(st.path(), &["fs", "stat", &at("/workspace/a")]);
    assert!(err(&o).contains("no such file"), "{}", err(&o));

    let o = namzu(st.path(), &["fs", "ls", &at("/workspace/../../etc")]);
    assert_eq!(o.status.code(), Some(125));
    let o = namzu(st.path(), &["fs", "ls", "no-colon"]);
    assert!(err(&o).contains("expected ID:PATH"), "{}", err(&o));
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

/// `namzu kill` sends SIGKILL unless told otherwise, as `docker kill`
/// does: a session that ignores SIGTERM still dies.
#[test]
fn kill_defaults_to_sigkill() {
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let script = "trap '' TERM; sleep 300";
    let o = namzu(
        st.path(),
        &["exec", "--detach", "--id", "stubborn", &id, "--", "sh", "-c", script],
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = namzu(st.path(), &["kill", &id, "stubborn", "--signal", "TERM"]);
    assert!(o.status.success(), "{}", err(&o));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let list = out(&namzu(st.path(), &["sessions", &id]));
    assert!(
        list.lines().any(|l| l.starts_with("stubborn") && l.contains("running")),
        "the control: SIGTERM is ignored, {list}"
    );
    let o = namzu(st.path(), &["kill", &id, "stubborn"]);
    assert_eq!(out(&o).trim(), "stubborn exited(137)", "{}", err(&o));
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

#[test]
fn quiesce_stops_every_process_and_flush_reports_its_time() {
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    for name in ["one", "two"] {
        let o = namzu(
            st.path(),
            &["exec", "--detach", "--id", name, &id, "--", "sleep", "300"],
        );
        assert!(o.status.success(), "{}", err(&o));
    }
    let o = namzu(st.path(), &["quiesce", &id, "--grace", "1"]);
    assert!(o.status.success(), "{}", err(&o));
    let sleeps = out(&o).lines().filter(|l| l.contains("sleep")).count();
    assert!(sleeps >= 2, "both sleeps are reported stopped: {}", out(&o));
    let list = out(&namzu(st.path(), &["sessions", &id]));
    assert!(!list.contains("running"), "nothing runs after quiesce: {list}");
    let o = namzu(st.path(), &["exec", &id, "--", "true"]);
    assert!(
        o.status.success(),
        "the sandbox still serves after quiesce: {}",
        err(&o)
    );

    let o = namzu(st.path(), &["flush", &id]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).starts_with("flushed in ") && out(&o).trim_end().ends_with(" ms"),
        "{}",
        out(&o)
    );
    let o = namzu(st.path(), &["flush", &id, "--timeout=-1"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(err(&o).contains("--timeout"), "{}", err(&o));
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

/// `namzu watch` prints a line per change once its watches are in place
/// (the stderr line says when), beneath subdirectories with -r, and exits
/// after --count events.
#[test]
fn watch_prints_each_change_under_a_directory() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    assert!(
        namzu(st.path(), &["fs", "mkdir", "-p", &format!("{id}:/workspace/w/sub")])
            .status
            .success()
    );
    let mut w = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["watch", "-r", "--count", "2", &id, "/workspace/w"])
        .env("NAMZU_STATE_DIR", st.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut errs = BufReader::new(w.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("watching ") {
        line.clear();
        assert!(errs.read_line(&mut line).unwrap() > 0, "watch ended before watching");
    }
    // A directory first, then a file beneath the watched subdirectory.
    let script = "mkdir /workspace/w/d && : > /workspace/w/sub/f";
    let o = namzu(st.path(), &["exec", &id, "--", "sh", "-c", script]);
    assert!(o.status.success(), "{}", err(&o));
    let o = w.wait_with_output().unwrap();
    assert!(o.status.success());
    assert_eq!(out(&o), "create d/\ncreate sub/f\n");
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

/// `namzu pause` stops a sandbox's processes in place (the pids on
/// stdout), an exec is then refused naming the pause, and `namzu resume`
/// continues the same processes.
#[test]
fn pause_refuses_new_commands_until_resume() {
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let o = namzu(
        st.path(),
        &["exec", "--detach", "--id", "nap", &id, "--", "sleep", "300"],
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = namzu(st.path(), &["pause", &id]);
    assert!(o.status.success(), "{}", err(&o));
    let stopped: Vec<u32> = out(&o).lines().map(|l| l.trim().parse().unwrap()).collect();
    assert!(!stopped.is_empty(), "{}", err(&o));
    let o = namzu(st.path(), &["exec", &id, "--", "true"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("paused"), "{}", err(&o));
    let o = namzu(st.path(), &["resume", &id]);
    assert!(o.status.success(), "{}", err(&o));
    let mut continued: Vec<u32> = out(&o).lines().map(|l| l.trim().parse().unwrap()).collect();
    continued.sort_unstable();
    let mut want = stopped;
    want.sort_unstable();
    assert_eq!(continued, want);
    assert!(namzu(st.path(), &["exec", &id, "--", "true"]).status.success());
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

#[test]
fn suspend_keeps_the_files_across_processes_and_resume_starts_it_again() {
    let st = tempfile::tempdir().unwrap();
    // A disk limit where loop devices can be made (root), as CI runs.
    let root = nix::unistd::geteuid().is_root();
    let o = if root {
        namzu(st.path(), &["create", "--disk", "64m"])
    } else {
        namzu(st.path(), &["create"])
    };
    assert!(o.status.success(), "{}", err(&o));
    let id = out(&o).trim().to_owned();
    let o = namzu(
        st.path(),
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo a > /workspace/a; echo b > /tmp/b; df -k /workspace | tail -1",
        ],
    );
    assert!(o.status.success(), "{}", err(&o));
    if root {
        let size_kib: u64 = out(&o).split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(size_kib <= 64 << 10, "a {size_kib} KiB workspace for a 64 MiB disk");
    }
    let o = namzu(st.path(), &["suspend", &id]);
    assert!(o.status.success(), "{}", err(&o));
    let o = namzu(st.path(), &["ls"]);
    let line = out(&o)
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_default()
        .to_owned();
    assert!(line.contains("suspended"), "{}", out(&o));
    let o = namzu(st.path(), &["exec", &id, "--", "true"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("suspended"), "{}", err(&o));
    let o = namzu(st.path(), &["resume", &id]);
    assert!(o.status.success(), "{}", err(&o));
    let o = namzu(st.path(), &["exec", &id, "--", "cat", "/workspace/a", "/tmp/b"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), "a\nb\n");
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}
