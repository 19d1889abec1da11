//! When each step of the agent's own start happened, reported in Health
//! (`startup`): where a cold start spends its time, measured where it is
//! spent instead of guessed from outside.
//!
//! A mark is a stage name and a `CLOCK_MONOTONIC` reading. The clock is the
//! host's wherever no time namespace or VM sits between host and agent (the
//! `local`, `host` and docker tiers), so the host can line the agent's marks
//! up with its own. Marks made before a `fork` travel into the child with
//! its memory, which is how the launcher's, its namespace child's and the
//! init's marks end up in the one list the init serves.
//!
//! At most [`MAX_MARKS`] are kept: a start has about fifteen, and nothing
//! after it marks.

use std::sync::Mutex;

/// Marks kept; any beyond are dropped.
pub const MAX_MARKS: usize = 64;

static MARKS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Records that `stage` ended now.
pub fn mark(stage: &'static str) {
    let t = now_ns();
    let mut marks = MARKS.lock().unwrap_or_else(|p| p.into_inner());
    if marks.len() < MAX_MARKS {
        marks.push((stage, t));
    }
}

/// Every mark so far, in the order made.
pub fn marks() -> Vec<(&'static str, u64)> {
    MARKS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_keep_their_order_and_a_bound() {
        mark("first");
        mark("second");
        let m = marks();
        let a = m.iter().position(|(s, _)| *s == "first").unwrap();
        let b = m.iter().position(|(s, _)| *s == "second").unwrap();
        assert!(a < b && m[a].1 <= m[b].1);
        for _ in 0..2 * MAX_MARKS {
            mark("flood");
        }
        assert_eq!(marks().len(), MAX_MARKS);
    }
}
