//! `image import|ls`: root filesystem images of the daemonless tiers.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::fail::Fail;
use crate::ui::progress;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import a `docker save` tarball or an OCI image layout (tar or directory).
    Import {
        file: PathBuf,
        /// Name to give it (default: the names it carries).
        #[arg(long)]
        name: Option<String>,
    },
    /// List imported images.
    Ls,
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: ImageCmd) -> Result<ExitCode, Fail> {
    match cmd {
        ImageCmd::Import { file, name } => import(state_dir, file, name).await,
        ImageCmd::Ls => list(state_dir).await,
    }
}

async fn import(state_dir: &Option<PathBuf>, file: PathBuf, name: Option<String>) -> Result<ExitCode, Fail> {
    let store = namzu::image::ImageStore::new(state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir));
    let bar = progress(std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0), "import");
    let shown = bar.clone();
    let info =
        tokio::task::spawn_blocking(move || store.import(&file, name.as_deref(), &|done, _| shown.set_position(done)))
            .await
            .map_err(|e| Fail(e.to_string()))?;
    bar.finish_and_clear();
    let info = info?;
    println!("{} {}", info.id, info.names.join(" "));
    Ok(ExitCode::SUCCESS)
}

async fn list(state_dir: &Option<PathBuf>) -> Result<ExitCode, Fail> {
    let store = namzu::image::ImageStore::new(state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir));
    for i in store.list()? {
        println!("{} {}", i.id, i.names.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}
