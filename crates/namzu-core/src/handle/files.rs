//! [`Files`]: files inside a sandbox, confined beneath its roots. Writes
//! are atomic (a failed write leaves the old file); reads and writes of
//! any size stream.

use std::path::Path;

use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::client::{AgentClient, ByteStream, FileInfoStream, WatchStream};
use crate::error::Result;
use crate::types::{ByteRange, FileData, FileInfo, WalkOptions, WriteOptions};

/// Files of one sandbox; from [`Sandbox::files`](crate::Sandbox::files).
/// Relative paths are relative to the sandbox's working directory.
#[derive(Clone, Copy)]
pub struct Files<'a> {
    agent: &'a AgentClient,
}

impl<'a> Files<'a> {
    pub(super) fn new(agent: &'a AgentClient) -> Self {
        Self { agent }
    }

    /// The whole file (bounded by the agent's `max_read_bytes`; use
    /// [`Self::stream`] for larger files).
    pub async fn read(self, path: impl AsRef<Path>) -> Result<Bytes> {
        Ok(self.agent.read_file(path.as_ref(), None).await?.data)
    }

    /// Part of a file, with the file's size and whether the read reached
    /// its end.
    pub async fn read_range(self, path: impl AsRef<Path>, range: ByteRange) -> Result<FileData> {
        self.agent.read_file(path.as_ref(), Some(range)).await
    }

    /// The file as a stream of chunks, any size.
    pub async fn stream(self, path: impl AsRef<Path>) -> Result<ByteStream> {
        self.agent.read_file_stream(path.as_ref(), None).await
    }

    /// Part of the file as a stream of chunks.
    pub async fn stream_range(self, path: impl AsRef<Path>, range: ByteRange) -> Result<ByteStream> {
        self.agent.read_file_stream(path.as_ref(), Some(range)).await
    }

    /// Replaces the file's content atomically (new files get mode 0644);
    /// returns the bytes written.
    pub async fn write(self, path: impl AsRef<Path>, data: impl Into<Bytes>) -> Result<u64> {
        self.write_with(path, data, WriteOptions::default()).await
    }

    /// [`Self::write`] with options (mode of a new file, create parents).
    pub async fn write_with(self, path: impl AsRef<Path>, data: impl Into<Bytes>, opts: WriteOptions) -> Result<u64> {
        self.agent.write_file(path.as_ref(), data.into(), opts).await
    }

    /// Streams `reader` into the file atomically, any size: the file
    /// appears whole when the reader ends, and not at all if it fails.
    pub async fn write_from<R>(self, path: impl AsRef<Path>, reader: R, opts: WriteOptions) -> Result<u64>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        self.agent.write_file_from(path.as_ref(), reader, opts).await
    }

    /// The entries of a directory.
    pub async fn list(self, path: impl AsRef<Path>) -> Result<Vec<FileInfo>> {
        self.agent.list_files(path.as_ref()).await
    }

    /// Every entry beneath `root`, streamed, depth-first; bounded by
    /// `opts.max_entries`.
    pub async fn walk(self, root: impl AsRef<Path>, opts: WalkOptions) -> Result<FileInfoStream> {
        self.agent.walk_files(root.as_ref(), opts).await
    }

    /// Changes under the directory `path` (and beneath it, when
    /// `recursive`) from now on, until the stream is dropped: creates,
    /// writes, removes, renames and attribute changes, each named relative
    /// to `path`.
    pub async fn watch(self, path: impl AsRef<Path>, recursive: bool) -> Result<WatchStream> {
        self.agent.watch_dir(path.as_ref(), recursive).await
    }

    /// What is at `path` (a symlink itself, not its target).
    pub async fn stat(self, path: impl AsRef<Path>) -> Result<FileInfo> {
        self.agent.stat(path.as_ref()).await
    }

    /// Creates one directory; its parent must exist.
    pub async fn mkdir(self, path: impl AsRef<Path>) -> Result<()> {
        self.agent.mkdir(path.as_ref(), false).await
    }

    /// Creates a directory and any missing parents; an existing directory
    /// is fine.
    pub async fn mkdir_all(self, path: impl AsRef<Path>) -> Result<()> {
        self.agent.mkdir(path.as_ref(), true).await
    }

    /// Removes a file, a symlink or an empty directory.
    pub async fn remove(self, path: impl AsRef<Path>) -> Result<()> {
        self.agent.remove(path.as_ref(), false).await
    }

    /// Removes a directory and everything beneath it (or a single file).
    pub async fn remove_all(self, path: impl AsRef<Path>) -> Result<()> {
        self.agent.remove(path.as_ref(), true).await
    }

    /// Renames within the sandbox, replacing the destination atomically.
    pub async fn rename(self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.agent.rename(from.as_ref(), to.as_ref()).await
    }
}
