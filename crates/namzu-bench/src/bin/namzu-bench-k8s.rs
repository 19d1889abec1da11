//! The `kubernetes` tier against the control-plane SIMULATOR, whose pods
//! are real `local` sandboxes on a simulated pod network. Figures are
//! reported, never asserted.
//!
//! * Acquire from a warm pool with a simulated API latency on every
//!   request: namzu's whole acquire (claim, readiness poll, Sandbox and pod
//!   reads, dial, preface, privilege probe) next to a hand-written client
//!   doing the same requests and the same dial; for each, the time spent
//!   waiting on the API and what is left — the host's own cost.
//! * N concurrent acquires from a pool of N: wall time, per-acquire
//!   percentiles, and a cross-talk check (each sandbox sees only its own
//!   marker, every pod is different).
//! * Persistent workspaces: create, suspend and resume with data on the
//!   disk, next to what a user does without them (a task Sandbox from the
//!   template and the data uploaded again).

use std::time::{Duration, Instant};

use namzu::backend::kubernetes::api::{Api, Resource};
use namzu::backend::kubernetes::crd::{Sandbox as SandboxKind, SandboxClaim};
use namzu::backend::kubernetes::{acquire, build, KubernetesProvider};
use namzu::{AgentClient, ClientOptions, ExecRequest, SandboxSpec};
use namzu_k8s_sim::cluster::{Cluster, NAMESPACE};
use namzu_k8s_sim::Stall;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same acquire, written by hand: POST the claim, GET it until bound
/// and Ready, GET the Sandbox, GET the pod, dial and say hello.
async fn by_hand(
    api: &Api,
    opts: &namzu::backend::kubernetes::KubernetesOptions,
    n: usize,
) -> Res<(Duration, Duration)> {
    let id = format!("sb-{n:012x}");
    let name = acquire::object_name(&id);
    let claims = Resource::of::<SandboxClaim>(NAMESPACE);
    let before = api.time_in_calls();
    let t = Instant::now();
    let claim = build::claim(opts, &name, &id, std::time::SystemTime::now());
    api.create(&claims, &serde_json::to_value(claim)?).await?;
    let sandbox = loop {
        let c = api.get(&claims, &name).await?;
        let ready = c["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if let (true, Some(s)) = (ready, c["status"]["sandbox"]["name"].as_str()) {
            break s.to_owned();
        }
        tokio::time::sleep(opts.poll_interval).await;
    };
    let _ = api.get(&Resource::of::<SandboxKind>(NAMESPACE), &sandbox).await?;
    let pod = api.get(&Resource::core("pods", NAMESPACE), &sandbox).await?;
    let ip: std::net::IpAddr = pod["status"]["podIP"].as_str().unwrap_or_default().parse()?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    // The link is mutual TLS, by hand as by namzu.
    let addr = std::net::SocketAddr::new(ip, opts.agent_port);
    let tls = opts
        .link_tls
        .as_ref()
        .map(namzu::backend::kubernetes::link::LinkTls::client_config)
        .ok_or("no link credentials")?;
    let link = AgentClient::connect(
        &id,
        &addr.to_string(),
        uid.into_bytes(),
        ClientOptions::default(),
        move || {
            let tls = tls.clone();
            async move { namzu_proto::link_tls::connect(tls, tokio::net::TcpStream::connect(addr).await?).await }
        },
    )
    .await?;
    let total = t.elapsed();
    drop(link);
    api.delete(&claims, &name).await?;
    Ok((total, api.time_in_calls() - before))
}

async fn acquire_cost(c: &Cluster, iters: usize, latency: Duration) -> Res<()> {
    let mut opts = c.options(true);
    opts.address_mode = namzu::backend::kubernetes::AddressMode::PodIp;
    let p = KubernetesProvider::new(c.client(), opts.clone())?;
    let api = Api::new(c.client(), opts.api_request_timeout)?;
    c.sim.stall(Stall {
        method: None,
        target: String::new(),
        delay: latency,
        times: usize::MAX,
    });
    let (mut nz, mut nz_api, mut nz_host, mut hand, mut hand_api, mut hand_host) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut requests = 0;
    for i in 0..iters {
        if !c.pool_ready(2, Duration::from_secs(60)).await {
            return Err("the pool did not refill".into());
        }
        let before = (p.api().time_in_calls(), p.api().calls().len());
        let t = Instant::now();
        let sb = p.create_task(SandboxSpec::default()).await?;
        let total = t.elapsed();
        let waited = p.api().time_in_calls() - before.0;
        requests = p.api().calls().len() - before.1;
        nz.push(total);
        nz_api.push(waited);
        nz_host.push(total.saturating_sub(waited));
        sb.destroy().await?;
        if !c.pool_ready(2, Duration::from_secs(60)).await {
            return Err("the pool did not refill".into());
        }
        let (total, waited) = by_hand(&api, &opts, i).await?;
        hand.push(total);
        hand_api.push(waited);
        hand_host.push(total.saturating_sub(waited));
    }
    let (a, b, h) = (pct(&mut nz, 0.5), pct(&mut nz_api, 0.5), pct(&mut nz_host, 0.5));
    let (x, y, z) = (pct(&mut hand, 0.5), pct(&mut hand_api, 0.5), pct(&mut hand_host, 0.5));
    println!(
        "acquire from a warm pool, {} simulated API latency per request, {iters} runs (p50):",
        ms(latency)
    );
    println!(
        "  {:<34} {:>10} {:>12} {:>14}",
        "", "total", "in API calls", "host-side*"
    );
    println!(
        "  {:<34} {:>10} {:>12} {:>14}",
        "namzu (claim … probe)",
        ms(a),
        ms(b),
        ms(h)
    );
    println!(
        "  {:<34} {:>10} {:>12} {:>14}",
        "hand-written (same requests, dial)",
        ms(x),
        ms(y),
        ms(z)
    );
    println!(
        "  ratio namzu/hand: total {:.2}x, host-side {:.2}x; namzu issued {requests} requests\n  * total minus time in API calls: the poll interval's waits (the same for both), dial, preface, health, and for namzu the privilege probe",
        a.as_secs_f64() / x.as_secs_f64(),
        h.as_secs_f64() / z.as_secs_f64().max(1e-9)
    );
    Ok(())
}

async fn concurrent(n: usize) -> Res<()> {
    let c = Cluster::start(Some(n as i64)).await?;
    let t = Instant::now();
    if !c.pool_ready(n as i64, Duration::from_secs(300)).await {
        return Err(format!("a pool of {n} did not become ready").into());
    }
    let warm = t.elapsed();
    let mut opts = c.options(true);
    opts.address_mode = namzu::backend::kubernetes::AddressMode::PodIp;
    opts.ready_timeout = Duration::from_secs(120);
    let p = KubernetesProvider::new(c.client(), opts)?;
    let t = Instant::now();
    let runs = (0..n).map(|i| {
        let p = p.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let sb = p.create_task(SandboxSpec::default()).await?;
            let took = t.elapsed();
            let marker = format!("marker-{i}");
            sb.files().write(std::path::Path::new("marker"), marker.clone()).await?;
            let out = sb
                .commands()
                .run(ExecRequest::shell("cat /workspace/marker; echo; ls /workspace | wc -l"))
                .await?;
            let seen = String::from_utf8_lossy(&out.stdout).into_owned();
            let clean = seen == format!("{marker}\n1\n");
            if !clean {
                eprintln!("sandbox {i} saw {seen:?}");
            }
            let uid = sb
                .backend::<namzu::backend::kubernetes::KubernetesSandbox>()
                .map(|k| k.bound().pod.uid.clone())
                .unwrap_or_default();
            Ok::<_, namzu::Error>((took, clean, uid, sb))
        })
    });
    let results = futures::future::join_all(runs).await;
    let wall = t.elapsed();
    let mut times = Vec::new();
    let mut uids = std::collections::BTreeSet::new();
    let (mut crossed, mut failed) = (0, 0);
    let mut handles = Vec::new();
    for r in results {
        match r {
            Ok(Ok((took, clean, uid, sb))) => {
                times.push(took);
                crossed += usize::from(!clean);
                uids.insert(uid);
                handles.push(sb);
            }
            Ok(Err(e)) => {
                failed += 1;
                eprintln!("acquire failed: {e}");
            }
            Err(e) => {
                failed += 1;
                eprintln!("task failed: {e}");
            }
        }
    }
    for sb in &handles {
        let _ = sb.destroy().await;
    }
    c.stop().await;
    println!(
        "{n} concurrent acquires from a warm pool of {n} (pool warmed in {:.1} s):",
        warm.as_secs_f64()
    );
    if times.is_empty() {
        println!("  none succeeded");
        return Ok(());
    }
    println!(
        "  wall {:.2} s; per acquire p50 {}, p95 {}, max {}",
        wall.as_secs_f64(),
        ms(pct(&mut times, 0.5)),
        ms(pct(&mut times, 0.95)),
        ms(pct(&mut times, 1.0))
    );
    println!(
        "  succeeded {}, failed {failed}; distinct pods {}; sandboxes that saw another's files or output: {crossed}",
        times.len(),
        uids.len()
    );
    Ok(())
}

/// Persistent workspaces next to what a user would do without them: a
/// task sandbox made from the template, then the workspace's data
/// uploaded again. Per round: create (cold, with `mib` MiB written),
/// suspend (flushed: the pod gone), resume (a new pod on the same disk,
/// the data checked), and the alternative — create a task Sandbox from
/// the template and write the same `mib` MiB into it.
async fn workspaces(iters: usize, mib: usize) -> Res<()> {
    use namzu::backend::kubernetes::workspace::SuspendOptions;
    use namzu::backend::kubernetes::WorkspaceOptions;
    let c = Cluster::start(None).await?;
    let p = KubernetesProvider::new(c.client(), c.options(false))?;
    let data = bytes::Bytes::from(vec![0x5a_u8; mib << 20]);
    let (mut create, mut suspend, mut resume, mut task) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..iters {
        let name = format!("bench-{i}");
        let t = Instant::now();
        let ws = p.workspace(&name, WorkspaceOptions::default()).await?;
        create.push(t.elapsed());
        ws.sandbox().await?.files().write("data", data.clone()).await?;
        let t = Instant::now();
        ws.suspend(SuspendOptions::default()).await?;
        suspend.push(t.elapsed());
        let t = Instant::now();
        ws.resume(Default::default()).await?;
        let back = ws.sandbox().await?.files().stat("data").await?;
        resume.push(t.elapsed());
        if back.size != data.len() as u64 {
            return Err(format!("resumed with {} bytes of {}", back.size, data.len()).into());
        }
        p.delete_workspace(&name, None).await?;
        let t = Instant::now();
        let sb = p.create_task(SandboxSpec::default()).await?;
        sb.files().write("data", data.clone()).await?;
        task.push(t.elapsed());
        sb.destroy().await?;
    }
    println!("\npersistent workspaces, {iters} rounds, {mib} MiB on the disk (p50):");
    println!(
        "  {:<52} {:>10}",
        "create (Sandbox + PVC, pod Ready, dial, probe)",
        ms(pct(&mut create, 0.5))
    );
    println!(
        "  {:<52} {:>10}",
        "suspend (flush, patch, pod gone)",
        ms(pct(&mut suspend, 0.5))
    );
    let r = pct(&mut resume, 0.5);
    println!(
        "  {:<52} {:>10}",
        "resume (patch, new pod Ready, dial, probe; data there)",
        ms(r)
    );
    let t = pct(&mut task, 0.5);
    println!(
        "  {:<52} {:>10}",
        format!("instead: task Sandbox from the template + {mib} MiB upload"),
        ms(t)
    );
    println!("  resume / instead: {:.2}x", r.as_secs_f64() / t.as_secs_f64());
    c.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let iters = arg("--iters", 10) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 5));
    let n = arg("--concurrent", 50) as usize;
    {
        let c = Cluster::start(Some(2)).await?;
        println!("simulated pod network: {:?}", c.ctl.pod_network());
        let r = acquire_cost(&c, iters, latency).await;
        c.stop().await;
        r?;
    }
    concurrent(n).await?;
    let w = arg("--workspaces", 5) as usize;
    if w > 0 {
        workspaces(w, arg("--workspace-mib", 64) as usize).await?;
    }
    Ok(())
}
