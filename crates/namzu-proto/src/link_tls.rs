//! The pod link's mutual TLS: what both ends of a link that crosses a
//! network (a pod's agent port) configure, so the two cannot disagree.
//!
//! * TLS 1.3 only, ALPN `h2`, the `ring` provider.
//! * The agent (server) requires a client certificate chaining to the link
//!   CA it was given, with the clientAuth usage: a peer without the host's
//!   private key cannot finish the handshake, whatever token it holds.
//! * The host (client) accepts only a server certificate chaining to the
//!   same CA, for [`SERVER_NAME`], with the serverAuth usage. The usages
//!   keep the two keys apart: the agent's own certificate (whose key sits
//!   in the cluster) is no client certificate.
//!
//! The bind token still travels in the preface, inside the TLS stream: it
//! names WHICH pod the host meant (the pod uid), no longer who may speak.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The name every agent's certificate is issued for and every host
/// verifies (the address dialled is a pod IP or a Service name; the CA is
/// namzu's own, so any certificate it signed for this name is an agent).
pub const SERVER_NAME: &str = "namzu-agent";

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LinkTlsError {
    #[error("{what}: no usable PEM: {message}")]
    Pem { what: &'static str, message: String },
    #[error("{what}: {source}")]
    Rustls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("the client certificate verifier: {0}")]
    Verifier(String),
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where an agent finds its side of the link: PEM files, the key removed
/// once read when `consume_key` (it sits in a volume the commands share,
/// and nothing needs it after the agent holds it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerFiles {
    pub cert: String,
    pub key: String,
    pub client_ca: String,
    #[serde(default)]
    pub consume_key: bool,
}

impl ServerFiles {
    /// Reads the files (removing the key if asked) into a server config.
    pub fn load(&self) -> Result<Arc<ServerConfig>, LinkTlsError> {
        let read = |path: &str| {
            std::fs::read(path).map_err(|source| LinkTlsError::File {
                path: path.to_owned(),
                source,
            })
        };
        let (cert, key, ca) = (read(&self.cert)?, read(&self.key)?, read(&self.client_ca)?);
        if self.consume_key {
            std::fs::remove_file(&self.key).map_err(|source| LinkTlsError::File {
                path: self.key.clone(),
                source,
            })?;
        }
        server_config(&cert, &key, &ca)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in `pem`, in order; at least one.
pub fn certs(what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, LinkTlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LinkTlsError::Pem {
            what,
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(LinkTlsError::Pem {
            what,
            message: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// The private key in `pem`.
pub fn key(what: &'static str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, LinkTlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| LinkTlsError::Pem {
        what,
        message: e.to_string(),
    })
}

fn roots(ca_pem: &[u8]) -> Result<RootCertStore, LinkTlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs("the link CA", ca_pem)? {
        roots.add(c).map_err(|source| LinkTlsError::Rustls {
            what: "the link CA",
            source,
        })?;
    }
    Ok(roots)
}

fn tls13(what: &'static str) -> impl Fn(rustls::Error) -> LinkTlsError {
    move |source| LinkTlsError::Rustls { what, source }
}

/// The agent's side: its certificate chain and key, and the CA a client's
/// certificate must chain to (required).
pub fn server_config(cert_pem: &[u8], key_pem: &[u8], client_ca_pem: &[u8]) -> Result<Arc<ServerConfig>, LinkTlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_ca_pem)?), provider())
        .build()
        .map_err(|e| LinkTlsError::Verifier(e.to_string()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls13("TLS 1.3"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs("the agent certificate", cert_pem)?,
            key("the agent key", key_pem)?,
        )
        .map_err(tls13("the agent certificate and key"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// The host's side: the CA an agent's certificate must chain to, and the
/// host's own certificate chain and key.
pub fn client_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ClientConfig>, LinkTlsError> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls13("TLS 1.3"))?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(certs("the host certificate", cert_pem)?, key("the host key", key_pem)?)
        .map_err(tls13("the host certificate and key"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// Opens TLS over `io` as the host, verifying the agent as [`SERVER_NAME`].
pub async fn connect<S>(cfg: Arc<ClientConfig>, io: S) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let name = ServerName::try_from(SERVER_NAME).map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(cfg).connect(name, io).await
}
