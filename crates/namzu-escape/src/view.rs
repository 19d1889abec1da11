//! Attempts to reach the host's network, and to find the host in what the
//! sandbox can see of itself: its mount table, its inherited descriptors.
//! The observations fail closed: a file that cannot be read is Broken, never
//! "nothing found".

use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::attempt::{io, sys, Attempt, Ctl, Env, Res};
use libc::{ECONNREFUSED, ECONNRESET, EHOSTUNREACH, ENETUNREACH, ENOENT, EPERM};

fn tcp(addr: &str) -> Res {
    let addr: std::net::SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => return Res::Broken(format!("address {addr}: {e}")),
    };
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(_) => Res::Succeeded(format!("connected to {addr}")),
        Err(e) => io("connect", &e),
    }
}

/// Speaks to an agent's link as the host would: the preface with the bind
/// token, then one byte back. `0` is the agent accepting (HTTP/2 would
/// follow); a TLS alert or a closed stream is the agent refusing a peer
/// without the host's certificate.
fn act_as_host(e: &Env) -> Res {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = match e.agent_link.parse() {
        Ok(a) => a,
        Err(err) => return Res::Broken(format!("address {:?}: {err}", e.agent_link)),
    };
    let mut s = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(s) => s,
        Err(err) => return io("connect", &err),
    };
    let token = e.agent_token.as_bytes();
    let Ok(len) = u16::try_from(token.len()) else {
        return Res::Broken("token too long".into());
    };
    let mut preface = b"NZL1".to_vec();
    preface.extend_from_slice(&len.to_be_bytes());
    preface.extend_from_slice(token);
    if let Err(err) = s.set_read_timeout(Some(Duration::from_secs(5))) {
        return io("set a read timeout", &err);
    }
    if let Err(err) = s.write_all(&preface) {
        return io("send the preface", &err);
    }
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) if b[0] == 0 => Res::Succeeded(format!("{addr} accepted the preface: a link as the host")),
        Ok(1) if b[0] == 0x15 => Res::Absent(format!("{addr} answered a TLS alert: no link without the host's key")),
        Ok(1) => Res::Broken(format!("{addr} answered {:#04x}", b[0])),
        Ok(_) => Res::Absent(format!("{addr} closed the stream without accepting")),
        Err(err) => io("read the answer", &err),
    }
}

fn abstract_connect(name: &str) -> Res {
    use std::os::linux::net::SocketAddrExt;
    match std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) {
        Err(e) => Res::Broken(format!("abstract name: {e}")),
        Ok(a) => match UnixStream::connect_addr(&a) {
            Ok(_) => Res::Succeeded(format!("connected to @{name}")),
            Err(e) => io("connect", &e),
        },
    }
}

fn mountinfo() -> Result<Vec<(String, String, String)>, Res> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Res::Broken(format!("read /proc/self/mountinfo: {e}")))?;
    let rows: Vec<(String, String, String)> = info
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let fstype = l.split(" - ").nth(1)?.split_whitespace().next()?;
            Some(((*f.get(4)?).to_owned(), (*f.get(5)?).to_owned(), fstype.to_owned()))
        })
        .collect();
    if !rows.iter().any(|(p, _, _)| p == "/") {
        return Err(Res::Broken("the mount table shows no root".into()));
    }
    Ok(rows)
}

fn weak_mounts(_: &Env) -> Res {
    let rows = match mountinfo() {
        Ok(r) => r,
        Err(r) => return r,
    };
    let weak: Vec<String> = rows
        .iter()
        .filter_map(|(point, opts, _)| {
            let has = |o: &str| opts.split(',').any(|x| x == o);
            // Device nodes bound into /dev and the /proc masks are the
            // exceptions; /dev and devpts must still be nosuid.
            let device_bind = (point.starts_with("/dev/") && point != "/dev/pts" && point != "/dev/shm")
                || point.starts_with("/proc/");
            let weak = if device_bind {
                false
            } else if point == "/dev" || point == "/dev/pts" {
                !has("nosuid")
            } else {
                !(has("nosuid") && has("nodev"))
            };
            weak.then(|| format!("{point} ({opts})"))
        })
        .collect();
    if weak.is_empty() {
        Res::Absent("every mount is nosuid,nodev (device binds excepted)".into())
    } else {
        Res::Succeeded(format!("{weak:?}"))
    }
}

/// The sandbox's own layout; a tmpfs anywhere is the sandbox's memory.
const OURS: &[&str] = &[
    "/",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/etc",
    "/tmp",
    // The docker tier's tmpfs, the microvm guest's writable bind.
    "/var/tmp",
    "/run",
    "/home",
    "/root",
    "/workspace",
    "/dev",
    "/proc",
    "/mnt",
];

/// Where the sandbox's root is an image, the mount points that are the
/// image's own top-level entries: read-only binds, from the filesystem and
/// the directory its `/usr` comes from (`<image root>/NAME` at `/NAME`).
/// In the host view `/usr` is the host's own `/usr` (no image root), and
/// nothing is excused.
fn image_entries() -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    // (device, root within it, mount point, options)
    let rows: Vec<(&str, &str, &str, &str)> = info
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((*f.get(2)?, *f.get(3)?, *f.get(4)?, *f.get(5)?))
        })
        .collect();
    let Some((dev, image_root)) = rows
        .iter()
        .find(|r| r.2 == "/usr")
        .and_then(|r| Some((r.0, r.1.strip_suffix("/usr")?)))
    else {
        return Vec::new();
    };
    if image_root.is_empty() {
        return Vec::new();
    }
    rows.iter()
        .filter(|(d, root, point, opts)| {
            let top = point.len() > 1 && !point[1..].contains('/');
            *d == dev && top && *root == format!("{image_root}{point}") && opts.split(',').any(|o| o == "ro")
        })
        .map(|r| r.2.to_owned())
        .collect()
}

fn host_mounts(_: &Env) -> Res {
    let rows = match mountinfo() {
        Ok(r) => r,
        Err(r) => return r,
    };
    let image = image_entries();
    let foreign: Vec<String> = rows
        .iter()
        .filter(|(_, _, fstype)| fstype != "tmpfs")
        .filter(|(p, _, _)| !image.contains(p))
        .filter(|(p, _, _)| {
            !OURS
                .iter()
                .any(|o| p == o || (o.len() > 1 && p.starts_with(&format!("{o}/"))))
        })
        .map(|(p, _, t)| format!("{p} ({t})"))
        .collect();
    if foreign.is_empty() {
        Res::Absent("only the sandbox's own mount points".into())
    } else {
        Res::Succeeded(format!("{foreign:?}"))
    }
}

/// Descriptors this process did not open itself: above stdio and without
/// close-on-exec (every one opened here is close-on-exec, and those of the
/// program that started it that were are gone with its exec).
fn inherited_fds(_: &Env) -> Res {
    let rd = match std::fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd,
        Err(e) => return Res::Broken(format!("read /proc/self/fd: {e}")),
    };
    let fds: Vec<i32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    if !fds.contains(&0) && !fds.contains(&1) {
        return Res::Broken(format!("/proc/self/fd shows no stdio: {fds:?}"));
    }
    let extra: Vec<i32> = fds
        .into_iter()
        .filter(|&fd| fd > 2)
        // SAFETY: fcntl(2) F_GETFD on an integer; a closed fd answers -1.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == 0)
        .collect();
    if extra.is_empty() {
        Res::Absent("only stdio inherited".into())
    } else {
        Res::Succeeded(format!("inherited fds {extra:?}"))
    }
}

pub fn attempts() -> Vec<Attempt> {
    vec![
        Attempt {
            name: "reach a TCP server on the host's loopback",
            ctl: Ctl::User,
            proof: &[ECONNREFUSED, ENETUNREACH],
            op: |e| tcp(&format!("127.0.0.1:{}", e.tcp_port)),
        },
        Attempt {
            name: "reach a TCP server on the host's own address",
            ctl: Ctl::User,
            proof: &[ENETUNREACH, EHOSTUNREACH],
            op: |e| tcp(&format!("{}:{}", e.host_ip, e.tcp_port)),
        },
        Attempt {
            name: "reach a host unix socket not bound in",
            ctl: Ctl::User,
            proof: &[ENOENT],
            op: |e| match UnixStream::connect(&e.unix) {
                Ok(_) => Res::Succeeded(format!("connected to {}", e.unix)),
                Err(err) => io("connect", &err),
            },
        },
        Attempt {
            name: "act as the host on the agent's link",
            ctl: Ctl::User,
            proof: &[ECONNREFUSED, ECONNRESET],
            op: act_as_host,
        },
        Attempt {
            name: "reach a host abstract unix socket",
            ctl: Ctl::User,
            proof: &[ECONNREFUSED],
            op: |e| abstract_connect(&e.abstract_name),
        },
        Attempt {
            name: "open a raw packet socket",
            ctl: Ctl::Root,
            proof: &[EPERM],
            op: |_| {
                // SAFETY: socket(2) with integers.
                let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
                sys("socket(AF_PACKET)", fd.into(), |_| {
                    Res::Succeeded("made a packet socket".into())
                })
            },
        },
        Attempt {
            name: "find a mount without nosuid or nodev",
            ctl: Ctl::User,
            proof: &[],
            op: weak_mounts,
        },
        Attempt {
            name: "see a host mount",
            ctl: Ctl::User,
            proof: &[],
            op: host_mounts,
        },
        Attempt {
            name: "use file descriptors inherited from the agent",
            ctl: Ctl::User,
            proof: &[],
            op: inherited_fds,
        },
    ]
}
