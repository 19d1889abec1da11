//! Which namzu containers `gc` may remove. A container is removed only on
//! proof that nothing owns it: made by this instance and its record proven
//! absent, or made by another instance ON THIS MACHINE (its machine label)
//! whose state directory is proven gone (ENOENT) or taken over by another
//! instance. A state directory that cannot be read (EACCES, ELOOP …), a
//! container from another machine sharing the daemon, or one without the
//! labels proves nothing: it is logged and left running.

use std::collections::HashMap;
use std::path::Path;

use super::{labels, short, DockerProvider};
use crate::error::{Error, Result};

/// This machine's id (`/etc/machine-id`, else D-Bus's copy, else the host
/// name): what tells a state directory on this machine from the same path
/// on another machine sharing the daemon.
pub fn machine_id() -> String {
    [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .map(|s| s.trim().to_owned())
    .find(|s| !s.is_empty())
    .unwrap_or_default()
}

/// What gc may conclude about a container another host instance made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Proven gone: its state directory, on this machine, is absent or now
    /// another instance's. The container may be removed.
    Gone(String),
    /// Its state directory is there and still its own.
    Alive,
    /// Nothing is proven (another machine, missing labels, a state
    /// directory that cannot be read): reported, never removed.
    Unknown(String),
}

/// Judges the owner of a container from its labels, reading its state
/// directory's instance file with `read` (the filesystem, in gc).
pub fn owner_of(
    labels: &HashMap<String, String>,
    this_machine: &str,
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Owner {
    let (Some(instance), Some(dir), Some(machine)) = (
        labels.get(labels::INSTANCE),
        labels.get(labels::STATE_DIR),
        labels.get(labels::MACHINE),
    ) else {
        return Owner::Unknown("it lacks the instance, state-dir or machine label".into());
    };
    if this_machine.is_empty() || machine != this_machine {
        return Owner::Unknown(format!("it was made on machine {machine:?}, not this one"));
    }
    let file = Path::new(dir).join("docker").join(".instance");
    match read(&file) {
        Ok(s) if s.trim() == instance => Owner::Alive,
        Ok(_) => Owner::Gone(format!("{dir} now belongs to another instance")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Owner::Gone(format!("{dir} is gone")),
        Err(e) => Owner::Unknown(format!("{} cannot be read: {e}", file.display())),
    }
}

impl DockerProvider {
    /// Removes containers whose host instance is PROVEN gone
    /// ([`Owner::Gone`]) or whose sandbox this instance no longer knows (its
    /// record proven absent). Anything unproven is logged and left.
    pub(super) async fn remove_orphans(&self) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        let machine = machine_id();
        for c in self.namzu_containers().await? {
            let labels = c.labels.unwrap_or_default();
            let Some(sandbox) = labels.get(labels::SANDBOX).cloned() else {
                continue;
            };
            let ours = labels.get(labels::INSTANCE) == Some(&self.instance);
            let owner = if ours {
                match self.state.read_meta(&sandbox) {
                    Err(Error::SandboxNotFound { .. }) => Owner::Gone("this instance has no record of it".into()),
                    Err(e) => Owner::Unknown(format!("its record cannot be read: {e}")),
                    Ok(_) => Owner::Alive,
                }
            } else {
                owner_of(&labels, &machine, |p| std::fs::read_to_string(p))
            };
            match owner {
                Owner::Gone(why) => {
                    if let Some(cid) = c.id {
                        tracing::info!(%sandbox, container = %short(&cid), why, "gc: removing an orphan");
                        self.remove_container(&cid).await?;
                        removed.push(sandbox);
                    }
                }
                Owner::Unknown(why) => {
                    tracing::warn!(%sandbox, why, "gc: cannot prove this container an orphan; left running")
                }
                Owner::Alive => {}
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn labelled(machine: Option<&str>) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (labels::INSTANCE.to_owned(), "inst-a".to_owned()),
            (labels::STATE_DIR.to_owned(), "/srv/namzu-a".to_owned()),
        ]);
        if let Some(m) = machine {
            l.insert(labels::MACHINE.to_owned(), m.to_owned());
        }
        l
    }

    fn err(kind: std::io::ErrorKind) -> impl Fn(&Path) -> std::io::Result<String> {
        move |_| Err(std::io::Error::from(kind))
    }

    /// Audit item 6: only a proven absence (or a state directory taken over
    /// by another instance) on this machine makes an orphan.
    #[test]
    fn only_proven_absence_on_this_machine_is_an_orphan() {
        let here = labelled(Some("m1"));
        assert!(matches!(
            owner_of(&here, "m1", err(std::io::ErrorKind::NotFound)),
            Owner::Gone(_)
        ));
        assert!(matches!(
            owner_of(&here, "m1", |_| Ok("inst-b\n".into())),
            Owner::Gone(_)
        ));
        assert_eq!(owner_of(&here, "m1", |_| Ok("inst-a\n".into())), Owner::Alive);
        // Unreadable is not absent.
        for kind in [
            std::io::ErrorKind::PermissionDenied,
            std::io::ErrorKind::Other,
            std::io::ErrorKind::TimedOut,
        ] {
            assert!(
                matches!(owner_of(&here, "m1", err(kind)), Owner::Unknown(_)),
                "{kind:?}"
            );
        }
        // Another machine sharing the daemon: its path means nothing here.
        assert!(matches!(
            owner_of(&here, "m2", err(std::io::ErrorKind::NotFound)),
            Owner::Unknown(_)
        ));
        // Made before the machine label, or by something else.
        assert!(matches!(
            owner_of(&labelled(None), "m1", err(std::io::ErrorKind::NotFound)),
            Owner::Unknown(_)
        ));
        // No machine id here: nothing can be proven.
        assert!(matches!(
            owner_of(&here, "", err(std::io::ErrorKind::NotFound)),
            Owner::Unknown(_)
        ));
        // The path read is the instance file under the labelled directory.
        let seen = std::sync::Mutex::new(None);
        owner_of(&here, "m1", |p| {
            *seen.lock().unwrap() = Some(p.to_path_buf());
            Ok("inst-a".into())
        });
        assert_eq!(
            seen.into_inner().unwrap().unwrap(),
            Path::new("/srv/namzu-a/docker/.instance")
        );
    }
}
