//! A real network for the egress tests: a network namespace joined to the
//! host by a veth pair (iproute2), holding test hosts at public-looking
//! addresses (TEST-NET-2, 198.51.100.0/24) and one at a private address, each
//! running real servers: HTTP that answers with the name of the address it
//! was reached at, a stream that ticks until closed, and TLS (`openssl
//! s_server`, with a certificate made for the run). The names tests use are
//! mapped to these addresses by the sandbox's egress `hosts`, the resolver
//! the host's egress service consults first.
//!
//! Needs root, `ip` and `openssl`; [`NetLab::available`] says why not.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// The public-looking range the lab claims on the host (TEST-NET-2). Not
/// TEST-NET-3 or TEST-NET-1: machines of this workplace sit at 192.0.2.0/24
/// and reach their package registries through 203.0.113.80, and a lab (or
/// one a killed run left behind) holding that range cut the host off from
/// them. [`NetLab::start`] refuses a range the host already talks to.
pub const PUB_NET: &str = "198.51.100.0/24";
/// The host's own address in [`PUB_NET`].
pub const HOST_PUB: &str = "198.51.100.1";
/// The first public-looking test host.
pub const PUB1: &str = "198.51.100.10";
/// The second.
pub const PUB2: &str = "198.51.100.11";
/// A private test host (the DNS-rebinding target).
pub const PRIVATE: &str = "10.231.0.10";
/// A link-local test host (169.254.0.0/16, like cloud metadata services).
/// Not 169.254.169.254 itself: a cloud machine routes that address to its
/// real metadata service, which no test may touch or re-route.
pub const LINK_LOCAL: &str = "169.254.77.1";
/// A port on [`PUB1`] where a virtual-host server answers every request
/// on a connection (keep-alive, pipelining, `Connection: close` ignored,
/// as a careless CDN edge might) with the Host it was sent:
/// `vhost <Host>`.
pub const VHOST_PORT: u16 = 8081;
/// The port of the ticking stream on [`PUB1`].
pub const STREAM_PORT: u16 = 9000;

pub struct NetLab {
    ns: String,
    pub dir: tempfile::TempDir,
    /// The TLS server's certificate (self-signed: it is its own CA).
    pub tls_cert: Vec<u8>,
    tls: Option<Child>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether the host may route `net` to the lab: not if a route of its own
/// (other than the default) already covers it, nor if a socket on the host
/// is talking to an address in it — a proxy, a registry, a resolver — which
/// the lab's route would take away.
fn claimable(net: &str) -> Result<(), String> {
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "match", net])
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    let routed: Vec<String> = String::from_utf8_lossy(&routes.stdout)
        .lines()
        .filter(|l| !l.starts_with("default"))
        .map(str::to_owned)
        .collect();
    if !routed.is_empty() {
        return Err(format!("{net} is already routed on this host: {}", routed.join("; ")));
    }
    let socks = Command::new("ss")
        .args(["-Htun", "dst", net])
        .output()
        .map_err(|e| format!("ss: {e}"))?;
    let talking = String::from_utf8_lossy(&socks.stdout).trim().to_owned();
    if !talking.is_empty() {
        return Err(format!(
            "this host is talking to {net}, which the lab would take away: {talking}"
        ));
    }
    Ok(())
}

impl NetLab {
    /// Why the lab cannot be built here, if it cannot.
    pub fn available() -> Result<(), String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root (network namespaces and veth)".into());
        }
        for tool in ["ip", "ss", "openssl", "curl"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                return Err(format!("needs {tool} (scripts/net-up.sh installs it)"));
            }
        }
        Ok(())
    }

    /// Builds the namespace, its addresses and its servers.
    pub fn start() -> Result<Self, String> {
        Self::available()?;
        let tag = format!("{:x}", std::process::id() & 0xffff);
        let ns = format!("nz-egress-{tag}");
        let (vh, vn) = (format!("nzh{tag}"), format!("nzn{tag}"));
        // A lab a killed run left behind would hold the same addresses
        // (and so the routes): ours by name, removed first.
        let listed = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        for stale in String::from_utf8_lossy(&listed.stdout).lines() {
            if let Some(name) = stale.split_whitespace().next().filter(|n| n.starts_with("nz-egress-")) {
                let _ = ip(&["netns", "del", name]);
            }
        }
        // A namespace no longer named can still be alive (a process of a
        // failed run holding a socket of it), and with it its veth, whose
        // host end keeps the lab's addresses and routes: found by the lab's
        // host address (the simulator's pod veths share the name prefix)
        // and deleted, which deletes the pair.
        let addrs = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        for line in String::from_utf8_lossy(&addrs.stdout).lines() {
            let mut f = line.split_whitespace();
            let dev = f.nth(1).unwrap_or_default().split('@').next().unwrap_or_default();
            if line.contains(&format!("inet {HOST_PUB}/24")) && dev != vh {
                let _ = ip(&["link", "del", dev]);
            }
        }
        claimable(PUB_NET)?;
        ip(&["netns", "add", &ns])?;
        let mut lab = Self {
            ns: ns.clone(),
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            tls_cert: Vec::new(),
            tls: None,
        };
        ip(&["link", "add", &vh, "type", "veth", "peer", "name", &vn, "netns", &ns])?;
        for a in [&format!("{HOST_PUB}/24"), "10.231.0.1/24", "169.254.77.2/24"] {
            ip(&["addr", "add", a, "dev", &vh])?;
        }
        ip(&["link", "set", &vh, "up"])?;
        for a in [PUB1, PUB2, PRIVATE, LINK_LOCAL] {
            ip(&["-n", &ns, "addr", "add", &format!("{a}/24"), "dev", &vn])?;
        }
        ip(&["-n", &ns, "link", "set", &vn, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        lab.start_servers()?;
        lab.start_tls()?;
        Ok(lab)
    }

    /// The names tests use, for `EgressConfig::hosts`.
    pub fn hosts() -> BTreeMap<String, Vec<IpAddr>> {
        let a = |s: &str| vec![s.parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0]))];
        BTreeMap::from([
            ("allowed.test".to_owned(), a(PUB1)),
            ("api.allowed.test".to_owned(), a(PUB2)),
            ("tls.allowed.test".to_owned(), a(PUB1)),
            ("evil-allowed.test".to_owned(), a(PUB2)),
            ("other.test".to_owned(), a(PUB2)),
            ("internal.allowed.test".to_owned(), a(PRIVATE)),
            ("metadata.allowed.test".to_owned(), a(LINK_LOCAL)),
        ])
    }

    /// What a test case needs of the running lab.
    pub fn handle(&self) -> LabHandle {
        LabHandle { ns: self.ns.clone() }
    }

    /// Plain servers, on threads that entered the namespace.
    fn start_servers(&self) -> Result<(), String> {
        let path = PathBuf::from(format!("/run/netns/{}", self.ns));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let entered = std::fs::File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|f| nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string()));
            let mut listeners = Vec::new();
            let bound = entered.and_then(|()| {
                for (addr, port) in [
                    (PUB1, 80),
                    (PUB1, 8080),
                    (PUB2, 80),
                    (PRIVATE, 80),
                    (LINK_LOCAL, 80),
                    (PUB1, VHOST_PORT),
                    (PUB1, STREAM_PORT),
                ] {
                    let l = TcpListener::bind((addr, port)).map_err(|e| format!("bind {addr}:{port}: {e}"))?;
                    listeners.push((addr, port, l));
                }
                Ok(())
            });
            let _ = tx.send(bound);
            for (addr, port, l) in listeners {
                std::thread::spawn(move || serve(addr, port, l));
            }
        });
        rx.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())?
    }

    fn start_tls(&mut self) -> Result<(), String> {
        let (key, cert) = (self.dir.path().join("key.pem"), self.dir.path().join("cert.pem"));
        let out = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=tls.allowed.test",
            ])
            .args(["-addext", "subjectAltName=DNS:tls.allowed.test", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .map_err(|e| format!("openssl req: {e}"))?;
        if !out.status.success() {
            return Err(format!("openssl req: {}", String::from_utf8_lossy(&out.stderr)));
        }
        self.tls_cert = std::fs::read(&cert).map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args([
                "netns", "exec", &self.ns, "openssl", "s_server", "-quiet", "-www", "-accept",
            ])
            .arg(format!("{PUB1}:443"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("openssl s_server: {e}"))?;
        self.tls = Some(child);
        // Ready when it accepts.
        for _ in 0..100 {
            if std::net::TcpStream::connect_timeout(
                &format!("{PUB1}:443").parse().map_err(|_| "addr")?,
                Duration::from_millis(200),
            )
            .is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("openssl s_server did not start".into())
    }
}

/// HTTP that names the address it was reached at; on the stream port, a
/// line every 100 ms until the peer goes.
fn serve(addr: &'static str, port: u16, l: TcpListener) {
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        std::thread::spawn(move || {
            if port == VHOST_PORT {
                return vhost(c);
            }
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
                if head.len() > 64 * 1024 {
                    return;
                }
            }
            if port == STREAM_PORT || port >= DYNAMIC_PORTS {
                if port == STREAM_PORT {
                    let path = String::from_utf8_lossy(&head)
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    watch_peer_close(&c, path);
                }
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n");
                for i in 0.. {
                    if c.write_all(format!("tick {i}\n").as_bytes()).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let body = format!("served by {addr}:{port}\n");
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        });
    }
}

/// Request paths of [`STREAM_PORT`] connections whose peer has closed its
/// end, as the lab server saw it (a read returned end-of-file or an error).
static STREAMS_CLOSED_BY_PEER: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Whether a [`STREAM_PORT`] connection that asked for `path` has been
/// closed by its peer, as the lab's server saw it.
pub fn stream_closed_by_peer(path: &str) -> bool {
    STREAMS_CLOSED_BY_PEER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|p| p == path)
}

fn watch_peer_close(c: &std::net::TcpStream, path: String) {
    let Ok(mut r) = c.try_clone() else { return };
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        STREAMS_CLOSED_BY_PEER
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path);
    });
}

/// Ports the kernel hands out for port 0: the lab's delayed listeners,
/// which stream ticks like [`STREAM_PORT`].
const DYNAMIC_PORTS: u16 = 32768;

/// A TCP listener on an ephemeral port with a backlog of 0: it queues ONE
/// connection.
fn backlog_zero(addr: &str) -> Result<TcpListener, String> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let addr: std::net::SocketAddr = format!("{addr}:0").parse().map_err(|_| "addr")?;
    // CLOEXEC: every sandbox the test starts afterwards would inherit it
    // otherwise, and a socket keeps its network namespace (the lab's veth,
    // addresses and routes) alive as long as any holder lives.
    let sock = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| e.to_string())?;
    rustix::net::bind(&sock, &addr).map_err(|e| format!("bind {addr}: {e}"))?;
    rustix::net::listen(&sock, 0).map_err(|e| e.to_string())?;
    Ok(TcpListener::from(sock))
}

/// A running lab, as a test case sees it.
#[derive(Clone)]
pub struct LabHandle {
    ns: String,
}

/// A listener on [`PUB1`] that accepts nothing until [`Delayed::release`]
/// (or drop). Once a filler connection holds its one queue slot, the
/// kernel drops every SYN to it, so a connect there stays in flight,
/// retransmitting, for as long as a test needs, and completes after the
/// release; then it streams ticks.
pub struct Delayed {
    pub port: u16,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl Delayed {
    pub fn release(&self) {
        let (released, cv) = &*self.gate;
        *released.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
}

impl Drop for Delayed {
    fn drop(&mut self) {
        self.release();
    }
}

impl LabHandle {
    /// Starts a [`Delayed`] listener in the lab.
    pub fn delayed(&self) -> Result<Delayed, String> {
        let path = PathBuf::from(format!("/run/netns/{}", self.ns));
        let gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gate.clone();
        std::thread::spawn(move || {
            let made = std::fs::File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|f| nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string()))
                .and_then(|()| backlog_zero(PUB1))
                .and_then(|l| Ok((l.local_addr().map_err(|e| e.to_string())?.port(), l)));
            let l = match made {
                Ok((port, l)) => {
                    let _ = tx.send(Ok(port));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let (released, cv) = &*g;
            let mut r = released.lock().unwrap_or_else(|p| p.into_inner());
            while !*r {
                r = cv.wait(r).unwrap_or_else(|p| p.into_inner());
            }
            drop(r);
            serve(PUB1, DYNAMIC_PORTS, l);
        });
        let port = rx.recv_timeout(Duration::from_secs(10)).map_err(|e| e.to_string())??;
        Ok(Delayed { port, gate })
    }
}

/// Whether a socket of this host's network namespace is in SYN_SENT to
/// `ip:port` (`/proc/net/tcp`: addresses as the kernel's raw hex).
pub fn syn_sent_to(ip: std::net::Ipv4Addr, port: u16) -> bool {
    let want = format!("{:08X}:{port:04X}", u32::from_le_bytes(ip.octets()));
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&want.as_str()) && f.get(3) == Some(&"02")
        })
    })
}

/// Answers each request on the connection with the Host it named.
fn vhost(mut c: std::net::TcpStream) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            pending.drain(..end + 4);
            let host = head
                .lines()
                .find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("host")))
                .map_or("(none)", |(_, v)| v.trim())
                .to_owned();
            let body = format!("vhost {host}\n");
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if c.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
        if pending.len() > 64 * 1024 {
            return;
        }
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        if let Some(mut c) = self.tls.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace takes its end of the veth, and so the pair.
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range this host is talking to is refused, and names what holds
    /// it; the lab's own range, with nobody on it, is not.
    #[test]
    fn a_range_the_host_talks_to_is_not_claimed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let err = claimable("127.0.0.0/8").expect_err("a connected socket's range");
        assert!(
            err.contains("talking to 127.0.0.0/8") && err.contains(&port.to_string()),
            "{err}"
        );
        drop(c);
        assert_eq!(claimable(PUB_NET), Ok(()));
        // A subnet the host routes itself: its own link's.
        let routes = Command::new("ip").args(["-4", "route", "show"]).output().unwrap();
        let own = String::from_utf8_lossy(&routes.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .find(|net| net.contains('/'))
            .map(str::to_owned)
            .expect("a route of the host's own link");
        let err = claimable(&own).expect_err("a routed subnet");
        assert!(err.contains("already routed"), "{err}");
    }
}
