//! The extra modes, run separately from the attempts because they push
//! limits or serve: `--fork-bomb`, `--disk-fill PATH`, `--mem-hog`,
//! `--cpu-burn SECS`, `--echo-server PORT`, `--report-caps`.

use std::io::{Read, Write};

pub fn report_caps() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status.lines().find(|l| l.starts_with("CapEff:")).unwrap_or("CapEff: ?");
    println!("CapEff: {}", eff.trim_start_matches("CapEff:").trim());
}

/// Forks idle children until fork fails; prints how many, then kills them
/// all (and itself) through the process group.
pub fn fork_bomb(limit: u32) {
    let mut n = 0u32;
    let err = loop {
        if n >= limit {
            break "reached the test's own ceiling".to_owned();
        }
        // SAFETY: fork(2); the child only pauses until the group is killed.
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: pause(2) takes nothing.
                unsafe { libc::pause() };
            },
            -1 => break std::io::Error::last_os_error().to_string(),
            _ => n += 1,
        }
    };
    println!("forked {n} before: {err}");
    let _ = std::io::stdout().flush();
    // SAFETY: kill(2) of our own process group.
    unsafe { libc::kill(0, libc::SIGKILL) };
}

pub fn disk_fill(path: &str) {
    // SAFETY: ignoring a signal installs no handler code. Past RLIMIT_FSIZE
    // the write then fails with EFBIG instead of the signal killing us.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    let res: std::io::Result<()> = std::fs::File::create(path).and_then(|mut f| loop {
        f.write_all(&chunk)?;
        written += chunk.len() as u64;
    });
    let e = res.err().map_or_else(|| "none".to_owned(), |e| e.to_string());
    let _ = std::fs::remove_file(path);
    println!("wrote {written} bytes before: {e}");
}

/// Allocates and touches memory in 16 MiB steps until something stops it;
/// prints progress so the host sees how far it got.
pub fn mem_hog() {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; 16 << 20];
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
        held.push(chunk);
        println!("holding {} MiB", held.len() * 16);
        let _ = std::io::stdout().flush();
    }
}

/// Spins for `secs` of wall time; prints the CPU time it got.
pub fn cpu_burn(secs: f64) {
    let t0 = std::time::Instant::now();
    let mut x = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    // SAFETY: getrusage(2) fills a struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let cpu = ru.ru_utime.tv_sec as f64
        + ru.ru_utime.tv_usec as f64 / 1e6
        + ru.ru_stime.tv_sec as f64
        + ru.ru_stime.tv_usec as f64 / 1e6;
    println!("cpu {cpu:.3} wall {:.3} ({x})", t0.elapsed().as_secs_f64());
}

/// Echoes every connection on 127.0.0.1:`port` until the peer half-closes,
/// then closes its own half. Prints `listening` once ready.
pub fn echo_server(port: u16) {
    let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
        println!("cannot bind {port}");
        return;
    };
    println!("listening");
    let _ = std::io::stdout().flush();
    for conn in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut conn = conn;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if conn.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = conn.shutdown(std::net::Shutdown::Write);
        });
    }
}
