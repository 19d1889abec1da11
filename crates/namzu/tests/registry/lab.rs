//! What the pull tests stand on: real `docker-registry` processes (Debian's
//! distribution 2.8: the shared one on 127.0.0.1:5000 that
//! scripts/docker-up.sh starts, and private ones with htpasswd or token
//! auth), a token server of our own that signs what distribution verifies,
//! a proxy in front of a registry that counts, corrupts or cuts blob
//! responses, and images built layer by layer and pushed with oci-client.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{ImageIndexEntry, OciImageIndex, Platform as OciPlatform};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

pub const SHARED: &str = "127.0.0.1:5000";

/// A name no earlier run pushed.
pub fn unique(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("namzu-test/{what}-{}-{t}", std::process::id())
}

/// Whether the registries are here: the shared one answering and Debian's
/// `docker-registry` on PATH. Without them a test is skipped, unless the
/// test command asked for them (`NAMZU_REQUIRE_DOCKER`, as root), when it
/// fails.
pub fn ready() -> bool {
    let up = std::net::TcpStream::connect(SHARED).is_ok()
        && Command::new("docker-registry")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !up {
        assert!(
            std::env::var_os("NAMZU_REQUIRE_DOCKER").is_none(),
            "no registry on {SHARED} or no docker-registry: scripts/docker-up.sh brings them up"
        );
        eprintln!("skipped: no registry on {SHARED} (scripts/docker-up.sh starts one)");
    }
    up
}

pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

/// One layer: (path, contents); a path ending in `/` is a directory.
pub fn layer(entries: &[(&str, &[u8])]) -> (Vec<u8>, String) {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        if let Some(dir) = path.strip_suffix('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, dir, &[][..]).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, *data).unwrap();
        }
    }
    let tar = b.into_inner().unwrap();
    let diff_id = format!("sha256:{}", sha256_hex(&tar));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), diff_id)
}

pub fn client(registry: &str) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(vec![registry.to_owned()]),
        ..ClientConfig::default()
    })
}

/// A pushed image: its reference, manifest digest and layer digests.
pub struct Pushed {
    pub reference: String,
    pub digest: String,
    pub layers: Vec<String>,
    pub manifest_size: i64,
}

/// Pushes an image of `layers` for `arch` as `registry/repo:tag`.
pub async fn push(
    registry: &str,
    repo: &str,
    tag: &str,
    arch: &str,
    layers: &[Vec<u8>],
    diff_ids: &[String],
    auth: &RegistryAuth,
) -> Pushed {
    let reference = format!("{registry}/{repo}:{tag}");
    let r: Reference = reference.parse().unwrap();
    let config = serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin", "FROM_IMAGE=yes"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = Config::oci_v1(serde_json::to_vec(&config).unwrap(), None);
    let image_layers: Vec<ImageLayer> = layers
        .iter()
        .map(|l| ImageLayer::oci_v1_gzip(l.clone(), None))
        .collect();
    let c = client(registry);
    c.push(&r, &image_layers, config, auth, None).await.expect("push");
    let (raw, digest) = c
        .pull_manifest_raw(&r, auth, &["application/vnd.oci.image.manifest.v1+json"])
        .await
        .expect("manifest back");
    Pushed {
        reference,
        digest,
        layers: image_layers.iter().map(|l| l.sha256_digest()).collect(),
        manifest_size: raw.len() as i64,
    }
}

/// Pushes an index over `images` (arch, pushed) as `registry/repo:tag`.
pub async fn push_index(registry: &str, repo: &str, tag: &str, images: &[(&str, &Pushed)]) -> String {
    let reference = format!("{registry}/{repo}:{tag}");
    let r: Reference = reference.parse().unwrap();
    let index = OciImageIndex {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.index.v1+json".into()),
        manifests: images
            .iter()
            .map(|(arch, p)| ImageIndexEntry {
                media_type: "application/vnd.oci.image.manifest.v1+json".into(),
                digest: p.digest.clone(),
                size: p.manifest_size,
                platform: Some(OciPlatform {
                    architecture: (*arch).into(),
                    os: "linux".into(),
                    os_version: None,
                    os_features: None,
                    variant: None,
                    features: None,
                }),
                annotations: None,
                artifact_type: None,
            })
            .collect(),
        artifact_type: None,
        annotations: None,
    };
    client(registry)
        .push_manifest_list(&r, &RegistryAuth::Anonymous, index)
        .await
        .expect("push index");
    reference
}

/// A private `docker-registry` on a free loopback port, with `auth` (the
/// YAML of its `auth:` section), killed when dropped.
pub struct Registry {
    pub addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Registry {
    pub fn start(auth: &str, dir: tempfile::TempDir) -> Self {
        let port = free_port();
        let cfg = dir.path().join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .expect("docker-registry (Debian's package; scripts/docker-up.sh installs it)");
        let addr = format!("127.0.0.1:{port}");
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < until, "docker-registry did not start on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { addr, child, _dir: dir }
    }

    /// One with htpasswd auth: `user` with `password`.
    pub fn htpasswd(user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash(password, 4).unwrap();
        std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n")).unwrap();
        let auth = format!(
            "auth:\n  htpasswd:\n    realm: namzu-test\n    path: {}\n",
            dir.path().join("htpasswd").display()
        );
        Self::start(&auth, dir)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A docker config directory holding `user:password` for `registry`.
pub fn docker_config(registry: &str, user: &str, password: &str) -> tempfile::TempDir {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    docker_config_with(registry, serde_json::json!({"auth": auth}))
}

/// A docker config directory holding `entry` under `auths.registry`.
pub fn docker_config_with(registry: &str, entry: serde_json::Value) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("config.json"),
        serde_json::json!({"auths": {registry: entry}}).to_string(),
    )
    .unwrap();
    d
}

/// A token server (Docker's token auth: the registry's challenge sends the
/// client here with basic credentials; it answers with a JWT signed by a
/// key whose certificate the registry trusts) and the registry using it.
pub struct TokenRegistry {
    pub registry: Registry,
    pub issued: Arc<Mutex<u32>>,
}

impl TokenRegistry {
    pub async fn start(user: &'static str, password: &'static str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["namzu-token".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("root.pem"), cert.pem()).unwrap();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
        let issued = Arc::new(Mutex::new(0));
        let state = Arc::new((signer, x5c, issued.clone(), user, password));
        let app = axum::Router::new()
            .route("/token", axum::routing::get(token).post(refresh))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let realm = format!("http://{}/token", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let auth = format!(
            "auth:\n  token:\n    realm: {realm}\n    service: namzu-test\n    issuer: namzu-test-issuer\n    rootcertbundle: {}\n",
            dir.path().join("root.pem").display()
        );
        Self {
            registry: Registry::start(&auth, dir),
            issued,
        }
    }
}

type TokenState = Arc<(
    ring::signature::EcdsaKeyPair,
    String,
    Arc<Mutex<u32>>,
    &'static str,
    &'static str,
)>;

async fn token(
    State(st): State<TokenState>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let (_, _, _, user, password) = &*st;
    let b64 = base64::engine::general_purpose::STANDARD;
    let want = format!("Basic {}", b64.encode(format!("{user}:{password}")));
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
        return refuse("bad credentials");
    }
    let jwt = sign(&st, q.get("scope"));
    json(serde_json::json!({"token": jwt, "expires_in": 300}))
}

/// The OAuth2 side (what `docker login` gets an identity token from): a
/// POSTed form trading the refresh token `refresh-PASSWORD` for an access
/// token.
async fn refresh(State(st): State<TokenState>, axum::Form(f): axum::Form<HashMap<String, String>>) -> Response {
    let password = st.4;
    if f.get("grant_type").map(String::as_str) != Some("refresh_token") {
        return Response::builder()
            .status(400)
            .body(Body::from("unsupported grant_type"))
            .unwrap();
    }
    if f.get("refresh_token") != Some(&format!("refresh-{password}"))
        || f.get("service").map(String::as_str) != Some("namzu-test")
    {
        return refuse("invalid refresh token");
    }
    let jwt = sign(&st, f.get("scope"));
    json(serde_json::json!({"access_token": jwt, "expires_in": 300, "scope": f.get("scope")}))
}

fn refuse(why: &'static str) -> Response {
    Response::builder().status(401).body(Body::from(why)).unwrap()
}

fn json(v: serde_json::Value) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

/// A JWT granting `scope` (`repository:NAME:pull,push`), signed by the key
/// the registry trusts.
fn sign(st: &TokenState, scope: Option<&String>) -> String {
    let (signer, x5c, issued, user, _) = &**st;
    let access: Vec<serde_json::Value> = scope
        .into_iter()
        .filter_map(|s| {
            let mut parts = s.splitn(3, ':');
            let (t, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({"type": t, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = url.encode(serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]}).to_string());
    let claims = url.encode(
        serde_json::json!({
            "iss": "namzu-test-issuer", "sub": user, "aud": "namzu-test",
            "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", rand_id()),
            "access": access,
        })
        .to_string(),
    );
    let signing_input = format!("{header}.{claims}");
    let sig = signer
        .sign(&ring::rand::SystemRandom::new(), signing_input.as_bytes())
        .unwrap();
    *issued.lock().unwrap() += 1;
    format!("{signing_input}.{}", url.encode(sig.as_ref()))
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

/// What the proxy does to blob responses.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Mode {
    #[default]
    Pass,
    /// Flip one byte in the middle of this blob.
    Corrupt(String),
    /// Send only this many bytes of this blob, then drop the connection
    /// (once; then pass).
    Cut(String, usize),
}

/// What the proxy saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub mode: Mode,
    /// Blob GETs by digest.
    pub blob_gets: HashMap<String, usize>,
    /// Range headers of blob GETs, by digest.
    pub ranges: Vec<(String, String)>,
}

/// A proxy on a loopback port in front of `upstream`.
#[derive(Clone)]
pub struct Proxy {
    pub addr: String,
    pub seen: Arc<Mutex<Seen>>,
}

type Upstream = hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

impl Proxy {
    pub async fn start(upstream: &str) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let client: Upstream =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let st = (seen.clone(), client, upstream.to_owned());
        let app = axum::Router::new().fallback(forward).with_state(Arc::new(st));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr: addr.to_string(),
            seen,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.seen.lock().unwrap().mode = mode;
    }

    pub fn gets(&self, digest: &str) -> usize {
        self.seen.lock().unwrap().blob_gets.get(digest).copied().unwrap_or(0)
    }
}

type ProxyState = Arc<(Arc<Mutex<Seen>>, Upstream, String)>;

async fn forward(State(st): State<ProxyState>, req: Request) -> Response {
    let (seen, client, upstream) = &*st;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let blob = path
        .split_once("/blobs/")
        .map(|(_, d)| d.split('?').next().unwrap_or(d).to_owned())
        .filter(|_| req.method() == axum::http::Method::GET);
    let mut up = axum::http::Request::builder()
        .method(req.method().clone())
        .uri(format!("http://{upstream}{path}"));
    for (k, v) in req.headers() {
        if k != "host" {
            up = up.header(k, v);
        }
    }
    let mode = {
        let mut s = seen.lock().unwrap();
        if let Some(d) = &blob {
            *s.blob_gets.entry(d.clone()).or_default() += 1;
            if let Some(r) = req.headers().get("range") {
                s.ranges.push((d.clone(), r.to_str().unwrap_or("").to_owned()));
            }
        }
        s.mode.clone()
    };
    let resp = client.request(up.body(Body::empty()).unwrap()).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = http_body_util::BodyExt::collect(body).await.unwrap().to_bytes();
    let mut out = Response::builder().status(parts.status);
    for (k, v) in &parts.headers {
        out = out.header(k, v);
    }
    match (&mode, &blob) {
        (Mode::Corrupt(d), Some(b)) if d == b && !bytes.is_empty() => {
            let mut v = bytes.to_vec();
            let mid = v.len() / 2;
            v[mid] ^= 0x55;
            out.body(Body::from(v)).unwrap()
        }
        (Mode::Cut(d, n), Some(b)) if d == b => {
            seen.lock().unwrap().mode = Mode::Pass;
            let head = bytes.slice(..(*n).min(bytes.len()));
            let stream = futures::stream::iter(vec![
                Ok::<_, std::io::Error>(head),
                Err(std::io::Error::other("cut by the test proxy")),
            ]);
            out.body(Body::from_stream(stream)).unwrap()
        }
        _ => out.body(Body::from(bytes)).unwrap(),
    }
}

/// The files of a rootfs, relative, sorted (directories end in `/`).
pub fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel}/"));
                stack.push(e.path());
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}
