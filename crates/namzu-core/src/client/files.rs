//! Files: atomic writes (whole or streamed), reads and ranged streams, listing, walking, stat, mkdir, remove, rename.

use super::link::*;

impl AgentClient {
    /// Writes `data` to `path` atomically.
    pub async fn write_file(&self, path: &Path, data: Bytes, opts: WriteOptions) -> Result<u64> {
        const OP: &str = "write_file";
        self.require(OP, feat::FILES_WRITE)?;
        let total = data.len() as u64;
        if let Some(mut sock) = self.side_write_start(OP, &begin(path, &opts)).await? {
            for part in data.chunks(super::side_write::FRAME_BYTES) {
                self.side_write_data(OP, &mut sock, part).await?;
            }
            return self.side_write_finish(OP, sock, total).await;
        }
        let chunk = self.inner.write_chunk;
        let chunks = (0..data.len()).step_by(chunk).map(move |i| {
            let end = (i + chunk).min(data.len());
            v1::WriteFileRequest {
                msg: Some(write_file_request::Msg::Data(data.slice(i..end))),
            }
        });
        let msgs = std::iter::once(begin_msg(path, &opts))
            .chain(chunks)
            .chain(std::iter::once(v1::WriteFileRequest {
                msg: Some(write_file_request::Msg::Commit(v1::WriteCommit { total_bytes: total })),
            }));
        let r = self
            .rpc()
            .write_file(futures::stream::iter(msgs))
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        self.answered_by(&r.boot_id);
        Ok(r.bytes_written)
    }

    /// Writes everything `reader` yields to `path` atomically, streaming. A
    /// read error aborts the write; the old file stays.
    pub async fn write_file_from<R>(&self, path: &Path, mut reader: R, opts: WriteOptions) -> Result<u64>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        const OP: &str = "write_file";
        self.require(OP, feat::FILES_WRITE)?;
        if let Some(mut sock) = self.side_write_start(OP, &begin(path, &opts)).await? {
            // A local read error drops the stream before END: the agent
            // replaces nothing.
            let mut buf = vec![0u8; super::side_write::FRAME_BYTES];
            let mut total = 0u64;
            loop {
                let n = reader
                    .read(&mut buf)
                    .await
                    .map_err(|source| Error::LocalIo { op: OP.into(), source })?;
                if n == 0 {
                    return self.side_write_finish(OP, sock, total).await;
                }
                self.side_write_data(OP, &mut sock, &buf[..n]).await?;
                total += n as u64;
            }
        }
        let (tx, rx) = mpsc::channel(4);
        let begin = begin_msg(path, &opts);
        let chunk = self.inner.write_chunk;
        let pump = tokio::spawn(async move {
            if tx.send(begin).await.is_err() {
                return Ok(());
            }
            let mut total = 0u64;
            loop {
                let mut buf = Vec::with_capacity(chunk);
                let n = (&mut reader).take(chunk as u64).read_to_end(&mut buf).await?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                let msg = v1::WriteFileRequest {
                    msg: Some(write_file_request::Msg::Data(buf.into())),
                };
                if tx.send(msg).await.is_err() {
                    return Ok(());
                }
            }
            let _ = tx
                .send(v1::WriteFileRequest {
                    msg: Some(write_file_request::Msg::Commit(v1::WriteCommit { total_bytes: total })),
                })
                .await;
            Ok::<_, io::Error>(())
        });
        let r = self.rpc().write_file(ReceiverStream::new(rx)).await;
        // A local read error explains the failure better than the agent's
        // "ended without commit".
        if let Ok(Err(source)) = pump.await {
            return Err(Error::LocalIo { op: OP.into(), source });
        }
        let r = r.map_err(|s| self.status(OP, s))?.into_inner();
        self.answered_by(&r.boot_id);
        Ok(r.bytes_written)
    }

    /// Reads a whole file, or a range of it.
    pub async fn read_file(&self, path: &Path, range: Option<ByteRange>) -> Result<FileData> {
        const OP: &str = "read_file";
        self.require(OP, feat::FILES_READ)?;
        let (offset, length) = range.map_or((0, None), |r| (r.offset, r.length));
        let r = self
            .rpc()
            .read_file(v1::ReadFileRequest {
                path: path_bytes(path),
                offset,
                length,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        self.answered_by(&r.boot_id);
        Ok(FileData {
            data: r.data,
            file_size: r.file_size,
            eof: r.eof,
        })
    }

    /// Streams a file (or a range) in chunks; memory stays bounded on both
    /// ends whatever the size.
    pub async fn read_file_stream(&self, path: &Path, range: Option<ByteRange>) -> Result<ByteStream> {
        const OP: &str = "read_file_stream";
        self.require(OP, feat::FILES_READ_STREAM)?;
        let (offset, length) = range.map_or((0, None), |r| (r.offset, r.length));
        let req = v1::ReadFileStreamRequest {
            path: path_bytes(path),
            offset,
            length,
        };
        if let Some(s) = self.side_read_stream(OP, &req).await? {
            return Ok(s);
        }
        let s = self
            .rpc()
            .read_file_stream(req)
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let me = self.clone();
        Ok(Box::pin(
            s.map(move |r| r.map(|c| c.data).map_err(|s| me.status(OP, s))),
        ))
    }

    /// The entries of a directory.
    pub async fn list_files(&self, path: &Path) -> Result<Vec<FileInfo>> {
        const OP: &str = "list_files";
        self.require(OP, feat::FILES_LIST)?;
        let r = self
            .rpc()
            .list_files(v1::ListFilesRequest { path: path_bytes(path) })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(r.into_inner().entries.into_iter().map(file_info).collect())
    }

    /// Walks a tree depth-first. Symlinks are reported, never followed. A
    /// budget overrun ends the stream with [`Error::WalkLimit`].
    pub async fn walk_files(&self, root: &Path, opts: WalkOptions) -> Result<FileInfoStream> {
        const OP: &str = "walk_files";
        self.require(OP, feat::FILES_WALK)?;
        let s = self
            .rpc()
            .walk_files(v1::WalkFilesRequest {
                root: path_bytes(root),
                max_entries: opts.max_entries,
                max_depth: opts.max_depth,
                include_hidden: opts.include_hidden,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        let me = self.clone();
        Ok(Box::pin(s.map(move |r| r.map(file_info).map_err(|s| me.status(OP, s)))))
    }

    /// Changes under the directory `path` (and beneath it, when
    /// `recursive`) as they happen; the watches are in place when this
    /// returns. Dropping the stream ends the watch.
    pub async fn watch_dir(&self, path: &Path, recursive: bool) -> Result<WatchStream> {
        const OP: &str = "watch_dir";
        self.require(OP, feat::FILES_WATCH)?;
        let mut s = self
            .rpc()
            .watch_dir(v1::WatchDirRequest {
                path: path_bytes(path),
                recursive,
            })
            .await
            .map_err(|s| self.status(OP, s))?
            .into_inner();
        // The agent's first message says the watches are set.
        match s.message().await.map_err(|st| self.status(OP, st))? {
            Some(ev) if ev.kind == v1::WatchEventKind::WatchStarted as i32 => {}
            _ => {
                return Err(Error::Protocol {
                    op: OP.into(),
                    message: "the watch did not start with WATCH_STARTED".into(),
                })
            }
        }
        let me = self.clone();
        Ok(Box::pin(s.filter_map(move |r| {
            let out = match r {
                Err(st) => Some(Err(me.status(OP, st))),
                Ok(ev) => watch_event(ev).map(Ok),
            };
            futures::future::ready(out)
        })))
    }

    /// What is at `path` (a symlink itself, not its target).
    pub async fn stat(&self, path: &Path) -> Result<FileInfo> {
        const OP: &str = "stat";
        self.require(OP, feat::FILES_STAT)?;
        let r = self
            .rpc()
            .stat(v1::StatRequest { path: path_bytes(path) })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(file_info(r.into_inner()))
    }

    /// Creates a directory (and missing parents with `parents`).
    pub async fn mkdir(&self, path: &Path, parents: bool) -> Result<()> {
        const OP: &str = "mkdir";
        self.require(OP, feat::FILES_MKDIR)?;
        self.rpc()
            .mkdir(v1::MkdirRequest {
                path: path_bytes(path),
                parents,
                mode: None,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }

    /// Removes a file, symlink or empty directory (anything beneath too with `recursive`).
    pub async fn remove(&self, path: &Path, recursive: bool) -> Result<()> {
        const OP: &str = "remove";
        self.require(OP, feat::FILES_REMOVE)?;
        self.rpc()
            .remove(v1::RemoveRequest {
                path: path_bytes(path),
                recursive,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }

    /// Renames within the sandbox, replacing the destination atomically.
    pub async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        const OP: &str = "rename";
        self.require(OP, feat::FILES_RENAME)?;
        self.rpc()
            .rename(v1::RenameRequest {
                from: path_bytes(from),
                to: path_bytes(to),
                no_replace: false,
            })
            .await
            .map_err(|s| self.status(OP, s))?;
        Ok(())
    }
}

fn begin(path: &Path, opts: &WriteOptions) -> v1::WriteBegin {
    v1::WriteBegin {
        path: path_bytes(path),
        mode: opts.mode,
        create_parents: opts.create_parents,
    }
}

fn begin_msg(path: &Path, opts: &WriteOptions) -> v1::WriteFileRequest {
    v1::WriteFileRequest {
        msg: Some(write_file_request::Msg::Begin(begin(path, opts))),
    }
}

fn watch_event(e: v1::WatchEvent) -> Option<WatchEvent> {
    use v1::WatchEventKind as K;
    let kind = match K::try_from(e.kind).ok()? {
        K::WatchCreate => WatchKind::Create,
        K::WatchWrite => WatchKind::Write,
        K::WatchRemove => WatchKind::Remove,
        K::WatchRename => WatchKind::Rename,
        K::WatchChmod => WatchKind::Chmod,
        K::WatchOverflow => WatchKind::Overflow,
        K::WatchStarted | K::Unspecified => return None,
    };
    Some(WatchEvent {
        kind,
        name: bytes_path(&e.name),
        is_dir: e.is_dir,
    })
}

fn file_info(e: v1::FileEntry) -> FileInfo {
    use std::os::unix::ffi::OsStringExt;
    let kind = match e.file_type() {
        v1::FileType::Regular => FileKind::File,
        v1::FileType::Directory => FileKind::Dir,
        v1::FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    };
    let mtime = if e.mtime_ms >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_millis(e.mtime_ms.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_millis(e.mtime_ms.unsigned_abs())
    };
    FileInfo {
        path: bytes_path(&e.path),
        name: std::ffi::OsString::from_vec(e.name.to_vec()),
        kind,
        size: e.size,
        mode: e.mode,
        mtime,
        symlink_target: e.symlink_target.as_deref().map(bytes_path),
        depth: e.depth,
    }
}
