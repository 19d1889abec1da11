//! [`Sandbox`]: the handle a caller holds for one live sandbox, whatever its
//! tier.
//!
//! Operations are grouped by noun, the way E2B's SDK and kube-rs's `Api<K>`
//! read: [`Sandbox::commands`], [`Sandbox::files`], [`Sandbox::sessions`],
//! [`Sandbox::terminals`] and [`Sandbox::network`]; quiesce, flush and
//! destroy sit on the handle itself. Every group but the network's talks to
//! the sandbox's agent over its link, so a tier implements only the small
//! [`SandboxBackend`] trait (identity, link, destroy, egress policy) and
//! never the operations.
//!
//! The handle is cheap to clone; clones share one link. After
//! [`Sandbox::destroy`] every operation fails with
//! [`Error::SandboxDestroyed`](crate::Error::SandboxDestroyed).
//!
//! ```no_run
//! # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
//! let out = sb.commands().run("echo hello").await?;
//! assert_eq!(&out.stdout[..], b"hello\n");
//! sb.files().write("notes.txt", "draft").await?;
//! assert_eq!(&sb.files().read("notes.txt").await?[..], b"draft");
//! sb.destroy().await?;
//! # Ok(()) }
//! ```

mod backend;
mod commands;
mod files;
mod network;
mod sessions;
mod terminals;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

pub use backend::SandboxBackend;
pub use commands::Commands;
pub use files::Files;
pub use network::Network;
pub use sessions::{Sessions, DEFAULT_SESSION_READ_BYTES};
pub use terminals::Terminals;

use crate::client::AgentClient;
use crate::error::Result;
use crate::spec::Tier;
use crate::types::QuiesceReport;

/// A live sandbox. Made by a [`Provider`](crate::Provider)'s `create` or
/// `connect`; see the [module docs](self) for the groups of operations.
#[derive(Clone)]
pub struct Sandbox {
    backend: Arc<dyn SandboxBackend>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id())
            .field("tier", &self.tier())
            .finish()
    }
}

impl Sandbox {
    /// Wraps a tier's backend in the shared handle.
    pub fn new(backend: impl SandboxBackend + 'static) -> Self {
        Self {
            backend: Arc::new(backend),
        }
    }

    /// The sandbox's id, unique within its tier.
    pub fn id(&self) -> &str {
        self.backend.id()
    }

    /// The tier it lives in.
    pub fn tier(&self) -> Tier {
        self.backend.tier()
    }

    /// The raw link to the agent, for what the groups do not cover
    /// (health, agent limits, features).
    pub fn agent(&self) -> &AgentClient {
        self.backend.agent()
    }

    /// The tier's own backend, for tier-specific details
    /// (e.g. the Kubernetes objects a sandbox is bound to).
    pub fn backend<B: SandboxBackend>(&self) -> Option<&B> {
        let any: &dyn Any = &*self.backend;
        any.downcast_ref::<B>()
    }

    /// Running commands: foreground, streamed, detachable and reattached.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// use namzu_core::ExecRequest;
    /// let out = sb.commands().run(ExecRequest::new("uname").arg("-r")).await?;
    /// println!("{}", String::from_utf8_lossy(&out.stdout));
    /// # Ok(()) }
    /// ```
    pub fn commands(&self) -> Commands<'_> {
        Commands::new(self.agent())
    }

    /// Files inside the sandbox, confined to its roots.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// sb.files().mkdir_all("/workspace/out").await?;
    /// sb.files().write("/workspace/out/a.txt", "hello").await?;
    /// for f in sb.files().list("/workspace/out").await? {
    ///     println!("{} {}", f.path.display(), f.size);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn files(&self) -> Files<'_> {
        Files::new(self.agent())
    }

    /// Named background commands whose output is kept by offset.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// use namzu_core::SessionSpec;
    /// sb.sessions().start(SessionSpec::new("server", "python3").arg("-m").arg("http.server")).await?;
    /// let chunk = sb.sessions().read("server", 0).await?;
    /// println!("{}", String::from_utf8_lossy(&chunk.data));
    /// # Ok(()) }
    /// ```
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions::new(self.agent())
    }

    /// Terminals (ptys), one-off or persistent.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// use namzu_core::TerminalOptions;
    /// let mut term = sb.terminals().open(TerminalOptions::default().size(120, 40)).await?;
    /// term.write("exit 3\n").await?;
    /// assert_eq!(term.close().await?.code, Some(3));
    /// # Ok(()) }
    /// ```
    pub fn terminals(&self) -> Terminals<'_> {
        Terminals::new(self.agent())
    }

    /// What may leave the sandbox, and TCP connections into it.
    ///
    /// ```no_run
    /// # async fn demo(sb: namzu_core::Sandbox) -> namzu_core::Result<()> {
    /// use namzu_core::egress::EgressPolicy;
    /// sb.network().set_policy(EgressPolicy::allow_hosts(["pypi.org"])?).await?;
    /// # Ok(()) }
    /// ```
    pub fn network(&self) -> Network<'_> {
        Network::new(&*self.backend)
    }

    /// Stops every process in the sandbox but the agent: SIGTERM, then
    /// SIGKILL after `grace`, until a pass finds nothing left.
    pub async fn quiesce(&self, grace: Duration) -> Result<QuiesceReport> {
        self.agent().quiesce(grace).await
    }

    /// Pauses the sandbox: every process in it but the agent stopped, in
    /// place, until [`Self::resume`]. Meanwhile nothing starts in it
    /// (commands, terminals, sessions and TCP connections are refused with
    /// [`Error::SandboxPaused`](crate::Error::SandboxPaused)); files, reads
    /// of running commands' output, cancels and kills go on, and a
    /// command's timeout does not run. Pausing a paused sandbox is done.
    ///
    /// A tier may pause more than the processes: a microVM's whole machine
    /// stops (its vCPUs; its memory stays). Then every operation is
    /// refused with `SandboxPaused` until the resume, streams already open
    /// wait (their silence meanwhile is not a dead agent's), and the
    /// guest's clock is set to the host's when it continues.
    pub async fn pause(&self) -> Result<crate::types::PauseReport> {
        self.backend.pause().await
    }

    /// Resumes a paused sandbox: what the pause stopped runs on where it
    /// was. Resuming a running sandbox is done.
    pub async fn resume(&self) -> Result<crate::types::ResumeReport> {
        self.backend.resume().await
    }

    /// Whether the sandbox is paused.
    pub async fn is_paused(&self) -> Result<bool> {
        self.backend.is_paused().await
    }

    /// Makes the workspace durable (sync to disk); returns how long it took.
    pub async fn flush(&self, timeout: Duration) -> Result<Duration> {
        self.agent().flush(timeout).await
    }

    /// Whether the sandbox is still there, by the tier's cheap check (its
    /// processes) where it has one; `None`: ask its agent instead.
    pub fn alive(&self) -> Option<bool> {
        self.backend.alive()
    }

    /// Tears the sandbox down: every process in it is killed and its state
    /// removed. Idempotent.
    pub async fn destroy(&self) -> Result<()> {
        self.backend.destroy().await
    }

    /// Suspends the sandbox to disk: its processes end, what it wrote is
    /// kept under its id, and [`Provider::resume`](crate::Provider::resume)
    /// starts it again, from this process or any later one. The handle is
    /// spent. Refused by name on a tier that cannot.
    pub async fn suspend(self) -> Result<()> {
        self.backend.suspend().await
    }
}
