//! Test builds only (cargo feature `weaken`): the escape suite's
//! layer-removal test takes ONE defence away at a time, named in the
//! sandbox's environment as `NAMZU_TEST_WEAKEN=layer[,layer]`, to show which
//! attempts each defence alone stops. Layers:
//!
//! * `seccomp`: namzu's filter becomes an allow-everything filter (the
//!   privilege probe still sees a filter installed);
//! * `landlock`: no landlock ruleset;
//! * `readonly`: the host directories, binds and `/` stay writable mounts;
//! * `etc`: the host's whole /etc is shown (read-only) instead of the
//!   curated copy;
//! * `probe-bait`: a privilege the probe must catch is left in place
//!   (capabilities on `local`, no seccomp filter at all in a container).
//!
//! Without the feature, [`active`] is a constant `false`: a shipped agent
//! has no such switch, whatever its environment says.

/// The environment variable naming the layers to remove.
pub const VAR: &str = "NAMZU_TEST_WEAKEN";

/// Whether `layer` is to be removed, per `env` (the spec's environment).
#[cfg(feature = "weaken")]
pub fn active<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>, layer: &str) -> bool {
    env.into_iter()
        .any(|(k, v)| k == VAR && v.split(',').any(|l| l == layer))
}

/// Whether `layer` is to be removed: never, in a build without `weaken`.
#[cfg(not(feature = "weaken"))]
pub fn active<'a>(_env: impl IntoIterator<Item = (&'a str, &'a str)>, _layer: &str) -> bool {
    false
}

/// [`active`] over a launch spec's environment.
pub fn in_spec(spec: &namzu_proto::launch::LaunchSpec, layer: &str) -> bool {
    active(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())), layer)
}

/// [`active`] over this process's environment (a container's agent).
pub fn in_process(layer: &str) -> bool {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    active(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())), layer)
}

/// What Health reports for a removed layer.
pub const REMOVED: &str = "REMOVED by NAMZU_TEST_WEAKEN (test build)";
