//! Files: streamed download (HTTP `Range` honoured) and upload (streamed
//! into the agent's atomic write, never held whole here), list, walk,
//! stat, mkdir, remove, rename.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};
use namzu::{ByteRange, FileKind, WalkOptions, WriteOptions};

use super::model::{
    FileView, MkdirBody, PathQuery, RemoveQuery, RenameBody, UploadQuery, WalkQuery, WatchEventView, WatchQuery,
    Written,
};
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::{check_id, AppState, Json, Owner, Query};

/// A `Range` header's single range against a file of `size` bytes:
/// `Ok(None)` to send it whole (no header, or one we do not serve
/// partially: several ranges, another unit), `Err` when unsatisfiable.
pub(crate) fn parse_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(h) = header else { return Ok(None) };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        // Suffix: the last N bytes.
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        (size.saturating_sub(n), size.saturating_sub(1))
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            size.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(size.saturating_sub(1))
        };
        (start, end)
    };
    if start >= size || end < start {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// Download a file, streamed; a single `Range` is answered with 206.
#[utoipa::path(get, operation_id = "downloadFile", path = "/v1/sandboxes/{id}/files/content", tag = "files", params(("id" = String, Path), PathQuery),
    responses((status = 200, description = "the file", content_type = "application/octet-stream"),
              (status = 206, description = "the range asked for"), (status = 416, description = "unsatisfiable range"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn download(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<PathQuery>,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let info = sb.files().stat(&q.path).await?;
    if info.kind != FileKind::File {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_a_regular_file",
            format!("{} is not a regular file", q.path),
        )
        .field("path"));
    }
    let size = info.size;
    let range = headers.get(http::header::RANGE).and_then(|v| v.to_str().ok());
    let (status, start, len) = match parse_range(range, size) {
        Ok(None) => (StatusCode::OK, 0, size),
        Ok(Some((a, b))) => (StatusCode::PARTIAL_CONTENT, a, b - a + 1),
        Err(()) => {
            return Ok((
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(http::header::CONTENT_RANGE, format!("bytes */{size}"))],
                axum::Json(
                    ApiError::new(
                        StatusCode::RANGE_NOT_SATISFIABLE,
                        "range_not_satisfiable",
                        format!("the file has {size} bytes"),
                    )
                    .field("range")
                    .body(),
                ),
            )
                .into_response())
        }
    };
    let slot = st.stream_slot(&owner)?;
    let stream = sb
        .files()
        .stream_range(
            &q.path,
            ByteRange {
                offset: start,
                length: Some(len),
            },
        )
        .await?;
    let metrics_state = st.clone();
    let body = Body::from_stream(stream.map(move |r| {
        let _hold = &slot;
        match r {
            Ok(b) => {
                metrics_state.metrics.moved("download", b.len() as u64);
                Ok(b)
            }
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }));
    let mut resp = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .header(http::header::ACCEPT_RANGES, "bytes")
        .header(http::header::CONTENT_LENGTH, len);
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(
            http::header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", start + len - 1),
        );
    }
    resp.body(body).map_err(ApiError::internal)
}

/// Upload a file, streamed into an atomic write: the file appears whole
/// when the body ends, and a body that breaks off (or passes
/// `max_upload_bytes`) leaves the old file and no temporary behind.
#[utoipa::path(put, operation_id = "uploadFile", path = "/v1/sandboxes/{id}/files/content", tag = "files", params(("id" = String, Path), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = Written), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, description = "max_upload_bytes", body = ErrorBody)))]
pub async fn upload(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<UploadQuery>,
    req: Request,
) -> ApiResult<axum::Json<Written>> {
    check_id("id", &id)?;
    let max = st.config.limits.max_upload_bytes;
    let too_large = || ApiError::limit(StatusCode::PAYLOAD_TOO_LARGE, "max_upload_bytes", max);
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mut opts = WriteOptions::default().create_parents(q.create_parents);
    if let Some(m) = &q.mode {
        let mode = u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| ApiError::invalid("mode", "mode is octal permission bits, e.g. 644"))?;
        opts = opts.mode(mode);
    }
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = st.stream_slot(&owner)?;
    let over = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let (over2, seen2, st2) = (over.clone(), seen.clone(), st.clone());
    let body = req
        .into_body()
        .into_data_stream()
        .map_err(std::io::Error::other)
        .and_then(move |b| {
            let total = seen2.fetch_add(b.len() as u64, Ordering::Relaxed) + b.len() as u64;
            st2.metrics.moved("upload", b.len() as u64);
            let r = if total > max {
                over2.store(true, Ordering::Relaxed);
                Err(std::io::Error::other("max_upload_bytes"))
            } else {
                Ok(b)
            };
            futures::future::ready(r)
        });
    let reader = tokio_util::io::StreamReader::new(body);
    let r = sb.files().write_from(&q.path, reader, opts).await;
    drop(slot);
    match r {
        Ok(bytes) => Ok(axum::Json(Written { bytes })),
        Err(_) if over.load(Ordering::Relaxed) => Err(too_large()),
        Err(namzu::Error::LocalIo { source, .. }) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "upload_interrupted",
            format!(
                "the body broke off after {} bytes ({source}); the old file is kept",
                seen.load(Ordering::Relaxed)
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The entries of a directory.
#[utoipa::path(get, operation_id = "listDirectory", path = "/v1/sandboxes/{id}/files/list", tag = "files", params(("id" = String, Path), PathQuery),
    responses((status = 200, body = [FileView]), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<axum::Json<Vec<FileView>>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    Ok(axum::Json(
        sb.files().list(&q.path).await?.iter().map(FileView::from).collect(),
    ))
}

/// Every entry beneath a directory, depth-first.
#[utoipa::path(get, operation_id = "walkDirectory", path = "/v1/sandboxes/{id}/files/walk", tag = "files", params(("id" = String, Path), WalkQuery),
    responses((status = 200, body = [FileView]), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 422, description = "more than max_entries", body = ErrorBody)))]
pub async fn walk(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<WalkQuery>,
) -> ApiResult<axum::Json<Vec<FileView>>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let mut opts = WalkOptions::default().include_hidden(q.include_hidden);
    if let Some(d) = q.max_depth {
        opts = opts.max_depth(d);
    }
    if let Some(n) = q.max_entries {
        opts = opts.max_entries(n);
    }
    let entries: Vec<namzu::FileInfo> = sb.files().walk(&q.path, opts).await?.try_collect().await?;
    Ok(axum::Json(entries.iter().map(FileView::from).collect()))
}

/// Changes under a directory as they happen, one NDJSON line each (the
/// first, `started`, once the watches are in place), until the client
/// goes away.
#[utoipa::path(get, operation_id = "watchDirectory", path = "/v1/sandboxes/{id}/files/watch", tag = "files", params(("id" = String, Path), WatchQuery),
    responses((status = 200, description = "the events, one per line", content((WatchEventView = "application/x-ndjson"))),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn watch(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> ApiResult<Response> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    let slot = st.stream_slot(&owner)?;
    let events = sb.files().watch(&q.path, q.recursive).await?;
    let line = |v: &WatchEventView| bytes::Bytes::from(serde_json::to_string(v).unwrap_or_default() + "\n");
    let started = line(&WatchEventView {
        kind: "started".into(),
        name: String::new(),
        is_dir: true,
    });
    let shutdown = st.shutdown.clone();
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(started) })
        .chain(events.map(move |r| {
            let _hold = &slot;
            match r {
                Ok(e) => Ok(line(&WatchEventView {
                    kind: e.kind.name().into(),
                    name: e.name.to_string_lossy().into_owned(),
                    is_dir: e.is_dir,
                })),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            }
        }))
        .take_until(async move { shutdown.cancelled().await });
    Ok((
        [(http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

/// What is at a path (a symlink itself, not its target).
#[utoipa::path(get, operation_id = "statFile", path = "/v1/sandboxes/{id}/files/stat", tag = "files", params(("id" = String, Path), PathQuery),
    responses((status = 200, body = FileView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn stat(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<axum::Json<FileView>> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    Ok(axum::Json(FileView::from(&sb.files().stat(&q.path).await?)))
}

/// Create a directory.
#[utoipa::path(post, operation_id = "makeDirectory", path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", params(("id" = String, Path)), request_body = MkdirBody,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn mkdir(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(b): Json<MkdirBody>,
) -> ApiResult<StatusCode> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    if b.parents {
        sb.files().mkdir_all(&b.path).await?;
    } else {
        sb.files().mkdir(&b.path).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a file, a symlink or an empty directory; with `recursive`, a
/// whole tree.
#[utoipa::path(delete, operation_id = "removeFile", path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path), RemoveQuery),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn remove(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> ApiResult<StatusCode> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    if q.recursive {
        sb.files().remove_all(&q.path).await?;
    } else {
        sb.files().remove(&q.path).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Rename, replacing the destination atomically.
#[utoipa::path(post, operation_id = "renameFile", path = "/v1/sandboxes/{id}/files/rename", tag = "files", params(("id" = String, Path)), request_body = RenameBody,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn rename(
    State(st): State<AppState>,
    Owner(owner): Owner,
    Path(id): Path<String>,
    Json(b): Json<RenameBody>,
) -> ApiResult<StatusCode> {
    check_id("id", &id)?;
    let (_, sb) = st.registry.sandbox(&owner, &id).await?;
    sb.files().rename(&b.from, &b.to).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some((0, 3))));
        assert_eq!(parse_range(Some("bytes=4-"), 10), Ok(Some((4, 9))));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Ok(Some((0, 9))));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), Ok(Some((5, 9))));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=0-0"), 0), Err(()));
        assert_eq!(parse_range(Some("bytes=5-2"), 10), Err(()));
        assert_eq!(
            parse_range(Some("bytes=0-1,4-5"), 10),
            Ok(None),
            "several ranges: the whole file"
        );
        assert_eq!(parse_range(Some("items=0-1"), 10), Ok(None));
    }
}
