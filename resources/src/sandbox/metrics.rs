//! The kubelet's sandbox metrics.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};

/// Sandbox metrics, registered once.
#[derive(Debug, Clone)]
pub struct SandboxMetrics {
    /// `kubelet_started_pods_total`: sandboxes created.
    pub started_pods: IntCounter,
    /// `kubelet_started_pods_errors_total`: sandbox creations that failed.
    pub started_pods_errors: IntCounter,
    /// `kubelet_run_podsandbox_duration_seconds{runtime_handler}`.
    pub run_duration: HistogramVec,
    /// `kubelet_run_podsandbox_errors_total{runtime_handler}`.
    pub run_errors: IntCounterVec,
}

impl SandboxMetrics {
    /// Creates the metrics and registers them with `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::build()?;
        registry.register(Box::new(m.started_pods.clone()))?;
        registry.register(Box::new(m.started_pods_errors.clone()))?;
        registry.register(Box::new(m.run_duration.clone()))?;
        registry.register(Box::new(m.run_errors.clone()))?;
        Ok(m)
    }

    /// The metrics, registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::build().unwrap_or_else(|e| unreachable!("invalid sandbox metric definitions: {e}"))
    }

    fn build() -> Result<Self, prometheus::Error> {
        Ok(Self {
            started_pods: IntCounter::new("kubelet_started_pods_total", "Cumulative number of pods started.")?,
            started_pods_errors: IntCounter::new(
                "kubelet_started_pods_errors_total",
                "Cumulative number of errors when starting pods",
            )?,
            run_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_run_podsandbox_duration_seconds",
                    "Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler.",
                )
                .buckets(prometheus::DEFAULT_BUCKETS.to_vec()),
                &["runtime_handler"],
            )?,
            run_errors: IntCounterVec::new(
                Opts::new(
                    "kubelet_run_podsandbox_errors_total",
                    "Cumulative number of the run_podsandbox operation errors by RuntimeClass.Handler.",
                ),
                &["runtime_handler"],
            )?,
        })
    }
}
