//! The node's view for the HTTP servers: pods with live status, metrics, health and log files,
//! read from the engine's stores at request time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use nodelet_resources::pod::actual::{ContainerState, PodActual};
use nodelet_resources::pod::desired::{DesiredPod, PodUid};
use nodelet_resources::pod::reconciler::{Clock, PodReconciler};
use nodelet_resources::pod::status::{PodOpStatus, pod_status};
use prometheus::{Encoder, IntGauge, IntGaugeVec, Opts, Registry};
use reconcile_engine::Store;

use crate::server::NodeView;

/// Gauges computed at scrape time from the actual store.
struct ScrapeGauges {
    running_pods: IntGauge,
    running_containers: IntGaugeVec,
    desired_pods: IntGauge,
}

/// What the servers show of this node.
pub(crate) struct Node {
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    failures: Store<PodUid, PodOpStatus>,
    reconciler: PodReconciler,
    clock: Clock,
    registry: Registry,
    gauges: ScrapeGauges,
    pod_logs_dir: PathBuf,
    runtime_ready: Arc<AtomicBool>,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        desired: Store<PodUid, DesiredPod>,
        actual: Store<PodUid, PodActual>,
        failures: Store<PodUid, PodOpStatus>,
        reconciler: PodReconciler,
        clock: Clock,
        registry: Registry,
        pod_logs_dir: PathBuf,
        runtime_ready: Arc<AtomicBool>,
    ) -> Result<Self, prometheus::Error> {
        let gauges = ScrapeGauges {
            running_pods: IntGauge::new(
                "kubelet_running_pods",
                "Number of pods that have a running pod sandbox.",
            )?,
            running_containers: IntGaugeVec::new(
                Opts::new("kubelet_running_containers", "Number of containers currently running."),
                &["container_state"],
            )?,
            desired_pods: IntGauge::new(
                "kubelet_desired_pods",
                "The number of pods the kubelet is being instructed to run.",
            )?,
        };
        registry.register(Box::new(gauges.running_pods.clone()))?;
        registry.register(Box::new(gauges.running_containers.clone()))?;
        registry.register(Box::new(gauges.desired_pods.clone()))?;
        Ok(Self {
            desired,
            actual,
            failures,
            reconciler,
            clock,
            registry,
            gauges,
            pod_logs_dir,
            runtime_ready,
        })
    }

    /// The desired pod with this namespace and name.
    fn find(&self, namespace: &str, name: &str) -> Option<Arc<DesiredPod>> {
        let mut found = None;
        self.desired.for_each(|uid, pod| {
            if pod.namespace() == namespace && pod.name() == name {
                found = Some(uid.clone());
            }
        });
        found.and_then(|uid| self.desired.get(&uid))
    }
}

impl NodeView for Node {
    fn pods(&self) -> List<Pod> {
        let now = (self.clock)();
        let mut items: Vec<Pod> = self
            .desired
            .entries()
            .into_iter()
            .map(|(uid, desired)| {
                let actual = self.actual.get(&uid);
                let failure = self.failures.get(&uid);
                let mut pod = desired.pod.clone();
                pod.status =
                    Some(pod_status(&self.reconciler, &desired, actual.as_deref(), failure.as_deref(), now));
                pod
            })
            .collect();
        items.sort_by(|a, b| {
            (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
                .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
        });
        List { items, ..List::default() }
    }

    fn metrics(&self) -> String {
        let mut running_pods = 0;
        let mut states = [0_i64; 4];
        self.actual.for_each(|_, pod| {
            running_pods += i64::from(pod.sandbox().is_some_and(|s| s.ready));
            for c in &pod.containers {
                let i = match c.state {
                    ContainerState::Created => 0,
                    ContainerState::Running => 1,
                    ContainerState::Exited => 2,
                    ContainerState::Unknown => 3,
                };
                states[i] += 1;
            }
        });
        self.gauges.running_pods.set(running_pods);
        for (label, n) in ["created", "running", "exited", "unknown"].into_iter().zip(states) {
            self.gauges.running_containers.with_label_values(&[label]).set(n);
        }
        self.gauges.desired_pods.set(i64::try_from(self.desired.len()).unwrap_or(i64::MAX));
        let mut out = Vec::new();
        if let Err(e) = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn healthy(&self) -> Result<(), String> {
        if self.runtime_ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("container runtime is not ready".to_string())
        }
    }

    fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf> {
        let desired = self.find(namespace, pod)?;
        let actual = self.actual.get(&desired.uid().to_string())?;
        let record = actual.container(container)?;
        let dir = self.pod_logs_dir.join(format!("{namespace}_{pod}_{}", desired.uid()));
        Some(dir.join(container).join(format!("{}.log", record.restart_count)))
    }
}
