//! The curated `/etc` of the host view: which of the host's files and
//! directories a sandbox sees, and a shared, read-only copy of them made
//! once per state of the host's `/etc` instead of once per sandbox.
//!
//! The launcher (host credentials, before it forks) calls [`cached`]: it
//! fingerprints the host's curated files (inode, size, times, mode, link
//! target), and returns `<cache>/<fingerprint>`, building it first when it
//! is missing — in a temporary directory renamed into place, so a reader
//! never sees half of one and two launchers building the same one at once
//! both end up using the one that won. The init binds it read-only at
//! `/etc` and the [`ETC_DIRS`] over their empty mount points. What differs
//! per sandbox is not in it: `/etc/machine-id` is a link to
//! [`MACHINE_ID`], written fresh into the sandbox's own `/run`.
//!
//! Anything not named in [`ETC_FILES`] — shadow, gshadow, sudoers, ssh
//! host keys, the host's machine-id, credentials — never enters a copy.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Files of the host's /etc copied in.
pub const ETC_FILES: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "profile",
    "bash.bashrc",
    "environment",
    "shells",
    "inputrc",
    "protocols",
    "services",
    "networks",
    "mime.types",
    "issue",
];

/// Directories of the host's /etc shown read-only (bound over the copy).
pub const ETC_DIRS: &[&str] = &[
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "profile.d",
    "skel",
];

/// Where `/etc/machine-id` points: a file of the sandbox's own `/run`,
/// written with a fresh identity at every start.
pub const MACHINE_ID: &str = "/run/machine-id";

/// Bumped whenever what a copy holds changes, so no old copy is reused.
const FORMAT: u32 = 1;

/// A fingerprint of everything a copy is made of.
fn fingerprint(hostname: &str, resolv_conf: &[u8]) -> std::io::Result<String> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (FORMAT, hostname, resolv_conf).hash(&mut h);
    for name in ETC_FILES.iter().chain(ETC_DIRS) {
        let path = Path::new("/etc").join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) => {
                (name, m.dev(), m.ino(), m.size(), m.mode()).hash(&mut h);
                (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()).hash(&mut h);
                if m.file_type().is_symlink() {
                    std::fs::read_link(&path)?.hash(&mut h);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (name, "absent").hash(&mut h),
            Err(e) => return Err(e),
        }
    }
    Ok(format!("{:016x}", h.finish()))
}

/// Writes a copy into `dir` (which exists and is empty).
fn build(dir: &Path, hostname: &str, resolv_conf: &[u8]) -> std::io::Result<()> {
    for name in ETC_FILES {
        let host = Path::new("/etc").join(name);
        let target = dir.join(name);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => std::os::unix::fs::symlink(std::fs::read_link(&host)?, &target)?,
            Ok(m) if m.is_file() => {
                std::fs::copy(&host, &target)?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    for name in ETC_DIRS {
        if Path::new("/etc").join(name).is_dir() {
            std::fs::create_dir(dir.join(name))?;
        }
    }
    std::fs::write(dir.join("hostname"), format!("{hostname}\n"))?;
    std::fs::write(dir.join("resolv.conf"), resolv_conf)?;
    std::os::unix::fs::symlink(MACHINE_ID, dir.join("machine-id"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// The copy for the host's /etc as it is now, beneath `cache` (made if
/// missing, mode 0755 with the host files' own modes).
pub fn cached(cache: &Path, hostname: &str, resolv_conf: &[u8]) -> std::io::Result<PathBuf> {
    let at = cache.join(fingerprint(hostname, resolv_conf)?);
    if at.is_dir() {
        return Ok(at);
    }
    std::fs::create_dir_all(cache)?;
    let tmp = cache.join(format!(".tmp-{}-{:08x}", std::process::id(), rand::random::<u32>()));
    std::fs::create_dir(&tmp)?;
    let made = build(&tmp, hostname, resolv_conf).and_then(|()| std::fs::rename(&tmp, &at));
    match made {
        Ok(()) => Ok(at),
        // Another launcher put the same copy in place first.
        Err(_) if at.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(at)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_copy_per_state_of_etc_and_nothing_secret_in_it() {
        let cache = tempfile::tempdir().unwrap();
        let a = cached(cache.path(), "namzu", b"nameserver 127.0.0.1\n").unwrap();
        let again = cached(cache.path(), "namzu", b"nameserver 127.0.0.1\n").unwrap();
        assert_eq!(a, again, "an unchanged /etc reuses its copy");
        let other = cached(cache.path(), "other", b"nameserver 127.0.0.1\n").unwrap();
        assert_ne!(a, other, "what goes into a copy is part of its name");
        assert_eq!(std::fs::read_to_string(a.join("hostname")).unwrap(), "namzu\n");
        assert_eq!(std::fs::read_link(a.join("machine-id")).unwrap(), Path::new(MACHINE_ID));
        if Path::new("/etc/passwd").is_file() {
            assert_eq!(
                std::fs::read(a.join("passwd")).unwrap(),
                std::fs::read("/etc/passwd").unwrap()
            );
        }
        for secret in ["shadow", "gshadow", "sudoers", "ssh"] {
            assert!(!a.join(secret).exists(), "{secret} was copied");
        }
        let left: Vec<_> = std::fs::read_dir(cache.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(left.is_empty(), "no temporary directory is left behind");
    }
}
