//! What the CLI test targets share: running the binary, and the
//! second-host-process scenarios every tier runs.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub fn namzu(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(args)
        .env("NAMZU_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Creates a default sandbox; its id.
pub fn create(state: &Path) -> String {
    String::from_utf8_lossy(&namzu(state, &["create"]).stdout)
        .trim()
        .to_owned()
}

pub fn stderr_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.contains("isolates NOTHING"))
        .map(String::from)
        .collect()
}

/// A host process attaches to a persistent terminal that a killed one left;
/// `tier` is the `create` flags.
pub fn second_process_attaches_to_a_persistent_terminal(st: &Path, tier: &[&str]) {
    use std::io::{Read, Write};
    let create: Vec<&str> = std::iter::once("create").chain(tier.iter().copied()).collect();
    let tier = tier.join(" ");
    let id = String::from_utf8_lossy(&namzu(st, &create).stdout).trim().to_owned();
    // Host process A opens the terminal, types, reads, and is killed.
    let mut a = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["shell", &id, "--session", "pt", "--", "sh"])
        .env("NAMZU_STATE_DIR", st)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin_a = a.stdin.take().unwrap();
    stdin_a.write_all(b"echo first-$((40+2))\n").unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    let mut out_a = a.stdout.take().unwrap();
    while !String::from_utf8_lossy(&seen).contains("first-42") {
        let n = out_a.read(&mut buf).unwrap();
        assert!(n > 0, "A's terminal ended early: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    a.kill().unwrap();
    let _ = a.wait();

    // Host process B attaches: the shell is still there, A's output is
    // replayed, and the exit code comes through.
    let mut b = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["attach", &id, "pt"])
        .env("NAMZU_STATE_DIR", st)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    b.stdin
        .take()
        .unwrap()
        .write_all(b"echo second-$((3*3)); exit 6\n")
        .unwrap();
    let o = b.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(6),
        "{tier}: {text} / {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("first-42"), "A's output was not replayed: {text}");
    assert!(text.contains("second-9"), "{text}");
    drop(stdin_a);
    assert!(namzu(st, &["rm", &id]).status.success());
}

/// A host process runs a named command and is killed mid-command; a second
/// one resumes from the byte it reached and a third reads it all again.
/// `tier` is the `create` flags.
pub fn second_process_reattaches_to_a_named_execution(st: &Path, tier: &[&str]) {
    use std::io::Read;
    let create: Vec<&str> = std::iter::once("create").chain(tier.iter().copied()).collect();
    let tier = tier.join(" ");
    let id = String::from_utf8_lossy(&namzu(st, &create).stdout).trim().to_owned();
    let script = "i=1; while [ $i -le 400 ]; do echo line$i; i=$((i+1)); sleep 0.002; done; exit 4";
    // Host process A runs the named command in the foreground and is
    // killed mid-command.
    let mut a = Command::new(env!("CARGO_BIN_EXE_namzu"))
        .args(["exec", &id, "--id", "job", "--", "sh", "-c", script])
        .env("NAMZU_STATE_DIR", st)
        .stdin(Stdio::null())
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
    let want: String = (1..=400).map(|i| format!("line{i}\n")).collect();
    assert!(
        first.len() < want.len(),
        "{tier}: A saw the whole run; the test proves nothing"
    );

    // Host process B resumes from the byte A reached: the command went
    // on without A, and nothing is lost or repeated.
    let b = namzu(
        st,
        &["logs", &id, "job", "--follow", "--from", &first.len().to_string()],
    );
    assert_eq!(
        b.status.code(),
        Some(4),
        "{tier}: {}",
        String::from_utf8_lossy(&b.stderr)
    );
    let mut all = first;
    all.extend_from_slice(&b.stdout);
    assert_eq!(String::from_utf8_lossy(&all), want, "{tier}: bytes lost or repeated");
    // Host process C reads it all again, and gets the same result.
    let c = namzu(st, &["logs", &id, "job", "--follow"]);
    assert_eq!(c.status.code(), Some(4), "{tier}");
    assert_eq!(String::from_utf8_lossy(&c.stdout), want, "{tier}");
    let o = namzu(st, &["cancel", &id, "job"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "job had already exited",
        "{tier}"
    );
    assert!(namzu(st, &["rm", &id]).status.success());
}
