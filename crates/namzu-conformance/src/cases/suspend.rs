//! Suspend to disk and resume, and the disk limit: what a tier keeps of a
//! sandbox when none of its processes run, and how much it may write.

use super::common::*;
use crate::util::pattern;

/// Lines of `/proc/*/cmdline` inside the sandbox that start with `prefix`.
async fn running(sb: &Sandbox, prefix: &str) -> Result<usize, String> {
    let out = sh(
        sb,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
    )
    .await?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .count())
}

/// A suspended sandbox keeps what it wrote — `/workspace` and the writable
/// paths `/tmp`, `/home` and `/root`, with modes, symlinks and named
/// pipes — and resumes under the same id; the handle it was suspended
/// through is spent. Where the tier keeps only the disk, a new agent
/// answers (another boot id) and the old processes are gone; where it
/// keeps memory too, the same agent answers and they run on. A second
/// round trip keeps what was written between them.
pub(super) async fn suspend_keeps_the_disk_and_resume_starts_it_again(f: Factory) -> Outcome {
    let resume = crate::hooks().resume.ok_or("the tier gave no resumer")?;
    let sb = f(SandboxSpec::default()).await.ctx("create")?;
    let id = sb.id().to_owned();
    let mut live = sb.clone();
    let result = async {
        let big = pattern(22, 3 << 20);
        sb.files()
            .write("/workspace/big.bin", Bytes::from(big.clone()))
            .await
            .ctx("write the workspace file")?;
        let setup = "set -e; echo tmp > /tmp/t; chmod 640 /tmp/t; mkdir -p /root/.cache/d /home/u; \
                     echo root > /root/.cache/d/r; echo home > /home/u/h; ln -s /workspace/big.bin /tmp/link; \
                     mkfifo /tmp/fifo; (sleep 3000 >/dev/null 2>&1 </dev/null &)";
        let out = sh(&sb, setup).await?;
        ensure!(out.status.success(), "setup: {}", String::from_utf8_lossy(&out.stderr));
        ensure!(running(&sb, "sleep 3000").await? == 1, "the sleeper is not running");
        let boot = sb.agent().boot_id();

        sb.clone().suspend().await.ctx("suspend")?;
        ensure!(
            sb.commands().run("true").await.is_err(),
            "the suspended handle still runs commands"
        );
        let back = resume(id.clone()).await.ctx("resume")?;
        live = back.clone();
        ensure!(back.id() == id, "resumed as {} instead of {id}", back.id());
        let memory = crate::hooks().suspend_keeps_memory;
        ensure!(
            (back.agent().boot_id() == boot) == memory,
            "after resume the boot id went from {boot} to {} (memory kept: {memory})",
            back.agent().boot_id()
        );
        let read = back
            .files()
            .read("/workspace/big.bin")
            .await
            .ctx("read the workspace file")?;
        ensure!(read[..] == big[..], "the workspace file changed: {} bytes", read.len());
        let check =
            "set -e; cat /tmp/t /root/.cache/d/r /home/u/h; stat -c '%a %F' /tmp/t /tmp/fifo; readlink /tmp/link";
        let out = sh(&back, check).await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success() && text == "tmp\nroot\nhome\n640 regular file\n644 fifo\n/workspace/big.bin\n",
            "after resume: {text:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sleepers = running(&back, "sleep 3000").await?;
        ensure!(
            sleepers == usize::from(memory),
            "{sleepers} sleepers after the resume (memory kept: {memory})"
        );

        // Again, with what was written in between.
        let out = sh(&back, "echo second > /tmp/second && rm /home/u/h").await?;
        ensure!(out.status.success(), "write between suspends");
        back.clone().suspend().await.ctx("second suspend")?;
        let again = resume(id.clone()).await.ctx("second resume")?;
        live = again.clone();
        let out = sh(&again, "cat /tmp/second /tmp/t; test ! -e /home/u/h && echo gone").await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(text == "second\ntmp\ngone\n", "after the second resume: {text:?}");
        Ok(())
    }
    .await;
    let destroyed = live.destroy().await.ctx("destroy");
    result.and(destroyed)
}

/// With a disk limit, `/workspace` fills with ENOSPC inside at about the
/// limit (the filesystem's own metadata comes off it), a write that does
/// not fit is refused and leaves the old file, and freeing space makes
/// room again.
pub(super) async fn disk_limit_fills_with_enospc(f: Factory) -> Outcome {
    const LIMIT: u64 = 32 << 20;
    let mut spec = SandboxSpec::default();
    spec.resources.disk_bytes = Some(LIMIT);
    with_sandbox(&f, spec, |sb| async move {
        sb.files()
            .write("/workspace/keep.txt", Bytes::from_static(OLD))
            .await
            .ctx("seed")?;
        let out = sh(
            &sb,
            "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo rc=$?",
        )
        .await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            text.contains("No space left on device") && !text.contains("rc=0"),
            "filling past the limit: {text}"
        );
        let out = sh(&sb, "stat -c %s /workspace/fill").await?;
        let filled: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(u64::MAX);
        ensure!(
            (LIMIT / 2..=LIMIT).contains(&filled),
            "{filled} bytes written into a {LIMIT}-byte disk"
        );
        let over = sb
            .files()
            .write("/workspace/keep.txt", Bytes::from(vec![7u8; 4 << 20]))
            .await;
        ensure!(over.is_err(), "a 4 MiB write into a full disk succeeded");
        let kept = sb.files().read("/workspace/keep.txt").await.ctx("read back")?;
        ensure!(&kept[..] == OLD, "the failed write changed the old file");
        let out = sh(&sb, "rm /workspace/fill && echo ok > /workspace/after").await?;
        ensure!(out.status.success(), "no room after freeing the disk");
        Ok(())
    })
    .await
}

/// Where a suspend keeps memory, the sandbox goes on where it stopped: a
/// detached execution begun before the suspend ends after the resume
/// (its clock says so, set to the host's), its whole output read by
/// offset across the suspend with no byte lost or repeated; a process
/// keeps its pid; the same agent answers.
pub(super) async fn suspend_with_memory_goes_on_where_it_stopped(f: Factory) -> Outcome {
    const LINES: usize = 100;
    let resume = crate::hooks().resume.ok_or("the tier gave no resumer")?;
    let sb = f(SandboxSpec::default()).await.ctx("create")?;
    let id = sb.id().to_owned();
    let mut live = sb.clone();
    let result = async {
        let script = format!(
            "i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line-$i; sleep 0.05; done; date +%s > /tmp/ended; exit 3"
        );
        let mut s = sb
            .commands()
            .stream(ExecRequest::shell(&script).execution_id("across"))
            .await
            .ctx("start")?;
        let mut out = Vec::new();
        while !String::from_utf8_lossy(&out).contains("line-3\n") {
            match s.next().await {
                Some(Ok(ExecEvent::Stdout { data, .. })) => out.extend_from_slice(&data),
                other => return Err(format!("before the suspend: {other:?}")),
            }
        }
        let off = s.next_offset();
        drop(s);
        let pid = sh(&sb, "sleep 3000 >/dev/null 2>&1 </dev/null & echo $!").await?;
        let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
        let boot = sb.agent().boot_id();
        sb.clone().suspend().await.ctx("suspend")?;
        let resumed_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs();
        let back = resume(id.clone()).await.ctx("resume")?;
        live = back.clone();
        ensure!(back.agent().boot_id() == boot, "another agent answers: the memory was not kept");
        let mut rest = back
            .commands()
            .attach_stream(
                "across",
                namzu::AttachOptions {
                    from_offset: off,
                    ..Default::default()
                },
            )
            .await
            .ctx("attach from the offset")?;
        let (o2, e2, exit) = collect_events(&mut rest).await?;
        out.extend_from_slice(&o2);
        let want: String = (1..=LINES).map(|i| format!("line-{i}\n")).collect();
        ensure!(
            out == want.as_bytes() && e2.is_empty(),
            "output across the suspend: {:?} / {:?}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&e2)
        );
        ensure!(exit.status.code == Some(3), "{exit:?}");
        let ended = sh(&back, "cat /tmp/ended").await?;
        let ended: u64 = String::from_utf8_lossy(&ended.stdout).trim().parse().map_err(|e| format!("{e}"))?;
        ensure!(
            ended + 1 >= resumed_at,
            "the execution ended at {ended}, before the resume began at {resumed_at}"
        );
        let cmd = sh(&back, &format!("tr '\\0' ' ' < /proc/{pid}/cmdline")).await?;
        ensure!(
            String::from_utf8_lossy(&cmd.stdout) == "sleep 3000 ",
            "pid {pid} after the resume: {:?}",
            String::from_utf8_lossy(&cmd.stdout)
        );
        Ok(())
    }
    .await;
    let destroyed = live.destroy().await.ctx("destroy");
    result.and(destroyed)
}

/// The whole output and exit code of execution `job` in `sb`, from 0.
async fn whole_output(sb: &Sandbox, job: &str) -> Result<(Vec<u8>, Option<i32>), String> {
    let mut s = sb
        .commands()
        .attach_stream(job, namzu::AttachOptions::default())
        .await
        .ctx(job)?;
    let (out, _, exit) = collect_events(&mut s).await?;
    Ok((out, exit.status.code))
}

/// A snapshot of a running sandbox lets it run on, and each fork started
/// from it goes on from the snapshot's instant: a detached execution
/// begun before the snapshot finishes in the source and in every fork,
/// each with its whole output; each writes to a disk of its own, starting
/// from the snapshot's; each has an id of its own.
pub(super) async fn forks_of_a_snapshot_go_on_independently(f: Factory) -> Outcome {
    const LINES: usize = 60;
    let p = crate::hooks()
        .snapshots
        .ok_or("the tier gave no provider for snapshots")?;
    with_sandbox(&f, SandboxSpec::default(), |src| async move {
        sh(&src, "echo before > /workspace/shared").await?;
        let script = format!("i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line-$i; sleep 0.05; done; exit 5");
        let mut s = src
            .commands()
            .stream(ExecRequest::shell(&script).execution_id("job"))
            .await
            .ctx("start")?;
        // Begun: its first line is out.
        match s.next().await {
            Some(Ok(ExecEvent::Stdout { .. })) => {}
            other => return Err(format!("the job's first event: {other:?}")),
        }
        drop(s);
        let snap = p.snapshot(src.id()).await.ctx("snapshot")?;
        ensure!(snap.source == src.id(), "{snap:?}");
        let mut forks = Vec::new();
        let result = async {
            for _ in 0..2 {
                forks.push(p.fork(&snap.id).await.ctx("fork")?);
            }
            let ids: std::collections::BTreeSet<&str> =
                std::iter::once(src.id()).chain(forks.iter().map(|f| f.id())).collect();
            ensure!(ids.len() == 3, "ids shared: {ids:?}");
            let want: String = (1..=LINES).map(|i| format!("line-{i}\n")).collect();
            for sb in std::iter::once(&src).chain(forks.iter()) {
                let (out, code) = whole_output(sb, "job").await?;
                ensure!(
                    out == want.as_bytes() && code == Some(5),
                    "in {}: {code:?} {:?}",
                    sb.id(),
                    String::from_utf8_lossy(&out)
                );
            }
            let (a, b) = (&forks[0], &forks[1]);
            sh(a, "echo a > /workspace/shared; echo a > /workspace/only-a").await?;
            sh(&src, "echo src > /workspace/shared").await?;
            for (sb, want) in [
                (b, "before\nshared\n"),
                (a, "a\nonly-a\nshared\n"),
                (&src, "src\nshared\n"),
            ] {
                let out = sh(sb, "cat /workspace/shared; ls /workspace").await?;
                let got = String::from_utf8_lossy(&out.stdout).into_owned();
                ensure!(got == want, "in {}: {got:?}, not {want:?}", sb.id());
            }
            Ok(())
        }
        .await;
        for fork in forks {
            let _ = fork.destroy().await;
        }
        let deleted = p.delete_snapshot(&snap.id).await.ctx("delete the snapshot");
        result.and(deleted)
    })
    .await
}
