//! `namzu-vmm`: the anchor of one microVM (see
//! `namzu::backend::microvm::anchor`), beside the library it runs. Started
//! by the microvm provider with the path of the VM's `anchor.json`; lives
//! as long as the VM; logs to stderr (the sandbox's `agent.log`).

use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NAMZU_AGENT_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mut args = std::env::args_os().skip(1);
    let (Some(spec), None) = (args.next(), args.next()) else {
        tracing::error!("usage: namzu-vmm ANCHOR_JSON");
        return ExitCode::from(2);
    };
    let code = namzu::backend::microvm::anchor::run(std::path::Path::new(&spec));
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
