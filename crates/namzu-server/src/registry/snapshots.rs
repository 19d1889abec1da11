//! Snapshots through the server: who owns each (one JSON file per
//! snapshot under `<state>/server/snapshots/`, beside the sandboxes'
//! records), and forks recorded as sandboxes of the same owner, made from
//! the source's record. A snapshot of another owner is the same
//! `snapshot_not_found` as one that does not exist.

use axum::http::StatusCode;
use namzu::SnapshotInfo;
use serde::{Deserialize, Serialize};

use super::{now_ms, write_atomic, Pending, Record, Registry};
use crate::error::{ApiError, ApiResult};

/// What the server keeps of one snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotRecord {
    owner: String,
    /// The source's record at the snapshot: tier, runtime, image, labels
    /// and timeout policy a fork starts with.
    source: Record,
}

fn no_snapshot(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "snapshot_not_found", format!("no snapshot {id}"))
}

impl Registry {
    fn snapshot_path(&self, snapshot: &str) -> std::path::PathBuf {
        self.dir.join("snapshots").join(format!("{snapshot}.json"))
    }

    fn snapshot_record(&self, owner: &str, snapshot: &str) -> ApiResult<SnapshotRecord> {
        let ok = !snapshot.is_empty() && snapshot.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        let rec: Option<SnapshotRecord> = ok
            .then(|| std::fs::read(self.snapshot_path(snapshot)).ok())
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok());
        rec.filter(|r| r.owner == owner).ok_or_else(|| no_snapshot(snapshot))
    }

    /// Saves `owner`'s running sandbox `id` as a snapshot (see
    /// [`namzu::Provider::snapshot`]); the sandbox runs on.
    pub async fn snapshot(&self, owner: &str, id: &str) -> ApiResult<SnapshotInfo> {
        let rec = self.get(owner, id)?;
        let provider = self.provider(rec.tier, rec.runtime.clone()).await?;
        let info = provider.snapshot(id).await?;
        let kept = SnapshotRecord {
            owner: owner.into(),
            source: rec,
        };
        let saved = std::fs::create_dir_all(self.dir.join("snapshots"))
            .and_then(|()| serde_json::to_vec_pretty(&kept).map_err(std::io::Error::other))
            .and_then(|b| write_atomic(&self.snapshot_path(&info.id), &b));
        if let Err(e) = saved {
            // Unrecorded, nobody could fork or remove it: undo.
            let _ = provider.delete_snapshot(&info.id).await;
            return Err(ApiError::internal(format!("cannot record snapshot: {e}")));
        }
        Ok(info)
    }

    /// `owner`'s snapshots, oldest first.
    pub async fn snapshots(&self, owner: &str) -> ApiResult<Vec<SnapshotInfo>> {
        let mut out = Vec::new();
        let mut tiers = Vec::new();
        for e in std::fs::read_dir(self.dir.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else { continue };
            if let Ok(r) = self.snapshot_record(owner, id) {
                let key = (r.source.tier, r.source.runtime.clone());
                if !tiers.contains(&key) {
                    tiers.push(key);
                }
            }
        }
        for (tier, runtime) in tiers {
            let provider = self.provider(tier, runtime).await?;
            for s in provider.snapshots().await? {
                if self.snapshot_record(owner, &s.id).is_ok() {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| (a.created_unix, &a.id).cmp(&(b.created_unix, &b.id)));
        Ok(out)
    }

    /// Starts a sandbox from `owner`'s `snapshot`, recorded as `owner`'s,
    /// with the source's tier, labels and timeout policy; `timeout_ms`
    /// replaces the source's timeout when given.
    pub async fn fork(
        &self,
        _pending: Pending<'_>,
        owner: &str,
        snapshot: &str,
        timeout_ms: Option<u64>,
    ) -> ApiResult<Record> {
        let snap = self.snapshot_record(owner, snapshot)?;
        let provider = self.provider(snap.source.tier, snap.source.runtime.clone()).await?;
        let sb = provider.fork(snapshot).await?;
        let now = now_ms();
        let timeout_ms = timeout_ms.unwrap_or(snap.source.timeout_ms);
        let record = Record {
            id: sb.id().to_string(),
            created_at_ms: now,
            expires_at_ms: now + timeout_ms,
            timeout_ms,
            state: "running".into(),
            // The source's E2B token is the source's; a fork made here is
            // reached through this API.
            envd_token: None,
            ..snap.source
        };
        self.adopt(record, sb).await
    }

    /// Removes `owner`'s `snapshot` (409 `snapshot_in_use` while forks'
    /// disks overlay it).
    pub async fn delete_snapshot(&self, owner: &str, snapshot: &str) -> ApiResult<()> {
        let snap = self.snapshot_record(owner, snapshot)?;
        let provider = self.provider(snap.source.tier, snap.source.runtime.clone()).await?;
        match provider.delete_snapshot(snapshot).await {
            Ok(()) | Err(namzu::Error::SnapshotNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let _ = std::fs::remove_file(self.snapshot_path(snapshot));
        Ok(())
    }
}
