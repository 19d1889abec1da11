//! What a registry sends as a manifest or index: whatever the bytes,
//! `select_manifest` answers (a manifest, an index entry's digest, the
//! platforms an index lists, or a refusal) without panicking, and an entry
//! it picks is one the index lists for the platform asked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use namzu::image::pull::{select_manifest, Selected};
use namzu::image::Platform;

fuzz_target!(|data: &[u8]| {
    let platform = Platform::host();
    match select_manifest(data, &platform) {
        Ok(Selected::Child(digest)) => {
            // The digest came from an entry naming this platform.
            let v: serde_json::Value = serde_json::from_slice(data).expect("accepted bytes are JSON");
            let listed = v["manifests"].as_array().expect("an index lists manifests");
            assert!(listed.iter().any(|m| m["digest"] == digest.as_str()
                && m["platform"]["os"] == platform.os.as_str()
                && m["platform"]["architecture"] == platform.architecture.as_str()));
        }
        Ok(Selected::Manifest(m)) => {
            assert!(m.layers().iter().all(|l| !l.media_type().to_string().contains("zstd")));
        }
        Ok(Selected::Missing(_)) | Err(_) => {}
    }
});
