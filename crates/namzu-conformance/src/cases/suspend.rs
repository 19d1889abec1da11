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
/// pipes — and resumes under the same id with a new agent (another boot
/// id), its old processes gone; the handle it was suspended through is
/// spent. A second round trip keeps what was written between them.
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
        ensure!(back.agent().boot_id() != boot, "the same agent answers after resume");
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
        ensure!(
            running(&back, "sleep 3000").await? == 0,
            "a process outlived the suspend"
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
