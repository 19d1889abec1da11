//! Lays the agent's start-up code out together in release builds (and in
//! the profiles that inherit release, such as `fast`: cargo reports them to
//! a build script as `release` too).
//!
//! Every sandbox runs this binary three times (launcher, middle process,
//! in-sandbox agent) and each keeps what its start touched mapped. The code a
//! start runs is a few hundred pages scattered over the whole text segment,
//! and the kernel's fault-around maps 64 KiB around every fault, so an idle
//! agent held about three quarters of the text. `startup.order` lists those
//! functions (mangled names, measured by `bench/agent-order.sh`); lld puts
//! them first, next to each other.
//!
//! The names carry crate hashes, so the list matches only the release build
//! of the same sources, lockfile and compiler. A name that no longer exists is
//! skipped without a warning: the layout degrades to the default, nothing
//! breaks. `bench/agent-order.sh` prints how much of the list still matches
//! and rewrites it.

fn main() {
    println!("cargo:rerun-if-changed=startup.order");
    println!("cargo:rerun-if-env-changed=NAMZU_AGENT_NO_ORDER");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    // The flag is lld's (GNU ld refuses it), and rust-lld links this
    // target by default from rustc 1.90; the workspace still builds on older
    // compilers, which link with the system's ld.
    let lld =
        std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu") && rustc_minor().is_some_and(|m| m >= 90);
    if !release || !lld || std::env::var_os("NAMZU_AGENT_NO_ORDER").is_some() {
        return;
    }
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    // `-Xlinker` hands the next argument to lld as it is: `-Wl,` would
    // split a checkout path at its commas. Cargo passes each line's value
    // as one argument, so spaces in the path are kept too.
    for arg in [
        format!("--symbol-ordering-file={dir}/startup.order"),
        "--no-warn-symbol-ordering".to_owned(),
    ] {
        println!("cargo:rustc-link-arg-bins=-Xlinker");
        println!("cargo:rustc-link-arg-bins={arg}");
    }
}

/// The minor version of the compiler cargo runs (`1.MINOR.x`).
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var_os("RUSTC")?;
    let out = std::process::Command::new(rustc).arg("-vV").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.lines().find_map(|l| l.strip_prefix("release: "))?;
    version.split('.').nth(1)?.parse().ok()
}
