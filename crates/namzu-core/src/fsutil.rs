//! Small file-system helpers every layer shares.

use std::path::Path;

/// Writes `bytes` to `path` whole or not at all: a temporary file beside
/// it (mode 0600, named after it, this process and this write), synced,
/// renamed over it; the temporary file is removed if anything fails, and a
/// failed write leaves the old file.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, true)
}

/// [`write_private`] without the sync: readers in any process see the old
/// file or the new one, never a part, for files rewritten on a hot path
/// (a sandbox's record on every create). After a crash the rename keeps the
/// old file or the new one on ext4 and xfs.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(path, bytes, false)
}

fn replace(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Two writes of one path from one process (two threads) must not share
    // a temporary file, or one could rename the other's half-written bytes.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
