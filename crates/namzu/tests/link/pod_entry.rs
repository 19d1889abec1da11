//! The agent as a Kubernetes pod starts it (`deploy/k8s/`): `--listen tcp`,
//! the bind token in `NAMZU_AGENT_TOKEN` (the downward API's pod uid), and
//! ONE unprivileged uid for the agent and every command it runs. A command
//! is the attacker here: it must not read the token — not from its own
//! environment, not from the agent's `/proc/<pid>/environ` (the process's
//! original environment, which removing the variable does not scrub), not
//! from its memory — so it cannot offer it on `127.0.0.1` and act as the
//! host.

use super::*;

/// The uid a pod runs the agent and its commands as (the shipped
/// template's), when this test may switch to it; else the test's own,
/// which no more has CAP_SYS_PTRACE than the pod's would.
const POD_UID: u32 = 65532;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_in_the_pod_cannot_read_the_agents_token() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let as_root = nix::unistd::geteuid().is_root();
    if as_root {
        // Both the agent and its commands: the pod's one uid, no capability.
        std::os::unix::fs::chown(&root, Some(POD_UID), Some(POD_UID)).unwrap();
        let mut p = std::fs::metadata(dir.path()).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
        std::fs::set_permissions(dir.path(), p).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let secret = "pod-uid-5b0e7c1e-8f5a-4d8e-9d7e-0c1d2e3f4a5b";
    let mut cmd = Command::new(namzu::backend::find_agent_binary().expect("agent binary"));
    cmd.args(["--listen", &format!("tcp:127.0.0.1:{port}"), "--root"])
        .arg(&root)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("NAMZU_AGENT_LOG", "warn")
        .env("NAMZU_AGENT_TOKEN", secret)
        .stdout(Stdio::null());
    if as_root {
        cmd.uid(POD_UID).gid(POD_UID);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let a = Agent {
        child,
        dir: tempfile::tempdir().unwrap(),
    };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match AgentClient::connect_tcp("pod", addr, secret.as_bytes().to_vec(), ClientOptions::default()).await {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "the agent never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let probe = format!(
        "id -u; env | grep -c NAMZU_AGENT_TOKEN; cat /proc/{pid}/environ; echo environ=$?; \
         cat /proc/{pid}/cmdline >/dev/null; head -c1 /proc/{pid}/mem; echo mem=$?"
    );
    let out = c.exec(ExecRequest::shell(&probe)).await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let mut lines = stdout.lines();
    if as_root {
        assert_eq!(lines.next(), Some("65532"), "{stdout}");
    }
    assert!(
        !stdout.contains(secret) && !stderr.contains(secret),
        "a command read the token: {stdout} {stderr}"
    );
    assert!(
        stdout.contains("\n0\n") || stdout.starts_with("0\n"),
        "the token is in the command's environment: {stdout}"
    );
    assert!(
        stdout.contains("environ=1"),
        "the agent's environ was readable: {stdout} {stderr}"
    );
    assert!(
        stdout.contains("mem=1"),
        "the agent's memory was readable: {stdout} {stderr}"
    );
    // And guessing is all that is left: the agent refuses anything else.
    let wrong = AgentClient::connect_tcp("pod", addr, b"not-the-token".to_vec(), ClientOptions::default()).await;
    assert!(matches!(wrong, Err(Error::Preface { .. })), "{wrong:?}");
    drop(a);
}
