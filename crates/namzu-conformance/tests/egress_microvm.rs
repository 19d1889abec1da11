//! Egress on the `microvm` tier: the cases of `namzu_conformance::egress`
//! on a real network, from a guest that has no NIC (every connection goes
//! through the agent's proxy and resolver, each decision the host
//! supervisor's, over the link). The guest boots the Debian image with the
//! host's curl added. Needs the lab's tools (`scripts/net-up.sh`) and the
//! microvm tier; without them every test is reported ignored, unless
//! `NAMZU_REQUIRE_NET=1` / `NAMZU_REQUIRE_MICROVM=1` makes that a failure.

#[path = "support/microvm.rs"]
mod microvm;

use std::sync::Arc;

use namzu::Provider;
use namzu_conformance::egress::Env;
use namzu_conformance::netlab::NetLab;

fn main() -> std::process::ExitCode {
    let lab = NetLab::start();
    let env = lab.as_ref().map_err(Clone::clone).and_then(|lab| {
        let p = Arc::new(microvm::provider("egress")?);
        let rootfs = microvm::curl_rootfs(&p)?;
        let state = p.state_root().to_path_buf();
        let q = p.clone();
        Ok(Env {
            factory: Arc::new(move |mut spec| {
                let p = p.clone();
                spec.image.get_or_insert_with(|| rootfs.to_string_lossy().into_owned());
                Box::pin(async move { p.create(spec).await })
            }),
            connect: Arc::new(move |id| {
                let q = q.clone();
                Box::pin(async move { q.connect(&id).await })
            }),
            cert: lab.tls_cert.clone(),
            log_of: Arc::new(move |id| state.join(id).join("egress.log")),
            lab: lab.handle(),
            handoff: false,
        })
    });
    let why = env.as_ref().err().cloned();
    let code = namzu_conformance::egress::run(namzu_conformance::egress::trials("microvm", env), why.as_deref());
    drop(lab);
    microvm::cleanup("egress");
    code
}
