//! The pod link, attacked from the pod network (item 5 of the kubernetes
//! tier's link): against a simulated pod's real agent, reached at its pod
//! IP, every way in without the host's private key is refused — the pod's
//! uid (the bind token, which any namespace reader sees) over plaintext,
//! TLS with no client certificate, a certificate of another CA, and the
//! agents' own certificate and key (what a Secret reader holds) — while
//! the host's credentials work. The host refuses an agent that cannot
//! prove itself, and what crosses the pod network is TLS, not plaintext.
//! (The attack from inside the pod is the escape suite's
//! `escape_kubernetes_sim`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use namzu::{AgentClient, ClientOptions, Error, ExecRequest, SandboxSpec};
use namzu_k8s_sim::cluster::Cluster;
use namzu_k8s_sim::podnet::Mode;
use namzu_kubernetes::link::LinkCredentials;
use namzu_kubernetes::AddressMode;
use namzu_proto::link_tls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::*;

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Links to `addr` with `token`, each stream opened by `dial`.
async fn link<F, Fut, S>(addr: SocketAddr, token: &str, dial: F) -> namzu::Result<AgentClient>
where
    F: Fn(SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = std::io::Result<S>> + Send + 'static,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let opts = ClientOptions {
        connect_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    AgentClient::connect("x", &addr.to_string(), token.as_bytes().to_vec(), opts, move || {
        dial(addr)
    })
    .await
}

/// A TLS dialer with this client configuration.
fn tls(
    cfg: Arc<rustls::ClientConfig>,
) -> impl Fn(SocketAddr) -> futures::future::BoxFuture<'static, std::io::Result<Tls>> + Send + Sync {
    move |addr| {
        let cfg = cfg.clone();
        Box::pin(async move { link_tls::connect(cfg, tokio::net::TcpStream::connect(addr).await?).await })
    }
}

fn plain(addr: SocketAddr) -> futures::future::BoxFuture<'static, std::io::Result<tokio::net::TcpStream>> {
    Box::pin(tokio::net::TcpStream::connect(addr))
}

/// The link's CA as roots, and no client certificate.
fn no_client_cert(ca: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in link_tls::certs("ca", ca.as_bytes()).unwrap() {
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// A TCP relay to `to` keeping every byte each way.
async fn recording_relay(to: SocketAddr) -> (SocketAddr, Arc<Mutex<(Vec<u8>, Vec<u8>)>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let rec = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(to).await else {
                return;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            let (up, down) = (rec.clone(), rec.clone());
            tokio::spawn(async move {
                let mut b = [0u8; 16384];
                while let Ok(n @ 1..) = cr.read(&mut b).await {
                    up.lock().unwrap().0.extend_from_slice(&b[..n]);
                    if sw.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let mut b = [0u8; 16384];
                while let Ok(n @ 1..) = sr.read(&mut b).await {
                    down.lock().unwrap().1.extend_from_slice(&b[..n]);
                    if cw.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (at, seen)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_host_key_opens_a_pods_link_and_the_link_is_not_plaintext() {
    let c = Cluster::start(None).await.unwrap();
    if std::env::var("NAMZU_REQUIRE_NET").as_deref() == Ok("1") {
        assert_eq!(c.ctl.pod_network(), Mode::Veth);
    }
    let mut opts = c.options(false);
    opts.address_mode = AddressMode::PodIp;
    let p = provider(&c, opts);
    let sb = p.create_task(SandboxSpec::default()).await.unwrap();
    let pod = k8s(&sb).bound().pod.clone();
    let addr = SocketAddr::new(pod.ip.unwrap(), 1024);
    if c.ctl.pod_network() == Mode::Veth {
        assert!(addr.ip().to_string().starts_with("10.244."), "{addr}");
    }
    let host = c.link.host_tls().unwrap().client_config();
    // The init container copied the Secret's files into the memory
    // volume; the agent removed the key once read.
    let link_dir = c.state_dir().join("sim-pods").join(&pod.uid).join("volumes/namzu-link");
    assert!(link_dir.join("tls.crt").is_file(), "{}", link_dir.display());
    assert!(
        !link_dir.join("tls.key").exists(),
        "the agent left its key in the pod's volume"
    );

    // The pod's uid over plaintext: what the link was before.
    let r = link(addr, &pod.uid, plain).await;
    assert!(r.is_err(), "a plaintext link with the pod uid was let in");
    // TLS, the right CA, no client certificate.
    let r = link(addr, &pod.uid, tls(no_client_cert(&c.link.ca_cert))).await;
    assert!(r.is_err(), "a link without a client certificate was let in");
    // A client certificate of another CA (trusting the right one).
    let other = LinkCredentials::generate().unwrap();
    let foreign = link_tls::client_config(
        c.link.ca_cert.as_bytes(),
        other.client_cert.as_bytes(),
        other.client_key.as_bytes(),
    )
    .unwrap();
    let r = link(addr, &pod.uid, tls(foreign)).await;
    assert!(r.is_err(), "another CA's client certificate was let in");
    // The agents' own certificate and key: what reading the Secret gives.
    let secret_holder = link_tls::client_config(
        c.link.ca_cert.as_bytes(),
        c.link.server_cert.as_bytes(),
        c.link.server_key.as_bytes(),
    )
    .unwrap();
    let r = link(addr, &pod.uid, tls(secret_holder)).await;
    assert!(r.is_err(), "the agents' server certificate was let in as a client");
    // The host's key, with the wrong pod's token: the token still names
    // the pod.
    let r = link(addr, "not-the-uid", tls(host.clone())).await;
    assert!(matches!(r, Err(Error::Preface { .. })), "{r:?}");

    // The host's key and the pod's uid, through a relay that records the
    // pod network's bytes.
    let (via, seen) = recording_relay(addr).await;
    let canary = format!("namzu-plaintext-canary-{}", std::process::id());
    let right = link(via, &pod.uid, tls(host.clone())).await.unwrap();
    let out = right.exec(ExecRequest::shell(format!("echo {canary}"))).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), canary);
    drop(right);
    let (up, down) = seen.lock().unwrap().clone();
    assert!(
        up.len() > 200 && down.len() > 200,
        "the relay saw {} / {} bytes",
        up.len(),
        down.len()
    );
    // A TLS handshake record (22), TLS 1.x, each way.
    assert_eq!((up[0], up[1]), (0x16, 0x03), "{:?}", &up[..8]);
    assert_eq!((down[0], down[1]), (0x16, 0x03), "{:?}", &down[..8]);
    for (what, bytes) in [("host to pod", &up), ("pod to host", &down)] {
        assert!(
            !contains(bytes, canary.as_bytes()),
            "{what}: the command crossed in clear"
        );
        assert!(
            !contains(bytes, pod.uid.as_bytes()),
            "{what}: the token crossed in clear"
        );
        assert!(!contains(bytes, b"NZL1"), "{what}: the preface crossed in clear");
    }
    sb.destroy().await.unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_refuses_an_agent_that_cannot_prove_itself() {
    // An impostor on the pod network: a TLS server with another CA's
    // agent certificate (and it would admit the host's client cert).
    let ours = LinkCredentials::generate().unwrap();
    let theirs = LinkCredentials::generate().unwrap();
    let server = link_tls::server_config(
        theirs.server_cert.as_bytes(),
        theirs.server_key.as_bytes(),
        ours.ca_cert.as_bytes(),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let handshakes = Arc::new(Mutex::new(Vec::new()));
    let seen = handshakes.clone();
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        while let Ok((s, _)) = l.accept().await {
            let r = acceptor.accept(s).await.map(drop).map_err(|e| e.to_string());
            seen.lock().unwrap().push(r);
        }
    });
    let host = ours.host_tls().unwrap().client_config();
    let Err(e) = link_tls::connect(host.clone(), tokio::net::TcpStream::connect(addr).await.unwrap()).await else {
        panic!("the host finished a handshake with an impostor")
    };
    assert!(e.to_string().contains("certificate"), "{e}");
    // Control: the same impostor with OUR agent certificate is accepted
    // (so what failed above was the proof, not the plumbing).
    let genuine = link_tls::server_config(
        ours.server_cert.as_bytes(),
        ours.server_key.as_bytes(),
        ours.ca_cert.as_bytes(),
    )
    .unwrap();
    let l2 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr2 = l2.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = l2.accept().await.unwrap();
        let mut t = tokio_rustls::TlsAcceptor::from(genuine).accept(s).await.unwrap();
        t.write_all(b"ok").await.unwrap();
        t.flush().await.unwrap();
    });
    let mut t = link_tls::connect(host, tokio::net::TcpStream::connect(addr2).await.unwrap())
        .await
        .unwrap();
    let mut b = [0u8; 2];
    t.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_link_credentials_acquire_and_connect_are_refused_before_any_request() {
    let c = Cluster::start(None).await.unwrap();
    let p = provider(
        &c,
        namzu_kubernetes::KubernetesOptions {
            link_tls: None,
            ..c.options(false)
        },
    );
    for r in [
        p.create_task(SandboxSpec::default()).await.err(),
        namzu::Provider::connect(&p, "sb-000000000001").await.err(),
    ] {
        match r {
            Some(Error::OptionRefused { option, reason, .. }) => {
                assert_eq!(option, "link_tls");
                assert!(reason.contains("link-init"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(p.api().calls().is_empty(), "{:?}", p.api().calls());
    // The tier's operations need no link.
    namzu_kubernetes::ops::read_task_capacity(p.api(), p.options())
        .await
        .unwrap();
    c.stop().await;
}
