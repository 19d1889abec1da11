//! The REST surface and the object store behind it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::schema;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::selector::Selector;

mod store;

/// The agent-sandbox CRDs the simulator serves, with their schemas.
const CRDS: &[&str] = &[
    include_str!("../../namzu-kubernetes/tests/fixtures/agent-sandbox-crds/agents.x-k8s.io_sandboxes.yaml"),
    include_str!(
        "../../namzu-kubernetes/tests/fixtures/agent-sandbox-crds/extensions.agents.x-k8s.io_sandboxclaims.yaml"
    ),
    include_str!(
        "../../namzu-kubernetes/tests/fixtures/agent-sandbox-crds/extensions.agents.x-k8s.io_sandboxtemplates.yaml"
    ),
    include_str!(
        "../../namzu-kubernetes/tests/fixtures/agent-sandbox-crds/extensions.agents.x-k8s.io_sandboxwarmpools.yaml"
    ),
];

/// What a resource is: its kind and, for custom resources, its schema.
#[derive(Clone)]
struct ResourceType {
    kind: String,
    schema: Option<Value>,
    /// With a `status` subresource, the main resource ignores status
    /// (create drops it, patches keep the stored one) and `/status`
    /// changes nothing else.
    status_subresource: bool,
}

/// (group, version, plural, namespace, name)
type Key = (String, String, String, String, String);

#[derive(Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    revision: u64,
}

/// A fault knob: the next `times` requests with this method (any, if
/// `None`) whose `resource[/name]` contains `target` (or, for a target
/// written `=resource[/name]`, equals it) are answered with `status` (and
/// `Retry-After`, if given) instead of being served.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<Method>,
    pub target: String,
    pub status: u16,
    pub retry_after: Option<u64>,
    pub times: usize,
}

/// A latency knob: the next `times` requests with this method (any, if
/// `None`) whose `resource[/name]` contains `target` are APPLIED at once and
/// answered only after `delay` — so a client that gives up first has lost
/// the answer to a request that landed. A long delay is an API server that
/// never answers.
#[derive(Debug, Clone)]
pub struct Stall {
    pub method: Option<Method>,
    pub target: String,
    pub delay: std::time::Duration,
    pub times: usize,
}

/// (group, version, plural) of a resource the simulator serves.
pub type Gvr = (&'static str, &'static str, &'static str);

/// What the API calls after it served a pod read (the controller replaces
/// a pod there when a test asked it to). Implemented by the controller, so
/// the server needs no knowledge of it.
pub(crate) trait PodReadHook: std::any::Any + Send + Sync {
    fn after_pod_read<'a>(
        &'a self,
        sim: &'a Simulator,
        ns: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
}

/// The simulator: its store, the resource types it knows, its faults.
pub struct Simulator {
    store: Mutex<Store>,
    types: HashMap<(String, String, String), ResourceType>,
    faults: Mutex<Vec<Fault>>,
    stalls: Mutex<Vec<Stall>>,
    rewrites: Mutex<Vec<(String, Value)>>,
    /// The agent-sandbox controller, once started, as the API sees it: a
    /// hook after pod reads (the server knows no controller type).
    pub(crate) controller: std::sync::OnceLock<Arc<dyn PodReadHook>>,
}

impl Simulator {
    /// A simulator knowing core `pods` and the four agent-sandbox kinds
    /// (every served version of each).
    pub fn new() -> Arc<Self> {
        let mut types = HashMap::new();
        types.insert(
            (String::new(), "v1".into(), "pods".into()),
            ResourceType {
                kind: "Pod".into(),
                schema: None,
                status_subresource: true,
            },
        );
        // Events as the controller records them (the events.k8s.io API).
        types.insert(
            ("events.k8s.io".into(), "v1".into(), "events".into()),
            ResourceType {
                kind: "Event".into(),
                schema: None,
                status_subresource: false,
            },
        );
        // Core objects the controller makes or reads, stored as sent.
        for (plural, kind) in [
            ("services", "Service"),
            ("configmaps", "ConfigMap"),
            ("secrets", "Secret"),
            ("persistentvolumeclaims", "PersistentVolumeClaim"),
            ("events", "Event"),
        ] {
            types.insert(
                (String::new(), "v1".into(), plural.into()),
                ResourceType {
                    kind: kind.into(),
                    schema: None,
                    status_subresource: false,
                },
            );
        }
        // Policy objects, stored as sent (no schema): what the backend's
        // egress and ingress checks read.
        for (group, version, plural, kind) in [
            ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
            ("cilium.io", "v2", "ciliumnetworkpolicies", "CiliumNetworkPolicy"),
            (
                "admissionregistration.k8s.io",
                "v1",
                "validatingadmissionpolicies",
                "ValidatingAdmissionPolicy",
            ),
            (
                "admissionregistration.k8s.io",
                "v1",
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
            ),
        ] {
            types.insert(
                (group.into(), version.into(), plural.into()),
                ResourceType {
                    kind: kind.into(),
                    schema: None,
                    status_subresource: false,
                },
            );
        }
        for text in CRDS {
            let Ok(crd) = serde_yaml::from_str::<Value>(text) else {
                continue;
            };
            let spec = &crd["spec"];
            let (group, plural, kind) = (
                spec["group"].as_str().unwrap_or_default(),
                spec["names"]["plural"].as_str().unwrap_or_default(),
                spec["names"]["kind"].as_str().unwrap_or_default(),
            );
            for v in spec["versions"].as_array().into_iter().flatten() {
                let version = v["name"].as_str().unwrap_or_default();
                types.insert(
                    (group.to_owned(), version.to_owned(), plural.to_owned()),
                    ResourceType {
                        kind: kind.to_owned(),
                        schema: schema::crd_schema(&crd, version).cloned(),
                        status_subresource: v["subresources"].get("status").is_some(),
                    },
                );
            }
        }
        Arc::new(Self {
            store: Mutex::default(),
            types,
            faults: Mutex::default(),
            stalls: Mutex::default(),
            rewrites: Mutex::default(),
            controller: std::sync::OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves on 127.0.0.1 (an ephemeral port); returns the base URL.
    pub async fn serve(self: &Arc<Self>) -> std::io::Result<String> {
        let app = axum::Router::new()
            .route("/api/:version/namespaces/:ns/:plural", any(route))
            .route("/api/:version/namespaces/:ns/:plural/:name", any(route))
            .route("/api/:version/namespaces/:ns/:plural/:name/status", any(route))
            .route("/apis/:group/:version/namespaces/:ns/:plural", any(route))
            .route("/apis/:group/:version/namespaces/:ns/:plural/:name", any(route))
            .route("/apis/:group/:version/namespaces/:ns/:plural/:name/status", any(route))
            // Cluster-scoped resources (admission policies): no namespace.
            .route("/apis/:group/:version/:plural", any(route))
            .route("/apis/:group/:version/:plural/:name", any(route))
            .with_state(self.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        Ok(format!("http://{addr}"))
    }

    /// Arms a fault knob.
    pub fn inject(&self, fault: Fault) {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).push(fault);
    }

    /// After every successful write (POST or PATCH) of an object whose
    /// `resource/name` matches `target`, merges `patch` into what is stored
    /// — what a mutating webhook or a controller rewriting the object does.
    pub fn rewrite_on_write(&self, target: &str, patch: Value) {
        self.rewrites
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((target.to_owned(), patch));
    }

    /// Applies the armed rewrites for `target` to an object about to be
    /// stored, under the same store lock as the write: no reader (the
    /// controller included) ever sees the object as written before the
    /// rewrite, as none sees a mutating webhook's input.
    fn rewrite(&self, target: &str, obj: &mut Value) {
        let rewrites = self.rewrites.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (t, patch) in rewrites {
            if matches_target(&t, target) {
                json_patch::merge(obj, &patch);
            }
        }
    }

    /// Arms a latency knob.
    pub fn stall(&self, stall: Stall) {
        self.stalls.lock().unwrap_or_else(|p| p.into_inner()).push(stall);
    }

    /// How long this request's answer is held, if a stall matches it.
    fn stalled(&self, method: &Method, target: &str) -> Option<std::time::Duration> {
        let mut stalls = self.stalls.lock().unwrap_or_else(|p| p.into_inner());
        let s = stalls.iter_mut().find(|s| {
            s.times > 0 && s.method.as_ref().is_none_or(|m| m == method) && matches_target(&s.target, target)
        })?;
        s.times -= 1;
        Some(s.delay)
    }

    /// The fault this request trips, if any (and counts it down).
    fn tripped(&self, method: &Method, target: &str) -> Option<Response> {
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let f = faults.iter_mut().find(|f| {
            f.times > 0 && f.method.as_ref().is_none_or(|m| m == method) && matches_target(&f.target, target)
        })?;
        f.times -= 1;
        let code = StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = status(code, "Injected", format!("simulated fault: {}", f.status));
        if let Some(s) = f.retry_after {
            if let Ok(v) = axum::http::HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert("retry-after", v);
            }
        }
        Some(r)
    }
}

/// Whether a knob's target names this request's `resource[/name]`.
fn matches_target(knob: &str, target: &str) -> bool {
    match knob.strip_prefix('=') {
        Some(exact) => exact == target,
        None => target.contains(knob),
    }
}

/// A `Status` failure, as the API server writes one.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn ok(code: StatusCode, v: Value) -> Response {
    (code, axum::Json(v)).into_response()
}

struct Target {
    group: String,
    version: String,
    ns: String,
    plural: String,
    name: Option<String>,
    /// `Some("status")` for the status subresource.
    sub: Option<&'static str>,
}

impl Target {
    fn key(&self, name: &str) -> Key {
        (
            self.group.clone(),
            self.version.clone(),
            self.plural.clone(),
            self.ns.clone(),
            name.to_owned(),
        )
    }
}

/// Every route: the path's parameters (a missing `group` is the core
/// group) and whether it names the status subresource.
async fn route(
    State(sim): State<Arc<Simulator>>,
    Path(p): Path<HashMap<String, String>>,
    uri: axum::http::Uri,
    method: Method,
    q: Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    let t = Target {
        group: get("group"),
        version: get("version"),
        ns: get("ns"),
        plural: get("plural"),
        name: p.get("name").cloned(),
        sub: uri.path().ends_with("/status").then_some("status"),
    };
    let target = match &t.name {
        Some(n) => format!("{}/{n}", t.plural),
        None => t.plural.clone(),
    };
    let hold = sim.stalled(&method, &target);
    let pod_read = (method == Method::GET && t.group.is_empty() && t.plural == "pods")
        .then(|| t.name.clone().map(|n| (t.ns.clone(), n)))
        .flatten();
    let answer = handle(&sim, t, method, &q, &headers, &body);
    if let (Some((ns, name)), Some(ctl)) = (pod_read, sim.controller.get()) {
        if answer.status().is_success() {
            ctl.after_pod_read(&sim, &ns, &name).await;
        }
    }
    if let Some(d) = hold {
        tokio::time::sleep(d).await;
    }
    answer
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    v["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A uid in the shape Kubernetes writes (a random UUID).
pub fn new_uid() -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        rand::random::<u32>(),
        rand::random::<u16>(),
        rand::random::<u16>() & 0xfff,
        rand::random::<u16>() & 0xfff,
        rand::random::<u64>() & 0xffff_ffff_ffff
    )
}

pub(crate) fn now_rfc3339() -> String {
    namzu_kubernetes::build::rfc3339(std::time::SystemTime::now())
}

fn invalid(kind: &str, name: &str, violations: &[schema::Violation]) -> Response {
    let causes: Vec<String> = violations.iter().map(ToString::to_string).collect();
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("{kind} {name:?} is invalid: {}", causes.join("; ")),
    )
}

fn handle(
    sim: &Simulator,
    t: Target,
    method: Method,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let target = match &t.name {
        Some(n) => format!("{}/{n}", t.plural),
        None => t.plural.clone(),
    };
    if let Some(r) = sim.tripped(&method, &target) {
        return r;
    }
    let Some(rt) = sim
        .types
        .get(&(t.group.clone(), t.version.clone(), t.plural.clone()))
        .cloned()
    else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({}/{} {})",
                t.group, t.version, t.plural
            ),
        );
    };
    let api_version = if t.group.is_empty() {
        t.version.clone()
    } else {
        format!("{}/{}", t.group, t.version)
    };
    let mut store = sim.lock();
    if t.sub.is_some() && !(rt.status_subresource && matches!(method, Method::PATCH | Method::GET)) {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} has no such subresource, or it takes PATCH and GET only", t.plural),
        );
    }
    match (method, &t.name) {
        (Method::GET, None) => {
            let selector = match Selector::parse(q.get("labelSelector").map(String::as_str).unwrap_or_default()) {
                Ok(s) => s,
                Err(e) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("unable to parse requirement: {e}"),
                    )
                }
            };
            let items: Vec<Value> = store
                .objects
                .iter()
                .filter(|((g, v, p, ns, _), _)| *g == t.group && *v == t.version && *p == t.plural && *ns == t.ns)
                .map(|(_, o)| o)
                .filter(|o| selector.matches(&labels_of(o)))
                .cloned()
                .collect();
            ok(
                StatusCode::OK,
                json!({
                    "apiVersion": api_version,
                    "kind": format!("{}List", rt.kind),
                    "metadata": {"resourceVersion": store.revision.to_string()},
                    "items": items,
                }),
            )
        }
        (Method::GET, Some(name)) => match store.objects.get(&t.key(name)) {
            Some(o) => ok(StatusCode::OK, o.clone()),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{} {name:?} not found", t.plural),
            ),
        },
        (Method::POST, None) => {
            let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "the body is not JSON".into());
            };
            if !obj.is_object() || !obj["metadata"].is_object() && !obj["metadata"].is_null() {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the body is not an object".into(),
                );
            }
            if obj["kind"].as_str() != Some(rt.kind.as_str())
                || obj["apiVersion"].as_str() != Some(api_version.as_str())
            {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!(
                        "the body is a {} {}, not a {} {api_version}",
                        obj["kind"], obj["apiVersion"], rt.kind
                    ),
                );
            }
            match obj["metadata"]["namespace"].as_str() {
                Some(ns) if ns != t.ns => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!(
                            "the namespace of the object ({ns}) does not match the namespace on the request ({})",
                            t.ns
                        ),
                    )
                }
                _ => {}
            }
            let name = match (
                obj["metadata"]["name"].as_str(),
                obj["metadata"]["generateName"].as_str(),
            ) {
                (Some(n), _) if !n.is_empty() => n.to_owned(),
                (_, Some(prefix)) => format!("{prefix}{:05x}", rand::random::<u32>() & 0xfffff),
                _ => {
                    return invalid(
                        &rt.kind,
                        "",
                        &[schema::Violation {
                            path: ".metadata.name".into(),
                            problem: "name or generateName is required".into(),
                        }],
                    )
                }
            };
            let bad_name = if t.plural == "services" {
                schema::dns_label(&name)
            } else {
                schema::dns_subdomain(&name)
            };
            if let Some(problem) = bad_name {
                return invalid(
                    &rt.kind,
                    &name,
                    &[schema::Violation {
                        path: ".metadata.name".into(),
                        problem,
                    }],
                );
            }
            if let Some(s) = &rt.schema {
                schema::apply_defaults(s, &mut obj);
                let mut v = schema::validate(s, &obj);
                if v.is_empty() {
                    v = crate::cel_rules::check(s, &obj, None);
                }
                if !v.is_empty() {
                    return invalid(&rt.kind, &name, &v);
                }
            }
            if store.objects.contains_key(&t.key(&name)) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{} {name:?} already exists", t.plural),
                );
            }
            store.revision += 1;
            let meta = &mut obj["metadata"];
            meta["name"] = json!(name);
            meta["namespace"] = json!(t.ns);
            meta["uid"] = json!(new_uid());
            meta["resourceVersion"] = json!(store.revision.to_string());
            meta["generation"] = json!(1);
            meta["creationTimestamp"] = json!(now_rfc3339());
            if let Some(m) = meta.as_object_mut() {
                m.remove("generateName");
            }
            if rt.status_subresource {
                if let Some(m) = obj.as_object_mut() {
                    m.remove("status");
                }
            }
            sim.rewrite(&format!("{}/{name}", t.plural), &mut obj);
            store.objects.insert(t.key(&name), obj.clone());
            ok(StatusCode::CREATED, obj)
        }
        (Method::PATCH, Some(name)) => {
            let Some(current) = store.objects.get(&t.key(name)).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} {name:?} not found", t.plural),
                );
            };
            let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "the patch is not JSON".into());
            };
            let mut next = current.clone();
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            match ct {
                "application/merge-patch+json" => {
                    // A resourceVersion in the patch is a precondition.
                    if let Some(rv) = patch["metadata"]["resourceVersion"].as_str() {
                        if Some(rv) != current["metadata"]["resourceVersion"].as_str() {
                            return status(
                                StatusCode::CONFLICT,
                                "Conflict",
                                format!("Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again", t.plural),
                            );
                        }
                    }
                    json_patch::merge(&mut next, &patch);
                }
                "application/json-patch+json" => {
                    let ops: json_patch::Patch = match serde_json::from_value(patch) {
                        Ok(p) => p,
                        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("the JSON patch is malformed: {e}")),
                    };
                    if let Err(e) = json_patch::patch(&mut next, &ops) {
                        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", format!("the JSON patch could not be applied: {e}"));
                    }
                }
                other => {
                    return status(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json (got {other:?})"),
                    )
                }
            }
            // What the server owns cannot be patched away.
            for f in ["name", "namespace", "uid", "creationTimestamp"] {
                next["metadata"][f] = current["metadata"][f].clone();
            }
            // With a status subresource, the resource and its status change
            // apart: /status touches only status, the resource never it.
            if rt.status_subresource {
                if t.sub == Some("status") {
                    let status = next["status"].take();
                    next = current.clone();
                    next["status"] = status;
                } else {
                    next["status"] = current["status"].clone();
                }
                if next["status"].is_null() {
                    if let Some(m) = next.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if let Some(s) = &rt.schema {
                schema::apply_defaults(s, &mut next);
                let mut v = schema::validate(s, &next);
                if v.is_empty() {
                    v = crate::cel_rules::check(s, &next, Some(&current));
                }
                if !v.is_empty() {
                    return invalid(&rt.kind, name, &v);
                }
            }
            store.revision += 1;
            next["metadata"]["resourceVersion"] = json!(store.revision.to_string());
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(if next["spec"] != current["spec"] {
                generation + 1
            } else {
                generation
            });
            sim.rewrite(&format!("{}/{name}", t.plural), &mut next);
            store.objects.insert(t.key(name), next.clone());
            ok(StatusCode::OK, next)
        }
        (Method::DELETE, Some(name)) => {
            let Some(current) = store.objects.get(&t.key(name)).cloned() else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{} {name:?} not found", t.plural),
                );
            };
            if let Ok(opts) = serde_json::from_slice::<Value>(body) {
                let pre = &opts["preconditions"];
                for (field, have) in [
                    ("uid", &current["metadata"]["uid"]),
                    ("resourceVersion", &current["metadata"]["resourceVersion"]),
                ] {
                    if let Some(want) = pre[field].as_str() {
                        if Some(want) != have.as_str() {
                            return status(
                                StatusCode::CONFLICT,
                                "Conflict",
                                format!("Precondition failed: {field}: {want}, object {field}: {have}"),
                            );
                        }
                    }
                }
            }
            let grace = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|o| o["gracePeriodSeconds"].as_i64());
            drop(store);
            let gvr = (t.group.as_str(), t.version.as_str(), t.plural.as_str());
            let after = sim.delete_with(gvr, &t.ns, name, grace).unwrap_or(current);
            ok(StatusCode::OK, after)
        }
        (m, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{m} is not supported here"),
        ),
    }
}
