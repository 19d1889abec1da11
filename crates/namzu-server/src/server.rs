//! The listener: accepts TCP (and TLS, with rustls) connections and serves
//! HTTP/1.1 and HTTP/2 (h2c by prior knowledge, or h2 by ALPN) on each,
//! WebSocket upgrades included; bounds connections and the time to send a
//! request head; and shuts down gracefully: stop accepting, let streams
//! run for `shutdown_grace`, then end them with an event that says where
//! to re-attach. Sandboxes are never touched by a shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::rustls;

use crate::config::{ConfigError, ServerConfig, TlsFiles};
use crate::state::AppState;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server's state directory could not be opened.
    #[error("cannot open the server's records")]
    State(#[source] std::io::Error),
}

fn tls_acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, ConfigError> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| ConfigError::Tls(format!("{}: {e}", p.display())));
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::Tls(format!("{}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::Tls(format!("{}: no certificate", files.cert.display())));
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| ConfigError::Tls(format!("{}: {e}", files.key.display())))?
        .ok_or_else(|| ConfigError::Tls(format!("{}: no private key", files.key.display())))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ConfigError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// Serves `config` until `shutdown` resolves. `ready` is called with the
/// bound address (useful with port 0) once connections are accepted.
pub async fn serve(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    config.validate()?;
    let tls = config.tls.as_ref().map(tls_acceptor).transpose()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.listen,
        source,
    })?;
    let limits = config.limits.clone();
    let tiers = config.tiers.clone();
    let st = AppState::new(config).map_err(ServeError::State)?;
    st.registry.warm(&tiers).await;
    let reaper = tokio::spawn(crate::api::sandboxes::reap(st.clone()));
    let app = crate::api::router(st.clone());

    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let conns = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));

    tracing::info!(%addr, tls = tls.is_some(), "namzu serve: listening");
    ready(addr);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = conns.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let head_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, "connection: {e}");
                    }
                }
                Some(acceptor) => {
                    let stream = match tokio::time::timeout(head_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return tracing::debug!(%peer, "TLS handshake: {e}"),
                        Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                    };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, "connection: {e}");
                    }
                }
            }
        });
    }
    drop(listener);
    tracing::info!(
        grace_ms = limits.shutdown_grace.as_millis() as u64,
        "namzu serve: shutting down; sandboxes are kept"
    );
    let drained = tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await;
    if drained.is_err() {
        // Streams still open get their last event: where to re-attach.
        st.shutdown.cancel();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    st.shutdown.cancel();
    reaper.abort();
    // The warm pools' sandboxes are the server's own, never a caller's.
    st.registry.close_pools().await;
    Ok(())
}
