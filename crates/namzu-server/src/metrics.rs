//! [`Metrics`]: what `GET /metrics` shows, in Prometheus text
//! (prometheus-client). Counters and histograms are updated where things
//! happen; the sandbox gauge is computed from the registry at scrape time,
//! so it can never drift from what the server holds.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels: a tier.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// The tier's name.
    pub tier: String,
}

/// Labels: a tier and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierState {
    /// The tier's name.
    pub tier: String,
    /// `running`, or `dead` once an operation found its agent gone.
    pub state: String,
}

/// Labels: why a sandbox was destroyed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestroyLabels {
    /// The tier's name.
    pub tier: String,
    /// `request` or `timeout`.
    pub reason: String,
}

/// Labels: which way bytes went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Direction {
    /// `upload`, `download`, `stdout`, `stderr`, `tcp_in`, `tcp_out`,
    /// `terminal_in`, `terminal_out`.
    pub direction: String,
}

/// Labels: an egress verdict.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Verdict {
    /// `allowed`, `refused`, `resolved`, `failed`.
    pub verdict: String,
}

/// Labels: an HTTP route and status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteStatus {
    /// The route's pattern (`/v1/sandboxes/{id}`), never the raw path, so
    /// ids do not explode the series.
    pub route: String,
    /// The HTTP method.
    pub method: String,
    /// The status code.
    pub status: String,
}

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    /// Sandboxes by tier and state (set at scrape).
    pub sandboxes: Family<TierState, Gauge>,
    /// Creates that succeeded, by tier.
    pub creates: Family<TierLabel, Counter>,
    /// Creates that failed, by tier.
    pub create_failures: Family<TierLabel, Counter>,
    /// Destroys, by tier and reason.
    pub destroys: Family<DestroyLabels, Counter>,
    /// Seconds a create took, by tier.
    pub create_seconds: Family<TierLabel, Histogram>,
    /// Commands started, by tier.
    pub commands: Family<TierLabel, Counter>,
    /// Seconds from a command's start to its exit, for commands whose exit
    /// the server saw, by tier.
    pub command_seconds: Family<TierLabel, Histogram>,
    /// Bytes through the server, by direction.
    pub bytes: Family<Direction, Counter>,
    /// Egress decisions of the server's sandboxes, by verdict (set at
    /// scrape from their supervisors).
    pub egress: Family<Verdict, Gauge<u64, AtomicU64>>,
    /// HTTP requests, by route, method and status.
    pub http: Family<RouteStatus, Counter>,
    /// Seconds from a request to its response head, by route (a stream's
    /// body is not in it).
    pub http_seconds: Family<Route, Histogram>,
}

/// Labels: an HTTP route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Route {
    /// The route's pattern.
    pub route: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("namzu");
        let m = Self {
            sandboxes: Family::default(),
            creates: Family::default(),
            create_failures: Family::default(),
            destroys: Family::default(),
            create_seconds: Family::new_with_constructor(latency_histogram),
            commands: Family::default(),
            command_seconds: Family::new_with_constructor(latency_histogram),
            bytes: Family::default(),
            egress: Family::default(),
            http: Family::default(),
            http_seconds: Family::new_with_constructor(latency_histogram),
            registry: Registry::default(),
        };
        registry.register(
            "sandboxes",
            "Sandboxes the server holds, by tier and state",
            m.sandboxes.clone(),
        );
        registry.register("sandbox_creates", "Sandboxes created", m.creates.clone());
        registry.register(
            "sandbox_create_failures",
            "Creates that failed",
            m.create_failures.clone(),
        );
        registry.register("sandbox_destroys", "Sandboxes destroyed, by reason", m.destroys.clone());
        registry.register(
            "sandbox_create_seconds",
            "Time to create a sandbox, by tier",
            m.create_seconds.clone(),
        );
        registry.register("commands", "Commands started", m.commands.clone());
        registry.register(
            "command_seconds",
            "Time from a command's start to its exit",
            m.command_seconds.clone(),
        );
        registry.register("bytes", "Bytes moved through the server, by direction", m.bytes.clone());
        registry.register(
            "egress_decisions",
            "Egress decisions of the server's sandboxes' supervisors, by verdict",
            m.egress.clone(),
        );
        registry.register("http_requests", "HTTP requests, by route and status", m.http.clone());
        registry.register(
            "http_request_seconds",
            "Time from a request to its response head, by route",
            m.http_seconds.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Counts `n` bytes moved `direction`.
    pub fn moved(&self, direction: &str, n: u64) {
        self.bytes
            .get_or_create(&Direction {
                direction: direction.into(),
            })
            .inc_by(n);
    }

    /// Records a command's start.
    pub fn command_started(&self, tier: &str) {
        self.commands.get_or_create(&TierLabel { tier: tier.into() }).inc();
    }

    /// Records a command's exit after `took`.
    pub fn command_ended(&self, tier: &str, took: Duration) {
        self.command_seconds
            .get_or_create(&TierLabel { tier: tier.into() })
            .observe(took.as_secs_f64());
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("metrics: encode: {e}");
        }
        out
    }
}
