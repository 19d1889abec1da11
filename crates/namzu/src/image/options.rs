//! How pulls are made and what they report: [`PullOptions`] (policy,
//! credentials' place, insecure registries, platform, limits, timeouts),
//! [`Platform`] and [`PullEvent`]. Plain data, shared by the store and the
//! puller.

use std::path::PathBuf;
use std::time::Duration;

/// When creating a sandbox pulls its image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull when the cache has no image by that name (podman's and
    /// docker's default).
    #[default]
    Missing,
    /// Pull every time (a tag may have moved).
    Always,
    /// Never pull: use the cache or fail.
    Never,
}

/// An OS, an architecture and a variant (`linux/arm64/v8`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// In OCI's spelling: `amd64`, `arm64`, `arm`, `386`, `ppc64le`,
    /// `s390x`, `riscv64`.
    pub architecture: String,
    /// `v7`, `v8` …, when it matters.
    pub variant: Option<String>,
}

impl Platform {
    /// This host's platform.
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Self {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        match &self.variant {
            Some(v) => write!(f, "/{v}"),
            None => Ok(()),
        }
    }
}

impl std::str::FromStr for Platform {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut parts = s.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(os), Some(arch), variant, None) if !os.is_empty() && !arch.is_empty() => Ok(Self {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.filter(|v| !v.is_empty()).map(str::to_owned),
            }),
            _ => Err(format!("{s:?} is not a platform (os/arch[/variant], e.g. linux/amd64)")),
        }
    }
}

/// How pulls are made.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// When creating a sandbox pulls.
    pub policy: PullPolicy,
    /// The directory of docker's `config.json` (default `$DOCKER_CONFIG`,
    /// else `~/.docker`).
    pub docker_config: Option<PathBuf>,
    /// Registries (`host:port`) spoken to over plain HTTP besides loopback
    /// ones.
    pub insecure_registries: Vec<String>,
    /// The platform picked from a multi-platform index.
    pub platform: Platform,
    /// Blobs downloaded at once per pull.
    pub max_concurrent_downloads: usize,
    /// The largest image pulled: the sum of its layers as the registry
    /// sends them.
    pub max_image_bytes: u64,
    /// After a pull, the least recently used images no sandbox uses are
    /// evicted until the cache holds at most this many bytes (`None`: no
    /// bound).
    pub cache_max_bytes: Option<u64>,
    /// Connecting to the registry.
    pub connect_timeout: Duration,
    /// Silence on a connection to the registry.
    pub read_timeout: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            policy: PullPolicy::Missing,
            docker_config: None,
            insecure_registries: Vec::new(),
            platform: Platform::host(),
            max_concurrent_downloads: 3,
            max_image_bytes: 32 << 30,
            cache_max_bytes: Some(64 << 30),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// What a pull reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// The manifest is known: its digest and layers (digest, size).
    Resolved {
        /// The digest of the platform's manifest.
        digest: String,
        /// Each layer: its digest and size.
        layers: Vec<(String, u64)>,
    },
    /// Bytes of a blob have arrived.
    Blob {
        /// The blob.
        digest: String,
        /// Bytes so far (from an earlier, broken-off pull included).
        done: u64,
        /// Its size.
        total: u64,
    },
    /// A blob is in the cache: downloaded now, or `cached` already.
    BlobReady {
        /// The blob.
        digest: String,
        /// It was there before this pull.
        cached: bool,
    },
    /// The layers are being unpacked.
    Unpacking,
}
