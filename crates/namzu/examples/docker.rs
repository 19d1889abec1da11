//! The same handle on the docker tier: one container per sandbox (runc, or
//! gVisor with `--runtime runsc`), from any image the daemon has or pulls.
//!
//! ```sh
//! cargo run -p namzu --example docker -- busybox:1.36 runsc
//! ```

use namzu::backend::docker::{DockerOptions, DockerProvider};
use namzu::{Provider, SandboxSpec};

#[tokio::main]
async fn main() -> namzu::Result<()> {
    let mut args = std::env::args().skip(1);
    let image = args.next().unwrap_or_else(|| "busybox:1.36".into());
    let runtime = args.next();
    let opts = DockerOptions {
        runtime,
        ..Default::default()
    };
    let provider = DockerProvider::new(namzu::backend::default_state_dir(), opts).await?;
    let sb = provider
        .create(SandboxSpec {
            image: Some(image),
            ..Default::default()
        })
        .await?;
    let out = sb.commands().run("uname -a; id").await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    sb.destroy().await
}
