//! The image pair's metric, the kubelet's `kubelet_image_garbage_collected_total{reason}` (the
//! engine adds its own operation metrics under the reconciler name `images`).

use prometheus::{IntCounterVec, Opts, Registry};

/// `kubelet_image_garbage_collected_total{reason}`.
#[derive(Debug, Clone)]
pub struct ImageGcMetrics {
    /// Images removed, by reason (`age`, `space`).
    pub collected: IntCounterVec,
}

impl ImageGcMetrics {
    /// Registers the metrics in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let collected = Self::unregistered()?.collected;
        registry.register(Box::new(collected.clone()))?;
        Ok(Self { collected })
    }

    /// The metrics, registered nowhere (tests).
    pub fn unregistered() -> Result<Self, prometheus::Error> {
        let collected = IntCounterVec::new(
            Opts::new(
                "kubelet_image_garbage_collected_total",
                "Total number of images garbage collected by the kubelet, whether through disk usage or image \
                 age.",
            ),
            &["reason"],
        )?;
        Ok(Self { collected })
    }
}
