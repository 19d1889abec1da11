//! Puts back what a suspend saved of the sandbox's writable tmpfs's (the
//! host's archive, [`namzu_proto::launch::LaunchSpec::restore`]), run by
//! G after the pivot and before any hardening: as the sandbox's root, with
//! the capabilities of its own user namespace, so owners, modes and times
//! come back as the sandbox saw them.
//!
//! Only entries beneath [`SAVED_DIRS`] are unpacked; anything else in the
//! archive is skipped. Each entry is unpacked by the `tar` crate's
//! `unpack_in`, which refuses a path that climbs out with `..` or through a
//! symlink; and since this runs inside the sandbox's own root, the worst an
//! archive could do is write the sandbox's own files.

use std::path::{Component, Path};

use namzu_proto::launch::SAVED_DIRS;

/// Unpacks the archive into `/`. Returns how many entries were put back.
pub fn unpack(file: std::fs::File) -> std::io::Result<u64> {
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut restored = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if !beneath_saved(&path) {
            tracing::warn!(path = %path.display(), "skipped an archive entry outside the saved directories");
            continue;
        }
        // The tar crate would unpack a FIFO as an empty regular file.
        if entry.header().entry_type() == tar::EntryType::Fifo {
            fifo(&Path::new("/").join(&path), entry.header())?;
            restored += 1;
        } else if entry.unpack_in("/")? {
            restored += 1;
        }
    }
    Ok(restored)
}

/// Makes the named pipe an archive entry describes, with its owner and mode.
fn fifo(path: &Path, h: &tar::Header) -> std::io::Result<()> {
    let mode = h.mode()? & 0o7777;
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let id = |v: u64| u32::try_from(v).unwrap_or(65534);
    nix::unistd::fchownat(
        None,
        path,
        Some(nix::unistd::Uid::from_raw(id(h.uid()?))),
        Some(nix::unistd::Gid::from_raw(id(h.gid()?))),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    // The umask took bits from mkfifo's mode.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

/// Whether `path` (relative, as archived) lies in one of [`SAVED_DIRS`].
fn beneath_saved(path: &Path) -> bool {
    let mut parts = path.components().filter(|c| !matches!(c, Component::CurDir));
    let first = match parts.next() {
        Some(Component::Normal(first)) => first,
        _ => return false,
    };
    SAVED_DIRS.iter().any(|d| first == *d) && parts.all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_beneath_the_saved_directories_are_taken() {
        for ok in ["tmp", "tmp/a", "./home/u/.bashrc", "root/x/y"] {
            assert!(beneath_saved(Path::new(ok)), "{ok}");
        }
        for no in ["etc/passwd", "/tmp/a", "tmp/../etc/x", "workspace/a", "", "usr"] {
            assert!(!beneath_saved(Path::new(no)), "{no}");
        }
    }
}
