//! How the CLI fails: one line on stderr and an exit code.

/// Exit code for namzu's own failures (as `docker run` does).
pub const EXIT_NAMZU: u8 = 125;
/// Exit code for bad usage.
pub const EXIT_USAGE: u8 = 2;

/// A failure to report in one line.
pub struct Fail(pub String);

impl From<namzu::Error> for Fail {
    fn from(e: namzu::Error) -> Self {
        Fail(e.to_string())
    }
}
