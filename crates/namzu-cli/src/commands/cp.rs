//! `cp`: files between the host and a sandbox, streamed, with progress; a
//! download is renamed into place only when whole.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use futures::StreamExt;
use namzu::{Provider, WriteOptions};
use tokio::io::AsyncWriteExt;

use crate::fail::Fail;
use crate::providers::provider_of;
use crate::ui::progress;

/// `ID:PATH` → (id, path); anything else is a local path.
pub fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (id.starts_with("sb-") && !id.contains('/')).then_some((id, path))
}

pub async fn copy(p: &dyn Provider, src: &str, dst: &str) -> Result<(), Fail> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((id, path))) => {
            let sb = p.connect(id).await?;
            let file = tokio::fs::File::open(src)
                .await
                .map_err(|e| Fail(format!("{src}: {e}")))?;
            let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
            let bar = progress(len, "upload");
            let reader = bar.wrap_async_read(file);
            sb.files()
                .write_from(Path::new(path), Box::new(reader), WriteOptions::default())
                .await?;
            bar.finish_and_clear();
            Ok(())
        }
        (Some((id, path)), None) => {
            let sb = p.connect(id).await?;
            let size = sb.files().stat(Path::new(path)).await?.size;
            let bar = progress(size, "download");
            let mut s = sb.files().stream(Path::new(path)).await?;
            // Written beside the target and renamed, so a failed copy never
            // leaves a truncated file under the destination name.
            let target = PathBuf::from(dst);
            let tmp = target.with_file_name(format!(
                ".{}.namzu-part",
                target.file_name().and_then(|n| n.to_str()).unwrap_or("copy")
            ));
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
            let res = async {
                while let Some(chunk) = s.next().await {
                    let chunk = chunk?;
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
                    bar.inc(chunk.len() as u64);
                }
                f.sync_all()
                    .await
                    .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
                tokio::fs::rename(&tmp, &target)
                    .await
                    .map_err(|e| Fail(format!("{dst}: {e}")))
            }
            .await;
            if res.is_err() {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            bar.finish_and_clear();
            res
        }
        (Some(_), Some(_)) => Err(Fail(
            "copying between two sandboxes is not supported; copy through the host".into(),
        )),
        (None, None) => Err(Fail("one side of cp must be ID:PATH".into())),
    }
}

pub async fn run(state_dir: &Option<PathBuf>, src: String, dst: String) -> Result<ExitCode, Fail> {
    let id = split_remote(&src).or(split_remote(&dst)).map(|(id, _)| id.to_owned());
    let Some(id) = id else {
        return Err(Fail("one side of cp must be ID:PATH".into()));
    };
    let (_, p) = provider_of(state_dir, &id).await?;
    copy(p.as_ref(), &src, &dst).await?;
    Ok(ExitCode::SUCCESS)
}
