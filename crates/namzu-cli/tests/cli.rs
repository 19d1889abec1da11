//! The `namzu` binary, end to end, on the host tier.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::*;

#[test]
fn run_streams_output_and_exits_with_the_command_code() {
    let st = tempfile::tempdir().unwrap();
    for tier in ["local", "host"] {
        let script = "echo out$A; echo err >&2; exit 7";
        let o = namzu(
            st.path(),
            &["run", "--tier", tier, "--env", "A=1", "--", "sh", "-c", script],
        );
        assert_eq!(o.status.code(), Some(7), "{tier}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "out1\n", "{tier}");
        assert_eq!(stderr_lines(&o), ["err"], "{tier}");
        let warned = String::from_utf8_lossy(&o.stderr).contains("isolates NOTHING");
        assert_eq!(warned, tier == "host", "only the host tier warns ({tier})");
    }
    // The sandbox is gone afterwards.
    let ls = namzu(st.path(), &["ls"]);
    assert_eq!(
        String::from_utf8_lossy(&ls.stdout).lines().count(),
        1,
        "{}",
        String::from_utf8_lossy(&ls.stdout)
    );
}

#[test]
fn killed_commands_exit_128_plus_signal_and_timeouts_kill() {
    let st = tempfile::tempdir().unwrap();
    let o = namzu(st.path(), &["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.code(), Some(143));
    let o = namzu(st.path(), &["run", "--timeout", "0.3", "--", "sleep", "30"]);
    assert_eq!(o.status.code(), Some(137));
    assert!(stderr_lines(&o).iter().any(|l| l.contains("timed out")));
}

#[test]
fn sandboxes_outlive_the_cli_and_files_copy_both_ways() {
    let st = tempfile::tempdir().unwrap();
    let o = namzu(st.path(), &["create"]);
    assert!(o.status.success(), "{o:?}");
    let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert!(id.starts_with("sb-"));
    let o = namzu(st.path(), &["exec", &id, "--", "sh", "-c", "echo kept > state.txt"]);
    assert!(o.status.success());
    // A later process sees the same sandbox.
    let o = namzu(st.path(), &["exec", &id, "--", "cat", "state.txt"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "kept\n");

    let local = st.path().join("up.bin");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    let o = namzu(
        st.path(),
        &["cp", local.to_str().unwrap(), &format!("{id}:in/../up.bin")],
    );
    assert!(!o.status.success(), "a path with .. must be refused");
    let o = namzu(st.path(), &["cp", local.to_str().unwrap(), &format!("{id}:up.bin")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back = st.path().join("back.bin");
    let o = namzu(st.path(), &["cp", &format!("{id}:up.bin"), back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&back).unwrap(), data);

    let ls = String::from_utf8_lossy(&namzu(st.path(), &["ls"]).stdout).into_owned();
    assert!(ls.lines().any(|l| l.starts_with(&id) && l.contains(" up ")), "{ls}");
    let o = namzu(st.path(), &["rm", &id]);
    assert!(o.status.success());
    let o = namzu(st.path(), &["exec", &id, "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert_eq!(stderr_lines(&o), [format!("namzu: no sandbox with id {id}")]);
}

#[test]
fn dead_sandbox_unknown_id_and_bad_flags_give_one_line() {
    let st = tempfile::tempdir().unwrap();
    for tier in ["local", "host"] {
        dead_sandbox_is_reported(st.path(), tier);
    }
    let o = namzu(st.path(), &["exec", "sb-deadbeef", "--", "true"]);
    assert_eq!(stderr_lines(&o), ["namzu: no sandbox with id sb-deadbeef"]);
    let o = namzu(st.path(), &["run", "--bogus", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr_lines(&o).len(), 1, "{:?}", stderr_lines(&o));
    let o = namzu(st.path(), &["run", "--env", "NOEQUALS", "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    let o = namzu(st.path(), &["run", "--tier", "docker", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert_eq!(stderr_lines(&o).len(), 1);
}

/// Kills a sandbox's anchor process behind namzu's back, then checks that
/// exec says so in one line and rm still cleans up.
fn dead_sandbox_is_reported(st: &Path, tier: &str) {
    let id = String::from_utf8_lossy(&namzu(st, &["create", "--tier", tier]).stdout)
        .trim()
        .to_owned();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(st.join(tier).join(&id).join("meta.json")).unwrap()).unwrap();
    let pid = meta["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let o = namzu(st, &["exec", &id, "--", "true"]);
    assert_eq!(o.status.code(), Some(125), "{tier}");
    assert_eq!(
        stderr_lines(&o),
        [format!("namzu: sandbox {id} is not running (its agent is gone)")],
        "{tier}"
    );
    // An operator's process that merely names the sandbox's directory
    // (audit item 14): not the sandbox's, so rm must leave it alone.
    let dir = st.join(tier).join(&id).display().to_string();
    let mut operator = std::process::Command::new("tail")
        .args(["-f", &format!("{dir}/agent.log")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(namzu(st, &["rm", &id]).status.success(), "rm of a dead {tier} sandbox");
    assert!(!st.join(tier).join(&id).exists(), "rm left the {tier} state behind");
    assert!(
        operator.try_wait().unwrap().is_none(),
        "rm killed an operator's tail -f of the {tier} sandbox's log"
    );
    let _ = operator.kill();
    let _ = operator.wait();
    // Nor a process of the sandbox's: it outlived its anchor, not its
    // removal (on local its init, a fork of the launcher, names the dir).
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir))
        .collect();
    assert!(left.is_empty(), "rm of a dead {tier} sandbox left {left:?}");
}

#[test]
fn gc_removes_dead_sandboxes_and_keeps_live_ones() {
    let st = tempfile::tempdir().unwrap();
    let create = |tier| {
        String::from_utf8_lossy(&namzu(st.path(), &["create", "--tier", tier]).stdout)
            .trim()
            .to_owned()
    };
    let (live, dead) = (create("local"), create("local"));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(st.path().join("local").join(&dead).join("meta.json")).unwrap()).unwrap();
    let pid = meta["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let o = namzu(st.path(), &["gc"]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), dead);
    assert!(!st.path().join("local").join(&dead).exists());
    let o = namzu(st.path(), &["exec", &live, "--", "true"]);
    assert!(o.status.success(), "gc touched a live sandbox");
    if nix::unistd::geteuid().is_root() {
        // Claims are the numbered files (beside them: the claims' lock).
        let claims = std::fs::read_dir(st.path().join("local/.uids"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count();
        assert_eq!(claims, 1, "the dead sandbox's id range was not released");
    }
    assert!(namzu(st.path(), &["rm", &live]).status.success());
}

#[test]
fn piped_stdin_reaches_the_command() {
    let st = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["run", "--", "wc", "-c"])
        .env("NAMZU_STATE_DIR", st.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&vec![b'z'; 100_000]).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "100000");
}

#[test]
fn port_forward_reaches_a_server_inside_the_sandbox() {
    use std::io::{BufRead, Read, Write};
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let escape = Path::new(env!("CARGO_BIN_EXE_namzu")).with_file_name("namzu-escape");
    assert!(
        namzu(st.path(), &["cp", escape.to_str().unwrap(), &format!("{id}:escape")])
            .status
            .success()
    );
    assert!(namzu(st.path(), &["exec", &id, "--", "chmod", "755", "escape"])
        .status
        .success());
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_namzu"))
            .args(args)
            .env("NAMZU_STATE_DIR", st.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut server = spawn(&["exec", &id, "--", "./escape", "--echo-server", "7300"]);
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "listening");
    let mut fwd = spawn(&["port-forward", &id, "0:7300"]);
    let mut line = String::new();
    std::io::BufReader::new(fwd.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.split_whitespace().nth(1).unwrap().to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"through the tunnel").unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = String::new();
    conn.read_to_string(&mut back).unwrap();
    assert_eq!(back, "through the tunnel");
    let _ = fwd.kill();
    let _ = server.kill();
    let _ = fwd.wait();
    let _ = server.wait();
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

#[test]
fn shell_runs_a_terminal_and_exits_with_its_code() {
    use std::io::Write;
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["shell", &id, "--", "sh"])
        .env("NAMZU_STATE_DIR", st.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo hi-$((2+3)); exit 3\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("hi-5"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

/// Input that ends after the terminal has exited must not cost its output or
/// its exit code. This process holds back from reading until the shell has
/// printed more than a pipe holds and exited, so the CLI is still draining
/// output when it sees the end of its input and finds the call over.
#[test]
fn a_terminal_whose_input_ends_after_its_exit_keeps_its_output_and_code() {
    use std::io::Read;
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    for _ in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_namzu"))
            .args([
                "shell",
                &id,
                "--",
                "sh",
                "-c",
                "head -c 300000 /dev/zero | tr '\\0' x; exit 3",
            ])
            .env("NAMZU_STATE_DIR", st.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Ordering, not a timing claim: by then the shell has exited and
        // the CLI sits blocked on a full stdout pipe.
        std::thread::sleep(std::time::Duration::from_millis(1500));
        drop(child.stdin.take());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut out = Vec::new();
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(out.iter().filter(|&&b| b == b'x').count(), 300_000);
    }
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

#[test]
fn a_second_process_resumes_a_detached_log_where_a_killed_one_stopped() {
    use std::io::Read;
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let script = "i=1; while [ $i -le 400 ]; do echo line$i; i=$((i+1)); sleep 0.002; done; exit 4";
    let o = namzu(
        st.path(),
        &["exec", "--detach", "--id", "job", &id, "--", "sh", "-c", script],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "job");

    // Host process A follows the log and is killed mid-command.
    let mut a = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["logs", &id, "job", "--follow"])
        .env("NAMZU_STATE_DIR", st.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = vec![0u8; 600];
    a.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    a.kill().unwrap();
    let mut rest_of_a = Vec::new();
    let _ = a.stdout.take().unwrap().read_to_end(&mut rest_of_a);
    let _ = a.wait();
    first.extend_from_slice(&rest_of_a);
    let got_a = first.len();

    // Host process B resumes from the byte A reached, to the end.
    let b = namzu(
        st.path(),
        &["logs", &id, "job", "--follow", "--from", &got_a.to_string()],
    );
    assert_eq!(
        b.status.code(),
        Some(4),
        "the command's exit code comes through: {}",
        String::from_utf8_lossy(&b.stderr)
    );
    let mut all = first;
    all.extend_from_slice(&b.stdout);
    let want: String = (1..=400).map(|i| format!("line{i}\n")).collect();
    assert_eq!(
        String::from_utf8_lossy(&all),
        want,
        "bytes lost or repeated between the two readers"
    );

    let list = String::from_utf8_lossy(&namzu(st.path(), &["sessions", &id]).stdout).into_owned();
    assert!(
        list.lines().any(|l| l.starts_with("job") && l.contains("exited(4)")),
        "{list}"
    );
    let o = namzu(
        st.path(),
        &["exec", "--detach", "--id", "svc", &id, "--", "sleep", "300"],
    );
    assert!(o.status.success());
    let o = namzu(st.path(), &["kill", &id, "svc", "--signal", "KILL"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "svc exited(137)");
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

#[test]
fn a_second_process_attaches_to_a_persistent_terminal_a_killed_one_left() {
    let st = tempfile::tempdir().unwrap();
    for tier in [["--tier", "local"], ["--tier", "host"]] {
        second_process_attaches_to_a_persistent_terminal(st.path(), &tier);
    }
}

#[test]
fn a_second_process_reattaches_to_a_named_execution_a_killed_one_left() {
    let st = tempfile::tempdir().unwrap();
    for tier in [["--tier", "local"], ["--tier", "host"]] {
        second_process_reattaches_to_a_named_execution(st.path(), &tier);
    }
}

/// Starts `namzu ARGS` in the foreground and waits for the first line of
/// its output, which must be `started`.
fn spawn_started(st: &Path, args: &[&str]) -> std::process::Child {
    use std::io::BufRead;
    let mut fg = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(args)
        .env("NAMZU_STATE_DIR", st)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(fg.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "started");
    fg
}

/// Ctrl-C on a foreground named execution cancels it inside the sandbox
/// (the name only makes it survive this process dying, not an interrupt).
#[test]
fn ctrl_c_cancels_a_foreground_named_execution() {
    let st = tempfile::tempdir().unwrap();
    let id = create(st.path());
    let mut fg = spawn_started(
        st.path(),
        &[
            "exec",
            &id,
            "--id",
            "job",
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 271.8",
        ],
    );
    let running = || {
        let o = namzu(
            st.path(),
            &[
                "exec",
                &id,
                "--",
                "sh",
                "-c",
                "grep -l '271[.]8' /proc/[0-9]*/cmdline 2>/dev/null | wc -l",
            ],
        );
        String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().unwrap_or(99)
    };
    // The pattern does not match its own text: only the sleep counts.
    assert_eq!(running(), 1, "the command is not running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(fg.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = fg.wait().unwrap();
    // The CLI exits with the command's code: killed by the cancel.
    assert!(matches!(status.code(), Some(137 | 143)), "{status:?}");
    let mut left = running();
    for _ in 0..50 {
        if left == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = running();
    }
    assert_eq!(left, 0, "the named execution outlived Ctrl-C");
    assert!(namzu(st.path(), &["rm", &id]).status.success());
}

/// Host pids whose command line is exactly `cmd` (NUL-separated).
fn host_pids(cmd: &[u8]) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmd))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `run` with nothing allowed out runs in a sandbox of its own with no
/// agent: Ctrl-C kills everything the command started, detached or not,
/// and the sandbox leaves nothing behind in the state directory.
#[test]
fn ctrl_c_ends_a_run_and_leaves_nothing_behind() {
    let st = tempfile::tempdir().unwrap();
    let mut fg = spawn_started(
        st.path(),
        &[
            "run",
            "--",
            "sh",
            "-c",
            "setsid sleep 314.15 >/dev/null 2>&1 </dev/null & echo started; exec sleep 271.9",
        ],
    );
    let (fg_cmd, bg_cmd) = (b"sleep\x00271.9\x00", b"sleep\x00314.15\x00");
    for _ in 0..100 {
        if host_pids(bg_cmd).len() == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!((host_pids(fg_cmd).len(), host_pids(bg_cmd).len()), (1, 1));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(fg.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = fg.wait().unwrap();
    assert_eq!(status.code(), Some(137), "{status:?}");
    // Gone when the CLI has returned: everything the command started.
    assert!(host_pids(fg_cmd).is_empty() && host_pids(bg_cmd).is_empty());
    // Its directory and id range go right after (removed by a process
    // of their own while the kernel tears the namespaces down).
    let sandboxes = || {
        std::fs::read_dir(st.path().join("local"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sb-"))
            .count()
    };
    for _ in 0..250 {
        if sandboxes() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(sandboxes(), 0, "the run left its sandbox directory behind");
}

/// `run` takes a sandbox with an agent exactly when something may leave:
/// only then does a proxy serve inside (and its variables say where).
#[test]
fn run_serves_a_proxy_only_where_something_may_leave() {
    let st = tempfile::tempdir().unwrap();
    let script = "echo \"[$HTTPS_PROXY]\"";
    let o = namzu(st.path(), &["run", "--", "sh", "-c", script]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[]\n", "{o:?}");
    let o = namzu(st.path(), &["run", "--network", "deny", "--", "sh", "-c", script]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[http://127.0.0.1:3128]\n", "{o:?}");
}

/// `image import` of a `docker save` tarball, `image ls` showing it, and a
/// sandbox run from it.
#[test]
fn image_import_ls_and_run() {
    let st = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let escape = Path::new(env!("CARGO_BIN_EXE_namzu")).with_file_name("namzu-escape");
    std::fs::create_dir_all(w.join("root/bin")).unwrap();
    std::fs::copy(&escape, w.join("root/bin/escape")).unwrap();
    std::fs::create_dir_all(w.join("l1")).unwrap();
    let tar = |dir: &Path, out: &Path, what: &[&str]| {
        let s = Command::new("tar")
            .arg("-C")
            .arg(dir)
            .arg("-cf")
            .arg(out)
            .args(what)
            .status()
            .unwrap();
        assert!(s.success());
    };
    tar(&w.join("root"), &w.join("l1/layer.tar"), &["bin"]);
    std::fs::write(
        w.join("config.json"),
        br#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#,
    )
    .unwrap();
    std::fs::write(
        w.join("manifest.json"),
        br#"[{"Config":"config.json","RepoTags":["cli/escape:1"],"Layers":["l1/layer.tar"]}]"#,
    )
    .unwrap();
    tar(w, &w.join("image.tar"), &["manifest.json", "config.json", "l1"]);
    let o = namzu(st.path(), &["image", "import", w.join("image.tar").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ls = String::from_utf8_lossy(&namzu(st.path(), &["image", "ls"]).stdout).into_owned();
    let row = ls.lines().find(|l| l.contains("cli/escape:1"));
    assert!(row.is_some_and(|r| r.contains("sha256:")), "image ls: {ls}");
    let o = namzu(
        st.path(),
        &["run", "--image", "cli/escape:1", "--", "/bin/escape", "--report-caps"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "CapEff: 0000000000000000");
    // Nothing of the host's /usr in the image's root.
    let o = namzu(st.path(), &["run", "--image", "cli/escape:1", "--", "/usr/bin/true"]);
    assert!(!o.status.success(), "the host's /usr is visible in an image sandbox");
}
