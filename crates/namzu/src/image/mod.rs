//! Images for the daemonless tiers (local, microvm): pulled from a registry
//! ([`pull`]), or imported from `docker save` tarballs and OCI image layouts
//! (a directory or a tar of one), unpacked into a content-addressed cache.
//!
//! Layout under `<state>/images/`:
//! * `sha256/<id>/rootfs/` — the unpacked root filesystem of the image whose
//!   config blob hashes to `<id>` (the image id, as Docker computes it);
//! * `sha256/<id>/config.json` — that image's config (its user, its env);
//! * `sha256/<id>/image.json` — its size, its registry digest, its layers;
//! * `refs/<name>` — a name (`repo:tag`) pointing at an id;
//! * `blobs/sha256/<hex>` — pulled blobs, shared by every image listing them
//!   ([`blob`]); `locks/` their download and unpack locks;
//! * `tmp/` — staging, removed after each import or pull.
//!
//! Import verifies every OCI blob against its digest, applies layers in
//! order with whiteouts (`.wh.NAME` deletes, `.wh..wh..opq` empties a
//! directory) strictly beneath the rootfs by file descriptor ([`layer`]:
//! an entry that would reach outside through a symlink, `..` or an absolute
//! path is refused as [`Error::ImageEntryRefused`] naming it), skips device
//! nodes, and publishes the rootfs by one rename, so a failed import leaves
//! nothing behind. Manifest and blob paths must stay inside the archive,
//! symlinks it carries included. Importing the same image twice reuses the
//! first copy.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use oci_client::Reference;
use oci_spec::image::{Arch, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

mod auth;
pub mod blob;
pub mod cache;
pub mod layer;
pub mod options;
pub mod pull;

pub use options::{Platform, PullEvent, PullOptions, PullPolicy};

/// An image in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// `sha256:<hex>` of the image config.
    pub id: String,
    /// Names it was imported under.
    pub names: Vec<String>,
    /// Its unpacked root filesystem.
    pub rootfs: PathBuf,
    /// The registry's digest of its manifest (`sha256:…`), for a pulled
    /// image.
    pub digest: Option<String>,
    /// Bytes of its unpacked root filesystem.
    pub size: u64,
}

/// What an image's config asks of the process it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// The user (`name`, `uid`, `uid:gid` …), `0` when the image names none.
    pub user: String,
    /// The environment, PATH always set.
    pub env: Vec<(String, String)>,
}

/// The image cache of one state directory.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    pull: PullOptions,
}

fn not_an_image(path: &Path, reason: impl Into<String>) -> Error {
    Error::NotAnImage {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn local(op: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::LocalIo { op: op.into(), source }
}

#[derive(Deserialize)]
struct DockerManifest {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The canonical registry form of a reference (`alpine` →
/// `docker.io/library/alpine:latest`), `None` when it is not one.
pub fn canonical(reference: &str) -> Option<String> {
    if reference.starts_with('/') || reference.starts_with("sha256:") {
        return None;
    }
    Reference::try_from(reference).ok().map(|r| r.whole())
}

/// A name usable as a file name: `repo/name:tag` → `repo%2Fname:tag`.
fn ref_file(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/@".contains(&b))
        && !name.contains("..");
    ok.then(|| name.replace('/', "%2F"))
}

impl ImageStore {
    /// The store beneath `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            root: state_dir.into().join("images"),
            pull: PullOptions::default(),
        }
    }

    /// The same store, pulling with `opts`.
    pub fn with_pull_options(mut self, opts: PullOptions) -> Self {
        self.pull = opts;
        self
    }

    /// How this store pulls.
    pub fn pull_options(&self) -> &PullOptions {
        &self.pull
    }

    /// Imports a `docker save` tarball, an OCI layout tarball, or an OCI
    /// layout directory. `name` overrides the names the image carries.
    /// `progress(done, total)` is called as the archive is read.
    pub fn import(&self, file: &Path, name: Option<&str>, progress: &dyn Fn(u64, u64)) -> Result<ImageInfo> {
        const OP: &str = "image import";
        if let Some(n) = name {
            if ref_file(n).is_none() {
                return Err(Error::InvalidArgument {
                    op: OP.into(),
                    message: format!("invalid image name {n:?}"),
                });
            }
        }
        let meta = std::fs::metadata(file).map_err(|e| not_an_image(file, e.to_string()))?;
        std::fs::create_dir_all(self.root.join("tmp")).map_err(local(OP))?;
        let staging = tempfile::Builder::new()
            .prefix("import-")
            .tempdir_in(self.root.join("tmp"))
            .map_err(local(OP))?;
        let layout: PathBuf = if meta.is_dir() {
            file.to_path_buf()
        } else {
            let total = meta.len();
            let f = std::fs::File::open(file).map_err(local(OP))?;
            let counted = Progress {
                inner: f,
                done: 0,
                total,
                report: progress,
            };
            let mut ar = tar::Archive::new(counted);
            ar.set_preserve_permissions(false);
            ar.unpack(staging.path())
                .map_err(|e| not_an_image(file, format!("not a readable tar archive: {e}")))?;
            staging.path().to_path_buf()
        };
        let (config, layers, names) = if layout.join("index.json").is_file() {
            self.oci(file, &layout)?
        } else if layout.join("manifest.json").is_file() {
            docker(file, &layout)?
        } else {
            return Err(not_an_image(
                file,
                "neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
            ));
        };
        let id = sha256_file(&config).map_err(local(OP))?;
        let apply = |layer: &Path, rootfs: &Path| apply_layer(file, layer, rootfs);
        let (dir, meta) = self.publish(&id, &config, &layers, None, &apply)?;
        let names: Vec<String> = match name {
            Some(n) => vec![n.to_owned()],
            None => names.into_iter().filter(|n| ref_file(n).is_some()).collect(),
        };
        for n in &names {
            self.tag(n, &id)?;
        }
        Ok(ImageInfo {
            id: format!("sha256:{id}"),
            names,
            rootfs: dir.join("rootfs"),
            digest: meta.digest,
            size: meta.size,
        })
    }

    /// Unpacks `layers` in order with `apply` into a new rootfs for image
    /// `id` (with its config and an `image.json`) and publishes it by one
    /// rename; an image already there is kept as it is.
    pub(crate) fn publish(
        &self,
        id: &str,
        config: &Path,
        layers: &[PathBuf],
        digest: Option<&str>,
        apply: &dyn Fn(&Path, &Path) -> Result<()>,
    ) -> Result<(PathBuf, cache::Meta)> {
        const OP: &str = "image unpack";
        let dir = self.root.join("sha256").join(id);
        if dir.join("rootfs").is_dir() {
            return Ok((dir.clone(), cache::Meta::read(&dir)));
        }
        std::fs::create_dir_all(self.root.join("sha256")).map_err(local(OP))?;
        std::fs::create_dir_all(self.root.join("tmp")).map_err(local(OP))?;
        let partial = tempfile::Builder::new()
            .prefix("partial-")
            .tempdir_in(self.root.join("tmp"))
            .map_err(local(OP))?;
        let rootfs = partial.path().join("rootfs");
        std::fs::create_dir(&rootfs).map_err(local(OP))?;
        for layer in layers {
            apply(layer, &rootfs)?;
        }
        // Kept for the tiers that run the image's own user and environment
        // (the microvm tier).
        std::fs::copy(config, partial.path().join("config.json")).map_err(local(OP))?;
        let meta = cache::Meta {
            digest: digest.map(str::to_owned),
            layers: layers
                .iter()
                .chain(std::iter::once(&config.to_path_buf()))
                .filter_map(|l| l.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .filter(|n| n.len() == 64)
                .map(|n| format!("sha256:{n}"))
                .collect(),
            size: cache::tree_size(&rootfs),
        };
        meta.write(partial.path()).map_err(local(OP))?;
        // One rename publishes the image; a concurrent identical import
        // that won the race is just as good.
        match std::fs::rename(partial.path(), &dir) {
            Ok(()) => {
                let _ = partial.keep();
                Ok((dir, meta))
            }
            Err(_) if dir.join("rootfs").is_dir() => Ok((dir.clone(), cache::Meta::read(&dir))),
            Err(e) => Err(local(OP)(e)),
        }
    }

    /// Points `name` at image `id`, replacing what it named before.
    pub(crate) fn tag(&self, name: &str, id: &str) -> Result<()> {
        const OP: &str = "image tag";
        let f = ref_file(name).ok_or_else(|| Error::InvalidArgument {
            op: OP.into(),
            message: format!("invalid image name {name:?}"),
        })?;
        std::fs::create_dir_all(self.root.join("refs")).map_err(local(OP))?;
        // Written aside and renamed: a reader never sees half an id.
        let tmp = self.root.join("refs").join(format!(".{f}.{}", std::process::id()));
        std::fs::write(&tmp, id).map_err(local(OP))?;
        std::fs::rename(&tmp, self.root.join("refs").join(f)).map_err(local(OP))
    }

    /// The rootfs for a name, an id (`sha256:…`), or a rootfs directory.
    pub fn resolve(&self, reference: &str) -> Result<PathBuf> {
        let path = Path::new(reference);
        if path.is_absolute() {
            return match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => Ok(path.to_path_buf()),
                Ok(_) => Err(not_an_image(
                    path,
                    "not a directory (a rootfs is a directory; import archives first)",
                )),
                Err(e) => Err(not_an_image(path, e.to_string())),
            };
        }
        let id = match reference.strip_prefix("sha256:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => hex.to_owned(),
            _ => self.named(reference).ok_or_else(|| Error::ImageNotFound {
                reference: reference.into(),
            })?,
        };
        let dir = self.root.join("sha256").join(id);
        let rootfs = dir.join("rootfs");
        if rootfs.is_dir() {
            cache::touch(&dir);
            Ok(rootfs)
        } else {
            Err(Error::ImageNotFound {
                reference: reference.into(),
            })
        }
    }

    /// The id a name points at: the name as given, else its canonical
    /// registry form (`alpine` → `docker.io/library/alpine:latest`).
    fn named(&self, reference: &str) -> Option<String> {
        let read = |name: &str| {
            let f = ref_file(name)?;
            let id = std::fs::read_to_string(self.root.join("refs").join(f)).ok()?;
            Some(id.trim().to_owned())
        };
        read(reference).or_else(|| read(&canonical(reference)?))
    }

    /// The user and environment the image's config asks for (`User`,
    /// `Env`), for a rootfs [`ImageStore::resolve`] returned; an image
    /// without a kept config (a rootfs directory, an older import) runs as
    /// root with the usual PATH.
    pub fn runtime_config(rootfs: &Path) -> RuntimeConfig {
        let inner = rootfs
            .parent()
            .and_then(|d| std::fs::File::open(d.join("config.json")).ok())
            .and_then(|f| ImageConfiguration::from_reader(std::io::BufReader::new(f)).ok())
            .and_then(|c| c.config().clone())
            .unwrap_or_default();
        let mut env: Vec<(String, String)> = inner
            .env()
            .clone()
            .unwrap_or_default()
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push((
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ));
        }
        RuntimeConfig {
            user: inner
                .user()
                .clone()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "0".into()),
            env,
        }
    }

    /// Every image in the cache with its names.
    pub fn list(&self) -> Result<Vec<ImageInfo>> {
        let mut out: Vec<ImageInfo> = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.root.join("sha256")) else {
            return Ok(out);
        };
        for e in rd.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if !e.path().join("rootfs").is_dir() {
                continue;
            }
            let meta = cache::Meta::read(&e.path());
            out.push(ImageInfo {
                id: format!("sha256:{id}"),
                names: Vec::new(),
                rootfs: e.path().join("rootfs"),
                digest: meta.digest,
                size: meta.size,
            });
        }
        if let Ok(rd) = std::fs::read_dir(self.root.join("refs")) {
            for e in rd
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            {
                let target = std::fs::read_to_string(e.path()).unwrap_or_default();
                if let Some(img) = out.iter_mut().find(|i| i.id == format!("sha256:{}", target.trim())) {
                    img.names.push(e.file_name().to_string_lossy().replace("%2F", "/"));
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Config and layers of an OCI layout, every blob checked against its
    /// digest. Picks linux/amd64 from a multi-platform index.
    fn oci(&self, file: &Path, layout: &Path) -> Result<(PathBuf, Vec<PathBuf>, Vec<String>)> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| not_an_image(file, format!("{}: {e}", p.display())));
        let blob = |digest: &str| -> Result<PathBuf> {
            let (alg, hex) = digest
                .split_once(':')
                .ok_or_else(|| not_an_image(file, format!("bad digest {digest:?}")))?;
            if alg != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(not_an_image(file, format!("unsupported digest {digest:?}")));
            }
            let p = within(file, layout, &format!("blobs/{alg}/{hex}"))?;
            let got = sha256_file(&p).map_err(|e| not_an_image(file, format!("blob {digest}: {e}")))?;
            if got != hex {
                return Err(not_an_image(
                    file,
                    format!("blob {digest} is corrupt (content hashes to sha256:{got})"),
                ));
            }
            Ok(p)
        };
        let index = ImageIndex::from_reader(&read(&layout.join("index.json"))?[..])
            .map_err(|e| not_an_image(file, format!("index.json: {e}")))?;
        let mut names = Vec::new();
        let mut desc = index
            .manifests()
            .first()
            .cloned()
            .ok_or_else(|| not_an_image(file, "index.json lists no manifest"))?;
        if let Some(n) = desc.annotations().as_ref().and_then(|a| {
            a.get("io.containerd.image.name")
                .or(a.get(oci_spec::image::ANNOTATION_REF_NAME))
        }) {
            names.push(n.clone());
        }
        // A nested index (multi-platform, OCI's or Docker's list): take
        // linux/amd64.
        let nested = match desc.media_type() {
            MediaType::ImageIndex => true,
            other => other.to_string().contains("manifest.list"),
        };
        if nested {
            let nested = ImageIndex::from_reader(&read(&blob(desc.digest().as_ref())?)?[..])
                .map_err(|e| not_an_image(file, format!("nested index: {e}")))?;
            desc = nested
                .manifests()
                .iter()
                .find(|m| {
                    m.platform()
                        .as_ref()
                        .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == Arch::Amd64)
                })
                .cloned()
                .ok_or_else(|| not_an_image(file, "no linux/amd64 manifest in the index"))?;
        }
        let manifest = ImageManifest::from_reader(&read(&blob(desc.digest().as_ref())?)?[..])
            .map_err(|e| not_an_image(file, format!("manifest: {e}")))?;
        let config = blob(manifest.config().digest().as_ref())?;
        let layers = manifest
            .layers()
            .iter()
            .map(|l| blob(l.digest().as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok((config, layers, names))
    }
}

/// Config and layers of a `docker save` archive.
fn docker(file: &Path, layout: &Path) -> Result<(PathBuf, Vec<PathBuf>, Vec<String>)> {
    let raw = std::fs::read(layout.join("manifest.json")).map_err(|e| not_an_image(file, e.to_string()))?;
    let manifests: Vec<DockerManifest> =
        serde_json::from_slice(&raw).map_err(|e| not_an_image(file, format!("manifest.json: {e}")))?;
    let m = manifests
        .into_iter()
        .next()
        .ok_or_else(|| not_an_image(file, "manifest.json lists no image"))?;
    let inside = |rel: &str| within(file, layout, rel);
    let config = inside(&m.config)?;
    let layers = m.layers.iter().map(|l| inside(l)).collect::<Result<Vec<_>>>()?;
    Ok((config, layers, m.repo_tags.unwrap_or_default()))
}

/// Applies one layer (tar, or gzip'd tar) onto `rootfs`, beneath it by
/// file descriptor (see [`layer`]). `file` names the image in errors.
pub(crate) fn apply_layer(file: &Path, layer: &Path, rootfs: &Path) -> Result<()> {
    let bad = |e: std::io::Error| not_an_image(file, format!("layer {}: {e}", layer.display()));
    let mut f = std::fs::File::open(layer).map_err(bad)?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(bad)?;
    let f = std::fs::File::open(layer).map_err(bad)?;
    let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let layer_name = layer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    layer::apply(reader, rootfs).map_err(|e| match e {
        layer::LayerError::Refused { entry, reason } => Error::ImageEntryRefused {
            path: file.to_path_buf(),
            layer: layer_name,
            entry,
            reason,
        },
        layer::LayerError::Read(e) => bad(e),
        layer::LayerError::Io { entry, source } => Error::LocalIo {
            op: format!("image import: layer {layer_name}: entry {entry:?}"),
            source,
        },
    })
}

/// `rel` inside the unpacked `layout`, as a regular file: neither `..` nor
/// a symlink the archive carries may take a manifest's path outside it.
fn within(file: &Path, layout: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(not_an_image(file, format!("manifest path {rel:?} leaves the archive")));
    }
    let missing = || not_an_image(file, format!("manifest names {rel:?}, which is not in the archive"));
    let full = layout.join(p).canonicalize().map_err(|_| missing())?;
    let base = layout.canonicalize().map_err(|e| not_an_image(file, e.to_string()))?;
    if !full.starts_with(&base) {
        return Err(not_an_image(file, format!("manifest path {rel:?} leaves the archive")));
    }
    if full.is_file() {
        Ok(full)
    } else {
        Err(missing())
    }
}

struct Progress<'a, R> {
    inner: R,
    done: u64,
    total: u64,
    report: &'a dyn Fn(u64, u64),
}

impl<R: Read> Read for Progress<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        (self.report)(self.done, self.total);
        Ok(n)
    }
}
