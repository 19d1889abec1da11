//! The accept-loop rule every listener of namzu follows (the agent's link
//! listeners, its egress proxies, the host's egress supervisor): a
//! transient failure — out of file descriptors (EMFILE, ENFILE), of buffers
//! (ENOBUFS, ENOMEM), or a peer that went away before it was accepted
//! (ECONNABORTED, EPROTO, EPERM from a firewall) — is logged and retried
//! after a short pause, never the end of the loop: a sandbox that opens
//! enough sockets to exhaust a process's descriptors must not take the
//! listener down with it. Only an error that says the listener itself is
//! unusable (EBADF, EINVAL, ENOTSOCK, EOPNOTSUPP) ends the loop.

use std::future::Future;
use std::io;
use std::time::Duration;

/// The pause after a transient accept failure: long enough not to spin
/// while descriptors are exhausted, short enough that a freed one is used
/// soon.
pub const BACKOFF: Duration = Duration::from_millis(50);

/// Whether an accept error leaves the listener usable.
pub fn is_transient(e: &io::Error) -> bool {
    !matches!(
        e.raw_os_error(),
        Some(libc_errno::EBADF | libc_errno::EINVAL | libc_errno::ENOTSOCK | libc_errno::EOPNOTSUPP)
    )
}

/// Errno values, spelled here so the protocol crate needs no libc.
mod libc_errno {
    pub const EBADF: i32 = 9;
    pub const EINVAL: i32 = 22;
    pub const ENOTSOCK: i32 = 88;
    pub const EOPNOTSUPP: i32 = 95;
}

/// The next accepted connection, retrying transient failures after
/// [`BACKOFF`]; `None` once the listener is unusable. `what` names the
/// listener in the log.
pub async fn next<T, F, Fut>(mut accept: F, what: &str) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    loop {
        match accept().await {
            Ok(v) => return Some(v),
            Err(e) if is_transient(&e) => {
                tracing::warn!(listener = what, error = %e, "accept failed; retrying");
                tokio::time::sleep(BACKOFF).await;
            }
            Err(e) => {
                tracing::error!(listener = what, error = %e, "accept failed; the listener stops");
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_exhaustion_is_transient_and_a_dead_listener_is_not() {
        for errno in [
            24,  /* EMFILE */
            23,  /* ENFILE */
            103, /* ECONNABORTED */
            105, /* ENOBUFS */
        ] {
            assert!(is_transient(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [9, 22, 88] {
            assert!(!is_transient(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
    }
}
