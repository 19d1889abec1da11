//! A simulated pod's volumes, made on the node as a kubelet makes them:
//! `emptyDir` (an empty directory), `secret` and `configMap` (each key a
//! file, mode `defaultMode` or 0644, from the object in the pod's
//! namespace). A Secret or ConfigMap that does not exist leaves the pod
//! waiting in `ContainerCreating` with the kubelet's mount message, as on
//! a cluster; nothing is guessed in its place.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use serde_json::Value;

use crate::server::{Gvr, Simulator};

/// Secrets, stored as the API stores them (`data` base64).
pub const SECRETS: Gvr = ("", "v1", "secrets");
/// ConfigMaps.
pub const CONFIG_MAPS: Gvr = ("", "v1", "configmaps");

/// Why a volume could not be set up, in the kubelet's words.
fn mount_failed(volume: &str, message: String) -> String {
    format!("MountVolume.SetUp failed for volume {volume:?} : {message}")
}

/// The files a volume source holds, or why it cannot be mounted.
fn files(sim: &Simulator, ns: &str, v: &Value) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    if let Some(src) = v.get("secret") {
        let name = src["secretName"].as_str().unwrap_or_default();
        let Some(obj) = sim.object(SECRETS.0, SECRETS.1, SECRETS.2, ns, name) else {
            return Err(format!("secret {name:?} not found"));
        };
        let data: BTreeMap<String, ByteString> =
            serde_json::from_value(obj["data"].clone()).map_err(|e| format!("secret {name:?}: {e}"))?;
        return Ok(Some(data.into_iter().map(|(k, v)| (k, v.0)).collect()));
    }
    if let Some(src) = v.get("configMap") {
        let name = src["name"].as_str().unwrap_or_default();
        let Some(obj) = sim.object(CONFIG_MAPS.0, CONFIG_MAPS.1, CONFIG_MAPS.2, ns, name) else {
            return Err(format!("configmap {name:?} not found"));
        };
        let data: BTreeMap<String, String> =
            serde_json::from_value(obj["data"].clone()).map_err(|e| format!("configmap {name:?}: {e}"))?;
        return Ok(Some(data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()));
    }
    Ok(None)
}

/// Makes every volume of `pod` under `dir`; returns where each is, or
/// the kubelet's message for the one that could not be set up.
pub(super) fn make(sim: &Simulator, pod: &Value, dir: &Path) -> Result<HashMap<String, PathBuf>, String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut volumes = HashMap::new();
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let Some(name) = v["name"].as_str() else { continue };
        let contents = if v.get("emptyDir").is_some() {
            BTreeMap::new()
        } else {
            match files(sim, ns, v) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(message) => return Err(mount_failed(name, message)),
            }
        };
        let at = dir.join(name);
        std::fs::create_dir_all(&at).map_err(|e| mount_failed(name, e.to_string()))?;
        let source = v.get("secret").or_else(|| v.get("configMap"));
        let mode = source
            .and_then(|s| s["defaultMode"].as_u64())
            .and_then(|m| u32::try_from(m).ok())
            .unwrap_or(0o644);
        for (key, bytes) in contents {
            if key.contains('/') || key.starts_with('.') {
                return Err(mount_failed(name, format!("key {key:?} is not a file name")));
            }
            let f = at.join(&key);
            std::fs::write(&f, bytes)
                .and_then(|()| std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)))
                .map_err(|e| mount_failed(name, e.to_string()))?;
        }
        volumes.insert(name.to_owned(), at);
    }
    Ok(volumes)
}
