//! Audit item 8 on gVisor with a host that cannot give files away (not
//! root): this test binary drops CAP_CHOWN from its first thread before any
//! other thread exists, so the provider really takes that path. The run
//! directory (bind-mounted, seen by commands under runsc) must then be
//! sticky, not world-writable: a command cannot remove, rename or replace
//! the agent's socket, the token is emptied before it runs, and the host's
//! next call reaches the real agent.
//!
//! The image runs commands as `app` (1000): a command whose uid were the
//! host user's own would own the directory, which the sticky bit does not
//! stop; the relay's peer check (tests/relay_peer.rs in the agent) is what
//! holds then.

use std::os::unix::fs::PermissionsExt;

use namzu::backend::docker::DockerOptions;
use namzu::{ExecRequest, Provider, SandboxSpec};
use namzu_conformance::docker::{self, TEST_USER_IMAGE};

async fn run() -> Result<(), String> {
    let opts = DockerOptions {
        runtime: Some("runsc".into()),
        ..Default::default()
    };
    let p = docker::provider("runsc-unpriv", opts).await?;
    docker::ensure_test_user_image(p.docker()).await?;
    let sb = p
        .create(SandboxSpec {
            image: Some(TEST_USER_IMAGE.into()),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create: {e}"))?;
    let run_dir = std::env::temp_dir()
        .join(format!("namzu-runsc-unpriv-{}", std::process::id()))
        .join("docker")
        .join(sb.id())
        .join("run");
    let mode = std::fs::metadata(&run_dir)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode()
        & 0o7777;
    if mode != 0o1777 {
        return Err(format!("the unprivileged path was not taken: run dir mode {mode:o}"));
    }
    let script = "id -u; if [ -s /.namzu/run/token ]; then echo token=readable; else echo token=gone; fi; \
        rm -f /.namzu/run/agent.sock; echo rm=$?; \
        mv /.namzu/run/agent.sock /.namzu/run/moved; echo mv=$?; \
        ls -la /.namzu/run/";
    let o = sb
        .commands()
        .run(ExecRequest::shell(script))
        .await
        .map_err(|e| e.to_string())?;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    let checks = [
        (lines.first() == Some(&"1000"), "the command runs as app (1000)"),
        (
            lines.get(1) == Some(&"token=gone"),
            "the token is gone or empty before commands run",
        ),
        (lines.contains(&"rm=1"), "removing the agent's socket fails"),
        (lines.contains(&"mv=1"), "renaming the agent's socket fails"),
        (
            out.contains("agent.sock") && !out.contains("moved"),
            "the socket is still in place",
        ),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(format!("{what}: {out}{err}"));
        }
    }
    // The host's next link (a new relay) reaches the real agent.
    let again = p.connect(sb.id()).await.map_err(|e| format!("connect: {e}"))?;
    let o = again
        .commands()
        .run(ExecRequest::shell("echo real-agent"))
        .await
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&o.stdout) != "real-agent\n" {
        return Err(format!("after the attempt: {o:?}"));
    }
    sb.destroy().await.map_err(|e| e.to_string())
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    // Before the runtime: threads inherit the caller's capabilities.
    let dropped = [caps::CapSet::Effective, caps::CapSet::Permitted]
        .into_iter()
        .try_for_each(|set| caps::drop(None, set, caps::Capability::CAP_CHOWN))
        .map_err(|e| format!("drop CAP_CHOWN: {e}"));
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string());
    let ready = dropped.and_then(|()| {
        rt.as_ref().map_err(Clone::clone).and_then(|rt| {
            rt.block_on(docker::provider(
                "runsc-unpriv-probe",
                DockerOptions {
                    runtime: Some("runsc".into()),
                    ..Default::default()
                },
            ))
            .map(drop)
        })
    });
    let trial = match (&ready, docker::required()) {
        (Err(why), false) => libtest_mimic::Trial::test("runsc_run_dir_with_an_unprivileged_host", || Ok(()))
            .with_ignored_flag(true)
            .with_kind(why.clone()),
        _ => {
            let ready = ready.clone();
            libtest_mimic::Trial::test("runsc_run_dir_with_an_unprivileged_host", move || {
                ready.clone()?;
                let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
                rt.block_on(run()).map_err(Into::into)
            })
        }
    };
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
