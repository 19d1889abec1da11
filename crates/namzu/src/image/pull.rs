//! Pulling images from OCI and Docker registries into the [`ImageStore`]
//! (`oci-client` speaks the distribution API; `oci-spec` parses what it
//! fetches).
//!
//! What a pull promises:
//! * the manifest for [`PullOptions::platform`] is picked from a
//!   multi-platform index (OCI's or Docker's list); an index without one is
//!   [`Error::ImagePlatformMissing`] listing what it has;
//! * every blob is verified by digest and size while it streams, kept once
//!   by digest and shared by every image listing it, fetched once however
//!   many pulls ask at the same time, and resumed after a break ([`blob`]);
//! * the image is unpacked by the same layer code as an import (whiteouts,
//!   nothing beneath a symlink) and published by one rename: an interrupted
//!   pull leaves no half image;
//! * failures are told apart: [`Error::ImageNotInRegistry`] (unknown name,
//!   tag or digest), [`Error::RegistryAuthRefused`],
//!   [`Error::RegistryUnreachable`], [`Error::ImageBlobCorrupt`],
//!   [`Error::ImagePullInterrupted`], [`Error::RegistryProtocol`];
//! * credentials come from docker's config (`$DOCKER_CONFIG/config.json` or
//!   `~/.docker/config.json`, its `credHelpers` and `credsStore` included)
//!   and are sent as the registry's challenge asks: basic, or exchanged for
//!   a bearer token at its realm; an identity token (OAuth2 refresh token)
//!   is exchanged at the realm first. Plain HTTP is spoken only to loopback
//!   registries (as docker does) and to ones named in
//!   [`PullOptions::insecure_registries`];
//! * blobs are fetched from the registry only, never from a descriptor's
//!   `urls` (a registry could otherwise send the client anywhere).
//!
//! [`blob`]: super::blob

use std::path::{Path, PathBuf};

use futures::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use oci_spec::image::{ImageIndex, ImageManifest};

use super::auth::{self, chain, Credential, ExchangeFailure};
pub use super::options::{Platform, PullEvent, PullOptions, PullPolicy};
use super::{canonical, local, ImageInfo, ImageStore};
use crate::error::{Error, Result};

/// What a manifest fetched for a platform turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Selected {
    /// An image manifest.
    Manifest(Box<ImageManifest>),
    /// An index: the digest of the platform's entry.
    Child(String),
    /// An index without the platform: the platforms it lists.
    Missing(Vec<String>),
}

const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Reads a manifest or index a registry sent and picks `platform`'s entry.
/// Schema 1 manifests, zstd layers and anything not JSON are refused.
pub fn select_manifest(raw: &[u8], platform: &Platform) -> std::result::Result<Selected, String> {
    let v: serde_json::Value = serde_json::from_slice(raw).map_err(|e| format!("manifest is not JSON: {e}"))?;
    if v.get("schemaVersion").and_then(|s| s.as_i64()) != Some(2) {
        return Err("not a schema 2 manifest (schema 1 is not supported)".into());
    }
    if v.get("manifests").is_some() {
        let index = ImageIndex::from_reader(raw).map_err(|e| format!("index: {e}"))?;
        let mut available = Vec::new();
        let mut best: Option<(u8, String)> = None;
        for m in index.manifests() {
            let Some(p) = m.platform() else { continue };
            let (os, arch) = (p.os().to_string(), p.architecture().to_string());
            let variant = p.variant().clone();
            available.push(match &variant {
                Some(v) => format!("{os}/{arch}/{v}"),
                None => format!("{os}/{arch}"),
            });
            if os != platform.os || arch != platform.architecture {
                continue;
            }
            // An exact variant first, then none named, then any.
            let rank = match (&platform.variant, &variant) {
                (Some(w), Some(v)) if w == v => 0,
                (Some(_), Some(_)) => continue,
                (None, None) => 0,
                (_, None) => 1,
                (None, Some(_)) => 2,
            };
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                best = Some((rank, m.digest().to_string()));
            }
        }
        return Ok(match best {
            Some((_, d)) => Selected::Child(d),
            None => Selected::Missing(available),
        });
    }
    let m = ImageManifest::from_reader(raw).map_err(|e| format!("manifest: {e}"))?;
    for l in m.layers() {
        let t = l.media_type().to_string();
        if t.contains("zstd") {
            return Err(format!(
                "layer {} is zstd-compressed ({t}), which is not supported",
                l.digest()
            ));
        }
    }
    Ok(Selected::Manifest(Box::new(m)))
}

/// One pull's context: its reference and registry (for errors), who it
/// authenticated as, and where it reports.
pub(crate) struct Pulling<'a> {
    reference: String,
    registry: String,
    user: Option<String>,
    progress: &'a (dyn Fn(PullEvent) + Send + Sync),
}

impl Pulling<'_> {
    pub(crate) fn report(&self, e: PullEvent) {
        (self.progress)(e)
    }

    pub(crate) fn protocol(&self, reason: impl Into<String>) -> Error {
        Error::RegistryProtocol {
            registry: self.registry.clone(),
            reason: format!("{}: {}", self.reference, reason.into()),
        }
    }

    pub(crate) fn corrupt(&self, digest: &str, reason: String) -> Error {
        Error::ImageBlobCorrupt {
            reference: self.reference.clone(),
            digest: digest.into(),
            reason,
        }
    }

    pub(crate) fn interrupted(&self, digest: &str, received: u64, size: u64, reason: String) -> Error {
        Error::ImagePullInterrupted {
            reference: self.reference.clone(),
            digest: digest.into(),
            received,
            size,
            reason,
        }
    }

    fn refused(&self, reason: String) -> Error {
        Error::RegistryAuthRefused {
            reference: self.reference.clone(),
            registry: self.registry.clone(),
            user: self.user.clone(),
            reason,
        }
    }

    fn unreachable(&self, reason: String) -> Error {
        Error::RegistryUnreachable {
            registry: self.registry.clone(),
            reason,
        }
    }

    fn absent(&self) -> Error {
        Error::ImageNotInRegistry {
            reference: self.reference.clone(),
            registry: self.registry.clone(),
        }
    }

    /// oci-client's error as ours.
    pub(crate) fn map(&self, e: OciDistributionError) -> Error {
        use OciDistributionError as O;
        match e {
            O::AuthenticationFailure(reason) => self.refused(reason),
            O::UnauthorizedError { url } => self.refused(format!("401 Unauthorized at {url}")),
            O::ImageManifestNotFoundError(_) => self.absent(),
            O::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    self.refused(envelope.to_string())
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound
                    )
                }) {
                    self.absent()
                } else {
                    self.protocol(envelope.to_string())
                }
            }
            O::ServerError { code: 404, .. } => self.absent(),
            O::ServerError {
                code: 401 | 403,
                message,
                ..
            } => self.refused(message),
            O::RequestError(r) if r.is_connect() || r.is_timeout() || r.status().is_none() && r.is_request() => {
                self.unreachable(chain(&r))
            }
            other => self.protocol(other.to_string()),
        }
    }
}

fn is_loopback(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl ImageStore {
    /// The rootfs for `reference`, pulled first as
    /// [`PullOptions::policy`] says when it names a registry image.
    pub async fn ensure(&self, reference: &str, progress: &(dyn Fn(PullEvent) + Send + Sync)) -> Result<PathBuf> {
        let pullable = canonical(reference).is_some();
        match self.pull.policy {
            PullPolicy::Always if pullable => {
                self.pull(reference, progress).await?;
                self.resolve(reference)
            }
            policy => match self.resolve(reference) {
                Err(Error::ImageNotFound { .. }) if policy == PullPolicy::Missing && pullable => {
                    self.pull(reference, progress).await?;
                    self.resolve(reference)
                }
                other => other,
            },
        }
    }

    /// Pulls `reference` (`[registry/]repo[:tag][@digest]`) into the cache
    /// under its canonical name.
    pub async fn pull(&self, reference: &str, progress: &(dyn Fn(PullEvent) + Send + Sync)) -> Result<ImageInfo> {
        const OP: &str = "image pull";
        let image = Reference::try_from(reference).map_err(|e| Error::InvalidArgument {
            op: OP.into(),
            message: format!("{reference:?} is not an image reference: {e}"),
        })?;
        let registry = image.resolve_registry().to_owned();
        let opts = &self.pull;
        let credential =
            auth::from_docker_config(opts.docker_config.as_deref(), image.registry()).map_err(|reason| {
                Error::RegistryAuthRefused {
                    reference: reference.into(),
                    registry: registry.clone(),
                    user: None,
                    reason,
                }
            })?;
        let p = Pulling {
            reference: reference.into(),
            registry: registry.clone(),
            user: match &credential {
                Credential::Basic(u, _) => Some(u.clone()),
                _ => None,
            },
            progress,
        };
        // reqwest on rustls without a provider of its own: ours is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain = is_loopback(&registry)
            || opts
                .insecure_registries
                .iter()
                .any(|r| *r == registry || r == image.registry());
        let auth = match credential {
            Credential::Anonymous => RegistryAuth::Anonymous,
            Credential::Basic(u, pw) => RegistryAuth::Basic(u, pw),
            Credential::Identity(t) => {
                let base = format!("{}://{registry}", if plain { "http" } else { "https" });
                auth::exchange_identity_token(opts, &base, image.repository(), &t)
                    .await
                    .map_err(|e| match e {
                        ExchangeFailure::Refused(r) => p.refused(r),
                        ExchangeFailure::Unreachable(r) => p.unreachable(r),
                        ExchangeFailure::Protocol(r) => p.protocol(r),
                    })?
            }
        };
        let client = Client::new(ClientConfig {
            protocol: if plain {
                ClientProtocol::HttpsExcept(vec![registry.clone()])
            } else {
                ClientProtocol::Https
            },
            connect_timeout: Some(opts.connect_timeout),
            read_timeout: Some(opts.read_timeout),
            max_concurrent_download: opts.max_concurrent_downloads.max(1),
            ..ClientConfig::default()
        });
        client
            .auth(&image, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| p.map(e))?;

        let (raw, top) = client
            .pull_manifest_raw(&image, &auth, ACCEPT)
            .await
            .map_err(|e| p.map(e))?;
        let (manifest, digest) = match select_manifest(&raw, &opts.platform).map_err(|r| p.protocol(r))? {
            Selected::Manifest(m) => (m, top.clone()),
            Selected::Missing(available) => {
                return Err(Error::ImagePlatformMissing {
                    reference: reference.into(),
                    platform: opts.platform.to_string(),
                    available,
                })
            }
            Selected::Child(d) => {
                let child = image.clone_with_digest(d.clone());
                let (raw, got) = client
                    .pull_manifest_raw(&child, &auth, ACCEPT)
                    .await
                    .map_err(|e| p.map(e))?;
                if got != d {
                    return Err(p.protocol(format!("manifest {d} arrived as {got}")));
                }
                match select_manifest(&raw, &opts.platform).map_err(|r| p.protocol(r))? {
                    Selected::Manifest(m) => (m, d),
                    _ => return Err(p.protocol(format!("index entry {d} is not an image manifest"))),
                }
            }
        };
        let desc = |d: &oci_spec::image::Descriptor| OciDescriptor {
            media_type: d.media_type().to_string(),
            digest: d.digest().to_string(),
            size: d.size() as i64,
            ..OciDescriptor::default()
        };
        let layers: Vec<OciDescriptor> = manifest.layers().iter().map(desc).collect();
        let total: u64 = layers.iter().map(|l| l.size.max(0) as u64).sum();
        if total > opts.max_image_bytes {
            return Err(Error::LimitExceeded {
                op: OP.into(),
                limit: format!("max_image_bytes ({})", opts.max_image_bytes),
                value: total,
                path: None,
            });
        }
        p.report(PullEvent::Resolved {
            digest: digest.clone(),
            layers: layers
                .iter()
                .map(|l| (l.digest.clone(), l.size.max(0) as u64))
                .collect(),
        });
        let blobs = self.blobs();
        let gc = {
            let b = self.blobs();
            tokio::task::spawn_blocking(move || b.gc_lock(true))
                .await
                .map_err(|e| local(OP)(std::io::Error::other(e)))??
        };
        let config = blobs.fetch(&client, &image, &desc(manifest.config()), &p).await?;
        // A single-platform image names its platform in its config.
        if let Ok(c) = oci_spec::image::ImageConfiguration::from_file(&config) {
            let (os, arch) = (c.os().to_string(), c.architecture().to_string());
            if os != opts.platform.os || arch != opts.platform.architecture {
                return Err(Error::ImagePlatformMissing {
                    reference: reference.into(),
                    platform: opts.platform.to_string(),
                    available: vec![format!("{os}/{arch}")],
                });
            }
        }
        let id = super::blob::sha256_hex(manifest.config().digest().as_ref())
            .map_err(|r| p.protocol(r))?
            .to_owned();
        let dir = self.root.join("sha256").join(&id);
        if !dir.join("rootfs").is_dir() {
            // Layers download side by side; they apply in order.
            // Boxed in a loop, not a closure: the future must be Send for
            // any borrow, which a closure's inferred lifetime cannot say.
            let mut fetches: Vec<futures::future::BoxFuture<'_, Result<PathBuf>>> = Vec::new();
            for l in &layers {
                fetches.push(Box::pin(blobs.fetch(&client, &image, l, &p)));
            }
            let paths: Vec<PathBuf> = futures::stream::iter(fetches)
                .buffered(opts.max_concurrent_downloads.max(1))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<_>>()?;
            let _unpack = blobs.lock(&format!("image-{id}")).await?;
            p.report(PullEvent::Unpacking);
            let store = self.clone();
            let (name, digest2, id2) = (reference.to_owned(), top.clone(), id.clone());
            tokio::task::spawn_blocking(move || {
                let file = PathBuf::from(&name);
                let apply = |layer: &Path, rootfs: &Path| super::apply_layer(&file, layer, rootfs);
                store.publish(&id2, &config, &paths, Some(&digest2), &apply)
            })
            .await
            .map_err(|e| local(OP)(std::io::Error::other(e)))??;
        }
        let name = image.whole();
        self.tag(&name, &id)?;
        super::cache::touch(&dir);
        drop(gc);
        if let Some(max) = opts.cache_max_bytes {
            // Only while no other pull runs (it evicts when it ends): a
            // pull never waits on another to finish.
            if let Some(gc) = self.blobs().try_gc_lock() {
                self.evict_locked(max, &[format!("sha256:{id}")], gc)?;
            }
        }
        let meta = super::cache::Meta::read(&dir);
        Ok(ImageInfo {
            id: format!("sha256:{id}"),
            names: vec![name],
            rootfs: dir.join("rootfs"),
            digest: Some(meta.digest.unwrap_or(top)),
            size: meta.size,
        })
    }
}
