//! The pause of a whole microVM (QMP `stop` / `cont` by its anchor), on
//! real qemu guests (TCG here), beyond the conformance suite's case
//! (nothing served while paused, the guest's clock standing still): a
//! stream open across a pause longer than every silence bound of the link
//! goes on after it, while silence outside a pause is still a dead agent;
//! a paused VM refuses a connect and a snapshot by name, and a suspend
//! continues it first.

#[path = "support/microvm.rs"]
mod microvm;

use std::time::Duration;

use futures::StreamExt;

use namzu::backend::microvm::{MicroVmOptions, MicroVmProvider};
use namzu::{Error, ExecEvent, ExecRequest, Provider, Resources, SandboxSpec};

type R = Result<(), Box<dyn std::error::Error>>;

/// The link's keepalive here: a ping a second, so a dead agent is found
/// within three.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// The agent's heartbeat here: a stream silent for three (3 s) is lost.
const HEARTBEAT_MS: u64 = 1000;
/// Longer than both bounds together.
const PAUSE: Duration = Duration::from_secs(8);

fn provider() -> Result<MicroVmProvider, String> {
    Ok(microvm::provider("pause")?.options(MicroVmOptions {
        default_image: Some(microvm::IMAGE.into()),
        link_keepalive: KEEPALIVE,
        ..Default::default()
    }))
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        resources: Resources {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        },
        limits: vec![(namzu_proto::limits::HEARTBEAT_INTERVAL_MS.into(), HEARTBEAT_MS)],
        ..Default::default()
    }
}

/// Runs `body` with the provider, a fresh VM and its id; the VM is
/// destroyed whatever the body returned.
async fn on_vm<F, Fut>(body: F) -> R
where
    F: FnOnce(MicroVmProvider, namzu::Sandbox, String) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    let p = provider()?;
    let sb = p.create(spec()).await?;
    let id = sb.id().to_owned();
    let result = body(p.clone(), sb, id.clone()).await;
    let _ = p.destroy(&id).await;
    result
}

/// Prints 1 to 30, a line every 0.1 s.
const COUNT: &str = "i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo $i; sleep 0.1; done";

/// The stream's stdout up to its exit, and the exit code.
async fn rest(
    s: &mut namzu::ExecStream,
    mut out: Vec<u8>,
) -> Result<(Vec<u8>, Option<i32>), Box<dyn std::error::Error>> {
    while let Some(ev) = s.next().await {
        match ev? {
            ExecEvent::Stdout { data, .. } => out.extend_from_slice(&data),
            ExecEvent::Stderr { .. } => {}
            ExecEvent::Exit(x) => return Ok((out, x.status.code)),
        }
    }
    Err("the stream ended without an exit".into())
}

/// A command streaming across a pause eight times the link's keepalive and
/// over twice its silence bound loses nothing and ends well; while paused
/// nothing arrives, and a connect, a command and a snapshot are refused
/// with `SandboxPaused`.
async fn a_stream_open_across_a_pause_goes_on_after_it() -> R {
    on_vm(|p, sb, id| async move {
        let mut s = sb.commands().stream(ExecRequest::shell(COUNT)).await?;
        let mut out = Vec::new();
        while !out.contains(&b'\n') {
            match s.next().await.ok_or("the stream ended at once")?? {
                ExecEvent::Stdout { data, .. } => out.extend_from_slice(&data),
                other => return Err(format!("before the pause: {other:?}").into()),
            }
        }
        sb.pause().await?;
        let quiet = tokio::time::timeout(PAUSE, s.next()).await;
        assert!(quiet.is_err(), "the paused VM's stream said {:?}", quiet.ok());
        match p.connect(&id).await {
            Err(Error::SandboxPaused { op }) => assert_eq!(op, "connect"),
            other => panic!("a connect to a paused VM: {:?}", other.map(|s| s.id().to_owned())),
        }
        match sb.commands().run("true").await {
            Err(Error::SandboxPaused { op }) => assert_eq!(op, "exec"),
            other => panic!("a command in a paused VM: {other:?}"),
        }
        match p.snapshot(&id).await {
            Err(Error::SandboxPaused { op }) => assert_eq!(op, "snapshot"),
            other => panic!("a snapshot of a paused VM: {other:?}"),
        }
        let resumed = sb.resume().await?;
        assert!(resumed.paused_for >= PAUSE, "{resumed:?}");
        let (out, code) = rest(&mut s, out).await?;
        let want: String = (1..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!(String::from_utf8_lossy(&out), want);
        assert_eq!(code, Some(0));
        // Told the host's time on `cont`: not six seconds behind.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64();
        let guest: f64 = String::from_utf8_lossy(&sb.commands().run("date +%s.%N").await?.stdout)
            .trim()
            .parse()?;
        assert!((guest - now).abs() < 2.0, "guest clock {guest}, host {now}");
        R::Ok(())
    })
    .await
}

/// The VMM of sandbox `id`, by its command line.
fn vmm_pid(id: &str) -> Option<nix::unistd::Pid> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        let vmm = cmd.starts_with("qemu-system") || cmd.contains("/qemu-system");
        (vmm && cmd.contains(id)).then(|| nix::unistd::Pid::from_raw(pid))
    })
}

/// The same silence outside a pause (the VMM stopped behind namzu's back)
/// is a dead agent's: the stream is lost within its silence bound.
async fn silence_outside_a_pause_is_still_a_dead_agent() -> R {
    use nix::sys::signal::{kill, Signal};
    on_vm(|_, sb, id| async move {
        let vmm = vmm_pid(&id).ok_or("no VMM process found")?;
        let mut s = sb.commands().stream(ExecRequest::shell("sleep 60")).await?;
        kill(vmm, Signal::SIGSTOP)?;
        let ended = tokio::time::timeout(Duration::from_secs(20), s.next()).await;
        let _ = kill(vmm, Signal::SIGCONT);
        match ended {
            Ok(Some(Err(Error::LinkLost { .. }))) => {}
            other => panic!("a stream of a VMM stopped without a pause: {other:?}"),
        }
        assert!(!sb.is_paused().await?, "a stop behind namzu's back reads as a pause");
        R::Ok(())
    })
    .await
}

/// A suspend of a paused VM continues it first (its disk is flushed from
/// inside), then keeps its memory: a process started before the pause
/// runs on after the resume.
async fn a_paused_vm_suspends_and_resumes_running() -> R {
    on_vm(|p, sb, id| async move {
        let pid = sb
            .commands()
            .run("sleep 600 >/dev/null 2>&1 </dev/null & echo $!")
            .await?
            .stdout;
        let pid = String::from_utf8_lossy(&pid).trim().to_owned();
        sb.pause().await?;
        p.suspend(&id).await?;
        assert!(!p.state_root().join(&id).join("paused").exists());
        let back = p.resume(&id).await?;
        assert!(!back.is_paused().await?);
        let alive = back.commands().run(format!("kill -0 {pid}").as_str()).await?;
        assert!(alive.status.success(), "the process of before the pause is gone");
        R::Ok(())
    })
    .await
}

/// A VM whose anchor was killed while it was paused is dead, not paused:
/// the file the anchor left behind does not outlive it.
async fn a_pause_outlives_no_anchor() -> R {
    use nix::sys::signal::{kill, Signal};
    on_vm(|p, sb, id| async move {
        sb.pause().await?;
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(p.state_root().join(&id).join("meta.json"))?)?;
        let anchor = meta["pid"].as_i64().ok_or("no anchor pid")? as i32;
        kill(nix::unistd::Pid::from_raw(anchor), Signal::SIGKILL)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{anchor}")).exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!sb.is_paused().await?, "a dead VM reads as paused");
        match p.connect(&id).await {
            Err(Error::SandboxDead { .. }) => {}
            other => panic!(
                "a connect to a VM whose anchor died paused: {:?}",
                other.map(|s| s.id().to_owned())
            ),
        }
        R::Ok(())
    })
    .await
}

fn main() -> std::process::ExitCode {
    let tests: Vec<(&str, microvm::Body)> = vec![
        ("a_stream_open_across_a_pause_goes_on_after_it", || {
            Box::pin(a_stream_open_across_a_pause_goes_on_after_it())
        }),
        ("silence_outside_a_pause_is_still_a_dead_agent", || {
            Box::pin(silence_outside_a_pause_is_still_a_dead_agent())
        }),
        ("a_paused_vm_suspends_and_resumes_running", || {
            Box::pin(a_paused_vm_suspends_and_resumes_running())
        }),
        ("a_pause_outlives_no_anchor", || Box::pin(a_pause_outlives_no_anchor())),
    ];
    let code = microvm::run_trials(tests, Some(1));
    microvm::cleanup("pause");
    code
}
