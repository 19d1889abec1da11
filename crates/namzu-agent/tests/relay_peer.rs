//! Audit item 8: a relay sends nothing to a socket its own uid (the
//! agent's) does not hold. A listener owned by root stands in for a socket
//! a command planted at the agent's path; the relay runs as another uid and
//! must refuse before a byte of the host's preface reaches it. The control:
//! the same relay, as the listener's own uid, delivers the bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn run_relay(path: &std::path::Path, uid: Option<u32>, input: &[u8]) -> (bool, String, Vec<u8>) {
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(false).unwrap();
    let got = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        buf
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_namzu-agent"));
    cmd.arg("--relay")
        .arg(format!("unix:{}", path.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(input);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let received = got.join().unwrap();
    let _ = std::fs::remove_file(path);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        received,
    )
}

#[test]
fn a_relay_never_feeds_a_socket_another_uid_holds() {
    // No silent pass: without root the attack cannot be staged, and this
    // test says so by failing (CI runs as root).
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root, to run the relay as another uid"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("agent.sock");
    let preface = b"NAMZU-PREFACE the-bind-token";
    // Control: same uid on both ends, the bytes arrive.
    let (ok, err, received) = run_relay(&path, None, preface);
    assert!(ok, "{err}");
    assert_eq!(received, preface);
    // The attack: the socket's holder (root) is not the relay's uid.
    let (ok, err, received) = run_relay(&path, Some(65534), preface);
    assert!(!ok, "the relay accepted a foreign socket");
    assert!(err.contains("refusing to relay"), "{err}");
    assert!(
        received.is_empty(),
        "the planted socket received {:?}",
        String::from_utf8_lossy(&received)
    );
}
