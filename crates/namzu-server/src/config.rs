//! [`ServerConfig`] and its [`Limits`]: every bound the server applies,
//! each named (the name is what a refusal reports in its `field`) and
//! configurable, with a safe default.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use namzu::Tier;

use crate::keys::ApiKeys;

/// The server's bounds. A refusal names the field it hit.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `max_body_bytes`: largest JSON request body (413 past it).
    pub max_body_bytes: usize,
    /// `max_upload_bytes`: largest file upload, streamed (413 past it).
    pub max_upload_bytes: u64,
    /// `header_read_timeout`: time a client has to send a request's head.
    pub header_read_timeout: Duration,
    /// `max_streams_per_key`: streamed responses, uploads and WebSockets
    /// one key may have open at once (429 past it).
    pub max_streams_per_key: usize,
    /// `max_sandboxes_per_key`: live sandboxes one key may own (429).
    pub max_sandboxes_per_key: usize,
    /// `max_connections`: TCP connections the server serves at once; more
    /// wait in the kernel's backlog.
    pub max_connections: usize,
    /// `max_collected_output_bytes`: output `POST …/commands/run` collects
    /// per stream before marking it truncated.
    pub max_collected_output_bytes: usize,
    /// `default_timeout`: a sandbox's life when create names none.
    pub default_timeout: Duration,
    /// `max_timeout`: longest life a create or extend may ask for.
    pub max_timeout: Duration,
    /// `shutdown_grace`: on SIGTERM, how long open streams may go on.
    pub shutdown_grace: Duration,
    /// `max_page_size`: most sandboxes one list page returns.
    pub max_page_size: usize,
    /// `warm_pool`: sandboxes of the default configuration kept started
    /// per single-host tier (`namzu::pool`), so a create asking for
    /// nothing else is a claim instead of a cold start; 0: none.
    pub warm_pool: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 1 << 20,
            max_upload_bytes: 16 << 30,
            header_read_timeout: Duration::from_secs(10),
            max_streams_per_key: 64,
            max_sandboxes_per_key: 200,
            max_connections: 1024,
            max_collected_output_bytes: 16 << 20,
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            shutdown_grace: Duration::from_secs(10),
            max_page_size: 1000,
            warm_pool: 0,
        }
    }
}

/// What an E2B template stands for on this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The tier its sandboxes are made on.
    pub tier: Tier,
    /// The image (`None`: the tier's default root).
    pub image: Option<String>,
    /// docker: the runtime.
    pub runtime: Option<String>,
}

/// TLS material (PEM files).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Everything `namzu serve` is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (default 127.0.0.1:8080).
    pub listen: SocketAddr,
    /// Tiers a create may ask for; the first is the default.
    pub tiers: Vec<Tier>,
    /// Accepted keys; empty means no authentication (loopback only).
    pub keys: ApiKeys,
    /// Where sandboxes (and the server's own records) live.
    pub state_dir: Option<PathBuf>,
    /// TLS, when given.
    pub tls: Option<TlsFiles>,
    /// Bounds.
    pub limits: Limits,
    /// E2B templates by name (default: `base` on the first tier, its
    /// default root).
    pub e2b_templates: std::collections::BTreeMap<String, Template>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tiers: vec![Tier::Local],
            keys: ApiKeys::default(),
            state_dir: None,
            tls: None,
            limits: Limits::default(),
            e2b_templates: [(
                "base".to_string(),
                Template {
                    tier: Tier::Local,
                    image: None,
                    runtime: None,
                },
            )]
            .into(),
        }
    }
}

/// A configuration the server refuses to start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A non-loopback address without keys would hand sandboxes to anyone
    /// who can reach it.
    #[error("refusing to listen on {0}, which is not a loopback address, without API keys: pass --api-keys FILE (see `namzu api-key`) or listen on 127.0.0.1")]
    OpenListener(SocketAddr),
    /// No tier to serve.
    #[error("no tier to serve: --tiers is empty")]
    NoTiers,
    /// The TLS files cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
}

impl ServerConfig {
    /// The checks done before binding.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.keys.is_empty() && !self.listen.ip().is_loopback() {
            return Err(ConfigError::OpenListener(self.listen));
        }
        if self.tiers.is_empty() {
            return Err(ConfigError::NoTiers);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_listener_needs_keys() {
        let mut c = ServerConfig {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..Default::default()
        };
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("--api-keys"), "{e}");
        let (_, line) = crate::keys::new_key("a");
        c.keys = ApiKeys::parse(&line, "k").unwrap();
        assert!(c.validate().is_ok());
        c.listen = "[::1]:1".parse().unwrap();
        c.keys = ApiKeys::default();
        assert!(c.validate().is_ok(), "loopback without keys is fine");
    }
}
