//! Puts back what a suspend saved of the sandbox's writable tmpfs's (the
//! host's archive, [`namzu_proto::launch::LaunchSpec::restore`]), run by
//! G after the pivot and before any hardening: as the sandbox's root, with
//! the capabilities of its own user namespace, so owners, modes and times
//! come back as the sandbox saw them. Only entries beneath
//! [`SAVED_DIRS`] are taken ([`crate::archive::unpack`]); and since this
//! runs inside the sandbox's own root, the worst an archive could do is
//! write the sandbox's own files.

use std::path::Path;

use namzu_proto::launch::SAVED_DIRS;

/// Unpacks the archive into `/`. Returns how many entries were put back.
pub fn unpack(file: std::fs::File) -> std::io::Result<u64> {
    crate::archive::unpack(file, Path::new("/"), SAVED_DIRS)
}
