//! Snapshots of running sandboxes and sandboxes forked from them (the
//! microvm tier; every other tier answers 422 `option_refused`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::model::SandboxView;
use crate::error::{ApiResult, ErrorBody};
use crate::state::{check_id, AppState, Json, Owner};

/// A saved snapshot: memory, devices and disk of a sandbox at one instant.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotView {
    /// The snapshot's id.
    pub id: String,
    /// The sandbox it was taken of.
    pub source: String,
    /// The tier that keeps it.
    pub tier: String,
    /// When it was taken, Unix ms.
    pub created_at_ms: u64,
    /// Bytes of its saved memory and device state.
    pub memory_bytes: u64,
    /// Bytes its disk takes on the host.
    pub disk_bytes: u64,
}

impl From<namzu::SnapshotInfo> for SnapshotView {
    fn from(s: namzu::SnapshotInfo) -> Self {
        Self {
            id: s.id,
            source: s.source,
            tier: s.tier.name().into(),
            created_at_ms: s.created_unix * 1000,
            memory_bytes: s.memory_bytes,
            disk_bytes: s.disk_bytes,
        }
    }
}

/// The caller's snapshots.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    /// Oldest first.
    pub snapshots: Vec<SnapshotView>,
}

/// How a fork starts.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Its timeout, in seconds; default: the source's.
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// Save a running sandbox as a snapshot (its memory, devices and disk at
/// one instant); the sandbox runs on. microvm only (422
/// `option_refused` elsewhere).
#[utoipa::path(post, operation_id = "snapshot", path = "/v1/sandboxes/{id}/snapshot", tag = "snapshots", params(("id" = String, Path)),
    responses((status = 201, body = SnapshotView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    check_id("id", &id)?;
    let info = st.registry.snapshot(&owner, &id).await?;
    tracing::info!(%id, snapshot = %info.id, "snapshot taken");
    Ok((StatusCode::CREATED, axum::Json(SnapshotView::from(info))))
}

/// List the caller's snapshots.
#[utoipa::path(get, operation_id = "listSnapshots", path = "/v1/snapshots", tag = "snapshots",
    responses((status = 200, body = SnapshotList)))]
pub async fn list(State(st): State<AppState>, Owner(owner): Owner) -> ApiResult<axum::Json<SnapshotList>> {
    let snapshots = st.registry.snapshots(&owner).await?;
    Ok(axum::Json(SnapshotList {
        snapshots: snapshots.into_iter().map(SnapshotView::from).collect(),
    }))
}

/// Start a sandbox from a snapshot: its processes go on from the
/// snapshot's instant, on a copy-on-write disk of its own, under a new id
/// and token; the source's labels and timeout policy.
#[utoipa::path(post, operation_id = "fork", path = "/v1/snapshots/{snapshot}/fork", tag = "snapshots", params(("snapshot" = String, Path)),
    request_body = ForkRequest,
    responses((status = 201, body = SandboxView), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn fork(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(snapshot): Path<String>,
    body: Option<Json<ForkRequest>>,
) -> ApiResult<impl IntoResponse> {
    check_id("snapshot", &snapshot)?;
    let req = body.map(|Json(r)| r).unwrap_or_default();
    let timeout = match req.timeout_s {
        Some(s) => Some(super::sandboxes::timeout_of(&st, Some(s))?.as_millis() as u64),
        None => None,
    };
    let pending = st.registry.reserve(&owner, st.config.limits.max_sandboxes_per_key)?;
    let r = st.registry.fork(pending, &owner, &snapshot, timeout).await?;
    tracing::info!(id = %r.id, %snapshot, owner = %r.owner, "sandbox forked");
    Ok((StatusCode::CREATED, axum::Json(SandboxView::from(&r))))
}

/// Remove a snapshot (409 `snapshot_in_use` while sandboxes forked from
/// it run).
#[utoipa::path(delete, operation_id = "deleteSnapshot", path = "/v1/snapshots/{snapshot}", tag = "snapshots", params(("snapshot" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(snapshot): Path<String>,
) -> ApiResult<StatusCode> {
    check_id("snapshot", &snapshot)?;
    st.registry.delete_snapshot(&owner, &snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}
