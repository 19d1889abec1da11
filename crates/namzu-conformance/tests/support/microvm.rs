//! What the microvm tier's test binaries share: the provider on a state
//! directory of their own, with the Debian image imported and the kernel
//! the setup script fetched.

use std::path::PathBuf;

use namzu::backend::microvm::{MicroVmOptions, MicroVmProvider};

/// What the microvm tier refuses by name, so a case needing it is
/// reported ignored with the reason.
pub const CANNOT: &[(&str, &str)] = &[(
    "flush_makes_the_workspace_durable",
    "the case counts the host's dirty page cache; a guest's writes are dirty in the guest's own memory, which the host cannot see (microvm_tier::flush_writes_back_the_guests_dirty_pages measures it inside)",
)];

/// The image every microvm test boots.
pub const IMAGE: &str = "debian:bookworm";

fn state(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("namzu-microvm-{what}-{}", std::process::id()))
}

/// Why this machine cannot run the tier, if it cannot.
pub fn missing() -> Option<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if std::env::var_os("NAMZU_MICROVM_KERNEL").is_none() {
        return Some("NAMZU_MICROVM_KERNEL is not set (scripts/microvm-up.sh prints it)".into());
    }
    if !root.join("target/images/debian-bookworm.tar").is_file() {
        return Some("target/images/debian-bookworm.tar is missing (scripts/images.sh)".into());
    }
    None
}

/// The provider, its image imported; `Err(why)` where the machine cannot
/// run the tier and nobody required it.
pub fn provider(what: &str) -> Result<MicroVmProvider, String> {
    if let Some(why) = missing() {
        if std::env::var_os("NAMZU_REQUIRE_MICROVM").is_some_and(|v| v == "1") {
            panic!("microvm tier required (NAMZU_REQUIRE_MICROVM=1) but unavailable: {why}");
        }
        return Err(why);
    }
    let dir = state(what);
    let tar = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/images/debian-bookworm.tar");
    let imported = namzu::image::ImageStore::new(&dir).import(&tar, Some(IMAGE), &|_, _| {});
    if let Err(e) = imported {
        panic!("import {}: {e}", tar.display());
    }
    let p = match MicroVmProvider::new(&dir) {
        Ok(p) => p,
        Err(e) => panic!("microvm provider: {e}"),
    };
    Ok(p.options(MicroVmOptions {
        default_image: Some(IMAGE.into()),
        ..Default::default()
    }))
}

/// Reports every case ignored, naming why.
pub fn skip_all(backend: &str, why: &str) -> std::process::ExitCode {
    namzu_conformance::ignore_all(backend, why)
}

/// Removes the state directory (every VM in it destroyed first).
pub fn cleanup(what: &str) {
    let dir = state(what);
    if let Ok(rt) = tokio::runtime::Runtime::new() {
        rt.block_on(async {
            if let Ok(p) = MicroVmProvider::new(&dir) {
                for s in namzu::Provider::list(&p).await.unwrap_or_default() {
                    let _ = namzu::Provider::destroy(&p, &s.id).await;
                }
            }
        });
    }
    let _ = std::fs::remove_dir_all(dir);
}
