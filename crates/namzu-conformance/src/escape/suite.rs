//! The escape attempts, run twice: once on the host as a positive control
//! (each under the identity its attempt names), once inside the sandbox.
//! An attempt counts as proven blocked only when its control succeeded AND
//! the attempt inside failed with one of the errnos that name the boundary
//! (or found nothing where the control found it). Everything else is
//! inconclusive, named, and never counted as proof.
//!
//! The host plants the targets: a secret in a world-readable directory,
//! TCP listeners on loopback and on the host's own address, unix and
//! abstract sockets, a marked process, a file in the host's /etc that the
//! curated copy leaves out, a 0777 directory bound read-only into the
//! sandbox at [`RO_TARGET`] (where the tier takes binds), and a plaintext
//! agent on the host's loopback, whose preface the control speaks as the
//! host would; inside, the same attempt aims at the agent port
//! ([`AGENT_PORT`]) with the token the tier's agent takes there.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use namzu::{Bind, ExecRequest, SandboxSpec};

use crate::util::Ctx;
use crate::{ensure, Factory};

/// Where the read-only bind sits inside the sandbox.
pub const RO_TARGET: &str = "/mnt/namzu-ro";

/// The agent port a link attempt aims at inside (a pod's; nothing listens
/// there on the tiers whose link is a host socket).
pub const AGENT_PORT: u16 = 1024;

/// What a tier's sandbox offers the suite.
pub struct TierShape {
    /// Whether the tier takes binds (the kubernetes tier's pods do not).
    pub binds: bool,
    /// The bind token its agent port takes, read from the handle (a pod's
    /// uid); `None`: the control's token.
    pub link_token: Option<fn(&namzu::Sandbox) -> String>,
}

impl Default for TierShape {
    fn default() -> Self {
        Self {
            binds: true,
            link_token: None,
        }
    }
}

/// One attempt's line from `namzu-escape`: its verdict word and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub verdict: String,
    pub detail: String,
}

/// What the pair of runs shows about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The control succeeded; inside it failed with a proving errno.
    Proven,
    /// Inside it succeeded.
    Escaped(String),
    /// Neither: why.
    Inconclusive(String),
    /// No safe control exists (it would change the host's kernel); it
    /// failed inside. Not counted as evidence.
    Uncontrolled(String),
}

/// Both runs, parsed, with each attempt's outcome.
#[derive(Debug)]
pub struct Report {
    pub inside: BTreeMap<String, Line>,
    pub control: BTreeMap<String, Line>,
    pub outcomes: BTreeMap<String, Outcome>,
    /// Escapes only the host saw (a listener accepted, the marked process
    /// died, the secret changed).
    pub host_side: Vec<String>,
    /// What the agent reported it applied (Health's `hardening`).
    pub hardening: BTreeMap<String, String>,
}

pub fn parse(text: &str) -> BTreeMap<String, Line> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, '\t');
            (f.next()? == "attempt").then_some(())?;
            let name = f.next()?.to_owned();
            let verdict = f.next()?.to_owned();
            let detail = f.next().unwrap_or_default().to_owned();
            Some((name, Line { verdict, detail }))
        })
        .collect()
}

pub fn judge(inside: &Line, control: Option<&Line>) -> Outcome {
    let control = control.map(|c| c.verdict.as_str());
    match (inside.verdict.as_str(), control) {
        ("succeeded", _) => Outcome::Escaped(inside.detail.clone()),
        (_, Some("skipped")) if inside.verdict == "blocked" => Outcome::Uncontrolled(inside.detail.clone()),
        ("blocked", Some("succeeded")) => Outcome::Proven,
        ("blocked", c) => Outcome::Inconclusive(format!("the control failed too ({c:?})")),
        (v, _) => Outcome::Inconclusive(format!("inside: {v} {}", inside.detail)),
    }
}

impl Report {
    pub fn proven(&self) -> Vec<&str> {
        self.with(|o| matches!(o, Outcome::Proven))
    }
    pub fn escaped(&self) -> Vec<&str> {
        self.with(|o| matches!(o, Outcome::Escaped(_)))
    }
    pub fn inconclusive(&self) -> Vec<&str> {
        self.with(|o| matches!(o, Outcome::Inconclusive(_)))
    }
    pub fn uncontrolled(&self) -> Vec<&str> {
        self.with(|o| matches!(o, Outcome::Uncontrolled(_)))
    }
    fn with(&self, f: impl Fn(&Outcome) -> bool) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter(|(_, o)| f(o))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The summary CI prints. Kernel invariants (named by the tier's
    /// expectation) and attempts with no safe control are listed apart and
    /// not counted as proof.
    pub fn summary(&self, tier: &str, expect: &Expect) -> String {
        let invariant = |n: &str| expect.invariants.iter().any(|(i, _)| *i == n);
        let proven: Vec<&str> = self.proven().into_iter().filter(|n| !invariant(n)).collect();
        let mut apart: Vec<&str> = self.proven().into_iter().filter(|n| invariant(n)).collect();
        apart.extend(self.uncontrolled());
        format!(
            "escape suite ({tier}): {} attempted, {} proven blocked, {} succeeded, {} inconclusive {:?}; kernel invariants, not counted: {} {:?}",
            self.outcomes.len(),
            proven.len(),
            self.escaped().len() + self.host_side.len(),
            self.inconclusive().len(),
            self.inconclusive(),
            apart.len(),
            apart,
        )
    }
}

/// The host's first non-loopback IPv4 address, where the second TCP
/// listener is reachable from the host itself.
fn host_ip() -> Result<std::net::Ipv4Addr, String> {
    nix::ifaddrs::getifaddrs()
        .ctx("getifaddrs")?
        .filter_map(|i| i.address?.as_sockaddr_in().map(|a| a.ip()))
        .find(|ip| !ip.is_loopback())
        .ok_or_else(|| "the host has no IPv4 address besides loopback".into())
}

/// A real agent serving plaintext on a free loopback port with `token`
/// (the control's target for acting as the host): started, and waited for.
fn plaintext_agent(root: &Path, token: &str) -> Result<(Reap, u16), String> {
    let bin = namzu::backend::find_agent_binary().ctx("agent binary")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ctx("a free port")?
        .port();
    let token_file = root.join(".agent-token");
    std::fs::write(&token_file, token).ctx("agent token")?;
    let child = std::process::Command::new(bin)
        .args([
            "--listen",
            &format!("tcp:127.0.0.1:{port}"),
            "--consume-token",
            "--root",
        ])
        .arg(root)
        .arg("--token-file")
        .arg(&token_file)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ctx("start the plaintext agent")?;
    let agent = Reap(child);
    for _ in 0..250 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((agent, port));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(format!("the plaintext agent never listened on 127.0.0.1:{port}"))
}

/// The block device holding the host's root filesystem.
fn host_disk() -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata("/").map(|m| m.dev()).unwrap_or(0);
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(|d| format!("/dev/{d}")))
        })
        .unwrap_or_else(|| format!("/dev/block/{major}:{minor}"))
}

/// `len:fnv64`, as `namzu-escape` computes it.
fn digest(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{}:{h:016x}", bytes.len())
}

/// Removes a planted file on every way out.
struct Planted(PathBuf);
impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Kills the marked host process on every way out.
struct Reap(std::process::Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The targets, alive for one run.
pub struct Targets {
    dir: tempfile::TempDir,
    scratch: tempfile::TempDir,
    tcp: std::net::TcpListener,
    _wide: std::net::TcpListener,
    _unix: UnixListener,
    _abstract: UnixListener,
    _canary: Planted,
    sleeper: Reap,
    _agent: Reap,
    agent_token: String,
    control_link: String,
    args: Vec<String>,
}

impl Targets {
    pub fn plant() -> Result<Self, String> {
        static RUN: AtomicUsize = AtomicUsize::new(0);
        let n = RUN.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}-{n}", std::process::id());
        let dir = tempfile::tempdir().ctx("tempdir")?;
        // World-readable on purpose: only the boundary may keep it out.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).ctx("chmod")?;
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"the host's secret").ctx("plant secret")?;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).ctx("chmod")?;
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).ctx("mkdir ro")?;
        std::fs::write(ro.join("file"), b"").ctx("ro file")?;
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o777)).ctx("chmod")?;
        std::fs::set_permissions(ro.join("file"), std::fs::Permissions::from_mode(0o666)).ctx("chmod")?;
        let scratch = tempfile::tempdir().ctx("tempdir")?;
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).ctx("chmod")?;

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").ctx("tcp listener")?;
        let port = tcp.local_addr().ctx("addr")?.port();
        tcp.set_nonblocking(true).ctx("nonblocking")?;
        let ip = host_ip()?;
        let wide = std::net::TcpListener::bind((ip, port)).ctx("tcp listener on the host's address")?;
        let unix_path = dir.path().join("host.sock");
        let unix = UnixListener::bind(&unix_path).ctx("unix listener")?;
        std::fs::set_permissions(&unix_path, std::fs::Permissions::from_mode(0o777)).ctx("chmod")?;
        let abstract_name = format!("namzu-escape-{tag}");
        let abs = {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).ctx("abstract")?;
            UnixListener::bind_addr(&a).ctx("abstract listener")?
        };
        let canary_name = format!("namzu-escape-canary-{tag}");
        let canary = Planted(Path::new("/etc").join(&canary_name));
        std::fs::write(&canary.0, b"a host /etc file\n").ctx("plant the /etc canary")?;
        std::fs::set_permissions(&canary.0, std::fs::Permissions::from_mode(0o644)).ctx("chmod")?;
        let shadow = std::fs::read("/etc/shadow").map_or_else(|_| "unreadable".to_owned(), |b| digest(&b));
        let marker = format!("namzu-escape-marker-{tag}");
        let sleeper = std::process::Command::new("sleep")
            .arg0(&marker)
            .arg("300")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ctx("host sleeper")?;
        let sleeper = Reap(sleeper);
        let agent_token = format!("namzu-escape-token-{tag}");
        let (agent, agent_port) = plaintext_agent(scratch.path(), &agent_token)?;
        let args = [
            ("--secret", secret.display().to_string()),
            ("--host-path", dir.path().display().to_string()),
            ("--tcp", port.to_string()),
            ("--host-ip", ip.to_string()),
            ("--unix", unix_path.display().to_string()),
            ("--abstract", abstract_name),
            ("--host-pid", sleeper.0.id().to_string()),
            ("--marker", marker),
            ("--etc-canary", canary_name),
            ("--shadow-digest", shadow),
            ("--disk", host_disk()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect();
        Ok(Self {
            dir,
            scratch,
            tcp,
            _wide: wide,
            _unix: unix,
            _abstract: abs,
            _canary: canary,
            sleeper,
            _agent: agent,
            agent_token,
            control_link: format!("127.0.0.1:{agent_port}"),
            args,
        })
    }

    /// The host directory bound read-only at [`RO_TARGET`].
    pub fn ro_host(&self) -> PathBuf {
        self.dir.path().join("ro")
    }

    /// The spec the attempts run in: the read-only bind, and what the
    /// caller adds (a weakened layer, say).
    pub fn spec(&self, mut spec: SandboxSpec) -> SandboxSpec {
        spec.binds.push(Bind {
            source: self.ro_host(),
            target: RO_TARGET.into(),
            writable: false,
        });
        spec
    }

    /// Runs the control on the host, as root, with one descriptor (9)
    /// inherited the way a leak from the agent would be.
    pub fn control(&self) -> Result<String, String> {
        let bin = super::escape_binary()?;
        let mut args = self.args.clone();
        args.extend([
            "--agent-link".into(),
            self.control_link.clone(),
            "--agent-token".into(),
            self.agent_token.clone(),
            "--control".into(),
            "--ro-dir".into(),
            self.ro_host().display().to_string(),
            "--scratch".into(),
            self.scratch.path().display().to_string(),
        ]);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" 9</dev/null")
            .arg(bin)
            .args(args)
            .output()
            .ctx("run the control")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(out.status.success(), "the control failed: {:?}\n{text}", out.status);
        Ok(text)
    }

    /// The arguments for the run inside; `token`: what the agent port
    /// inside takes (else the control's).
    pub fn inside_args(&self, token: Option<String>) -> Vec<String> {
        let mut a = self.args.clone();
        a.extend([
            "--agent-link".into(),
            format!("127.0.0.1:{AGENT_PORT}"),
            "--agent-token".into(),
            token.unwrap_or_else(|| self.agent_token.clone()),
            "--ro-dir".into(),
            RO_TARGET.into(),
            "--scratch".into(),
            "/workspace".into(),
        ]);
        a
    }

    /// What only the host can see: the listener accepted, the marked
    /// process died, the secret changed.
    pub fn host_side(&mut self) -> Result<Vec<String>, String> {
        let mut seen = Vec::new();
        if self.tcp.accept().is_ok() {
            seen.push("reach the host TCP server: the loopback listener accepted a connection".into());
        }
        if self.sleeper.0.try_wait().ctx("sleeper")?.is_some() {
            seen.push("signal a host process: the marked host process died".into());
        }
        let mut s = String::new();
        std::fs::File::open(self.dir.path().join("secret"))
            .and_then(|mut f| f.read_to_string(&mut s))
            .ctx("secret")?;
        if s != "the host's secret" {
            seen.push("alter the host secret: it changed".into());
        }
        for e in std::fs::read_dir(self.ro_host()).ctx("ro dir")?.flatten() {
            if e.file_name() != "file" {
                seen.push(format!("write under the read-only bind: {:?} appeared", e.file_name()));
            }
        }
        Ok(seen)
    }
}

/// Plants the targets, runs the control and the attempts in a sandbox made
/// by `factory` from `spec`, and judges each attempt.
pub async fn run(factory: &Factory, spec: SandboxSpec) -> Result<Report, String> {
    run_on(factory, spec, &TierShape::default()).await
}

/// Plants the targets and runs the control: what every way of running the
/// attempts inside starts with. Returns the targets and the control's
/// output.
pub fn prepare() -> Result<(Targets, String), String> {
    let targets = Targets::plant()?;
    let control_text = targets.control()?;
    // The control reached the loopback listener (that is its job); what it
    // queued is taken now, so that only the sandbox's could remain.
    let mut reached = 0;
    while targets.tcp.accept().is_ok() {
        reached += 1;
    }
    ensure!(reached > 0, "the control never reached the loopback listener");
    Ok((targets, control_text))
}

/// Judges the attempts: the output of the run inside next to the
/// control's, and what the host saw.
pub fn finish(
    targets: &mut Targets,
    control_text: &str,
    inside_text: &str,
    hardening: BTreeMap<String, String>,
) -> Result<Report, String> {
    let host_side = targets.host_side()?;
    let inside = parse(inside_text);
    let control = parse(control_text);
    let outcomes = inside
        .iter()
        .map(|(name, line)| (name.clone(), judge(line, control.get(name))))
        .collect();
    Ok(Report {
        inside,
        control,
        outcomes,
        host_side,
        hardening,
    })
}

/// [`run`] on a tier of this shape.
pub async fn run_on(factory: &Factory, spec: SandboxSpec, shape: &TierShape) -> Result<Report, String> {
    let (mut targets, control_text) = prepare()?;
    let spec = if shape.binds { targets.spec(spec) } else { spec };
    let targets_ref = &targets;
    let link_token = shape.link_token;
    let inside_text = crate::util::with_sandbox(factory, spec, |sb| async move {
        let args = targets_ref.inside_args(link_token.map(|f| f(&sb)));
        super::install(&sb).await?;
        let hardening = sb.agent().info().hardening.clone();
        let out = sb
            .commands()
            .run(ExecRequest::new("./escape").args(args))
            .await
            .ctx("run namzu-escape")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(out.status.success(), "namzu-escape failed: {:?}\n{text}", out.status);
        // The agent outlived every attempt on it.
        let after = sb
            .commands()
            .run(ExecRequest::new("true"))
            .await
            .ctx("agent after the attempts")?;
        ensure!(after.status.success(), "agent down");
        Ok((text, hardening))
    })
    .await?;
    let (inside_text, hardening) = inside_text;
    finish(&mut targets, &control_text, &inside_text, hardening)
}

/// What one tier is expected to show, attempt by attempt. Every attempt not
/// named here must be proven blocked.
#[derive(Default)]
pub struct Expect {
    /// Inconclusive where THIS host lacks the target or the feature (the
    /// control fails): proven or inconclusive-by-control, never escaped.
    pub host_may_lack: &'static [(&'static str, &'static str)],
    /// Proven, but by a kernel invariant rather than anything namzu does
    /// (listed apart; the layer-removal test shows they stay blocked with
    /// every removable layer gone).
    pub invariants: &'static [(&'static str, &'static str)],
    /// Escapes this tier is known to allow, each with why.
    pub known_gaps: &'static [(&'static str, &'static str)],
    /// Inconclusive because this tier's kernel lacks the interface (gVisor's
    /// procfs, say): the attempt fails inside with another errno.
    pub tier_lacks: &'static [(&'static str, &'static str)],
}

/// What the `local` tier's sandboxes (and the simulated pods, which are
/// local sandboxes) block by a kernel invariant rather than anything namzu
/// does: listed apart, not counted.
pub const LOCAL_INVARIANTS: &[(&str, &str)] = &[
    (
        "kill the agent",
        "the kernel drops SIGKILL sent to a pid namespace's init from inside it",
    ),
    (
        "mknod a block device",
        "device nodes need CAP_MKNOD in the initial user namespace",
    ),
    (
        "mknod /dev/mem's twin",
        "device nodes need CAP_MKNOD in the initial user namespace",
    ),
    (
        "read the kernel log (syslog)",
        "the kernel log needs CAP_SYSLOG in the initial user namespace",
    ),
    (
        "read kernel addresses from /proc/kallsyms",
        "real addresses need CAP_SYSLOG in the initial user namespace",
    ),
    (
        "load a bpf program",
        "bpf needs CAP_BPF or CAP_SYS_ADMIN in the initial user namespace",
    ),
];

/// Attempts whose control fails on some hosts, and why.
pub const HOST_MAY_LACK: &[(&str, &str)] = &[
    (
        "read /proc/kcore",
        "kernels built without CONFIG_PROC_KCORE have no /proc/kcore",
    ),
    (
        "write /proc/sysrq-trigger",
        "kernels built without CONFIG_MAGIC_SYSRQ have no sysrq-trigger",
    ),
    (
        "open the host's disk",
        "a host that is itself a container or VM may refuse even its root the disk (device cgroup)",
    ),
    (
        "ptrace through the x32 ABI",
        "kernels built without CONFIG_X86_X32_ABI answer ENOSYS to every x32 call",
    ),
];

/// Asserts the exact set of attempt names and each one's outcome.
pub fn check(report: &Report, expect: &Expect) -> Result<(), String> {
    let names = ATTEMPTS;
    let got: Vec<&str> = report.outcomes.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = names.to_vec();
    want.sort_unstable();
    ensure!(got == want, "attempts ran {got:?}, expected exactly {want:?}");
    ensure!(
        report.control.len() == names.len(),
        "the control ran {} attempts of {}",
        report.control.len(),
        names.len()
    );
    let mut wrong = Vec::new();
    for (name, o) in &report.outcomes {
        let listed = |l: &[(&str, &str)]| l.iter().any(|(n, _)| n == name);
        let ok = match o {
            Outcome::Proven => !listed(expect.known_gaps),
            Outcome::Escaped(_) => listed(expect.known_gaps),
            Outcome::Inconclusive(why) => {
                (listed(expect.host_may_lack) && why.starts_with("the control failed"))
                    || (listed(expect.tier_lacks) && why.starts_with("inside:"))
            }
            Outcome::Uncontrolled(_) => !listed(expect.known_gaps),
        };
        if !ok {
            wrong.push(format!(
                "{name}: {o:?} (inside {:?}, control {:?})",
                report.inside.get(name),
                report.control.get(name)
            ));
        }
    }
    ensure!(wrong.is_empty(), "unexpected outcomes:\n  {}", wrong.join("\n  "));
    ensure!(
        report.host_side.is_empty(),
        "the host saw escapes: {:?}",
        report.host_side
    );
    Ok(())
}

/// Every attempt `namzu-escape` makes, by name: a lost or renamed attempt
/// fails the suite.
pub const ATTEMPTS: &[&str] = &[
    "read a secret planted on the host",
    "list the host directory holding the secret",
    "read a host /etc file the curated copy leaves out",
    "read the host's /etc/shadow",
    "read the host through /proc/self/root/..",
    "read the host through the agent's /proc/PID/root",
    "read /sys",
    "read /proc/kcore",
    "read kernel addresses from /proc/kallsyms",
    "open the host's disk",
    "create a file under /usr",
    "create a file in /",
    "open a system file for writing (/usr/lib/os-release)",
    "append to /etc/passwd",
    "write a 0666 file under a read-only mount",
    "create a file in a 0777 directory under a read-only mount",
    "write /proc/sys/kernel/hostname",
    "write /proc/sys/vm/drop_caches",
    "write /proc/sysrq-trigger",
    "see a host process",
    "signal a host process",
    "ptrace a host process",
    "ptrace the agent",
    "read the agent's environment",
    "open the agent's memory (/proc/PID/mem)",
    "read the agent's memory with process_vm_readv",
    "list the agent's open files",
    "make the agent the OOM victim",
    "kill the agent",
    "mount a tmpfs",
    "mount procfs",
    "remount a read-only mount read-write",
    "unmount the /proc masks",
    "create a user namespace (unshare)",
    "create a mount namespace (unshare)",
    "create a network namespace (unshare)",
    "create a user namespace (clone)",
    "create a user namespace (clone3)",
    "join the agent's mount namespace",
    "chroot",
    "pivot_root",
    "open_tree (new mount API)",
    "fsopen (new mount API)",
    "gain capabilities through a setuid binary",
    "raise capabilities with capset",
    "set the hostname",
    "clear no_new_privs",
    "load a bpf program",
    "open a perf counter",
    "keyctl",
    "add_key",
    "userfaultfd",
    "create an AF_VSOCK socket",
    "ptrace through the x32 ABI",
    "io_uring_setup",
    "read the kernel log (syslog)",
    "mknod a block device",
    "mknod /dev/mem's twin",
    "load a kernel module (init_module)",
    "load a kernel module (finit_module)",
    "kexec_load",
    "reboot",
    "set the clock",
    "swapon",
    "reach a TCP server on the host's loopback",
    "reach a TCP server on the host's own address",
    "reach a host unix socket not bound in",
    "reach a host abstract unix socket",
    "act as the host on the agent's link",
    "open a raw packet socket",
    "find a mount without nosuid or nodev",
    "see a host mount",
    "use file descriptors inherited from the agent",
];

/// Prints the summary, then every attempt that is not plainly proven, with
/// both runs' lines (CI's log is where a reader checks the claim).
pub fn print(report: &Report, tier: &str, expect: &Expect) {
    println!("{}", report.summary(tier, expect));
    for (name, o) in &report.outcomes {
        if *o != Outcome::Proven || expect.invariants.iter().any(|(n, _)| n == name) {
            println!(
                "  {name}: {o:?}; inside {:?}; control {:?}",
                report.inside.get(name).map(|l| format!("{} {}", l.verdict, l.detail)),
                report.control.get(name).map(|l| format!("{} {}", l.verdict, l.detail)),
            );
        }
    }
    for h in &report.host_side {
        println!("  host saw: {h}");
    }
}
