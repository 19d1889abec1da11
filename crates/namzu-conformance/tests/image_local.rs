//! `local` sandboxes from images: `docker save` and OCI layouts built here,
//! layer by layer, with a static binary of ours as the only program.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use namzu::backend::local::LocalProvider;
use namzu::image::ImageStore;
use namzu::{Error, ExecRequest, FileKind, Provider, SandboxSpec};
use sha2::Digest;

fn escape_bin() -> Vec<u8> {
    std::fs::read(namzu_conformance::escape::escape_binary().unwrap()).unwrap()
}

/// A tar of (path, contents, mode); a path ending in '/' is a directory.
fn tar_of(entries: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in entries {
        let mut h = tar::Header::new_gnu();
        if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(data.len() as u64);
        }
        h.set_mode(*mode);
        h.set_cksum();
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn layers() -> (Vec<u8>, Vec<u8>) {
    let bin = escape_bin();
    let l1 = tar_of(&[
        ("bin/", b"", 0o755),
        ("bin/escape", &bin, 0o755),
        ("etc/", b"", 0o755),
        ("etc/passwd", b"root:x:0:0:image root:/root:/bin/escape\n", 0o644),
        ("gone.txt", b"deleted by layer 2", 0o644),
        ("keep/", b"", 0o755),
        ("keep/a", b"emptied by layer 2", 0o644),
    ]);
    let l2 = tar_of(&[
        (".wh.gone.txt", b"", 0o644),
        ("keep/.wh..wh..opq", b"", 0o644),
        ("keep/b", b"new", 0o644),
    ]);
    (l1, l2)
}

const CONFIG: &[u8] = br#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;

fn docker_save(dir: &Path) -> PathBuf {
    let (l1, l2) = layers();
    let manifest =
        br#"[{"Config":"config.json","RepoTags":["test/escape:1"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#;
    let archive = tar_of(&[
        ("manifest.json", manifest, 0o644),
        ("config.json", CONFIG, 0o644),
        ("l1/", b"", 0o755),
        ("l1/layer.tar", &l1, 0o644),
        ("l2/", b"", 0o755),
        ("l2/layer.tar", &l2, 0o644),
    ]);
    let path = dir.join("image.tar");
    std::fs::write(&path, archive).unwrap();
    path
}

fn hex(data: &[u8]) -> String {
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn oci_layout(dir: &Path) -> PathBuf {
    let (l1, l2) = layers();
    let root = dir.join("oci");
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| {
        let d = hex(data);
        std::fs::write(blobs.join(&d), data).unwrap();
        (format!("sha256:{d}"), data.len())
    };
    let (cfg, cfg_len) = put(CONFIG);
    let (g1, n1) = put(&gzip(&l1));
    let (g2, n2) = put(&gzip(&l2));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg, "size": cfg_len},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": g1, "size": n1},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": g2, "size": n2},
        ],
    })
    .to_string();
    let (m, mlen) = put(manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": mlen,
                       "annotations": {"org.opencontainers.image.ref.name": "test/oci:1"}}],
    });
    std::fs::write(root.join("index.json"), index.to_string()).unwrap();
    std::fs::write(root.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    root
}

/// The image's own files, layers applied with whiteouts, and nothing of the
/// host's /usr; its binary runs unprivileged.
async fn check_sandbox_from(state: &Path, image: &str) {
    let provider = LocalProvider::new(state).unwrap();
    let sb = provider
        .create(SandboxSpec {
            image: Some(image.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let passwd = sb.files().read(Path::new("/etc/passwd")).await.unwrap();
    assert_eq!(&passwd[..], b"root:x:0:0:image root:/root:/bin/escape\n");
    assert!(
        matches!(
            sb.files().stat(Path::new("/gone.txt")).await,
            Err(Error::NotFound { .. })
        ),
        "whiteout ignored"
    );
    let keep: Vec<_> = sb
        .files()
        .list(Path::new("/keep"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(keep, ["b"], "opaque directory not emptied");
    let top: Vec<String> = sb
        .files()
        .list(Path::new("/"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect();
    assert!(
        !top.iter().any(|n| n == "usr"),
        "host /usr leaked into an image sandbox: {top:?}"
    );
    assert!(top.iter().any(|n| n == "workspace"));
    let out = sb
        .commands()
        .run(ExecRequest::new("/bin/escape").arg("--report-caps"))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "CapEff: 0000000000000000");
    let r = sb
        .files()
        .write(Path::new("/bin/pwn"), bytes::Bytes::from_static(b"x"))
        .await;
    assert!(
        matches!(r, Err(namzu::Error::PermissionDenied { .. })),
        "the image root must be read-only: {r:?}"
    );
    let st = sb.files().stat(Path::new("/bin/escape")).await.unwrap();
    assert_eq!(st.kind, FileKind::File);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn docker_save_archives_import_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::new(dir.path());
    let file = docker_save(dir.path());
    let info = store.import(&file, None, &|_, _| {}).unwrap();
    assert_eq!(info.id, format!("sha256:{}", hex(CONFIG)));
    assert_eq!(info.names, ["test/escape:1"]);
    // Content-addressed: a second import is the same image.
    let again = store.import(&file, Some("other:latest"), &|_, _| {}).unwrap();
    assert_eq!(again.rootfs, info.rootfs);
    assert_eq!(store.resolve("other:latest").unwrap(), info.rootfs);
    assert_eq!(store.resolve(&info.id).unwrap(), info.rootfs);
    check_sandbox_from(dir.path(), "test/escape:1").await;
}

#[tokio::test]
async fn oci_layouts_import_with_digests_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::new(dir.path());
    let layout = oci_layout(dir.path());
    let info = store.import(&layout, None, &|_, _| {}).unwrap();
    assert_eq!(info.names, ["test/oci:1"]);
    check_sandbox_from(dir.path(), "test/oci:1").await;

    // A corrupted blob is refused, and nothing is published for it.
    let other = tempfile::tempdir().unwrap();
    let layout = oci_layout(other.path());
    let blobs = layout.join("blobs/sha256");
    let victim = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .find(|e| std::fs::read(e.path()).unwrap().starts_with(&[0x1f, 0x8b]))
        .unwrap()
        .path();
    std::fs::write(&victim, gzip(b"tampered")).unwrap();
    let store2 = ImageStore::new(other.path());
    match store2.import(&layout, None, &|_, _| {}) {
        Err(Error::NotAnImage { reason, .. }) => assert!(reason.contains("corrupt"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(store2.list().unwrap().is_empty());
}

/// A multi-platform image (an index of indexes, as `docker buildx` and
/// registries make them): linux/amd64 is taken, the arm64 manifest beside
/// it never applied; with no amd64 manifest the import is refused by name.
#[tokio::test]
async fn a_multi_platform_index_gives_its_linux_amd64_image() {
    let dir = tempfile::tempdir().unwrap();
    let layout = oci_layout(dir.path());
    let blobs = layout.join("blobs/sha256");
    let put = |data: &[u8]| {
        let d = hex(data);
        std::fs::write(blobs.join(&d), data).unwrap();
        (format!("sha256:{d}"), data.len())
    };
    let top: serde_json::Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let amd64 = &top["manifests"][0];
    let arm_layer = gzip(&tar_of(&[("arm64-only", b"wrong platform", 0o644)]));
    let arm_config = br#"{"architecture":"arm64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#;
    let (ac, acn) = put(arm_config);
    let (al, aln) = put(&arm_layer);
    let arm = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": ac, "size": acn},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": al, "size": aln}],
    })
    .to_string();
    let (am, amn) = put(arm.as_bytes());
    let nested = |with_amd64: bool| {
        let mut manifests = vec![serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": am, "size": amn,
            "platform": {"architecture": "arm64", "os": "linux"}})];
        if with_amd64 {
            manifests.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": amd64["digest"], "size": amd64["size"],
                "platform": {"architecture": "amd64", "os": "linux"}}));
        }
        let inner = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}).to_string();
        let (d, n) = put(inner.as_bytes());
        let outer = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": d, "size": n,
            "annotations": {"org.opencontainers.image.ref.name": "test/multi:1"}}]});
        std::fs::write(layout.join("index.json"), outer.to_string()).unwrap();
    };
    nested(false);
    let store = ImageStore::new(dir.path());
    match store.import(&layout, None, &|_, _| {}) {
        Err(Error::NotAnImage { reason, .. }) => assert!(reason.contains("linux/amd64"), "{reason}"),
        other => panic!("an index without linux/amd64: {other:?}"),
    }
    nested(true);
    let info = store.import(&layout, None, &|_, _| {}).unwrap();
    assert_eq!(info.names, ["test/multi:1"]);
    assert!(!info.rootfs.join("arm64-only").exists(), "the arm64 layer was applied");
    check_sandbox_from(dir.path(), "test/multi:1").await;
}

#[tokio::test]
async fn what_is_not_an_image_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::new(dir.path());
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    assert!(matches!(
        store.import(&text, None, &|_, _| {}),
        Err(Error::NotAnImage { .. })
    ));
    let bare = dir.path().join("bare.tar");
    std::fs::write(&bare, tar_of(&[("hello.txt", b"hi", 0o644)])).unwrap();
    match store.import(&bare, None, &|_, _| {}) {
        Err(Error::NotAnImage { path, reason }) => {
            assert_eq!(path, bare);
            assert!(reason.contains("manifest.json"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Never pulled (the registry tests pull): a name the cache lacks.
    let provider = LocalProvider::new(dir.path())
        .unwrap()
        .pull_options(namzu::image::PullOptions {
            policy: namzu::image::PullPolicy::Never,
            ..Default::default()
        });
    let r = provider
        .create(SandboxSpec {
            image: Some("no/such:image".into()),
            ..Default::default()
        })
        .await;
    assert!(matches!(r, Err(Error::ImageNotFound { reference }) if reference == "no/such:image"));
    let r = provider
        .create(SandboxSpec {
            image: Some(text.display().to_string()),
            ..Default::default()
        })
        .await;
    assert!(matches!(r, Err(Error::NotAnImage { .. })), "a file is not a rootfs");
    assert!(
        provider.list().await.unwrap().is_empty(),
        "a refused create left a sandbox behind"
    );
}

#[tokio::test]
async fn a_rootfs_directory_works_as_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::write(rootfs.join("bin/escape"), escape_bin()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("bin/escape"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let provider = LocalProvider::new(dir.path().join("state")).unwrap();
    let sb = provider
        .create(SandboxSpec {
            image: Some(rootfs.display().to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    let out = sb
        .commands()
        .run(ExecRequest::new("/bin/escape").arg("--report-caps"))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "CapEff: 0000000000000000");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn binds_show_host_paths_and_misconfiguration_is_refused_by_field() {
    use namzu::Bind;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("in.txt"), "from the host").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let provider = LocalProvider::new(dir.path().join("state")).unwrap();
    let spec = SandboxSpec {
        binds: vec![
            Bind {
                source: data.clone(),
                target: "/data".into(),
                writable: false,
            },
            Bind {
                source: out.clone(),
                target: "/tmp/out".into(),
                writable: true,
            },
            // Outside every path the sandbox writes anyway: writable only
            // because the bind says so (landlock must follow it).
            Bind {
                source: out.clone(),
                target: "/srv/rw".into(),
                writable: true,
            },
        ],
        ..Default::default()
    };
    let sb = provider.create(spec).await.unwrap();
    let r = sb.files().read(Path::new("/data/in.txt")).await.unwrap();
    assert_eq!(&r[..], b"from the host");
    let w = sb
        .commands()
        .run(ExecRequest::shell("echo nope > /data/new"))
        .await
        .unwrap();
    assert!(!w.status.success(), "a read-only bind was writable");
    let w = sb
        .commands()
        .run(ExecRequest::shell("echo yes > /tmp/out/new"))
        .await
        .unwrap();
    assert!(w.status.success(), "{:?}", String::from_utf8_lossy(&w.stderr));
    assert_eq!(std::fs::read_to_string(out.join("new")).unwrap(), "yes\n");
    let w = sb
        .commands()
        .run(ExecRequest::shell("echo also > /srv/rw/other"))
        .await
        .unwrap();
    assert!(w.status.success(), "{:?}", String::from_utf8_lossy(&w.stderr));
    assert_eq!(std::fs::read_to_string(out.join("other")).unwrap(), "also\n");
    sb.destroy().await.unwrap();

    let bad = |binds: Vec<Bind>| SandboxSpec {
        binds,
        ..Default::default()
    };
    let missing = dir.path().join("missing");
    match provider
        .create(bad(vec![Bind {
            source: missing,
            target: "/m".into(),
            writable: false,
        }]))
        .await
    {
        Err(Error::OptionRefused { option, .. }) => assert_eq!(option, "binds[0].source"),
        other => panic!("{:?}", other.err()),
    }
    for target in ["relative", "/a/../etc", "/proc/x", "/"] {
        match provider
            .create(bad(vec![Bind {
                source: data.clone(),
                target: target.into(),
                writable: false,
            }]))
            .await
        {
            Err(Error::OptionRefused { option, .. }) => assert_eq!(option, "binds[0].target", "{target}"),
            other => panic!("{target}: {:?}", other.err()),
        }
    }
    assert!(
        provider.list().await.unwrap().is_empty(),
        "a refused create left a sandbox behind"
    );
}
