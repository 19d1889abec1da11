//! A workspace's raw block device, made usable before anything is served:
//! probed, formatted ONLY when it provably carries no filesystem, and
//! mounted. This runs with CAP_SYS_ADMIN before the agent drops every
//! privilege (`--workspace-device`, with `--command-user`), on a device a
//! Kubernetes block-mode claim (`volumeDevices`) hands the pod — a device
//! that, after the first start, holds somebody's work.
//!
//! The rule that keeps a resumed workspace's disk from being reformatted:
//! `blkid` decides, and only its "nothing found" answer (exit status 2)
//! may lead to `mkfs`, and only once a raw read proves the device can be
//! read at all (status 2 also covers "could not read"). A missing tool, any
//! other status, or a found filesystem of no type stops the start, naming
//! what was seen; a filesystem this agent does not mount (swap, LUKS, an
//! unknown type) is refused, never overwritten.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Filesystems a workspace device may carry and be mounted with.
pub const MOUNTABLE: &[&str] = &["ext4", "ext3", "ext2", "xfs", "btrfs"];
/// What a blank device is formatted with.
pub const FORMAT: &str = "ext4";
/// Bytes read from the start of a device to prove it can be read.
const PROBE_READ: usize = 64 * 1024;

/// Why a device was not made usable. Nothing was written to it unless
/// the variant says so.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A tool the rule needs is not on `PATH`: nothing was decided.
    #[error("workspace device {}: {tool} not found on PATH ({path}); without it a filled disk cannot be told from a blank one, so nothing was done", device.display())]
    ToolMissing {
        /// The device.
        device: PathBuf,
        /// The tool.
        tool: String,
        /// The PATH searched.
        path: String,
    },
    /// `blkid` answered with a status that is neither "found" nor "nothing
    /// found".
    #[error("workspace device {}: blkid exited with {status:?}: {stderr}; refusing to touch the device", device.display())]
    Probe {
        /// The device.
        device: PathBuf,
        /// Its exit status (`None`: killed).
        status: Option<i32>,
        /// What it said.
        stderr: String,
    },
    /// `blkid` found something but printed no type.
    #[error("workspace device {}: blkid found a signature with no type; refusing to touch the device", device.display())]
    NoType {
        /// The device.
        device: PathBuf,
    },
    /// `blkid` found nothing, and the device could not be read either: an
    /// unreadable device is not a blank one.
    #[error("workspace device {}: blkid found nothing and the device cannot be read ({source}); not formatting what cannot be read", device.display())]
    Unreadable {
        /// The device.
        device: PathBuf,
        /// The read's failure.
        #[source]
        source: std::io::Error,
    },
    /// The device carries a filesystem (or other signature) this agent
    /// does not mount; it is left as it is.
    #[error("workspace device {} carries {found:?}, which is not one of {MOUNTABLE:?}; left as it is", device.display())]
    Unsupported {
        /// The device.
        device: PathBuf,
        /// What blkid reported.
        found: String,
    },
    /// Formatting a blank device failed (it may be partly written).
    #[error("workspace device {}: mkfs.{FORMAT} failed: {message}", device.display())]
    Format {
        /// The device.
        device: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Mounting (or taking ownership of) the filesystem failed.
    #[error("workspace device {}: mounting {fstype} at {}: {source}", device.display(), at.display())]
    Mount {
        /// The device.
        device: PathBuf,
        /// Its filesystem.
        fstype: String,
        /// Where.
        at: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// What `blkid` says a device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A filesystem (or signature) of this type.
    Found(String),
    /// No signature at all, and the device reads: a blank device.
    Blank,
}

/// The tools the rule needs, found on a `PATH` up front.
#[derive(Debug, Clone)]
pub struct Tools {
    blkid: PathBuf,
    mkfs: PathBuf,
}

impl Tools {
    /// Finds `blkid` and `mkfs.ext4` on `path` (a `PATH` value), or names
    /// the missing one.
    pub fn find(device: &Path, path: &str) -> Result<Self, DiskError> {
        let find = |tool: &str| {
            std::env::split_paths(path)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
                .ok_or_else(|| DiskError::ToolMissing {
                    device: device.to_owned(),
                    tool: tool.to_owned(),
                    path: path.to_owned(),
                })
        };
        Ok(Self {
            blkid: find("blkid")?,
            mkfs: find(&format!("mkfs.{FORMAT}"))?,
        })
    }
}

/// Probes `device`: `blkid`'s status 0 with a type is [`Probe::Found`];
/// status 2 is [`Probe::Blank`] only if the device's first bytes read.
pub fn probe(tools: &Tools, device: &Path) -> Result<Probe, DiskError> {
    let out = Command::new(&tools.blkid)
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .output()
        .map_err(|e| DiskError::Probe {
            device: device.to_owned(),
            status: None,
            stderr: e.to_string(),
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    match out.status.code() {
        Some(0) => {
            let found = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if found.is_empty() {
                return Err(DiskError::NoType {
                    device: device.to_owned(),
                });
            }
            Ok(Probe::Found(found))
        }
        Some(2) => {
            let mut buf = vec![0u8; PROBE_READ];
            std::fs::File::open(device)
                .and_then(|mut f| f.read_exact(&mut buf))
                .map_err(|source| DiskError::Unreadable {
                    device: device.to_owned(),
                    source,
                })?;
            Ok(Probe::Blank)
        }
        status => Err(DiskError::Probe {
            device: device.to_owned(),
            status,
            stderr,
        }),
    }
}

/// What [`prepare`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The device was blank and was formatted now.
    pub formatted: bool,
    /// The filesystem mounted.
    pub fstype: String,
}

/// Makes `device` the filesystem at `at`: formatted only when
/// [`probe`] calls it blank (then re-probed: it must read as
/// [`FORMAT`]), mounted `nosuid,nodev`; a fresh filesystem's root is given
/// to `owner` (uid, gid), an existing one is left as its holder left it.
pub fn prepare(tools: &Tools, device: &Path, at: &Path, owner: Option<(u32, u32)>) -> Result<Prepared, DiskError> {
    let (fstype, formatted) = match probe(tools, device)? {
        Probe::Found(t) if MOUNTABLE.contains(&t.as_str()) => (t, false),
        Probe::Found(found) => {
            return Err(DiskError::Unsupported {
                device: device.to_owned(),
                found,
            })
        }
        Probe::Blank => {
            format(tools, device)?;
            match probe(tools, device)? {
                Probe::Found(t) if t == FORMAT => (t, true),
                other => {
                    return Err(DiskError::Format {
                        device: device.to_owned(),
                        message: format!("after mkfs the device reads as {other:?}"),
                    })
                }
            }
        }
    };
    let mount_err = |source: std::io::Error| DiskError::Mount {
        device: device.to_owned(),
        fstype: fstype.clone(),
        at: at.to_owned(),
        source,
    };
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(device),
        at,
        Some(fstype.as_str()),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| mount_err(e.into()))?;
    if let (true, Some((uid, gid))) = (formatted, owner) {
        std::os::unix::fs::chown(at, Some(uid), Some(gid)).map_err(mount_err)?;
    }
    Ok(Prepared { formatted, fstype })
}

fn format(tools: &Tools, device: &Path) -> Result<(), DiskError> {
    let out = Command::new(&tools.mkfs)
        // -F: a whole device, not a partition; the probe decided it is blank.
        .args(["-q", "-F", "-L", "namzu-ws"])
        .arg(device)
        .output()
        .map_err(|e| DiskError::Format {
            device: device.to_owned(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(DiskError::Format {
            device: device.to_owned(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}
