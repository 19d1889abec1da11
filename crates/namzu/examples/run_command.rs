//! Run a command in a `local` sandbox and stream its output as it comes.
//!
//! ```sh
//! cargo run -p namzu --example run_command -- 'for i in 1 2 3; do echo tick $i; sleep 0.2; done'
//! ```

use futures::StreamExt;
use namzu::backend::local::LocalProvider;
use namzu::{ExecEvent, Provider, SandboxSpec};

#[tokio::main]
async fn main() -> namzu::Result<()> {
    let script = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "echo hello from $(hostname)".into());
    let provider = LocalProvider::new(namzu::backend::default_state_dir())?;
    let sb = provider.create(SandboxSpec::default()).await?;

    let mut stream = sb.commands().stream(script.as_str()).await?;
    let mut code = 0;
    while let Some(event) = stream.next().await {
        match event? {
            ExecEvent::Stdout { data, .. } => print!("{}", String::from_utf8_lossy(&data)),
            ExecEvent::Stderr { data, .. } => eprint!("{}", String::from_utf8_lossy(&data)),
            ExecEvent::Exit(exit) => code = exit.status.shell_code(),
        }
    }
    sb.destroy().await?;
    std::process::exit(code);
}
