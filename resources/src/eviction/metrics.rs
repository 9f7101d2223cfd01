//! The eviction pair's metrics.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::local_storage::LimitSignal;
use crate::model::pressure::{Condition, Signal};

/// `kubelet_evictions_total{eviction_signal}` and `nodelet_node_pressure{condition}`.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// Pods evicted, by signal: the node-pressure signals and the local storage limits
    /// (`emptydirfs.limit`, `ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`). The kubelet calls it
    /// `kubelet_evictions`; a counter without the `_total` suffix fails `promtool check metrics`, so
    /// nodelet adds it. Every signal starts at 0, so the series exists (and `increase()` sees the first
    /// eviction) before anything was evicted.
    pub evictions: IntCounterVec,
    /// `nodelet_node_pressure{condition}`: 1 while the node reports the condition (`MemoryPressure`,
    /// `DiskPressure`, `PIDPressure`) `True`, else 0. The kubelet has no metric for its pressure
    /// conditions (they are in the Node's status only); this one lets alerts see them without the API.
    pub node_pressure: IntGaugeVec,
}

impl EvictionMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let evictions = IntCounterVec::new(
            Opts::new("kubelet_evictions_total", "Cumulative number of pod evictions by eviction signal."),
            &["eviction_signal"],
        )?;
        let node_pressure = IntGaugeVec::new(
            Opts::new(
                "nodelet_node_pressure",
                "1 while the node's pressure condition (MemoryPressure, DiskPressure, PIDPressure) is True.",
            ),
            &["condition"],
        )?;
        for signal in Signal::ALL {
            evictions.with_label_values(&[signal.as_str()]);
        }
        for signal in LimitSignal::ALL {
            evictions.with_label_values(&[signal.as_str()]);
        }
        for condition in Condition::ALL {
            node_pressure.with_label_values(&[condition.as_str()]).set(0);
        }
        registry.register(Box::new(evictions.clone()))?;
        registry.register(Box::new(node_pressure.clone()))?;
        Ok(Self { evictions, node_pressure })
    }

    /// Sets `nodelet_node_pressure` from the conditions that are true now.
    pub fn set_pressure(&self, pressure: &std::collections::BTreeSet<Condition>) {
        for condition in Condition::ALL {
            let value = i64::from(pressure.contains(&condition));
            self.node_pressure.with_label_values(&[condition.as_str()]).set(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&registry.gather(), &mut out)
            .unwrap_or_else(|e| panic!("encode: {e}"));
        out
    }

    #[test]
    fn every_signal_and_condition_is_exported_from_the_start() {
        let registry = Registry::new();
        let m = EvictionMetrics::new(&registry).unwrap_or_else(|e| panic!("{e}"));
        let t = text(&registry);
        assert!(t.contains("kubelet_evictions_total{eviction_signal=\"memory.available\"} 0"), "{t}");
        assert!(t.contains("kubelet_evictions_total{eviction_signal=\"pid.available\"} 0"), "{t}");
        assert!(t.contains("kubelet_evictions_total{eviction_signal=\"emptydirfs.limit\"} 0"), "{t}");
        assert!(t.contains("nodelet_node_pressure{condition=\"DiskPressure\"} 0"), "{t}");

        m.set_pressure(&[Condition::DiskPressure].into_iter().collect());
        let t = text(&registry);
        assert!(t.contains("nodelet_node_pressure{condition=\"DiskPressure\"} 1"), "{t}");
        assert!(t.contains("nodelet_node_pressure{condition=\"MemoryPressure\"} 0"), "{t}");
        m.set_pressure(&Default::default());
        assert!(text(&registry).contains("nodelet_node_pressure{condition=\"DiskPressure\"} 0"));
    }
}
