//! Egress on the `docker` tier, runc and runsc: the cases of
//! `namzu_conformance::egress` on a real network, in containers of
//! [`TEST_CURL_IMAGE`](namzu_conformance::docker::TEST_CURL_IMAGE). Needs
//! a daemon (`scripts/docker-up.sh`) and the lab's tools
//! (`scripts/net-up.sh`); without them every test is reported ignored,
//! unless `NAMZU_REQUIRE_NET=1` makes that a failure.

use std::path::PathBuf;
use std::sync::Arc;

use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::Provider;
use namzu_conformance::docker;
use namzu_conformance::egress::Env;
use namzu_conformance::netlab::NetLab;

fn state_dir(runtime: &str) -> PathBuf {
    std::env::temp_dir().join(format!("namzu-egress-docker-{runtime}-{}", std::process::id()))
}

async fn env(runtime: &'static str, cert: Vec<u8>, lab: namzu_conformance::netlab::LabHandle) -> Result<Env, String> {
    let p = DockerProvider::new(
        state_dir(runtime),
        DockerOptions {
            runtime: Some(runtime.into()),
            ..Default::default()
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let image = docker::ensure_test_curl_image(p.docker()).await?;
    let p = Arc::new(p);
    let q = p.clone();
    Ok(Env {
        connect: Arc::new(move |id| {
            let q = q.clone();
            Box::pin(async move { q.connect(&id).await })
        }),
        factory: Arc::new(move |mut spec| {
            let p = p.clone();
            spec.image.get_or_insert_with(|| image.to_owned());
            Box::pin(async move { p.create(spec).await })
        }),
        cert,
        log_of: Arc::new(move |id| state_dir(runtime).join("docker").join(id).join("egress.log")),
        lab,
        // gVisor's sockets are its own: none can be passed to the host.
        handoff: runtime == "runc",
    })
}

fn main() -> std::process::ExitCode {
    let lab = NetLab::start();
    let mut trials = Vec::new();
    let mut why = lab.as_ref().err().cloned();
    match tokio::runtime::Runtime::new() {
        Err(e) => why = Some(e.to_string()),
        Ok(rt) => {
            for runtime in ["runc", "runsc"] {
                let env = match &lab {
                    Ok(l) => rt.block_on(env(runtime, l.tls_cert.clone(), l.handle())),
                    Err(why) => Err(why.clone()),
                };
                if let Err(e) = &env {
                    why.get_or_insert_with(|| e.clone());
                }
                trials.extend(namzu_conformance::egress::trials(&format!("docker-{runtime}"), env));
            }
        }
    }
    let code = namzu_conformance::egress::run(trials, why.as_deref());
    drop(lab);
    for runtime in ["runc", "runsc"] {
        let _ = std::fs::remove_dir_all(state_dir(runtime));
    }
    code
}
