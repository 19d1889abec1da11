//! Resource limits through cgroups, for the single-host tiers.
//!
//! cgroup v2 is used when the unified hierarchy offers the controller;
//! otherwise the v1 hierarchy of that controller (hybrid hosts often expose
//! only `hugetlb` on v2, so memory, pids and cpu live in v1 there). Each
//! sandbox's group is created *under the caller's own group*, so it never
//! escapes a limit the caller is already under. Which layout applied is
//! reported per controller. A limit that cannot be applied is refused with
//! [`Error::OptionRefused`] naming it; nothing is silently skipped.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::Resources;

/// The groups made for one sandbox: one directory per hierarchy used.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cgroups {
    /// The cgroup directories made, removed with the sandbox.
    pub dirs: Vec<PathBuf>,
    /// e.g. `memory=v1 pids=v1 cpu=v1`.
    pub report: String,
}

impl Cgroups {
    /// The files a process is moved in through.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Removes the groups; they must be empty (the sandbox is gone).
    pub fn remove(&self) {
        for d in &self.dirs {
            // A group empties asynchronously after its last process exits.
            for _ in 0..100 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        }
    }
}

#[derive(Debug)]
struct Mount {
    point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

fn mounts() -> Vec<Mount> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let point = pre.split_whitespace().nth(4).unwrap_or_default();
        let mut post = post.split_whitespace();
        let fstype = post.next().unwrap_or_default();
        let super_opts = post.nth(1).unwrap_or_default();
        match fstype {
            "cgroup2" => {
                let controllers = std::fs::read_to_string(Path::new(point).join("cgroup.controllers"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(String::from)
                    .collect();
                out.push(Mount {
                    point: point.into(),
                    v2: true,
                    controllers,
                });
            }
            "cgroup" => {
                let controllers = super_opts.split(',').map(String::from).collect();
                out.push(Mount {
                    point: point.into(),
                    v2: false,
                    controllers,
                });
            }
            _ => {}
        }
    }
    out
}

/// This process's group path in the hierarchy holding `controller` (v1) or
/// in the unified hierarchy (v2).
fn own_path(v2: bool, controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if v2 {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_owned())
    })
}

fn refuse(field: &str, reason: String) -> Error {
    Error::OptionRefused {
        tier: crate::spec::Tier::Local,
        option: format!("resources.{field}"),
        reason,
    }
}

/// Where `controller` can be used: (group directory for this sandbox, v2?).
fn place(controller: &str, id: &str, mounts: &[Mount]) -> Option<(PathBuf, bool)> {
    // v2 first, when it offers the controller.
    let m = mounts
        .iter()
        .find(|m| m.v2 && m.controllers.iter().any(|c| c == controller))
        .or_else(|| {
            mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
        })?;
    let own = own_path(m.v2, controller)?;
    let parent = m.point.join(own.trim_start_matches('/'));
    Some((parent.join(format!("namzu-{id}")), m.v2))
}

/// Creates the groups for `res` and writes the limits. Returns `None` when
/// nothing is asked for.
pub fn create(id: &str, res: &Resources) -> Result<Option<Cgroups>> {
    // The disk is not a cgroup's: only memory, pids and cpu are made here.
    if res.memory_bytes.is_none() && res.pids.is_none() && res.cpus.is_none() {
        return Ok(None);
    }
    if let Some(c) = res.cpus {
        if !(c.is_finite() && c > 0.0) {
            return Err(refuse("cpus", format!("must be a positive number of CPUs, got {c}")));
        }
    }
    let mounts = mounts();
    let mut made = Cgroups::default();
    let mut report = Vec::new();
    let wanted = [
        ("memory", "memory_bytes", res.memory_bytes.is_some()),
        ("pids", "pids", res.pids.is_some()),
        ("cpu", "cpus", res.cpus.is_some()),
    ];
    let result = (|| {
        for (controller, field, asked) in wanted {
            if !asked {
                continue;
            }
            let (dir, v2) = place(controller, id, &mounts).ok_or_else(|| {
                refuse(
                    field,
                    format!("no cgroup hierarchy offers the {controller} controller here"),
                )
            })?;
            if !made.dirs.contains(&dir) {
                std::fs::create_dir(&dir)
                    .map_err(|e| refuse(field, format!("cannot create {}: {e}", dir.display())))?;
                made.dirs.push(dir.clone());
            }
            let w = |file: &str, value: String| {
                std::fs::write(dir.join(file), &value).map_err(|e| {
                    refuse(
                        field,
                        format!("cannot write {value} to {}: {e}", dir.join(file).display()),
                    )
                })
            };
            if v2 {
                // The parent must hand the controller down.
                if let Some(parent) = dir.parent() {
                    let _ = std::fs::write(parent.join("cgroup.subtree_control"), format!("+{controller}"));
                }
            }
            match (controller, v2) {
                ("memory", true) => {
                    w("memory.max", res.memory_bytes.unwrap_or(0).to_string())?;
                    w("memory.swap.max", "0".into())?;
                }
                ("memory", false) => w("memory.limit_in_bytes", res.memory_bytes.unwrap_or(0).to_string())?,
                ("pids", _) => w("pids.max", res.pids.unwrap_or(0).to_string())?,
                ("cpu", true) => w("cpu.max", format!("{} 100000", cpu_quota(res)))?,
                ("cpu", false) => {
                    w("cpu.cfs_period_us", "100000".into())?;
                    w("cpu.cfs_quota_us", cpu_quota(res).to_string())?;
                }
                _ => {}
            }
            report.push(format!("{controller}=cgroup{}", if v2 { "v2" } else { "v1" }));
        }
        Ok::<_, Error>(())
    })();
    match result {
        Ok(()) => {
            made.report = report.join(" ");
            Ok(Some(made))
        }
        Err(e) => {
            made.remove();
            Err(e)
        }
    }
}

fn cpu_quota(res: &Resources) -> u64 {
    (res.cpus.unwrap_or(1.0) * 100_000.0).round().max(1000.0) as u64
}
