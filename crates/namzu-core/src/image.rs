//! What an image layer's entry may be refused for: shared by the image
//! store of the daemonless tiers and the error they report it with.

/// The longest entry path a layer may name (Linux's PATH_MAX). It also
/// bounds how deep the recursive removals of whiteouts can go.
pub const MAX_ENTRY_PATH: usize = 4096;

/// Why an entry of a layer was refused. The import stops at the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Its path is absolute or climbs with '..'.
    #[error("its path is absolute or climbs with '..'")]
    PathOutside,
    /// Its path is longer than bytes.
    #[error("its path is longer than {MAX_ENTRY_PATH} bytes")]
    PathTooLong,
    /// Its path crosses a symlink or a non-directory that the image made.
    #[error("its path crosses a symlink or a non-directory that the image made")]
    ThroughSymlink,
    /// It hard-links to an absolute or '..' path.
    #[error("it hard-links to an absolute or '..' path")]
    LinkOutside,
    /// It hard-links to a path the rootfs does not have.
    #[error("it hard-links to a path the rootfs does not have")]
    LinkMissing,
}
