//! What the simulated kubelet does before a pod's workload runs, as a
//! node would: every container's image must be in the node's cache
//! ([`crate::images`]; else `ErrImageNeverPull`); `emptyDir` volumes are
//! made; init containers run in order, from their images, with their
//! volume mounts (the agent image's `--install` copies the agent into an
//! `emptyDir`); and the workload's command must exist where the container
//! sees it — in a mounted volume or in its image's root filesystem — else
//! the container cannot start. The workload then runs from its image's
//! root filesystem: a command the image lacks (`/bin/sh` in a FROM
//! scratch image) fails there as it would on a cluster.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use namzu::image::ImageStore;
use namzu_proto::link_tls::ServerFiles;
use serde_json::Value;

use crate::server::Simulator;

/// What the workload runs: the agent as its container sees it (the file
/// on the host), and its image.
pub(super) struct Prepared {
    pub agent: PathBuf,
    pub image: String,
    /// The pod's volumes on the host, removed with the pod.
    pub volumes: PathBuf,
    /// The link TLS the agent's arguments name, as node paths.
    pub tls: Option<ServerFiles>,
    /// The workload's PVC mounts, shown in the sandbox.
    pub binds: Vec<namzu::Bind>,
}

/// Why a pod's containers cannot run, as its status says it.
#[derive(Debug)]
pub(super) struct PodError {
    /// The waiting reason (`ErrImageNeverPull`, `CrashLoopBackOff`, …).
    pub reason: &'static str,
    pub message: String,
    /// The container it happened to, and whether it is an init container.
    pub container: String,
    pub init: bool,
}

fn fail(reason: &'static str, c: &Value, init: bool, message: String) -> PodError {
    PodError {
        reason,
        message,
        container: c["name"].as_str().unwrap_or_default().to_owned(),
        init,
    }
}

/// Where `path` is, as container `c` sees it: under one of its volume
/// mounts, or in its image's root filesystem.
fn resolve(c: &Value, path: &str, volumes: &HashMap<String, PathBuf>, rootfs: &Path) -> PathBuf {
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let (Some(mp), Some(name)) = (m["mountPath"].as_str(), m["name"].as_str()) else {
            continue;
        };
        let mp = mp.trim_end_matches('/');
        let rest = if path == mp {
            Some("")
        } else {
            path.strip_prefix(&format!("{mp}/"))
        };
        if let (Some(rest), Some(dir)) = (rest, volumes.get(name)) {
            return dir.join(rest);
        }
    }
    rootfs.join(path.trim_start_matches('/'))
}

/// Where container `c`'s command `exe` is on the node, if it is there
/// and executable; else the container cannot start (`hint` says why not
/// in this pod's terms).
fn entrypoint(
    c: &Value,
    init: bool,
    exe: &str,
    (volumes, rootfs): (&HashMap<String, PathBuf>, &Path),
    hint: &str,
) -> Result<PathBuf, PodError> {
    let p = resolve(c, exe, volumes, rootfs);
    if std::fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
        return Ok(p);
    }
    Err(fail(
        "CrashLoopBackOff",
        c,
        init,
        format!("exec: {exe:?}: stat {exe}: no such file or directory{hint}"),
    ))
}

/// The command line a container runs: `command` then `args`.
fn argv(c: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .flat_map(|k| c[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// Readies `pod` on the node under `state_dir`.
pub(super) async fn prepare(sim: &Simulator, pod: &Value, state_dir: &Path) -> Result<Prepared, PodError> {
    let store = ImageStore::new(state_dir);
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("pod");
    let volumes_dir = state_dir.join("sim-pods").join(uid);
    let pv_root = state_dir.join("sim-pv");
    let volumes =
        super::volumes::make(sim, pod, &volumes_dir.join("volumes"), &pv_root).map_err(|message| PodError {
            reason: "ContainerCreating",
            message,
            container: String::new(),
            init: false,
        })?;
    let image_of = |c: &Value, init: bool| -> Result<(String, PathBuf), PodError> {
        let image = c["image"].as_str().unwrap_or_default().to_owned();
        let rootfs = store.resolve(&image).map_err(|_| {
            fail(
                "ErrImageNeverPull",
                c,
                init,
                format!("Container image {image:?} is not present with pull policy of Never (the simulated node's cache: crate::images)"),
            )
        })?;
        Ok((image, rootfs))
    };
    for c in pod["spec"]["initContainers"].as_array().into_iter().flatten() {
        let (_, rootfs) = image_of(c, true)?;
        let argv = argv(c);
        let Some(exe) = argv.first() else {
            return Err(fail(
                "CrashLoopBackOff",
                c,
                true,
                "the init container has no command".into(),
            ));
        };
        let exe_path = entrypoint(c, true, exe, (&volumes, &rootfs), "")?;
        // Paths in its arguments are the container's: mapped to where the
        // node keeps them.
        let args: Vec<PathBuf> = argv[1..]
            .iter()
            .map(|a| {
                if a.starts_with('/') {
                    resolve(c, a, &volumes, &rootfs)
                } else {
                    PathBuf::from(a)
                }
            })
            .collect();
        let run = tokio::process::Command::new(&exe_path).args(&args).env_clear().output();
        match tokio::time::timeout(Duration::from_secs(60), run).await {
            Ok(Ok(out)) if out.status.success() => {}
            Ok(Ok(out)) => {
                return Err(fail(
                    "CrashLoopBackOff",
                    c,
                    true,
                    format!(
                        "init container exited {}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ))
            }
            Ok(Err(e)) => return Err(fail("CrashLoopBackOff", c, true, format!("exec: {exe:?}: {e}"))),
            Err(_) => return Err(fail("CrashLoopBackOff", c, true, "init container ran over 60 s".into())),
        }
    }
    let c = &pod["spec"]["containers"][0];
    let (image, rootfs) = image_of(c, false)?;
    let Some(entry) = c["command"].as_array().and_then(|a| a.first()).and_then(Value::as_str) else {
        return Err(fail(
            "RunContainerError",
            c,
            false,
            "the simulator runs a container's `command`; this one has none".into(),
        ));
    };
    let agent = entrypoint(
        c,
        false,
        entry,
        (&volumes, &rootfs),
        ": nothing put the agent there (an init container that installs it into a mounted emptyDir, or an image that carries it)",
    )?;
    if agent.file_name().and_then(|n| n.to_str()) != Some("namzu-agent") {
        return Err(fail(
            "RunContainerError",
            c,
            false,
            format!("the simulator's pods run the namzu agent as their command, not {entry:?}"),
        ));
    }
    let tls = link_tls(c, (&volumes, &rootfs))?;
    // A PVC is where the workload container mounts it (the sandbox shows
    // nothing else of the pod's volumes: its agent runs from the node).
    let claimed: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("persistentVolumeClaim").is_some())
        .filter_map(|v| v["name"].as_str())
        .collect();
    let binds = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["name"].as_str().is_some_and(|n| claimed.contains(&n)))
        .filter_map(|m| {
            Some(namzu::Bind {
                source: volumes.get(m["name"].as_str()?)?.clone(),
                target: m["mountPath"].as_str()?.into(),
                writable: m["readOnly"] != true,
            })
        })
        .collect();
    Ok(Prepared {
        agent,
        image,
        volumes: volumes_dir,
        tls,
        binds,
    })
}

/// The workload agent's `--tls-cert`, `--tls-key` and `--tls-client-ca`
/// (with `--consume-tls-key`), mapped to where the node keeps them; each
/// must be there, as the agent would find it, or the container crashes.
fn link_tls(c: &Value, (volumes, rootfs): (&HashMap<String, PathBuf>, &Path)) -> Result<Option<ServerFiles>, PodError> {
    let args = argv(c);
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let (Some(cert), Some(key), Some(ca)) = (flag("--tls-cert"), flag("--tls-key"), flag("--tls-client-ca")) else {
        return Ok(None);
    };
    let node = |p: &str| -> Result<String, PodError> {
        let at = resolve(c, p, volumes, rootfs);
        if !at.is_file() {
            return Err(fail(
                "CrashLoopBackOff",
                c,
                false,
                format!("the link's TLS: {p}: No such file or directory"),
            ));
        }
        Ok(at.to_string_lossy().into_owned())
    };
    Ok(Some(ServerFiles {
        cert: node(cert)?,
        key: node(key)?,
        client_ca: node(ca)?,
        consume_key: args.iter().any(|a| a == "--consume-tls-key"),
    }))
}
