//! Start a detachable command, let this process exit, and read it from
//! another process by offset — nothing lost, nothing repeated.
//!
//! ```sh
//! cargo run -p namzu --example detach_reattach -- start          # prints SANDBOX EXECUTION
//! cargo run -p namzu --example detach_reattach -- attach SANDBOX EXECUTION
//! cargo run -p namzu --example detach_reattach -- destroy SANDBOX
//! ```

use futures::StreamExt;
use namzu::backend::local::LocalProvider;
use namzu::{AttachOptions, ExecEvent, ExecRequest, Provider, SandboxSpec};

#[tokio::main]
async fn main() -> namzu::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let provider = LocalProvider::new(namzu::backend::default_state_dir())?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["start"] => {
            let sb = provider.create(SandboxSpec::default()).await?;
            let req = ExecRequest::shell("for i in $(seq 1 5); do echo line $i; sleep 0.1; done; exit 3")
                .execution_id("build-42");
            let mut stream = sb.commands().spawn(req).await?;
            // Read the first line, then leave: the command goes on.
            if let Some(event) = stream.next().await {
                if let ExecEvent::Stdout { data, .. } = event? {
                    eprint!("first: {}", String::from_utf8_lossy(&data));
                }
            }
            println!("{} {} {}", sb.id(), stream.execution_id, stream.next_offset());
        }
        ["attach", id, execution] | ["attach", id, execution, _] => {
            let from = args.get(3).and_then(|o| o.parse().ok()).unwrap_or(0);
            let sb = provider.connect(id).await?;
            let out = sb
                .commands()
                .attach(execution, AttachOptions::default().from_offset(from))
                .await?;
            print!("{}", String::from_utf8_lossy(&out.stdout));
            println!("exit {}", out.status.shell_code());
        }
        ["destroy", id] => provider.destroy(id).await?,
        _ => eprintln!("usage: detach_reattach start | attach SANDBOX EXECUTION [OFFSET] | destroy SANDBOX"),
    }
    Ok(())
}
