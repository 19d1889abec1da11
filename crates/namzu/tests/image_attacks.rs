//! Hostile images against `namzu image import`: layers that make a symlink
//! and then name a path through it (opaque whiteout, named whiteout,
//! overwrite), hard links out of the rootfs, absolute and `..` entry paths.
//! Each attack aims at a canary directory beside the state directory; the
//! import must be refused with the entry named, the canary untouched, and
//! nothing published.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use namzu::image::layer::Refusal;
use namzu::image::ImageStore;
use namzu::Error;

enum E<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

/// A tar whose names are written as given (tar::Builder would refuse the
/// `..` and absolute names these attacks need).
fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        let (name, data, link): (&str, &[u8], &str) = match e {
            E::File(n, d) => {
                h.set_entry_type(tar::EntryType::Regular);
                (n, d, "")
            }
            E::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                (n, b"", "")
            }
            E::Symlink(n, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                (n, b"", t)
            }
            E::Hardlink(n, t) => {
                h.set_entry_type(tar::EntryType::Link);
                (n, b"", t)
            }
        };
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A `docker save` archive of the given layers.
fn docker_save(dir: &Path, layers: &[Vec<u8>]) -> PathBuf {
    let names: Vec<String> = (0..layers.len()).map(|i| format!("l{i}/layer.tar")).collect();
    let manifest = serde_json::json!([{"Config": "config.json", "RepoTags": ["attack:1"], "Layers": names}]);
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("manifest.json", manifest.to_string().as_bytes());
    add(
        "config.json",
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers"}}"#,
    );
    for (n, l) in names.iter().zip(layers) {
        add(n, l);
    }
    let path = dir.join("image.tar");
    std::fs::write(&path, b.into_inner().unwrap()).unwrap();
    path
}

struct Lab {
    _dir: tempfile::TempDir,
    root: PathBuf,
    victim: PathBuf,
}

impl Lab {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let victim = root.join("victim");
        std::fs::create_dir_all(victim.join("sub")).unwrap();
        std::fs::write(victim.join("canary"), "canary").unwrap();
        std::fs::write(victim.join("sub/deep"), "deep").unwrap();
        Self {
            _dir: dir,
            root,
            victim,
        }
    }

    fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    /// The symlink targets that reach the victim: absolute, and `..` from
    /// `<state>/images/tmp/partial-*/rootfs/` (five levels up).
    fn targets(&self) -> [String; 2] {
        [self.victim.display().to_string(), "../../../../../victim".into()]
    }

    fn import(&self, layers: &[Vec<u8>]) -> Result<namzu::image::ImageInfo, Error> {
        let file = docker_save(&self.root, layers);
        ImageStore::new(self.state()).import(&file, None, &|_, _| {})
    }

    fn assert_victim_untouched(&self) {
        assert_eq!(std::fs::read_to_string(self.victim.join("canary")).unwrap(), "canary");
        assert_eq!(std::fs::read_to_string(self.victim.join("sub/deep")).unwrap(), "deep");
        let mut names: Vec<String> = std::fs::read_dir(&self.victim)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["canary", "sub"], "the victim directory changed");
        let st = std::fs::metadata(self.victim.join("canary")).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::nlink(&st),
            1,
            "the canary gained a hard link"
        );
        assert!(
            ImageStore::new(self.state()).list().unwrap().is_empty(),
            "a refused import published an image"
        );
    }
}

fn assert_refused(r: Result<namzu::image::ImageInfo, Error>, want_entry: &str, want: Refusal) {
    match r {
        Err(Error::ImageEntryRefused {
            entry, reason, layer, ..
        }) => {
            assert_eq!(entry, want_entry);
            assert_eq!(reason, want);
            assert_eq!(layer, "layer.tar");
        }
        other => panic!("expected the entry {want_entry:?} refused ({want:?}), got {other:?}"),
    }
}

#[test]
fn an_opaque_whiteout_through_an_image_symlink_is_refused() {
    for target in Lab::new().targets() {
        let lab = Lab::new();
        let r = lab.import(&[layer(&[E::Symlink("x", &target), E::File("x/.wh..wh..opq", b"")])]);
        assert_refused(r, "x/.wh..wh..opq", Refusal::ThroughSymlink);
        lab.assert_victim_untouched();
    }
}

#[test]
fn an_opaque_whiteout_through_a_symlink_of_an_earlier_layer_is_refused() {
    let lab = Lab::new();
    let target = lab.victim.display().to_string();
    let r = lab.import(&[
        layer(&[E::Symlink("x", &target)]),
        layer(&[E::File("x/.wh..wh..opq", b"")]),
    ]);
    assert_refused(r, "x/.wh..wh..opq", Refusal::ThroughSymlink);
    lab.assert_victim_untouched();
}

#[test]
fn a_named_whiteout_through_an_image_symlink_is_refused() {
    for target in Lab::new().targets() {
        let lab = Lab::new();
        for victim in ["x/.wh.canary", "x/.wh.sub"] {
            let r = lab.import(&[layer(&[E::Symlink("x", &target), E::File(victim, b"")])]);
            assert_refused(r, victim, Refusal::ThroughSymlink);
            lab.assert_victim_untouched();
        }
    }
}

#[test]
fn an_overwrite_through_a_symlinked_parent_is_refused() {
    for target in Lab::new().targets() {
        let lab = Lab::new();
        for entries in [
            vec![E::Symlink("x", &target), E::File("x/canary", b"pwned")],
            vec![E::Symlink("x", &target), E::File("x/new", b"planted")],
            vec![E::Symlink("x", &target), E::Dir("x/sub")],
            vec![E::Symlink("x", &target), E::Symlink("x/canary", "/etc/passwd")],
            vec![
                E::Dir("d"),
                E::Symlink("d/x", &target),
                E::File("d/x/sub/deep", b"pwned"),
            ],
        ] {
            let r = lab.import(&[layer(&entries)]);
            match r {
                Err(Error::ImageEntryRefused { reason, .. }) => assert_eq!(reason, Refusal::ThroughSymlink),
                other => panic!("{other:?}"),
            }
            lab.assert_victim_untouched();
        }
    }
}

#[test]
fn hard_links_out_of_the_rootfs_are_refused() {
    let lab = Lab::new();
    let abs = lab.victim.join("canary").display().to_string();
    let cases: Vec<(Vec<E>, &str, Refusal)> = vec![
        (vec![E::Hardlink("h", &abs)], "h", Refusal::LinkOutside),
        (
            vec![E::Hardlink("h", "../../../../../victim/canary")],
            "h",
            Refusal::LinkOutside,
        ),
        (
            vec![
                E::Symlink("x", lab.victim.to_str().unwrap()),
                E::Hardlink("h", "x/canary"),
            ],
            "h",
            Refusal::ThroughSymlink,
        ),
        (vec![E::Hardlink("h", "no/such/file")], "h", Refusal::LinkMissing),
    ];
    for (entries, entry, want) in cases {
        assert_refused(lab.import(&[layer(&entries)]), entry, want);
        lab.assert_victim_untouched();
    }
}

#[test]
fn absolute_and_climbing_entry_paths_are_refused() {
    let lab = Lab::new();
    let abs = lab.victim.join("canary").display().to_string();
    for name in [
        abs.as_str(),
        "../../../../../victim/canary",
        "a/../../../../../../victim/canary",
    ] {
        assert_refused(
            lab.import(&[layer(&[E::File(name, b"pwned")])]),
            name,
            Refusal::PathOutside,
        );
        lab.assert_victim_untouched();
    }
}

/// The other side of the refusals: symlinks with absolute and `..` targets
/// are legitimate image content, kept verbatim and never followed; an entry
/// replacing a symlink replaces the link, not its target; hard links inside
/// work; setuid bits are dropped.
#[test]
fn symlinks_are_kept_verbatim_and_replaced_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let lab = Lab::new();
    let abs = lab.victim.join("canary").display().to_string();
    let info = lab
        .import(&[
            layer(&[
                E::Dir("usr/"),
                E::Dir("usr/lib/"),
                E::Symlink("lib", "usr/lib"),
                E::Symlink("abs", &abs),
                E::Symlink("up", "../../../../../victim/canary"),
                E::File("usr/lib/real", b"real"),
                E::Hardlink("usr/lib/again", "usr/lib/real"),
            ]),
            layer(&[E::File("abs", b"replaced"), E::Dir("up/"), E::File("up/inside", b"in")]),
        ])
        .unwrap();
    let r = &info.rootfs;
    assert_eq!(std::fs::read_link(r.join("lib")).unwrap(), Path::new("usr/lib"));
    assert_eq!(std::fs::read_to_string(r.join("abs")).unwrap(), "replaced");
    assert!(r.join("up").symlink_metadata().unwrap().is_dir());
    assert_eq!(std::fs::read_to_string(r.join("up/inside")).unwrap(), "in");
    assert_eq!(std::fs::read_to_string(r.join("usr/lib/again")).unwrap(), "real");
    lab_victim_untouched_after_success(&lab);

    // setuid and setgid bits never land in the cache.
    let lab = Lab::new();
    let mut h = tar::Header::new_ustar();
    h.set_path("suid").unwrap();
    h.set_size(2);
    h.set_mode(0o6755);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"#!"[..]).unwrap();
    let info = lab.import(&[b.into_inner().unwrap()]).unwrap();
    let mode = std::fs::metadata(info.rootfs.join("suid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "mode {mode:o}");
}

fn lab_victim_untouched_after_success(lab: &Lab) {
    assert_eq!(std::fs::read_to_string(lab.victim.join("canary")).unwrap(), "canary");
    assert_eq!(std::fs::read_to_string(lab.victim.join("sub/deep")).unwrap(), "deep");
}
