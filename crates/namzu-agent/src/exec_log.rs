//! The retained log of a detachable execution.
//!
//! A detachable command's stdout and stderr are appended, in the order they
//! arrive, to one bounded log that lives as long as the execution's record,
//! not as long as any call. Every byte has a position in that interleaved
//! log (`log_offset`) as well as in its own stream (`offset`), so a reader
//! that lost its connection comes back at exactly the byte it had reached.
//!
//! Promises:
//! * Appending never waits for a reader: when the log holds more than its
//!   `execution_log_bytes`, the oldest bytes are dropped.
//! * A reader asking for dropped bytes gets a `gap` naming the lost range
//!   before anything else, and its exit reports both streams truncated —
//!   never a shorter stream that looks complete.
//! * Every reader sees the same exit, whenever it attaches while the record
//!   is retained.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use namzu_proto::v1::{self, agent_error::Kind, exec_output, ExecExit, ExecOutput, OutputChunk};
use tokio::sync::{mpsc, Notify};

use crate::op_error::{agent_err, IntoStatus, OpError};

/// Largest run of log bytes one follow step sends.
const STEP_BYTES: u64 = 256 * 1024;

pub type OutputTx = mpsc::Sender<Result<ExecOutput, tonic::Status>>;

struct Entry {
    stdout: bool,
    /// Offset of `data` in its own stream.
    stream_offset: u64,
    /// Offset of `data` in the log.
    log_offset: u64,
    data: Bytes,
}

#[derive(Default)]
struct Inner {
    entries: VecDeque<Entry>,
    /// Log offset of the oldest byte held.
    start: u64,
    /// Log offset of the next byte.
    end: u64,
    /// Bytes produced so far per stream: [stdout, stderr].
    totals: [u64; 2],
    pid: u32,
    outcome: Option<Result<ExecExit, OpError>>,
    finished_at: Option<Instant>,
}

pub struct ExecLog {
    cap: u64,
    inner: Mutex<Inner>,
    changed: Notify,
}

/// What a reader at some offset gets next.
struct Step {
    /// The reader's offset was evicted; it resumes here.
    gap_to: Option<u64>,
    chunks: Vec<(bool, OutputChunk)>,
    outcome: Option<Result<ExecExit, OpError>>,
}

impl ExecLog {
    pub fn new(cap: u64) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            inner: Mutex::default(),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Whole-field updates only: a poisoned lock still holds a valid log.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_pid(&self, pid: u32) {
        self.lock().pid = pid;
        self.changed.notify_waiters();
    }

    pub fn append(&self, stdout: bool, data: &[u8]) {
        {
            let mut g = self.lock();
            let idx = usize::from(!stdout);
            let entry = Entry {
                stdout,
                stream_offset: g.totals[idx],
                log_offset: g.end,
                data: Bytes::copy_from_slice(data),
            };
            g.totals[idx] += data.len() as u64;
            g.end += data.len() as u64;
            g.entries.push_back(entry);
            while g.end - g.start > self.cap {
                let over = g.end - g.start - self.cap;
                let Some(front) = g.entries.front_mut() else { break };
                let len = front.data.len() as u64;
                if len <= over {
                    g.start += len;
                    g.entries.pop_front();
                } else {
                    let cut = usize::try_from(over).unwrap_or(usize::MAX);
                    front.data = front.data.slice(cut..);
                    front.stream_offset += over;
                    front.log_offset += over;
                    g.start += over;
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Waits until the command has a pid or has ended (it failed to
    /// start), so a fresh start's `Started` carries the real pid.
    pub async fn started(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let g = self.lock();
                if g.pid != 0 || g.outcome.is_some() {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Records how the execution ended; readers get it once they have read
    /// every byte.
    pub fn finish(&self, outcome: Result<ExecExit, OpError>) {
        {
            let mut g = self.lock();
            g.outcome = Some(outcome);
            g.finished_at = Some(Instant::now());
        }
        self.changed.notify_waiters();
    }

    /// The pid, the bytes produced so far, and the exit once there is one.
    pub fn summary(&self) -> (u32, u64, Option<ExecExit>) {
        let g = self.lock();
        let exit = match &g.outcome {
            Some(Ok(x)) => Some(*x),
            _ => None,
        };
        (g.pid, g.end, exit)
    }

    pub fn finished_at(&self) -> Option<Instant> {
        self.lock().finished_at
    }

    fn step(&self, at: u64) -> Step {
        let g = self.lock();
        let gap_to = (at < g.start).then_some(g.start);
        let mut at = at.max(g.start);
        let limit = at + STEP_BYTES;
        let mut chunks = Vec::new();
        for e in &g.entries {
            let end = e.log_offset + e.data.len() as u64;
            if end <= at {
                continue;
            }
            if at >= limit {
                break;
            }
            let skip = at - e.log_offset;
            let take = (end - at).min(limit - at);
            let lo = usize::try_from(skip).unwrap_or(usize::MAX);
            let hi = usize::try_from(skip + take).unwrap_or(usize::MAX);
            chunks.push((
                e.stdout,
                OutputChunk {
                    offset: e.stream_offset + skip,
                    data: e.data.slice(lo..hi),
                    log_offset: at,
                },
            ));
            at += take;
        }
        Step {
            gap_to,
            chunks,
            outcome: g.outcome.clone(),
        }
    }

    /// Serves one reader from `from`: `Started`, a gap if `from` was
    /// evicted, the held bytes, then (with `follow`) live ones and the
    /// outcome. Ends early, signalling nothing, when the reader goes.
    pub async fn follow(
        self: Arc<Self>,
        execution_id: String,
        from: u64,
        follow: bool,
        attached: bool,
        heartbeat: Option<Duration>,
        tx: OutputTx,
    ) {
        let (pid, end) = {
            let g = self.lock();
            (g.pid, g.end)
        };
        if from > end {
            let mut e = agent_err(
                Kind::InvalidArgument,
                "attach_exec",
                "offset is past the end of the log",
            );
            e.execution_id = execution_id;
            e.limit = end;
            let _ = tx.send(Err(e.into_status())).await;
            return;
        }
        let started = v1::Started {
            pid,
            execution_id: execution_id.clone(),
            attached,
            boot_id: crate::boot_id().to_owned(),
        };
        if tx.send(Ok(msg(exec_output::Msg::Started(started)))).await.is_err() {
            return;
        }
        let beats = heartbeat.map(|every| spawn_heartbeats(tx.clone(), every));
        let mut at = from;
        let mut lost = 0u64;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let step = self.step(at);
            if let Some(to) = step.gap_to {
                lost += to - at;
                let gap = v1::OutputGap {
                    from_offset: at,
                    to_offset: to,
                };
                at = to;
                if tx.send(Ok(msg(exec_output::Msg::Gap(gap)))).await.is_err() {
                    break;
                }
            }
            if !step.chunks.is_empty() {
                let mut gone = false;
                for (stdout, chunk) in step.chunks {
                    at = chunk.log_offset + chunk.data.len() as u64;
                    let m = if stdout {
                        exec_output::Msg::Stdout(chunk)
                    } else {
                        exec_output::Msg::Stderr(chunk)
                    };
                    if tx.send(Ok(msg(m))).await.is_err() {
                        gone = true;
                        break;
                    }
                }
                if gone {
                    break;
                }
                continue;
            }
            match step.outcome {
                Some(Ok(mut exit)) => {
                    // The log is one interleaved space: which stream the
                    // lost bytes belonged to is gone with them.
                    if lost > 0 {
                        exit.stdout_truncated = true;
                        exit.stderr_truncated = true;
                    }
                    let _ = tx.send(Ok(msg(exec_output::Msg::Exit(exit)))).await;
                    break;
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(e.into_status())).await;
                    break;
                }
                None if !follow => break,
                None => {}
            }
            tokio::select! {
                _ = &mut changed => {}
                _ = tx.closed() => break,
            }
        }
        if let Some(b) = beats {
            b.abort();
        }
    }
}

fn msg(m: exec_output::Msg) -> ExecOutput {
    ExecOutput { msg: Some(m) }
}

/// Sends a heartbeat on `tx` every `every` until the call is gone.
pub fn spawn_heartbeats(tx: OutputTx, every: Duration) -> tokio::task::JoinHandle<()> {
    crate::heartbeat::spawn(tx, every, || Ok(msg(exec_output::Msg::Heartbeat(v1::Empty {}))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_keeps_the_newest_bytes_with_both_offsets() {
        let log = ExecLog::new(5);
        log.append(true, b"abc");
        log.append(false, b"XY");
        log.append(true, b"de");
        // 7 bytes written, 5 held: "c", "XY", "de".
        let step = log.step(0);
        assert_eq!(step.gap_to, Some(2));
        let got: Vec<(bool, u64, u64, &[u8])> = step
            .chunks
            .iter()
            .map(|(s, c)| (*s, c.offset, c.log_offset, c.data.as_ref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (true, 2, 2, &b"c"[..]),
                (false, 0, 3, &b"XY"[..]),
                (true, 3, 5, &b"de"[..])
            ]
        );
        // A reader in the middle of an entry resumes at its exact byte.
        let step = log.step(4);
        assert_eq!(step.gap_to, None);
        assert_eq!(step.chunks[0].1.data.as_ref(), b"Y");
        assert_eq!(step.chunks[0].1.offset, 1);
    }

    #[tokio::test]
    async fn every_reader_gets_the_same_exit_and_a_late_one_is_told_its_gap() {
        let log = ExecLog::new(4);
        log.append(true, b"123456");
        log.finish(Ok(ExecExit {
            code: Some(3),
            stdout_bytes: 6,
            ..Default::default()
        }));
        let read = |from| {
            let log = log.clone();
            async move {
                let (tx, mut rx) = mpsc::channel(16);
                log.follow("e".into(), from, true, true, None, tx).await;
                let mut out = Vec::new();
                while let Some(m) = rx.recv().await {
                    out.push(m.unwrap().msg.unwrap());
                }
                out
            }
        };
        let late = read(0).await;
        assert!(matches!(&late[1], exec_output::Msg::Gap(g) if g.from_offset == 0 && g.to_offset == 2));
        let exit = |v: &[exec_output::Msg]| match v.last() {
            Some(exec_output::Msg::Exit(x)) => *x,
            other => panic!("no exit: {other:?}"),
        };
        assert!(exit(&late).stdout_truncated && exit(&late).stderr_truncated);
        let on_time = read(2).await;
        assert_eq!(exit(&on_time).code, Some(3));
        assert!(!exit(&on_time).stdout_truncated);
        assert_eq!(exit(&late).code, exit(&on_time).code);
    }
}
