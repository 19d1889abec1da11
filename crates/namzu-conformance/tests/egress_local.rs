//! Egress on the `local` tier: the cases of `namzu_conformance::egress` on
//! a real network. Needs root, iproute2, curl and openssl
//! (`scripts/net-up.sh`); without them every test is reported ignored,
//! unless `NAMZU_REQUIRE_NET=1` makes that a failure.

use std::path::PathBuf;
use std::sync::Arc;

use namzu::backend::local::LocalProvider;
use namzu::Provider;
use namzu_conformance::egress::Env;
use namzu_conformance::netlab::NetLab;

fn state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("namzu-egress-local-{}", std::process::id()))
}

fn main() -> std::process::ExitCode {
    let lab = NetLab::start();
    let env = lab.as_ref().map_err(Clone::clone).and_then(|lab| {
        let p = Arc::new(LocalProvider::new(state_dir()).map_err(|e| e.to_string())?);
        let q = p.clone();
        Ok(Env {
            factory: Arc::new(move |spec| {
                let p = p.clone();
                Box::pin(async move { p.create(spec).await })
            }),
            connect: Arc::new(move |id| {
                let q = q.clone();
                Box::pin(async move { q.connect(&id).await })
            }),
            cert: lab.tls_cert.clone(),
            log_of: Arc::new(|id| state_dir().join("local").join(id).join("egress.log")),
            lab: lab.handle(),
            handoff: true,
        })
    });
    let why = env.as_ref().err().cloned();
    let code = namzu_conformance::egress::run(namzu_conformance::egress::trials("local", env), why.as_deref());
    drop(lab);
    let _ = std::fs::remove_dir_all(state_dir());
    code
}
