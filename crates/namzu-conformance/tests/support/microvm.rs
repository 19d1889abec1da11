#![allow(dead_code)] // each test binary uses part of it
//! What the microvm tier's test binaries share: the provider on one state
//! directory, with the Debian image imported and the kernel
//! the setup script fetched.

use std::path::PathBuf;

use namzu::backend::microvm::{MicroVmOptions, MicroVmProvider};

/// What the microvm tier refuses by name, so a case needing it is
/// reported ignored with the reason.
pub const CANNOT: &[(&str, &str)] = &[(
    "flush_makes_the_workspace_durable",
    "the case counts the host's dirty page cache; a guest's writes are dirty in the guest's own memory, which the host cannot see (microvm_tier::flush_writes_back_the_guests_dirty_pages measures it inside)",
)];

/// The image every microvm test boots.
pub const IMAGE: &str = "debian:bookworm";

/// One state directory for every microvm test binary, kept across runs:
/// the image is imported and its base disk built once (cargo runs test
/// binaries one after another, so they never share it at the same time).
fn state(_what: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/microvm/test-state");
    // Canonical: the sockets beneath it must fit a sockaddr_un (108 bytes),
    // and `crates/namzu-conformance/../../` alone is 35 of them.
    let _ = std::fs::create_dir_all(&dir);
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// Destroys what an earlier run left in the state directory (a run that
/// panicked before destroying its VMs), once per test process.
fn sweep_stale(dir: &std::path::Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = dir.to_path_buf();
        // On a thread of its own: the caller may be inside a runtime.
        let _ = std::thread::spawn(move || {
            let Ok(p) = MicroVmProvider::new(&dir) else { return };
            let Ok(rt) = tokio::runtime::Runtime::new() else { return };
            rt.block_on(async {
                for s in namzu::Provider::list(&p).await.unwrap_or_default() {
                    let _ = namzu::Provider::destroy(&p, &s.id).await;
                }
            });
        })
        .join();
    });
}

/// Why this machine cannot run the tier, if it cannot.
pub fn missing() -> Option<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if std::env::var_os("NAMZU_MICROVM_KERNEL").is_none() {
        return Some("NAMZU_MICROVM_KERNEL is not set (scripts/microvm-up.sh prints it)".into());
    }
    if !root.join("target/images/debian-bookworm.tar").is_file() {
        return Some("target/images/debian-bookworm.tar is missing (scripts/images.sh)".into());
    }
    None
}

/// The provider, its image imported; `Err(why)` where the machine cannot
/// run the tier and nobody required it.
pub fn provider(what: &str) -> Result<MicroVmProvider, String> {
    if let Some(why) = missing() {
        if std::env::var_os("NAMZU_REQUIRE_MICROVM").is_some_and(|v| v == "1") {
            panic!("microvm tier required (NAMZU_REQUIRE_MICROVM=1) but unavailable: {why}");
        }
        return Err(why);
    }
    let dir = state(what);
    sweep_stale(&dir);
    let tar = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/images/debian-bookworm.tar");
    let store = namzu::image::ImageStore::new(&dir);
    let imported = match store.resolve(IMAGE) {
        Ok(_) => Ok(()),
        Err(_) => store.import(&tar, Some(IMAGE), &|_, _| {}).map(drop),
    };
    if let Err(e) = imported {
        panic!("import {}: {e}", tar.display());
    }
    let p = match MicroVmProvider::new(&dir) {
        Ok(p) => p,
        Err(e) => panic!("microvm provider: {e}"),
    };
    Ok(p.options(MicroVmOptions {
        default_image: Some(IMAGE.into()),
        ..Default::default()
    }))
}

/// Reports every case ignored, naming why.
pub fn skip_all(backend: &str, why: &str) -> std::process::ExitCode {
    namzu_conformance::ignore_all(backend, why)
}

/// Destroys every VM in the state directory (the image and its base disk
/// stay for the next run).
pub fn cleanup(what: &str) {
    let dir = state(what);
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Runtime::new() else { return };
        rt.block_on(async {
            if let Ok(p) = MicroVmProvider::new(&dir) {
                for s in namzu::Provider::list(&p).await.unwrap_or_default() {
                    let _ = namzu::Provider::destroy(&p, &s.id).await;
                }
            }
        });
    })
    .join();
}

/// The Debian image with the host's curl and getent (and the libraries
/// they load) added, as a rootfs directory beside the state: what the
/// egress cases drive inside (the minbase image has no curl). Built once.
pub fn curl_rootfs(p: &MicroVmProvider) -> Result<PathBuf, String> {
    let out = state("egress")
        .parent()
        .map(|d| d.join("curl-rootfs"))
        .ok_or("no state parent")?;
    if out.join(".complete").is_file() {
        return Ok(out);
    }
    let base = namzu::image::ImageStore::new(p.state_root().parent().ok_or("no state root")?)
        .resolve(IMAGE)
        .map_err(|e| e.to_string())?;
    let part = out.with_extension("part");
    let _ = std::fs::remove_dir_all(&part);
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&base)
        .arg(&part)
        .status()
        .map_err(|e| format!("cp: {e}"))?;
    if !st.success() {
        return Err(format!("cp -a {}: {st}", base.display()));
    }
    for program in ["/usr/bin/curl", "/usr/bin/getent"] {
        for f in namzu_conformance::docker::with_libraries(program)? {
            let to = part.join(f.trim_start_matches('/'));
            if let Some(d) = to.parent() {
                std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
            // The image's own copy of a library is replaced by the host's,
            // which curl was linked against (both Debian 12).
            let _ = std::fs::remove_file(&to);
            std::fs::copy(&f, &to).map_err(|e| format!("{f}: {e}"))?;
        }
    }
    std::fs::write(part.join(".complete"), b"").map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&out);
    std::fs::rename(&part, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// What a test of a microvm test binary is: an async body, its error
/// reported with its whole chain of causes.
pub type Body = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>>>;

/// Runs `tests` under libtest conventions, each on a runtime of its own,
/// `threads` at a time (none: libtest's default); every one is reported
/// ignored, with the reason, where the machine cannot run the tier and
/// nobody required it.
pub fn run_trials(tests: Vec<(&'static str, Body)>, threads: Option<usize>) -> std::process::ExitCode {
    use libtest_mimic::{Arguments, Failed, Trial};
    let args = Arguments::from_args();
    let unavailable = missing().filter(|_| std::env::var("NAMZU_REQUIRE_MICROVM").as_deref() != Ok("1"));
    let trials = tests
        .into_iter()
        .map(|(name, body)| {
            let trial = Trial::test(name, move || {
                let rt = tokio::runtime::Runtime::new().map_err(|e| Failed::from(e.to_string()))?;
                rt.block_on(body()).map_err(|e| {
                    // The whole chain: a tier's error says what in its source.
                    let mut text = e.to_string();
                    let mut cause = e.source();
                    while let Some(c) = cause {
                        text.push_str(&format!(": {c}"));
                        cause = c.source();
                    }
                    Failed::from(text)
                })
            });
            match &unavailable {
                Some(why) => trial.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
                None => trial,
            }
        })
        .collect();
    let args = Arguments {
        test_threads: threads.or(args.test_threads),
        ..args
    };
    libtest_mimic::run(&args, trials).exit_code()
}
