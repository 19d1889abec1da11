//! One factory for every tier: [`provider`] builds the provider of a tier
//! from its name and [`ProviderOptions`]. The CLI and the egress supervisor
//! both use it, so a new tier is added here and nowhere else.

use std::path::PathBuf;

#[cfg(feature = "docker")]
use crate::backend::docker::{DockerOptions, DockerProvider};
use crate::backend::host::HostProvider;
#[cfg(feature = "kubernetes")]
use crate::backend::kubernetes::{KubernetesOptions, KubernetesProvider};
use crate::backend::local::LocalProvider;
use crate::backend::microvm::{MicroVmOptions, MicroVmProvider};
use crate::error::{Error, Result};
use crate::provider::Provider;
use crate::spec::Tier;

/// What the factory needs to build any tier's provider; every field has a
/// default but the Kubernetes options.
#[derive(Clone, Default)]
pub struct ProviderOptions {
    /// Where sandbox state lives (default: [`crate::backend::default_state_dir`]).
    pub state_dir: Option<PathBuf>,
    /// The agent binary (default: found with [`crate::backend::find_agent_binary`]).
    pub agent_bin: Option<PathBuf>,
    /// Options of the docker tier.
    #[cfg(feature = "docker")]
    pub docker: DockerOptions,
    /// Options of the microvm tier.
    pub microvm: MicroVmOptions,
    /// Options of the kubernetes tier; it cannot be built without them.
    #[cfg(feature = "kubernetes")]
    pub kubernetes: Option<KubernetesOptions>,
}

impl std::fmt::Debug for ProviderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderOptions")
            .field("state_dir", &self.state_dir)
            .field("agent_bin", &self.agent_bin)
            .finish_non_exhaustive()
    }
}

impl ProviderOptions {
    /// Options with this state directory.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }
}

/// The provider of `tier`. A tier this build cannot serve is
/// [`Error::TierUnavailable`] naming it and why.
pub async fn provider(tier: Tier, opts: ProviderOptions) -> Result<Box<dyn Provider>> {
    let dir = opts.state_dir.clone().unwrap_or_else(crate::backend::default_state_dir);
    let agent = || {
        opts.agent_bin
            .clone()
            .map_or_else(crate::backend::find_agent_binary, Ok)
    };
    match tier {
        Tier::Host => Ok(Box::new(HostProvider::with_agent(dir, agent()?))),
        Tier::Local => Ok(Box::new(LocalProvider::with_agent(dir, agent()?))),
        #[cfg(feature = "docker")]
        Tier::Docker => Ok(Box::new(DockerProvider::with_agent(dir, agent()?, opts.docker).await?)),
        #[cfg(feature = "kubernetes")]
        Tier::Kubernetes => {
            let k = opts.kubernetes.ok_or_else(|| Error::TierUnavailable {
                tier,
                reason: "no Kubernetes options given (namespace, warm pool or template)".into(),
            })?;
            Ok(Box::new(KubernetesProvider::from_env(k).await?))
        }
        #[cfg(not(feature = "docker"))]
        Tier::Docker => Err(Error::TierUnavailable {
            tier,
            reason: "this build of namzu has no docker tier (cargo feature `docker`)".into(),
        }),
        #[cfg(not(feature = "kubernetes"))]
        Tier::Kubernetes => Err(Error::TierUnavailable {
            tier,
            reason: "this build of namzu has no kubernetes tier (cargo feature `kubernetes`)".into(),
        }),
        Tier::MicroVm => Ok(Box::new(
            MicroVmProvider::with_agent(dir, agent()?).options(opts.microvm),
        )),
    }
}
