//! The workspace device rule (`namzu_agent::disk`) on REAL loop devices:
//! a blank device is formatted and mounted, a formatted one is mounted and
//! never formatted again (its files survive), a device carrying a
//! signature this agent does not mount is left byte-for-byte as it was, a
//! device that cannot be read is not taken for a blank one, and a missing
//! tool stops everything. Needs root (loop devices, mount); fails rather
//! than skips under NAMZU_REQUIRE_ROOT, which the test command sets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use namzu_agent::disk::{prepare, probe, DiskError, Probe, Tools};

/// A loop device over a sparse file, detached when dropped.
struct Loop {
    dev: PathBuf,
    _file: tempfile::NamedTempFile,
}

impl Loop {
    fn new(fill: impl FnOnce(&Path)) -> Self {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(64 << 20).unwrap();
        fill(file.path());
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Self { dev, _file: file }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Unmounts when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn root_or_skip() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("NAMZU_REQUIRE_ROOT").is_none(),
        "NAMZU_REQUIRE_ROOT is set and this is not root"
    );
    eprintln!("skipped: loop devices and mounts need root");
    false
}

fn tools(dev: &Path) -> Tools {
    Tools::find(dev, "/usr/sbin:/sbin:/usr/bin:/bin").unwrap()
}

#[test]
fn a_blank_device_is_formatted_once_and_its_files_survive_the_next_start() {
    if !root_or_skip() {
        return;
    }
    let l = Loop::new(|_| {});
    let t = tools(&l.dev);
    assert_eq!(probe(&t, &l.dev).unwrap(), Probe::Blank);
    let at = tempfile::tempdir().unwrap();
    let p = prepare(&t, &l.dev, at.path(), Some((65532, 65532))).unwrap();
    assert!(p.formatted && p.fstype == "ext4", "{p:?}");
    {
        let _m = Mounted(at.path().to_owned());
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(at.path()).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (65532, 65532),
            "a fresh disk is the command user's"
        );
        std::fs::write(at.path().join("work"), b"a week of it").unwrap();
    }
    // The next start (a resumed pod): mounted, never formatted again.
    let p = prepare(&t, &l.dev, at.path(), Some((1, 1))).unwrap();
    let _m = Mounted(at.path().to_owned());
    assert!(!p.formatted, "a formatted disk was formatted again");
    assert_eq!(std::fs::read(at.path().join("work")).unwrap(), b"a week of it");
}

#[test]
fn a_signature_it_does_not_mount_is_left_exactly_as_it_was() {
    if !root_or_skip() {
        return;
    }
    let l = Loop::new(|f| {
        let ok = Command::new("mkswap").arg(f).output().unwrap().status.success();
        assert!(ok, "mkswap");
    });
    let before = std::fs::read(&l.dev).unwrap();
    let at = tempfile::tempdir().unwrap();
    match prepare(&tools(&l.dev), &l.dev, at.path(), None).unwrap_err() {
        DiskError::Unsupported { found, .. } => assert_eq!(found, "swap"),
        other => panic!("{other}"),
    }
    assert!(std::fs::read(&l.dev).unwrap() == before, "the device was written to");
}

#[test]
fn a_device_that_cannot_be_read_is_not_blank_and_a_missing_tool_stops_everything() {
    if !root_or_skip() {
        return;
    }
    let l = Loop::new(|_| {});
    let at = tempfile::tempdir().unwrap();
    // blkid finds nothing on a path that is no device; the raw read fails.
    let missing = Path::new("/dev/namzu-no-such-device");
    match prepare(&tools(&l.dev), missing, at.path(), None).unwrap_err() {
        DiskError::Unreadable { .. } => {}
        other => panic!("{other}"),
    }
    // No blkid on PATH: nothing decided, nothing written.
    let empty = tempfile::tempdir().unwrap();
    match Tools::find(&l.dev, empty.path().to_str().unwrap()).unwrap_err() {
        DiskError::ToolMissing { tool, .. } => assert_eq!(tool, "blkid"),
        other => panic!("{other}"),
    }
    assert_eq!(
        probe(&tools(&l.dev), &l.dev).unwrap(),
        Probe::Blank,
        "the device was touched"
    );
}
