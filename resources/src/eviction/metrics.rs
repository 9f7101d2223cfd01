//! The eviction manager's metrics.

use prometheus::{IntCounterVec, Opts, Registry};

/// `kubelet_evictions_total{eviction_signal}`.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// Pods evicted, by signal. The kubelet calls it `kubelet_evictions`; a counter without the
    /// `_total` suffix fails `promtool check metrics`, so nodelet adds it.
    pub evictions: IntCounterVec,
}

impl EvictionMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let evictions = IntCounterVec::new(
            Opts::new("kubelet_evictions_total", "Cumulative number of pod evictions by eviction signal."),
            &["eviction_signal"],
        )?;
        registry.register(Box::new(evictions.clone()))?;
        Ok(Self { evictions })
    }
}
