//! Suspend and resume on the `local` tier, beyond the conformance case:
//! the state a suspended sandbox leaves on disk, read by another provider
//! (another process, or the same host after a restart: no process, mount
//! or cgroup of the sandbox is left while it is suspended), a failed
//! resume that leaves it suspended, and what the archive does not take.
//! Needs `namzu-agent` built beside the test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use namzu::backend::local::LocalProvider;
use namzu::{Bind, Error, Provider, Sandbox, SandboxSpec};

fn provider(state: &Path) -> LocalProvider {
    LocalProvider::new(state).expect("namzu-agent beside the test binary")
}

async fn sh(sb: &Sandbox, script: &str) -> String {
    let out = sb.commands().run(script).await.unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(4) == Some(&*p))
}

#[tokio::test]
async fn a_suspended_sandbox_is_kept_on_disk_alone_and_another_provider_resumes_it() {
    let state = tempfile::tempdir().unwrap();
    let disk = root().then_some(64 << 20);
    let id = {
        let a = provider(state.path());
        let mut spec = SandboxSpec::default();
        spec.resources.disk_bytes = disk;
        let sb = a.create(spec).await.unwrap();
        sh(&sb, "echo kept > /workspace/w; echo tmp > /tmp/t").await;
        let id = sb.id().to_owned();
        // Memory is not kept here: no snapshot, no fork, refused by name.
        for (op, got) in [
            ("snapshot", a.snapshot(&id).await.err()),
            ("fork", a.fork("snap-000000000001").await.err()),
        ] {
            assert!(
                matches!(&got, Some(Error::OptionRefused { option, .. }) if option == op),
                "{op}: {got:?}"
            );
        }
        let dir = state.path().join("local").join(&id);
        assert_eq!(mounted(&dir.join("workspace")), disk.is_some());
        sb.suspend().await.unwrap();
        // Nothing of it runs or stays mounted: what a host restart leaves.
        let listed = a.list().await.unwrap();
        let me = listed.iter().find(|s| s.id == id).unwrap();
        assert!(me.suspended && !me.alive, "{me:?}");
        assert!(!mounted(&dir.join("workspace")), "the disk stayed mounted");
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["pid"], 0);
        assert_eq!(meta["procs"], serde_json::json!([]));
        assert!(meta["record"]["cgroups"].is_null());
        // Suspending again is done; gc leaves it; connect refuses it, typed.
        a.suspend(&id).await.unwrap();
        assert!(a.gc().await.unwrap().is_empty());
        assert!(matches!(a.connect(&id).await, Err(Error::SandboxSuspended { .. })));
        id
    };
    // Another provider on the same state directory.
    let b = provider(state.path());
    let sb = b.resume(&id).await.unwrap();
    assert_eq!(sh(&sb, "cat /workspace/w /tmp/t").await, "kept\ntmp\n");
    if disk.is_some() {
        let size: u64 = sh(&sb, "df -B1 --output=size /workspace | tail -1")
            .await
            .trim()
            .parse()
            .unwrap();
        assert!(size <= 64 << 20 && size > 32 << 20, "a {size}-byte /workspace");
    }
    assert!(!state.path().join("local").join(&id).join("saved.tar").exists());
    assert!(matches!(b.resume(&id).await, Err(Error::NotSuspended { .. })));
    // A suspended sandbox is destroyed whole: its directory and its disk.
    sb.suspend().await.unwrap();
    b.destroy(&id).await.unwrap();
    assert!(!state.path().join("local").join(&id).exists());
    assert!(b.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_resume_leaves_the_sandbox_suspended_with_nothing_lost() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path());
    let sb = p.create(SandboxSpec::default()).await.unwrap();
    sh(&sb, "echo kept > /workspace/w; echo tmp > /tmp/t").await;
    let id = sb.id().to_owned();
    sb.suspend().await.unwrap();
    let dir = state.path().join("local").join(&id);
    let archive = dir.join("saved.tar");
    let good = std::fs::read(&archive).unwrap();
    // A damaged archive: the new init cannot put it back, and says so.
    let mut bad = good.clone();
    bad.truncate(700);
    bad[600..700].fill(0xff);
    std::fs::write(&archive, &bad).unwrap();
    let failed = p.resume(&id).await;
    assert!(failed.is_err(), "a damaged archive was resumed");
    let listed = p.list().await.unwrap();
    let me = listed.iter().find(|s| s.id == id).unwrap();
    assert!(me.suspended && !me.alive, "{me:?}");
    assert_eq!(
        std::fs::read(&archive).unwrap(),
        bad,
        "the failed resume touched the archive"
    );
    assert_eq!(std::fs::read(dir.join("workspace/w")).unwrap(), b"kept\n");
    // With the archive mended, the same sandbox resumes whole.
    std::fs::write(&archive, &good).unwrap();
    let sb = p.resume(&id).await.unwrap();
    assert_eq!(sh(&sb, "cat /workspace/w /tmp/t").await, "kept\ntmp\n");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn the_archive_takes_neither_a_bind_nor_what_a_symlink_points_at() {
    let state = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("host-file"), b"the host's\n").unwrap();
    let p = provider(state.path());
    let spec = SandboxSpec {
        binds: vec![Bind {
            source: host.path().to_path_buf(),
            target: "/tmp/bound".into(),
            writable: false,
        }],
        ..Default::default()
    };
    let sb = p.create(spec).await.unwrap();
    // A symlink to a host path the sandbox cannot see: archived as a link.
    let secret = host.path().join("host-file");
    sh(
        &sb,
        &format!("ln -s {} /tmp/points-out; echo mine > /tmp/mine", secret.display()),
    )
    .await;
    let id = sb.id().to_owned();
    sb.suspend().await.unwrap();
    let archive = state.path().join("local").join(&id).join("saved.tar");
    let mut names = Vec::new();
    let mut ar = tar::Archive::new(std::fs::File::open(&archive).unwrap());
    for e in ar.entries().unwrap() {
        let e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        if name == "tmp/points-out" {
            assert_eq!(e.header().entry_type(), tar::EntryType::Symlink);
            assert_eq!(e.size(), 0);
        }
        names.push(name);
    }
    assert!(names.contains(&"tmp/mine".to_owned()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("tmp/bound/")),
        "the bind's contents were archived: {names:?}"
    );
    let sb = p.resume(&id).await.unwrap();
    assert_eq!(
        sh(&sb, "cat /tmp/bound/host-file /tmp/mine").await,
        "the host's\nmine\n"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn a_suspend_that_cannot_archive_leaves_the_sandbox_running_where_it_was() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path());
    let sb = p.create(SandboxSpec::default()).await.unwrap();
    // A sparse file claims 10 GiB the tmpfs never held: archiving it
    // would fill the host's disk, so the suspend is refused, typed.
    sh(&sb, "truncate -s 10G /tmp/sparse && echo kept > /tmp/k").await;
    let id = sb.id().to_owned();
    let failed = p.suspend(&id).await;
    assert!(
        matches!(&failed, Err(Error::LimitExceeded { limit, .. }) if limit == "suspend_archive_bytes"),
        "{failed:?}"
    );
    let dir = state.path().join("local").join(&id);
    assert!(!dir.join("saved.tar").exists() && !dir.join("saved.tar.tmp").exists());
    assert!(!sb.is_paused().await.unwrap(), "left paused");
    assert_eq!(sh(&sb, "cat /tmp/k").await, "kept\n");
    let me = p.list().await.unwrap().into_iter().find(|s| s.id == id).unwrap();
    assert!(me.alive && !me.suspended, "{me:?}");
    sb.destroy().await.unwrap();
}

/// The fields of `/proc/<pid>/stat` after the command name (state first,
/// start time at 19); `None` once the process is gone.
fn stat_fields(pid: u64) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_owned).collect())
}

fn start(pid: u64) -> u64 {
    stat_fields(pid).unwrap()[19].parse().unwrap()
}

/// `pid` and every process descending from it, as `/proc` has them now:
/// (pid, start time in clock ticks after boot), parents before children.
fn proc_tree(pid: u64) -> Vec<(u64, u64)> {
    let mut out = vec![(pid, start(pid))];
    let mut i = 0;
    while i < out.len() {
        for task in std::fs::read_dir(format!("/proc/{}/task", out[i].0)).unwrap().flatten() {
            let kids = std::fs::read_to_string(task.path().join("children")).unwrap();
            for kid in kids.split_whitespace() {
                let kid: u64 = kid.parse().unwrap();
                out.push((kid, start(kid)));
            }
        }
        i += 1;
    }
    out
}

/// What meta.json records of the sandbox's processes (pid, start).
fn recorded(dir: &Path) -> (u64, Vec<(u64, u64)>) {
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
    let procs = meta["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_u64().unwrap(), p["start"].as_u64().unwrap()))
        .collect();
    (meta["pid"].as_u64().unwrap(), procs)
}

#[tokio::test]
async fn the_processes_recorded_are_the_launchers_tree_and_a_resume_records_its_own() {
    let state = tempfile::tempdir().unwrap();
    let p = provider(state.path());
    let sb = p.create(SandboxSpec::default()).await.unwrap();
    let id = sb.id().to_owned();
    let dir = state.path().join("local").join(&id);
    // The launcher, its namespace child and the sandbox's init: what the
    // launcher wrote while the init built the sandbox is what /proc has.
    let (anchor, first) = recorded(&dir);
    assert_eq!(first.len(), 3, "{first:?}");
    assert_eq!(first[0].0, anchor);
    assert_eq!(first, proc_tree(anchor));
    sb.suspend().await.unwrap();
    // A forged list left in the directory (as an earlier launch's would
    // be) must not stand in for the next launch's.
    let me = u64::from(std::process::id());
    let me = (me, start(me));
    std::fs::write(dir.join("procs"), format!("{} {}\n", me.0, me.1)).unwrap();
    let sb = p.resume(&id).await.unwrap();
    let (anchor, again) = recorded(&dir);
    assert_eq!(again, proc_tree(anchor));
    assert_eq!(again.len(), 3, "{again:?}");
    assert!(again.iter().all(|p| !first.contains(p) && *p != me), "{again:?}");
    // And they are what destroy ends: none of them runs after it (the
    // launcher, this process's child, may be a zombie until reaped).
    sb.destroy().await.unwrap();
    for (pid, start) in again {
        let runs = stat_fields(pid).is_some_and(|f| f[0] != "Z" && f[19] == start.to_string());
        assert!(!runs, "process {pid} outlived destroy");
    }
}
