//! What the CLI shows besides command output: progress bars and short
//! summaries.

use std::process::ExitCode;

/// A session's state in a word or two.
pub fn session_state(s: &namzu::SessionInfo) -> String {
    match s.state {
        namzu::SessionState::Running => "running".into(),
        namzu::SessionState::Exited(st) => format!("exited({})", st.shell_code()),
    }
}

/// A byte-counting bar on stderr.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}") {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}

/// A spinner on stderr for a step of unknown length (drawn only where
/// stderr is a terminal).
pub fn spinner(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(what.to_owned());
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// A command's exit as ours: its code, or 128 + signal, clamped to a byte.
pub fn exit_code(status: &namzu::ExitStatus) -> ExitCode {
    ExitCode::from(u8::try_from(status.shell_code().clamp(0, 255)).unwrap_or(255))
}
