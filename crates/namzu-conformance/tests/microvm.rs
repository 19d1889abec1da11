//! The conformance suite on the `microvm` tier: one qemu `microvm` guest
//! per sandbox (TCG where KVM is unusable, as on these machines), the
//! static agent as the guest's init, booting the debootstrapped Debian
//! image (`scripts/images.sh`) with the kernel `scripts/microvm-up.sh`
//! fetched (`NAMZU_MICROVM_KERNEL`). Without qemu or a kernel every case is
//! reported ignored, unless `NAMZU_REQUIRE_MICROVM=1`.

#[path = "support/microvm.rs"]
mod microvm;

fn main() -> std::process::ExitCode {
    let provider = match microvm::provider("conformance") {
        Ok(p) => p,
        Err(why) => return microvm::skip_all("microvm", &why),
    };
    let resumer = provider.clone();
    let snapshots: std::sync::Arc<dyn namzu::Provider> = std::sync::Arc::new(provider.clone());
    let factory: namzu_conformance::Factory = std::sync::Arc::new(move |spec| {
        let p = provider.clone();
        Box::pin(async move { namzu::Provider::create(&p, spec).await })
    });
    // The writable disk is the disk limit; a suspend keeps it and the
    // VM's memory.
    let resume: namzu_conformance::Resumer = std::sync::Arc::new(move |id: String| {
        let p = resumer.clone();
        Box::pin(async move { namzu::Provider::resume(&p, &id).await })
    });
    let hooks = namzu_conformance::TierHooks {
        resume: Some(resume),
        disk_limit: true,
        suspend_keeps_memory: true,
        snapshots: Some(snapshots),
        pause_stops_machine: true,
    };
    let code = namzu_conformance::run_main_with("microvm", factory, microvm::CANNOT, hooks);
    microvm::cleanup("conformance");
    code
}
