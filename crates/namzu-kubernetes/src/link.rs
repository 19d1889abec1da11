//! The pod link's credentials: mutual TLS between the host and each pod's
//! agent ([`namzu_proto::link_tls`]), so that neither a namespace reader
//! (who sees every pod's uid, the bind token) nor a command inside a pod
//! (which shares the agent's uid and reaches its port on loopback) can
//! speak to an agent as the host, and nothing crosses the pod network in
//! clear.
//!
//! [`LinkCredentials::generate`] makes, once per deployment:
//! * a CA, whose private key is dropped as soon as it has signed the two
//!   certificates below — nobody holds it, so nobody can mint a third;
//! * the host's client certificate (clientAuth) and key: kept by the host
//!   alone ([`LinkCredentials::write_host_dir`], the key mode 0600), never
//!   sent to the cluster;
//! * the agents' server certificate (serverAuth, for
//!   [`namzu_proto::link_tls::SERVER_NAME`]) and key, for the cluster's
//!   Secret [`SERVER_SECRET`], which only the template's init container
//!   mounts; it copies them into a memory volume the agent reads and
//!   removes the key from before any command runs.
//!
//! The CA certificate goes to the ConfigMap [`CA_CONFIGMAP`] (public). An
//! agent admits only a client certificate of that CA with the clientAuth
//! usage: the server key (readable by whoever may read Secrets) is not
//! one. What a Secret reader CAN do is pose as an agent to a host whose
//! traffic they can already intercept; `docs/kubernetes.md` says so.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use namzu_proto::link_tls::{self, LinkTlsError, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// The ConfigMap holding the link CA's certificate (key [`CA_KEY`]).
pub const CA_CONFIGMAP: &str = "namzu-link-ca";
/// The Secret (`kubernetes.io/tls`) holding the agents' certificate and key.
pub const SERVER_SECRET: &str = "namzu-link-server";
/// The CA certificate's key in the ConfigMap and its file in a host dir.
pub const CA_KEY: &str = "ca.crt";
/// The host's certificate and key files in a host dir.
pub const CLIENT_CERT_FILE: &str = "client.crt";
/// See [`CLIENT_CERT_FILE`].
pub const CLIENT_KEY_FILE: &str = "client.key";

/// Why link credentials could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Generating a key or a certificate failed.
    #[error("generating the link credentials: {0}")]
    Generate(String),
    /// A host credential file.
    #[error("link credential file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// What the filesystem said.
        #[source]
        source: std::io::Error,
    },
    /// The PEM material is not usable TLS configuration.
    #[error(transparent)]
    Tls(#[from] LinkTlsError),
}

/// Everything [`LinkCredentials::generate`] makes (PEM). The CA's key is
/// not among it.
#[derive(Clone)]
pub struct LinkCredentials {
    /// The CA certificate (public: the ConfigMap, and the host's roots).
    pub ca_cert: String,
    /// The agents' certificate and key (the Secret).
    pub server_cert: String,
    /// See [`LinkCredentials::server_cert`].
    pub server_key: String,
    /// The host's certificate and key (the host alone).
    pub client_cert: String,
    /// See [`LinkCredentials::client_cert`].
    pub client_key: String,
}

impl std::fmt::Debug for LinkCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkCredentials").finish_non_exhaustive()
    }
}

/// Validity: from January 1 of this year to January 1 two years on (at
/// least a year); `namzu kube link-init` again to rotate.
fn validity(p: &mut CertificateParams) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 365.2425-day years: off by at most a day at a year's edge, which
    // the January-1 bounds absorb.
    let year = 1970 + i32::try_from(secs / 31_556_952).unwrap_or(0);
    p.not_before = rcgen::date_time_ymd(year, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
}

fn leaf(names: Vec<String>, common: &str, usage: ExtendedKeyUsagePurpose) -> Result<CertificateParams, LinkError> {
    let gen = |e: rcgen::Error| LinkError::Generate(e.to_string());
    let mut p = CertificateParams::new(names).map_err(gen)?;
    p.distinguished_name.push(DnType::CommonName, common);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![usage];
    validity(&mut p);
    Ok(p)
}

impl LinkCredentials {
    /// A fresh CA, server and host identity (ECDSA P-256); the CA's key
    /// is dropped here.
    pub fn generate() -> Result<Self, LinkError> {
        let gen = |e: rcgen::Error| LinkError::Generate(e.to_string());
        let ca_key = KeyPair::generate().map_err(gen)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
        ca.distinguished_name.push(DnType::CommonName, "namzu link CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut ca);
        let ca_cert = ca.self_signed(&ca_key).map_err(gen)?.pem();
        let issuer = Issuer::new(ca, ca_key);
        let server_key = KeyPair::generate().map_err(gen)?;
        let server_cert = leaf(
            vec![SERVER_NAME.into()],
            "namzu agent",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?
        .signed_by(&server_key, &issuer)
        .map_err(gen)?
        .pem();
        let client_key = KeyPair::generate().map_err(gen)?;
        let client_cert = leaf(Vec::new(), "namzu host", ExtendedKeyUsagePurpose::ClientAuth)?
            .signed_by(&client_key, &issuer)
            .map_err(gen)?
            .pem();
        Ok(Self {
            ca_cert,
            server_cert,
            server_key: server_key.serialize_pem(),
            client_cert,
            client_key: client_key.serialize_pem(),
        })
    }

    /// The host's side as a dialer uses it.
    pub fn host_tls(&self) -> Result<LinkTls, LinkError> {
        LinkTls::from_pem(
            self.ca_cert.as_bytes(),
            self.client_cert.as_bytes(),
            self.client_key.as_bytes(),
        )
    }

    /// Writes the host's files into `dir` (made 0700): [`CA_KEY`],
    /// [`CLIENT_CERT_FILE`] and [`CLIENT_KEY_FILE`] (0600), each written
    /// whole under a temporary name and renamed.
    pub fn write_host_dir(&self, dir: &Path) -> Result<(), LinkError> {
        private_dir(dir)?;
        for (name, pem) in [
            (CA_KEY, &self.ca_cert),
            (CLIENT_CERT_FILE, &self.client_cert),
            (CLIENT_KEY_FILE, &self.client_key),
        ] {
            write_private(&dir.join(name), pem.as_bytes())?;
        }
        Ok(())
    }

    /// Writes [`LinkCredentials::cluster_objects`] as a YAML manifest for
    /// `kubectl apply -f` (mode 0600: it holds the agents' key), its
    /// directory made 0700 if missing.
    pub fn write_manifest(&self, path: &Path, namespace: &str) -> Result<(), LinkError> {
        let docs = self
            .cluster_objects(namespace)
            .iter()
            .map(serde_yaml::to_string)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LinkError::Generate(e.to_string()))?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            private_dir(parent)?;
        }
        write_private(path, docs.join("---\n").as_bytes())
    }

    /// The cluster's side: the ConfigMap [`CA_CONFIGMAP`] and the Secret
    /// [`SERVER_SECRET`] in `namespace`, as JSON objects to apply.
    pub fn cluster_objects(&self, namespace: &str) -> [serde_json::Value; 2] {
        let meta = |name: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "namzu".to_owned(),
            )])),
            ..Default::default()
        };
        let cm = ConfigMap {
            metadata: meta(CA_CONFIGMAP),
            data: Some(BTreeMap::from([(CA_KEY.to_owned(), self.ca_cert.clone())])),
            ..Default::default()
        };
        let secret = Secret {
            metadata: meta(SERVER_SECRET),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("tls.crt".to_owned(), ByteString(self.server_cert.clone().into_bytes())),
                ("tls.key".to_owned(), ByteString(self.server_key.clone().into_bytes())),
            ])),
            ..Default::default()
        };
        let with_kind = |mut v: serde_json::Value, kind: &str| {
            v["apiVersion"] = "v1".into();
            v["kind"] = kind.into();
            v
        };
        [
            with_kind(serde_json::to_value(cm).unwrap_or_default(), "ConfigMap"),
            with_kind(serde_json::to_value(secret).unwrap_or_default(), "Secret"),
        ]
    }
}

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> LinkError {
    let path = path.display().to_string();
    move |source| LinkError::File { path, source }
}

/// Makes `dir` (and its parents) if missing, mode 0700.
fn private_dir(dir: &Path) -> Result<(), LinkError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(file_error(dir))
}

/// [`namzu_core::fsutil::write_private`], its error naming the file.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), LinkError> {
    namzu_core::fsutil::write_private(path, bytes).map_err(file_error(path))
}

/// The host's side of the pod link: the CA an agent must prove itself by,
/// and the host's own certificate and key.
#[derive(Clone)]
pub struct LinkTls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkTls { .. }")
    }
}

impl LinkTls {
    /// From PEM: the CA certificate, the host's certificate and its key.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, LinkError> {
        Ok(Self {
            config: link_tls::client_config(ca, cert, key)?,
        })
    }

    /// From a directory [`LinkCredentials::write_host_dir`] wrote.
    pub fn from_dir(dir: &Path) -> Result<Self, LinkError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| LinkError::File {
                path: path.display().to_string(),
                source,
            })
        };
        Self::from_pem(&read(CA_KEY)?, &read(CLIENT_CERT_FILE)?, &read(CLIENT_KEY_FILE)?)
    }

    /// The rustls configuration a dial uses.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }
}
