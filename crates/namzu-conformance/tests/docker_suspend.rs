//! Suspend and resume on the `docker` tier, beyond the conformance case,
//! under runc and runsc: an image that runs as a user of its own, files
//! of any mode kept with their owners (the tmpfs's are read by whoever can
//! read them all: the host under runc, a root exec under gVisor), the
//! container stopped and kept while suspended, a failed resume that
//! leaves it so. Needs a daemon (the test command starts one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::{Error, Provider, SandboxSpec};
use namzu_conformance::docker::{self, TEST_USER_IMAGE};

async fn sh(sb: &namzu::Sandbox, script: &str) -> String {
    let out = sb.commands().run(script).await.unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn running(p: &DockerProvider, id: &str) -> bool {
    let c = p
        .docker()
        .inspect_container(&format!("namzu-{id}"), None)
        .await
        .unwrap();
    c.state.and_then(|s| s.running).unwrap_or(false)
}

async fn a_users_files_of_any_mode_come_back_with_their_owners(runtime: Option<&str>) {
    let opts = DockerOptions {
        runtime: runtime.map(str::to_owned),
        ..Default::default()
    };
    let p = docker::provider(&format!("suspend-{}", runtime.unwrap_or("runc")), opts)
        .await
        .unwrap();
    docker::ensure_test_user_image(p.docker()).await.unwrap();
    let spec = SandboxSpec {
        image: Some(TEST_USER_IMAGE.into()),
        ..Default::default()
    };
    let sb = p.create(spec).await.unwrap();
    let id = sb.id().to_owned();
    sh(
        &sb,
        "set -e; umask 077; echo secret > /tmp/secret; mkdir -p /tmp/d /var/tmp/v; \
         echo unreadable > /tmp/d/none; chmod 000 /tmp/d/none; chmod 500 /tmp/d; \
         echo v > /var/tmp/v/f; echo w > /workspace/w",
    )
    .await;
    p.suspend(&id).await.unwrap();
    assert!(!running(&p, &id).await, "the container runs while suspended");
    let me = p.list().await.unwrap().into_iter().find(|s| s.id == id).unwrap();
    assert!(me.suspended && !me.alive, "{me:?}");
    assert!(matches!(p.connect(&id).await, Err(Error::SandboxSuspended { .. })));
    assert!(p.gc().await.unwrap().is_empty(), "gc took a suspended sandbox");

    // A damaged archive: the resume fails and the sandbox stays suspended.
    let dir = std::env::temp_dir()
        .join(format!(
            "namzu-suspend-{}-{}",
            runtime.unwrap_or("runc"),
            std::process::id()
        ))
        .join("docker")
        .join(&id);
    let archive = dir.join("saved.tar");
    let good = std::fs::read(&archive).unwrap();
    let mut bad = good.clone();
    bad.truncate(1000);
    bad[520..1000].fill(0xff);
    std::fs::write(&archive, &bad).unwrap();
    assert!(p.resume(&id).await.is_err(), "a damaged archive was resumed");
    assert!(!running(&p, &id).await, "a failed resume left the container running");
    let me = p.list().await.unwrap().into_iter().find(|s| s.id == id).unwrap();
    assert!(me.suspended, "{me:?}");
    std::fs::write(&archive, &good).unwrap();

    let sb = p.resume(&id).await.unwrap();
    assert_eq!(sb.id(), id);
    let got = sh(
        &sb,
        "id -un; cat /tmp/secret /var/tmp/v/f /workspace/w; \
         stat -c '%U:%G %a' /tmp/secret /tmp/d /tmp/d/none",
    )
    .await;
    assert_eq!(got, "app\nsecret\nv\nw\napp:app 600\napp:app 500\napp:app 0\n");
    sb.destroy().await.unwrap();
    assert!(!dir.exists());
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let reachable = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(docker::provider("suspend-probe", DockerOptions::default()))
                .map(drop)
        });
    if let Err(why) = &reachable {
        if docker::required() {
            eprintln!("docker_suspend: {why}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let trials = [None, Some("runsc")]
        .into_iter()
        .map(|runtime| {
            let name = format!(
                "a_users_files_of_any_mode_come_back_with_their_owners_{}",
                runtime.unwrap_or("runc")
            );
            let trial = libtest_mimic::Trial::test(name, move || {
                let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
                rt.block_on(a_users_files_of_any_mode_come_back_with_their_owners(runtime));
                Ok(())
            });
            match &reachable {
                Err(why) => trial.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
                Ok(()) => trial,
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
