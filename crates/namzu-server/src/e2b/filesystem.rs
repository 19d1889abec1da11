//! envd's `filesystem.Filesystem` (Stat, MakeDir, Move, ListDir, Remove)
//! and its plain-HTTP `/files` (download; upload as multipart/form-data or
//! octet-stream, streamed into namzu's atomic write), and watching on the
//! agent's inotify feature: WatchDir streams; CreateWatcher keeps a
//! bounded buffer that GetWatcherEvents drains (the sync SDK polls).

use std::sync::{Arc, Mutex};

use axum::extract::{Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use namzu::{FileInfo, FileKind, Sandbox, WalkOptions, WriteOptions};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, ConnectError};
use super::control::E2bError;
use super::shared::{new_token, EnvdTarget, Watcher, WATCHER_BUFFER};
use crate::state::AppState;

fn entry(f: &FileInfo) -> Value {
    let ty = match f.kind {
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let secs = f
        .mtime
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut v = json!({
        "name": f.name.to_string_lossy(),
        "type": ty,
        "path": f.path.to_string_lossy(),
        "size": f.size.to_string(),
        "mode": f.mode & 0o7777,
        "permissions": permissions(f),
        "owner": "user",
        "group": "user",
        "modifiedTime": super::control::iso_secs(secs),
    });
    if let Some(t) = &f.symlink_target {
        v["symlinkTarget"] = json!(t.to_string_lossy());
    }
    v
}

fn permissions(f: &FileInfo) -> String {
    let kind = match f.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (f.mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn fs_event(e: &namzu::WatchEvent) -> Option<Value> {
    let ty = match e.kind {
        namzu::WatchKind::Create => "EVENT_TYPE_CREATE",
        namzu::WatchKind::Write => "EVENT_TYPE_WRITE",
        namzu::WatchKind::Remove => "EVENT_TYPE_REMOVE",
        namzu::WatchKind::Rename => "EVENT_TYPE_RENAME",
        namzu::WatchKind::Chmod => "EVENT_TYPE_CHMOD",
        namzu::WatchKind::Overflow => return None,
    };
    Some(json!({"name": e.name.to_string_lossy(), "type": ty}))
}

/// WatchDir: a server stream of `start`, then `filesystem` events (and
/// keepalives when asked), until the client goes away.
async fn watch_dir(st: AppState, t: EnvdTarget, headers: HeaderMap, body: Bytes) -> Result<Response, ConnectError> {
    let req: PathReq = connect::request(&headers, &body)?;
    let sb = sandbox(&st, &t).await?;
    let mut events = sb.files().watch(&req.path, req.recursive).await?;
    let every = connect::keepalive(&headers);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        // WatchDirResponse's oneof sits at its top level in proto3 JSON.
        if tx.send(connect::envelope(0, &json!({"start": {}}))).await.is_err() {
            return;
        }
        loop {
            let tick = connect::tick(every);
            let msg = tokio::select! {
                _ = tx.closed() => return,
                _ = st.shutdown.cancelled() => {
                    let _ = tx.send(ConnectError::new("unavailable", "the server is shutting down").end_stream()).await;
                    return;
                }
                _ = tick => json!({"keepalive": {}}),
                ev = events.next() => match ev {
                    None => { let _ = tx.send(connect::end_ok()).await; return; }
                    Some(Err(e)) => { let _ = tx.send(ConnectError::from(e).end_stream()).await; return; }
                    Some(Ok(e)) => match fs_event(&e) {
                        Some(v) => json!({"filesystem": v}),
                        None => continue,
                    },
                },
            };
            if tx.send(connect::envelope(0, &msg)).await.is_err() {
                return;
            }
        }
    });
    Ok(connect::stream_response(rx))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PathReq {
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    watcher_id: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

async fn sandbox(st: &AppState, t: &EnvdTarget) -> Result<Sandbox, ConnectError> {
    Ok(st.envd_sandbox(t).await?)
}

/// Every `filesystem.Filesystem` method.
pub async fn call(
    State(st): State<AppState>,
    Extension(t): Extension<EnvdTarget>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    if method == "WatchDir" {
        return watch_dir(st, t, headers, body)
            .await
            .unwrap_or_else(connect::stream_error);
    }
    let r = async {
        let req: PathReq = connect::request(&headers, &body)?;
        let sb = sandbox(&st, &t).await?;
        let files = sb.files();
        match method.as_str() {
            "Stat" => Ok(json!({"entry": entry(&files.stat(&req.path).await?)})),
            "MakeDir" => {
                if files.stat(&req.path).await.is_ok() {
                    return Err(ConnectError::new("already_exists", format!("{} exists", req.path)));
                }
                files.mkdir_all(&req.path).await?;
                Ok(json!({"entry": entry(&files.stat(&req.path).await?)}))
            }
            "Move" => {
                files.rename(&req.source, &req.destination).await?;
                Ok(json!({"entry": entry(&files.stat(&req.destination).await?)}))
            }
            "ListDir" => {
                let root = files.stat(&req.path).await?;
                if root.kind != FileKind::Dir {
                    return Err(ConnectError::new(
                        "invalid_argument",
                        format!("{} is not a directory", req.path),
                    ));
                }
                let opts = WalkOptions::default()
                    .include_hidden(true)
                    .max_depth(req.depth.unwrap_or(1).max(1));
                let entries: Vec<FileInfo> = files.walk(&req.path, opts).await?.try_collect().await?;
                Ok(json!({"entries": entries.iter().map(entry).collect::<Vec<_>>()}))
            }
            "Remove" => {
                files.remove_all(&req.path).await?;
                Ok(json!({}))
            }
            "CreateWatcher" => {
                let mut events = files.watch(&req.path, req.recursive).await?;
                let buf: Arc<Mutex<std::collections::VecDeque<Value>>> = Arc::default();
                let sink = buf.clone();
                let task = tokio::spawn(async move {
                    while let Some(Ok(e)) = events.next().await {
                        if let (Some(v), Ok(mut q)) = (fs_event(&e), sink.lock()) {
                            if q.len() == WATCHER_BUFFER {
                                q.pop_front();
                            }
                            q.push_back(v);
                        }
                    }
                });
                let id = new_token();
                let w = Watcher {
                    sandbox: t.0.id.clone(),
                    events: buf,
                    task,
                };
                st.e2b_watchers
                    .0
                    .lock()
                    .map_err(|_| ConnectError::new("internal", "poisoned"))?
                    .insert(id.clone(), w);
                Ok(json!({"watcherId": id}))
            }
            "GetWatcherEvents" | "RemoveWatcher" => {
                let mut map = st
                    .e2b_watchers
                    .0
                    .lock()
                    .map_err(|_| ConnectError::new("internal", "poisoned"))?;
                let unknown = || ConnectError::new("not_found", format!("watcher {:?} not found", req.watcher_id));
                if map.get(&req.watcher_id).is_none_or(|w| w.sandbox != t.0.id) {
                    return Err(unknown());
                }
                if method == "RemoveWatcher" {
                    map.remove(&req.watcher_id);
                    return Ok(json!({}));
                }
                let w = map.get(&req.watcher_id).ok_or_else(unknown)?;
                let events: Vec<Value> = w.events.lock().map(|mut q| q.drain(..).collect()).unwrap_or_default();
                Ok(json!({"events": events}))
            }
            other => Err(ConnectError::new(
                "unimplemented",
                format!("filesystem.Filesystem/{other}"),
            )),
        }
    }
    .await;
    match (r, streaming) {
        (Ok(v), _) => axum::Json(v).into_response(),
        (Err(e), true) => connect::stream_error(e),
        (Err(e), false) => e.into_response(),
    }
}

/// `/files` query.
#[derive(Debug, Deserialize)]
pub struct FilesQuery {
    path: Option<String>,
    #[allow(dead_code)]
    username: Option<String>,
}

fn plain(e: namzu::Error) -> E2bError {
    E2bError::from(e)
}

/// `GET /files?path=`: the file's bytes, streamed.
pub async fn download(
    State(st): State<AppState>,
    Extension(t): Extension<EnvdTarget>,
    Query(q): Query<FilesQuery>,
) -> Result<Response, E2bError> {
    let path = q
        .path
        .ok_or_else(|| E2bError(StatusCode::BAD_REQUEST, "path is required".into()))?;
    let sb = st.envd_sandbox(&t).await.map_err(E2bError::from)?;
    let info = sb.files().stat(&path).await.map_err(plain)?;
    if info.kind == FileKind::Dir {
        return Err(E2bError(StatusCode::BAD_REQUEST, format!("{path} is a directory")));
    }
    let stream = sb.files().stream(&path).await.map_err(plain)?;
    let m = st.clone();
    let body = axum::body::Body::from_stream(stream.map(move |r| {
        r.inspect(|b| m.metrics.moved("download", b.len() as u64))
            .map_err(|e| std::io::Error::other(e.to_string()))
    }));
    Ok((
        [
            (http::header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (http::header::CONTENT_LENGTH, info.size.to_string()),
        ],
        body,
    )
        .into_response())
}

async fn write_stream<S>(st: &AppState, sb: &Sandbox, path: &str, s: S) -> Result<Value, E2bError>
where
    S: futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let max = st.config.limits.max_upload_bytes;
    let m = st.clone();
    let mut seen = 0u64;
    let counted = s.and_then(move |b| {
        seen += b.len() as u64;
        m.metrics.moved("upload", b.len() as u64);
        futures::future::ready(if seen > max {
            Err(std::io::Error::other("max_upload_bytes"))
        } else {
            Ok(b)
        })
    });
    let reader = tokio_util::io::StreamReader::new(Box::pin(counted));
    sb.files()
        .write_from(path, reader, WriteOptions::default().create_parents(true))
        .await
        .map_err(plain)?;
    let name = std::path::Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(json!({"name": name, "type": "file", "path": path}))
}

/// `POST /files`: multipart (field `file`, its filename the target path,
/// or `?path=` for one file) or octet-stream with `?path=`.
pub async fn upload(
    State(st): State<AppState>,
    Extension(t): Extension<EnvdTarget>,
    Query(q): Query<FilesQuery>,
    req: Request,
) -> Result<Response, E2bError> {
    let sb = st.envd_sandbox(&t).await.map_err(E2bError::from)?;
    let slot = st.stream_slot(&t.0.owner).map_err(E2bError::from)?;
    let ct = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        let mut mp = <Multipart as axum::extract::FromRequest<AppState>>::from_request(req, &st)
            .await
            .map_err(|e| E2bError(StatusCode::BAD_REQUEST, e.body_text()))?;
        while let Some(field) = mp
            .next_field()
            .await
            .map_err(|e| E2bError(StatusCode::BAD_REQUEST, e.body_text()))?
        {
            let target = match (field.file_name(), &q.path) {
                (_, Some(p)) if written.is_empty() => p.clone(),
                (Some(f), _) => f.to_string(),
                _ => {
                    return Err(E2bError(
                        StatusCode::BAD_REQUEST,
                        "a file field without a filename".into(),
                    ))
                }
            };
            // A field borrows the multipart reader: copy it through a pipe so
            // the write streams without holding the whole file.
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
            let rx_stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
            let st2 = st.clone();
            let sb2 = sb.clone();
            let target2 = target.clone();
            let writer = tokio::spawn(async move { write_stream(&st2, &sb2, &target2, rx_stream).await });
            let mut field = field;
            loop {
                match field.chunk().await {
                    Ok(Some(b)) => {
                        if tx.send(Ok(b)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        break;
                    }
                }
            }
            drop(tx);
            let w = writer
                .await
                .map_err(|e| E2bError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
            written.push(w);
        }
    } else {
        let path = q
            .path
            .clone()
            .ok_or_else(|| E2bError(StatusCode::BAD_REQUEST, "path is required".into()))?;
        let body = req.into_body().into_data_stream().map_err(std::io::Error::other);
        written.push(write_stream(&st, &sb, &path, body).await?);
    }
    drop(slot);
    if written.is_empty() {
        return Err(E2bError(StatusCode::BAD_REQUEST, "no file in the request".into()));
    }
    Ok(axum::Json(written).into_response())
}
