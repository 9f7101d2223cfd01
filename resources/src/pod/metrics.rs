//! Pod metrics with the kubelet's names (see the shared reference, §10).

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The pod metrics kept live; gauges of running pods and containers are computed at scrape time
/// from the actual store.
#[derive(Debug, Clone)]
pub struct PodMetrics {
    /// `kubelet_pleg_relist_duration_seconds`.
    pub pleg_relist_duration: Histogram,
    /// `kubelet_pleg_relist_interval_seconds`.
    pub pleg_relist_interval: Histogram,
    /// `nodelet_pleg_pod_read_duration_seconds`: one read of the pods that runtime events named (the
    /// evented PLEG's update between relists), however many pods it read.
    pub pleg_pod_read_duration: Histogram,
    /// `nodelet_evented_pleg_connections_total{result}`: subscriptions to the runtime's events that
    /// became active (`success`: the first and every one after a break) or broke (`error`). The
    /// kubelet's `kubelet_evented_pleg_connection_{success,error}_count`, named as Prometheus wants
    /// a counter.
    pub evented_pleg_connections: IntCounterVec,
    /// `nodelet_evented_pleg_source{source}`: 1 for the runtime event stream the PLEG follows now, 0 for the
    /// others: `cri` (CRI `GetContainerEvents`), `containerd` (containerd's own event service, on runtimes
    /// without CRI events), `none` (no stream active: the PLEG relists every `plegRelistPeriod`). Set with
    /// [`PodMetrics::set_event_source`].
    pub evented_pleg_source: IntGaugeVec,
    /// `kubelet_started_containers_total{container_type}`: container starts attempted (counted before
    /// the start, as the kubelet), `container_type` from [`container_type`].
    pub started_containers: IntCounterVec,
    /// `kubelet_started_containers_errors_total{container_type,code}`: starts that failed, `code` the
    /// kubelet's reason (`ErrImagePull`, `CreateContainerError`, `RunContainerError`…).
    pub started_containers_errors: IntCounterVec,
    /// `kubelet_pod_start_duration_seconds`: from the creation of a pod's first sandbox to all its app
    /// containers running (first start only).
    pub pod_start_duration: Histogram,
    /// `kubelet_pod_worker_duration_seconds{operation_type}`: one pod operation, labelled as the
    /// kubelet's sync types: `update` (start, kill or resize containers), `kill` (all of the pod's
    /// containers), `sync` (refresh). Sandboxes are the sandbox pair's
    /// ([`crate::sandbox::metrics`]).
    pub pod_worker_duration: HistogramVec,
}

/// The `source` label of `nodelet_evented_pleg_source` when no runtime event stream is active.
pub const EVENT_SOURCE_NONE: &str = "none";

/// Every `source` label of `nodelet_evented_pleg_source`: the runtime event streams (`cri`, `containerd`) and
/// [`EVENT_SOURCE_NONE`].
pub const EVENT_SOURCES: [&str; 3] = ["cri", "containerd", EVENT_SOURCE_NONE];

/// The `container_type` label of the container-start metrics: `container`, `init_container` or
/// `ephemeral_container` (the kubelet's values).
pub fn container_type(kind: super::driver::ContainerKind) -> &'static str {
    match kind {
        super::driver::ContainerKind::App => "container",
        super::driver::ContainerKind::Init => "init_container",
        super::driver::ContainerKind::Ephemeral => "ephemeral_container",
    }
}

/// The kubelet's buckets of `kubelet_pod_start_duration_seconds`.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0,
    480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

const PLEG_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Buckets of the evented PLEG's pod reads: a few pods, so finer at the low end.
const POD_READ_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

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
            pleg_pod_read_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "nodelet_pleg_pod_read_duration_seconds",
                    "Duration in seconds for reading the pods that runtime events named, between relists.",
                )
                .buckets(POD_READ_BUCKETS.to_vec()),
            )?,
            evented_pleg_connections: IntCounterVec::new(
                Opts::new(
                    "nodelet_evented_pleg_connections_total",
                    "Subscriptions to the runtime's event stream that became active (success) or broke (error).",
                ),
                &["result"],
            )?,
            evented_pleg_source: IntGaugeVec::new(
                Opts::new(
                    "nodelet_evented_pleg_source",
                    "The runtime event stream the PLEG follows (1): cri, containerd, or none (relisting only).",
                ),
                &["source"],
            )?,
            started_containers: IntCounterVec::new(
                Opts::new("kubelet_started_containers_total", "Cumulative number of containers started"),
                &["container_type"],
            )?,
            started_containers_errors: IntCounterVec::new(
                Opts::new(
                    "kubelet_started_containers_errors_total",
                    "Cumulative number of errors when starting containers",
                ),
                &["container_type", "code"],
            )?,
            pod_start_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "kubelet_pod_start_duration_seconds",
                    "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
                )
                .buckets(POD_START_BUCKETS.to_vec()),
            )?,
            pod_worker_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_pod_worker_duration_seconds",
                    "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
                ),
                &["operation_type"],
            )?,
        };
        registry.register(Box::new(m.pod_start_duration.clone()))?;
        registry.register(Box::new(m.pod_worker_duration.clone()))?;
        registry.register(Box::new(m.pleg_relist_duration.clone()))?;
        registry.register(Box::new(m.pleg_relist_interval.clone()))?;
        registry.register(Box::new(m.pleg_pod_read_duration.clone()))?;
        registry.register(Box::new(m.evented_pleg_connections.clone()))?;
        for result in ["success", "error"] {
            m.evented_pleg_connections.with_label_values(&[result]);
        }
        registry.register(Box::new(m.evented_pleg_source.clone()))?;
        m.set_event_source(EVENT_SOURCE_NONE);
        registry.register(Box::new(m.started_containers.clone()))?;
        registry.register(Box::new(m.started_containers_errors.clone()))?;
        Ok(m)
    }

    /// Marks `source` (one of [`EVENT_SOURCES`]) as the event stream the PLEG follows in
    /// `nodelet_evented_pleg_source`, the others 0.
    pub fn set_event_source(&self, source: &str) {
        for s in EVENT_SOURCES {
            self.evented_pleg_source.with_label_values(&[s]).set(i64::from(s == source));
        }
    }

    /// Metrics registered nowhere (for tests).
    pub fn unregistered() -> Self {
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }
}
