//! The image cache's bookkeeping: each image's `image.json` (size, registry
//! digest, layers), when it was last used, which sandboxes use it, and the
//! removals: `rm` of a name or an id, `prune` of what no image needs, and
//! the size bound that evicts the least recently used images.
//!
//! Promises:
//! * an image a sandbox of this state directory still names (its
//!   `spec.json` roots it there, suspended sandboxes included) is never
//!   removed: `rm` refuses with [`Error::ImageInUse`], eviction skips it;
//! * an image disappears by one rename out of `sha256/` before its files
//!   are deleted, so a reader sees it whole or not at all;
//! * a blob is deleted only when no remaining image lists it and no pull
//!   holds its lock.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{local, ImageStore};
use crate::error::{Error, Result};

/// What `image.json` keeps of an image.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Meta {
    /// The registry's manifest digest, for a pulled image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The blobs it was made from (`sha256:…`; its layers, then its
    /// config): the blobs it keeps in the cache.
    #[serde(default)]
    pub layers: Vec<String>,
    /// Bytes of its rootfs.
    #[serde(default)]
    pub size: u64,
}

impl Meta {
    /// The meta of the image directory `dir`; an image imported before
    /// `image.json` existed gets its size measured now.
    pub fn read(dir: &Path) -> Self {
        std::fs::read(dir.join("image.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| Self {
                size: tree_size(&dir.join("rootfs")),
                ..Self::default()
            })
    }

    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join("image.json"), serde_json::to_vec(self)?)
    }
}

/// Bytes of the regular files beneath `dir` (each hard-linked file once),
/// following no symlink.
pub fn tree_size(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && (m.nlink() == 1 || seen.insert((m.dev(), m.ino()))) {
                total += m.len();
            }
        }
    }
    total
}

/// Marks the image directory `dir` used now (for least-recently-used
/// eviction).
pub(crate) fn touch(dir: &Path) {
    let used = dir.join("used");
    let _ = std::fs::File::create(&used).and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

fn last_used(dir: &Path) -> std::time::SystemTime {
    let at = |p: PathBuf| p.metadata().and_then(|m| m.modified()).ok();
    at(dir.join("used"))
        .or_else(|| at(dir.join("config.json")))
        .unwrap_or(std::time::UNIX_EPOCH)
}

/// What a removal took away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Names untagged.
    pub names: Vec<String>,
    /// Images (`sha256:…`) deleted.
    pub images: Vec<String>,
    /// Bytes freed.
    pub bytes: u64,
}

impl ImageStore {
    fn image_dir(&self, id: &str) -> PathBuf {
        self.root.join("sha256").join(id.trim_start_matches("sha256:"))
    }

    /// The sandboxes of this state directory whose root is image `id`.
    pub fn users(&self, id: &str) -> Vec<String> {
        let rootfs = self.image_dir(id).join("rootfs");
        let Some(state) = self.root.parent() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(state.join("local")) else {
            return out;
        };
        for e in rd.flatten() {
            let Ok(raw) = std::fs::read(e.path().join("spec.json")) else {
                continue;
            };
            let names = serde_json::from_slice::<serde_json::Value>(&raw)
                .ok()
                .and_then(|v| v.get("rootfs").and_then(|r| r.as_str()).map(PathBuf::from));
            if names.as_deref() == Some(rootfs.as_path()) {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        out.sort();
        out
    }

    /// Removes a name, and the image it named once no other name does; or,
    /// given an id (`sha256:…`), the image and every name of it. Refused
    /// with [`Error::ImageInUse`] while a sandbox runs from it.
    pub fn remove(&self, reference: &str) -> Result<Removed> {
        let _gc = self.blobs().gc_lock(false)?;
        let images = self.list()?;
        let by_id = images
            .iter()
            .find(|i| i.id == reference || i.id == format!("sha256:{reference}"));
        let (image, names): (_, Vec<String>) = match by_id {
            Some(img) => (img, img.names.clone()),
            None => {
                let id = self.named(reference).ok_or_else(|| Error::ImageNotFound {
                    reference: reference.into(),
                })?;
                let img =
                    images
                        .iter()
                        .find(|i| i.id == format!("sha256:{id}"))
                        .ok_or_else(|| Error::ImageNotFound {
                            reference: reference.into(),
                        })?;
                let name = img
                    .names
                    .iter()
                    .find(|n| *n == reference || Some((*n).clone()) == super::canonical(reference))
                    .cloned()
                    .unwrap_or_else(|| reference.to_owned());
                (img, vec![name])
            }
        };
        let last = names.len() >= image.names.len();
        if last {
            let users = self.users(&image.id);
            if !users.is_empty() {
                return Err(Error::ImageInUse {
                    reference: reference.into(),
                    sandboxes: users,
                });
            }
        }
        let mut removed = Removed::default();
        for n in &names {
            if let Some(f) = super::ref_file(n) {
                match std::fs::remove_file(self.root.join("refs").join(f)) {
                    Ok(()) => removed.names.push(n.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(local("image rm")(e)),
                }
            }
        }
        if last {
            removed.bytes += self.delete_image(&image.id)?;
            removed.images.push(image.id.clone());
            removed.bytes += self.drop_unused_blobs(false)?;
        }
        Ok(removed)
    }

    /// Deletes image `id`'s directory: renamed out of `sha256/` first.
    fn delete_image(&self, id: &str) -> Result<u64> {
        const OP: &str = "image rm";
        let dir = self.image_dir(id);
        let size = Meta::read(&dir).size;
        std::fs::create_dir_all(self.root.join("tmp")).map_err(local(OP))?;
        let gone = self.root.join("tmp").join(format!(
            "gone-{}-{}",
            id.trim_start_matches("sha256:"),
            std::process::id()
        ));
        std::fs::rename(&dir, &gone).map_err(local(OP))?;
        remove_tree(&gone).map_err(local(OP))?;
        Ok(size)
    }

    /// Deletes blobs no image lists (and, with `partials`, unfinished
    /// downloads no pull is writing); returns the bytes freed.
    fn drop_unused_blobs(&self, partials: bool) -> Result<u64> {
        let wanted: std::collections::HashSet<String> = self
            .list()?
            .iter()
            .flat_map(|i| Meta::read(i.rootfs.parent().unwrap_or(&i.rootfs)).layers)
            .filter_map(|d| d.strip_prefix("sha256:").map(str::to_owned))
            .collect();
        let mut freed = 0;
        let Ok(rd) = std::fs::read_dir(self.blobs().dir()) else {
            return Ok(0);
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let (hex, partial) = match name.strip_suffix(".partial") {
                Some(h) => (h.to_owned(), true),
                None => (name.clone(), false),
            };
            if hex.len() != 64 || (partial && !partials) || (!partial && wanted.contains(&hex)) {
                continue;
            }
            // A pull holding the blob's lock is writing or about to use it.
            let Some(_lock) = self.blobs().try_lock(&hex) else {
                continue;
            };
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            if std::fs::remove_file(e.path()).is_ok() {
                freed += len;
            }
        }
        Ok(freed)
    }

    /// Bytes the cache holds: every image's rootfs and every blob.
    pub fn cache_bytes(&self) -> Result<u64> {
        let images: u64 = self.list()?.iter().map(|i| i.size).sum();
        let blobs: u64 = std::fs::read_dir(self.blobs().dir())
            .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0);
        Ok(images + blobs)
    }

    /// Removes what no image needs (blobs no image lists, unfinished
    /// downloads, images without a name, staging leftovers), then
    /// [`ImageStore::evict`]s down to `max_bytes` (when given). Images in
    /// `keep` stay.
    pub fn prune(&self, max_bytes: Option<u64>, keep: &[String]) -> Result<Removed> {
        let gc = self.blobs().gc_lock(false)?;
        let mut removed = Removed::default();
        for img in self.list()? {
            if img.names.is_empty() && !keep.contains(&img.id) && self.users(&img.id).is_empty() {
                removed.bytes += self.delete_image(&img.id)?;
                removed.images.push(img.id);
            }
        }
        removed.bytes += self.drop_unused_blobs(true)?;
        if let Ok(rd) = std::fs::read_dir(self.root.join("tmp")) {
            for e in rd.flatten() {
                // Staging of a pull or import still running is recent.
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|a| a.as_secs() > 3600));
                let gone = e.file_name().to_string_lossy().starts_with("gone-");
                if old || gone {
                    let _ = remove_tree(&e.path());
                }
            }
        }
        drop(gc);
        if let Some(max) = max_bytes {
            let more = self.evict(max, keep)?;
            removed.names.extend(more.names);
            removed.images.extend(more.images);
            removed.bytes += more.bytes;
        }
        Ok(removed)
    }

    /// Removes the least recently used images no sandbox uses (and their
    /// names and blobs) until the cache holds at most `max` bytes; images in
    /// `keep` stay.
    pub fn evict(&self, max: u64, keep: &[String]) -> Result<Removed> {
        let gc = self.blobs().gc_lock(false)?;
        self.evict_locked(max, keep, gc)
    }

    /// [`ImageStore::evict`] under the collection lock `_gc`.
    pub(crate) fn evict_locked(&self, max: u64, keep: &[String], _gc: super::blob::Lock) -> Result<Removed> {
        let mut removed = Removed::default();
        {
            let mut images = self.list()?;
            images.sort_by_key(|i| last_used(i.rootfs.parent().unwrap_or(&i.rootfs)));
            for img in images {
                if self.cache_bytes()? <= max {
                    break;
                }
                if keep.contains(&img.id) || !self.users(&img.id).is_empty() {
                    continue;
                }
                for n in &img.names {
                    if let Some(f) = super::ref_file(n) {
                        let _ = std::fs::remove_file(self.root.join("refs").join(f));
                        removed.names.push(n.clone());
                    }
                }
                removed.bytes += self.delete_image(&img.id)?;
                removed.images.push(img.id);
                removed.bytes += self.drop_unused_blobs(false)?;
            }
        }
        Ok(removed)
    }
}

/// Removes a tree whose directories a layer may have left read-only.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            let mut stack = vec![path.to_path_buf()];
            while let Some(d) = stack.pop() {
                let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
                if let Ok(rd) = std::fs::read_dir(&d) {
                    for e in rd.flatten() {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            stack.push(e.path());
                        }
                    }
                }
            }
            std::fs::remove_dir_all(path)
        }
    }
}
