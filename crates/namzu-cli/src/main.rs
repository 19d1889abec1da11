//! `namzu`: run commands in sandboxes from the shell.
//!
//! Sandboxes outlive this process: their state lives in the state directory
//! (`--state-dir`, `NAMZU_STATE_DIR`), and a later `namzu` reconnects to the
//! agent by id. Every failure prints one line to stderr and exits non-zero
//! (125 for namzu's own errors, 2 for bad usage); `run` and `exec` otherwise
//! exit with the command's code, or 128 + signal.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::backend::host::HostProvider;
use namzu::backend::local::LocalProvider;
use namzu::{CancellationToken, ExecEvent, ExecRequest, Provider, Sandbox, SandboxSpec, Tier, WriteOptions};
use tokio::io::AsyncWriteExt;

/// Exit code for namzu's own failures (as `docker run` does).
const EXIT_NAMZU: u8 = 125;
const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(
    name = "namzu",
    version,
    about = "Sandboxes for AI agents: run commands behind an isolation boundary"
)]
struct Cli {
    /// Where sandbox state lives.
    #[arg(long, global = true, env = "NAMZU_STATE_DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct ExecArgs {
    /// KEY=VALUE added to the command's environment (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Working directory inside the sandbox (relative to its workspace).
    #[arg(long, short = 'w')]
    workdir: Option<PathBuf>,
    /// Kill the command (and everything it started) after this many seconds.
    #[arg(long)]
    timeout: Option<f64>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// Root filesystem, runtime and resource limits of a new sandbox.
#[derive(clap::Args, Clone, Default)]
struct ResourceArgs {
    /// local: an imported image (name or sha256:id) or a rootfs directory;
    /// default: a read-only view of the host's /usr and friends.
    /// docker: an image reference (required), pulled if the daemon lacks it.
    #[arg(long)]
    image: Option<String>,
    /// docker: the OCI runtime, runc (the daemon's default) or runsc (gVisor).
    #[arg(long)]
    runtime: Option<String>,
    /// Show a host path inside: SRC:DST, read-only, or SRC:DST:rw (repeatable).
    #[arg(long = "bind", value_parser = parse_bind)]
    binds: Vec<namzu::Bind>,
    /// Memory limit, e.g. 512m or 2g.
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU limit in CPUs, e.g. 0.5.
    #[arg(long)]
    cpus: Option<f64>,
    /// Process limit.
    #[arg(long)]
    pids: Option<u64>,
    #[command(flatten)]
    network: NetworkArgs,
}

/// Where and how `--tier kubernetes` acquires (see docs/kubernetes.md); the
/// cluster is the one kube finds (KUBECONFIG, ~/.kube/config, or the pod's
/// service account).
#[derive(clap::Args, Clone, Default)]
struct KubeArgs {
    /// kubernetes: the namespace of the pool or template.
    #[arg(long = "kube-namespace", value_name = "NS")]
    namespace: Option<String>,
    /// kubernetes: claim from this SandboxWarmPool.
    #[arg(long = "warm-pool", value_name = "NAME", conflicts_with = "template")]
    warm_pool: Option<String>,
    /// kubernetes: without a pool, make a Sandbox from this SandboxTemplate.
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// kubernetes: dial the Sandbox's Service name (in-cluster) or the pod's IP.
    #[arg(long = "kube-address", value_parser = ["service", "pod-ip"])]
    address: Option<String>,
    /// kubernetes: KEY=VALUE on the claim (repeatable).
    #[arg(long = "claim-label", value_parser = parse_kv)]
    claim_labels: Vec<(String, String)>,
    /// kubernetes: seconds an acquire may take, polls included.
    #[arg(long = "ready-timeout", value_name = "SECS")]
    ready_timeout: Option<u64>,
}

impl KubeArgs {
    fn is_empty(&self) -> bool {
        self.namespace.is_none()
            && self.warm_pool.is_none()
            && self.template.is_none()
            && self.address.is_none()
            && self.claim_labels.is_empty()
            && self.ready_timeout.is_none()
    }

    async fn provider(&self) -> Result<namzu::backend::kubernetes::KubernetesProvider, Fail> {
        use namzu::backend::kubernetes::{AddressMode, KubernetesOptions, KubernetesProvider};
        let defaults = KubernetesOptions::default();
        let opts = KubernetesOptions {
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
        };
        Ok(KubernetesProvider::from_env(opts).await?)
    }
}

/// What may leave a sandbox (see `namzu::egress`).
#[derive(clap::Args, Clone, Default)]
struct NetworkArgs {
    /// none (the default: nothing leaves, no name resolves), deny (names
    /// resolve, nothing connects), public (any public address, never a
    /// private, loopback, link-local, CGNAT, ULA, multicast or metadata one),
    /// all.
    #[arg(long, value_parser = ["none", "deny", "public", "all"])]
    network: Option<String>,
    /// Allow a host (api.example.com) or a domain with its subdomains
    /// (.example.com), optionally at some ports only: HOST=443,8443.
    /// Repeatable; makes the policy an allowlist.
    #[arg(long = "allow-host", value_name = "HOST[=PORTS]")]
    allow_hosts: Vec<String>,
    /// With --network public: never this CIDR either (repeatable).
    #[arg(long = "except-cidr", value_name = "CIDR")]
    except_cidrs: Vec<String>,
    /// Resolve NAME to IP on the host's side, before the system resolver
    /// (like docker's --add-host): NAME=IP (repeatable; at create only).
    #[arg(long = "egress-host", value_name = "NAME=IP")]
    egress_hosts: Vec<String>,
    /// Let the policy reach this link-local or cloud-metadata range
    /// (169.254.169.254/32, fe80::/10 …), refused under every policy
    /// otherwise, --network all included (repeatable; at create only).
    #[arg(long = "reach-link-local", value_name = "CIDR")]
    reach_link_local: Vec<String>,
    /// Egress connections open or opening at once (default 256); one more
    /// is refused and logged (at create only).
    #[arg(long = "egress-max-connections", value_name = "N")]
    egress_max_connections: Option<usize>,
    /// Name queries per second (default 20); more are refused and logged
    /// (at create only). Under --network deny only --egress-host names
    /// resolve.
    #[arg(long = "dns-queries-per-sec", value_name = "N")]
    dns_queries_per_sec: Option<u32>,
}

impl NetworkArgs {
    /// The policy these flags name, or `None` when they name none.
    fn policy(&self) -> Result<Option<namzu::egress::EgressPolicy>, Fail> {
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

    fn config(&self) -> Result<namzu::egress::EgressConfig, Fail> {
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
    fn spec(&self, env: Vec<(String, String)>) -> Result<SandboxSpec, Fail> {
        Ok(SandboxSpec {
            env,
            egress: self.network.config()?,
            image: self.image.clone(),
            binds: self.binds.clone(),
            resources: namzu::Resources {
                memory_bytes: self.memory,
                cpus: self.cpus,
                pids: self.pids,
            },
            ..Default::default()
        })
    }
}

#[derive(Subcommand)]
enum NetworkAction {
    /// Replace the whole policy: new connections follow it at once, open
    /// ones it refuses are closed.
    Set {
        #[command(flatten)]
        network: NetworkArgs,
    },
    /// Print the policy in force (JSON) and how many connections are open.
    Show,
}

fn parse_signal(s: &str) -> Result<namzu::SessionSignal, String> {
    match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
        "TERM" => Ok(namzu::SessionSignal::Term),
        "KILL" => Ok(namzu::SessionSignal::Kill),
        "INT" => Ok(namzu::SessionSignal::Int),
        "HUP" => Ok(namzu::SessionSignal::Hup),
        _ => Err(format!("signal must be TERM, KILL, INT or HUP, got {s:?}")),
    }
}

fn session_state(s: &namzu::SessionInfo) -> String {
    match s.state {
        namzu::SessionState::Running => "running".into(),
        namzu::SessionState::Exited(st) => format!("exited({})", st.shell_code()),
    }
}

fn parse_ports(s: &str) -> Result<(u16, u16), String> {
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

fn parse_bind(s: &str) -> Result<namzu::Bind, String> {
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

fn parse_size(s: &str) -> Result<u64, String> {
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

#[derive(Subcommand)]
enum Cmd {
    /// Create a sandbox, run one command in it, destroy it.
    Run {
        /// Isolation tier.
        #[arg(long, default_value = "local")]
        tier: Tier,
        #[command(flatten)]
        resources: ResourceArgs,
        #[command(flatten)]
        kube: KubeArgs,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Create a sandbox that outlives this process; prints its id.
    Create {
        #[arg(long, default_value = "local")]
        tier: Tier,
        /// KEY=VALUE in every command's environment (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        #[command(flatten)]
        resources: ResourceArgs,
    },
    /// Show or change what may leave a running sandbox.
    Network {
        id: String,
        #[command(subcommand)]
        action: NetworkAction,
    },
    /// Run a command in an existing sandbox.
    Exec {
        id: String,
        /// Start it in a named session that outlives this process and return
        /// at once (read it with `namzu logs`, stop it with `namzu kill`).
        #[arg(long, requires = "session")]
        detach: bool,
        /// Name the command. Without --detach it runs in the foreground as a
        /// detachable execution: if this process dies the command goes on,
        /// and `namzu logs ID NAME --follow` picks it up (Ctrl-C still
        /// cancels it). With --detach, the session's name.
        #[arg(long = "id", value_name = "NAME")]
        session: Option<String>,
        #[command(flatten)]
        exec: ExecArgs,
    },
    /// Print a detached session's or a named execution's output from an
    /// offset; --follow until it exits, then exit with its code.
    Logs {
        id: String,
        session: String,
        #[arg(long)]
        follow: bool,
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// List a sandbox's sessions.
    Sessions { id: String },
    /// Signal every process of a session.
    Kill {
        id: String,
        session: String,
        /// TERM, KILL, INT or HUP.
        #[arg(long, default_value = "TERM", value_parser = parse_signal)]
        signal: namzu::SessionSignal,
    },
    /// Cancel a named execution and wait until its kill is confirmed.
    Cancel { id: String, name: String },
    /// Copy a file; write ID:PATH for a path inside a sandbox.
    Cp { src: String, dst: String },
    /// List sandboxes.
    Ls,
    /// An interactive shell (a pty) in a sandbox; exits with the shell's code.
    Shell {
        id: String,
        /// Keep the terminal as a persistent session with this name: this
        /// process dying only detaches it (`namzu attach` resumes it).
        #[arg(long)]
        session: Option<String>,
        /// Command instead of a login shell.
        #[arg(last = true)]
        command: Vec<OsString>,
    },
    /// Attach to a persistent terminal session (replays from --from).
    Attach {
        id: String,
        session: String,
        #[arg(long, default_value_t = 0)]
        from: u64,
    },
    /// Forward a local TCP port to a port inside a sandbox (until Ctrl-C).
    PortForward {
        id: String,
        /// LOCAL:REMOTE, e.g. 8080:80; LOCAL 0 picks a free port.
        #[arg(value_parser = parse_ports)]
        ports: (u16, u16),
    },
    /// Manage root filesystem images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Remove sandboxes whose agent died, and their leftovers.
    Gc {
        /// Only this tier (default: every tier with local state).
        #[arg(long)]
        tier: Option<Tier>,
    },
    /// Destroy sandboxes.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Import a `docker save` tarball or an OCI image layout (tar or directory).
    Import {
        file: PathBuf,
        /// Name to give it (default: the names it carries).
        #[arg(long)]
        name: Option<String>,
    },
    /// List imported images.
    Ls,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.into(), v.into())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// A failure to report in one line.
struct Fail(String);

impl From<namzu::Error> for Fail {
    fn from(e: namzu::Error) -> Self {
        Fail(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let msg = e.render().to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("invalid usage")
                .trim_start_matches("error: ");
            eprintln!("namzu: {first} (see namzu --help)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NAMZU_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("namzu: cannot start: {e}");
            return ExitCode::from(EXIT_NAMZU);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(Fail(msg)) => {
            eprintln!("namzu: {msg}");
            ExitCode::from(EXIT_NAMZU)
        }
    }
}

/// The provider of `tier`; `runtime` is the docker runtime to create with.
async fn provider(state_dir: &Option<PathBuf>, tier: Tier, runtime: Option<String>) -> Result<Box<dyn Provider>, Fail> {
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    if runtime.is_some() && tier != Tier::Docker {
        return Err(Fail(format!("--runtime applies to --tier docker, not {tier}")));
    }
    match tier {
        Tier::Host => Ok(Box::new(HostProvider::new(dir)?)),
        Tier::Local => Ok(Box::new(LocalProvider::new(dir)?)),
        Tier::Docker => {
            let opts = DockerOptions {
                runtime,
                on_pull: Some(pull_progress()),
                ..Default::default()
            };
            Ok(Box::new(DockerProvider::new(dir, opts).await?))
        }
        Tier::Kubernetes => Err(Fail(
            "a kubernetes sandbox is not recorded in the state directory: only `namzu run --tier kubernetes` (create, run, destroy in one process) is available from the CLI".into(),
        )),
        other => Err(Fail(format!(
            "tier {other} is not available yet; use --tier local or docker"
        ))),
    }
}

/// Draws one bar per image pull on stderr.
fn pull_progress() -> namzu::backend::docker::PullCallback {
    let bar = std::sync::Arc::new(std::sync::Mutex::new(None::<indicatif::ProgressBar>));
    std::sync::Arc::new(move |p: &namzu::backend::docker::PullProgress| {
        let Ok(mut slot) = bar.lock() else { return };
        let b = slot.get_or_insert_with(|| progress(0, "pull"));
        if let (Some(cur), Some(total)) = (p.current, p.total) {
            b.set_length(total);
            b.set_position(cur);
        }
        b.set_message(format!("pull {} {}", p.layer.as_deref().unwrap_or(""), p.status));
        if p.status.starts_with("Status:") {
            b.finish_and_clear();
        }
    })
}

/// The tiers whose sandboxes are recorded in the state directory.
const STATE_TIERS: [Tier; 3] = [Tier::Local, Tier::Host, Tier::Docker];

/// Tiers that have ever made a sandbox in this state directory.
fn used_tiers(state_dir: &Option<PathBuf>) -> Vec<Tier> {
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    STATE_TIERS
        .into_iter()
        .filter(|t| *t != Tier::Docker || dir.join(t.name()).is_dir())
        .collect()
}

/// The provider that knows sandbox `id`.
async fn provider_of(state_dir: &Option<PathBuf>, id: &str) -> Result<(Tier, Box<dyn Provider>), Fail> {
    let dir = state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir);
    for tier in STATE_TIERS {
        let known = Path::new(id).file_name() == Some(std::ffi::OsStr::new(id))
            && dir.join(tier.name()).join(id).join("meta.json").is_file();
        if known {
            return Ok((tier, provider(state_dir, tier, None).await?));
        }
    }
    Err(Fail(format!("no sandbox with id {id}")))
}

fn warn_host(tier: Tier) {
    if tier == Tier::Host {
        eprintln!("namzu: WARNING: tier host isolates NOTHING; the command runs as you, on this machine");
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Fail> {
    match cli.cmd {
        Cmd::Run {
            tier,
            resources,
            kube,
            exec,
        } => {
            let p: Box<dyn Provider> = match tier {
                Tier::Kubernetes => Box::new(kube.provider().await?),
                _ if !kube.is_empty() => {
                    return Err(Fail(format!(
                        "--kube-namespace, --warm-pool, --template, --kube-address, --claim-label and --ready-timeout apply to --tier kubernetes, not {tier}"
                    )))
                }
                _ => provider(&cli.state_dir, tier, resources.runtime.clone()).await?,
            };
            warn_host(tier);
            let sb = p.create(resources.spec(Vec::new())?).await?;
            let result = run_command(&sb, exec, None).await;
            let destroyed = sb.destroy().await;
            let code = result?;
            destroyed?;
            Ok(code)
        }
        Cmd::Create { tier, env, resources } => {
            let p = provider(&cli.state_dir, tier, resources.runtime.clone()).await?;
            warn_host(tier);
            let sb = p.create(resources.spec(env)?).await?;
            println!("{}", sb.id());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Network { id, action } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            match action {
                NetworkAction::Set { network } => {
                    if !network.egress_hosts.is_empty()
                        || !network.reach_link_local.is_empty()
                        || network.egress_max_connections.is_some()
                        || network.dns_queries_per_sec.is_some()
                    {
                        return Err(Fail(
                            "--egress-host, --reach-link-local, --egress-max-connections and --dns-queries-per-sec are set at create; `network set` changes the policy"
                                .into(),
                        ));
                    }
                    let policy = network
                        .policy()?
                        .ok_or_else(|| Fail("say what to allow: --network, or --allow-host".into()))?;
                    sb.network().set_policy(policy).await?;
                }
                NetworkAction::Show => {
                    let (config, open) = sb.network().policy().await?;
                    let mut v = serde_json::to_value(&config).map_err(|e| Fail(e.to_string()))?;
                    v["open_connections"] = serde_json::Value::from(open);
                    println!("{}", serde_json::to_string_pretty(&v).map_err(|e| Fail(e.to_string()))?);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec {
            id,
            detach,
            session,
            exec,
        } => {
            let (tier, p) = provider_of(&cli.state_dir, &id).await?;
            warn_host(tier);
            let sb = p.connect(&id).await?;
            if !detach {
                return run_command(&sb, exec, session).await;
            }
            if exec.timeout.is_some() {
                return Err(Fail(
                    "--timeout does not apply to --detach (stop it with `namzu kill`)".into(),
                ));
            }
            let mut args = exec.command.into_iter();
            let command = args.next().ok_or_else(|| Fail("no command given".into()))?;
            let spec = namzu::SessionSpec {
                session_id: session.unwrap_or_default(),
                command,
                args: args.collect(),
                cwd: exec.workdir,
                env: exec.env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            };
            let info = sb.sessions().start(spec).await?;
            println!("{}", info.session_id);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Logs {
            id,
            session,
            follow,
            from,
        } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            let mut out = tokio::io::stdout();
            let mut at = from;
            loop {
                let c = match sb.sessions().read_max(&session, at, 0).await {
                    // Not a session: a named execution, read from its log.
                    Err(namzu::Error::SessionNotFound { .. }) if at == from => {
                        let opts = namzu::AttachOptions {
                            from_offset: from,
                            follow,
                            on_gap: Some(std::sync::Arc::new(|g: namzu::OutputGap| {
                                eprintln!(
                                    "namzu: {} bytes of output were dropped (log full) from offset {}",
                                    g.lost_bytes, g.from_offset
                                )
                            })),
                            ..Default::default()
                        };
                        let stream = sb.commands().attach_stream(&session, opts).await?;
                        let code = print_events(stream).await?;
                        return Ok(code.unwrap_or(ExitCode::SUCCESS));
                    }
                    other => other?,
                };
                if c.dropped_bytes > 0 {
                    eprintln!(
                        "namzu: {} bytes of output were dropped (ring full) before offset {}",
                        c.dropped_bytes, c.offset
                    );
                }
                out.write_all(&c.data).await.map_err(|e| Fail(format!("stdout: {e}")))?;
                out.flush().await.map_err(|e| Fail(format!("stdout: {e}")))?;
                at = c.next_offset;
                let caught_up = at == c.info.output_bytes;
                match c.info.state {
                    namzu::SessionState::Exited(st) if caught_up && follow => {
                        return Ok(ExitCode::from(
                            u8::try_from(st.shell_code().clamp(0, 255)).unwrap_or(255),
                        ));
                    }
                    _ if caught_up && !follow => return Ok(ExitCode::SUCCESS),
                    _ if c.data.is_empty() => tokio::time::sleep(Duration::from_millis(50)).await,
                    _ => {}
                }
            }
        }
        Cmd::Sessions { id } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            println!("{:<24} {:<8} {:<12} BYTES", "SESSION", "PID", "STATE");
            for s in sb.sessions().list().await? {
                println!(
                    "{:<24} {:<8} {:<12} {}",
                    s.session_id,
                    s.pid,
                    session_state(&s),
                    s.output_bytes
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cancel { id, name } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            let outcome = match sb.commands().cancel(&name).await? {
                namzu::CancelOutcome::Killed => "killed",
                namzu::CancelOutcome::NotStarted => "never started",
                namzu::CancelOutcome::AlreadyExited => "had already exited",
            };
            println!("{name} {outcome}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Kill { id, session, signal } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            let info = sb.sessions().kill(&session, signal).await?;
            println!("{} {}", info.session_id, session_state(&info));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cp { src, dst } => {
            let id = split_remote(&src).or(split_remote(&dst)).map(|(id, _)| id.to_owned());
            let Some(id) = id else {
                return Err(Fail("one side of cp must be ID:PATH".into()));
            };
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            copy(p.as_ref(), &src, &dst).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ls => {
            println!("{:<18} {:<8} {:<6} CREATED", "ID", "TIER", "STATE");
            for tier in used_tiers(&cli.state_dir) {
                for s in provider(&cli.state_dir, tier, None).await?.list().await? {
                    let state = if s.alive { "up" } else { "dead" };
                    println!("{:<18} {:<8} {:<6} {}", s.id, s.tier, state, s.created_unix);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Shell { id, session, command } => {
            let (tier, p) = provider_of(&cli.state_dir, &id).await?;
            warn_host(tier);
            let sb = p.connect(&id).await?;
            shell(&sb, session, command).await
        }
        Cmd::Attach { id, session, from } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb = p.connect(&id).await?;
            let t = sb.terminals().attach(&session, from).await?;
            interact(t).await
        }
        Cmd::PortForward {
            id,
            ports: (local, remote),
        } => {
            let (_, p) = provider_of(&cli.state_dir, &id).await?;
            let sb: Sandbox = p.connect(&id).await?;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", local))
                .await
                .map_err(|e| Fail(format!("cannot listen on 127.0.0.1:{local}: {e}")))?;
            let addr = listener.local_addr().map_err(|e| Fail(e.to_string()))?;
            println!("forwarding {addr} -> {id}:{remote}");
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
                    accepted = listener.accept() => {
                        let (mut conn, peer) = match accepted {
                            Ok(c) => c,
                            // Out of descriptors and the like: the forward
                            // goes on once some are free.
                            Err(e) if namzu_proto::accept::is_transient(&e) => {
                                tokio::time::sleep(namzu_proto::accept::BACKOFF).await;
                                continue;
                            }
                            Err(e) => return Err(Fail(e.to_string())),
                        };
                        let sb = sb.clone();
                        tokio::spawn(async move {
                            match sb.network().connect(remote).await {
                                Ok(mut tunnel) => {
                                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut tunnel).await;
                                }
                                Err(e) => eprintln!("namzu: {peer}: {e}"),
                            }
                        });
                    }
                }
            }
        }
        Cmd::Image(ImageCmd::Import { file, name }) => {
            let store =
                namzu::image::ImageStore::new(cli.state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir));
            let bar = progress(std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0), "import");
            let shown = bar.clone();
            let info = tokio::task::spawn_blocking(move || {
                store.import(&file, name.as_deref(), &|done, _| shown.set_position(done))
            })
            .await
            .map_err(|e| Fail(e.to_string()))?;
            bar.finish_and_clear();
            let info = info?;
            println!("{} {}", info.id, info.names.join(" "));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Image(ImageCmd::Ls) => {
            let store =
                namzu::image::ImageStore::new(cli.state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir));
            for i in store.list()? {
                println!("{} {}", i.id, i.names.join(" "));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gc { tier } => {
            let tiers: Vec<Tier> = match tier {
                Some(t) => vec![t],
                None => used_tiers(&cli.state_dir),
            };
            for t in tiers {
                for id in provider(&cli.state_dir, t, None).await?.gc().await? {
                    println!("{id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rm { ids } => {
            for id in ids {
                // Unknown ids are an error here, although destroy itself is
                // idempotent: a typo should not look like success.
                let (_, p) = provider_of(&cli.state_dir, &id).await?;
                p.destroy(&id).await?;
                println!("{id}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs one command, streaming its output; Ctrl-C cancels it (and
/// everything it started). Returns the command's exit code.
async fn run_command(sb: &Sandbox, a: ExecArgs, name: Option<String>) -> Result<ExitCode, Fail> {
    let mut args = a.command.into_iter();
    let Some(cmd) = args.next() else {
        return Err(Fail("no command given".into()));
    };
    let mut req = ExecRequest::new(cmd).args(args);
    for (k, v) in a.env {
        req = req.env(k, v);
    }
    if let Some(w) = a.workdir {
        req = req.cwd(w);
    }
    if let Some(t) = a.timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(Fail(format!("--timeout must be a positive number of seconds, got {t}")));
        }
        req = req.timeout(Duration::from_secs_f64(t));
    }
    if let Some(name) = name {
        req = req.execution_id(name);
    }
    // Piped input is forwarded; a terminal is not (no PTY yet), so an
    // interactive shell does not wait on keystrokes it cannot see.
    if !std::io::stdin().is_terminal() {
        let stdin = tokio_util::io::ReaderStream::new(tokio::io::stdin())
            .take_while(|r| futures::future::ready(r.is_ok()))
            .filter_map(|r| futures::future::ready(r.ok()));
        req = req.stdin_stream(stdin);
    }
    let token = CancellationToken::new();
    let ctrl_c = {
        let token = token.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                token.cancel();
            }
        })
    };
    let stream = sb.commands().stream(req.cancel_token(token)).await?;
    let code = print_events(stream).await;
    ctrl_c.abort();
    Ok(code?.unwrap_or(ExitCode::from(EXIT_NAMZU)))
}

/// Copies a command's output to ours; the command's exit code, if the
/// stream got that far.
async fn print_events(mut stream: namzu::ExecStream) -> Result<Option<ExitCode>, Fail> {
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let mut code = None;
    while let Some(ev) = stream.next().await {
        match ev? {
            ExecEvent::Stdout { data, .. } => {
                out.write_all(&data).await.map_err(|e| Fail(format!("stdout: {e}")))?;
                out.flush().await.map_err(|e| Fail(format!("stdout: {e}")))?;
            }
            ExecEvent::Stderr { data, .. } => {
                err.write_all(&data).await.map_err(|e| Fail(format!("stderr: {e}")))?;
            }
            ExecEvent::Exit(x) => {
                if x.status.timed_out {
                    eprintln!("namzu: command timed out and was killed");
                }
                if x.stdout_truncated || x.stderr_truncated {
                    eprintln!("namzu: some output was dropped (beyond max_output_bytes, or evicted from the log)");
                }
                code = Some(ExitCode::from(
                    u8::try_from(x.status.shell_code().clamp(0, 255)).unwrap_or(255),
                ));
            }
        }
    }
    Ok(code)
}

/// Puts the terminal in raw mode until dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self(None);
        }
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let _ = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, saved);
        }
    }
}

fn local_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout()).map_or((80, 24), |w| (w.ws_col, w.ws_row))
}

/// Runs an interactive terminal: stdin in, output out, resizes followed.
async fn shell(sb: &Sandbox, session: Option<String>, command: Vec<OsString>) -> Result<ExitCode, Fail> {
    let (cols, rows) = local_size();
    let mut args = command.into_iter();
    let opts = namzu::TerminalOptions {
        command: args.next(),
        args: args.collect(),
        cols,
        rows,
        persistent: session.is_some(),
        session_id: session,
        ..Default::default()
    };
    let t = sb.terminals().open(opts).await?;
    interact(t).await
}

/// Drives a terminal from this process's stdin and stdout until it exits.
async fn interact(mut t: namzu::Terminal) -> Result<ExitCode, Fail> {
    use tokio::io::AsyncReadExt;
    let _raw = RawMode::enter();
    let (tx, mut keys) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 || tx.send(bytes::Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                break;
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .map_err(|e| Fail(e.to_string()))?;
    let mut out = tokio::io::stdout();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            ev = t.next() => match ev {
                Some(Ok(namzu::TerminalEvent::Output { data, .. })) => {
                    out.write_all(&data).await.map_err(|e| Fail(format!("stdout: {e}")))?;
                    out.flush().await.map_err(|e| Fail(format!("stdout: {e}")))?;
                }
                Some(Ok(namzu::TerminalEvent::Exit(st))) => {
                    return Ok(ExitCode::from(u8::try_from(st.shell_code().clamp(0, 255)).unwrap_or(255)));
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Err(Fail("the terminal ended without an exit".into())),
            },
            key = keys.recv(), if stdin_open => match key {
                Some(k) => t.write(k).await?,
                // End of input is passed on as the terminal's EOF character.
                None => {
                    stdin_open = false;
                    t.write(bytes::Bytes::from_static(b"\x04")).await?;
                }
            },
            _ = winch.recv() => {
                let (c, r) = local_size();
                t.resize(c, r).await?;
            }
        }
    }
}

/// `ID:PATH` → (id, path); anything else is a local path.
fn split_remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (id.starts_with("sb-") && !id.contains('/')).then_some((id, path))
}

async fn copy(p: &dyn Provider, src: &str, dst: &str) -> Result<(), Fail> {
    match (split_remote(src), split_remote(dst)) {
        (None, Some((id, path))) => {
            let sb = p.connect(id).await?;
            let file = tokio::fs::File::open(src)
                .await
                .map_err(|e| Fail(format!("{src}: {e}")))?;
            let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
            let bar = progress(len, "upload");
            let reader = bar.wrap_async_read(file);
            sb.files()
                .write_from(Path::new(path), Box::new(reader), WriteOptions::default())
                .await?;
            bar.finish_and_clear();
            Ok(())
        }
        (Some((id, path)), None) => {
            let sb = p.connect(id).await?;
            let size = sb.files().stat(Path::new(path)).await?.size;
            let bar = progress(size, "download");
            let mut s = sb.files().stream(Path::new(path)).await?;
            // Written beside the target and renamed, so a failed copy never
            // leaves a truncated file under the destination name.
            let target = PathBuf::from(dst);
            let tmp = target.with_file_name(format!(
                ".{}.namzu-part",
                target.file_name().and_then(|n| n.to_str()).unwrap_or("copy")
            ));
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
            let res = async {
                while let Some(chunk) = s.next().await {
                    let chunk = chunk?;
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
                    bar.inc(chunk.len() as u64);
                }
                f.sync_all()
                    .await
                    .map_err(|e| Fail(format!("{}: {e}", tmp.display())))?;
                tokio::fs::rename(&tmp, &target)
                    .await
                    .map_err(|e| Fail(format!("{dst}: {e}")))
            }
            .await;
            if res.is_err() {
                let _ = tokio::fs::remove_file(&tmp).await;
            }
            bar.finish_and_clear();
            res
        }
        (Some(_), Some(_)) => Err(Fail(
            "copying between two sandboxes is not supported; copy through the host".into(),
        )),
        (None, None) => Err(Fail("one side of cp must be ID:PATH".into())),
    }
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}") {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}
