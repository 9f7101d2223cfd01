//! Prober metrics with the kubelet's names and labels (shared reference §4), in a registry of their own:
//! the kubelet serves them on `/metrics/probes`, not `/metrics`.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The `result` label values of `prober_probe_total`.
pub const RESULTS: [&str; 3] = ["successful", "failed", "unknown"];

/// The prober's metrics. Cheap to clone.
///
/// A series exists once its probe has run with that result (as the kubelet, no zero-valued series for
/// results that never happened); the prober deletes a pod's series when the pod leaves the desired
/// store ([`ProbeMetrics::forget`]).
#[derive(Debug, Clone)]
pub struct ProbeMetrics {
    /// `prober_probe_total{probe_type,result,container,pod,namespace,pod_uid}`: probe runs by result
    /// (`successful`, `failed`, `unknown` for a handler error or timeout).
    pub probe_total: IntCounterVec,
    /// `prober_probe_duration_seconds{probe_type,container,pod,namespace}`: how long probe runs take
    /// (the kubelet's labels: no `pod_uid` here).
    pub probe_duration: HistogramVec,
}

/// The labels of one probe of one container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProbeLabels {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: &'static str,
    /// The container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub pod_uid: String,
}

impl ProbeMetrics {
    /// Creates the metrics and registers them in `registry` (the one served on `/metrics/probes`).
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            probe_total: IntCounterVec::new(
                Opts::new(
                    "prober_probe_total",
                    "Cumulative number of a liveness, readiness or startup probe for a container by result.",
                ),
                &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
            )?,
            // The kubelet's buckets: the Prometheus defaults.
            probe_duration: HistogramVec::new(
                HistogramOpts::new(
                    "prober_probe_duration_seconds",
                    "Duration in seconds for a probe response.",
                ),
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

    /// Counts one run of the probe with `result` (one of [`RESULTS`]) that took `seconds`. As the
    /// kubelet, the duration of a `failed` run is not observed (only `successful` and `unknown` ones).
    pub fn observe(&self, labels: &ProbeLabels, result: &str, seconds: f64) {
        let l = labels;
        self.probe_total
            .with_label_values(&[l.probe_type, result, &l.container, &l.pod, &l.namespace, &l.pod_uid])
            .inc();
        if result == "failed" {
            return;
        }
        self.probe_duration
            .with_label_values(&[l.probe_type, &l.container, &l.pod, &l.namespace])
            .observe(seconds);
    }

    /// Deletes the series of the probe (every result), as the kubelet does when it stops a worker.
    pub fn forget(&self, labels: &ProbeLabels) {
        let l = labels;
        for result in RESULTS {
            // Err = the series never existed (the probe never had that result).
            let _ = self.probe_total.remove_label_values(&[
                l.probe_type,
                result,
                &l.container,
                &l.pod,
                &l.namespace,
                &l.pod_uid,
            ]);
        }
        let _ = self.probe_duration.remove_label_values(&[l.probe_type, &l.container, &l.pod, &l.namespace]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out)
            .unwrap_or_default();
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn series_carry_pod_uid_appear_on_use_and_go_when_forgotten() {
        let registry = Registry::new();
        let m = ProbeMetrics::new(&registry).expect("metrics");
        let labels = ProbeLabels {
            probe_type: "Readiness",
            container: "app".into(),
            pod: "web".into(),
            namespace: "default".into(),
            pod_uid: "u-1".into(),
        };
        assert!(!text(&registry).contains("prober_probe_total{"), "no series before a run");
        m.observe(&labels, "successful", 0.002);
        m.observe(&labels, "successful", 0.003);
        m.observe(&labels, "failed", 0.5);
        let t = text(&registry);
        assert!(
            t.contains(
                "prober_probe_total{container=\"app\",namespace=\"default\",pod=\"web\",pod_uid=\"u-1\",probe_type=\"Readiness\",result=\"successful\"} 2"
            ),
            "{t}"
        );
        assert!(t.contains("result=\"failed\"} 1"), "{t}");
        assert!(!t.contains("result=\"unknown\""), "no zero series for results that did not happen: {t}");
        assert!(
            t.contains(
                "prober_probe_duration_seconds_count{container=\"app\",namespace=\"default\",pod=\"web\",probe_type=\"Readiness\"} 2"
            ),
            "{t}"
        );
        m.forget(&labels);
        let t = text(&registry);
        assert!(
            !t.contains("prober_probe_total{") && !t.contains("prober_probe_duration_seconds_count{"),
            "{t}"
        );
    }
}
