//! `namzu run` on the local tier when nothing may leave the sandbox: the
//! command runs in a sandbox made for it alone, with no agent and no link
//! (`LocalProvider::run_once`), started from this process before any
//! thread exists. Everything else `run` takes (another tier, a network
//! policy) goes through a served sandbox as before.
//!
//! What the user sees is the same either way: the command's stdout and
//! stderr as they come, piped stdin forwarded (a terminal is not), the
//! command's exit code or 128 + the signal, 137 after `--timeout` (with a
//! line saying so), Ctrl-C killing everything it started.

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use namzu::backend::local::{LocalProvider, OnceCleanup, OnceIo, OnceRequest};
use namzu::Tier;

use crate::args::{ExecArgs, KubeArgs, ResourceArgs};
use crate::fail::Fail;

/// Whether `run` with these arguments takes the agentless path: the local
/// tier, no flag of another tier (those are refused on the served path,
/// by name), and no egress configuration at all.
pub fn eligible(tier: Tier, resources: &ResourceArgs, kube: &KubeArgs) -> bool {
    tier == Tier::Local
        && kube.is_empty()
        && resources.runtime.is_none()
        && resources.kernel.is_none()
        && resources.accel.is_none()
        && resources
            .network
            .config()
            .is_ok_and(|c| c == namzu::egress::EgressConfig::default())
}

/// Runs `exec` in a one-command sandbox of `resources`.
pub fn run(state_dir: &Option<PathBuf>, resources: &ResourceArgs, exec: ExecArgs) -> Result<ExitCode, Fail> {
    if let Some(image) = &resources.image {
        super::image::ensure_blocking(state_dir, image)?;
    }
    let spec = resources.spec(Vec::new())?;
    let timeout = match exec.timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            return Err(Fail(format!("--timeout must be a positive number of seconds, got {t}")))
        }
        t => t.map(Duration::from_secs_f64),
    };
    let req = OnceRequest {
        command: exec.command,
        env: exec.env,
        cwd: exec.workdir,
        timeout,
        // This process exits right after: the sandbox's leftovers go
        // while it does.
        cleanup: OnceCleanup::Detached,
    };
    // Ctrl-C (and a TERM or HUP aimed at us) cancels: taken by descriptor,
    // so it wakes the copy loop instead of ending this process before the
    // sandbox is gone.
    let cancel = cancel_signals()?;
    let stdin = if std::io::stdin().is_terminal() || stdin_is_dev_null() {
        None
    } else {
        Some(
            std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| Fail(format!("stdin: {e}")))?,
        )
    };
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    // No agent binary is needed: no agent starts.
    let provider = LocalProvider::with_agent(dir, PathBuf::new());
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    let outcome = provider.run_once(
        spec,
        req,
        OnceIo {
            stdin,
            stdout: &mut out,
            stderr: &mut err,
            cancel: Some(cancel.as_fd()),
        },
    )?;
    namzu::timeline::mark("cli.command-done");
    if outcome.timed_out {
        eprintln!("namzu: command timed out and was killed");
    }
    let code = match (outcome.code, outcome.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => i32::from(crate::fail::EXIT_NAMZU),
    };
    Ok(ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(255)))
}

/// A signalfd of SIGINT, SIGTERM and SIGHUP, which are blocked from now
/// on (the sandbox unblocks them for itself).
fn cancel_signals() -> Result<nix::sys::signalfd::SignalFd, Fail> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().map_err(|e| Fail(format!("block signals: {e}")))?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC).map_err(|e| Fail(format!("signalfd: {e}")))
}

/// Whether our stdin is /dev/null (character device 1:3): then the command
/// gets its own, and nothing needs copying.
fn stdin_is_dev_null() -> bool {
    rustix::fs::fstat(std::io::stdin().as_fd()).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
            && rustix::fs::major(st.st_rdev) == 1
            && rustix::fs::minor(st.st_rdev) == 3
    })
}
