//! The host side of egress: answers the agent's asks against the policy,
//! resolves, checks every address, connects and splices. One [`Service`]
//! per sandbox, run by the egress supervisor ([`super::supervisor`]).
//!
//! A policy change ([`Service::set`]) is atomic: asks decided after it see
//! only the new policy, and every open connection the new policy would
//! refuse is closed (both ends) before `set` returns.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use namzu_proto::v1::{self, egress_ask, EgressAsk, EgressVerdict};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use ipnet::IpNet;

use super::addr;
use super::policy::{EgressPolicy, PolicyError, Refusal, Target};
use crate::client::AgentClient;
use crate::error::Result;

/// How long one connection attempt to one address may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const CHUNK: usize = 64 * 1024;

/// A sandbox's egress settings: the policy, names the host resolves itself
/// (like `docker run --add-host`), consulted before the system resolver,
/// and the link-local or cloud-metadata addresses the sandbox may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressConfig {
    #[serde(default)]
    pub policy: EgressPolicy,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Link-local and cloud-metadata addresses ([`addr::LINK_LOCAL`]) that
    /// the policy may reach. Empty by default, and then they are refused
    /// under every policy, allow-all included: the connection would leave
    /// from the host's own network stack and reach the HOST's metadata
    /// service (its credentials). Only ranges inside that space are
    /// accepted ([`PolicyError::NotLinkLocal`]); naming one opens nothing
    /// else, and the policy still decides (deny-all reaches nothing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reach_link_local: Vec<IpNet>,
}

impl EgressConfig {
    /// The policy's entries, and every `reach_link_local` range inside
    /// link-local or metadata space.
    pub fn validate(&self) -> std::result::Result<(), PolicyError> {
        self.policy.validate()?;
        match self.reach_link_local.iter().find(|n| !addr::is_link_local_net(n)) {
            Some(n) => Err(PolicyError::NotLinkLocal {
                cidr: *n,
                reason: "169.254.0.0/16, fe80::/10 and the metadata addresses are the space".into(),
            }),
            None => Ok(()),
        }
    }

    /// [`EgressPolicy::may_connect`] with this configuration's opt-ins.
    pub fn may_connect(&self, host: &str, port: u16) -> std::result::Result<Target, Refusal> {
        self.policy.may_connect_with(host, port, &self.reach_link_local)
    }

    /// [`EgressPolicy::may_reach`] with this configuration's opt-ins.
    pub fn may_reach(&self, ip: IpAddr) -> std::result::Result<(), Refusal> {
        self.policy.may_reach_with(ip, &self.reach_link_local)
    }
}

/// One open connection, as the policy sees it.
struct Conn {
    host: String,
    port: u16,
    addr: IpAddr,
    close: CancellationToken,
}

/// The egress decisions of one sandbox.
pub struct Service {
    id: String,
    config: RwLock<EgressConfig>,
    conns: Mutex<HashMap<u64, Conn>>,
    next: AtomicU64,
}

impl Service {
    pub fn new(id: impl Into<String>, config: EgressConfig) -> Arc<Self> {
        Arc::new(Self {
            id: id.into(),
            config: RwLock::new(config),
            conns: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> EgressConfig {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Replaces the policy (and host overrides) and closes every open
    /// connection the new policy refuses. Returns how many it closed.
    pub fn set(&self, config: EgressConfig) -> usize {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config.clone();
        let mut closed = 0;
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for c in conns.values() {
            let verdict = config
                .may_connect(&c.host, c.port)
                .and_then(|_| config.may_reach(c.addr));
            if let Err(why) = verdict {
                tracing::info!(sandbox = %self.id, host = %c.host, port = c.port, address = %c.addr, reason = %why, "egress: open connection closed by a policy change");
                c.close.cancel();
                closed += 1;
            }
        }
        closed
    }

    /// Answers asks on the agent's `Egress` call until it ends;
    /// `attached` runs once the call is up.
    pub async fn serve(self: &Arc<Self>, client: &AgentClient, attached: impl FnOnce()) -> Result<()> {
        let (verdicts, mut asks) = client.egress_channel().await?;
        tracing::info!(sandbox = %self.id, "egress: attached");
        attached();
        while let Some(ask) = asks.next().await {
            let Ok(ask) = ask else { break };
            let (me, client, verdicts) = (self.clone(), client.clone(), verdicts.clone());
            tokio::spawn(async move {
                if let Some(v) = me.handle(&client, ask).await {
                    let _ = verdicts.send(v).await;
                }
            });
        }
        Ok(())
    }

    async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        if let Some(a) = self.config.read().unwrap_or_else(|p| p.into_inner()).hosts.get(name) {
            return Ok(a.clone());
        }
        Ok(tokio::net::lookup_host((name, 0)).await?.map(|s| s.ip()).collect())
    }

    /// One ask; `None` when the answer is the splice itself.
    async fn handle(self: &Arc<Self>, client: &AgentClient, ask: EgressAsk) -> Option<EgressVerdict> {
        let id = ask.id;
        let refuse = |r: String| EgressVerdict {
            id,
            refusal: r,
            ..Default::default()
        };
        let fail = |e: String| EgressVerdict {
            id,
            error: e,
            ..Default::default()
        };
        match ask.what? {
            egress_ask::What::Resolve(q) => {
                let name = match self.config().policy.may_resolve(&q.name) {
                    Ok(n) => n,
                    Err(why) => {
                        self.log(&q.name, 0, "resolve", Err(&why));
                        return Some(refuse(why.to_string()));
                    }
                };
                match self.resolve(&name).await {
                    Ok(addrs) => {
                        tracing::info!(sandbox = %self.id, host = %name, verdict = "resolved", count = addrs.len(), "egress");
                        Some(EgressVerdict {
                            id,
                            addresses: addrs
                                .into_iter()
                                .filter(|a| a.is_ipv6() == q.ipv6)
                                .map(|a| match a {
                                    IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
                                    IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
                                })
                                .collect(),
                            ..Default::default()
                        })
                    }
                    Err(e) => Some(fail(format!("resolve {name}: {e}"))),
                }
            }
            egress_ask::What::Connect(c) => {
                let Ok(port) = u16::try_from(c.port) else {
                    return Some(refuse(format!("port {} is not a port", c.port)));
                };
                let policy = self.config();
                let (host, addrs) = match policy.may_connect(&c.host, port) {
                    Err(why) => {
                        self.log(&c.host, port, &c.via, Err(&why));
                        return Some(refuse(why.to_string()));
                    }
                    Ok(Target::Address(ip)) => (ip.to_string(), vec![ip]),
                    Ok(Target::Name(name)) => match self.resolve(&name).await {
                        Ok(a) if a.is_empty() => return Some(fail(format!("{name} has no address"))),
                        Ok(a) => (name, a),
                        Err(e) => return Some(fail(format!("resolve {name}: {e}"))),
                    },
                };
                // Every address, not just the one dialled: a permitted name
                // that resolves inside is refused whole (DNS rebinding).
                if let Some(why) = addrs.iter().find_map(|a| policy.may_reach(*a).err()) {
                    self.log(&host, port, &c.via, Err(&why));
                    return Some(refuse(why.to_string()));
                }
                let mut last = String::new();
                for addr in &addrs {
                    let sa = SocketAddr::new(*addr, port);
                    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(sa)).await {
                        Ok(Ok(stream)) => {
                            self.log(&host, port, &c.via, Ok(*addr));
                            return self.splice(client, id, host, port, *addr, stream).await.err().map(fail);
                        }
                        Ok(Err(e)) => last = format!("connect {sa}: {e}"),
                        Err(_) => last = format!("connect {sa}: no answer within {CONNECT_TIMEOUT:?}"),
                    }
                }
                tracing::info!(sandbox = %self.id, host = %host, port, via = %c.via, verdict = "failed", reason = %last, "egress");
                Some(fail(last))
            }
        }
    }

    fn log(&self, host: &str, port: u16, via: &str, verdict: std::result::Result<IpAddr, &Refusal>) {
        match verdict {
            Ok(addr) => {
                tracing::info!(sandbox = %self.id, host, port, via, address = %addr, verdict = "allowed", "egress")
            }
            Err(why) => {
                tracing::info!(sandbox = %self.id, host, port, via, verdict = "refused", reason = %why, "egress")
            }
        }
    }

    /// Joins `stream` to the agent's client for ask `id` until either side
    /// ends or a policy change closes it.
    async fn splice(
        self: &Arc<Self>,
        client: &AgentClient,
        id: u64,
        host: String,
        port: u16,
        addr: IpAddr,
        stream: tokio::net::TcpStream,
    ) -> std::result::Result<(), String> {
        let (to_sandbox, mut from_sandbox) = client.egress_splice(id).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let close = CancellationToken::new();
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            Conn {
                host,
                port,
                addr,
                close: close.clone(),
            },
        );
        let (mut rd, mut wr) = stream.into_split();
        let up = async {
            while let Some(Ok(m)) = from_sandbox.next().await {
                match m.msg {
                    Some(v1::tcp_output::Msg::Data(d)) => {
                        if wr.write_all(&d).await.is_err() {
                            return;
                        }
                    }
                    _ => break,
                }
            }
            let _ = wr.shutdown().await;
        };
        let down = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let m = match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => v1::egress_splice_input::Msg::Eof(v1::Empty {}),
                    Ok(n) => v1::egress_splice_input::Msg::Data(Bytes::copy_from_slice(&buf[..n])),
                };
                let eof = matches!(m, v1::egress_splice_input::Msg::Eof(_));
                if to_sandbox.send(v1::EgressSpliceInput { msg: Some(m) }).await.is_err() || eof {
                    return;
                }
            }
        };
        tokio::select! {
            _ = async { tokio::join!(up, down) } => {}
            _ = close.cancelled() => {}
        }
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        Ok(())
    }
}
