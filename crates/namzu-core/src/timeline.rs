//! Where a sandbox's start and end spend their time: each step, when it
//! ends, is a `tracing` event at target [`TARGET`] (level TRACE) with the
//! fields `stage` and `mono_ns` (`CLOCK_MONOTONIC` nanoseconds, the clock
//! the agent's own marks use, see [`crate::AgentInfo::startup`]).
//!
//! Nothing is measured unless a subscriber enables the target: the event
//! macro checks its callsite's interest before the clock is read. The CLI
//! shows them with `NAMZU_LOG=namzu::timeline=trace`; the benchmarks collect
//! them to print the stage table.

/// The target every mark is sent to.
pub const TARGET: &str = "namzu::timeline";

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Records that `stage` ended now (a TRACE event at [`TARGET`]).
pub fn mark(stage: &str) {
    tracing::trace!(target: "namzu::timeline", stage, mono_ns = now_ns());
}

/// Replays marks made elsewhere (the agent's, from Health) as events, so
/// one subscriber sees the whole start in order.
pub fn replay(marks: &[(String, u64)]) {
    if tracing::enabled!(target: "namzu::timeline", tracing::Level::TRACE) {
        for (stage, ns) in marks {
            tracing::trace!(target: "namzu::timeline", stage = stage.as_str(), mono_ns = *ns);
        }
    }
}
