//! `fs ls|stat|mkdir|rm|mv ID:PATH`: files inside a sandbox, without a
//! shell (works on images that have none); `watch ID PATH`: their changes
//! as they happen.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::UNIX_EPOCH;

use clap::Subcommand;
use namzu::{FileInfo, FileKind};

use crate::fail::Fail;
use crate::providers::connect;

#[derive(Subcommand)]
pub enum FsCmd {
    /// List a directory: kind, mode, size, modification time, name.
    Ls { target: String },
    /// Show what is at a path (a symlink itself, not its target).
    Stat { target: String },
    /// Make a directory.
    Mkdir {
        target: String,
        /// Make missing parents too; an existing directory is fine.
        #[arg(long, short = 'p')]
        parents: bool,
    },
    /// Remove a file, a symlink or an empty directory.
    Rm {
        target: String,
        /// Remove a directory and everything beneath it.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Rename within one sandbox: ID:FROM ID:TO (or ID:FROM TO).
    Mv { from: String, to: String },
}

/// `ID:PATH` split in two; the path must not be empty.
fn target(s: &str) -> Result<(&str, &Path), Fail> {
    match s.split_once(':') {
        Some((id, path)) if !id.is_empty() && !path.is_empty() => Ok((id, Path::new(path))),
        _ => Err(Fail(format!("expected ID:PATH, got {s:?}"))),
    }
}

fn kind(k: FileKind) -> char {
    match k {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Other => '?',
    }
}

fn line(f: &FileInfo, name: &str) -> String {
    let mtime = f.mtime.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let link = f
        .symlink_target
        .as_ref()
        .map(|t| format!(" -> {}", t.display()))
        .unwrap_or_default();
    format!(
        "{}{:04o} {:>12} {mtime:>11} {name}{link}",
        kind(f.kind),
        f.mode & 0o7777,
        f.size
    )
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: FsCmd) -> Result<ExitCode, Fail> {
    match cmd {
        FsCmd::Ls { target: t } => {
            let (id, path) = target(&t)?;
            let sb = connect(state_dir, id).await?;
            let mut entries = sb.files().list(path).await?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for f in &entries {
                println!("{}", line(f, &f.name.to_string_lossy()));
            }
        }
        FsCmd::Stat { target: t } => {
            let (id, path) = target(&t)?;
            let sb = connect(state_dir, id).await?;
            let f = sb.files().stat(path).await?;
            println!("{}", line(&f, &f.path.to_string_lossy()));
        }
        FsCmd::Mkdir { target: t, parents } => {
            let (id, path) = target(&t)?;
            let sb = connect(state_dir, id).await?;
            if parents {
                sb.files().mkdir_all(path).await?;
            } else {
                sb.files().mkdir(path).await?;
            }
        }
        FsCmd::Rm { target: t, recursive } => {
            let (id, path) = target(&t)?;
            let sb = connect(state_dir, id).await?;
            if recursive {
                sb.files().remove_all(path).await?;
            } else {
                sb.files().remove(path).await?;
            }
        }
        FsCmd::Mv { from, to } => {
            let (id, src) = target(&from)?;
            let dst = match to.split_once(':') {
                Some((other, _)) if other != id => {
                    return Err(Fail(format!(
                        "mv renames within one sandbox: {from} and {to} name different sandboxes; copy through the host with `namzu cp`"
                    )))
                }
                Some((_, path)) => Path::new(path),
                None => Path::new(to.as_str()),
            };
            let sb = connect(state_dir, id).await?;
            sb.files().rename(src, dst).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `watch ID PATH`: a line per change under `path` (`KIND NAME`, a
/// directory's name ending in `/`), flushed as it comes; the stderr line
/// `watching …` says the watches are in place.
pub async fn watch(
    state_dir: &Option<PathBuf>,
    id: &str,
    path: &Path,
    recursive: bool,
    count: Option<u64>,
) -> Result<ExitCode, Fail> {
    use futures::StreamExt;
    use std::io::Write;
    let sb = connect(state_dir, id).await?;
    let mut events = sb.files().watch(path, recursive).await?;
    eprintln!("watching {id}:{}", path.display());
    let mut out = std::io::stdout();
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let Some(ev) = events.next().await else { break };
        let ev = ev?;
        let slash = if ev.is_dir { "/" } else { "" };
        writeln!(out, "{} {}{slash}", ev.kind.name(), ev.name.display())
            .and_then(|()| out.flush())
            .map_err(|e| Fail(format!("stdout: {e}")))?;
        seen += 1;
    }
    Ok(ExitCode::SUCCESS)
}
