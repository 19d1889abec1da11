//! The conformance suite every namzu backend must pass.
//!
//! Cases are backend-agnostic: each gets fresh sandboxes from a factory and
//! checks behaviour only through the [`Sandbox`] API. A backend is tested by
//! one line in a test target with `harness = false`:
//!
//! ```text
//! namzu_conformance::conformance_main!("host", |spec| async move {
//!     provider().create(spec).await
//! });
//! ```
//!
//! which expands to a `main` that runs one test per case (libtest output,
//! filters and `--ignored` work as usual). A case whose agent features the
//! backend does not advertise is reported **ignored**, with the missing
//! feature named in its kind — never a silent pass.

mod cases;
pub mod docker;
pub mod egress;
pub mod escape;
pub mod netlab;
pub mod util;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use namzu::{Result, Sandbox, SandboxSpec};

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Makes a fresh sandbox for a case, with the spec the case asks for.
pub type Factory = Arc<dyn Fn(SandboxSpec) -> BoxFut<Result<Sandbox>> + Send + Sync>;

/// What a case returns: `Err` with a description of the first broken promise.
pub type Outcome = std::result::Result<(), String>;

/// One conformance case.
pub struct Case {
    pub name: &'static str,
    /// Agent features the case exercises.
    pub needs: &'static [&'static str],
    pub run: fn(Factory) -> BoxFut<Outcome>,
}

/// Starts a suspended sandbox again by its id: a tier's
/// [`Provider::resume`](namzu::Provider::resume).
pub type Resumer = Arc<dyn Fn(String) -> BoxFut<Result<Sandbox>> + Send + Sync>;

/// What a tier offers beyond its agent's features, for the cases that
/// need the tier itself: suspend and resume, a disk limit. A case that
/// needs one the tier does not offer is reported ignored, named.
#[derive(Clone, Default)]
pub struct TierHooks {
    /// Resumes a suspended sandbox; `None`: the tier cannot suspend.
    pub resume: Option<Resumer>,
    /// The tier honours `resources.disk_bytes`.
    pub disk_limit: bool,
    /// A suspend keeps the sandbox's memory too: its processes go on
    /// after the resume, where they stopped (microvm).
    pub suspend_keeps_memory: bool,
    /// The tier's provider where it keeps snapshots: the cases call its
    /// `snapshot`, `fork` and `delete_snapshot`.
    pub snapshots: Option<Arc<dyn namzu::Provider>>,
    /// A pause stops the whole machine (a VM's vCPUs), not the processes
    /// through the agent: while paused every operation is refused, and a
    /// pause reports no processes.
    pub pause_stops_machine: bool,
}

/// The pseudo-feature of cases that suspend and resume ([`TierHooks::resume`]).
pub const SUSPEND: &str = "tier:suspend";
/// The pseudo-feature of cases that set a disk limit ([`TierHooks::disk_limit`]).
pub const DISK_LIMIT: &str = "tier:disk-limit";
/// The pseudo-feature of cases whose suspend keeps memory
/// ([`TierHooks::suspend_keeps_memory`]).
pub const SUSPEND_MEMORY: &str = "tier:suspend-memory";
/// The pseudo-feature of cases that snapshot and fork
/// ([`TierHooks::snapshots`]).
pub const SNAPSHOT: &str = "tier:snapshot";

static HOOKS: std::sync::OnceLock<TierHooks> = std::sync::OnceLock::new();

/// The hooks the running suite was given (none: the default).
pub fn hooks() -> TierHooks {
    HOOKS.get().cloned().unwrap_or_default()
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    cases::all()
}

/// Runs the suite under libtest conventions and returns the process exit
/// code. A probe sandbox is created first to read the features the backend
/// advertises.
pub fn run_main(backend: &str, factory: Factory) -> std::process::ExitCode {
    run_main_except(backend, factory, &[])
}

/// [`run_main`], with cases this backend cannot meet reported ignored,
/// each with its reason: `(case name, reason)`.
pub fn run_main_except(backend: &str, factory: Factory, cannot: &[(&str, &str)]) -> std::process::ExitCode {
    run_main_with(backend, factory, cannot, TierHooks::default())
}

/// [`run_main_except`], with what the tier offers beyond its agent.
pub fn run_main_with(
    backend: &str,
    factory: Factory,
    cannot: &[(&str, &str)],
    tier: TierHooks,
) -> std::process::ExitCode {
    let offered: Vec<String> = [
        (tier.resume.is_some(), SUSPEND),
        (tier.disk_limit, DISK_LIMIT),
        (tier.resume.is_some() && tier.suspend_keeps_memory, SUSPEND_MEMORY),
        (tier.snapshots.is_some(), SNAPSHOT),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| name.to_owned())
    .collect();
    let _ = HOOKS.set(tier);
    let args = libtest_mimic::Arguments::from_args();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conformance[{backend}]: cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let features = rt.block_on(async {
        let sb = (factory)(SandboxSpec::default()).await?;
        let f = sb.agent().info().features.clone();
        sb.destroy().await?;
        Ok::<_, namzu::Error>(f)
    });
    drop(rt);
    let features = match features {
        Ok(f) => f,
        Err(e) => {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("conformance[{backend}]: cannot create a probe sandbox: {why}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let advertised = {
        let backend = backend.to_owned();
        let mut got = features.clone();
        got.sort();
        libtest_mimic::Trial::test(format!("{backend}::advertises_exactly_its_features"), move || {
            let mut want: Vec<String> = expected_features(&backend)
                .ok_or_else(|| format!("no feature list for backend {backend}"))?
                .iter()
                .map(|f| (*f).to_owned())
                .collect();
            want.sort();
            if got == want {
                Ok(())
            } else {
                Err(format!("advertises {got:?}, expected {want:?}").into())
            }
        })
    };
    let trials = std::iter::once(advertised)
        .chain(cases().into_iter().map(|case| {
            let missing: Vec<&str> = case
                .needs
                .iter()
                .copied()
                .filter(|f| !features.iter().chain(&offered).any(|g| g == f))
                .collect();
            let factory = factory.clone();
            let run = case.run;
            let trial = libtest_mimic::Trial::test(format!("{backend}::{}", case.name), move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| libtest_mimic::Failed::from(format!("runtime: {e}")))?;
                rt.block_on(run(factory)).map_err(libtest_mimic::Failed::from)
            });
            if let Some((_, why)) = cannot.iter().find(|(name, _)| *name == case.name) {
                trial.with_ignored_flag(true).with_kind(format!("cannot: {why}"))
            } else if missing.is_empty() {
                trial
            } else {
                trial
                    .with_ignored_flag(true)
                    .with_kind(format!("unsupported: {}", missing.join(",")))
            }
        }))
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// The agent features each backend must advertise, exactly: a feature
/// lost (or gained) fails the suite instead of turning cases into
/// "ignored".
pub fn expected_features(backend: &str) -> Option<Vec<&'static str>> {
    use namzu::features::{ALL, EGRESS, EGRESS_HANDOFF, EGRESS_STREAM, EXEC_SIDE, FILES_READ_SIDE, FILES_WRITE_SIDE};
    let with_egress = || {
        ALL.iter()
            .copied()
            .chain([EGRESS, EGRESS_STREAM, EGRESS_HANDOFF])
            .collect()
    };
    // An agent whose link is not a unix socket (a VM's port) does not
    // offer side reads or writes.
    let not_unix = || {
        ALL.iter()
            .copied()
            .filter(|f| *f != FILES_READ_SIDE && *f != FILES_WRITE_SIDE && *f != EXEC_SIDE)
            .chain([EGRESS, EGRESS_STREAM, EGRESS_HANDOFF])
            .collect()
    };
    match backend {
        "local" | "docker-runc" | "docker-runsc" | "kubernetes-sim" | "kubernetes-workspace-sim" => Some(with_egress()),
        "microvm" => Some(not_unix()),
        "host" => Some(ALL.to_vec()),
        _ => None,
    }
}

/// Lists every case as ignored with `reason` (a backend that is not
/// available here), under libtest conventions.
pub fn ignore_all(backend: &str, reason: &str) -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let kind = format!("unavailable: {reason}");
    let trials = cases()
        .into_iter()
        .map(|case| {
            libtest_mimic::Trial::test(format!("{backend}::{}", case.name), || Ok(()))
                .with_ignored_flag(true)
                .with_kind(kind.clone())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Expands to a `main` running the whole suite against a provider factory
/// `|spec: SandboxSpec| async { ... -> namzu::Result<Sandbox> }`; with
/// `resume = |id: String| async { ... }` and `disk_limit = true`, the
/// tier's [`TierHooks`] too.
#[macro_export]
macro_rules! conformance_main {
    ($backend:expr, $factory:expr) => {
        fn main() -> ::std::process::ExitCode {
            let f = $factory;
            let factory: $crate::Factory = ::std::sync::Arc::new(move |spec| Box::pin(f(spec)));
            $crate::run_main($backend, factory)
        }
    };
    ($backend:expr, $factory:expr, resume = $resume:expr, disk_limit = $disk:expr) => {
        fn main() -> ::std::process::ExitCode {
            let f = $factory;
            let factory: $crate::Factory = ::std::sync::Arc::new(move |spec| Box::pin(f(spec)));
            let r = $resume;
            let resume: $crate::Resumer = ::std::sync::Arc::new(move |id| Box::pin(r(id)));
            let hooks = $crate::TierHooks {
                resume: Some(resume),
                disk_limit: $disk,
                suspend_keeps_memory: false,
                pause_stops_machine: false,
                snapshots: None,
            };
            $crate::run_main_with($backend, factory, &[], hooks)
        }
    };
}
