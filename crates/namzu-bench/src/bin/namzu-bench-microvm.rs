//! The microvm tier's figures, side by side with what they are made of, in
//! one run (`bench/microvm.sh`): the same kernel booting to a trivial init
//! (busybox `reboot -f`) against boot to the agent answering, create +
//! first exec, the exec round trip against host fork+exec, and a 1 GiB copy
//! in against a raw socket copy into a file; pause, suspend with memory,
//! restore, resume from the disk alone, snapshot and fork against a fresh
//! boot, with the memory file's size. Under TCG where KVM is unusable
//! (these machines); the stage split says what KVM would change.
//! Not a test: nothing here gates anything.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use namzu::backend::microvm::qmp::Qmp;
use namzu::backend::microvm::{vmm, MicroVmOptions, MicroVmProvider};
use namzu::{ExecRequest, Provider, SandboxSpec, WriteOptions};
use tokio::io::AsyncReadExt;

#[path = "../raw.rs"]
mod raw;
use raw::raw_socket_write;

const GIB: u64 = 1 << 30;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The kernel booting to a trivial init: an initramfs whose /init is a
/// busybox script that powers off at once. qemu start to exit.
fn trivial_boot(kernel: &Path, accel: vmm::Accel, work: &Path) -> Result<Duration, Box<dyn std::error::Error>> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("busybox (static) is needed for the trivial-init line")?;
    let cpio = work.join("trivial.cpio");
    let mut f = std::fs::File::create(&cpio)?;
    let entries: Vec<(&str, u32, Vec<u8>)> = vec![
        ("bin", 0o040_755, Vec::new()),
        ("bin/busybox", 0o100_755, std::fs::read(&busybox)?),
        (
            "init",
            0o100_755,
            b"#!/bin/busybox sh\n/bin/busybox poweroff -f\n".to_vec(),
        ),
    ];
    for (i, (name, mode, data)) in entries.iter().enumerate() {
        let mut w = cpio::NewcBuilder::new(name)
            .ino(i as u32 + 1)
            .mode(*mode)
            .nlink(1)
            .write(&mut f, data.len() as u32);
        w.write_all(data)?;
        w.finish()?;
    }
    cpio::newc::trailer(&mut f)?;
    drop(f);
    let machine = format!("microvm,accel={accel},x-option-roms=off");
    // The same kernel command line as a namzu guest's (the TSC hint under TCG).
    let mut cmdline = String::from("console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init");
    if let (vmm::Accel::Tcg, Some(khz)) = (accel, vmm::host_tsc_khz()) {
        cmdline.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
    }
    let t = Instant::now();
    let child = std::process::Command::new("qemu-system-x86_64")
        .args([
            "-M",
            &machine,
            "-cpu",
            if accel == vmm::Accel::Kvm { "host" } else { "max" },
        ])
        .args([
            "-m",
            "512M",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(&cpio)
        .args(["-append", &cmdline])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut child = child;
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err("trivial boot: the guest did not end within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = t.elapsed();
    if !st.success() {
        return Err(format!("trivial boot: qemu {st}").into());
    }
    Ok(took)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let image = std::env::var("NAMZU_BENCH_IMAGE").unwrap_or_else(|_| "target/images/debian-bookworm.tar".into());
    let state = tempfile::tempdir_in("target")?;
    namzu::image::ImageStore::new(state.path()).import(Path::new(&image), Some("bench:1"), &|_, _| {})?;
    let accel = vmm::choose_accel(vmm::AccelChoice::Auto)?;
    let kernel = namzu::backend::microvm::boot::Kernel::find(None, state.path())?;
    let p = MicroVmProvider::new(state.path())?.options(MicroVmOptions {
        default_image: Some("bench:1".into()),
        disk_bytes: 3 << 30,
        ..Default::default()
    });
    // Warm: the initramfs and the base disk are built once per image.
    let t = Instant::now();
    let first = p.create(SandboxSpec::default()).await?;
    let cold = t.elapsed();
    first.destroy().await?;

    let mut trivial = Vec::new();
    let mut boots = Vec::new();
    let mut first_exec = Vec::new();
    for _ in 0..runs {
        trivial.push(trivial_boot(&kernel.vmlinuz, accel, state.path())?);
        let t = Instant::now();
        let sb = p.create(SandboxSpec::default()).await?;
        let booted = t.elapsed();
        sb.commands().run(ExecRequest::new("true")).await?;
        first_exec.push(t.elapsed());
        boots.push(booted);
        sb.destroy().await?;
    }
    let sb = p.create(SandboxSpec::default()).await?;
    let mut rtt = Vec::new();
    let mut host = Vec::new();
    for i in 0..60 {
        let t = Instant::now();
        sb.commands().run(ExecRequest::new("true")).await?;
        if i >= 10 {
            rtt.push(t.elapsed());
        }
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        if i >= 10 {
            host.push(t.elapsed());
        }
    }
    let t = Instant::now();
    let zeros = tokio::io::repeat(0).take(GIB);
    sb.files()
        .write_from(Path::new("big"), Box::new(zeros), WriteOptions::default())
        .await?;
    let copy_in = t.elapsed();
    let raw = raw_socket_write(&state.path().join("raw.bin"), GIB)?;
    sb.destroy().await?;

    let (trivial, boot, first_exec) = (median(trivial), median(boots), median(first_exec));
    println!("## microvm tier, accel {accel}, {runs} runs, medians");
    println!();
    if accel == vmm::Accel::Tcg {
        println!(
            "Under TCG (software emulation): KVM is unusable here ({}).",
            vmm::kvm_unusable().unwrap_or_default()
        );
        println!();
    }
    println!("| what | namzu | alternative | alternative is | ratio |");
    println!("|---|---|---|---|---|");
    println!(
        "| boot → agent answers (create) | {} | {} | same kernel, a busybox init that reboots at once | {:.2}x |",
        ms(boot),
        ms(trivial),
        boot.as_secs_f64() / trivial.as_secs_f64()
    );
    println!("| create + first exec | {} | | | |", ms(first_exec));
    println!(
        "| exec `true` round trip | {} | {} | host fork+exec | {:.2}x |",
        ms(median(rtt.clone())),
        ms(median(host.clone())),
        median(rtt).as_secs_f64() / median(host).as_secs_f64()
    );
    println!(
        "| 1 GiB copy in (atomic, fsync) | {:.0} MiB/s | {:.0} MiB/s | raw socket copy into a file + fsync | {:.2}x |",
        1024.0 / copy_in.as_secs_f64(),
        1024.0 / raw.as_secs_f64(),
        raw.as_secs_f64() / copy_in.as_secs_f64()
    );
    println!("| first create (initramfs + base disk built) | {} | | | |", ms(cold));
    println!();
    snapshot_bench(&p, runs.min(3), boot).await?;
    let agent_part = boot.saturating_sub(trivial);
    println!(
        "Stages: the kernel to a trivial init and back out takes {}; the rest of create, {} (disk made, \
         VMM jailed, modules, disks, overlay, switch root, agent, link, privilege probe, egress supervisor), \
         is namzu's. Under KVM the kernel's part shrinks to tens of milliseconds (no instruction \
         emulation), and so does most of namzu's guest part, which is CPU-bound in the guest.",
        ms(trivial),
        ms(agent_part)
    );
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Pause, suspend with memory, restore, resume from the disk alone,
/// snapshot and fork, each against a fresh boot (`boot`, create's median):
/// what a user pays instead of keeping the sandbox.
async fn snapshot_bench(p: &MicroVmProvider, runs: usize, boot: Duration) -> Result<(), Box<dyn std::error::Error>> {
    // A guest with 64 MiB of its own in memory (a shell holding it), as a
    // working one has.
    let busy = "sh -c 'x=$(head -c 50331648 /dev/urandom | base64 -w0); sleep 3000' >/dev/null 2>&1 </dev/null &";
    let (mut pause, mut unpause, mut suspend, mut restore, mut from_disk) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut snapshot, mut fork, mut mem_bytes, mut snap_disk) = (vec![], vec![], 0, 0);
    let (mut qmp_stop, mut qmp_cont) = (vec![], vec![]);
    for _ in 0..runs {
        let sb = p.create(SandboxSpec::default()).await?;
        let id = sb.id().to_owned();
        sb.commands().run(ExecRequest::shell(busy)).await?;
        let t = Instant::now();
        sb.pause().await?;
        pause.push(t.elapsed());
        let t = Instant::now();
        sb.resume().await?;
        unpause.push(t.elapsed());
        sb.commands().run(ExecRequest::new("true")).await?;
        // What the pause wraps, by hand: QMP `stop` and `cont` on the VM's
        // own socket, nothing held, nothing told.
        let sock = p.state_root().join(&id).join("vm/qmp.sock");
        let t = Instant::now();
        Qmp::connect(&sock, Duration::from_secs(10))?.execute("stop", None)?;
        qmp_stop.push(t.elapsed());
        let t = Instant::now();
        Qmp::connect(&sock, Duration::from_secs(10))?.execute("cont", None)?;
        qmp_cont.push(t.elapsed());
        let t = Instant::now();
        sb.suspend().await?;
        suspend.push(t.elapsed());
        mem_bytes = std::fs::metadata(p.state_root().join(&id).join("memory.snap"))?.len();
        let t = Instant::now();
        let sb = p.resume(&id).await?;
        sb.commands().run(ExecRequest::new("true")).await?;
        restore.push(t.elapsed());
        // The disk alone: the same suspend with its memory file taken away.
        sb.suspend().await?;
        std::fs::remove_file(p.state_root().join(&id).join("memory.snap"))?;
        let t = Instant::now();
        let sb = p.resume(&id).await?;
        sb.commands().run(ExecRequest::new("true")).await?;
        from_disk.push(t.elapsed());
        sb.commands().run(ExecRequest::shell(busy)).await?;
        let t = Instant::now();
        let snap = p.snapshot(&id).await?;
        snapshot.push(t.elapsed());
        (mem_bytes, snap_disk) = (snap.memory_bytes.max(mem_bytes), snap.disk_bytes);
        let t = Instant::now();
        let f = p.fork(&snap.id).await?;
        f.commands().run(ExecRequest::new("true")).await?;
        fork.push(t.elapsed());
        f.destroy().await?;
        sb.destroy().await?;
        p.delete_snapshot(&snap.id).await?;
    }
    let ratio = |d: Duration| format!("{:.2}x", d.as_secs_f64() / boot.as_secs_f64());
    println!();
    println!("### pause, suspend, restore and fork ({runs} runs, medians; 512 MiB guests holding 64 MiB)");
    println!();
    let (pause, unpause, qmp_stop, qmp_cont) = (median(pause), median(unpause), median(qmp_stop), median(qmp_cont));
    println!(
        "Pause by hand on the same VMs: QMP `stop` {}, `cont` {} — namzu's pause {:.2}x and resume {:.2}x that.",
        ms(qmp_stop),
        ms(qmp_cont),
        pause.as_secs_f64() / qmp_stop.as_secs_f64(),
        unpause.as_secs_f64() / qmp_cont.as_secs_f64()
    );
    println!();
    println!("| what | namzu | a fresh boot (create) | ratio |");
    println!("|---|---|---|---|");
    let rows = [
        ("pause (the VM stopped)", pause),
        ("resume a pause", unpause),
        ("suspend with memory (flush, save, end the VM)", median(suspend)),
        ("resume from memory + first exec", median(restore)),
        ("resume from the disk alone + first exec", median(from_disk)),
        ("snapshot a running VM (it runs on)", median(snapshot)),
        ("fork from the snapshot + first exec", median(fork)),
    ];
    for (what, d) in rows {
        println!("| {what} | {} | {} | {} |", ms(d), ms(boot), ratio(d));
    }
    println!();
    println!(
        "Memory file: {} for a 512 MiB guest (pages never touched are not written); a snapshot's disk: {} on the host.",
        mib(mem_bytes),
        mib(snap_disk)
    );
    Ok(())
}
