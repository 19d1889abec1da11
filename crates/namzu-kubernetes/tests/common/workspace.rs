//! What the workspace test binaries share: typed refusals read back,
//! options, recorders for the handle's callbacks, a payload.

use std::path::Path;
use std::sync::{Arc, Mutex};

use namzu::Error;
use namzu_k8s_sim::cluster::Cluster;
use namzu_kubernetes::api::Verb;
use namzu_kubernetes::workspace::{Flush, SuspendOptions};
use namzu_kubernetes::{KubernetesError, KubernetesProvider, WorkspaceError, WorkspaceOptions};

use super::{calls, provider};

pub fn ws_error(e: Error) -> WorkspaceError {
    match e.into_tier_error::<KubernetesError>() {
        Ok(KubernetesError::Workspace(w)) => *w,
        other => panic!("not a workspace error: {other:?}"),
    }
}

/// File `path` of a running workspace.
pub async fn read(ws: &namzu_kubernetes::KubernetesWorkspace, path: &str) -> Vec<u8> {
    let sb = ws.sandbox().await.unwrap();
    sb.files().read(Path::new(path)).await.unwrap().to_vec()
}

/// The calls `p` made after its first `before` that write (not get or list).
pub fn writes_since(p: &namzu_kubernetes::KubernetesProvider, before: usize) -> Vec<(String, Verb)> {
    calls(p)[before..]
        .iter()
        .filter(|(_, v)| !matches!(v, Verb::Get | Verb::List))
        .cloned()
        .collect()
}

/// Starts, in its own session, a process that ignores SIGTERM: a stopping
/// agent waits its shutdown grace (5 s) for it before the SIGKILL.
pub async fn start_stubborn(ws: &namzu_kubernetes::KubernetesWorkspace) {
    let sb = ws.sandbox().await.unwrap();
    let cmd = "setsid sh -c 'trap \"\" TERM; sleep 100' >/dev/null 2>&1 </dev/null & echo started";
    let out = sb.commands().run(cmd).await.unwrap();
    assert_eq!(&out.stdout[..], b"started\n");
}

/// The (field, expected, actual) of a `Mismatch` refusal.
pub fn mismatch(e: Error) -> (String, String, Option<String>) {
    match ws_error(e) {
        WorkspaceError::Mismatch {
            field,
            expected,
            actual,
            ..
        } => (field, expected, actual),
        other => panic!("{other:?}"),
    }
}

/// Opened under holder epoch `e`.
pub fn at(e: u64) -> WorkspaceOptions {
    WorkspaceOptions {
        epoch: Some(e),
        ..Default::default()
    }
}

pub fn skip() -> SuspendOptions {
    SuspendOptions {
        flush: Flush::Skip,
        ..Default::default()
    }
}

/// Bytes no text round trip would keep: every byte value, and more.
pub fn payload() -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// A provider whose link notices a silent pod within a second (an
/// evicted or restarted pod says nothing; the keepalive finds out).
pub fn keepalive_provider(c: &Cluster) -> KubernetesProvider {
    provider(c, c.options(false)).with_client_options(namzu::ClientOptions {
        keepalive: std::time::Duration::from_secs(1),
        ..Default::default()
    })
}

/// What a callback was told, and the callback that records it.
#[allow(clippy::type_complexity)]
pub fn recorder<T: Clone + Send + 'static>() -> (Arc<Mutex<Vec<T>>>, Arc<dyn Fn(&T) + Send + Sync>) {
    let told: Arc<Mutex<Vec<T>>> = Arc::default();
    let seen = told.clone();
    (told, Arc::new(move |t: &T| seen.lock().unwrap().push(t.clone())))
}

/// Runs `cmd` until the guest answers (within 30 s): a call after the
/// guest moved fails until the link has reached where it went.
pub async fn run_once_reached(sb: &namzu::Sandbox, cmd: &str) -> namzu::ExecOutput {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match sb.commands().run(cmd).await {
            Ok(out) => return out,
            Err(e) => assert!(std::time::Instant::now() < deadline, "never reached the guest: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
