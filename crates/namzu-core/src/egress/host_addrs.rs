//! The host's own addresses, which no sandbox may reach: read once, and
//! read again only when the kernel says an address came or went.
//!
//! Every egress decision checks the destination against them. Reading
//! them is two netlink dumps (links and addresses, `getifaddrs(3)`), a
//! tenth of a millisecond or more on the path of every connection; the
//! list changes almost never. A netlink socket subscribed to address
//! changes is drained (without blocking) before each use: a change the
//! kernel made before the check is queued there before the check runs,
//! so the list used is never older than the last change. Where the
//! subscription cannot be had, or its queue overflowed, the list is read
//! every time, as before.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// `RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`: address changes, both
/// families.
const ADDRESS_GROUPS: u32 = 0x10 | 0x100;

struct Cache {
    /// The subscription; `None` where it could not be had.
    watch: Option<OwnedFd>,
    /// The list as last read.
    addrs: Vec<IpAddr>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// Every address on the host's interfaces, as of now.
pub fn current() -> Vec<IpAddr> {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = cache.as_mut() {
        match &c.watch {
            Some(w) if !changed(w) => return c.addrs.clone(),
            // Drained: the read below is at least as new as any change
            // queued so far.
            Some(_) => {}
            None => c.watch = subscribe(),
        }
    }
    let watch = match cache.take() {
        Some(c) => c.watch,
        None => subscribe(),
    };
    let addrs = read();
    *cache = Some(Cache {
        watch,
        addrs: addrs.clone(),
    });
    addrs
}

/// A netlink socket told of every address change from now on.
fn subscribe() -> Option<OwnedFd> {
    use nix::sys::socket::{bind, socket, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        SockProtocol::NetlinkRoute,
    )
    .ok()?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, ADDRESS_GROUPS)).ok()?;
    Some(fd)
}

/// Whether anything was announced since the last call (reading it all);
/// an overflowed queue (`ENOBUFS`) or any error counts as a change.
fn changed(watch: &OwnedFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut buf = [0u8; 8192];
    let mut any = false;
    loop {
        match recv(watch.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(_) => any = true,
            Err(nix::errno::Errno::EAGAIN) => return any,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return true,
        }
    }
}

fn read() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An address added after the list was cached is in the next answer:
    /// the cache never hides a new host address (needs CAP_NET_ADMIN in
    /// a network namespace of its own; without it, skipped saying so, and
    /// failed under the test command, which sets NAMZU_REQUIRE_NET).
    #[test]
    fn an_address_added_after_a_read_is_in_the_next_answer() {
        use nix::sched::{unshare, CloneFlags};
        // A thread of its own in a fresh network namespace (as root), so
        // the host's interfaces are untouched.
        let r = std::thread::spawn(|| {
            if unshare(CloneFlags::CLONE_NEWNET).is_err() {
                return None;
            }
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status();
            if !up.is_ok_and(|s| s.success()) {
                return None;
            }
            *CACHE.lock().unwrap() = None;
            let before = current();
            let again = current();
            let extra: IpAddr = "198.51.100.77".parse().unwrap();
            let added = std::process::Command::new("ip")
                .args(["addr", "add", "198.51.100.77/32", "dev", "lo"])
                .status();
            assert!(added.is_ok_and(|s| s.success()), "ip addr add failed");
            let after = current();
            *CACHE.lock().unwrap() = None;
            Some((before, again, after, extra))
        })
        .join()
        .unwrap();
        let Some((before, again, after, extra)) = r else {
            // The test command runs as root with iproute2 and says so
            // (NAMZU_REQUIRE_NET): there, no namespace is a failure.
            assert!(
                std::env::var_os("NAMZU_REQUIRE_NET").is_none(),
                "no network namespace of its own (needs root and ip), and NAMZU_REQUIRE_NET is set"
            );
            eprintln!("skipped: no network namespace of its own (needs root and ip)");
            return;
        };
        assert!(!before.contains(&extra));
        assert_eq!(before, again, "an unchanged list read differently");
        assert!(
            after.contains(&extra),
            "the new address {extra} was not seen: {after:?}"
        );
    }
}
