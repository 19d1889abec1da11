//! `logs`: a session's or a named execution's output from an offset,
//! optionally followed to its exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::exec::print_events;
use crate::fail::Fail;
use crate::providers::connect;
use crate::ui::exit_code;

pub async fn run(
    state_dir: &Option<PathBuf>,
    id: String,
    session: String,
    follow: bool,
    from: u64,
) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    let mut out = tokio::io::stdout();
    let mut at = from;
    loop {
        let c = match sb.sessions().read_max(&session, at, 0).await {
            // Not a session: a named execution, read from its log.
            Err(namzu::Error::SessionNotFound { .. }) if at == from => {
                let opts = namzu::AttachOptions {
                    from_offset: from,
                    follow,
                    on_gap: Some(std::sync::Arc::new(|g: namzu::OutputGap| {
                        eprintln!(
                            "namzu: {} bytes of output were dropped (log full) from offset {}",
                            g.lost_bytes, g.from_offset
                        )
                    })),
                    ..Default::default()
                };
                let stream = sb.commands().attach_stream(&session, opts).await?;
                let code = print_events(stream).await?;
                return Ok(code.unwrap_or(ExitCode::SUCCESS));
            }
            other => other?,
        };
        if c.dropped_bytes > 0 {
            eprintln!(
                "namzu: {} bytes of output were dropped (ring full) before offset {}",
                c.dropped_bytes, c.offset
            );
        }
        out.write_all(&c.data).await.map_err(|e| Fail(format!("stdout: {e}")))?;
        out.flush().await.map_err(|e| Fail(format!("stdout: {e}")))?;
        at = c.next_offset;
        let caught_up = at == c.info.output_bytes;
        match c.info.state {
            namzu::SessionState::Exited(st) if caught_up && follow => {
                return Ok(exit_code(&st));
            }
            _ if caught_up && !follow => return Ok(ExitCode::SUCCESS),
            _ if c.data.is_empty() => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => {}
        }
    }
}
