//! Arguments shared by several commands, and their parsers.

use std::ffi::OsString;
use std::path::PathBuf;

use namzu::SandboxSpec;

use crate::fail::Fail;

#[derive(clap::Args, Clone)]
pub struct ExecArgs {
    /// KEY=VALUE added to the command's environment (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox (relative to its workspace).
    #[arg(long, short = 'w')]
    pub workdir: Option<PathBuf>,
    /// Kill the command (and everything it started) after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    pub command: Vec<OsString>,
}

/// Root filesystem, runtime and resource limits of a new sandbox.
#[derive(clap::Args, Clone, Default)]
pub struct ResourceArgs {
    /// local: an image (pulled from its registry unless cached, or imported;
    /// name or sha256:id) or a rootfs directory; default: a read-only view
    /// of the host's /usr and friends.
    /// docker: an image reference (required), pulled if the daemon lacks it.
    /// microvm: an image as on local (required), booted from its disk.
    #[arg(long)]
    pub image: Option<String>,
    /// docker: the OCI runtime, runc (the daemon's default) or runsc (gVisor).
    #[arg(long)]
    pub runtime: Option<String>,
    /// Show a host path inside: SRC:DST, read-only, or SRC:DST:rw (repeatable).
    #[arg(long = "bind", value_parser = parse_bind)]
    pub binds: Vec<namzu::Bind>,
    /// Memory limit, e.g. 512m or 2g.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// CPU limit in CPUs, e.g. 0.5.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Process limit.
    #[arg(long)]
    pub pids: Option<u64>,
    /// Disk limit, e.g. 1g: what /workspace may hold (local and docker: a
    /// size-limited filesystem image, needs root; microvm: the writable disk).
    #[arg(long, value_parser = parse_size)]
    pub disk: Option<u64>,
    /// microvm: the guest kernel (a vmlinuz, or an unpacked kernel package;
    /// default NAMZU_MICROVM_KERNEL, else <state>/microvm/kernel).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// microvm: the accelerator, auto (KVM where usable, else TCG), kvm or tcg.
    #[arg(long, value_parser = parse_accel)]
    pub accel: Option<namzu::backend::microvm::vmm::AccelChoice>,
    #[command(flatten)]
    pub network: NetworkArgs,
}

/// The kubernetes tier's part of the state directory.
pub fn kube_state_dir(state_dir: &Option<PathBuf>) -> PathBuf {
    state_dir
        .clone()
        .unwrap_or_else(namzu::backend::default_state_dir)
        .join("kubernetes")
}

/// The host's link credentials' default place.
pub fn link_dir(state_dir: &Option<PathBuf>) -> PathBuf {
    kube_state_dir(state_dir).join("link")
}

/// Where and how `--tier kubernetes` acquires (see docs/kubernetes.md); the
/// cluster is the one kube finds (KUBECONFIG, ~/.kube/config, or the pod's
/// service account).
#[derive(clap::Args, Clone, Default, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct KubeArgs {
    /// kubernetes: the namespace of the pool or template.
    #[arg(long = "kube-namespace", value_name = "NS")]
    pub namespace: Option<String>,
    /// kubernetes: claim from this SandboxWarmPool.
    #[arg(long = "warm-pool", value_name = "NAME", conflicts_with = "template")]
    pub warm_pool: Option<String>,
    /// kubernetes: without a pool, make a Sandbox from this SandboxTemplate.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// kubernetes: dial the Sandbox's Service name (in-cluster) or the pod's IP.
    #[arg(long = "kube-address", value_parser = ["service", "pod-ip"])]
    pub address: Option<String>,
    /// kubernetes: KEY=VALUE on the claim (repeatable).
    #[arg(long = "claim-label", value_parser = parse_kv)]
    pub claim_labels: Vec<(String, String)>,
    /// kubernetes: seconds an acquire may take, polls included.
    #[arg(long = "ready-timeout", value_name = "SECS")]
    pub ready_timeout: Option<u64>,
    /// kubernetes: the host's link credentials (`namzu kube link-init`);
    /// default `<state>/kubernetes/link`.
    #[arg(long = "link-dir", value_name = "DIR")]
    #[serde(default)]
    pub link_dir: Option<PathBuf>,
}

impl KubeArgs {
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none()
            && self.warm_pool.is_none()
            && self.template.is_none()
            && self.address.is_none()
            && self.claim_labels.is_empty()
            && self.ready_timeout.is_none()
            && self.link_dir.is_none()
    }

    /// The kubernetes tier's provider, built by the library's factory from
    /// these flags.
    pub async fn provider(&self, state_dir: &Option<PathBuf>) -> Result<Box<dyn namzu::Provider>, Fail> {
        // What cannot work is refused by option name before any cluster is
        // looked for.
        let mut opts = self.options();
        opts.validate()?;
        opts.link_tls = Some(self.link_tls(state_dir)?);
        let factory = namzu::factory::ProviderOptions {
            kubernetes: Some(opts),
            ..Default::default()
        };
        Ok(namzu::factory::provider(namzu::Tier::Kubernetes, factory).await?)
    }

    /// The host's link credentials, read from [`KubeArgs::link_dir`].
    pub fn link_tls(&self, state_dir: &Option<PathBuf>) -> Result<namzu::backend::kubernetes::link::LinkTls, Fail> {
        namzu::backend::kubernetes::link::LinkTls::from_dir(&self.link_dir(state_dir)).map_err(|e| {
            Fail(format!(
                "the pod link's credentials: {e} (make them with `namzu kube link-init`)"
            ))
        })
    }

    /// Where the host's link credentials are.
    pub fn link_dir(&self, state_dir: &Option<PathBuf>) -> PathBuf {
        self.link_dir.clone().unwrap_or_else(|| link_dir(state_dir))
    }

    /// The tier's options from these flags (without the link's
    /// credentials, which [`KubeArgs::provider`] reads).
    pub fn options(&self) -> namzu::backend::kubernetes::KubernetesOptions {
        use namzu::backend::kubernetes::{AddressMode, KubernetesOptions};
        let defaults = KubernetesOptions::default();
        KubernetesOptions {
            namespace: self.namespace.clone().unwrap_or(defaults.namespace.clone()),
            warm_pool_name: self.warm_pool.clone(),
            template_name: self.template.clone(),
            claim_labels: self.claim_labels.iter().cloned().collect(),
            address_mode: match self.address.as_deref() {
                Some("pod-ip") => AddressMode::PodIp,
                _ => AddressMode::Service,
            },
            ready_timeout: self
                .ready_timeout
                .map_or(defaults.ready_timeout, std::time::Duration::from_secs),
            ..defaults
        }
    }
}

/// What may leave a sandbox (see `namzu::egress`).
#[derive(clap::Args, Clone, Default)]
pub struct NetworkArgs {
    /// none (the default: nothing leaves, no name resolves), deny (names
    /// resolve, nothing connects), public (any public address, never a
    /// private, loopback, link-local, CGNAT, ULA, multicast or metadata one),
    /// all.
    #[arg(long, value_parser = ["none", "deny", "public", "all"])]
    pub network: Option<String>,
    /// Allow a host (api.example.com) or a domain with its subdomains
    /// (.example.com), optionally at some ports only: HOST=443,8443.
    /// Repeatable; makes the policy an allowlist.
    #[arg(long = "allow-host", value_name = "HOST[=PORTS]")]
    pub allow_hosts: Vec<String>,
    /// With --network public: never this CIDR either (repeatable).
    #[arg(long = "except-cidr", value_name = "CIDR")]
    pub except_cidrs: Vec<String>,
    /// Resolve NAME to IP on the host's side, before the system resolver
    /// (like docker's --add-host): NAME=IP (repeatable; at create only).
    #[arg(long = "egress-host", value_name = "NAME=IP")]
    pub egress_hosts: Vec<String>,
    /// Let the policy reach this link-local or cloud-metadata range
    /// (169.254.169.254/32, fe80::/10 …), refused under every policy
    /// otherwise, --network all included (repeatable; at create only).
    #[arg(long = "reach-link-local", value_name = "CIDR")]
    pub reach_link_local: Vec<String>,
    /// Egress connections open or opening at once (default 256); one more
    /// is refused and logged (at create only).
    #[arg(long = "egress-max-connections", value_name = "N")]
    pub egress_max_connections: Option<usize>,
    /// Name queries per second (default 20); more are refused and logged
    /// (at create only). Under --network deny only --egress-host names
    /// resolve.
    #[arg(long = "dns-queries-per-sec", value_name = "N")]
    pub dns_queries_per_sec: Option<u32>,
}

impl NetworkArgs {
    /// The policy these flags name, or `None` when they name none.
    pub fn policy(&self) -> Result<Option<namzu::egress::EgressPolicy>, Fail> {
        use namzu::egress::{policy::parse_cidrs, EgressPolicy, HostRule};
        if !self.except_cidrs.is_empty() && self.network.as_deref() != Some("public") {
            return Err(Fail("--except-cidr goes with --network public".into()));
        }
        if !self.allow_hosts.is_empty() {
            if let Some(n) = &self.network {
                return Err(Fail(format!("--allow-host makes an allowlist; drop --network {n}")));
            }
            let hosts = self
                .allow_hosts
                .iter()
                .map(|h| {
                    let (host, ports) = match h.split_once('=') {
                        None => (h.as_str(), None),
                        Some((host, ports)) => {
                            let ports = ports
                                .split(',')
                                .map(|p| {
                                    p.trim()
                                        .parse::<u32>()
                                        .map_err(|_| Fail(format!("{h:?}: {p:?} is not a port")))
                                })
                                .collect::<Result<Vec<u32>, Fail>>()?;
                            (host, Some(ports))
                        }
                    };
                    HostRule::parse(host, ports).map_err(|e| Fail(e.to_string()))
                })
                .collect::<Result<Vec<_>, Fail>>()?;
            return Ok(Some(EgressPolicy::Allowlist { hosts }));
        }
        Ok(match self.network.as_deref() {
            None => None,
            Some("none") => Some(EgressPolicy::NoNetwork),
            Some("deny") => Some(EgressPolicy::DenyAll),
            Some("all") => Some(EgressPolicy::AllowAll),
            Some("public") => Some(EgressPolicy::PublicInternet {
                except_cidrs: parse_cidrs(&self.except_cidrs).map_err(|e| Fail(e.to_string()))?,
            }),
            Some(other) => return Err(Fail(format!("unknown --network {other}"))),
        })
    }

    pub fn config(&self) -> Result<namzu::egress::EgressConfig, Fail> {
        let mut hosts = std::collections::BTreeMap::<String, Vec<std::net::IpAddr>>::new();
        for e in &self.egress_hosts {
            let (name, ip) = e
                .split_once('=')
                .ok_or_else(|| Fail(format!("--egress-host wants NAME=IP, got {e:?}")))?;
            let ip = ip
                .parse()
                .map_err(|_| Fail(format!("--egress-host {e:?}: {ip:?} is not an IP address")))?;
            let name = namzu::egress::policy::canonical_name(name)
                .map_err(|_| Fail(format!("--egress-host {e:?}: {name:?} is not a host name")))?;
            hosts.entry(name).or_default().push(ip);
        }
        Ok(namzu::egress::EgressConfig {
            policy: self.policy()?.unwrap_or_default(),
            hosts,
            reach_link_local: namzu::egress::policy::parse_cidrs(&self.reach_link_local)
                .map_err(|e| Fail(e.to_string()))?,
            max_connections: self.egress_max_connections,
            dns_queries_per_sec: self.dns_queries_per_sec,
        })
    }
}

impl ResourceArgs {
    pub fn spec(&self, env: Vec<(String, String)>) -> Result<SandboxSpec, Fail> {
        Ok(SandboxSpec {
            env,
            egress: self.network.config()?,
            image: self.image.clone(),
            binds: self.binds.clone(),
            resources: namzu::Resources {
                memory_bytes: self.memory,
                cpus: self.cpus,
                pids: self.pids,
                disk_bytes: self.disk,
            },
            ..Default::default()
        })
    }
}

#[derive(clap::Subcommand)]
pub enum NetworkAction {
    /// Replace the whole policy: new connections follow it at once, open
    /// ones it refuses are closed.
    Set {
        #[command(flatten)]
        network: NetworkArgs,
    },
    /// Print the policy in force (JSON) and how many connections are open.
    Show,
}

fn parse_accel(s: &str) -> Result<namzu::backend::microvm::vmm::AccelChoice, String> {
    s.parse()
}

pub fn parse_signal(s: &str) -> Result<namzu::SessionSignal, String> {
    match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
        "TERM" => Ok(namzu::SessionSignal::Term),
        "KILL" => Ok(namzu::SessionSignal::Kill),
        "INT" => Ok(namzu::SessionSignal::Int),
        "HUP" => Ok(namzu::SessionSignal::Hup),
        _ => Err(format!("signal must be TERM, KILL, INT or HUP, got {s:?}")),
    }
}

pub fn parse_ports(s: &str) -> Result<(u16, u16), String> {
    let (l, r) = s
        .split_once(':')
        .ok_or_else(|| format!("expected LOCAL:REMOTE, got {s:?}"))?;
    let l = l.parse().map_err(|_| format!("bad local port {l:?}"))?;
    let r: u16 = r.parse().map_err(|_| format!("bad remote port {r:?}"))?;
    if r == 0 {
        return Err("the remote port cannot be 0".into());
    }
    Ok((l, r))
}

pub fn parse_bind(s: &str) -> Result<namzu::Bind, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (src, dst, writable) = match parts.as_slice() {
        [src, dst] => (src, dst, false),
        [src, dst, "rw"] => (src, dst, true),
        [src, dst, "ro"] => (src, dst, false),
        _ => return Err(format!("expected SRC:DST or SRC:DST:rw, got {s:?}")),
    };
    Ok(namzu::Bind {
        source: src.into(),
        target: dst.into(),
        writable,
    })
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (t.as_str(), 1u64),
        Some((i, _)) => {
            let mul = match &t[i..] {
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                other => return Err(format!("unknown size unit {other:?} (use k, m or g)")),
            };
            (&t[..i], mul)
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("invalid size {s:?}"))
}

pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.into(), v.into())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}
