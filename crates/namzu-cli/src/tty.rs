//! The local terminal: raw mode, its size, and driving a sandbox terminal
//! from this process's stdin and stdout.

use std::io::IsTerminal;
use std::process::ExitCode;

use tokio::io::AsyncWriteExt;

use crate::fail::Fail;
use crate::ui::exit_code;

/// Puts the terminal in raw mode until dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self(None);
        }
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let _ = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, saved);
        }
    }
}

pub fn local_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout()).map_or((80, 24), |w| (w.ws_col, w.ws_row))
}

/// Drives a terminal from this process's stdin and stdout until it exits.
pub async fn interact(mut t: namzu::Terminal) -> Result<ExitCode, Fail> {
    use tokio::io::AsyncReadExt;
    let _raw = RawMode::enter();
    let (tx, mut keys) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 || tx.send(bytes::Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                break;
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .map_err(|e| Fail(e.to_string()))?;
    let mut out = tokio::io::stdout();
    // Nothing more is sent once a send fails: that only happens when the
    // terminal's call has ended, and what ended it (the exit, after every
    // byte before it, or the link's failure) still comes through `t.next()`.
    // Failing here instead would lose that output and the exit code.
    let (mut stdin_open, mut sending) = (true, true);
    loop {
        tokio::select! {
            ev = t.next() => match ev {
                Some(Ok(namzu::TerminalEvent::Output { data, .. })) => {
                    out.write_all(&data).await.map_err(|e| Fail(format!("stdout: {e}")))?;
                    out.flush().await.map_err(|e| Fail(format!("stdout: {e}")))?;
                }
                Some(Ok(namzu::TerminalEvent::Exit(st))) => {
                    return Ok(exit_code(&st));
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Err(Fail("the terminal ended without an exit".into())),
            },
            key = keys.recv(), if stdin_open && sending => {
                let sent = match key {
                    Some(k) => t.write(k).await,
                    // End of input is passed on as the terminal's EOF character.
                    None => {
                        stdin_open = false;
                        t.write(bytes::Bytes::from_static(b"\x04")).await
                    }
                };
                if let Err(e) = sent {
                    tracing::debug!("terminal input stops: {e}");
                    sending = false;
                }
            },
            _ = winch.recv(), if sending => {
                let (c, r) = local_size();
                if let Err(e) = t.resize(c, r).await {
                    tracing::debug!("terminal input stops: {e}");
                    sending = false;
                }
            }
        }
    }
}
