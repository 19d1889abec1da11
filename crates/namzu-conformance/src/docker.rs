//! What the docker tier's test targets share: a daemon check, the test
//! image, and provider factories.
//!
//! No registry is needed: the test image is made here from Debian's static
//! busybox (every applet linked in `/bin`, a passwd file for root) and
//! imported into the daemon, the same as `docker import` of a rootfs
//! tarball.

use std::sync::Arc;

use bollard::image::CreateImageOptions;
use futures::StreamExt;
use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::Provider;

use crate::util::Ctx;
use crate::Factory;

/// The image every docker test runs.
pub const TEST_IMAGE: &str = "namzu-test/busybox:2";

/// True when the docker tests must run rather than be reported ignored
/// (the test command sets it after starting the daemon).
pub fn required() -> bool {
    std::env::var_os("NAMZU_REQUIRE_DOCKER").is_some_and(|v| v == "1")
}

/// [`TEST_IMAGE`] with a user `app` (1000:1000, also in group `staff`, 50)
/// as its `USER`: an image that does not run as root.
pub const TEST_USER_IMAGE: &str = "namzu-test/busybox-app:2";

/// [`TEST_IMAGE`] plus the host's curl and getent with the libraries they
/// load: a client for the egress tests.
pub const TEST_CURL_IMAGE: &str = "namzu-test/busybox-curl:2";

/// Makes [`TEST_IMAGE`] on the daemon unless it is there.
pub async fn ensure_test_image(docker: &bollard::Docker) -> Result<&'static str, String> {
    build_busybox_image(docker, TEST_IMAGE, None, &[]).await
}

/// Makes [`TEST_USER_IMAGE`] on the daemon unless it is there.
pub async fn ensure_test_user_image(docker: &bollard::Docker) -> Result<&'static str, String> {
    build_busybox_image(docker, TEST_USER_IMAGE, Some("app"), &[]).await
}

/// Makes [`TEST_CURL_IMAGE`] on the daemon unless it is there.
pub async fn ensure_test_curl_image(docker: &bollard::Docker) -> Result<&'static str, String> {
    build_busybox_image(docker, TEST_CURL_IMAGE, None, &["/usr/bin/curl", "/usr/bin/getent"]).await
}

/// `program` and every library `ldd` says it loads (the loader included).
pub fn with_libraries(program: &str) -> Result<Vec<String>, String> {
    let out = std::process::Command::new("ldd").arg(program).output().ctx("ldd")?;
    let mut files = vec![program.to_owned()];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(p.to_owned());
        }
    }
    Ok(files)
}

/// FROM scratch: Debian's static busybox with its applets, a passwd and a
/// group file, /usr/lib/os-release (with `app` when `user` is set), imported as `name`.
async fn build_busybox_image(
    docker: &bollard::Docker,
    name: &'static str,
    user: Option<&str>,
    host_programs: &[&str],
) -> Result<&'static str, String> {
    if docker.inspect_image(name).await.is_ok() {
        return Ok(name);
    }
    let busybox = std::fs::read("/bin/busybox").ctx("read /bin/busybox (Debian's busybox-static)")?;
    let list = std::process::Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .ctx("busybox --list")?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut dir = |path: &str, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(mode);
        h.set_size(0);
        tar.append_data(&mut h, path, std::io::empty())
    };
    for (d, mode) in [
        ("bin", 0o755),
        ("etc", 0o755),
        ("usr", 0o755),
        ("usr/lib", 0o755),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("workspace", 0o755),
    ] {
        dir(d, mode).ctx("tar dir")?;
    }
    let mut file = |path: &str, mode: u32, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, path, data)
    };
    file("bin/busybox", 0o755, &busybox).ctx("tar busybox")?;
    let (mut passwd, mut group) = (
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_owned(),
        "root:x:0:\nnogroup:x:65534:\n".to_owned(),
    );
    if user.is_some() {
        passwd.push_str("app:x:1000:1000:app:/home/app:/bin/sh\n");
        group.push_str("app:x:1000:\nstaff:x:50:app\n");
    }
    file("etc/passwd", 0o644, passwd.as_bytes()).ctx("tar passwd")?;
    file("etc/group", 0o644, group.as_bytes()).ctx("tar group")?;
    // A system file and a /usr, as every distribution image has: the escape
    // suite's write attempts aim at them.
    file("usr/lib/os-release", 0o644, b"ID=namzu-test\n").ctx("tar os-release")?;
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet == "busybox" {
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")
            .ctx("tar link")?;
    }
    let mut added = std::collections::BTreeSet::new();
    for program in host_programs {
        for f in with_libraries(program)? {
            if added.insert(f.clone()) {
                let data = std::fs::read(&f).ctx("read a host program")?;
                let mut h = tar::Header::new_gnu();
                h.set_mode(0o755);
                h.set_size(data.len() as u64);
                tar.append_data(&mut h, f.trim_start_matches('/'), &data[..])
                    .ctx("tar program")?;
            }
        }
    }
    let body = tar.into_inner().ctx("tar")?;
    let (repo, tag) = name.split_once(':').unwrap_or((name, "latest"));
    let change = user.map(|u| format!("USER {u}"));
    let mut import = docker.create_image(
        Some(CreateImageOptions {
            from_src: "-",
            repo,
            tag,
            changes: change.iter().map(String::as_str).collect(),
            ..Default::default()
        }),
        Some(body.into()),
        None,
    );
    while let Some(step) = import.next().await {
        step.ctx("import the test image")?;
    }
    Ok(name)
}

/// A provider on a fresh state directory, or why there is none.
pub async fn provider(name: &str, opts: DockerOptions) -> Result<DockerProvider, String> {
    let agent = namzu::backend::find_agent_binary().ctx("agent binary")?;
    provider_with_agent(name, agent, opts).await
}

/// [`provider`] with a given agent binary (a test build, say).
pub async fn provider_with_agent(
    name: &str,
    agent: std::path::PathBuf,
    opts: DockerOptions,
) -> Result<DockerProvider, String> {
    let state = std::env::temp_dir().join(format!("namzu-{name}-{}", std::process::id()));
    let p = DockerProvider::with_agent(state, agent, opts)
        .await
        .ctx("docker provider")?;
    ensure_test_image(p.docker()).await?;
    Ok(p)
}

/// A factory creating sandboxes of [`TEST_IMAGE`] (unless the spec names
/// another image) on `provider`.
pub fn factory(provider: DockerProvider) -> Factory {
    let provider = Arc::new(provider);
    Arc::new(move |mut spec| {
        let provider = provider.clone();
        Box::pin(async move {
            spec.image.get_or_insert_with(|| TEST_IMAGE.to_owned());
            provider.create(spec).await
        })
    })
}

/// The `main` of a docker conformance target: the whole suite on
/// `opts`, or every case reported ignored with the reason the daemon is
/// missing (a failure instead when [`required`]).
pub fn conformance_main(backend: &str, opts: DockerOptions, cannot: &[(&str, &str)]) -> std::process::ExitCode {
    let made = tokio::runtime::Runtime::new()
        .ctx("runtime")
        .and_then(|rt| rt.block_on(provider(backend, opts)));
    match made {
        Ok(p) => {
            // Suspend and resume are the tier's; the disk limit is a
            // loop-mounted image, which needs root (as CI runs).
            let resumer = Arc::new(p.clone());
            let resume: crate::Resumer = Arc::new(move |id: String| {
                let p = resumer.clone();
                Box::pin(async move { p.resume(&id).await })
            });
            let hooks = crate::TierHooks {
                resume: Some(resume),
                disk_limit: nix::unistd::geteuid().is_root(),
                suspend_keeps_memory: false,
                pause_stops_machine: false,
                snapshots: None,
            };
            crate::run_main_with(backend, factory(p), cannot, hooks)
        }
        Err(why) if !required() => crate::ignore_all(backend, &why),
        Err(why) => {
            eprintln!("conformance[{backend}]: {why}");
            std::process::ExitCode::FAILURE
        }
    }
}
