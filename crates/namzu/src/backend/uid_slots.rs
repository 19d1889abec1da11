//! Host id ranges for `local` sandboxes when the host process is root: slot
//! N is host ids `UID_BASE + N * UID_RANGE ..` (uids and gids alike), held
//! by a claim file `<state>/local/.uids/N` naming the sandbox.
//!
//! Claims are atomic: a claim is a symbolic link whose target is the
//! sandbox's id, made in one `symlink` call that fails if the slot is
//! taken, so no reader ever sees an empty or half-written claim, and none
//! needs an fsync to stay whole (a crash leaves the link or nothing;
//! claims written by older versions as regular files are still read). Claims, releases and
//! sweeps also hold one exclusive lock (`.lock`, flock) for their few
//! file operations: a sweep that read an owner cannot then remove a slot
//! re-claimed under the same number since, and a release removes only its
//! own sandbox's claim. A slot whose range overlaps a subordinate
//! range another user holds in /etc/subuid or /etc/subgid is never handed
//! out: those ids are that user's containers'.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// First host uid/gid of sandbox id ranges (when the host process is root).
pub const UID_BASE: u32 = 1_000_000;
/// Ids per sandbox.
pub const UID_RANGE: u32 = 65_536;
/// Ranges available, so ids stay below 2^31.
pub const UID_SLOTS: u32 = 16_000;

/// Whether the sandbox `owner` of a claim still has its state directory
/// under `base` (the state directory every tier shares): the table is
/// shared by the local tier's sandboxes and the microvm tier's VMMs, so
/// one host id range never serves both at once, and a sweep by either
/// tier keeps the other's claims.
pub fn claim_owner_exists(base: &Path, owner: &str) -> bool {
    let plain = owner.starts_with("sb-") && owner[3..].bytes().all(|b| b.is_ascii_hexdigit());
    plain && ["local", "microvm"].iter().any(|t| base.join(t).join(owner).exists())
}

/// The sandbox holding the claim at `path`: a symbolic link's target, or
/// (a claim of an older version) a regular file's text.
fn owner_of(path: &Path) -> std::io::Result<String> {
    match std::fs::read_link(path) {
        Ok(target) => Ok(target.to_string_lossy().into_owned()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(std::fs::read_to_string(path)?.trim().to_owned()),
        Err(e) => Err(e),
    }
}

/// The claims of one state directory.
#[derive(Debug, Clone)]
pub struct UidSlots {
    dir: PathBuf,
    /// Ranges (start, count) other users hold in /etc/subuid and /etc/subgid.
    taken: Vec<(u64, u64)>,
}

/// `(start, count)` of every entry of a subuid/subgid file not naming one
/// of `mine` (user names or numeric ids).
pub fn foreign_subid_ranges(text: &str, mine: &[&str]) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let (who, start, count) = (f.next()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            (!mine.contains(&who)).then_some((start, count))
        })
        .collect()
}

impl UidSlots {
    /// The claims under `dir`, skipping ranges other users hold in this
    /// host's /etc/subuid and /etc/subgid (root's own entries are ours).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let mut taken = Vec::new();
        for f in ["/etc/subuid", "/etc/subgid"] {
            if let Ok(text) = std::fs::read_to_string(f) {
                taken.extend(foreign_subid_ranges(&text, &["root", "0"]));
            }
        }
        Self::with_taken(dir, taken)
    }

    /// As [`Self::new`], with the foreign ranges given.
    pub fn with_taken(dir: impl Into<PathBuf>, taken: Vec<(u64, u64)>) -> Self {
        Self { dir: dir.into(), taken }
    }

    /// The first host id of `slot`.
    pub fn base(slot: u32) -> u32 {
        UID_BASE + slot * UID_RANGE
    }

    /// Whether `slot`'s range overlaps a range another user holds.
    pub fn overlaps_foreign(&self, slot: u32) -> bool {
        let (lo, hi) = (
            u64::from(Self::base(slot)),
            u64::from(Self::base(slot)) + u64::from(UID_RANGE),
        );
        self.taken.iter().any(|&(s, c)| s < hi && lo < s.saturating_add(c))
    }

    /// Holds the claims' lock until dropped.
    fn lock(&self) -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&self.dir)?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(".lock"))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(f)
    }

    /// Claims a free slot for sandbox `id`; `None` when every slot is held.
    pub fn claim(&self, id: &str) -> std::io::Result<Option<u32>> {
        if id.is_empty() || id.contains('/') || id.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{id:?} cannot name a claim"),
            ));
        }
        let _lock = self.lock()?;
        for slot in (0..UID_SLOTS).filter(|s| !self.overlaps_foreign(*s)) {
            match std::os::unix::fs::symlink(id, self.dir.join(slot.to_string())) {
                Ok(()) => return Ok(Some(slot)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Gives `slot` back, if sandbox `id` still holds it.
    pub fn release(&self, slot: u32, id: &str) {
        let Ok(_lock) = self.lock() else { return };
        let path = self.dir.join(slot.to_string());
        if owner_of(&path).is_ok_and(|o| o == id) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Releases every claim whose sandbox `exists` says is gone; returns the
    /// slots released. A claim is never empty (see the module doc), so an
    /// unreadable or empty one is left for a human, not freed.
    pub fn sweep(&self, exists: impl Fn(&str) -> bool) -> Vec<u32> {
        let mut freed = Vec::new();
        let Ok(_lock) = self.lock() else { return freed };
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let Ok(slot) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue; // a temporary claim being written
            };
            let Ok(owner) = owner_of(&e.path()) else {
                continue;
            };
            let owner = owner.as_str();
            if !owner.is_empty() && !exists(owner) {
                let _ = std::fs::remove_file(e.path());
                freed.push(slot);
            }
        }
        freed
    }

    /// Where the claims live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Audit item 16: claims racing a sweep that frees every slot whose
    /// owner is not (yet) registered never hand one slot to two owners.
    #[test]
    fn claims_racing_a_sweep_never_share_a_slot() {
        let tmp = tempfile::tempdir().unwrap();
        let slots = UidSlots::with_taken(tmp.path().join(".uids"), Vec::new());
        // Owners "exist" only while registered here: between a claim and
        // the registration, a sweep that read a half-made claim would free
        // it (the old create-then-write claim did exactly that).
        let live: Arc<Mutex<HashSet<String>>> = Arc::default();
        let held: Arc<Mutex<HashSet<u32>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = {
            let (slots, live, stop) = (slots.clone(), live.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut swept = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    swept += slots.sweep(|o| live.lock().unwrap().contains(o)).len();
                }
                swept
            })
        };
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (slots, live, held) = (slots.clone(), live.clone(), held.clone());
                std::thread::spawn(move || {
                    for i in 0..300 {
                        let id = format!("sb-{w}-{i}");
                        live.lock().unwrap().insert(id.clone());
                        let slot = slots.claim(&id).unwrap().unwrap();
                        assert!(held.lock().unwrap().insert(slot), "slot {slot} handed out twice");
                        std::thread::yield_now();
                        let owner = owner_of(&slots.dir().join(slot.to_string())).unwrap();
                        assert_eq!(owner, id, "slot {slot} was re-claimed under {id}");
                        held.lock().unwrap().remove(&slot);
                        slots.release(slot, &id);
                        live.lock().unwrap().remove(&id);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        sweeper.join().unwrap();
        // Dead owners' claims are freed.
        let slot = slots.claim("sb-dead").unwrap().unwrap();
        assert_eq!(slots.sweep(|_| false), vec![slot]);
    }

    #[test]
    fn claims_are_links_naming_their_sandbox_and_old_file_claims_still_count() {
        let tmp = tempfile::tempdir().unwrap();
        let slots = UidSlots::with_taken(tmp.path(), Vec::new());
        // A claim an older version wrote: a regular file holding the id.
        std::fs::create_dir_all(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("0"), "sb-old\n").unwrap();
        assert_eq!(slots.claim("sb-new").unwrap(), Some(1), "the old claim holds slot 0");
        assert_eq!(std::fs::read_link(tmp.path().join("1")).unwrap(), Path::new("sb-new"));
        slots.release(0, "sb-new");
        assert!(tmp.path().join("0").exists(), "a release frees only its own claim");
        slots.release(0, "sb-old");
        assert!(!tmp.path().join("0").exists());
        assert_eq!(
            slots.sweep(|o| o == "sb-new"),
            Vec::<u32>::new(),
            "a live owner keeps its claim"
        );
        assert_eq!(slots.sweep(|_| false), vec![1]);
        assert!(slots.claim("a/b").is_err(), "an id that is not one name is refused");
    }

    #[test]
    fn ranges_another_user_holds_are_skipped() {
        let text = "root:100000:65536\nalice:1065536:65536\n1001:3000000:10\n";
        let taken = foreign_subid_ranges(text, &["root", "0"]);
        assert_eq!(taken, vec![(1_065_536, 65_536), (3_000_000, 10)]);
        let tmp = tempfile::tempdir().unwrap();
        let slots = UidSlots::with_taken(tmp.path(), taken);
        assert!(!slots.overlaps_foreign(0));
        assert!(slots.overlaps_foreign(1), "alice's range is slot 1's");
        // 3_000_000 lies in slot (3_000_000 - 1_000_000) / 65536 = 30.
        assert!(slots.overlaps_foreign(30));
        assert_eq!(slots.claim("a").unwrap(), Some(0));
        assert_eq!(slots.claim("b").unwrap(), Some(2), "slot 1 skipped");
    }
}
