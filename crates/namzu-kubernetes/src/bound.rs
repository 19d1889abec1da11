//! [`Bound`]: what an acquire ends with — the owned claim (or Sandbox),
//! the Sandbox it bound and the pod it runs in — before the agent is dialed.

use std::net::IpAddr;

use crate::lease::Leased;

/// The pod an acquire bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    /// The pod's name.
    pub name: String,
    /// The agent's bind token.
    pub uid: String,
    /// The pod's IP.
    pub ip: Option<IpAddr>,
    /// Its labels as the cluster reports them.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A Ready sandbox on the cluster, not yet dialed.
#[derive(Debug, Clone)]
pub struct Bound {
    /// The sandbox's id.
    pub id: String,
    /// Whether a claim or a Sandbox is what namzu owns (and leases).
    pub owner: Leased,
    /// The owned object's name.
    pub owner_name: String,
    /// The claim's (or Sandbox's) uid, as its reads reported it.
    pub owner_uid: Option<String>,
    /// The bound Sandbox's name.
    pub sandbox: String,
    /// The bound Sandbox's uid: a claim whose Sandbox vanished binds a NEW
    /// one (an empty pod) under the same claim, told apart by this.
    pub sandbox_uid: Option<String>,
    /// The Sandbox's Service name, when it has one.
    pub fqdn: Option<String>,
    /// The pod it runs in.
    pub pod: BoundPod,
}

/// Told of a pod replaced under a live handle: the sandbox id, the pod it
/// was bound to, and the one it follows now (see `rebind`).
pub type PodReplacedCallback = std::sync::Arc<dyn Fn(&str, &BoundPod, &BoundPod) + Send + Sync>;
