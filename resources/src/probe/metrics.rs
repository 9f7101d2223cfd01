//! Prober metrics with the kubelet's names and labels (shared reference §4).

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The prober's metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProbeMetrics {
    /// `prober_probe_total{probe_type,result,container,pod,namespace}`: probe runs by result
    /// (`successful`, `failed`, `unknown` for a handler error or timeout).
    pub probe_total: IntCounterVec,
    /// `prober_probe_duration_seconds{probe_type,container,pod,namespace}`: how long probe runs take.
    pub probe_duration: HistogramVec,
}

impl ProbeMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            probe_total: IntCounterVec::new(
                Opts::new(
                    "prober_probe_total",
                    "Cumulative number of a liveness, readiness or startup probe for a container by result.",
                ),
                &["probe_type", "result", "container", "pod", "namespace"],
            )?,
            probe_duration: HistogramVec::new(
                HistogramOpts::new(
                    "prober_probe_duration_seconds",
                    "Duration in seconds for a probe response.",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 14)?),
                &["probe_type", "container", "pod", "namespace"],
            )?,
        };
        registry.register(Box::new(m.probe_total.clone()))?;
        registry.register(Box::new(m.probe_duration.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }
}
