//! What a microVM boots: the guest kernel, and the initramfs namzu builds
//! around the agent.
//!
//! The kernel is any `vmlinuz` the operator names, or by default the one
//! `scripts/microvm-up.sh` fetched with `apt-get download` (Debian's
//! `linux-image-cloud-amd64`), unpacked as the package lays it out:
//! `<root>/boot/vmlinuz-<version>` beside `<root>/lib/modules/<version>/`.
//! The modules the guest needs (the virtio-mmio transport, block, console,
//! and overlayfs for the root) are taken from there with everything they
//! depend on (read from each module's `.modinfo`), unless the kernel has
//! them built in. The initramfs is a newc cpio holding the static agent as
//! `/init`, those modules, and their load order; it is built once per
//! (agent, kernel) and cached by the hash of what went in. It holds no
//! secret: the per-sandbox spec travels on the sandbox's own disk.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::MicroVmError;

/// The modules the guest's boot needs, by name, before dependencies.
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_console", "overlay"];

/// A guest kernel and where its modules are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The bootable image.
    pub vmlinuz: PathBuf,
    /// Its version (from the file name `vmlinuz-<version>`), if known.
    pub version: Option<String>,
    /// `lib/modules/<version>` of its package, if there is one.
    pub modules: Option<PathBuf>,
}

impl Kernel {
    /// The kernel at `path`: a `vmlinuz` file, or a directory holding an
    /// unpacked kernel package (`boot/vmlinuz-*`).
    pub fn at(path: &Path) -> Result<Self, MicroVmError> {
        let not_found = |searched: Vec<PathBuf>| MicroVmError::KernelNotFound { searched };
        let vmlinuz = if path.is_dir() {
            let boot = path.join("boot");
            let found = std::fs::read_dir(&boot)
                .map_err(|_| not_found(vec![boot.join("vmlinuz-*")]))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
                })
                .max();
            found.ok_or_else(|| not_found(vec![boot.join("vmlinuz-*")]))?
        } else if path.is_file() {
            path.to_path_buf()
        } else {
            return Err(not_found(vec![path.to_path_buf()]));
        };
        let version = vmlinuz
            .file_name()
            .and_then(|n| n.to_string_lossy().strip_prefix("vmlinuz-").map(str::to_owned));
        let modules = match (&version, vmlinuz.parent().and_then(Path::parent)) {
            (Some(v), Some(root)) => Some(root.join("lib/modules").join(v)).filter(|d| d.is_dir()),
            _ => None,
        };
        Ok(Self {
            vmlinuz,
            version,
            modules,
        })
    }

    /// The kernel named by the caller, else `NAMZU_MICROVM_KERNEL`, else
    /// `<state>/microvm/kernel` (where the setup script links it).
    pub fn find(named: Option<&Path>, state_dir: &Path) -> Result<Self, MicroVmError> {
        if let Some(p) = named {
            return Self::at(p);
        }
        let mut searched = Vec::new();
        let env = std::env::var_os("NAMZU_MICROVM_KERNEL").map(PathBuf::from);
        for p in env.into_iter().chain([state_dir.join("microvm/kernel")]) {
            match Self::at(&p) {
                Ok(k) => return Ok(k),
                Err(MicroVmError::KernelNotFound { searched: s }) => searched.extend(s),
                Err(e) => return Err(e),
            }
        }
        Err(MicroVmError::KernelNotFound { searched })
    }
}

fn initramfs_err(reason: impl Into<String>) -> MicroVmError {
    MicroVmError::Initramfs { reason: reason.into() }
}

/// The `.ko` files of `dir`, by module name (`-` read as `_`).
fn module_files(dir: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.join("kernel")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(name) = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".ko"))
            {
                out.insert(name.replace('-', "_"), p);
            }
        }
    }
    out
}

/// The `depends=` of a module's `.modinfo` section.
pub fn module_depends(ko: &[u8]) -> Result<Vec<String>, String> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(ko).map_err(|e| e.to_string())?;
    let Some(section) = file.section_by_name(".modinfo") else {
        return Ok(Vec::new());
    };
    let data = section.data().map_err(|e| e.to_string())?;
    Ok(data
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect())
}

/// The modules to load for `wanted`, dependencies first, each once;
/// built-in ones are left out. A wanted module that is neither is an error.
pub fn load_order(modules_dir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>, MicroVmError> {
    let files = module_files(modules_dir);
    let builtin: BTreeSet<String> = std::fs::read_to_string(modules_dir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next()?.strip_suffix(".ko").map(|n| n.replace('-', "_")))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        files: &BTreeMap<String, PathBuf>,
        builtin: &BTreeSet<String>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<PathBuf>,
        depth: usize,
    ) -> Result<(), MicroVmError> {
        if builtin.contains(name) || !seen.insert(name.to_owned()) {
            return Ok(());
        }
        if depth > 32 {
            return Err(initramfs_err(format!("module {name}: dependency chain too deep")));
        }
        let path = files.get(name).ok_or_else(|| {
            initramfs_err(format!(
                "module {name} is neither built in nor in the modules directory"
            ))
        })?;
        let bytes = std::fs::read(path).map_err(|e| initramfs_err(format!("{}: {e}", path.display())))?;
        for dep in module_depends(&bytes).map_err(|e| initramfs_err(format!("{}: {e}", path.display())))? {
            visit(&dep, files, builtin, seen, order, depth + 1)?;
        }
        order.push(path.clone());
        Ok(())
    }
    for w in wanted {
        visit(w, &files, &builtin, &mut seen, &mut order, 0)?;
    }
    Ok(order)
}

/// Builds (or finds in `cache`) the initramfs for this agent and kernel.
pub fn initramfs(cache: &Path, agent: &Path, kernel: &Kernel) -> Result<PathBuf, MicroVmError> {
    let io = |what: &str, p: &Path, e: std::io::Error| initramfs_err(format!("{what} {}: {e}", p.display()));
    let agent_bytes = std::fs::read(agent).map_err(|e| io("read the agent", agent, e))?;
    let modules = match &kernel.modules {
        Some(dir) => load_order(dir, GUEST_MODULES)?,
        None => Vec::new(),
    };
    let mut h = Sha256::new();
    h.update(&agent_bytes);
    for m in &modules {
        h.update(m.as_os_str().as_encoded_bytes());
        h.update(std::fs::metadata(m).map(|md| md.len()).unwrap_or(0).to_le_bytes());
    }
    let key: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    let out = cache.join(format!("initramfs-{key}.cpio"));
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(cache).map_err(|e| io("create", cache, e))?;
    super::disk::locked(&out, || write_initramfs(cache, &key, &out, agent_bytes, &modules))
        .map_err(|e| io("lock", &out, e))?
}

/// Writes the initramfs (unless a build that held the lock first did).
fn write_initramfs(
    cache: &Path,
    key: &str,
    out: &Path,
    agent_bytes: Vec<u8>,
    modules: &[PathBuf],
) -> Result<PathBuf, MicroVmError> {
    let io = |what: &str, p: &Path, e: std::io::Error| initramfs_err(format!("{what} {}: {e}", p.display()));
    if out.is_file() {
        return Ok(out.to_path_buf());
    }
    // Readable by the VMM's own uid (see `jail`).
    let _ = std::fs::set_permissions(cache, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    let mut entries: Vec<(String, u32, Vec<u8>)> = Vec::new();
    let dir = |p: &str| (p.to_owned(), 0o040_755, Vec::new());
    entries.extend(["dev", "proc", "sys", "mnt", "etc", "etc/namzu", "lib", "lib/modules"].map(dir));
    entries.push(("init".into(), 0o100_555, agent_bytes));
    let mut list = String::new();
    for (i, m) in modules.iter().enumerate() {
        let name = format!(
            "lib/modules/{i:02}-{}",
            m.file_name().unwrap_or_default().to_string_lossy()
        );
        let bytes = std::fs::read(m).map_err(|e| io("read", m, e))?;
        entries.push((name.clone(), 0o100_444, bytes));
        list.push('/');
        list.push_str(&name);
        list.push('\n');
    }
    entries.push((
        namzu_proto::launch::GUEST_MODULES_LIST.into(),
        0o100_444,
        list.into_bytes(),
    ));
    let tmp = cache.join(format!(".{key}.{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for (ino, (name, mode, data)) in entries.iter().enumerate() {
            let len = u32::try_from(data.len()).map_err(std::io::Error::other)?;
            let mut w = cpio::NewcBuilder::new(name)
                .ino(ino as u32 + 1)
                .mode(*mode)
                .nlink(if *mode & 0o040_000 != 0 { 2 } else { 1 })
                .write(&mut f, len);
            w.write_all(data)?;
            w.finish()?;
        }
        cpio::newc::trailer(&mut f)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::fs::rename(&tmp, out)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", out, e));
    }
    Ok(out.to_path_buf())
}
