//! Requests and results of file operations: entries, writes, reads,
//! walks and watches.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::SystemTime;

use bytes::Bytes;

/// What a file-system entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else: a device, socket or pipe.
    Other,
}

/// One file-system entry inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Full path (walk, stat) or the name joined to the listed directory.
    pub path: PathBuf,
    /// The entry name.
    pub name: OsString,
    /// What kind of entry.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification time.
    pub mtime: SystemTime,
    /// A symlink's target, as stored.
    pub symlink_target: Option<PathBuf>,
    /// Walk only: 1 for direct children of the root.
    pub depth: u32,
}

/// Options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Mode of a new file (default 0644). An existing file keeps its own.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
}

/// What changed, in a [`WatchEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchKind {
    /// Created, or moved in.
    Create,
    /// Written to.
    Write,
    /// Removed.
    Remove,
    /// Moved away (its new name, if inside the watched tree, is a Create).
    Rename,
    /// Its permissions or other attributes changed.
    Chmod,
    /// The kernel's queue overflowed: events between were lost.
    Overflow,
}

impl WatchKind {
    /// Its name on the HTTP API and in the CLI: `create`, `write`,
    /// `remove`, `rename`, `chmod`, `overflow`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Write => "write",
            Self::Remove => "remove",
            Self::Rename => "rename",
            Self::Chmod => "chmod",
            Self::Overflow => "overflow",
        }
    }
}

/// One change under a watched directory; from
/// [`crate::Files::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// What happened.
    pub kind: WatchKind,
    /// The entry, relative to the watched directory.
    pub name: PathBuf,
    /// The entry is a directory.
    pub is_dir: bool,
}

/// A range of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// The log offset to resume from.
    pub offset: u64,
    /// `None`: to the end of the file.
    pub length: Option<u64>,
}

/// What a (ranged) read returned.
#[derive(Debug, Clone)]
pub struct FileData {
    /// The bytes.
    pub data: Bytes,
    /// Size of the whole file.
    pub file_size: u64,
    /// The read reached the end of the file.
    pub eof: bool,
}

/// How a walk goes, each bound with a default.
#[derive(Debug, Clone, Default)]
pub struct WalkOptions {
    /// 0: the agent's default budget. More entries than this end the walk
    /// with [`crate::Error::WalkLimit`].
    pub max_entries: u32,
    /// 0: unlimited; 1: only the root's children.
    pub max_depth: u32,
    /// Include names starting with a dot.
    pub include_hidden: bool,
}

impl WriteOptions {
    /// Mode of a new file (an existing file keeps its own).
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Create missing parent directories.
    pub fn create_parents(mut self, yes: bool) -> Self {
        self.create_parents = yes;
        self
    }
}

impl WalkOptions {
    /// More entries than this end the walk with [`crate::Error::WalkLimit`].
    pub fn max_entries(mut self, n: u32) -> Self {
        self.max_entries = n;
        self
    }

    /// 1: only the root's children.
    pub fn max_depth(mut self, n: u32) -> Self {
        self.max_depth = n;
        self
    }

    /// Include names starting with a dot.
    pub fn include_hidden(mut self, yes: bool) -> Self {
        self.include_hidden = yes;
        self
    }
}
