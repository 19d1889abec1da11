//! A simulated pod's volumes, made on the node as a kubelet makes them:
//! `emptyDir` (an empty directory), `secret` and `configMap` (each key a
//! file, mode `defaultMode` or 0644, from the object in the pod's
//! namespace), and `persistentVolumeClaim` (the claim's own directory on
//! the node, which outlives the pod). A Secret or ConfigMap that does not exist leaves the pod
//! waiting in `ContainerCreating` with the kubelet's mount message, as on
//! a cluster; nothing is guessed in its place.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use serde_json::Value;

use crate::server::Simulator;

use super::{CONFIG_MAPS, PVCS, SECRETS};

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

/// Where a PVC's data lives on the node: keyed by the PVC's uid, under
/// `pv_root`, so it outlives every pod that mounts it (and goes with the
/// simulated node, not with the PVC object: no provisioner reclaims it).
fn claimed(sim: &Simulator, ns: &str, v: &Value, pv_root: &Path) -> Result<PathBuf, String> {
    let claim = v["persistentVolumeClaim"]["claimName"].as_str().unwrap_or_default();
    let pvc = sim
        .object(PVCS.0, PVCS.1, PVCS.2, ns, claim)
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .ok_or_else(|| format!("persistentvolumeclaim {claim:?} not found"))?;
    let at = pv_root.join(pvc["metadata"]["uid"].as_str().unwrap_or(claim));
    std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
    // On a cluster the pod's `fsGroup` makes the volume its group's; here
    // the pod's ids are the sandbox's mapped ones, unknown until it starts,
    // so the volume is open to all (under the node's state directory,
    // which no one else on the host can enter).
    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o777)).map_err(|e| e.to_string())?;
    Ok(at)
}

/// Makes every volume of `pod` under `dir` (a PVC's under `pv_root`);
/// returns where each is, or the kubelet's message for the one that could
/// not be set up.
pub(super) fn make(
    sim: &Simulator,
    pod: &Value,
    dir: &Path,
    pv_root: &Path,
) -> Result<HashMap<String, PathBuf>, String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut volumes = HashMap::new();
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let Some(name) = v["name"].as_str() else { continue };
        if v.get("persistentVolumeClaim").is_some() {
            let at = claimed(sim, ns, v, pv_root).map_err(|m| mount_failed(name, m))?;
            volumes.insert(name.to_owned(), at);
            continue;
        }
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
