//! The `kubernetes` tier's provider and handle: a task sandbox is acquired
//! (`acquire`), its agent dialed over TCP with the pod's uid as the
//! bind token, the privilege probe run over that link before the handle is
//! handed out (a refusal gives the sandbox back), and its lease renewed for
//! as long as the handle lives. Destroy gives the claim (or Sandbox) back;
//! the controller deletes the pod.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::acquire::{self, Bound};
use super::api::{Api, Resource};
use super::lease::{Lease, Leased};
use super::KubernetesOptions;
use namzu_core::check::{check_spec, privilege_probe, refuse_unsupported};
use namzu_core::client::{AgentClient, ClientOptions};
use namzu_core::error::{Error, Result};
use namzu_core::handle::{Sandbox, SandboxBackend};
use namzu_core::provider::Provider;
use namzu_core::spec::{SandboxInfo, SandboxSpec, Tier};

/// Makes task sandboxes on a cluster.
#[derive(Clone)]
pub struct KubernetesProvider {
    api: Api,
    opts: Arc<KubernetesOptions>,
    client: ClientOptions,
    verifier: Arc<super::policy::verify::PolicyVerifier>,
}

impl std::fmt::Debug for KubernetesProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesProvider")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl KubernetesProvider {
    /// A provider on `client` (kubeconfig or in-cluster, as kube builds
    /// it); options that cannot work are refused here, before any request.
    pub fn new(client: kube::Client, opts: KubernetesOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Self {
            api: Api::new(client, opts.api_request_timeout)?,
            opts: Arc::new(opts),
            client: ClientOptions::default(),
            verifier: Arc::default(),
        })
    }

    /// A provider on the client kube infers from the environment
    /// (`KUBECONFIG`, `~/.kube/config`, or the pod's service account).
    pub async fn from_env(opts: KubernetesOptions) -> Result<Self> {
        let client = kube::Client::try_default().await.map_err(|e| Error::OptionRefused {
            tier: namzu_core::spec::Tier::Kubernetes,
            option: "kubeconfig".into(),
            reason: e.to_string(),
        })?;
        Self::new(client, opts)
    }

    /// Link options for the agents it dials (keepalive, connect bound).
    pub fn with_client_options(mut self, client: ClientOptions) -> Self {
        self.client = client;
        self
    }

    /// The typed API layer (and its record of calls).
    pub fn api(&self) -> &Api {
        &self.api
    }

    /// The options it was built with.
    pub fn options(&self) -> &KubernetesOptions {
        &self.opts
    }

    /// The link options agents are dialed with.
    pub(crate) fn client_options(&self) -> &ClientOptions {
        &self.client
    }

    /// The egress-policy verifier (and its cache of passes).
    pub(crate) fn verifier(&self) -> &super::policy::verify::PolicyVerifier {
        &self.verifier
    }

    fn owner(&self) -> Leased {
        acquire::owner_kind(&self.opts)
    }

    /// Dials a bound sandbox, probes it, and starts its lease. A probe
    /// refusal (or a failed dial) is returned; the caller releases.
    async fn open(&self, mut bound: Bound) -> Result<KubernetesSandbox> {
        let (client, pod) = super::rebind::dial(&self.api, &self.opts, &bound, &self.client).await?;
        // The first dial may already have followed a replacement.
        bound.pod = pod.lock().unwrap_or_else(|p| p.into_inner()).clone();
        privilege_probe(&bound.id, &client).await?;
        let lease = Lease::start(
            self.api.clone(),
            acquire::owner_resource(bound.owner, &self.opts.namespace),
            bound.owner_name.clone(),
            bound.owner,
            self.opts.claim_ttl,
            self.opts.on_lease_renewal_error.clone(),
        );
        client.guard_with(lease.link_guard());
        Ok(KubernetesSandbox {
            provider: self.clone(),
            bound,
            client,
            lease,
            pod,
            fence_proven: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// [`Provider::create`]; the handle's backend is a [`KubernetesSandbox`]
    /// (`sb.backend::<KubernetesSandbox>()`).
    pub async fn create_task(&self, spec: SandboxSpec) -> Result<Sandbox> {
        refusals(&spec)?;
        check_spec(Tier::Kubernetes, &spec)?;
        let id = format!("sb-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        self.acquire_as(&id, &super::build::agent_env(&spec))
            .await
            .map(Sandbox::new)
    }

    /// Acquires sandbox `id` (a caller-chosen id: how a host that lost the
    /// answer to an earlier create for the same id adopts it).
    pub async fn create_task_with_id(&self, id: &str) -> Result<Sandbox> {
        self.acquire_as(id, &[]).await.map(Sandbox::new)
    }

    /// Refuses, before any request, to acquire or reach a pod the host
    /// cannot speak to: the link is mutual TLS and needs the host's key.
    pub(crate) fn link_ready(&self) -> Result<()> {
        if self.opts.link_tls.is_some() {
            return Ok(());
        }
        Err(namzu_core::error::Error::OptionRefused {
            tier: Tier::Kubernetes,
            option: "link_tls".into(),
            reason: "the pod link is mutual TLS and there are no host credentials: `namzu kube link-init` makes them (docs/kubernetes.md)".into(),
        })
    }

    async fn acquire_as(&self, id: &str, env: &[(String, String)]) -> Result<KubernetesSandbox> {
        self.link_ready()?;
        let bound = acquire::acquire(&self.api, &self.opts, id, env, &self.verifier).await?;
        let (owner, name) = (bound.owner, bound.owner_name.clone());
        match self.open(bound).await {
            Ok(sb) => Ok(sb),
            Err(e) => {
                if let Err(r) = acquire::release(&self.api, &self.opts, owner, &name).await {
                    tracing::warn!(%name, error = %r, "a refused sandbox could not be released");
                }
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Provider for KubernetesProvider {
    fn tier(&self) -> Tier {
        Tier::Kubernetes
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        self.create_task(spec).await
    }

    async fn connect(&self, id: &str) -> Result<Sandbox> {
        self.link_ready()?;
        let bound = acquire::find(&self.api, &self.opts, id).await?;
        Ok(Sandbox::new(self.open(bound).await?))
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let r = acquire::owner_resource(self.owner(), &self.opts.namespace);
        let list = self.api.list(&r, None).await?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(info)
            .collect())
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        acquire::release(&self.api, &self.opts, self.owner(), &acquire::object_name(id)).await
    }
}

/// A namzu sandbox summary of a claim (or Sandbox) namzu made.
fn info(o: &Value) -> Option<SandboxInfo> {
    let id = o["metadata"]["name"].as_str()?.strip_prefix("namzu-")?;
    if o["metadata"]["labels"][super::build::SANDBOX_LABEL] != id {
        return None;
    }
    let created_unix = o["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| k8s_openapi::chrono::DateTime::parse_from_rfc3339(t).ok())
        .and_then(|t| u64::try_from(t.timestamp()).ok())
        .unwrap_or(0);
    let alive = o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    Some(SandboxInfo {
        id: id.to_owned(),
        tier: Tier::Kubernetes,
        alive,
        created_unix,
        // A task sandbox is never suspended; a workspace is (`namzu workspace`).
        suspended: false,
    })
}
/// A task sandbox on a cluster: the backend of its [`Sandbox`] handle,
/// reached with `sb.backend::<KubernetesSandbox>()` for the objects it is
/// bound to.
/// A task sandbox on a cluster.
pub struct KubernetesSandbox {
    provider: KubernetesProvider,
    bound: Bound,
    client: AgentClient,
    lease: Lease,
    /// The pod the link is bound to now (it follows a replacement).
    pod: super::rebind::CurrentPod,
    /// The admission fence was seen applied (proven once per handle).
    fence_proven: std::sync::atomic::AtomicBool,
}

impl KubernetesSandbox {
    /// What the acquire bound: the claim (or Sandbox), the Sandbox, the pod.
    pub fn bound(&self) -> &Bound {
        &self.bound
    }

    /// The pod the link is bound to NOW: the acquired one, or the
    /// replacement it followed.
    pub fn current_pod(&self) -> crate::bound::BoundPod {
        self.pod.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err(SandboxGone)` once the lease found the object gone.
    pub fn check_lease(&self) -> Result<()> {
        self.lease.check(&self.bound.id)
    }

    /// The claim's (or Sandbox's) resource.
    pub fn owner_resource(&self) -> Resource {
        acquire::owner_resource(self.bound.owner, &self.provider.opts.namespace)
    }
}

#[async_trait]
impl SandboxBackend for KubernetesSandbox {
    fn id(&self) -> &str {
        &self.bound.id
    }

    fn tier(&self) -> Tier {
        Tier::Kubernetes
    }

    fn agent(&self) -> &AgentClient {
        &self.client
    }

    /// Replaces this sandbox's per-sandbox CiliumNetworkPolicy (see
    /// [`super::policy::per_sandbox`]): a hostname allowlist, or an empty one (or
    /// deny-all) to remove it. Refused by name unless `egress.per_sandbox`
    /// is configured.
    async fn set_network_policy(&self, policy: namzu_core::egress::EgressPolicy) -> Result<()> {
        self.lease.check(&self.bound.id)?;
        let opts = &self.provider.opts;
        let Some(cfg) = opts.egress.as_ref().and_then(|e| e.per_sandbox.as_ref()) else {
            return Err(super::policy::per_sandbox::PerSandboxError::NotConfigured.into());
        };
        super::policy::per_sandbox::apply(
            &self.provider.api,
            cfg,
            &opts.namespace,
            &self.bound,
            &policy,
            &self.fence_proven,
        )
        .await
    }

    /// Refused by name: this tier keeps no policy or connection count of
    /// its own; the cluster's policy objects are the record.
    async fn network_policy(&self) -> Result<(namzu_core::egress::EgressConfig, usize)> {
        Err(Error::OptionRefused {
            tier: Tier::Kubernetes,
            option: "network_policy".into(),
            reason: "the cluster's policy objects are the record (the template's <template>-egress policy, and \
                     namzu-sbx-<owner uid> for a per-sandbox one); open connections are not observable from the host"
                .into(),
        })
    }

    async fn destroy(&self) -> Result<()> {
        self.client.close();
        acquire::release(
            &self.provider.api,
            &self.provider.opts,
            self.bound.owner,
            &self.bound.owner_name,
        )
        .await
    }
}

/// What a task sandbox on a cluster cannot take from a spec: its pod is the
/// SandboxTemplate's (or the warm pool's, made before anyone asked), so the
/// image, mounts and resources are the template's. (Environment and agent
/// limits travel as the agent container's environment: the claim's `env`,
/// which the template must allow.) Egress on a cluster is the cluster's
/// NetworkPolicy, not a spec field.
pub(crate) fn refusals(spec: &SandboxSpec) -> Result<()> {
    let template = "the SandboxTemplate's pod decides it; a task sandbox is claimed, not built";
    refuse_unsupported(
        Tier::Kubernetes,
        &[
            (spec.image.is_some(), "image", template),
            (!spec.binds.is_empty(), "binds", "a pod has no host paths to bind"),
            (
                spec.resources.memory_bytes.is_some(),
                "resources.memory_bytes",
                template,
            ),
            (spec.resources.cpus.is_some(), "resources.cpus", template),
            (spec.resources.pids.is_some(), "resources.pids", template),
            (spec.resources.disk_bytes.is_some(), "resources.disk_bytes", template),
            (
                spec.egress != namzu_core::egress::EgressConfig::default(),
                "egress",
                "a pod's egress is the cluster's NetworkPolicy, not a sandbox option",
            ),
        ],
    )
}
