//! The escape suite inside a microVM guest (qemu `microvm`, TCG here).
//! Every attempt runs in the guest, as it runs in a container on the other
//! tiers, and its control on the host; what an attempt on the "host" kernel
//! reaches here is the guest's own kernel, behind the VM boundary, so the
//! count says what the guest's commands can reach of the guest (no
//! capability, no_new_privs, namzu's seccomp filter), and the VM-specific
//! checks (`microvm_tier`) what the VMM holds on the host. Prints
//! `escape suite (microvm): …` for CI.

#[path = "support/microvm.rs"]
mod microvm;

use libtest_mimic::{Arguments, Failed, Trial};
use namzu_conformance::escape::suite;

const VM: suite::Expect = suite::Expect {
    host_may_lack: suite::HOST_MAY_LACK,
    invariants: &[],
    known_gaps: &[],
    tier_lacks: &[
        (
            "write a 0666 file under a read-only mount",
            "the microvm tier takes no binds: there is no read-only bind in a guest",
        ),
        (
            "create a file in a 0777 directory under a read-only mount",
            "the microvm tier takes no binds: there is no read-only bind in a guest",
        ),
    ],
};

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let provider = microvm::provider("escape");
    let trial = Trial::test("escape_attempts_all_fail_inside_a_guest", move || {
        let p = provider.map_err(|why| Failed::from(format!("unavailable: {why}")))?;
        let factory: namzu_conformance::Factory = std::sync::Arc::new(move |spec| {
            let p = p.clone();
            Box::pin(async move { namzu::Provider::create(&p, spec).await })
        });
        let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
        let shape = suite::TierShape {
            binds: false,
            link_token: None,
        };
        let report = rt
            .block_on(suite::run_on(&factory, Default::default(), &shape))
            .map_err(Failed::from)?;
        suite::print(&report, "microvm", &VM);
        suite::check(&report, &VM).map_err(Failed::from)
    });
    let trial = match microvm::missing() {
        Some(why) if std::env::var_os("NAMZU_REQUIRE_MICROVM").is_none_or(|v| v != "1") => {
            trial.with_ignored_flag(true).with_kind(format!("unavailable: {why}"))
        }
        _ => trial,
    };
    let conclusion = libtest_mimic::run(&args, vec![trial]);
    microvm::cleanup("escape");
    conclusion.exit_code()
}
