//! The simulated node's image cache: what its pods can run. A pod's
//! containers run from their images' root filesystems, imported the way
//! the local tier imports images (`namzu image import`), and an image the
//! cache lacks cannot be pulled (no registry is reachable where namzu is
//! tested).
//!
//! Two images are there from the start:
//! * [`AGENT_IMAGE`], the agent image as `deploy/k8s/Dockerfile.agent`
//!   builds it (FROM scratch, `/namzu-agent`), made here from the agent
//!   binary under test;
//! * [`DISTRO_IMAGE`], a REAL distribution: Debian bookworm (minbase),
//!   debootstrapped from Debian's mirror by `scripts/images.sh` into
//!   `target/images/debian-bookworm.tar` (`NAMZU_TEST_DISTRO_IMAGE`
//!   overrides the path). The shipped template's workload image
//!   (`python:3.12-slim`, itself Debian bookworm plus Python) is served by
//!   it in the simulator, which [`crate::cluster`] says where it applies the
//!   template.
//!
//! Both live in one cache under `target/images/sim-node`, kept across runs
//! (the agent image replaced when the agent binary changes), which every
//! simulated cluster's state directory links to.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use namzu::image::ImageStore;
use sha2::{Digest, Sha256};

/// The agent image's reference, as the shipped template names it.
pub const AGENT_IMAGE: &str = "ghcr.io/namzu/namzu-agent:latest";
/// The real distribution image's reference.
pub const DISTRO_IMAGE: &str = "debian:bookworm";

/// Where `scripts/images.sh` leaves the distribution image.
pub fn distro_tarball() -> PathBuf {
    std::env::var_os("NAMZU_TEST_DISTRO_IMAGE").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/images/debian-bookworm.tar"),
        PathBuf::from,
    )
}

/// A one-layer `docker save` archive of `files` (path inside the image,
/// file on the host, mode) named `name`, written under `dir`.
pub fn save_tarball(dir: &Path, name: &str, files: &[(&str, &Path, u32)]) -> std::io::Result<PathBuf> {
    let mut layer = tar::Builder::new(Vec::new());
    for (inside, host, mode) in files {
        let data = std::fs::read(host)?;
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        layer.append_data(&mut h, inside.trim_start_matches('/'), data.as_slice())?;
    }
    let layer = layer.into_inner()?;
    let layer_id = hex(&Sha256::digest(&layer));
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"User": "65532:65532", "Entrypoint": ["/namzu-agent"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_id}")]}})
    .to_string();
    let config_id = hex(&Sha256::digest(config.as_bytes()));
    let manifest = serde_json::json!([{"Config": format!("{config_id}.json"), "RepoTags": [name],
        "Layers": [format!("{layer_id}.tar")]}])
    .to_string();
    let path = dir.join(format!("{config_id}.tar"));
    let mut out = tar::Builder::new(std::fs::File::create(&path)?);
    for (n, data) in [
        ("manifest.json".to_owned(), manifest.into_bytes()),
        (format!("{config_id}.json"), config.into_bytes()),
        (format!("{layer_id}.tar"), layer),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        out.append_data(&mut h, n, data.as_slice())?;
    }
    out.finish()?;
    Ok(path)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

static SHARED: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Where the node's image cache lives across runs: a state directory
/// whose `images` holds both images (`NAMZU_TEST_IMAGE_CACHE` overrides).
fn cache_root() -> PathBuf {
    std::env::var_os("NAMZU_TEST_IMAGE_CACHE").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/images/sim-node"),
        PathBuf::from,
    )
}

/// The node's image cache (a state directory's `images`), brought up to
/// date on first use in a process: the distribution image imported once,
/// the agent image again whenever the agent binary's content changed (the
/// image it replaces pruned). Processes take turns under a file lock.
pub fn shared_cache(agent_bin: &Path) -> std::io::Result<PathBuf> {
    let r = SHARED.get_or_init(|| {
        let build = || -> Result<PathBuf, String> {
            let root = cache_root();
            std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
            let lock = std::fs::File::create(root.join(".lock")).map_err(|e| e.to_string())?;
            let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("lock {}: {e}", root.display()))?;
            let store = ImageStore::new(&root);
            if store.resolve(DISTRO_IMAGE).is_err() {
                let distro = distro_tarball();
                if !distro.is_file() {
                    return Err(format!(
                        "the distribution image {} is missing: run scripts/images.sh (scripts/test.sh does)",
                        distro.display()
                    ));
                }
                store
                    .import(&distro, Some(DISTRO_IMAGE), &|_, _| {})
                    .map_err(|e| format!("importing {}: {e}", distro.display()))?;
            }
            let digest = hex(&Sha256::digest(std::fs::read(agent_bin).map_err(|e| e.to_string())?));
            let stamp = root.join("agent.sha256");
            let current = std::fs::read_to_string(&stamp).unwrap_or_default();
            if current.trim() != digest || store.resolve(AGENT_IMAGE).is_err() {
                let agent = save_tarball(&root, AGENT_IMAGE, &[("/namzu-agent", agent_bin, 0o755)])
                    .map_err(|e| format!("the agent image: {e}"))?;
                let imported = store.import(&agent, None, &|_, _| {});
                let _ = std::fs::remove_file(&agent);
                imported.map_err(|e| format!("importing the agent image: {e}"))?;
                std::fs::write(&stamp, &digest).map_err(|e| e.to_string())?;
                // The agent images no name points at any more.
                for old in store.list().map_err(|e| e.to_string())? {
                    if old.names.is_empty() {
                        if let Some(dir) = old.rootfs.parent() {
                            let _ = std::fs::remove_dir_all(dir);
                        }
                    }
                }
            }
            Ok(root.join("images"))
        };
        build()
    });
    match r {
        Ok(images) => Ok(images.clone()),
        Err(e) => Err(std::io::Error::other(e.clone())),
    }
}
/// Gives `state_dir` the shared cache as its `images` (a link: the
/// images' root filesystems are only ever read).
pub fn link_cache(state_dir: &Path, agent_bin: &Path) -> std::io::Result<()> {
    let images = shared_cache(agent_bin)?;
    std::os::unix::fs::symlink(images, state_dir.join("images"))
}
