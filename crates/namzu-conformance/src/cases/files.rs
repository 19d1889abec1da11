//! Files: atomic and streamed writes, reads and ranges, modes, listing, walking, and path confinement.

use super::common::*;

/// 64 MiB written from memory reads back byte-exact, whole-stream and by
/// ranges; a whole ReadFile above its limit is refused by name.
pub(super) async fn write_64mib_round_trips(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        const N: usize = 64 << 20;
        let data = Bytes::from(pattern(7, N));
        let n = sb.files().write("big.bin", data.clone()).await.ctx("write")?;
        ensure!(n == N as u64, "wrote {n}");
        let mut s = sb.files().stream("big.bin").await.ctx("stream")?;
        let mut got = 0usize;
        while let Some(chunk) = s.next().await {
            let chunk = chunk.ctx("chunk")?;
            ensure!(
                data[got..got + chunk.len()] == chunk[..],
                "bytes differ near offset {got}"
            );
            got += chunk.len();
        }
        ensure!(got == N, "streamed {got} of {N}");
        let r = sb
            .files()
            .read_range(
                "big.bin",
                ByteRange {
                    offset: 10 << 20,
                    length: Some(1 << 20),
                },
            )
            .await
            .ctx("range")?;
        ensure!(
            r.data[..] == data[10 << 20..11 << 20] && r.file_size == N as u64,
            "range differs"
        );
        match sb.files().read("big.bin").await {
            Err(Error::LimitExceeded { limit, .. }) => ensure!(limit == "max_read_range_bytes", "limit {limit}"),
            other => {
                return Err(format!(
                    "whole read of 64 MiB should exceed the range limit, got {other:?}"
                ))
            }
        }
        Ok(())
    })
    .await
}

/// A write held midway (its source paused after 1.5 MiB of 4): every read
/// meanwhile sees the old file whole; once it finishes, the new one whole.
/// Then the same under a stream of rewrites.
pub(super) async fn readers_never_see_a_partial_write(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        const N: usize = 1 << 20;
        let a = Bytes::from(vec![b'a'; N]);
        let b = Bytes::from(vec![b'b'; 2 * N]);
        sb.files().write("f", a.clone()).await.ctx("seed")?;
        let whole = |data: &[u8]| data == &a[..];
        let (paused_tx, paused) = tokio::sync::oneshot::channel();
        let (resume, resume_rx) = tokio::sync::oneshot::channel();
        let reader = PatternReader::new(7, 4 << 20).pausing_at(3 << 19, paused_tx, resume_rx);
        let held = {
            let sb = sb.clone();
            tokio::spawn(async move {
                sb.files()
                    .write_from("f", Box::new(reader), WriteOptions::default())
                    .await
            })
        };
        tokio::time::timeout(Duration::from_secs(30), paused)
            .await
            .ctx("the writer never reached its pause")?
            .ctx("pause")?;
        // 1.5 MiB are in flight or in the temporary by now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 0..5 {
            let r = sb.files().read("f").await.ctx("read during the write")?;
            ensure!(
                whole(&r),
                "read {i} during the held write saw {} bytes, not the old file",
                r.len()
            );
        }
        let _ = resume.send(());
        held.await.ctx("writer task")?.ctx("held write")?;
        let r = sb.files().read("f").await.ctx("read after")?;
        ensure!(r.len() == 4 << 20, "after the write: {} bytes", r.len());
        crate::util::check_pattern(7, 0, &r)?;

        let writer = {
            let sb = sb.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let d = if i % 2 == 0 { b.clone() } else { a.clone() };
                    sb.files().write("f", d).await?;
                }
                Ok::<_, Error>(())
            })
        };
        let mut reads = 0;
        while !writer.is_finished() || reads < 5 {
            let r = sb
                .files()
                .read_range(
                    "f",
                    ByteRange {
                        offset: 0,
                        length: Some(4 * N as u64),
                    },
                )
                .await
                .ctx("read")?;
            let whole_a = r.data.len() == N && r.data.iter().all(|&c| c == b'a');
            let whole_b = r.data.len() == 2 * N && r.data.iter().all(|&c| c == b'b');
            let whole_p = r.data.len() == 4 << 20;
            ensure!(
                whole_a || whole_b || whole_p,
                "read {reads} saw a partial file of {} bytes",
                r.data.len()
            );
            reads += 1;
        }
        writer.await.ctx("writer task")?.ctx("writer")?;
        Ok(())
    })
    .await
}

/// A write whose source fails part-way leaves the previous contents and no
/// temporary file behind.
pub(super) async fn failed_write_leaves_the_old_file(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        seed_old(&sb).await?;
        let reader = PatternReader::new(1, 8 << 20).failing_at(3 << 20);
        let r = sb
            .files()
            .write_from("keep.txt", Box::new(reader), WriteOptions::default())
            .await;
        ensure!(
            matches!(r, Err(Error::LocalIo { .. })),
            "expected the local read error, got {r:?}"
        );
        ensure!(old_file_alone(&sb).await?, "temporary left behind");
        Ok(())
    })
    .await
}

/// A write over `max_write_bytes` is refused by name and changes nothing.
pub(super) async fn oversized_write_is_refused_by_limit(f: Factory) -> Outcome {
    let spec = SandboxSpec {
        limits: vec![("max_write_bytes".into(), 1 << 20)],
        ..Default::default()
    };
    with_sandbox(&f, spec, |sb| async move {
        seed_old(&sb).await?;
        let r = sb.files().write("keep.txt", Bytes::from(vec![0u8; 2 << 20])).await;
        match r {
            Err(Error::LimitExceeded { limit, value, .. }) => {
                ensure!(limit == "max_write_bytes" && value == 1 << 20, "{limit}={value}")
            }
            other => return Err(format!("expected LimitExceeded, got {other:?}")),
        }
        ensure!(old_file_alone(&sb).await?, "temporary left behind");
        Ok(())
    })
    .await
}

/// A write the host abandons mid-stream (its future dropped) leaves the
/// previous contents, and its temporary is removed.
pub(super) async fn abandoned_write_leaves_the_old_file(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        seed_old(&sb).await?;
        // 2 MiB arrive, then the source stalls forever.
        let stalled = tokio::io::AsyncReadExt::chain(PatternReader::new(5, 2 << 20), Stall);
        let write = sb
            .files()
            .write_from("keep.txt", Box::new(stalled), WriteOptions::default());
        ensure!(
            tokio::time::timeout(Duration::from_millis(500), write).await.is_err(),
            "stalled write finished"
        );
        // The agent notices the reset stream asynchronously.
        for _ in 0..200 {
            if old_file_alone(&sb).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err("temporary left behind".into())
    })
    .await
}

/// Streamed and whole reads refuse a fifo (and never block on it) and a
/// directory, each with its own typed error.
pub(super) async fn streamed_read_refuses_non_regular_files(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(sh(&sb, "mkfifo pipe && mkdir dir").await?.status.success(), "mkfifo");
        let r = tokio::time::timeout(Duration::from_secs(10), sb.files().stream("pipe"))
            .await
            .ctx("fifo blocked")?;
        ensure!(
            matches!(r, Err(Error::NotRegularFile { .. })),
            "fifo stream: {:?}",
            r.err()
        );
        let r = tokio::time::timeout(Duration::from_secs(10), sb.files().read("pipe"))
            .await
            .ctx("fifo blocked")?;
        ensure!(
            matches!(r, Err(Error::NotRegularFile { .. })),
            "fifo read: {:?}",
            r.err()
        );
        let r = sb.files().stream("dir").await;
        ensure!(
            matches!(r, Err(Error::IsADirectory { .. })),
            "dir stream: {:?}",
            r.err()
        );
        Ok(())
    })
    .await
}

/// A new file takes the requested mode; an overwrite keeps the target's.
pub(super) async fn mode_is_preserved(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let opts = WriteOptions {
            mode: Some(0o600),
            ..Default::default()
        };
        sb.files()
            .write_with("new.sh", Bytes::from_static(b"#!/bin/sh\necho hi\n"), opts)
            .await
            .ctx("write")?;
        ensure!(
            sb.files().stat("new.sh").await.ctx("stat")?.mode == 0o600,
            "new file mode"
        );
        ensure!(sh(&sb, "chmod 0751 new.sh").await?.status.success(), "chmod");
        sb.files()
            .write("new.sh", Bytes::from_static(b"#!/bin/sh\necho again\n"))
            .await
            .ctx("overwrite")?;
        let st = sb.files().stat("new.sh").await.ctx("stat")?;
        ensure!(st.mode == 0o751, "overwrite changed mode to {:o}", st.mode);
        let out = sh(&sb, "./new.sh").await?;
        ensure!(
            &out.stdout[..] == b"again\n",
            "new contents not executed: {:?}",
            out.stdout
        );
        Ok(())
    })
    .await
}

/// Ranged reads: the answer carries the file size; a range past EOF returns
/// what exists; a stream honours offset and length.
pub(super) async fn ranged_reads(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        sb.files()
            .write("r.txt", Bytes::from_static(b"0123456789"))
            .await
            .ctx("write")?;
        let rng = |o, l| ByteRange { offset: o, length: l };
        let r = sb.files().read_range("r.txt", rng(2, Some(3))).await.ctx("2+3")?;
        ensure!(
            &r.data[..] == b"234" && r.file_size == 10 && !r.eof,
            "2+3 gave {:?} size {} eof {}",
            r.data,
            r.file_size,
            r.eof
        );
        let r = sb.files().read_range("r.txt", rng(8, Some(10))).await.ctx("8+10")?;
        ensure!(&r.data[..] == b"89" && r.eof, "8+10 gave {:?} eof {}", r.data, r.eof);
        let r = sb.files().read_range("r.txt", rng(20, Some(5))).await.ctx("20+5")?;
        ensure!(
            r.data.is_empty() && r.eof && r.file_size == 10,
            "past EOF gave {:?}",
            r.data
        );
        let r = sb.files().read_range("r.txt", rng(4, None)).await.ctx("4+")?;
        ensure!(&r.data[..] == b"456789" && r.eof, "4.. gave {:?}", r.data);
        let mut s = sb.files().stream_range("r.txt", rng(3, Some(4))).await.ctx("stream")?;
        let mut got = Vec::new();
        while let Some(c) = s.next().await {
            got.extend_from_slice(&c.ctx("chunk")?);
        }
        ensure!(got == b"3456", "stream range gave {got:?}");
        let r = sb.files().read("empty").await;
        ensure!(matches!(r, Err(Error::NotFound { .. })), "missing file gave {r:?}");
        Ok(())
    })
    .await
}

/// A 1 GiB file streams out byte-exact while the agent's peak RSS stays
/// far below the file size.
pub(super) async fn streamed_1gib_read_keeps_agent_memory_bounded(f: Factory) -> Outcome {
    const N: u64 = 1 << 30;
    const BOUND: u64 = 96 << 20;
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        let before = sb.agent().health().await.ctx("health")?;
        sb.files()
            .write_from("huge.bin", Box::new(PatternReader::new(3, N)), WriteOptions::default())
            .await
            .ctx("write 1 GiB")?;
        let after_write = sb.agent().health().await.ctx("health")?;
        let mut s = sb.files().stream("huge.bin").await.ctx("stream")?;
        let mut off = 0u64;
        while let Some(c) = s.next().await {
            let c = c.ctx("chunk")?;
            // Checking every byte of 1 GiB costs more than the transfer; a
            // sampled check still catches misordered or shifted chunks.
            check_pattern(3, off, &c[..c.len().min(64)])?;
            off += c.len() as u64;
        }
        ensure!(off == N, "streamed {off} of {N}");
        let after_read = sb.agent().health().await.ctx("health")?;
        let growth = after_read.peak_rss_bytes.saturating_sub(before.rss_bytes);
        eprintln!(
            "agent RSS: idle {} KiB, peak after 1 GiB write {} KiB, peak after 1 GiB read {} KiB",
            before.rss_bytes >> 10,
            after_write.peak_rss_bytes >> 10,
            after_read.peak_rss_bytes >> 10
        );
        ensure!(
            growth < BOUND,
            "agent peak RSS grew by {} MiB moving 1 GiB",
            growth >> 20
        );
        Ok(())
    })
    .await
}

/// The basic file ops, with their typed failures.
pub(super) async fn list_stat_mkdir_remove_rename(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        sb.files().mkdir_all("d/e").await.ctx("mkdir -p")?;
        ensure!(
            matches!(sb.files().mkdir("d").await, Err(Error::AlreadyExists { .. })),
            "mkdir existing"
        );
        sb.files()
            .write("d/x.txt", Bytes::from_static(b"xx"))
            .await
            .ctx("write")?;
        let st = sb.files().stat("d/x.txt").await.ctx("stat")?;
        ensure!(st.kind == FileKind::File && st.size == 2, "stat {st:?}");
        let names: Vec<_> = sb
            .files()
            .list("d")
            .await
            .ctx("list")?
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
        ensure!(
            names == [("e".into(), FileKind::Dir), ("x.txt".into(), FileKind::File)],
            "list {names:?}"
        );
        ensure!(
            matches!(sb.files().list("d/x.txt").await, Err(Error::NotADirectory { .. })),
            "list of a file"
        );
        sb.files().rename("d/x.txt", "d/e/y.txt").await.ctx("rename")?;
        ensure!(
            matches!(sb.files().stat("d/x.txt").await, Err(Error::NotFound { .. })),
            "old name remains"
        );
        ensure!(
            matches!(sb.files().remove("d").await, Err(Error::DirectoryNotEmpty { .. })),
            "non-recursive remove of a tree"
        );
        sb.files().remove_all("d").await.ctx("rm -r")?;
        ensure!(
            matches!(sb.files().stat("d").await, Err(Error::NotFound { .. })),
            "tree remains"
        );
        ensure!(
            matches!(sb.files().remove_all("d").await, Err(Error::NotFound { .. })),
            "remove of nothing"
        );
        Ok(())
    })
    .await
}

/// Walks are depth-first, skip hidden entries unless asked, report symlinks
/// without following them, honour max_depth, and tell a missing root from an
/// exhausted budget.
pub(super) async fn walk_reports_symlinks_and_honours_limits(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(
            sh(
                &sb,
                "mkdir -p t/a/b t/.hid && touch t/a/b/deep t/a/f t/.hid/h t/z && ln -s a t/link && ln -s / t/root"
            )
            .await?
            .status
            .success(),
            "setup"
        );
        let collect = |opts: WalkOptions| {
            let sb = sb.clone();
            async move {
                let mut s = sb.files().walk("t", opts).await?;
                let mut v = Vec::new();
                while let Some(e) = s.next().await {
                    match e {
                        Ok(e) => v.push((e.path.to_string_lossy().into_owned(), e.kind, e.depth)),
                        Err(err) => return Ok::<_, Error>((v, Some(err))),
                    }
                }
                Ok((v, None))
            }
        };
        let (all, err) = collect(WalkOptions::default()).await.ctx("walk")?;
        ensure!(err.is_none(), "walk failed: {err:?}");
        let paths: Vec<&str> = all.iter().map(|e| e.0.as_str()).collect();
        ensure!(
            paths == ["t/a", "t/a/b", "t/a/b/deep", "t/a/f", "t/link", "t/root", "t/z"],
            "walk order {paths:?}"
        );
        ensure!(
            all.iter().any(|e| e.0 == "t/link" && e.1 == FileKind::Symlink),
            "symlink not reported as one"
        );
        let (hidden, _) = collect(WalkOptions {
            include_hidden: true,
            ..Default::default()
        })
        .await
        .ctx("walk hidden")?;
        ensure!(
            hidden.iter().any(|e| e.0 == "t/.hid/h"),
            "include_hidden missed t/.hid/h"
        );
        let (shallow, _) = collect(WalkOptions {
            max_depth: 1,
            ..Default::default()
        })
        .await
        .ctx("walk depth 1")?;
        ensure!(
            shallow.iter().all(|e| e.2 == 1) && shallow.len() == 4,
            "depth 1 gave {shallow:?}"
        );
        let (some, err) = collect(WalkOptions {
            max_entries: 3,
            ..Default::default()
        })
        .await
        .ctx("walk budget")?;
        ensure!(some.len() == 3, "budget 3 gave {} entries", some.len());
        ensure!(
            matches!(err, Some(Error::WalkLimit { limit: 3, .. })),
            "budget overrun gave {err:?}"
        );
        match sb.files().walk("nope", WalkOptions::default()).await {
            Err(Error::NotFound { .. }) => {}
            Ok(_) => return Err("walk of a missing root succeeded".into()),
            Err(e) => return Err(format!("walk of a missing root: {e:?}")),
        }
        Ok(())
    })
    .await
}

/// `..`, absolute paths outside the roots and symlinks that point out are
/// refused as PathEscape, for reads, writes, renames and removes.
pub(super) async fn path_escapes_are_refused(f: Factory) -> Outcome {
    with_sandbox(&f, SandboxSpec::default(), |sb| async move {
        ensure!(
            sh(
                &sb,
                "ln -s / rootlink && ln -s ../../../../../../etc up && mkdir -p d && ln -s /tmp d/tmplink"
            )
            .await?
            .status
            .success(),
            "setup"
        );
        // Absolute paths outside every root escape too; where a root is "/"
        // (the boundary is the mount namespace) there is no such path.
        let roots = sb.agent().info().roots.clone();
        let outside = Path::new("/etc/passwd");
        let mut escapes = vec!["../x", "a/../../x", "rootlink/etc/passwd", "up/passwd", "d/tmplink/x"];
        if roots.iter().any(|r| outside.starts_with(r)) {
            sb.files().read(outside).await.ctx("read of a path inside a root")?;
        } else {
            escapes.push("/etc/passwd");
        }
        for e in escapes {
            let r = sb.files().read(e).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "read {e}: {r:?}");
            let r = sb.files().write(e, Bytes::from_static(b"pwn")).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "write {e}: {r:?}");
            let r = sb.files().stream(e).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "stream {e}: {:?}", r.err());
            let r = sb.files().list(e).await;
            ensure!(matches!(r, Err(Error::PathEscape { .. })), "list {e}: {r:?}");
        }
        let r = sb.files().rename("d", "../moved").await;
        ensure!(matches!(r, Err(Error::PathEscape { .. })), "rename out: {r:?}");
        let r = sb.files().remove_all("rootlink/tmp").await;
        ensure!(
            matches!(r, Err(Error::PathEscape { .. })),
            "remove through a link: {r:?}"
        );
        // The link itself is inside and may be inspected and removed.
        let st = sb.files().stat("rootlink").await.ctx("stat link")?;
        ensure!(
            st.kind == FileKind::Symlink && st.symlink_target.as_deref() == Some(Path::new("/")),
            "stat link {st:?}"
        );
        sb.files().remove("rootlink").await.ctx("remove link")?;
        Ok(())
    })
    .await
}
