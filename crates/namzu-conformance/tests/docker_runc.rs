//! The conformance suite on the `docker` tier with runc (the host reaches
//! the agent through its bind-mounted socket). Needs a daemon: the test
//! command starts one (`scripts/docker-up.sh`); without it every case is
//! reported ignored, unless `NAMZU_REQUIRE_DOCKER=1`.

fn main() -> std::process::ExitCode {
    namzu_conformance::docker::conformance_main("docker-runc", Default::default(), &[])
}
