//! `shell`, `attach` and `port-forward`: interactive terminals and TCP
//! into a sandbox.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use namzu::Sandbox;

use crate::fail::Fail;
use crate::providers::{connect, provider_of, warn_host};
use crate::tty::{interact, local_size};

pub async fn shell(
    state_dir: &Option<PathBuf>,
    id: String,
    session: Option<String>,
    command: Vec<OsString>,
) -> Result<ExitCode, Fail> {
    let (tier, p) = provider_of(state_dir, &id).await?;
    warn_host(tier);
    let sb = p.connect(&id).await?;
    open_terminal(&sb, session, command).await
}

pub async fn attach(state_dir: &Option<PathBuf>, id: String, session: String, from: u64) -> Result<ExitCode, Fail> {
    let sb = connect(state_dir, &id).await?;
    let t = sb.terminals().attach(&session, from).await?;
    interact(t).await
}

pub async fn port_forward(
    state_dir: &Option<PathBuf>,
    id: String,
    (local, remote): (u16, u16),
) -> Result<ExitCode, Fail> {
    let sb: Sandbox = connect(state_dir, &id).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", local))
        .await
        .map_err(|e| Fail(format!("cannot listen on 127.0.0.1:{local}: {e}")))?;
    let addr = listener.local_addr().map_err(|e| Fail(e.to_string()))?;
    println!("forwarding {addr} -> {id}:{remote}");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            accepted = listener.accept() => {
                let (mut conn, peer) = match accepted {
                    Ok(c) => c,
                    // Out of descriptors and the like: the forward
                    // goes on once some are free.
                    Err(e) if namzu_proto::accept::is_transient(&e) => {
                        tokio::time::sleep(namzu_proto::accept::BACKOFF).await;
                        continue;
                    }
                    Err(e) => return Err(Fail(e.to_string())),
                };
                let sb = sb.clone();
                tokio::spawn(async move {
                    match sb.network().connect(remote).await {
                        Ok(mut tunnel) => {
                            let _ = tokio::io::copy_bidirectional(&mut conn, &mut tunnel).await;
                        }
                        Err(e) => eprintln!("namzu: {peer}: {e}"),
                    }
                });
            }
        }
    }
}

/// Runs an interactive terminal: stdin in, output out, resizes followed.
async fn open_terminal(sb: &Sandbox, session: Option<String>, command: Vec<OsString>) -> Result<ExitCode, Fail> {
    let (cols, rows) = local_size();
    let mut args = command.into_iter();
    let opts = namzu::TerminalOptions {
        command: args.next(),
        args: args.collect(),
        cols,
        rows,
        persistent: session.is_some(),
        session_id: session,
        ..Default::default()
    };
    let t = sb.terminals().open(opts).await?;
    interact(t).await
}
