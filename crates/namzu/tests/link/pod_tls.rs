//! The agent as the shipped template starts it, TLS and all
//! (`deploy/k8s/sandboxtemplate-task.yaml`): the init step installs the
//! agent and copies the Secret's `tls.crt` / `tls.key` into the link
//! volume; the workload's agent serves `--listen tcp` with `--tls-cert`,
//! `--tls-key --consume-tls-key` and `--tls-client-ca`, under the pod's
//! one uid. Only the host's certificate opens the link; the key is gone
//! before a command runs; a command offering the token on loopback gets a
//! TLS alert, not a link.

use super::*;
use namzu::backend::kubernetes::link::LinkCredentials;

const POD_UID: u32 = 65532;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_s_agent_serves_mutual_tls_and_keeps_no_key() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let p = |s: &str| dir.path().join(s);
    let creds = LinkCredentials::generate().unwrap();
    // What the kubelet mounts: the Secret (init container only) and the
    // ConfigMap; the two emptyDirs.
    write(&p("secret/tls.crt"), &creds.server_cert);
    write(&p("secret/tls.key"), &creds.server_key);
    write(&p("ca/ca.crt"), &creds.ca_cert);
    for d in ["namzu", "link", "root"] {
        std::fs::create_dir_all(p(d)).unwrap();
    }
    let as_root = nix::unistd::geteuid().is_root();
    if as_root {
        for d in [
            "",
            "secret",
            "secret/tls.crt",
            "secret/tls.key",
            "namzu",
            "link",
            "root",
        ] {
            std::os::unix::fs::chown(p(d), Some(POD_UID), Some(POD_UID)).unwrap();
        }
    }
    let agent = namzu::backend::find_agent_binary().expect("agent binary");
    let mut init = Command::new(&agent);
    init.arg("--install")
        .arg(p("namzu/namzu-agent"))
        .arg("--install-tls-from")
        .arg(p("secret"))
        .arg("--install-tls-to")
        .arg(p("link"))
        .env_clear();
    if as_root {
        init.uid(POD_UID).gid(POD_UID);
    }
    let out = init.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mode =
        |f: &str| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p(f)).unwrap().permissions()) & 0o777;
    assert_eq!(mode("link/tls.key"), 0o400);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let token = "pod-uid-6c1f8d2a-9a6b-4e9f-8e8f-1d2e3f4a5b6c";
    let mut cmd = Command::new(p("namzu/namzu-agent"));
    cmd.args(["--listen", &format!("tcp:127.0.0.1:{port}"), "--root"])
        .arg(p("root"))
        .arg("--tls-cert")
        .arg(p("link/tls.crt"))
        .arg("--tls-key")
        .arg(p("link/tls.key"))
        .arg("--consume-tls-key")
        .arg("--tls-client-ca")
        .arg(p("ca/ca.crt"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("NAMZU_AGENT_LOG", "warn")
        .env("NAMZU_AGENT_TOKEN", token)
        .stdout(Stdio::null());
    if as_root {
        cmd.uid(POD_UID).gid(POD_UID);
    }
    let _a = Agent {
        child: cmd.spawn().unwrap(),
        dir: tempfile::tempdir().unwrap(),
    };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let host = creds.host_tls().unwrap().client_config();
    let dial = {
        let host = host.clone();
        move || {
            let host = host.clone();
            async move { namzu_proto::link_tls::connect(host, tokio::net::TcpStream::connect(addr).await?).await }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match AgentClient::connect(
            "pod",
            &addr.to_string(),
            token.into(),
            ClientOptions::default(),
            dial.clone(),
        )
        .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "the agent never answered: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(c.info().hardening.get("link").map(String::as_str), Some("mutual-tls"));
    assert!(!p("link/tls.key").exists(), "the agent left its key");
    assert!(p("link/tls.crt").exists());

    // A command, on loopback, as the host would: the preface with the
    // token (which it is handed here), and the first byte back.
    let attack = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} || exit 9; printf 'NZL1\\000\\0{len:o}%s' '{token}' >&3; head -c1 <&3 | od -An -tx1",
        len = token.len()
    );
    let out = c.exec(ExecRequest::new("bash").arg("-c").arg(&attack)).await.unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        answer, "15",
        "the agent answered a command's preface with {answer:?} (00 is a link)"
    );
    // From outside, the same without TLS.
    let plain = AgentClient::connect_tcp("pod", addr, token.into(), ClientOptions::default()).await;
    assert!(plain.is_err(), "a plaintext link was let in");
}

#[test]
fn tls_is_refused_on_a_link_that_is_not_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(namzu::backend::find_agent_binary().expect("agent binary"))
        .arg("--listen")
        .arg(format!("unix:{}", dir.path().join("s").display()))
        .args([
            "--tls-cert",
            "/dev/null",
            "--tls-key",
            "/dev/null",
            "--tls-client-ca",
            "/dev/null",
        ])
        .env("NAMZU_AGENT_TOKEN", "t")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tcp:"), "{err}");
}
