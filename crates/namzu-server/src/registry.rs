//! [`Registry`]: the server's own record of the sandboxes it made — owner,
//! labels, expiry — kept as one JSON file per sandbox under
//! `<state>/server/`, so a restarted server (even after `kill -9`) knows
//! them all again. The sandboxes themselves belong to their tiers and
//! outlive the server; a handle is reconnected through the tier's provider
//! on first use.
//!
//! Ownership is enforced here: every lookup takes the caller's owner, and a
//! sandbox of another owner is the same [`ApiError::no_sandbox`] as one
//! that does not exist.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use namzu::factory::ProviderOptions;
use namzu::{Provider, Sandbox, SandboxSpec, Tier};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};

mod snapshots;

/// What the server remembers of one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The sandbox's id.
    pub id: String,
    /// Its tier.
    pub tier: Tier,
    /// docker: the runtime.
    pub runtime: Option<String>,
    /// The image it was made from.
    pub image: Option<String>,
    /// The key name that made it.
    pub owner: String,
    /// The caller's labels.
    pub metadata: BTreeMap<String, String>,
    /// Unix ms.
    pub created_at_ms: u64,
    /// Unix ms; the reaper destroys it after (or pauses it, with
    /// `pause_on_timeout`).
    pub expires_at_ms: u64,
    /// Reaching its timeout pauses it instead of destroying it (E2B's
    /// `autoPause`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pause_on_timeout: bool,
    /// Reaching its timeout suspends it to disk instead of destroying it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend_on_timeout: bool,
    /// A paused sandbox is resumed by the next envd request to it (E2B's
    /// `autoResume`), its timeout set again to `timeout_ms` from then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_resume: bool,
    /// The timeout it was made with, in ms (what an auto-resume sets again).
    #[serde(default)]
    pub timeout_ms: u64,
    /// `running`, `paused` or `suspended` (through this server; it does not
    /// expire while so, and still counts against its owner's limit) or
    /// `dead`.
    #[serde(default = "running")]
    pub state: String,
    /// E2B-compatible API: the template it was made from, when made there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// E2B-compatible API: the token envd calls must carry
    /// (`X-Access-Token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_token: Option<String>,
}

impl Record {
    /// The timeout it was made with; `default` for a record older than
    /// `timeout_ms`.
    pub fn timeout(&self, default: Duration) -> Duration {
        match self.timeout_ms {
            0 => default,
            ms => Duration::from_millis(ms),
        }
    }
}

fn running() -> String {
    "running".into()
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

type ProviderKey = (Tier, Option<String>);

/// The server's sandboxes.
pub struct Registry {
    dir: PathBuf,
    state_dir: Option<PathBuf>,
    records: Mutex<BTreeMap<String, Record>>,
    handles: Mutex<HashMap<String, Sandbox>>,
    /// Creates under way, by owner: they count against the owner's limit.
    pending: Mutex<HashMap<String, usize>>,
    providers: tokio::sync::Mutex<HashMap<ProviderKey, Arc<dyn Provider>>>,
    /// `warm_pool`: sandboxes kept started per single-host tier.
    warm_pool: usize,
    pools: tokio::sync::Mutex<HashMap<ProviderKey, Arc<namzu::pool::Pool>>>,
}

/// A create counted against its owner's limit until dropped.
pub struct Pending<'a> {
    reg: &'a Registry,
    owner: String,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.reg.pending.lock() {
            if let Some(n) = p.get_mut(&self.owner) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

fn poisoned() -> ApiError {
    ApiError::internal("registry lock poisoned")
}

impl Registry {
    /// Loads the records under `<state>/server/` (creating it, 0700).
    pub fn open(state_dir: Option<PathBuf>) -> std::io::Result<Self> {
        let base = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
        let dir = base.join("server");
        std::fs::create_dir_all(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut records = BTreeMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match std::fs::read(&path).map(|b| serde_json::from_slice::<Record>(&b)) {
                    Ok(Ok(r)) => {
                        records.insert(r.id.clone(), r);
                    }
                    Ok(Err(e)) => tracing::warn!(path = %path.display(), "unreadable sandbox record skipped: {e}"),
                    Err(e) => tracing::warn!(path = %path.display(), "unreadable sandbox record skipped: {e}"),
                }
            }
        }
        tracing::info!(count = records.len(), dir = %dir.display(), "sandbox records loaded");
        Ok(Self {
            dir,
            state_dir,
            records: Mutex::new(records),
            handles: Mutex::default(),
            pending: Mutex::default(),
            providers: tokio::sync::Mutex::default(),
            warm_pool: 0,
            pools: tokio::sync::Mutex::default(),
        })
    }

    /// Keeps `n` sandboxes of the default configuration started per
    /// single-host tier (0: none).
    pub fn with_warm_pool(mut self, n: usize) -> Self {
        self.warm_pool = n;
        self
    }

    /// The warm pool a create of `spec` on `tier` (and docker runtime) is
    /// served from: only the default configuration is pooled, and the
    /// kubernetes tier keeps its own (SandboxWarmPool).
    pub async fn pool(
        &self,
        tier: Tier,
        runtime: Option<String>,
        spec: &SandboxSpec,
    ) -> namzu::Result<Option<Arc<namzu::pool::Pool>>> {
        if self.warm_pool == 0 || tier == Tier::Kubernetes || *spec != SandboxSpec::default() {
            return Ok(None);
        }
        let key = (tier, runtime.clone());
        if let Some(p) = self.pools.lock().await.get(&key) {
            return Ok(Some(p.clone()));
        }
        let provider = self.provider(tier, runtime.clone()).await?;
        let ledger = self
            .dir
            .join("pool")
            .join(format!("{}-{}", tier.name(), runtime.as_deref().unwrap_or("default")));
        let opts = namzu::pool::PoolOptions::default().size(self.warm_pool).ledger(ledger);
        let mut pools = self.pools.lock().await;
        let pool = pools
            .entry(key)
            .or_insert_with(|| Arc::new(namzu::pool::Pool::new(provider, SandboxSpec::default(), opts)))
            .clone();
        Ok(Some(pool))
    }

    /// Starts the warm pools of `tiers` filling.
    pub async fn warm(&self, tiers: &[Tier]) {
        for &tier in tiers {
            if let Err(e) = self.pool(tier, None, &SandboxSpec::default()).await {
                tracing::warn!(tier = tier.name(), "warm pool not started: {e}");
            }
        }
    }

    /// Destroys what the warm pools hold.
    pub async fn close_pools(&self) {
        let pools: Vec<_> = self.pools.lock().await.drain().map(|(_, p)| p).collect();
        for pool in pools {
            match Arc::try_unwrap(pool) {
                Ok(pool) => pool.close().await,
                // A create still holds it; dropping it closes it behind.
                Err(shared) => drop(shared),
            }
        }
    }

    /// The provider of `tier` (and docker runtime), built once.
    pub async fn provider(&self, tier: Tier, runtime: Option<String>) -> namzu::Result<Arc<dyn Provider>> {
        let key = (tier, runtime.clone());
        let mut map = self.providers.lock().await;
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        #[allow(unused_mut)]
        let mut opts = ProviderOptions {
            state_dir: self.state_dir.clone(),
            ..Default::default()
        };
        opts.docker.runtime = runtime;
        let p: Arc<dyn Provider> = Arc::from(namzu::factory::provider(tier, opts).await?);
        map.insert(key, p.clone());
        Ok(p)
    }

    /// Reserves a create for `owner` under `limit` live sandboxes.
    pub fn reserve(&self, owner: &str, limit: usize) -> ApiResult<Pending<'_>> {
        let owned = self
            .records
            .lock()
            .map_err(|_| poisoned())?
            .values()
            .filter(|r| r.owner == owner)
            .count();
        let mut p = self.pending.lock().map_err(|_| poisoned())?;
        let n = p.entry(owner.to_string()).or_default();
        if owned + *n >= limit {
            return Err(ApiError::limit(
                StatusCode::TOO_MANY_REQUESTS,
                "max_sandboxes_per_key",
                limit as u64,
            ));
        }
        *n += 1;
        Ok(Pending {
            reg: self,
            owner: owner.to_string(),
        })
    }

    /// Creates a sandbox and records it; `record`'s id is replaced by the
    /// new sandbox's.
    pub async fn create(&self, _pending: Pending<'_>, spec: SandboxSpec, mut record: Record) -> ApiResult<Record> {
        let sb = match self.pool(record.tier, record.runtime.clone(), &spec).await? {
            Some(pool) => pool.claim().await?,
            None => {
                self.provider(record.tier, record.runtime.clone())
                    .await?
                    .create(spec)
                    .await?
            }
        };
        record.id = sb.id().to_string();
        self.adopt(record, sb).await
    }

    /// Records a sandbox just made (by create or fork) and keeps its
    /// handle; a sandbox that cannot be recorded is destroyed.
    async fn adopt(&self, record: Record, sb: Sandbox) -> ApiResult<Record> {
        if let Err(e) = self.save(&record) {
            // Unrecorded, it would outlive the server unowned: undo.
            let _ = sb.destroy().await;
            return Err(ApiError::internal(format!("cannot record sandbox: {e}")));
        }
        self.records
            .lock()
            .map_err(|_| poisoned())?
            .insert(record.id.clone(), record.clone());
        self.handles
            .lock()
            .map_err(|_| poisoned())?
            .insert(record.id.clone(), sb);
        Ok(record)
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn save(&self, r: &Record) -> std::io::Result<()> {
        write_atomic(&self.path_of(&r.id), &serde_json::to_vec_pretty(r)?)
    }

    /// The record of `id` if `owner` owns it.
    pub fn get(&self, owner: &str, id: &str) -> ApiResult<Record> {
        self.records
            .lock()
            .map_err(|_| poisoned())?
            .get(id)
            .filter(|r| r.owner == owner)
            .cloned()
            .ok_or_else(|| ApiError::no_sandbox(id))
    }

    /// The record of `id`, whoever owns it (for calls authenticated by
    /// the sandbox's own envd token instead of an API key).
    pub fn get_any(&self, id: &str) -> Option<Record> {
        self.records.lock().ok()?.get(id).cloned()
    }

    /// Every record, for the reaper and metrics.
    pub fn all(&self) -> Vec<Record> {
        self.records
            .lock()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }

    /// `owner`'s records with every label in `labels`, after `cursor`, at
    /// most `limit`; and whether more follow.
    pub fn list(
        &self,
        owner: &str,
        labels: &[(String, String)],
        cursor: Option<&str>,
        limit: usize,
    ) -> ApiResult<(Vec<Record>, bool)> {
        let recs = self.records.lock().map_err(|_| poisoned())?;
        let mut it = recs
            .values()
            .filter(|r| r.owner == owner)
            .filter(|r| cursor.is_none_or(|c| r.id.as_str() > c))
            .filter(|r| labels.iter().all(|(k, v)| r.metadata.get(k) == Some(v)));
        let page: Vec<Record> = it.by_ref().take(limit).cloned().collect();
        let more = it.next().is_some();
        Ok((page, more))
    }

    /// The live handle of `owner`'s sandbox `id`, reconnected if this
    /// process has none.
    pub async fn sandbox(&self, owner: &str, id: &str) -> ApiResult<(Record, Sandbox)> {
        let rec = self.get(owner, id)?;
        if let Some(sb) = self.handles.lock().map_err(|_| poisoned())?.get(id).cloned() {
            return Ok((rec, sb));
        }
        let provider = self.provider(rec.tier, rec.runtime.clone()).await?;
        match provider.connect(id).await {
            Ok(sb) => {
                self.handles
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert(id.to_string(), sb.clone());
                Ok((rec, sb))
            }
            Err(e) => {
                if matches!(
                    e,
                    namzu::Error::SandboxDead { .. } | namzu::Error::SandboxNotFound { .. }
                ) {
                    self.set_state(id, "dead");
                }
                Err(e.into())
            }
        }
    }

    /// Suspends `owner`'s sandbox `id` to disk (see
    /// [`Provider::suspend`]): this process's handle is dropped and the
    /// record says `suspended` until [`Registry::resume_suspended`].
    pub async fn suspend(&self, owner: &str, id: &str) -> ApiResult<Record> {
        let rec = self.get(owner, id)?;
        if rec.state != "suspended" {
            let provider = self.provider(rec.tier, rec.runtime.clone()).await?;
            provider.suspend(id).await?;
            self.forget(id);
            self.set_state(id, "suspended");
        }
        self.get(owner, id)
    }

    /// Starts `owner`'s suspended sandbox `id` again on its disk; its
    /// handle is this process's from then on.
    pub async fn resume_suspended(&self, owner: &str, id: &str) -> ApiResult<Sandbox> {
        let rec = self.get(owner, id)?;
        let provider = self.provider(rec.tier, rec.runtime.clone()).await?;
        let sb = provider.resume(id).await?;
        self.handles
            .lock()
            .map_err(|_| poisoned())?
            .insert(id.to_string(), sb.clone());
        self.set_state(id, "running");
        Ok(sb)
    }

    /// Continues `owner`'s paused sandbox `id`: through this process's
    /// handle, or, where its tier refuses even a connect while paused (a
    /// VM paused whole by an earlier server), through its provider.
    pub async fn resume_paused(&self, owner: &str, id: &str) -> ApiResult<namzu::ResumeReport> {
        let report = match self.sandbox(owner, id).await {
            Ok((_, sb)) => sb.resume().await?,
            Err(e) if e.code == "sandbox_paused" => {
                self.resume_suspended(owner, id).await?;
                namzu::ResumeReport::default()
            }
            Err(e) => return Err(e),
        };
        self.set_state(id, "running");
        Ok(report)
    }

    /// Drops this process's handle of `id`, so the next use reconnects.
    pub fn forget(&self, id: &str) {
        if let Ok(mut h) = self.handles.lock() {
            h.remove(id);
        }
    }

    /// Records `id`'s state (`running`, `paused`, `suspended`, `dead`).
    pub fn set_state(&self, id: &str, state: &str) {
        let Ok(mut recs) = self.records.lock() else { return };
        if let Some(r) = recs.get_mut(id) {
            if r.state != state {
                r.state = state.into();
                let _ = self.save(r);
            }
        }
    }

    /// Moves `owner`'s sandbox's expiry to `timeout` from now.
    pub fn extend(&self, owner: &str, id: &str, timeout: Duration) -> ApiResult<Record> {
        let mut recs = self.records.lock().map_err(|_| poisoned())?;
        let r = recs
            .get_mut(id)
            .filter(|r| r.owner == owner)
            .ok_or_else(|| ApiError::no_sandbox(id))?;
        let mut next = r.clone();
        next.expires_at_ms = now_ms() + timeout.as_millis() as u64;
        self.save(&next)
            .map_err(|e| ApiError::internal(format!("cannot record sandbox: {e}")))?;
        *r = next.clone();
        Ok(next)
    }

    /// Destroys the sandbox of record `rec` and forgets it.
    pub async fn destroy(&self, rec: &Record) -> ApiResult<()> {
        let handle = self.handles.lock().map_err(|_| poisoned())?.remove(&rec.id);
        let result = match handle {
            Some(sb) => sb.destroy().await,
            None => match self.provider(rec.tier, rec.runtime.clone()).await {
                Ok(p) => p.destroy(&rec.id).await,
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) | Err(namzu::Error::SandboxNotFound { .. } | namzu::Error::SandboxDestroyed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.records.lock().map_err(|_| poisoned())?.remove(&rec.id);
        let _ = std::fs::remove_file(self.path_of(&rec.id));
        Ok(())
    }
}

/// Writes `data` to `path` through a temporary file renamed over it.
fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    namzu::fsutil::write_private(path, data)
}
