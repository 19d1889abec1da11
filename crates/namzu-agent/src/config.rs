//! Agent configuration: every limit the agent enforces, by name, with its
//! default and its `NAMZU_<NAME>` environment override.

use std::path::PathBuf;
use std::time::Duration;

use namzu_proto::limits;

/// Limits, each named in [`namzu_proto::limits`].
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_write_bytes: u64,
    pub max_read_range_bytes: u64,
    pub max_message_bytes: u64,
    pub max_output_bytes: u64,
    pub sandbox_max_timeout_ms: u64,
    pub cancel_confirm_ms: u64,
    pub max_execs: u64,
    pub exec_records_kept: u64,
    pub reservation_ttl_ms: u64,
    pub max_list_entries: u64,
    pub max_walk_entries: u64,
    pub max_token_bytes: u64,
    pub preface_timeout_ms: u64,
    pub max_pending_links: u64,
    pub shutdown_grace_ms: u64,
    pub agent_shutdown_deadline_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub max_sessions: u64,
    pub session_ring_bytes: u64,
    pub session_ttl_ms: u64,
    pub max_retained_logs: u64,
    pub execution_log_bytes: u64,
    pub execution_retained_ttl_ms: u64,
    pub egress_max_pending: u64,
    pub egress_decision_timeout_ms: u64,
    pub egress_max_head_bytes: u64,
    pub max_side_reads: u64,
    pub max_side_writes: u64,
    pub dial_back_scan_ms: u64,
    pub max_dial_back_hosts: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_write_bytes: 1 << 30,
            max_read_range_bytes: 4 << 20,
            max_message_bytes: namzu_proto::DEFAULT_MAX_MESSAGE_BYTES as u64,
            max_output_bytes: 16 << 20,
            sandbox_max_timeout_ms: 30 * 60 * 1000,
            cancel_confirm_ms: 5_000,
            max_execs: 256,
            exec_records_kept: 1024,
            reservation_ttl_ms: 120_000,
            max_list_entries: 100_000,
            max_walk_entries: 100_000,
            max_token_bytes: namzu_proto::preface::DEFAULT_MAX_TOKEN_BYTES as u64,
            preface_timeout_ms: 5_000,
            max_pending_links: 64,
            shutdown_grace_ms: 5_000,
            agent_shutdown_deadline_ms: 15_000,
            heartbeat_interval_ms: 15_000,
            max_sessions: 16,
            session_ring_bytes: 1 << 20,
            session_ttl_ms: 10 * 60 * 1000,
            max_retained_logs: 32,
            execution_log_bytes: 1 << 20,
            execution_retained_ttl_ms: 10 * 60 * 1000,
            egress_max_pending: 1024,
            egress_decision_timeout_ms: 30_000,
            egress_max_head_bytes: 16 * 1024,
            max_side_reads: 16,
            max_side_writes: 16,
            dial_back_scan_ms: 25,
            max_dial_back_hosts: 8,
        }
    }
}

/// A `NAMZU_*` override that is not a number.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {var}={value:?} is not a non-negative integer")]
pub struct BadOverride {
    pub var: String,
    pub value: String,
}

impl Limits {
    /// Defaults, overridden by `NAMZU_<LIMIT_NAME>` variables.
    pub fn from_env() -> Result<Self, BadOverride> {
        let mut l = Self::default();
        for (name, slot) in l.slots_mut() {
            let var = namzu_proto::limits::env_var(name);
            if let Ok(value) = std::env::var(&var) {
                *slot = value.trim().parse().map_err(|_| BadOverride { var, value })?;
            }
        }
        Ok(l)
    }

    /// Name/value pairs as reported by Health.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        let mut me = self.clone();
        me.slots_mut().into_iter().map(|(n, v)| (n, *v)).collect()
    }

    fn slots_mut(&mut self) -> Vec<(&'static str, &mut u64)> {
        vec![
            (limits::MAX_WRITE_BYTES, &mut self.max_write_bytes),
            (limits::MAX_READ_RANGE_BYTES, &mut self.max_read_range_bytes),
            (limits::MAX_MESSAGE_BYTES, &mut self.max_message_bytes),
            (limits::MAX_OUTPUT_BYTES, &mut self.max_output_bytes),
            (limits::MAX_EXECS, &mut self.max_execs),
            (limits::EXEC_RECORDS_KEPT, &mut self.exec_records_kept),
            (limits::RESERVATION_TTL_MS, &mut self.reservation_ttl_ms),
            (limits::MAX_LIST_ENTRIES, &mut self.max_list_entries),
            (limits::MAX_WALK_ENTRIES, &mut self.max_walk_entries),
            (limits::MAX_TOKEN_BYTES, &mut self.max_token_bytes),
            (limits::SANDBOX_MAX_TIMEOUT_MS, &mut self.sandbox_max_timeout_ms),
            (limits::CANCEL_CONFIRM_MS, &mut self.cancel_confirm_ms),
            (limits::PREFACE_TIMEOUT_MS, &mut self.preface_timeout_ms),
            (limits::MAX_PENDING_LINKS, &mut self.max_pending_links),
            (limits::SHUTDOWN_GRACE_MS, &mut self.shutdown_grace_ms),
            (limits::AGENT_SHUTDOWN_DEADLINE_MS, &mut self.agent_shutdown_deadline_ms),
            (limits::HEARTBEAT_INTERVAL_MS, &mut self.heartbeat_interval_ms),
            (limits::MAX_SESSIONS, &mut self.max_sessions),
            (limits::SESSION_RING_BYTES, &mut self.session_ring_bytes),
            (limits::SESSION_TTL_MS, &mut self.session_ttl_ms),
            (limits::MAX_RETAINED_LOGS, &mut self.max_retained_logs),
            (limits::EXECUTION_LOG_BYTES, &mut self.execution_log_bytes),
            (limits::EXECUTION_RETAINED_TTL_MS, &mut self.execution_retained_ttl_ms),
            (limits::EGRESS_MAX_PENDING, &mut self.egress_max_pending),
            (limits::EGRESS_DECISION_TIMEOUT_MS, &mut self.egress_decision_timeout_ms),
            (limits::EGRESS_MAX_HEAD_BYTES, &mut self.egress_max_head_bytes),
            (limits::MAX_SIDE_READS, &mut self.max_side_reads),
            (limits::MAX_SIDE_WRITES, &mut self.max_side_writes),
            (limits::DIAL_BACK_SCAN_MS, &mut self.dial_back_scan_ms),
            (limits::MAX_DIAL_BACK_HOSTS, &mut self.max_dial_back_hosts),
        ]
    }

    /// Sets a limit by name; unknown names are ignored here because the host
    /// validated them against [`namzu_proto::limits::ALL`].
    pub fn set(&mut self, name: &str, value: u64) {
        if let Some((_, slot)) = self.slots_mut().into_iter().find(|(n, _)| *n == name) {
            *slot = value;
        }
    }

    /// A limit as a `usize`, saturating on 32-bit targets.
    pub fn usize(v: u64) -> usize {
        usize::try_from(v).unwrap_or(usize::MAX)
    }

    pub fn preface_timeout(&self) -> Duration {
        Duration::from_millis(self.preface_timeout_ms)
    }
    /// The heartbeat interval, `None` when disabled.
    pub fn heartbeat(&self) -> Option<Duration> {
        (self.heartbeat_interval_ms > 0).then(|| Duration::from_millis(self.heartbeat_interval_ms))
    }

    pub fn cancel_confirm(&self) -> Duration {
        Duration::from_millis(self.cancel_confirm_ms)
    }
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

/// Everything the agent needs to serve.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// File operations are confined beneath these directories. The first is
    /// the root relative paths are resolved against.
    pub roots: Vec<PathBuf>,
    /// Working directory of a command that names none.
    pub default_cwd: PathBuf,
    /// The bind token a peer must present in the preface.
    pub token: Vec<u8>,
    pub limits: Limits,
    /// Features withheld by the operator (`NAMZU_DISABLED_FEATURES`, comma
    /// separated): neither advertised nor served.
    pub disabled_features: Vec<String>,
    /// What the sandbox applied around the agent (landlock ABI, seccomp,
    /// capabilities …), reported in Health. Empty on the host tier.
    pub hardening: Vec<(String, String)>,
    /// The loopback proxy and resolver's sockets, where the boundary gives
    /// the sandbox a network namespace of its own; `None`: no egress
    /// feature (the host tier shares the host's network).
    pub egress: Option<crate::egress::Listeners>,
    /// A TCP listener served besides the main one, with the same token (a
    /// pod's agent port, where the sandbox has a network of its own).
    pub tcp: Option<std::sync::Arc<std::net::TcpListener>>,
    /// Mutual TLS on every TCP listener (a pod's link; see
    /// [`namzu_proto::link_tls`]); unix sockets and inherited fds are the
    /// host's own channels and stay as they are.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// `/proc/self/status` of a child forked once the agent had hardened
    /// itself, before it served (the local sandbox's init makes one while
    /// it is still single-threaded, where a fork is cheap): Health's
    /// `probe_child` answers with it instead of forking again.
    pub startup_child_status: Option<String>,
    /// A directory of host listeners to dial out to ([`crate::dial_back`]),
    /// besides listening.
    pub dial_back: Option<std::path::PathBuf>,
}

/// The features the operator withholds: `NAMZU_DISABLED_FEATURES`, comma
/// separated (the container's environment on a pod; a local sandbox's
/// environment, which its agent takes as its own).
pub fn disabled_features_from_env() -> Vec<String> {
    std::env::var("NAMZU_DISABLED_FEATURES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect()
}

impl AgentConfig {
    pub fn feature_enabled(&self, feature: &str) -> bool {
        let egress = [
            namzu_proto::features::EGRESS,
            namzu_proto::features::EGRESS_STREAM,
            namzu_proto::features::EGRESS_HANDOFF,
        ];
        if egress.contains(&feature) && self.egress.is_none() {
            return false;
        }
        !self.disabled_features.iter().any(|f| f == feature)
    }

    /// Every feature this agent serves.
    pub fn features(&self) -> Vec<String> {
        namzu_proto::features::ALL
            .iter()
            .chain([
                &namzu_proto::features::EGRESS,
                &namzu_proto::features::EGRESS_STREAM,
                &namzu_proto::features::EGRESS_HANDOFF,
            ])
            .filter(|f| self.feature_enabled(f))
            .map(|f| (*f).to_owned())
            .collect()
    }
}
