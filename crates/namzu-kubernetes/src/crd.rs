//! Rust types for the four kinds of kubernetes-sigs/agent-sandbox, version
//! `v1beta1`: the fields namzu reads or writes, named as the CRDs name them
//! (camelCase on the wire). Pod templates are k8s-openapi's own types;
//! parts namzu passes through untouched stay JSON.

// The types mirror the agent-sandbox CRD schemas field for field (the
// fixtures in tests/fixtures/agent-sandbox-crds are the reference, and
// tests/k8s_crds.rs proves the objects built here pass them); their fields
// are documented there, not repeated here.
#![allow(missing_docs)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};

/// Group of `Sandbox`.
pub const AGENTS_GROUP: &str = "agents.x-k8s.io";
/// Group of `SandboxClaim`, `SandboxTemplate`, `SandboxWarmPool`.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";

/// A namespaced custom object: `apiVersion`, `kind`, metadata, spec and
/// status, as every agent-sandbox kind is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Object<S, T> {
    pub api_version: String,
    /// What kind of entry.
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: S,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<T>,
}

/// What each kind is called, and where it lives.
pub trait Kind {
    const GROUP: &'static str;
    const KIND: &'static str;
    /// The resource name in REST paths.
    const PLURAL: &'static str;
}

macro_rules! kind {
    ($alias:ident, $spec:ty, $status:ty, $group:expr, $kind:literal, $plural:literal) => {
        pub type $alias = Object<$spec, $status>;
        impl Kind for $alias {
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const PLURAL: &'static str = $plural;
        }
    };
}

kind!(
    Sandbox,
    SandboxSpec,
    SandboxStatus,
    AGENTS_GROUP,
    "Sandbox",
    "sandboxes"
);
kind!(
    SandboxClaim,
    SandboxClaimSpec,
    SandboxClaimStatus,
    EXTENSIONS_GROUP,
    "SandboxClaim",
    "sandboxclaims"
);
kind!(
    SandboxTemplate,
    SandboxTemplateSpec,
    serde_json::Value,
    EXTENSIONS_GROUP,
    "SandboxTemplate",
    "sandboxtemplates"
);
kind!(
    SandboxWarmPool,
    SandboxWarmPoolSpec,
    SandboxWarmPoolStatus,
    EXTENSIONS_GROUP,
    "SandboxWarmPool",
    "sandboxwarmpools"
);

impl<S: Default, T> Object<S, T>
where
    Self: Kind,
{
    /// An empty object of this kind, named `name` in `namespace`.
    pub fn named(namespace: &str, name: &str) -> Self {
        Self {
            api_version: format!("{}/{VERSION}", <Self as Kind>::GROUP),
            kind: <Self as Kind>::KIND.into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            spec: S::default(),
            status: None,
        }
    }
}

/// `{ name }`, how one object names another.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRef {
    /// The entry name.
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    pub pod_template: PodTemplateSpec,
    /// Make a headless Service for the pod (its FQDN is the agent address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// `Delete` or `Retain`, applied at `shutdownTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, rename = "serviceFQDN", skip_serializing_if = "Option::is_none")]
    pub service_fqdn: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    pub pod_template: PodTemplateSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    /// Whether claims may inject environment variables (`env`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates_policy: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    pub sandbox_template_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    pub warm_pool_ref: NameRef,
    /// Labels and annotations for the claimed pod (not the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
    /// Environment variables added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<ClaimEnv>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMetadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEnv {
    /// The entry name.
    pub name: String,
    /// The value that exceeded it.
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// `Delete`, `DeleteForeground` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    /// The entry name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<String>>,
}
