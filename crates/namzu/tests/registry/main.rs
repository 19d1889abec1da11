//! Pulls from real registries (Debian's `docker-registry`) on loopback:
//! layers with whiteouts, a multi-platform index, a corrupted blob, an
//! unknown tag, refused and accepted credentials (htpasswd, and token auth
//! through a token server), an unreachable registry, a pull cut off midway
//! and resumed, concurrent pulls, shared layers, removal and the size bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod lab;

use lab::{layer, push, push_index, tree, unique, Mode, Proxy, Registry, TokenRegistry};
use namzu::image::{ImageStore, Platform, PullEvent, PullOptions};
use namzu::Error;
use oci_client::secrets::RegistryAuth;

fn store(dir: &tempfile::TempDir) -> ImageStore {
    ImageStore::new(dir.path())
}

fn quiet(_: PullEvent) {}

/// Two layers: the second deletes a file by whiteout and empties a
/// directory by an opaque whiteout, then adds to it.
async fn two_layer_image(registry: &str, repo: &str) -> lab::Pushed {
    let (l1, d1) = layer(&[
        ("etc/", b""),
        ("etc/gone", b"deleted by the next layer"),
        ("etc/kept", b"kept"),
        ("data/", b""),
        ("data/old1", b"emptied by an opaque whiteout"),
        ("data/old2", b"same"),
        ("bin/", b""),
        ("bin/hello", b"#!/bin/sh\necho hello\n"),
    ]);
    let (l2, d2) = layer(&[
        ("etc/.wh.gone", b""),
        ("data/.wh..wh..opq", b""),
        ("data/new", b"after the opaque whiteout"),
    ]);
    push(
        registry,
        repo,
        "1",
        "amd64",
        &[l1, l2],
        &[d1, d2],
        &RegistryAuth::Anonymous,
    )
    .await
}

#[tokio::test]
async fn a_multi_layer_image_with_whiteouts_pulls_verified_and_unpacked() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let pushed = two_layer_image(reg, &unique("whiteouts")).await;
    let dir = tempfile::tempdir().unwrap();
    let events = std::sync::Mutex::new(Vec::new());
    let info = store(&dir)
        .pull(&pushed.reference, &|e| events.lock().unwrap().push(e))
        .await
        .unwrap();
    assert_eq!(info.digest.as_deref(), Some(pushed.digest.as_str()));
    assert_eq!(info.names, vec![pushed.reference.clone()]);
    let files = tree(&info.rootfs);
    assert_eq!(
        files,
        ["bin/", "bin/hello", "data/", "data/new", "etc/", "etc/kept"],
        "whiteouts applied"
    );
    assert_eq!(std::fs::read(info.rootfs.join("etc/kept")).unwrap(), b"kept");
    // Progress: the manifest's layers, then each blob's bytes to its end.
    let events = events.into_inner().unwrap();
    let Some(PullEvent::Resolved { layers, .. }) = events.first() else {
        panic!("first event: {events:?}")
    };
    assert_eq!(layers.iter().map(|l| l.0.clone()).collect::<Vec<_>>(), pushed.layers);
    for (digest, size) in layers {
        assert!(events.iter().any(
            |e| matches!(e, PullEvent::Blob { digest: d, done, total } if d == digest && done == size && total == size)
        ));
    }
    // Listed with its size and digest; the image's user and env are its config's.
    let listed = store(&dir).list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].digest.as_deref(), Some(pushed.digest.as_str()));
    let bytes: u64 = ["#!/bin/sh\necho hello\n".len(), 4, 25].iter().map(|n| *n as u64).sum();
    assert_eq!(listed[0].size, bytes);
    let rc = ImageStore::runtime_config(&info.rootfs);
    assert!(rc.env.contains(&("FROM_IMAGE".into(), "yes".into())), "{:?}", rc.env);
    // A digest reference names the same image.
    let by_digest = format!("{}@{}", pushed.reference.rsplit_once(':').unwrap().0, pushed.digest);
    let again = store(&dir).pull(&by_digest, &quiet).await.unwrap();
    assert_eq!(again.id, info.id);
}

#[tokio::test]
async fn a_multi_platform_index_gives_the_platform_asked_for() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let repo = unique("multiarch");
    let (amd, da) = layer(&[("arch", b"amd64")]);
    let (arm, dr) = layer(&[("arch", b"arm64")]);
    let a = push(reg, &repo, "amd64", "amd64", &[amd], &[da], &RegistryAuth::Anonymous).await;
    let r = push(reg, &repo, "arm64", "arm64", &[arm], &[dr], &RegistryAuth::Anonymous).await;
    let index = push_index(reg, &repo, "multi", &[("amd64", &a), ("arm64", &r)]).await;

    let dir = tempfile::tempdir().unwrap();
    let host = store(&dir).pull(&index, &quiet).await.unwrap();
    let want = Platform::host().architecture;
    assert_eq!(std::fs::read_to_string(host.rootfs.join("arch")).unwrap(), want);

    let opts = |p: &str| PullOptions {
        platform: p.parse().unwrap(),
        ..PullOptions::default()
    };
    let other = if want == "amd64" { "linux/arm64" } else { "linux/amd64" };
    let dir2 = tempfile::tempdir().unwrap();
    let picked = store(&dir2)
        .with_pull_options(opts(other))
        .pull(&index, &quiet)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(picked.rootfs.join("arch")).unwrap(),
        other.rsplit('/').next().unwrap()
    );
    match store(&dir2)
        .with_pull_options(opts("linux/s390x"))
        .pull(&index, &quiet)
        .await
    {
        Err(Error::ImagePlatformMissing {
            platform, available, ..
        }) => {
            assert_eq!(platform, "linux/s390x");
            assert_eq!(available, vec!["linux/amd64".to_owned(), "linux/arm64".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    // A single-platform image for another architecture is refused too.
    match store(&dir2)
        .with_pull_options(opts("linux/s390x"))
        .pull(&a.reference, &quiet)
        .await
    {
        Err(Error::ImagePlatformMissing { available, .. }) => assert_eq!(available, vec!["linux/amd64".to_owned()]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_corrupted_blob_is_refused_naming_its_digest_and_nothing_is_kept() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let pushed = two_layer_image(reg, &unique("corrupt")).await;
    let proxy = Proxy::start(reg).await;
    let bad = pushed.layers[1].clone();
    proxy.set(Mode::Corrupt(bad.clone()));
    let via = pushed.reference.replacen(reg, &proxy.addr, 1);
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir);
    match s.pull(&via, &quiet).await {
        Err(Error::ImageBlobCorrupt { digest, reason, .. }) => {
            assert_eq!(digest, bad);
            assert!(reason.contains("hashes to sha256:"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.list().unwrap().is_empty(), "no image");
    let hex = bad.trim_start_matches("sha256:");
    assert!(s.blobs().get(hex).is_none(), "no blob");
    assert!(!s.blobs().dir().join(format!("{hex}.partial")).exists(), "no partial");
    assert!(s.resolve(&via).is_err());
    // The registry's own copy is fine: the next pull through it works.
    proxy.set(Mode::Pass);
    let info = s.pull(&via, &quiet).await.unwrap();
    assert_eq!(info.digest.as_deref(), Some(pushed.digest.as_str()));
}

#[tokio::test]
async fn an_unknown_tag_and_an_unreachable_registry_are_told_apart() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let pushed = two_layer_image(reg, &unique("known")).await;
    let dir = tempfile::tempdir().unwrap();
    let unknown = pushed.reference.replace(":1", ":no-such-tag");
    match store(&dir).pull(&unknown, &quiet).await {
        Err(Error::ImageNotInRegistry { reference, registry }) => {
            assert_eq!((reference.as_str(), registry.as_str()), (unknown.as_str(), reg));
        }
        other => panic!("{other:?}"),
    }
    let unknown_repo = format!("{reg}/{}:1", unique("never-pushed"));
    assert!(matches!(
        store(&dir).pull(&unknown_repo, &quiet).await,
        Err(Error::ImageNotInRegistry { .. })
    ));
    // Nothing listens on port 1.
    match store(&dir).pull("127.0.0.1:1/x/y:1", &quiet).await {
        Err(Error::RegistryUnreachable { registry, .. }) => assert_eq!(registry, "127.0.0.1:1"),
        other => panic!("{other:?}"),
    }
    match store(&dir).pull("not a reference!", &quiet).await {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(store(&dir).list().unwrap().is_empty());
}

#[tokio::test]
async fn basic_auth_credentials_come_from_the_docker_config_and_a_refusal_is_typed() {
    if !lab::ready() {
        return;
    }
    let reg = Registry::htpasswd("alice", "s3cret");
    let repo = unique("basic");
    let (l, d) = layer(&[("who", b"basic")]);
    let auth = RegistryAuth::Basic("alice".into(), "s3cret".into());
    let pushed = push(&reg.addr, &repo, "1", "amd64", &[l], &[d], &auth).await;

    let dir = tempfile::tempdir().unwrap();
    let with = |cfg: Option<&tempfile::TempDir>| {
        store(&dir).with_pull_options(PullOptions {
            docker_config: Some(cfg.map_or_else(|| dir.path().join("no-docker-config"), |c| c.path().to_path_buf())),
            ..PullOptions::default()
        })
    };
    match with(None).pull(&pushed.reference, &quiet).await {
        Err(Error::RegistryAuthRefused {
            user: None, registry, ..
        }) => assert_eq!(registry, reg.addr),
        other => panic!("anonymous: {other:?}"),
    }
    let wrong = lab::docker_config(&reg.addr, "alice", "wrong");
    match with(Some(&wrong)).pull(&pushed.reference, &quiet).await {
        Err(Error::RegistryAuthRefused { user, .. }) => assert_eq!(user.as_deref(), Some("alice")),
        other => panic!("wrong password: {other:?}"),
    }
    assert!(store(&dir).list().unwrap().is_empty());
    let right = lab::docker_config(&reg.addr, "alice", "s3cret");
    let info = with(Some(&right)).pull(&pushed.reference, &quiet).await.unwrap();
    assert_eq!(std::fs::read(info.rootfs.join("who")).unwrap(), b"basic");
}

#[tokio::test]
async fn token_auth_exchanges_the_credentials_for_a_bearer_token() {
    if !lab::ready() {
        return;
    }
    let tr = TokenRegistry::start("bob", "t0ken-pass").await;
    let reg = tr.registry.addr.clone();
    let repo = unique("token");
    let (l, d) = layer(&[("who", b"token")]);
    let auth = RegistryAuth::Basic("bob".into(), "t0ken-pass".into());
    let pushed = push(&reg, &repo, "1", "amd64", &[l], &[d], &auth).await;
    let before = *tr.issued.lock().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let with = |cfg: &tempfile::TempDir| {
        store(&dir).with_pull_options(PullOptions {
            docker_config: Some(cfg.path().to_path_buf()),
            ..PullOptions::default()
        })
    };
    let wrong = lab::docker_config(&reg, "bob", "nope");
    match with(&wrong).pull(&pushed.reference, &quiet).await {
        Err(Error::RegistryAuthRefused { user, reason, .. }) => {
            assert_eq!(user.as_deref(), Some("bob"));
            assert!(reason.contains("bad credentials"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(*tr.issued.lock().unwrap(), before, "no token for a wrong password");
    let right = lab::docker_config(&reg, "bob", "t0ken-pass");
    let info = with(&right).pull(&pushed.reference, &quiet).await.unwrap();
    assert_eq!(std::fs::read(info.rootfs.join("who")).unwrap(), b"token");
    assert!(*tr.issued.lock().unwrap() > before, "the pull ran on a token");
}

#[tokio::test]
async fn an_identity_token_is_exchanged_at_the_realm_and_never_sent_to_the_registry() {
    if !lab::ready() {
        return;
    }
    let tr = TokenRegistry::start("carol", "id-pass").await;
    let reg = tr.registry.addr.clone();
    let repo = unique("identity");
    let (l, d) = layer(&[("who", b"identity")]);
    let auth = RegistryAuth::Basic("carol".into(), "id-pass".into());
    let pushed = push(&reg, &repo, "1", "amd64", &[l], &[d], &auth).await;

    let dir = tempfile::tempdir().unwrap();
    let with = |cfg: &tempfile::TempDir| {
        store(&dir).with_pull_options(PullOptions {
            docker_config: Some(cfg.path().to_path_buf()),
            ..PullOptions::default()
        })
    };
    let before = *tr.issued.lock().unwrap();
    let wrong = lab::docker_config_with(&reg, serde_json::json!({"identitytoken": "refresh-stolen"}));
    match with(&wrong).pull(&pushed.reference, &quiet).await {
        Err(Error::RegistryAuthRefused { reason, .. }) => {
            assert!(reason.contains("invalid refresh token"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(*tr.issued.lock().unwrap(), before, "no token for a wrong refresh token");
    assert!(matches!(
        store(&dir).resolve(&pushed.reference),
        Err(Error::ImageNotFound { .. })
    ));

    let right = lab::docker_config_with(&reg, serde_json::json!({"identitytoken": "refresh-id-pass"}));
    let info = with(&right).pull(&pushed.reference, &quiet).await.unwrap();
    assert_eq!(std::fs::read(info.rootfs.join("who")).unwrap(), b"identity");
    assert!(
        *tr.issued.lock().unwrap() > before,
        "the pull ran on an exchanged token"
    );
}

#[tokio::test]
async fn an_interrupted_pull_leaves_no_image_and_the_next_resumes_where_it_broke() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let repo = unique("resume");
    // Incompressible, so the layer is as big as its contents.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..4u32 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let (l, d) = layer(&[("big", &noise)]);
    let cut = l.len() / 3;
    let pushed = push(reg, &repo, "1", "amd64", &[l], &[d], &RegistryAuth::Anonymous).await;
    let proxy = Proxy::start(reg).await;
    let blob = pushed.layers[0].clone();
    proxy.set(Mode::Cut(blob.clone(), cut));
    let via = pushed.reference.replacen(reg, &proxy.addr, 1);
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir);
    match s.pull(&via, &quiet).await {
        Err(Error::ImagePullInterrupted {
            digest, received, size, ..
        }) => {
            assert_eq!(digest, blob);
            assert!(received <= cut as u64 && received < size, "{received} of {size}");
        }
        other => panic!("{other:?}"),
    }
    assert!(s.list().unwrap().is_empty(), "no half image");
    assert!(s.resolve(&via).is_err());
    let hex = blob.trim_start_matches("sha256:");
    let kept = std::fs::metadata(s.blobs().dir().join(format!("{hex}.partial")))
        .unwrap()
        .len();
    assert!(kept > 0, "what arrived is kept");

    let info = s.pull(&via, &quiet).await.unwrap();
    assert_eq!(std::fs::read(info.rootfs.join("big")).unwrap(), noise);
    let ranges = proxy.seen.lock().unwrap().ranges.clone();
    assert_eq!(
        ranges,
        vec![(blob.clone(), format!("bytes={kept}-"))],
        "asked only for the rest"
    );
    assert!(!s.blobs().dir().join(format!("{hex}.partial")).exists());
}

#[tokio::test]
async fn concurrent_pulls_fetch_each_blob_once_and_images_share_layers() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let repo = unique("shared");
    let (base, db) = layer(&[("base", b"shared base layer")]);
    let (top1, d1) = layer(&[("top", b"one")]);
    let (top2, d2) = layer(&[("top", b"two")]);
    let one = push(
        reg,
        &repo,
        "1",
        "amd64",
        &[base.clone(), top1],
        &[db.clone(), d1],
        &RegistryAuth::Anonymous,
    )
    .await;
    let two = push(
        reg,
        &repo,
        "2",
        "amd64",
        &[base, top2],
        &[db, d2],
        &RegistryAuth::Anonymous,
    )
    .await;
    let proxy = Proxy::start(reg).await;
    let via = |p: &lab::Pushed| p.reference.replacen(reg, &proxy.addr, 1);

    let dir = tempfile::tempdir().unwrap();
    let (s1, s2, r) = (store(&dir), store(&dir), via(&one));
    let (a, b) = tokio::join!(s1.pull(&r, &quiet), s2.pull(&r, &quiet));
    assert_eq!(a.unwrap().id, b.unwrap().id);
    for l in &one.layers {
        assert_eq!(proxy.gets(l), 1, "{l} fetched once");
    }
    let cached = std::sync::Mutex::new(Vec::new());
    store(&dir)
        .pull(&via(&two), &|e| {
            if let PullEvent::BlobReady { digest, cached: true } = e {
                cached.lock().unwrap().push(digest)
            }
        })
        .await
        .unwrap();
    assert_eq!(
        proxy.gets(&two.layers[0]),
        1,
        "the shared base layer is not fetched again"
    );
    assert_eq!(proxy.gets(&two.layers[1]), 1);
    assert!(cached.into_inner().unwrap().contains(&two.layers[0]));
    assert_eq!(store(&dir).list().unwrap().len(), 2);
}

#[tokio::test]
async fn rm_untags_then_deletes_and_the_cache_bound_evicts_the_least_recently_used() {
    if !lab::ready() {
        return;
    }
    let reg = lab::SHARED;
    let repo = unique("evict");
    let (base, db) = layer(&[("base", &[7u8; 64 << 10][..])]);
    let (top1, d1) = layer(&[("top", b"one")]);
    let (top2, d2) = layer(&[("top", b"two")]);
    let one = push(
        reg,
        &repo,
        "1",
        "amd64",
        &[base.clone(), top1],
        &[db.clone(), d1],
        &RegistryAuth::Anonymous,
    )
    .await;
    let two = push(
        reg,
        &repo,
        "2",
        "amd64",
        &[base, top2],
        &[db, d2],
        &RegistryAuth::Anonymous,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir);
    let first = s.pull(&one.reference, &quiet).await.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = s.pull(&two.reference, &quiet).await.unwrap();
    let both = s.cache_bytes().unwrap();

    // Bounded to what one image takes: the least recently used goes, with
    // its own layer; the shared base stays for the other.
    let gone = s.prune(Some(both - 1), &[]).unwrap();
    assert_eq!(gone.images, vec![first.id.clone()]);
    assert!(s.cache_bytes().unwrap() < both);
    assert!(s.blobs().get(one.layers[1].trim_start_matches("sha256:")).is_none());
    assert!(s.blobs().get(one.layers[0].trim_start_matches("sha256:")).is_some());
    assert!(matches!(s.resolve(&one.reference), Err(Error::ImageNotFound { .. })));

    // rm by name: the last name deletes the image and its blobs.
    let removed = s.remove(&two.reference).unwrap();
    assert_eq!(removed.images, vec![second.id.clone()]);
    assert!(s.list().unwrap().is_empty());
    assert!(
        std::fs::read_dir(s.blobs().dir()).unwrap().next().is_none(),
        "no blob left"
    );
    assert!(matches!(s.remove(&two.reference), Err(Error::ImageNotFound { .. })));
}

/// The `namzu` binary beside this test's directory (the test command builds
/// every binary first).
fn namzu_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("namzu")
}

#[tokio::test]
async fn the_cli_pulls_with_a_credential_helper_runs_from_the_image_and_keeps_it_while_used() {
    if !lab::ready() {
        return;
    }
    let reg = Registry::htpasswd("carol", "h3lper");
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static (scripts/docker-up.sh installs it)");
    let (l1, d1) = layer(&[("bin/", b""), ("bin/sh", &busybox), ("etc/", b""), ("etc/gone", b"x")]);
    let (l2, d2) = layer(&[("etc/.wh.gone", b""), ("etc/motd", b"pulled over the wire\n")]);
    let auth = RegistryAuth::Basic("carol".into(), "h3lper".into());
    let pushed = push(&reg.addr, &unique("cli"), "1", "amd64", &[l1, l2], &[d1, d2], &auth).await;

    // Docker's config names a credential helper for the registry; the
    // helper (a program on PATH, as docker's are) answers with the secret.
    let home = tempfile::tempdir().unwrap();
    let cfg = home.path().join("docker");
    std::fs::create_dir(&cfg).unwrap();
    std::fs::write(
        cfg.join("config.json"),
        serde_json::json!({"credHelpers": {&reg.addr: "namzutest"}}).to_string(),
    )
    .unwrap();
    let helpers = home.path().join("bin");
    std::fs::create_dir(&helpers).unwrap();
    let helper = helpers.join("docker-credential-namzutest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\n[ \"$server\" = \"{}\" ] || exit 1\necho '{{\"ServerURL\":\"'$server'\",\"Username\":\"carol\",\"Secret\":\"h3lper\"}}'\n",
            reg.addr
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let state = home.path().join("state");
    let path = format!("{}:{}", helpers.display(), std::env::var("PATH").unwrap_or_default());
    let namzu = |args: &[&str]| {
        std::process::Command::new(namzu_bin())
            .args(["--state-dir", state.to_str().unwrap()])
            .args(args)
            .env("DOCKER_CONFIG", &cfg)
            .env("PATH", &path)
            .output()
            .unwrap()
    };
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();

    // `run --image` pulls what the cache lacks, then runs from it.
    let o = namzu(&[
        "run",
        "--image",
        &pushed.reference,
        "--",
        "/bin/sh",
        "-c",
        "cat /etc/motd; ls /etc; echo $FROM_IMAGE",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(text(&o), "pulled over the wire\nmotd\nyes\n");
    let o = namzu(&["image", "ls"]);
    let row = text(&o)
        .lines()
        .find(|l| l.starts_with(&pushed.reference))
        .map(str::to_owned);
    let row = row.unwrap_or_else(|| panic!("image ls: {}", text(&o)));
    assert!(row.contains(&pushed.digest), "{row}");

    // A sandbox running from it keeps it from `image rm`.
    let o = namzu(&["create", "--image", &pushed.reference]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = text(&o).trim().to_owned();
    let o = namzu(&["image", "rm", &pushed.reference]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&id),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = namzu(&["exec", &id, "--", "/bin/sh", "-c", "cat /etc/motd"]);
    assert_eq!(text(&o), "pulled over the wire\n");
    assert!(namzu(&["rm", &id]).status.success());
    let o = namzu(&["image", "rm", &pushed.reference]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text(&o).contains("deleted sha256:"), "{}", text(&o));
    assert!(!text(&namzu(&["image", "ls"])).contains(&pushed.reference));

    // Without the helper's answer the registry refuses, and says whom.
    let o = std::process::Command::new(namzu_bin())
        .args([
            "--state-dir",
            state.to_str().unwrap(),
            "image",
            "pull",
            &pushed.reference,
        ])
        .env("DOCKER_CONFIG", home.path().join("none"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused") && err.contains("anonymous"), "{err}");
}
