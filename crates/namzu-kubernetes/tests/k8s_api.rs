//! The Kubernetes API layer against a real HTTP server (an axum app that
//! answers as an API server would, per path): every status maps to its
//! typed error, `Retry-After` is read, a request past the bound is a
//! `Timeout` naming verb, path and bound, the bearer token is sent and never
//! appears in an error, and every call is recorded as (group, resource,
//! verb).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use namzu_kubernetes::api::{Api, ApiError, Call, Resource, Verb};
use namzu_kubernetes::crd::{Sandbox, SandboxClaim};

const TOKEN: &str = "s3cr3t-token-value";

/// Answers by the last path segment; remembers the Authorization headers.
async fn serve() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap, uri: axum::http::Uri| {
        let log = log.clone();
        async move {
            if let Some(a) = headers.get("authorization") {
                log.lock().unwrap().push(a.to_str().unwrap_or_default().to_owned());
            }
            let last = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
            let json = |s: StatusCode, body: &str| {
                (s, [("content-type", "application/json")], body.to_owned()).into_response()
            };
            match last.as_str() {
                "forbidden" => json(StatusCode::FORBIDDEN, r#"{"message":"sandboxclaims is forbidden"}"#),
                "unauthorized" => json(StatusCode::UNAUTHORIZED, r#"{"message":"Unauthorized"}"#),
                "gone" => json(StatusCode::NOT_FOUND, r#"{"message":"not found"}"#),
                "expired" => json(StatusCode::GONE, r#"{"message":"gone"}"#),
                "taken" => json(StatusCode::CONFLICT, r#"{"message":"already exists"}"#),
                "busy" => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "3")], "slow down").into_response(),
                "broken" => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"message":"etcd unavailable"}"#),
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    json(StatusCode::OK, "{}")
                }
                _ => json(
                    StatusCode::OK,
                    &format!(
                        r#"{{"kind":"Echo","path":"{}","query":"{}"}}"#,
                        uri.path(),
                        uri.query().unwrap_or_default()
                    ),
                ),
            }
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

fn api(url: &str, bound: Duration) -> Api {
    let mut config = kube::Config::new(url.parse().unwrap());
    config.auth_info.token = Some(TOKEN.to_owned().into());
    Api::new(kube::Client::try_from(config).unwrap(), bound).unwrap()
}

#[tokio::test]
async fn statuses_map_to_typed_errors_and_calls_are_recorded() {
    let (url, seen) = serve().await;
    let a = api(&url, Duration::from_secs(2));
    let claims = Resource::of::<SandboxClaim>("ns");
    let pods = Resource::core("pods", "ns");

    let ok = a.get(&claims, "c1").await.unwrap();
    assert_eq!(
        ok["path"],
        "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims/c1"
    );
    let listed = a.list(&pods, Some("io.namzu/sandbox=sb-1,app!=x")).await.unwrap();
    assert_eq!(listed["query"], "labelSelector=io.namzu%2Fsandbox%3Dsb-1%2Capp%21%3Dx");
    let made = a
        .create(&Resource::of::<Sandbox>("ns"), &serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(made["path"], "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes");

    type Is = fn(&ApiError) -> bool;
    let cases: Vec<(ApiError, Is)> = vec![
        (
            a.get(&claims, "forbidden").await.unwrap_err(),
            |e| matches!(e, ApiError::Credential { status: 403, verb: Verb::Get, message, .. } if message.contains("forbidden")),
        ),
        (a.delete(&claims, "unauthorized").await.unwrap_err(), |e| {
            matches!(
                e,
                ApiError::Credential {
                    status: 401,
                    verb: Verb::Delete,
                    ..
                }
            )
        }),
        (a.get(&claims, "gone").await.unwrap_err(), |e| {
            matches!(e, ApiError::AlreadyGone { status: 404, .. })
        }),
        (
            a.merge_patch(&claims, "expired", &serde_json::json!({}))
                .await
                .unwrap_err(),
            |e| {
                matches!(
                    e,
                    ApiError::AlreadyGone {
                        status: 410,
                        verb: Verb::Patch,
                        ..
                    }
                )
            },
        ),
        (
            a.get(&claims, "taken").await.unwrap_err(),
            |e| matches!(e, ApiError::Conflict { message, .. } if message == "already exists"),
        ),
        (a.get(&claims, "busy").await.unwrap_err(), |e| {
            matches!(e, ApiError::Api { status: Some(429), retry_after: Some(d), transport: false, .. } if *d == Duration::from_secs(3))
                && e.is_transient()
        }),
        (a.get(&claims, "broken").await.unwrap_err(), |e| {
            matches!(e, ApiError::Api { status: Some(503), message, .. } if message == "etcd unavailable")
                && e.is_transient()
        }),
    ];
    for (i, (e, ok)) in cases.iter().enumerate() {
        assert!(ok(e), "case {i}: {e:?}");
        assert!(!format!("{e} {e:?}").contains(TOKEN), "case {i} leaks the token: {e:?}");
    }
    // The token went to the server on every call.
    assert!(seen.lock().unwrap().iter().all(|h| h == &format!("Bearer {TOKEN}")));
    assert!(!seen.lock().unwrap().is_empty());

    let calls = a.calls();
    let c = |group: &str, resource: &str, verb| Call {
        group: group.into(),
        resource: resource.into(),
        verb,
    };
    let ext = "extensions.agents.x-k8s.io";
    assert_eq!(
        calls,
        vec![
            c(ext, "sandboxclaims", Verb::Get),
            c("", "pods", Verb::List),
            c("agents.x-k8s.io", "sandboxes", Verb::Create),
            c(ext, "sandboxclaims", Verb::Get),
            c(ext, "sandboxclaims", Verb::Delete),
            c(ext, "sandboxclaims", Verb::Get),
            c(ext, "sandboxclaims", Verb::Patch),
            c(ext, "sandboxclaims", Verb::Get),
            c(ext, "sandboxclaims", Verb::Get),
            c(ext, "sandboxclaims", Verb::Get),
        ]
    );
}

#[tokio::test]
async fn a_request_past_the_bound_is_a_typed_timeout_and_no_server_is_transport() {
    let (url, _) = serve().await;
    let a = api(&url, Duration::from_secs(1));
    let claims = Resource::of::<SandboxClaim>("ns");
    let e = a.get(&claims, "slow").await.unwrap_err();
    assert_eq!(
        e,
        ApiError::Timeout {
            verb: Verb::Get,
            path: "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims/slow".into(),
            bound: Duration::from_secs(1),
        }
    );
    assert!(e.is_transient());
    // Nothing listens on this port.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let a = api(&format!("http://{dead}"), Duration::from_secs(2));
    let e = a.get(&claims, "c1").await.unwrap_err();
    assert!(
        matches!(
            e,
            ApiError::Api {
                status: None,
                transport: true,
                ..
            }
        ) && e.is_transient(),
        "{e:?}"
    );
    assert!(!format!("{e} {e:?}").contains(TOKEN), "{e:?}");
}

#[test]
fn bounds_below_one_second_are_refused() {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let client = kube::Client::try_from(config).unwrap();
    for bound in [Duration::ZERO, Duration::from_millis(999)] {
        match Api::new(client.clone(), bound) {
            Err(namzu::Error::OptionRefused { option, .. }) => assert_eq!(option, "api_request_timeout"),
            other => panic!("{bound:?}: {:?}", other.map(|_| ())),
        }
    }
    assert!(Api::new(client, Duration::from_secs(1)).is_ok());
}
