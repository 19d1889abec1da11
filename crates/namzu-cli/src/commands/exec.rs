//! `run`, `create` and `exec`: making sandboxes and running commands in
//! them, streamed, with Ctrl-C cancelling.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use namzu::{CancellationToken, ExecEvent, ExecRequest, Provider, Sandbox, Tier};
use tokio::io::AsyncWriteExt;

use crate::args::{ExecArgs, KubeArgs, ResourceArgs};
use crate::fail::{Fail, EXIT_NAMZU};
use crate::providers::{create_provider, provider_of, warn_host};
use crate::ui::exit_code;

/// Runs one command, streaming its output; Ctrl-C cancels it (and
/// everything it started). Returns the command's exit code.
pub async fn run_command(sb: &Sandbox, a: ExecArgs, name: Option<String>) -> Result<ExitCode, Fail> {
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
pub async fn print_events(mut stream: namzu::ExecStream) -> Result<Option<ExitCode>, Fail> {
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
                code = Some(exit_code(&x.status));
            }
        }
    }
    Ok(code)
}

pub async fn run(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    resources: ResourceArgs,
    kube: KubeArgs,
    exec: ExecArgs,
) -> Result<ExitCode, Fail> {
    let p = tier_provider(state_dir, tier, &resources, &kube).await?;
    warn_host(tier);
    let sb = p.create(resources.spec(Vec::new())?).await?;
    let result = run_command(&sb, exec, None).await;
    namzu::timeline::mark("cli.command-done");
    let destroyed = sb.destroy().await;
    let code = result?;
    destroyed?;
    Ok(code)
}

pub async fn create(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    env: Vec<(String, String)>,
    resources: ResourceArgs,
    kube: KubeArgs,
) -> Result<ExitCode, Fail> {
    let p = tier_provider(state_dir, tier, &resources, &kube).await?;
    warn_host(tier);
    let sb = p.create(resources.spec(env)?).await?;
    if tier == Tier::Kubernetes {
        // Found again by id from here on; the claim outlives this process
        // for its TTL, renewed while any process holds it.
        if let Err(e) = crate::kube::record(state_dir, sb.id(), &kube) {
            let _ = sb.destroy().await;
            return Err(e);
        }
    }
    println!("{}", sb.id());
    Ok(ExitCode::SUCCESS)
}

/// The provider `run` and `create` make with: the kubernetes flags for that
/// tier, refused by name on any other.
async fn tier_provider(
    state_dir: &Option<PathBuf>,
    tier: Tier,
    resources: &ResourceArgs,
    kube: &KubeArgs,
) -> Result<Box<dyn Provider>, Fail> {
    match tier {
        // The pod's runtime is the cluster's (its RuntimeClass), not a flag.
        Tier::Kubernetes if resources.runtime.is_some() => {
            Err(Fail("--runtime applies to --tier docker, not kubernetes".into()))
        }
        Tier::Kubernetes if resources.kernel.is_some() || resources.accel.is_some() => {
            Err(Fail("--kernel and --accel apply to --tier microvm, not kubernetes".into()))
        }
        Tier::Kubernetes => kube.provider(state_dir).await,
        _ if !kube.is_empty() => Err(Fail(format!(
            "--kube-namespace, --warm-pool, --template, --kube-address, --claim-label and --ready-timeout apply to --tier kubernetes, not {tier}"
        ))),
        _ => {
            if let (Tier::Local | Tier::MicroVm, Some(image)) = (tier, &resources.image) {
                super::image::ensure(state_dir, image).await?;
            }
            create_provider(state_dir, tier, resources).await
        }
    }
}

pub async fn exec(
    state_dir: &Option<PathBuf>,
    id: String,
    detach: bool,
    session: Option<String>,
    exec: ExecArgs,
) -> Result<ExitCode, Fail> {
    let (tier, p) = provider_of(state_dir, &id).await?;
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
