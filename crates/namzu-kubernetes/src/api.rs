//! The one typed layer every Kubernetes API call goes through: a path built
//! from (group, version, resource, namespace, name), a bound on every
//! request (`api_request_timeout`), a typed error a host can act on, and a
//! record of (group, resource, verb) for each call — which is how the RBAC
//! the backend needs is proven from what it does rather than from its text.
//!
//! Built on `kube::Client::send`, so authentication and TLS are kube's
//! (kubeconfig, in-cluster service account); the status, the body and the
//! `Retry-After` header are read here, where they are not lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use super::crd::{Kind, VERSION};

/// An RBAC verb, as Roles spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// POST.
    Create,
    /// PATCH (merge).
    Patch,
    /// DELETE.
    Delete,
}

impl Verb {
    /// The verb as RBAC names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Create => "create",
            Self::Patch => "patch",
            Self::Delete => "delete",
        }
    }

    fn method(self) -> http::Method {
        match self {
            Self::Get | Self::List => http::Method::GET,
            Self::Create => http::Method::POST,
            Self::Patch => http::Method::PATCH,
            Self::Delete => http::Method::DELETE,
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One call, as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    /// `""` for the core group.
    pub group: String,
    /// The resource, as `group/plural`.
    pub resource: String,
    /// The verb.
    pub verb: Verb,
}

/// A failed call, typed by what the caller can do about it. Never carries
/// the credentials: only the verb, the path and what the server said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer within (api_request_timeout).
    #[error("{verb} {path}: no answer within {bound:?} (api_request_timeout)")]
    Timeout {
        /// The request verb.
        verb: Verb,
        /// The request path.
        path: String,
        /// The bound it ran past.
        bound: Duration,
    },
    /// The credentials were refused.
    #[error("{verb} {path}: {status}: the credentials were refused: {message}")]
    Credential {
        /// The request verb.
        verb: Verb,
        /// The request path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// What went wrong, for humans.
        message: String,
    },
    /// The object is already gone (404 or 410).
    #[error("{verb} {path}: {status}: already gone")]
    AlreadyGone {
        /// The request verb.
        verb: Verb,
        /// The request path.
        path: String,
        /// The HTTP status.
        status: u16,
    },
    /// A conflicting write (409).
    #[error("{verb} {path}: 409 conflict: {message}")]
    Conflict {
        /// The request verb.
        verb: Verb,
        /// The request path.
        path: String,
        /// What went wrong, for humans.
        message: String,
    },
    /// Any other failure of a request.
    #[error("{verb} {path}: {}{message}", status.map_or("no response: ".to_owned(), |s| format!("{s}: ")))]
    Api {
        /// The request verb.
        verb: Verb,
        /// The request path.
        path: String,
        /// `None`: the request never got a status (connect, transport).
        status: Option<u16>,
        /// When the server asked to be retried (`Retry-After`).
        retry_after: Option<Duration>,
        /// The failure was the connection, not an answer.
        transport: bool,
        /// What went wrong, for humans.
        message: String,
    },
}

impl ApiError {
    /// Worth retrying inside a budget: connect and transport failures,
    /// timeouts, 429 and 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout { .. } => true,
            Self::Api { status, transport, .. } => *transport || status.is_some_and(|s| s == 429 || s >= 500),
            _ => false,
        }
    }
}

/// Where a resource lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group (empty for the core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Plural resource name.
    pub plural: String,
    /// The namespace.
    pub namespace: String,
}

impl Resource {
    /// The resource of an agent-sandbox kind in `namespace`.
    pub fn of<K: Kind>(namespace: &str) -> Self {
        Self {
            group: K::GROUP.into(),
            version: VERSION.into(),
            plural: K::PLURAL.into(),
            namespace: namespace.into(),
        }
    }

    /// A core (`v1`) resource, like `pods`.
    pub fn core(plural: &str, namespace: &str) -> Self {
        Self {
            group: String::new(),
            version: "v1".into(),
            plural: plural.into(),
            namespace: namespace.into(),
        }
    }

    /// The collection's path, or one object's.
    pub fn path(&self, name: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        // An empty namespace is a cluster-scoped resource.
        let mut p = if self.namespace.is_empty() {
            format!("{base}/{}", self.plural)
        } else {
            format!("{base}/namespaces/{}/{}", self.namespace, self.plural)
        };
        if let Some(n) = name {
            p.push('/');
            p.push_str(n);
        }
        p
    }
}

/// One request, before it is sent.
struct Request<'a> {
    verb: Verb,
    resource: &'a Resource,
    name: Option<&'a str>,
    /// A subresource, like `status`.
    sub: Option<&'static str>,
    query: Option<String>,
    body: Option<&'a Value>,
    content_type: Option<&'static str>,
}

impl<'a> Request<'a> {
    fn to(verb: Verb, resource: &'a Resource, name: Option<&'a str>) -> Self {
        Self {
            verb,
            resource,
            name,
            sub: None,
            query: None,
            body: None,
            content_type: None,
        }
    }

    fn body(self, body: &'a Value, content_type: &'static str) -> Self {
        Self {
            body: Some(body),
            content_type: Some(content_type),
            ..self
        }
    }
}

/// The typed client.
#[derive(Clone)]
pub struct Api {
    client: kube::Client,
    bound: Duration,
    calls: Arc<Mutex<Vec<Call>>>,
    /// Time spent waiting on the server, summed over every call.
    waited: Arc<Mutex<Duration>>,
}

impl Api {
    /// Refuses a bound below [`MIN_API_REQUEST_TIMEOUT`] (0 included).
    pub fn new(client: kube::Client, bound: Duration) -> namzu_core::Result<Self> {
        if bound < MIN_API_REQUEST_TIMEOUT {
            return Err(namzu_core::Error::OptionRefused {
                tier: namzu_core::spec::Tier::Kubernetes,
                option: "api_request_timeout".into(),
                reason: format!("{bound:?} is below {MIN_API_REQUEST_TIMEOUT:?}"),
            });
        }
        Ok(Self {
            client,
            bound,
            calls: Arc::default(),
            waited: Arc::default(),
        })
    }

    /// Time spent in calls so far (sent to answered): what a benchmark
    /// subtracts to find the host's own share of an operation.
    pub fn time_in_calls(&self) -> Duration {
        *self.waited.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every call made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// One object, by name.
    pub async fn get(&self, r: &Resource, name: &str) -> Result<Value, ApiError> {
        self.call(Request::to(Verb::Get, r, Some(name))).await
    }

    /// A list, narrowed by a label selector when given.
    pub async fn list(&self, r: &Resource, label_selector: Option<&str>) -> Result<Value, ApiError> {
        let req = Request {
            query: label_selector.map(|s| format!("labelSelector={}", urlencode(s))),
            ..Request::to(Verb::List, r, None)
        };
        self.call(req).await
    }

    /// Creates an object.
    pub async fn create(&self, r: &Resource, body: &Value) -> Result<Value, ApiError> {
        self.call(Request::to(Verb::Create, r, None).body(body, "application/json"))
            .await
    }

    /// A JSON merge patch (RFC 7386).
    pub async fn merge_patch(&self, r: &Resource, name: &str, patch: &Value) -> Result<Value, ApiError> {
        self.call(Request::to(Verb::Patch, r, Some(name)).body(patch, "application/merge-patch+json"))
            .await
    }

    /// A merge patch of the `status` subresource (what a controller
    /// writes; RBAC names it `<resource>/status`).
    pub async fn merge_patch_status(&self, r: &Resource, name: &str, patch: &Value) -> Result<Value, ApiError> {
        let req = Request {
            sub: Some("status"),
            ..Request::to(Verb::Patch, r, Some(name)).body(patch, "application/merge-patch+json")
        };
        self.call(req).await
    }

    /// A JSON patch (RFC 6902), `test` operations included.
    pub async fn json_patch(&self, r: &Resource, name: &str, ops: &Value) -> Result<Value, ApiError> {
        self.call(Request::to(Verb::Patch, r, Some(name)).body(ops, "application/json-patch+json"))
            .await
    }

    /// Deletes an object by name (foreground propagation).
    pub async fn delete(&self, r: &Resource, name: &str) -> Result<Value, ApiError> {
        self.call(Request::to(Verb::Delete, r, Some(name))).await
    }

    /// Deletes an object by name only while it still stands at
    /// `resource_version` (`preconditions.resourceVersion`): a write made
    /// since answers 409 and nothing is deleted.
    pub async fn delete_at(&self, r: &Resource, name: &str, resource_version: &str) -> Result<Value, ApiError> {
        let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": resource_version}});
        self.call(Request::to(Verb::Delete, r, Some(name)).body(&body, "application/json"))
            .await
    }

    async fn call(&self, req: Request<'_>) -> Result<Value, ApiError> {
        let Request {
            verb,
            resource: r,
            name,
            sub,
            query,
            body,
            content_type,
        } = req;
        let mut path = r.path(name);
        let mut resource = r.plural.clone();
        if let Some(sub) = sub {
            path = format!("{path}/{sub}");
            resource = format!("{resource}/{sub}");
        }
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(Call {
            group: r.group.clone(),
            resource,
            verb,
        });
        let uri = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let bytes = body
            .map(|b| serde_json::to_vec(b).unwrap_or_default())
            .unwrap_or_default();
        let mut req = http::Request::builder()
            .method(verb.method())
            .uri(&uri)
            .header("accept", "application/json");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let transport = |message: String| ApiError::Api {
            verb,
            path: path.clone(),
            status: None,
            retry_after: None,
            transport: true,
            message,
        };
        let req = req
            .body(kube::client::Body::from(bytes))
            .map_err(|e| transport(e.to_string()))?;
        let exchange = async {
            let resp = self.client.send(req).await.map_err(|e| transport(scrub(&e)))?;
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body: Bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, ApiError>((status, retry_after, body))
        };
        let sent = std::time::Instant::now();
        let answer = tokio::time::timeout(self.bound, exchange).await;
        *self.waited.lock().unwrap_or_else(|p| p.into_inner()) += sent.elapsed();
        let (status, retry_after, body) = answer.map_err(|_| ApiError::Timeout {
            verb,
            path: path.clone(),
            bound: self.bound,
        })??;
        let message = || {
            serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
                .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned())
        };
        match status {
            200..=299 => Ok(serde_json::from_slice(&body).unwrap_or(Value::Null)),
            401 | 403 => Err(ApiError::Credential {
                verb,
                path,
                status,
                message: message(),
            }),
            404 | 410 => Err(ApiError::AlreadyGone { verb, path, status }),
            409 => Err(ApiError::Conflict {
                verb,
                path,
                message: message(),
            }),
            _ => Err(ApiError::Api {
                verb,
                path,
                status: Some(status),
                retry_after,
                transport: false,
                message: message(),
            }),
        }
    }
}

/// A kube error as text, without anything that looks like a credential.
fn scrub(e: &kube::Error) -> String {
    let text = e.to_string();
    text.split_whitespace()
        .map(|w| {
            if w.to_ascii_lowercase().starts_with("bearer") {
                "[redacted]"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Percent-encodes a query value (label selectors carry `=`, `,`, `!`).
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Below this an API request bound is refused: no real API server answers
/// reliably faster.
pub const MIN_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Sandbox, SandboxClaim};

    #[test]
    fn paths_are_built_from_the_resource() {
        assert_eq!(
            Resource::of::<SandboxClaim>("ns").path(Some("c1")),
            "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims/c1"
        );
        assert_eq!(
            Resource::of::<Sandbox>("ns").path(None),
            "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes"
        );
        assert_eq!(
            Resource::core("pods", "ns").path(Some("p")),
            "/api/v1/namespaces/ns/pods/p"
        );
        assert_eq!(urlencode("a=b,c!=d"), "a%3Db%2Cc%21%3Dd");
    }
}
