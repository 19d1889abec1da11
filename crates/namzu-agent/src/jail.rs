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
//!
//! A kernel without `openat2` (gVisor's, for one) answers `ENOSYS`; the
//! jail then resolves the same way by hand ([`open_beneath_by_hand`]): one
//! component at a time with `O_NOFOLLOW`, following relative symlinks
//! itself, refusing absolute ones and any `..` above the root with `EXDEV`
//! as the kernel would, and opening the last component with `O_NOFOLLOW`
//! once it is known not to be a link, so a link swapped in meanwhile fails
//! instead of being followed.

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
        match rustix::fs::openat2(&root.fd, rel, flags | OFlags::CLOEXEC, mode, BENEATH) {
            Err(Errno::NOSYS) => Ok(open_beneath_by_hand(&root.fd, rel, flags, mode)?),
            other => Ok(other?),
        }
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

/// Most symlinks one resolution follows, as the kernel's `ELOOP` bound.
const MAX_LINKS: usize = 40;

/// `openat2(root, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
/// done in user space, for kernels without `openat2`.
pub fn open_beneath_by_hand(root: &OwnedFd, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    use std::collections::VecDeque;
    use std::os::fd::AsFd;
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // Directories from the root down to where we are; `..` pops.
    let mut stack: Vec<OwnedFd> = vec![rustix::fs::openat(root, ".", dir_flags, Mode::empty())?];
    let mut todo: VecDeque<std::ffi::OsString> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut links = 0usize;
    let top = |stack: &Vec<OwnedFd>| -> Result<OwnedFd, Errno> {
        let fd = stack.last().ok_or(Errno::XDEV)?;
        rustix::io::fcntl_dupfd_cloexec(fd, 0)
    };
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if stack.len() <= 1 {
                return Err(Errno::XDEV);
            }
            stack.pop();
            continue;
        }
        let last = todo.is_empty();
        let dir = stack.last().ok_or(Errno::XDEV)?.as_fd();
        // What is there now, not following it.
        let before = match rustix::fs::statat(dir, name.as_os_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(Errno::NOENT) if last => None,
            Err(e) => return Err(e),
        };
        let is_link = before
            .as_ref()
            .is_some_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink);
        if is_link {
            if last && flags.contains(OFlags::NOFOLLOW) {
                return Err(Errno::LOOP);
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            let target = rustix::fs::readlinkat(dir, name.as_os_str(), Vec::new())?;
            let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
            if target.is_absolute() {
                return Err(Errno::XDEV);
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => todo.push_front(n.to_owned()),
                    Component::ParentDir => todo.push_front("..".into()),
                    _ => {}
                }
            }
            continue;
        }
        let fd = if last {
            rustix::fs::openat(dir, name.as_os_str(), flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode)?
        } else {
            rustix::fs::openat(dir, name.as_os_str(), dir_flags, Mode::empty())?
        };
        // The name may have been swapped for a link between the look and
        // the open, and not every kernel refuses to follow it then (gVisor
        // 20221219 was seen to): what was opened must be what was looked
        // at, or, for a name just created, what the name is now. Otherwise
        // the opened object is dropped unused and the name looked at again.
        let opened = rustix::fs::fstat(&fd)?;
        let now = match before {
            Some(st) => st,
            None => rustix::fs::statat(dir, name.as_os_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?,
        };
        if (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino) {
            // Replaced meanwhile (an atomic rename, or a link): look again,
            // a bounded number of times.
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            todo.push_front(name);
            continue;
        }
        if last {
            return Ok(fd);
        }
        stack.push(fd);
    }
    // The path named a directory (or the root itself): open it as asked.
    let here = top(&stack)?;
    rustix::fs::openat(&here, ".", flags | OFlags::CLOEXEC, mode)
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

    /// The by-hand resolver answers as openat2 does: links inside the root
    /// are followed, links out of it and `..` above it are EXDEV, a final
    /// link is refused under O_NOFOLLOW.
    #[test]
    fn by_hand_resolution_matches_openat2() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/f"), b"inside").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("out")).unwrap();
        std::os::unix::fs::symlink("../../..", d.join("up")).unwrap();
        std::os::unix::fs::symlink("a/b", d.join("in")).unwrap();
        std::os::unix::fs::symlink("b/../../a/b/f", d.join("a/rel")).unwrap();
        std::os::unix::fs::symlink("loop2", d.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", d.join("loop2")).unwrap();
        let root = rustix::fs::open(d, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let read = |p: &str| {
            let fd = open_beneath_by_hand(&root, Path::new(p), OFlags::RDONLY, Mode::empty())?;
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s).unwrap();
            Ok::<_, Errno>(s)
        };
        assert_eq!(read("in/f").unwrap(), "inside");
        assert_eq!(read("a/rel").unwrap(), "inside");
        for p in ["out/passwd", "up/etc/passwd", "out", "a/../../etc/passwd"] {
            assert_eq!(read(p), Err(Errno::XDEV), "{p}");
            // The kernel agrees.
            let k = rustix::fs::openat2(&root, p, OFlags::RDONLY, Mode::empty(), BENEATH);
            assert_eq!(k.err(), Some(Errno::XDEV), "openat2 on {p}");
        }
        assert_eq!(read("loop1"), Err(Errno::LOOP));
        assert_eq!(read("missing/x"), Err(Errno::NOENT));
        let nofollow = open_beneath_by_hand(&root, Path::new("in"), OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty());
        assert_eq!(nofollow.err(), Some(Errno::LOOP));
        let created = open_beneath_by_hand(
            &root,
            Path::new("in/new"),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        );
        assert!(created.is_ok() && d.join("a/b/new").is_file());
        // A directory, and the root itself, open as directories.
        assert!(open_beneath_by_hand(
            &root,
            Path::new("a/b"),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty()
        )
        .is_ok());
        assert!(open_beneath_by_hand(&root, Path::new(""), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).is_ok());
    }

    fn cloexec(fd: &OwnedFd) -> bool {
        rustix::io::fcntl_getfd(fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC)
    }

    /// What the resolvers hand back is close-on-exec (a command must not
    /// inherit the agent's files) and opened with the access asked for.
    #[test]
    fn opened_files_are_close_on_exec_with_their_access_mode() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/f"), b"").unwrap();
        let root = rustix::fs::open(d, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let f = open_beneath_by_hand(&root, Path::new("a/b/f"), OFlags::WRONLY, Mode::empty()).unwrap();
        assert!(cloexec(&f));
        assert_eq!(rustix::io::write(&f, b"by hand").unwrap(), 7);
        let here = open_beneath_by_hand(
            &root,
            Path::new("a/b"),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        assert!(cloexec(&here));
        let top =
            open_beneath_by_hand(&root, Path::new(""), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(cloexec(&top));

        let jail = Jail::new(&[d.to_path_buf()]).unwrap();
        let canonical = d.canonicalize().unwrap();
        assert_eq!(jail.roots().collect::<Vec<_>>(), [canonical.as_path()]);
        let l = jail.locate(b"a/b/f").unwrap();
        assert_eq!(jail.full_path(&l), canonical.join("a/b/f"));
        let f = jail.open(&l, OFlags::WRONLY | OFlags::TRUNC, Mode::empty()).unwrap();
        assert!(cloexec(&f));
        assert_eq!(rustix::io::write(&f, b"jail").unwrap(), 4);
        assert_eq!(std::fs::read(d.join("a/b/f")).unwrap(), b"jail");
        // The parent must be a directory.
        let under_file = jail.locate(b"a/b/f/x").unwrap();
        assert!(matches!(jail.parent(&under_file), Err(ResolveError::Os(Errno::NOTDIR))));
        let (p, name) = jail.parent(&l).unwrap();
        assert!(cloexec(&p) && name == Path::new("f"));
    }

    /// The by-hand resolver follows as many links as the kernel does (40)
    /// and not one more.
    #[test]
    fn by_hand_follows_forty_links_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("target"), b"end").unwrap();
        // l1 -> l2 -> ... -> l40 -> target: 40 links.
        for i in 1..=40 {
            let to = if i == 40 {
                "target".to_owned()
            } else {
                format!("l{}", i + 1)
            };
            std::os::unix::fs::symlink(&to, d.join(format!("l{i}"))).unwrap();
        }
        // m0 -> l1: 41 links.
        std::os::unix::fs::symlink("l1", d.join("m0")).unwrap();
        let root = rustix::fs::open(d, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(open_beneath_by_hand(&root, Path::new("l1"), OFlags::RDONLY, Mode::empty()).is_ok());
        assert_eq!(
            open_beneath_by_hand(&root, Path::new("m0"), OFlags::RDONLY, Mode::empty()).err(),
            Some(Errno::LOOP)
        );
        // The kernel draws the line at the same place.
        let k = |p: &str| rustix::fs::openat2(&root, p, OFlags::RDONLY, Mode::empty(), BENEATH);
        assert!(k("l1").is_ok());
        assert_eq!(k("m0").err(), Some(Errno::LOOP));
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
