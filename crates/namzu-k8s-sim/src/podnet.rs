//! The simulated pod network. As root (with iproute2 and util-linux's
//! `nsenter`), a pod gets what a CNI plugin gives it: a veth pair whose
//! inner end lives in the pod sandbox's own network namespace, a /30 of
//! `10.244.0.0/16` (the host end .1, the pod .2), so the host dials the
//! agent's real TCP port at the pod's IP. The pod has no other route; a
//! dead pod's IP is unreachable at once (an `unreachable 10.244.0.0/16`
//! route, held while any simulator in the process runs), not a timeout.
//!
//! Without root, the pod network is a relay: the pod's IP is a loopback
//! address of its own (127.0.x.y) whose port is relayed to the agent's
//! unix socket. The agent and its token check are the same either way;
//! the link's mutual TLS, which the agent serves on its TCP port, is
//! served there by the relay, from the pod's own files and with the same
//! configuration ([`namzu_proto::link_tls`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use tokio::process::Command;

/// The pods' address range.
pub const POD_CIDR: &str = "10.244.0.0/16";

/// How pods are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A veth pair into the pod's network namespace.
    Veth,
    /// A loopback address relayed to the agent's socket.
    Relay,
}

impl Mode {
    /// Veth where this process may make one, else the relay.
    pub fn detect() -> Self {
        let root = nix::unistd::geteuid().is_root();
        let tools = ["ip", "nsenter"]
            .iter()
            .all(|t| std::process::Command::new(t).arg("-V").output().is_ok());
        if root && tools {
            Self::Veth
        } else {
            Self::Relay
        }
    }
}

/// A pod's attachment to the network.
pub enum Attachment {
    Veth { host_if: String },
    Relay { task: tokio::task::JoinHandle<()> },
}

/// One pod's network.
pub struct PodNet {
    pub ip: Ipv4Addr,
    pub attachment: Attachment,
}

static NEXT: AtomicU32 = AtomicU32::new(0);
static USERS: Mutex<usize> = Mutex::new(0);
/// Host ends of the veth pairs this process made and has not removed,
/// with the controller that owns each: what a torn-down controller
/// removes even when its pods' teardown never ran.
static LIVE: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<(String, u64)>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes every veth pair `owner` made that is still there.
pub fn remove_all(owner: u64) {
    let mine: Vec<String> = {
        let mut l = live();
        let (mine, rest): (Vec<_>, Vec<_>) = l.drain(..).partition(|(_, o)| *o == owner);
        *l = rest;
        mine.into_iter().map(|(n, _)| n).collect()
    };
    for host_if in mine {
        run_now(&["link", "del", &host_if]);
    }
}

async fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().await.map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn run_now(args: &[&str]) {
    let _ = std::process::Command::new("ip").args(args).output();
}

/// Holds the range's unreachable route while a simulator runs (veth mode).
pub fn hold_range() {
    let first = {
        let mut n = USERS.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        *n == 1
    };
    if first {
        run_now(&["route", "replace", "unreachable", POD_CIDR]);
    }
}

/// Lets go of the range's route once no simulator holds it.
pub fn release_range() {
    let last = {
        let mut n = USERS.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        *n == 0
    };
    if last {
        run_now(&["route", "del", "unreachable", POD_CIDR]);
    }
}

/// The process inside the sandbox launched as `launcher`: the first
/// descendant in another network namespace.
fn inner_pid(launcher: u32) -> Option<u32> {
    let own = std::fs::read_link("/proc/self/ns/net").ok()?;
    let mut queue = vec![launcher];
    while let Some(p) = queue.pop() {
        if std::fs::read_link(format!("/proc/{p}/ns/net")).is_ok_and(|n| n != own) {
            return Some(p);
        }
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            queue.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    None
}

/// Attaches the sandbox whose state lives in `dir` (its `meta.json` names
/// the launcher) to the pod network: a fresh /30 and a veth pair — or,
/// with `keep`, the /30 of that pod IP (a restarted container keeps its
/// pod's address).
pub async fn attach_veth(dir: &Path, owner: u64, keep: Option<Ipv4Addr>) -> Result<PodNet, String> {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let launcher = meta["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or("no launcher pid")?;
    let pid = inner_pid(launcher).ok_or("the pod's network namespace was not found")?;
    let netns = format!("--net=/proc/{pid}/ns/net");
    let mut last = String::new();
    let kept = keep.map(|ip| {
        let [_, _, hi, lo] = ip.octets();
        ((u32::from(hi) << 8) | u32::from(lo)) / 4
    });
    for _ in 0..if kept.is_some() { 1 } else { 64 } {
        let slot = kept.unwrap_or_else(|| (NEXT.fetch_add(1, Ordering::SeqCst) + std::process::id() * 7) % 16_384);
        let base = slot * 4;
        let octets = |n: u32| {
            Ipv4Addr::new(
                10,
                244,
                u8::try_from(n >> 8).unwrap_or(0),
                u8::try_from(n & 255).unwrap_or(0),
            )
        };
        let (host_ip, pod_ip) = (octets(base + 1), octets(base + 2));
        let (host_if, pod_if) = (format!("nzh{slot:x}"), format!("nzp{slot:x}"));
        if let Err(e) =
            run(Command::new("ip").args(["link", "add", &host_if, "type", "veth", "peer", "name", &pod_if])).await
        {
            last = e;
            continue;
        }
        live().push((host_if.clone(), owner));
        let setup = async {
            run(Command::new("ip").args(["link", "set", &pod_if, "netns", &pid.to_string()])).await?;
            run(Command::new("ip").args(["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])).await?;
            run(Command::new("ip").args(["link", "set", &host_if, "up"])).await?;
            run(Command::new("nsenter").args([
                netns.as_str(),
                "ip",
                "addr",
                "add",
                &format!("{pod_ip}/30"),
                "dev",
                &pod_if,
            ]))
            .await?;
            run(Command::new("nsenter").args([netns.as_str(), "ip", "link", "set", &pod_if, "up"])).await
        };
        match setup.await {
            Ok(()) => {
                return Ok(PodNet {
                    ip: pod_ip,
                    attachment: Attachment::Veth { host_if },
                })
            }
            Err(e) => {
                let _ = run(Command::new("ip").args(["link", "del", &host_if])).await;
                live().retain(|(n, _)| *n != host_if);
                last = e;
            }
        }
    }
    Err(format!("no pod network: {last}"))
}

static NEXT_LOOPBACK: AtomicU32 = AtomicU32::new(0);

/// A loopback pod IP whose `port` relays to the agent's unix `socket`;
/// with `keep`, that one (a restarted container keeps its pod's address).
pub async fn attach_relay(
    socket: PathBuf,
    port: u16,
    tls: Option<std::sync::Arc<tokio_rustls::rustls::ServerConfig>>,
    keep: Option<Ipv4Addr>,
) -> Result<PodNet, String> {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut last = String::new();
    for _ in 0..if keep.is_some() { 1 } else { 64 } {
        let n = NEXT_LOOPBACK.fetch_add(1, Ordering::SeqCst) + std::process::id() * 7;
        let ip = keep.unwrap_or_else(|| {
            Ipv4Addr::new(
                127,
                0,
                u8::try_from(1 + (n / 250) % 250).unwrap_or(1),
                u8::try_from(1 + n % 250).unwrap_or(1),
            )
        });
        match tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port)).await {
            Ok(listener) => {
                let task = tokio::spawn(async move {
                    loop {
                        let Ok((mut tcp, _)) = listener.accept().await else {
                            return;
                        };
                        let socket = socket.clone();
                        let tls = tls.clone();
                        tokio::spawn(async move {
                            let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await else {
                                return;
                            };
                            match tls {
                                Some(tls) => {
                                    if let Ok(mut s) = tls.accept(tcp).await {
                                        let _ = tokio::io::copy_bidirectional(&mut s, &mut unix).await;
                                    }
                                }
                                None => {
                                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                                }
                            }
                        });
                    }
                });
                return Ok(PodNet {
                    ip,
                    attachment: Attachment::Relay { task },
                });
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("no pod IP: {last}"))
}

impl PodNet {
    /// Takes the pod off the network: its IP stops answering at once.
    pub async fn detach(self) {
        match self.attachment {
            Attachment::Veth { host_if } => {
                let _ = run(Command::new("ip").args(["link", "del", &host_if])).await;
                live().retain(|(n, _)| *n != host_if);
            }
            Attachment::Relay { task } => {
                task.abort();
                let _ = task.await;
            }
        }
    }
}
