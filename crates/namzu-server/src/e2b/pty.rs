//! envd PTY processes on namzu terminals: `Start` with `pty` opens a
//! terminal and streams its bytes as `data.pty`; `SendInput` with
//! `input.pty` types into it, `Update` resizes it, `SendSignal` closes it.
//! One task owns each terminal; calls reach it through a channel. The
//! terminal lives until it exits or is killed, whether or not a stream is
//! reading it (its output is then dropped: a PTY is not re-attached).

use base64::Engine;
use bytes::Bytes;
use namzu::{TerminalEvent, TerminalOptions};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, ConnectError};
pub use super::shared::PtyInput;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `{"size": {"cols", "rows"}}`.
pub fn size_of(pty: &Value) -> (u16, u16) {
    let get = |k: &str, d: u16| {
        pty.get("size")
            .and_then(|s| s.get(k))
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .unwrap_or(d)
    };
    (get("cols", 80), get("rows", 24))
}

/// Opens the terminal and returns its pid, the sender its calls use, and
/// the stream response the Start call answers with.
pub async fn start(
    sb: &namzu::Sandbox,
    cmd: &str,
    args: &[String],
    envs: &std::collections::BTreeMap<String, String>,
    cwd: Option<&str>,
    pty: &Value,
) -> Result<(u32, mpsc::Sender<PtyInput>, mpsc::Receiver<Bytes>), ConnectError> {
    let (cols, rows) = size_of(pty);
    let mut opts = TerminalOptions::default().command(cmd).size(cols, rows);
    for a in args {
        opts = opts.arg(a);
    }
    for (k, v) in envs {
        opts = opts.env(k, v);
    }
    if let Some(c) = cwd {
        opts = opts.cwd(c);
    }
    let mut term = sb.terminals().open(opts).await?;
    let pid = term.pid;
    let (in_tx, mut in_rx) = mpsc::channel::<PtyInput>(64);
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut reader = Some(out_tx);
        let send = |reader: &mut Option<mpsc::Sender<Bytes>>, b: Bytes| {
            // A reader that went away stops getting bytes; the terminal goes on.
            if let Some(tx) = reader {
                if tx.try_send(b).is_err() && tx.is_closed() {
                    *reader = None;
                }
            }
        };
        if let Some(tx) = &reader {
            let _ = tx
                .send(connect::envelope(0, &json!({"event": {"start": {"pid": pid}}})))
                .await;
        }
        loop {
            tokio::select! {
                input = in_rx.recv() => match input {
                    Some(PtyInput::Data(b)) => { let _ = term.write(b).await; }
                    Some(PtyInput::Resize(c, r)) => { let _ = term.resize(c, r).await; }
                    Some(PtyInput::Kill) | None => {
                        let end = match term.close().await {
                            Ok(s) => super::shared::end_event(&s),
                            Err(e) => json!({"event": {"end": {"exitCode": -1, "exited": false, "status": "signal: killed", "error": e.to_string()}}}),
                        };
                        send(&mut reader, connect::envelope(0, &end));
                        send(&mut reader, connect::end_ok());
                        return;
                    }
                },
                ev = term.next() => match ev {
                    Some(Ok(TerminalEvent::Output { data, .. })) => {
                        if let Some(tx) = &reader {
                            let msg = connect::envelope(0, &json!({"event": {"data": {"pty": B64.encode(&data)}}}));
                            if tx.send(msg).await.is_err() {
                                reader = None;
                            }
                        }
                    }
                    Some(Ok(TerminalEvent::Exit(s))) => {
                        send(&mut reader, connect::envelope(0, &super::shared::end_event(&s)));
                        send(&mut reader, connect::end_ok());
                        return;
                    }
                    Some(Err(e)) => {
                        send(&mut reader, ConnectError::from(e).end_stream());
                        return;
                    }
                    None => return,
                },
            }
        }
    });
    Ok((pid, in_tx, out_rx))
}
