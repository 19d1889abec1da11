//! The link to a pod's agent, following the pod when it is replaced: every
//! (re)dial — the first, and each one an operation triggers after the link
//! dropped — goes where the agent is NOW and offers the token it takes
//! now. A replacement (same name, a new uid: the controller recreated the
//! pod) is adopted with its new address and bind token, the caller told
//! through [`KubernetesOptions::on_pod_replaced`]; the same pod failing
//! leaves its failure standing. A replaced pod is an empty one: what ran
//! and was written in the old one is gone, which the callback exists to
//! say.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::acquire::{Bound, BoundPod};
use super::api::{Api, Resource};
use super::{AddressMode, KubernetesError, KubernetesOptions};
use namzu_core::client::{AgentClient, ClientOptions};
use namzu_core::error::Result;

pub use crate::bound::PodReplacedCallback;

/// The pod a link is bound to now, shared by its dialer and its handle.
pub type CurrentPod = Arc<Mutex<BoundPod>>;

/// What stands under a bound pod's name.
enum Standing {
    /// The pod the link is bound to.
    Same,
    /// A replacement, live, with an address.
    Replaced(BoundPod),
    /// A replacement not yet running or addressed.
    Starting,
    /// Nothing (or nothing readable).
    Absent,
}

struct Ctx {
    api: Api,
    pods: Resource,
    id: String,
    mode: AddressMode,
    fqdn: Option<String>,
    port: u16,
    resolution: super::NameResolution,
    budget: std::time::Duration,
    poll: std::time::Duration,
    pod: CurrentPod,
    on_replaced: Option<PodReplacedCallback>,
    tls: Arc<rustls::ClientConfig>,
}

/// One link to an agent: mutual TLS over TCP ([`crate::link`]).
type Link = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

impl Ctx {
    fn current(&self) -> BoundPod {
        self.pod.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adopts `now` in place of `was`, and says so.
    fn adopt(&self, was: &BoundPod, now: BoundPod) {
        tracing::warn!(sandbox = %self.id, pod = %now.name, old_uid = %was.uid, new_uid = %now.uid,
            "the pod was replaced; following it (the old one's processes and files are gone)");
        *self.pod.lock().unwrap_or_else(|p| p.into_inner()) = now.clone();
        if let Some(cb) = &self.on_replaced {
            cb(&self.id, was, &now);
        }
    }

    /// The pod of that name as it stands.
    async fn replacement(&self, was: &BoundPod) -> Standing {
        let Ok(p) = self.api.get(&self.pods, &was.name).await else {
            return Standing::Absent;
        };
        let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
        if uid == was.uid {
            return Standing::Same;
        }
        let ip = p["status"]["podIP"].as_str().and_then(|s| s.parse::<IpAddr>().ok());
        let live = p["metadata"]["deletionTimestamp"].is_null() && !uid.is_empty();
        if !live || (self.mode == AddressMode::PodIp && ip.is_none()) {
            return Standing::Starting;
        }
        let labels = crate::labels::string_map(&p["metadata"]["labels"]);
        Standing::Replaced(BoundPod {
            name: was.name.clone(),
            uid: uid.to_owned(),
            ip,
            labels,
        })
    }

    /// One connection to where the agent of `pod` is.
    async fn connect(&self, pod: &BoundPod) -> std::io::Result<Link> {
        let ips = match self.mode {
            AddressMode::PodIp => pod.ip.into_iter().collect(),
            AddressMode::Service => {
                let fqdn = self.fqdn.clone().unwrap_or_default();
                self.resolution
                    .resolve_within(&fqdn, self.budget, self.poll)
                    .await
                    .map_err(std::io::Error::other)?
            }
        };
        let mut last = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "the pod has no address");
        for ip in ips {
            match tokio::net::TcpStream::connect(SocketAddr::new(ip, self.port)).await {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    // A failed handshake is the agent refusing the host, or
                    // not proving itself: no other address will do better.
                    return namzu_proto::link_tls::connect(self.tls.clone(), s).await;
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A dial: a re-dial first asks whether the pod was replaced (the
    /// Service name may already lead to the new one, whose agent wants
    /// its own token); a failed connect waits, inside the connect budget,
    /// for a replacement that is starting to have an address — and gives
    /// up at once when the pod is still the same one, or gone (a later
    /// call dials again; a sandbox given back is the lease's to say).
    async fn dial(&self, redial: bool) -> std::io::Result<Link> {
        let was = self.current();
        if redial {
            if let Standing::Replaced(now) = self.replacement(&was).await {
                self.adopt(&was, now);
            }
        }
        let pod = self.current();
        let failed = match self.connect(&pod).await {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let deadline = Instant::now() + self.budget;
        loop {
            match self.replacement(&pod).await {
                Standing::Replaced(now) => {
                    self.adopt(&pod, now.clone());
                    return self.connect(&now).await;
                }
                Standing::Starting if Instant::now() + self.poll < deadline => tokio::time::sleep(self.poll).await,
                Standing::Same | Standing::Absent | Standing::Starting => return Err(failed),
            }
        }
    }
}

/// Dials the agent of `bound`; the link follows its pod from then on. The
/// pod it is bound to now is in the returned [`CurrentPod`].
pub async fn dial(
    api: &Api,
    opts: &KubernetesOptions,
    bound: &Bound,
    client: &ClientOptions,
) -> Result<(AgentClient, CurrentPod)> {
    let id = bound.id.clone();
    if opts.address_mode == AddressMode::Service {
        let fqdn = bound.fqdn.clone().unwrap_or_default();
        if fqdn.is_empty() {
            return Err(KubernetesError::AgentAddressUnresolvable {
                id,
                fqdn,
                cause: "the Sandbox has no status.serviceFQDN".into(),
            }
            .into());
        }
        // Resolved once here, so a name that never resolves is named as
        // such rather than as a failed connect; a resolver that cannot
        // answer NOW is asked again within the connect budget.
        opts.resolution
            .resolve_within(&fqdn, client.connect_timeout, opts.poll_interval)
            .await
            .map_err(|cause| KubernetesError::AgentAddressUnresolvable {
                id: id.clone(),
                fqdn: fqdn.clone(),
                cause,
            })?;
    }
    let tls = opts
        .link_tls
        .as_ref()
        .map(crate::link::LinkTls::client_config)
        .ok_or_else(|| namzu_core::error::Error::OptionRefused {
            tier: namzu_core::spec::Tier::Kubernetes,
            option: "link_tls".into(),
            reason: "no host credentials for the pod link's mutual TLS".into(),
        })?;
    let pod: CurrentPod = Arc::new(Mutex::new(bound.pod.clone()));
    let ctx = Arc::new(Ctx {
        api: api.clone(),
        pods: Resource::core("pods", &opts.namespace),
        id: id.clone(),
        mode: opts.address_mode,
        fqdn: bound.fqdn.clone(),
        port: opts.agent_port,
        resolution: opts.resolution.clone(),
        budget: client.connect_timeout,
        poll: opts.poll_interval,
        pod: pod.clone(),
        on_replaced: opts.on_pod_replaced.clone(),
        tls,
    });
    let endpoint = match (&bound.fqdn, opts.address_mode) {
        (Some(f), AddressMode::Service) => format!("{f}:{}", opts.agent_port),
        _ => bound.pod.ip.map_or_else(
            || bound.pod.name.clone(),
            |ip| SocketAddr::new(ip, opts.agent_port).to_string(),
        ),
    };
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let dialer = {
        let ctx = ctx.clone();
        move || {
            let ctx = ctx.clone();
            let redial = !first.swap(false, std::sync::atomic::Ordering::SeqCst);
            async move { ctx.dial(redial).await }
        }
    };
    let token = {
        let pod = pod.clone();
        move || pod.lock().unwrap_or_else(|p| p.into_inner()).uid.clone().into_bytes()
    };
    let client = AgentClient::connect_following(&id, &endpoint, client.clone(), dialer, token).await?;
    Ok((client, pod))
}
