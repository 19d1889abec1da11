//! Generates the gRPC code from `proto/`. protoc comes from the
//! `protoc-bin-vendored` crate so a fresh machine needs nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY-free: build scripts are single-threaded at this point.
        std::env::set_var("PROTOC", protoc);
    }
    println!("cargo:rerun-if-changed=proto");
    tonic_build::configure()
        .bytes(["."])
        .compile_protos(&["proto/namzu/agent/v1/agent.proto"], &["proto"])?;
    Ok(())
}
