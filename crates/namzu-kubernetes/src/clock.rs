//! Times as Kubernetes writes them (RFC 3339, to the second) and reads of
//! them: shutdown times, lease deadlines.

use std::time::{Duration, SystemTime};

/// `t` as an RFC 3339 UTC date-time, to the second, as Kubernetes writes
/// them.
pub fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::chrono::DateTime::<k8s_openapi::chrono::Utc>::from(t)
        .to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true)
}

/// `t` as an RFC 3339 date-time to the second, rounded UP: a deadline
/// written to the second must never fall before the one meant (a lease
/// rounded down could expire up to a second before its renewal).
pub fn rfc3339_ceil(t: SystemTime) -> String {
    let frac = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    if frac == 0 {
        rfc3339(t)
    } else {
        rfc3339(t + Duration::from_nanos(u64::from(1_000_000_000 - frac)))
    }
}

/// How far ahead of now `time` (RFC 3339) lies; `None` if it is past or
/// unreadable.
pub fn until(time: &str, now: SystemTime) -> Option<Duration> {
    let t = k8s_openapi::chrono::DateTime::parse_from_rfc3339(time).ok()?;
    SystemTime::from(t).duration_since(now).ok()
}
