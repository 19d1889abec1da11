//! [`DockerError`]: what only the docker tier can fail with. It reaches
//! callers as [`Error::Tier`](crate::Error::Tier) with `tier: Docker`;
//! match it with `err.tier_error::<DockerError>()`.

use crate::error::Error;
use crate::spec::Tier;

/// A failure of the docker tier.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerError {
    /// The daemon refused or failed a request.
    #[error("{op}: the docker daemon answered: {message}")]
    Daemon {
        /// The operation that failed.
        op: String,
        /// What went wrong, for humans.
        message: String,
    },
    /// The runtime asked for is not registered with the daemon.
    #[error("the container runtime {runtime:?} is not registered with the daemon (it has: {})", available.join(", "))]
    RuntimeUnavailable {
        /// The runtime asked for.
        runtime: String,
        /// What the daemon has.
        available: Vec<String>,
    },
    /// The image is not on the daemon and could not be pulled.
    #[error("image {reference:?} is not on the daemon and could not be pulled: {message}")]
    ImagePull {
        /// The image reference.
        reference: String,
        /// What went wrong, for humans.
        message: String,
    },
}

impl From<DockerError> for Error {
    fn from(e: DockerError) -> Self {
        Error::tier(Tier::Docker, e)
    }
}
