//! `namzu run` on the `local` tier as an ordinary user: the sandbox's root
//! is that user, alone (a single-id map), with no capabilities. When the
//! tests run as root (CI), an ordinary user is created for this.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const USER: &str = "namzu-ci";
/// A second user, with a subordinate id range.
const SUB_USER: &str = "namzu-ci-sub";

/// Creates `user` if missing (idempotent, and safe against a parallel test
/// creating it first); returns its uid.
fn ensure_user(user: &str) -> u32 {
    let uid = || {
        Command::new("id")
            .args(["-u", user])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().unwrap())
    };
    if let Some(u) = uid() {
        return u;
    }
    let _ = Command::new("useradd")
        .args(["--system", "--no-create-home", "--shell", "/bin/sh", user])
        .status();
    uid().expect("useradd failed")
}

/// Runs `args` as an ordinary user; returns (uid, output).
fn as_ordinary_user(bin_dir: &Path, state: &Path, args: &[&str]) -> (u32, std::process::Output) {
    as_user(USER, bin_dir, state, args)
}

/// Runs `args` as `user` (when root; otherwise as the current user).
fn as_user(user: &str, bin_dir: &Path, state: &Path, args: &[&str]) -> (u32, std::process::Output) {
    let namzu = bin_dir.join("namzu");
    if !nix::unistd::geteuid().is_root() {
        let out = Command::new(&namzu)
            .args(args)
            .env("NAMZU_STATE_DIR", state)
            .output()
            .unwrap();
        return (nix::unistd::geteuid().as_raw(), out);
    }
    let uid = ensure_user(user);
    nix::unistd::chown(state, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
    let out = Command::new("runuser")
        .args(["-u", user, "--", "env", &format!("NAMZU_STATE_DIR={}", state.display())])
        .arg(&namzu)
        .args(args)
        .output()
        .unwrap();
    (uid, out)
}

#[test]
fn local_tier_works_for_an_ordinary_user_with_a_single_id_map() {
    let (dir, state) = staged();
    let script = "id -u; cat /proc/self/uid_map; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; touch /workspace/x && echo wrote";
    let (uid, out) = as_ordinary_user(
        dir.path(),
        &state,
        &["run", "--tier", "local", "--", "sh", "-c", script],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<&str>> = stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["0"], "root inside: {stdout}");
    assert_eq!(
        lines[1],
        ["0", &uid.to_string(), "1"],
        "a single-id map onto the user: {stdout}"
    );
    assert_eq!(lines[2], ["CapEff:", "0000000000000000"], "{stdout}");
    assert_eq!(lines[3], ["NoNewPrivs:", "1"], "{stdout}");
    assert_eq!(lines[4], ["wrote"], "{stdout}");
}

#[test]
fn cgroup_limits_an_ordinary_user_cannot_apply_are_refused_by_name() {
    if !nix::unistd::geteuid().is_root()
        && std::fs::metadata("/sys/fs/cgroup/memory").is_ok_and(|m| !m.permissions().readonly())
    {
        // A delegated hierarchy might make this work; the root case is
        // covered by the escape suite.
    }
    let (dir, state) = staged();
    let (_, out) = as_ordinary_user(dir.path(), &state, &["run", "--memory", "64m", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("resources.memory_bytes"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Copies the binaries where any user may run them; returns (dir, state).
fn staged() -> (tempfile::TempDir, std::path::PathBuf) {
    // The build tree may sit under a private home.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let built = Path::new(env!("CARGO_BIN_EXE_namzu"));
    for name in ["namzu", "namzu-agent", "namzu-egress"] {
        let dst = dir.path().join(name);
        std::fs::copy(built.with_file_name(name), &dst).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    (dir, state)
}

/// Appends `user:start:count` to a subid file unless the user has a line.
fn ensure_subids(file: &str, user: &str, start: u32) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    if !text.lines().any(|l| l.starts_with(&format!("{user}:"))) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .unwrap();
        writeln!(f, "{user}:{start}:65536").unwrap();
    }
}

#[test]
fn an_ordinary_user_with_subordinate_ids_gets_the_range_through_newuidmap() {
    let (dir, state) = staged();
    let user = if nix::unistd::geteuid().is_root() {
        ensure_user(SUB_USER);
        ensure_subids("/etc/subuid", SUB_USER, 3_000_000);
        ensure_subids("/etc/subgid", SUB_USER, 3_000_000);
        assert!(
            Path::new("/usr/bin/newuidmap").exists(),
            "uidmap is not installed (scripts/test.sh installs it)"
        );
        SUB_USER
    } else {
        USER
    };
    let script = "cat /proc/self/uid_map /proc/self/gid_map";
    let (uid, out) = as_user(user, dir.path(), &state, &["run", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Vec<&str>> = stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines[0],
        ["0", &uid.to_string(), "1"],
        "root inside is the user: {stdout}"
    );
    if nix::unistd::geteuid().is_root() {
        assert_eq!(
            lines[1],
            ["1", "3000000", "65536"],
            "uids 1.. come from the subordinate range: {stdout}"
        );
        assert_eq!(
            lines[3],
            ["1", "3000000", "65536"],
            "gids 1.. come from the subordinate range: {stdout}"
        );
    }
}
