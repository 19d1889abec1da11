//! How the CLI fails: one line on stderr and an exit code.

/// Exit code for namzu's own failures (as `docker run` does).
pub const EXIT_NAMZU: u8 = 125;
/// Exit code for bad usage.
pub const EXIT_USAGE: u8 = 2;

/// A failure to report in one line.
pub struct Fail(pub String);

/// The error and every cause beneath it, `: `-joined (each level's Display
/// says only its own part).
impl From<namzu::Error> for Fail {
    fn from(e: namzu::Error) -> Self {
        Fail(chain(&e))
    }
}

/// `e` and every cause beneath it, `: `-joined.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}
