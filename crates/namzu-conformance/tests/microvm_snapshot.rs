//! Memory snapshots and forks on the `microvm` tier, on real qemu guests
//! (TCG here), beyond the conformance suite's case (forks going on from
//! the snapshot's instant on disks of their own): forks under tokens of
//! their own, the snapshot held while forks overlay it, typed refusals, a
//! damaged memory file, forks drawing different random bytes, and the
//! guest's keeper (the one process that may set a restored guest's clock
//! and reseed its random pool) resisting a command's attempts on it.

#[path = "support/microvm.rs"]
mod microvm;

use namzu::{Error, Provider, Resources, SandboxSpec};

type R = Result<(), Box<dyn std::error::Error>>;

fn spec() -> SandboxSpec {
    SandboxSpec {
        resources: Resources {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn sh(sb: &namzu::Sandbox, script: &str) -> Result<String, Box<dyn std::error::Error>> {
    let out = sb.commands().run(script).await?;
    if !out.status.success() {
        return Err(format!("{script}: {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the conformance case `forks_of_a_snapshot_go_on_independently`
/// leaves to the tier: the snapshot listed, each fork's token its own (the
/// source's opens none), a fork's clock the host's, and removal refused
/// while forks' disks overlay the snapshot, naming them.
async fn forks_have_their_own_tokens_and_hold_their_snapshot() -> R {
    let p = microvm::provider("snapshot")?;
    let src = p.create(spec()).await?;
    let result = async {
        let snap = p.snapshot(src.id()).await?;
        assert_eq!(snap.source, src.id());
        assert!(snap.memory_bytes > 1 << 20, "{snap:?}");
        assert!(p.snapshots().await?.iter().any(|s| s.id == snap.id));
        let a = p.fork(&snap.id).await?;
        let b = p.fork(&snap.id).await?;
        // One snapshot, one random pool: reseeded from the host in each
        // fork before its first session, they draw different bytes.
        let draw = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
        let (ra, rb) = (sh(&a, draw).await?, sh(&b, draw).await?);
        assert_eq!(ra.len(), 64, "{ra:?}");
        assert_ne!(ra, rb, "two forks drew the same random bytes");
        // A fork's clock is the host's, not the snapshot's.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs() as i64;
        let guest: i64 = sh(&b, "date +%s").await?.trim().parse()?;
        assert!((guest - now).abs() <= 5, "guest clock {guest}, host {now}");
        let src_token = std::fs::read(p.state_root().join(src.id()).join("token"))?;
        for fork in [&a, &b] {
            let dir = p.state_root().join(fork.id());
            let sock = dir.join("agent.sock");
            let refused =
                namzu::AgentClient::connect_unix(fork.id(), &sock, src_token.clone(), Default::default()).await;
            assert!(refused.is_err(), "the source's token opened fork {}", fork.id());
            let own = std::fs::read(dir.join("token"))?;
            assert_ne!(own, src_token);
            let c = namzu::AgentClient::connect_unix(fork.id(), &sock, own, Default::default()).await?;
            c.close();
        }
        match p.delete_snapshot(&snap.id).await {
            Err(Error::SnapshotInUse { mut forks, .. }) => {
                forks.sort();
                let mut want = vec![a.id().to_owned(), b.id().to_owned()];
                want.sort();
                assert_eq!(forks, want);
            }
            other => panic!("delete while forks run: {other:?}"),
        }
        a.destroy().await?;
        b.destroy().await?;
        p.delete_snapshot(&snap.id).await?;
        assert!(p.snapshots().await?.iter().all(|s| s.id != snap.id));
        assert!(matches!(p.fork(&snap.id).await, Err(Error::SnapshotNotFound { .. })));
        R::Ok(())
    }
    .await;
    let _ = src.destroy().await;
    result
}

async fn snapshot_refusals_are_typed() -> R {
    let p = microvm::provider("snapshot")?;
    for bad in ["snap-nothere", "../microvm", "", ".snapshots"] {
        assert!(
            matches!(p.fork(bad).await, Err(Error::SnapshotNotFound { .. })),
            "fork {bad:?}"
        );
        assert!(matches!(
            p.delete_snapshot(bad).await,
            Err(Error::SnapshotNotFound { .. })
        ));
    }
    let sb = p.create(spec()).await?;
    let id = sb.id().to_owned();
    sb.suspend().await?;
    let r = p.snapshot(&id).await;
    assert!(matches!(r, Err(Error::SandboxSuspended { .. })), "{r:?}");
    p.destroy(&id).await?;
    let r = p.snapshot(&id).await;
    assert!(r.is_err(), "a snapshot of a destroyed sandbox: {r:?}");
    Ok(())
}

/// A restored guest's clock and random pool are set by a keeper holding
/// CAP_SYS_TIME and CAP_SYS_ADMIN alone; a command (root in the guest, no
/// capability) can neither set the clock itself nor reach the keeper's
/// pipe or memory.
async fn the_keeper_resists_a_command() -> R {
    let p = microvm::provider("snapshot")?;
    let sb = p.create(spec()).await?;
    let result = async {
        let keeper = sh(
            &sb,
            "for d in /proc/[0-9]*; do [ \"$(cat $d/comm 2>/dev/null)\" = namzu-keeper ] && echo ${d#/proc/}; done; true",
        )
        .await?;
        let keeper = keeper.trim();
        assert!(!keeper.is_empty(), "no keeper in the guest");
        let caps = sh(&sb, &format!("grep CapEff /proc/{keeper}/status")).await?;
        // CAP_SYS_TIME and CAP_SYS_ADMIN, nothing else.
        assert_eq!(caps.split_whitespace().nth(1), Some("0000000002200000"), "{caps}");
        let attempts = format!(
            "date -s @0 >/dev/null 2>&1 && echo set-clock; \
             cat /proc/{keeper}/fd/3 </dev/null >/dev/null 2>&1 && echo read-pipe; \
             echo 0000000000000000 > /proc/{keeper}/fd/3 2>/dev/null && echo wrote-pipe; \
             head -c1 /proc/{keeper}/mem >/dev/null 2>&1 && echo read-mem; \
             echo done"
        );
        assert_eq!(sh(&sb, &attempts).await?, "done\n");
        let year: i32 = sh(&sb, "date +%Y").await?.trim().parse()?;
        assert!(year >= 2025, "the clock moved: {year}");
        R::Ok(())
    }
    .await;
    let _ = sb.destroy().await;
    result
}

/// A memory file this qemu cannot load (another version's, a damaged
/// one) does not strand the sandbox: the resume boots its kept disk —
/// what it wrote is there, its processes are not — and says so in the
/// boot id.
async fn an_unloadable_memory_file_resumes_from_the_disk() -> R {
    let p = microvm::provider("snapshot")?;
    let sb = p.create(spec()).await?;
    let id = sb.id().to_owned();
    let result = async {
        sh(&sb, "echo kept > /workspace/f; sleep 3000 >/dev/null 2>&1 </dev/null &").await?;
        let boot = sb.agent().boot_id();
        sb.clone().suspend().await?;
        let mem = p.state_root().join(&id).join("memory.snap");
        assert!(mem.metadata()?.len() > 1 << 20, "no memory kept");
        std::fs::write(&mem, b"QEVM not really a migration stream")?;
        let back = p.resume(&id).await?;
        assert_ne!(back.agent().boot_id(), boot, "the damaged memory was loaded?");
        assert_eq!(sh(&back, "cat /workspace/f").await?, "kept\n");
        let sleepers = sh(
            &back,
            "for d in /proc/[0-9]*; do cat $d/cmdline 2>/dev/null | tr '\\0' ' '; echo; done | grep -c '^sleep 3000' || true",
        )
        .await?;
        assert_eq!(sleepers.trim(), "0");
        assert!(!mem.exists(), "the memory file outlived the resume");
        R::Ok(())
    }
    .await;
    let _ = p.destroy(&id).await;
    result
}

fn main() -> std::process::ExitCode {
    let tests: Vec<(&str, microvm::Body)> = vec![
        ("forks_have_their_own_tokens_and_hold_their_snapshot", || {
            Box::pin(forks_have_their_own_tokens_and_hold_their_snapshot())
        }),
        (
            "snapshot_refusals_are_typed",
            || Box::pin(snapshot_refusals_are_typed()),
        ),
        ("an_unloadable_memory_file_resumes_from_the_disk", || {
            Box::pin(an_unloadable_memory_file_resumes_from_the_disk())
        }),
        ("the_keeper_resists_a_command", || {
            Box::pin(the_keeper_resists_a_command())
        }),
    ];
    // One VM test at a time (two emulated guests on two cores time each
    // other out); forks make three at once already.
    let code = microvm::run_trials(tests, Some(1));
    microvm::cleanup("snapshot");
    code
}
