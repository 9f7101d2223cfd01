//! Volume metrics with the kubelet's names (see the shared reference, §10).

use prometheus::{HistogramOpts, HistogramVec, IntGaugeVec, Opts, Registry};
use reconcile_engine::Store;

use super::actual::VolumeActual;
use super::desired::{DesiredVolume, VolumeKey, is_device_key};
use crate::model::volumes::Plugin;

/// The volume metrics.
#[derive(Debug, Clone)]
pub struct VolumeMetrics {
    /// `volume_manager_total_volumes{plugin_name,state}`: volumes in the desired
    /// (`desired_state_of_world`) and actual (`actual_state_of_world`) state.
    pub total_volumes: IntGaugeVec,
    /// `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}`.
    pub operation_duration: HistogramVec,
}

const BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];

impl VolumeMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            total_volumes: IntGaugeVec::new(
                Opts::new("volume_manager_total_volumes", "Number of volumes in Volume Manager"),
                &["plugin_name", "state"],
            )?,
            operation_duration: HistogramVec::new(
                HistogramOpts::new("storage_operation_duration_seconds", "Storage operation duration")
                    .buckets(BUCKETS.to_vec()),
                &["volume_plugin", "operation_name", "status", "migrated"],
            )?,
        };
        registry.register(Box::new(m.total_volumes.clone()))?;
        registry.register(Box::new(m.operation_duration.clone()))?;
        Ok(m)
    }

    /// Metrics registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }

    /// Sets `volume_manager_total_volumes` from the two stores (call before a scrape).
    pub fn refresh(
        &self,
        desired: &Store<VolumeKey, DesiredVolume>,
        actual: &Store<VolumeKey, VolumeActual>,
    ) {
        let mut wanted = [0i64; Plugin::ALL.len()];
        let mut have = [0i64; Plugin::ALL.len()];
        let index = |p: Plugin| Plugin::ALL.iter().position(|q| *q == p).unwrap_or(0);
        // Pod volumes only: a CSI device is counted through the pod volumes published from it.
        desired.for_each(|k, v| {
            if !is_device_key(k) {
                wanted[index(v.plugin)] += 1;
            }
        });
        actual.for_each(|k, v| {
            if v.is_mounted() && !is_device_key(k) {
                have[index(v.plugin)] += 1;
            }
        });
        for (i, plugin) in Plugin::ALL.iter().enumerate() {
            self.total_volumes.with_label_values(&[plugin.name(), "desired_state_of_world"]).set(wanted[i]);
            self.total_volumes.with_label_values(&[plugin.name(), "actual_state_of_world"]).set(have[i]);
        }
    }
}
