//! A small client of qemu's machine protocol (QMP) on the VM's control
//! socket: commands and their answers, events skipped, and a descriptor
//! passed along with a command (`getfd`) — how the memory snapshot's file
//! reaches a VMM that is confined and sees no host path.
//!
//! Blocking, with a timeout on every read: it runs on a blocking thread
//! for the few commands a snapshot takes.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// What went wrong talking to the VMM.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket failed or closed.
    #[error("qmp: {0}")]
    Io(#[from] std::io::Error),
    /// The VMM said something that is not QMP.
    #[error("qmp: unreadable answer: {0}")]
    Protocol(String),
    /// The VMM refused a command.
    #[error("qmp {command}: {class}: {desc}")]
    Refused {
        /// The command.
        command: String,
        /// qemu's error class.
        class: String,
        /// qemu's words.
        desc: String,
    },
}

/// A connected, negotiated QMP session.
pub struct Qmp {
    read: BufReader<UnixStream>,
    write: UnixStream,
}

impl Qmp {
    /// Connects to the socket at `path`, reads the greeting and leaves
    /// capabilities negotiation; every read waits at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let mut q = Self {
            read: BufReader::new(s.try_clone()?),
            write: s,
        };
        let greeting = q.line()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("no greeting: {greeting}")));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// Runs `command` with `args`; its `return` value.
    pub fn execute(&mut self, command: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let msg = request(command, args);
        self.write.write_all(&msg)?;
        self.answer(command)
    }

    /// Runs `command` with `fd` passed beside it (SCM_RIGHTS), as `getfd`
    /// and `add-fd` take theirs.
    pub fn execute_with_fd(
        &mut self,
        command: &str,
        args: Option<Value>,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let msg = request(command, args);
        let fds = [fd];
        let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(QmpError::Protocol("no room for the descriptor".into()));
        }
        let sent = sendmsg(
            self.write.as_fd(),
            &[std::io::IoSlice::new(&msg)],
            &mut control,
            SendFlags::empty(),
        )
        .map_err(std::io::Error::from)?;
        // The descriptor rode the first byte; the rest goes plainly.
        self.write.write_all(&msg[sent..])?;
        self.answer(command)
    }

    fn answer(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let v = self.line()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
                return Err(QmpError::Refused {
                    command: command.into(),
                    class: s("class"),
                    desc: s("desc"),
                });
            }
            // Events (STOP, RESUME, MIGRATION …) come between; skipped.
        }
    }

    fn line(&mut self) -> Result<Value, QmpError> {
        let mut l = String::new();
        if self.read.read_line(&mut l)? == 0 {
            return Err(QmpError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the VMM closed its control socket",
            )));
        }
        serde_json::from_str(&l).map_err(|e| QmpError::Protocol(format!("{e}: {}", l.trim())))
    }
}

fn request(command: &str, args: Option<Value>) -> Vec<u8> {
    let mut v = json!({ "execute": command });
    if let Some(a) = args {
        v["arguments"] = a;
    }
    let mut b = v.to_string().into_bytes();
    b.push(b'\n');
    b
}

/// Saves the stopped-or-running VM behind `qmp` into `out` (qemu's
/// migration to a file descriptor) and leaves it stopped; the bytes
/// written. `max_wait` bounds the whole save.
pub fn save_memory(qmp: &mut Qmp, out: &std::fs::File, max_wait: Duration) -> Result<u64, QmpError> {
    qmp.execute("stop", None)?;
    // Nothing runs meanwhile: no reason to pace the copy (qemu's default
    // is 128 MiB/s, meant for a live migration over a network).
    qmp.execute("migrate-set-parameters", Some(json!({ "max-bandwidth": 1u64 << 40 })))?;
    qmp.execute_with_fd("getfd", Some(json!({ "fdname": "namzu-snapshot" })), out.as_fd())?;
    qmp.execute("migrate", Some(json!({ "uri": "fd:namzu-snapshot" })))?;
    let start = std::time::Instant::now();
    loop {
        let st = qmp.execute("query-migrate", None)?;
        match st.get("status").and_then(Value::as_str) {
            Some("completed") => break,
            Some(s @ ("failed" | "cancelled")) => {
                return Err(QmpError::Refused {
                    command: "migrate".into(),
                    class: s.into(),
                    desc: st
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given")
                        .into(),
                })
            }
            _ if start.elapsed() > max_wait => {
                let _ = qmp.execute("migrate_cancel", None);
                return Err(QmpError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the memory save took longer than {max_wait:?}"),
                )));
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    out.sync_all()?;
    Ok(out.metadata()?.len())
}
