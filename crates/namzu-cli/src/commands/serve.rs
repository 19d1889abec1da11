//! `namzu serve` (the HTTP API) and `namzu api-key` (a key for it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use namzu::Tier;
use namzu_server::{ApiKeys, Limits, ServerConfig, Template, TlsFiles};

use crate::fail::Fail;

/// `namzu serve`'s options.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Not loopback: --api-keys is required.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Tiers a create may ask for, comma-separated; the first is the default.
    #[arg(long, value_delimiter = ',', default_value = "local")]
    tiers: Vec<Tier>,
    /// Key file: one `NAME sha256:HEX` per line (make one with `namzu api-key NAME`).
    #[arg(long = "api-keys", value_name = "FILE")]
    api_keys: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key.
    #[arg(long = "tls-cert", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); with --tls-cert.
    #[arg(long = "tls-key", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// max_body_bytes: largest JSON body.
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<usize>,
    /// max_upload_bytes: largest file upload.
    #[arg(long, value_name = "BYTES")]
    max_upload_bytes: Option<u64>,
    /// header_read_timeout: seconds a client has to send a request head.
    #[arg(long, value_name = "SECS")]
    header_read_timeout: Option<f64>,
    /// max_streams_per_key: streams, uploads and WebSockets per key at once.
    #[arg(long, value_name = "N")]
    max_streams_per_key: Option<usize>,
    /// max_sandboxes_per_key: live sandboxes per key.
    #[arg(long, value_name = "N")]
    max_sandboxes_per_key: Option<usize>,
    /// max_connections: connections served at once.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// default_timeout: a sandbox's life when create names none, seconds.
    #[arg(long, value_name = "SECS")]
    default_timeout: Option<u64>,
    /// max_timeout: the longest life a create or extend may ask for, seconds.
    #[arg(long, value_name = "SECS")]
    max_timeout: Option<u64>,
    /// E2B template NAME=TIER[:IMAGE] (repeatable); `base` defaults to the
    /// first tier's default root.
    #[arg(long = "e2b-template", value_name = "NAME=TIER[:IMAGE]")]
    e2b_templates: Vec<String>,
    /// The docker runtime of E2B templates on the docker tier (runc, runsc).
    #[arg(long = "e2b-docker-runtime", value_name = "RUNTIME")]
    e2b_docker_runtime: Option<String>,
    /// shutdown_grace: on SIGTERM, seconds open streams may go on.
    #[arg(long, value_name = "SECS")]
    shutdown_grace: Option<f64>,
    /// warm_pool: sandboxes of the default configuration kept started per
    /// single-host tier, so such a create is served at once (0: none).
    #[arg(long, value_name = "N")]
    warm_pool: Option<usize>,
}

fn secs(s: f64, name: &str) -> Result<Duration, Fail> {
    Duration::try_from_secs_f64(s).map_err(|_| Fail(format!("--{name}: not a duration in seconds")))
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn serve(state_dir: Option<PathBuf>, a: ServeArgs) -> Result<ExitCode, Fail> {
    let mut limits = Limits::default();
    macro_rules! set {
        ($field:ident) => {
            if let Some(v) = a.$field {
                limits.$field = v;
            }
        };
    }
    set!(max_body_bytes);
    set!(max_upload_bytes);
    set!(max_streams_per_key);
    set!(max_sandboxes_per_key);
    set!(max_connections);
    set!(warm_pool);
    if let Some(s) = a.header_read_timeout {
        limits.header_read_timeout = secs(s, "header-read-timeout")?;
    }
    if let Some(s) = a.shutdown_grace {
        limits.shutdown_grace = secs(s, "shutdown-grace")?;
    }
    if let Some(s) = a.default_timeout {
        limits.default_timeout = Duration::from_secs(s);
    }
    if let Some(s) = a.max_timeout {
        limits.max_timeout = Duration::from_secs(s);
    }
    let keys = match &a.api_keys {
        Some(p) => ApiKeys::load(p).map_err(|e| Fail(e.to_string()))?,
        None => ApiKeys::default(),
    };
    let mut templates = std::collections::BTreeMap::new();
    if let Some(first) = a.tiers.first() {
        templates.insert(
            "base".to_string(),
            Template {
                tier: *first,
                image: None,
                runtime: None,
            },
        );
    }
    for t in &a.e2b_templates {
        let (name, rest) = t
            .split_once('=')
            .ok_or_else(|| Fail(format!("--e2b-template {t}: NAME=TIER[:IMAGE] wanted")))?;
        let (tier, image) = match rest.split_once(':') {
            Some((t, i)) => (t, Some(i.to_string())),
            None => (rest, None),
        };
        let tier: Tier = tier.parse().map_err(|e| Fail(format!("--e2b-template {t}: {e}")))?;
        if !a.tiers.contains(&tier) {
            return Err(Fail(format!("--e2b-template {t}: tier {tier} is not in --tiers")));
        }
        let runtime = (tier == Tier::Docker).then(|| a.e2b_docker_runtime.clone()).flatten();
        templates.insert(name.to_string(), Template { tier, image, runtime });
    }
    if a.e2b_docker_runtime.is_some() && !templates.values().any(|t| t.tier == Tier::Docker) {
        return Err(Fail(
            "--e2b-docker-runtime applies to --e2b-template NAME=docker:IMAGE, and there is none".into(),
        ));
    }
    let config = ServerConfig {
        listen: a.listen,
        tiers: a.tiers,
        e2b_templates: templates,
        keys,
        state_dir,
        tls: a.tls_cert.zip(a.tls_key).map(|(cert, key)| TlsFiles { cert, key }),
        limits,
    };
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    namzu_server::serve(config, shutdown, |addr| {
        // The one line a script waits for (with port 0, the port chosen).
        println!("namzu: listening on {scheme}://{addr}");
    })
    .await
    .map_err(|e| Fail(crate::fail::chain(&e)))?;
    Ok(ExitCode::SUCCESS)
}

/// `namzu api-key NAME`: a new key, and the line for the key file.
pub fn api_key(name: &str) -> Result<ExitCode, Fail> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
        return Err(Fail("a key name is 1-64 of [A-Za-z0-9-_.@]".into()));
    }
    let (key, line) = namzu_server::new_key(name);
    println!("{key}");
    eprintln!("namzu: give the key above to {name}; add this line to the key file (it holds only the hash):");
    eprintln!("{line}");
    Ok(ExitCode::SUCCESS)
}
