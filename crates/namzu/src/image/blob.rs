//! Pulled blobs, kept by digest under `<state>/images/blobs/sha256/`.
//!
//! Promises:
//! * a file named by a digest holds exactly the bytes that hash to it: a
//!   download streams into `<hex>.partial`, hashed and counted as it
//!   arrives, and is renamed into place only once its length and digest
//!   match the descriptor. Bytes past the descriptor's size, or a digest
//!   that does not match, drop the partial and fail as
//!   [`Error::ImageBlobCorrupt`](crate::Error::ImageBlobCorrupt) naming the digest;
//! * one download per digest at a time, across threads and processes: the
//!   download holds `locks/<hex>` (`flock`), and a pull that waited on it
//!   finds the blob there and fetches nothing;
//! * a download that breaks off keeps its partial, and the next one asks
//!   only for the rest (an HTTP range, its prefix hashed again from disk);
//!   a registry that ignores the range sends it all and the partial starts
//!   over.

use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use oci_client::client::BlobResponse;
use oci_client::manifest::OciDescriptor;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

use super::pull::{PullEvent, Pulling};
use super::{local, ImageStore};
use crate::error::Result;

/// The blob directory of one image store.
pub struct Blobs {
    dir: PathBuf,
    locks: PathBuf,
}

/// A held download lock; released when dropped.
pub struct Lock(#[allow(dead_code)] std::fs::File);

/// The hex of a `sha256:` digest, or why it is not one.
pub fn sha256_hex(digest: &str) -> std::result::Result<&str, String> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(hex)
        }
        _ => Err(format!("unsupported digest {digest:?} (sha256 only)")),
    }
}

impl ImageStore {
    /// The blob directory.
    pub fn blobs(&self) -> Blobs {
        Blobs {
            dir: self.root.join("blobs").join("sha256"),
            locks: self.root.join("locks"),
        }
    }
}

impl Blobs {
    /// Where the blobs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The verified blob `hex`, if present.
    pub fn get(&self, hex: &str) -> Option<PathBuf> {
        let p = self.dir.join(hex);
        p.is_file().then_some(p)
    }

    fn lock_file(&self, hex: &str) -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&self.locks)?;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.locks.join(hex))
    }

    /// The lock of blob `hex` if no one holds it.
    pub fn try_lock(&self, hex: &str) -> Option<Lock> {
        let f = self.lock_file(hex).ok()?;
        rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
        Some(Lock(f))
    }

    /// The cache's collection lock, waiting for it: pulls hold it shared
    /// from their first blob to their image's publication, so removals
    /// (which hold it exclusive) never take a blob a pull has fetched but
    /// not yet unpacked.
    pub fn gc_lock(&self, shared: bool) -> Result<Lock> {
        let f = self.lock_file("gc").map_err(local("image gc"))?;
        let op = if shared {
            rustix::fs::FlockOperation::LockShared
        } else {
            rustix::fs::FlockOperation::LockExclusive
        };
        rustix::fs::flock(f.as_fd(), op).map_err(|e| local("image gc")(e.into()))?;
        Ok(Lock(f))
    }

    /// The collection lock, exclusive, if nothing holds it.
    pub fn try_gc_lock(&self) -> Option<Lock> {
        let f = self.lock_file("gc").ok()?;
        rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
        Some(Lock(f))
    }

    /// The lock of `hex` (or an image id: the unpack lock), waiting for it.
    pub async fn lock(&self, hex: &str) -> Result<Lock> {
        let f = self.lock_file(hex).map_err(local("image pull"))?;
        tokio::task::spawn_blocking(move || {
            rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::LockExclusive)
                .map_err(|e| local("image pull")(e.into()))?;
            Ok(Lock(f))
        })
        .await
        .map_err(|e| local("image pull")(std::io::Error::other(e)))?
    }

    /// The blob `desc` names, fetched from the registry unless present.
    pub(crate) async fn fetch(
        &self,
        client: &Client,
        image: &Reference,
        desc: &OciDescriptor,
        p: &Pulling<'_>,
    ) -> Result<PathBuf> {
        const OP: &str = "image pull";
        let hex = sha256_hex(&desc.digest).map_err(|r| p.protocol(r))?.to_owned();
        let size =
            u64::try_from(desc.size).map_err(|_| p.protocol(format!("blob {} has size {}", desc.digest, desc.size)))?;
        let ready = |cached| {
            p.report(PullEvent::BlobReady {
                digest: desc.digest.clone(),
                cached,
            })
        };
        if let Some(path) = self.get(&hex) {
            ready(true);
            return Ok(path);
        }
        std::fs::create_dir_all(&self.dir).map_err(local(OP))?;
        let _lock = self.lock(&hex).await?;
        if let Some(path) = self.get(&hex) {
            ready(true);
            return Ok(path);
        }
        let part_path = self.dir.join(format!("{hex}.partial"));
        let mut part = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&part_path)
            .map_err(local(OP))?;
        let mut have = part.metadata().map_err(local(OP))?.len();
        let mut hash = Sha256::new();
        if have > size {
            part.set_len(0).map_err(local(OP))?;
            have = 0;
        }
        if have > 0 {
            // The prefix kept from a download that broke off, hashed again:
            // the file may have been touched since.
            let (f, h) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
                let mut h = Sha256::new();
                part.rewind()?;
                let mut buf = vec![0u8; 1 << 20];
                let mut left = have;
                while left > 0 {
                    let n = part.read(&mut buf[..usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20)])?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                    left -= n as u64;
                }
                Ok((part, h))
            })
            .await
            .map_err(|e| local(OP)(std::io::Error::other(e)))?
            .map_err(local(OP))?;
            part = f;
            hash = h;
        }
        let mut stream = if have > 0 {
            match client.pull_blob_stream_partial(image, desc, have, None).await {
                Ok(BlobResponse::Partial(s)) => s,
                Ok(BlobResponse::Full(s)) => {
                    tracing::debug!(digest = %desc.digest, "registry ignored the range: starting over");
                    have = 0;
                    hash = Sha256::new();
                    part.set_len(0).map_err(local(OP))?;
                    s
                }
                Err(e) => return Err(p.map(e)),
            }
        } else {
            client.pull_blob_stream(image, desc).await.map_err(|e| p.map(e))?
        };
        part.seek(std::io::SeekFrom::Start(have)).map_err(local(OP))?;
        let corrupt = |reason: String| {
            let _ = std::fs::remove_file(&part_path);
            p.corrupt(&desc.digest, reason)
        };
        p.report(PullEvent::Blob {
            digest: desc.digest.clone(),
            done: have,
            total: size,
        });
        while let Some(chunk) = stream.next().await {
            let bytes = match chunk {
                Ok(b) => b,
                Err(e) if is_digest_error(&e) => {
                    // oci-client's own check at the stream's end; ours
                    // below would say the same.
                    let got = hex_of(hash.clone());
                    return Err(corrupt(format!("its content hashes to sha256:{got}")));
                }
                Err(e) => {
                    let _ = part.sync_data();
                    return Err(p.interrupted(&desc.digest, have, size, e.to_string()));
                }
            };
            if have + bytes.len() as u64 > size {
                return Err(corrupt(format!("it runs past its size of {size} bytes")));
            }
            part.write_all(&bytes).map_err(local(OP))?;
            hash.update(&bytes);
            have += bytes.len() as u64;
            p.report(PullEvent::Blob {
                digest: desc.digest.clone(),
                done: have,
                total: size,
            });
        }
        if have < size {
            let _ = part.sync_data();
            return Err(p.interrupted(&desc.digest, have, size, "the registry ended the body early".into()));
        }
        let got = hex_of(hash);
        if got != hex {
            return Err(corrupt(format!("its content hashes to sha256:{got}")));
        }
        part.sync_all().map_err(local(OP))?;
        drop(part);
        let path = self.dir.join(&hex);
        std::fs::rename(&part_path, &path).map_err(local(OP))?;
        ready(false);
        Ok(path)
    }
}

fn hex_of(h: Sha256) -> String {
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn is_digest_error(e: &std::io::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|i| i as _);
    while let Some(err) = cur {
        if err.is::<oci_client::errors::DigestError>() {
            return true;
        }
        if let Some(oci) = err.downcast_ref::<oci_client::errors::OciDistributionError>() {
            if matches!(oci, oci_client::errors::OciDistributionError::DigestError(_)) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}
