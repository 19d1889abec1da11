//! The raw alternative to a file write through namzu: bytes over a local
//! socket into a file, then fsync. Shared by the bench binaries.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Copies `len` zero bytes over a socket pair into `dst` and syncs it.
pub fn raw_socket_write(dst: &Path, len: u64) -> std::io::Result<Duration> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let t0 = Instant::now();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let buf = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            a.write_all(&buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let mut f = std::fs::File::create(dst)?;
    std::io::copy(&mut (&mut b).take(len), &mut f)?;
    f.sync_all()?;
    sender.join().map_err(|_| std::io::Error::other("sender panicked"))??;
    Ok(t0.elapsed())
}
