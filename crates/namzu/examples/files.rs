//! Write a file into a sandbox, list its directory, read it back, and read
//! part of it.
//!
//! ```sh
//! cargo run -p namzu --example files
//! ```

use namzu::backend::local::LocalProvider;
use namzu::{ByteRange, Provider, SandboxSpec, WriteOptions};

#[tokio::main]
async fn main() -> namzu::Result<()> {
    let provider = LocalProvider::new(namzu::backend::default_state_dir())?;
    let sb = provider.create(SandboxSpec::default()).await?;
    let files = sb.files();

    files
        .write_with(
            "/workspace/notes/today.txt",
            "hello, sandbox\n",
            WriteOptions::default().create_parents(true).mode(0o600),
        )
        .await?;
    for entry in files.list("/workspace/notes").await? {
        println!("{:o} {:>6} {}", entry.mode, entry.size, entry.path.display());
    }
    let whole = files.read("/workspace/notes/today.txt").await?;
    print!("{}", String::from_utf8_lossy(&whole));
    let part = files
        .read_range(
            "/workspace/notes/today.txt",
            ByteRange {
                offset: 7,
                length: Some(7),
            },
        )
        .await?;
    println!(
        "bytes 7..14 of {}: {:?}",
        part.file_size,
        String::from_utf8_lossy(&part.data)
    );

    sb.destroy().await
}
