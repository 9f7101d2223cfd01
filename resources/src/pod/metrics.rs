//! Pod metrics with the kubelet's names (see the shared reference, §10).

use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};

/// The pod metrics kept live; gauges of running pods and containers are computed at scrape time
/// from the actual store.
#[derive(Debug, Clone)]
pub struct PodMetrics {
    /// `kubelet_pleg_relist_duration_seconds`.
    pub pleg_relist_duration: Histogram,
    /// `kubelet_pleg_relist_interval_seconds`.
    pub pleg_relist_interval: Histogram,
    /// `kubelet_started_containers_total`.
    pub started_containers: IntCounter,
    /// `kubelet_started_pods_total`.
    pub started_pods: IntCounter,
}

const PLEG_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl PodMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            pleg_relist_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "kubelet_pleg_relist_duration_seconds",
                    "Duration in seconds for relisting pods in PLEG.",
                )
                .buckets(PLEG_BUCKETS.to_vec()),
            )?,
            pleg_relist_interval: Histogram::with_opts(
                HistogramOpts::new(
                    "kubelet_pleg_relist_interval_seconds",
                    "Interval in seconds between relisting in PLEG.",
                )
                .buckets(PLEG_BUCKETS.to_vec()),
            )?,
            started_containers: IntCounter::new(
                "kubelet_started_containers_total",
                "Cumulative number of containers started.",
            )?,
            started_pods: IntCounter::new(
                "kubelet_started_pods_total",
                "Cumulative number of pods started.",
            )?,
        };
        registry.register(Box::new(m.pleg_relist_duration.clone()))?;
        registry.register(Box::new(m.pleg_relist_interval.clone()))?;
        registry.register(Box::new(m.started_containers.clone()))?;
        registry.register(Box::new(m.started_pods.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }
}
