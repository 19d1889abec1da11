//! Layer application on hostile entries: whatever sequence of files,
//! directories, symlinks, hard links and whiteouts a layer holds (paths from
//! an alphabet that includes `..`, absolute names, whiteout markers and
//! symlink targets aiming at a victim directory beside the rootfs), applying
//! it never changes the victim and never creates anything beside the rootfs.
#![no_main]

use std::io::Write;
use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;

const COMPONENTS: &[&str] = &[
    "x", "y", "sub", "canary", "deep", "..", ".", "", ".wh.canary", ".wh..wh..opq", ".wh.sub", ".wh.x",
];

struct Lab {
    base: PathBuf,
    n: u64,
}

thread_local! {
    static LAB: std::cell::RefCell<Lab> = std::cell::RefCell::new(Lab::new());
}

impl Lab {
    fn new() -> Self {
        let base = std::env::temp_dir().join(format!("namzu-fuzz-layer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("victim/sub")).unwrap();
        std::fs::write(base.join("victim/canary"), "canary").unwrap();
        std::fs::write(base.join("victim/sub/deep"), "deep").unwrap();
        Self { base, n: 0 }
    }
}

fn path_from(bytes: &mut impl Iterator<Item = u8>, victim: &Path) -> String {
    let head = bytes.next().unwrap_or(0);
    let mut out = String::new();
    match head % 8 {
        0 => out.push_str(&victim.display().to_string()),
        1 => out.push('/'),
        _ => {}
    }
    for _ in 0..(1 + head / 64) {
        let c = COMPONENTS[bytes.next().unwrap_or(0) as usize % COMPONENTS.len()];
        if !out.is_empty() && !out.ends_with('/') {
            out.push('/');
        }
        out.push_str(c);
    }
    out
}

fn layer_from(data: &[u8], victim: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut bytes = data.iter().copied();
    while let Some(k) = bytes.next() {
        let name = path_from(&mut bytes, victim);
        let link = path_from(&mut bytes, victim);
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(match k % 5 {
            0 => tar::EntryType::Regular,
            1 => tar::EntryType::Directory,
            2 => tar::EntryType::Symlink,
            3 => tar::EntryType::Link,
            _ => tar::EntryType::Fifo,
        });
        let old = h.as_old_mut();
        let n = name.len().min(99);
        old.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        let l = link.len().min(99);
        old.linkname[..l].copy_from_slice(&link.as_bytes()[..l]);
        let body: &[u8] = if k % 5 == 0 { b"pwned" } else { b"" };
        h.set_size(body.len() as u64);
        h.set_mode(0o755 | u32::from(k & 0x80) << 4);
        h.set_cksum();
        b.append(&h, body).unwrap();
    }
    let mut out = b.into_inner().unwrap();
    out.flush().unwrap();
    out
}

fuzz_target!(|data: &[u8]| {
    LAB.with(|lab| {
        let mut lab = lab.borrow_mut();
        lab.n += 1;
        let victim = lab.base.join("victim");
        let root = lab.base.join(format!("root-{}", lab.n));
        std::fs::create_dir(&root).unwrap();
        let tar = layer_from(data, &victim);
        let _ = namzu::image::layer::apply(&tar[..], &root);
        assert_eq!(std::fs::read(victim.join("canary")).unwrap(), b"canary");
        assert_eq!(std::fs::read(victim.join("sub/deep")).unwrap(), b"deep");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 2, "the victim gained or lost an entry");
        assert_eq!(std::fs::read_dir(victim.join("sub")).unwrap().count(), 1);
        let beside: Vec<_> = std::fs::read_dir(&lab.base).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(beside.len(), 2, "something was created beside the rootfs: {beside:?}");
        std::fs::remove_dir_all(&root).unwrap();
    });
});
