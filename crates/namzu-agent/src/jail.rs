//! The path jail: every file operation resolves its path beneath one of the
//! configured roots, or fails with [`JailError::Escape`].
//!
//! Two layers, so neither alone has to be perfect:
//! 1. a lexical check ([`Jail::locate`]): no NUL, no `..` component, an
//!    absolute path must lie under a root;
//! 2. the kernel: every open goes through `openat2(RESOLVE_BENEATH |
//!    RESOLVE_NO_MAGICLINKS)` from the root's directory fd, so a symlink
//!    that points out of the root (absolute or relative) is refused by the
//!    kernel with `EXDEV` at resolution time, with no check-then-use race.
//!
//! Operations on a final component that must not be followed (stat, remove,
//! rename, readlink) open the *parent* beneath the root and then use the
//! `*at` syscall on a single name, which the kernel does not resolve further.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Why a path was refused before any syscall.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JailError {
    #[error("path is empty")]
    Empty,
    #[error("path contains a NUL byte")]
    Nul,
    #[error("path escapes the sandbox's roots")]
    Escape,
    #[error("operation needs a path below the root, not the root itself")]
    IsRoot,
}

/// Resolution failure: either the lexical check or the kernel refused.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Jail(#[from] JailError),
    #[error("{0}")]
    Os(#[from] Errno),
}

/// A path located under a root: which root, and the path relative to it
/// (empty for the root itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub root: usize,
    pub rel: PathBuf,
}

#[derive(Debug)]
struct Root {
    path: PathBuf,
    fd: OwnedFd,
}

/// The set of directories file operations are confined to.
#[derive(Debug)]
pub struct Jail {
    roots: Vec<Root>,
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

impl Jail {
    /// Opens every root. Roots are canonicalised so that absolute request
    /// paths can be matched against them.
    pub fn new(roots: &[PathBuf]) -> std::io::Result<Self> {
        let mut out = Vec::with_capacity(roots.len());
        for r in roots {
            let path = std::fs::canonicalize(r)?;
            let fd = rustix::fs::open(
                &path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            out.push(Root { path, fd });
        }
        if out.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the jail needs at least one root",
            ));
        }
        Ok(Self { roots: out })
    }

    /// The root paths, canonical.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        self.roots.iter().map(|r| r.path.as_path())
    }

    /// Lexical step: which root, and the clean relative path beneath it.
    pub fn locate(&self, raw: &[u8]) -> Result<Located, JailError> {
        locate_in(self.roots.iter().map(|r| r.path.as_path()), raw)
    }

    /// The full host-visible path of a located path.
    pub fn full_path(&self, loc: &Located) -> PathBuf {
        self.roots[loc.root].path.join(&loc.rel)
    }

    /// Opens a located path beneath its root with the kernel's help.
    pub fn open(&self, loc: &Located, flags: OFlags, mode: Mode) -> Result<OwnedFd, ResolveError> {
        let root = &self.roots[loc.root];
        let rel: &Path = if loc.rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &loc.rel
        };
        Ok(rustix::fs::openat2(
            &root.fd,
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            BENEATH,
        )?)
    }

    /// Opens the parent directory of a located path and returns it with the
    /// final name, for syscalls that must not follow the last component.
    pub fn parent(&self, loc: &Located) -> Result<(OwnedFd, PathBuf), ResolveError> {
        let name = loc.rel.file_name().ok_or(JailError::IsRoot)?.to_owned();
        let parent = Located {
            root: loc.root,
            rel: loc.rel.parent().map(Path::to_path_buf).unwrap_or_default(),
        };
        let fd = self.open(&parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok((fd, PathBuf::from(name)))
    }
}

/// The pure lexical half of [`Jail::locate`], separate so it can be fuzzed
/// without opening anything.
pub fn locate_in<'a>(roots: impl Iterator<Item = &'a Path> + Clone, raw: &[u8]) -> Result<Located, JailError> {
    if raw.is_empty() {
        return Err(JailError::Empty);
    }
    if raw.contains(&0) {
        return Err(JailError::Nul);
    }
    let path = Path::new(OsStr::from_bytes(raw));
    let clean = clean(path)?;
    if !path.is_absolute() {
        return Ok(Located { root: 0, rel: clean });
    }
    for (i, root) in roots.enumerate() {
        // Both are clean and absolute; a component-wise prefix test.
        if let Ok(rest) = clean_abs(path)?.strip_prefix(root) {
            return Ok(Located {
                root: i,
                rel: rest.to_path_buf(),
            });
        }
    }
    Err(JailError::Escape)
}

/// Relative form without `.` components; `..` anywhere is refused.
fn clean(path: &Path) -> Result<PathBuf, JailError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return Err(JailError::Escape),
        }
    }
    Ok(out)
}

fn clean_abs(path: &Path) -> Result<PathBuf, JailError> {
    Ok(Path::new("/").join(clean(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(raw: &str) -> Result<Located, JailError> {
        let roots = [Path::new("/srv/ws"), Path::new("/data")];
        locate_in(roots.iter().copied(), raw.as_bytes())
    }

    #[test]
    fn relative_paths_go_under_the_first_root() {
        assert_eq!(
            loc("a/./b").unwrap(),
            Located {
                root: 0,
                rel: "a/b".into()
            }
        );
    }

    #[test]
    fn absolute_paths_pick_their_root() {
        assert_eq!(
            loc("/data/x").unwrap(),
            Located {
                root: 1,
                rel: "x".into()
            }
        );
        assert_eq!(
            loc("/srv/ws").unwrap(),
            Located {
                root: 0,
                rel: "".into()
            }
        );
        assert_eq!(
            loc("//srv//ws/./k").unwrap(),
            Located {
                root: 0,
                rel: "k".into()
            }
        );
    }

    #[test]
    fn escapes_are_refused() {
        assert_eq!(loc("../etc/passwd"), Err(JailError::Escape));
        assert_eq!(loc("a/../../x"), Err(JailError::Escape));
        assert_eq!(loc("/etc/passwd"), Err(JailError::Escape));
        assert_eq!(loc("/srv/wsx/a"), Err(JailError::Escape));
        assert_eq!(loc("/srv/ws/../ws/a"), Err(JailError::Escape));
        assert_eq!(loc(""), Err(JailError::Empty));
        assert_eq!(loc("a\0b"), Err(JailError::Nul));
    }

    #[test]
    fn kernel_refuses_symlink_out_of_the_root() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("../../..", dir.path().join("up")).unwrap();
        let jail = Jail::new(&[dir.path().to_path_buf()]).unwrap();
        for p in ["out/passwd", "up/etc/passwd"] {
            let l = jail.locate(p.as_bytes()).unwrap();
            let err = jail.open(&l, OFlags::RDONLY, Mode::empty()).unwrap_err();
            assert!(matches!(err, ResolveError::Os(Errno::XDEV)), "{p}: {err:?}");
        }
    }
}
