//! The node's view for the HTTP servers: pods with live status, metrics, health and log files,
//! read from the engine's stores at request time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodelet_resources::common::clock::Clock;
use nodelet_resources::model::actual::{ContainerState, PodActual, PodSandboxes};
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::pod::reconciler::PodReconciler;
use nodelet_resources::pod::status::{PodOpStatus, pod_status};
use nodelet_resources::sandbox::ops::SandboxOp;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey, is_device_key, split_key};
use nodelet_resources::volume::driver::VolumeError;
use nodelet_resources::volume::metrics::VolumeMetrics;
use nodelet_resources::volume::ops::VolumeOp;
use prometheus::{Encoder, IntGauge, IntGaugeVec, Opts, Registry};
use reconcile_engine::{OpError, OpStatus, Store};

use crate::server::checkpoint::{CheckpointTarget, CheckpointTargetError};
use crate::server::{NodeView, StreamTarget, StreamTargetError};
use crate::sources::SourceProblems;

/// Gauges computed at scrape time from the actual store.
#[derive(Clone)]
struct ScrapeGauges {
    running_pods: IntGauge,
    running_containers: IntGaugeVec,
    /// `kubelet_desired_pods{static}`: `static` is `true` for pods not from the API server.
    desired_pods: IntGaugeVec,
}

impl ScrapeGauges {
    /// The gauges, registered in `registry`.
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let gauges = ScrapeGauges {
            running_pods: IntGauge::new(
                "kubelet_running_pods",
                "Number of pods that have a running pod sandbox.",
            )?,
            running_containers: IntGaugeVec::new(
                Opts::new("kubelet_running_containers", "Number of containers currently running."),
                &["container_state"],
            )?,
            desired_pods: IntGaugeVec::new(
                Opts::new(
                    "kubelet_desired_pods",
                    "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
                ),
                &["static"],
            )?,
        };
        registry.register(Box::new(gauges.running_pods.clone()))?;
        registry.register(Box::new(gauges.running_containers.clone()))?;
        registry.register(Box::new(gauges.desired_pods.clone()))?;
        Ok(gauges)
    }
}

/// The volume engine's stores, for events and metrics.
pub(crate) struct VolumeView {
    pub(crate) desired: Store<VolumeKey, DesiredVolume>,
    pub(crate) actual: Store<VolumeKey, VolumeActual>,
    pub(crate) failures: Store<VolumeKey, OpStatus<VolumeOp, VolumeError>>,
    pub(crate) metrics: VolumeMetrics,
}

/// What the servers show of this node.
pub(crate) struct Node {
    stats: Option<nodelet_stats::StatsProvider>,
    pressure: Option<crate::pressure::PressureState>,
    /// When this nodelet started (wall-clock nanoseconds), the node's creation time.
    started: i64,
    volumes: Option<VolumeView>,
    claims: Option<(
        nodelet_resources::claim::status::ClaimView,
        nodelet_resources::claim::metrics::ClaimMetrics,
    )>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    failures: Store<PodUid, PodOpStatus>,
    reconciler: PodReconciler,
    /// The side inputs of the pod engine's reconciler, for status.
    inputs: nodelet_resources::pod::reconciler::PodInputs,
    clock: Clock,
    registry: Registry,
    /// The registry of `/metrics/probes` (the prober's metrics).
    probe_registry: Option<Registry>,
    gauges: ScrapeGauges,
    pod_logs_dir: PathBuf,
    runtime_ready: Arc<AtomicBool>,
    problems: SourceProblems,
    node_name: String,
    /// What the `Node` shows of the machine (read once at start-up).
    facts: Option<Arc<nodelet_node::node_facts::NodeFacts>>,
    /// The registered CSI drivers (for the CSINode).
    csi: Option<Arc<nodelet_csi::Registry>>,
    /// The pod config, which `nodelet debug` adds ephemeral containers of static pods to.
    pod_config: Option<crate::sources::PodConfig>,
    /// The effective configuration for `/configz`.
    configz: Option<serde_json::Value>,
    /// What happened to each container's image (`Pulling`/`Pulled` events).
    pulls: Option<nodelet_cri::images::PullRecords>,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        desired: Store<PodUid, DesiredPod>,
        actual: Store<PodUid, PodActual>,
        failures: Store<PodUid, PodOpStatus>,
        reconciler: PodReconciler,
        inputs: nodelet_resources::pod::reconciler::PodInputs,
        clock: Clock,
        metrics: &crate::daemon::MetricFamilies,
        pod_logs_dir: PathBuf,
        runtime_ready: Arc<AtomicBool>,
        problems: SourceProblems,
        node_name: String,
    ) -> Result<Self, prometheus::Error> {
        let gauges = metrics.get(ScrapeGauges::new)?;
        let registry = metrics.registry().clone();
        Ok(Self {
            stats: None,
            pressure: None,
            started: clock(),
            volumes: None,
            claims: None,
            desired,
            actual,
            failures,
            reconciler,
            inputs,
            clock,
            registry,
            probe_registry: None,
            gauges,
            pod_logs_dir,
            runtime_ready,
            problems,
            node_name,
            facts: None,
            csi: None,
            pod_config: None,
            configz: None,
            pulls: None,
        })
    }

    /// Lets `POST /debug/{namespace}/{pod}` add ephemeral containers to static pods through `pod_config`.
    pub(crate) fn with_pod_config(mut self, pod_config: crate::sources::PodConfig) -> Self {
        self.pod_config = Some(pod_config);
        self
    }

    /// Serves `configz` (the effective configuration, [`crate::config::configz::configz`]) on `/configz`.
    pub(crate) fn with_configz(mut self, configz: serde_json::Value) -> Self {
        self.configz = Some(configz);
        self
    }

    /// Reports the runtime's image pulls as the kubelet's `Pulling` and `Pulled` events.
    pub(crate) fn with_pulls(mut self, pulls: nodelet_cri::images::PullRecords) -> Self {
        self.pulls = Some(pulls);
        self
    }

    /// Shows the machine's capacity, addresses and system information on `/api/v1/nodes`.
    pub(crate) fn with_facts(mut self, facts: Arc<nodelet_node::node_facts::NodeFacts>) -> Self {
        self.facts = Some(facts);
        self
    }

    /// Shows the registered CSI drivers as this node's CSINode.
    pub(crate) fn with_csi(mut self, registry: Arc<nodelet_csi::Registry>) -> Self {
        self.csi = Some(registry);
        self
    }

    /// Shows the node's pressure conditions (`/api/v1/nodes`) and the eviction and image GC events.
    pub(crate) fn with_pressure(mut self, pressure: crate::pressure::PressureState) -> Self {
        self.pressure = Some(pressure);
        self
    }

    /// Eviction and image GC events: on pods (`Evicted`) and on the node.
    fn pressure_events(&self, items: &mut Vec<Event>) {
        use nodelet_resources::common::events::Involved;
        let Some(p) = &self.pressure else { return };
        for e in p.events.list() {
            let mut event = match &e.involved {
                Involved::Pod { namespace, name, uid } => {
                    self.event(&e.reason, namespace, name, Some(uid), e.message.clone(), e.count)
                }
                Involved::Node => {
                    let mut event =
                        self.event(&e.reason, "default", &self.node_name, None, e.message.clone(), e.count);
                    event.involved_object.kind = Some("Node".to_owned());
                    event.involved_object.namespace = None;
                    event.involved_object.uid = Some(self.node_name.clone());
                    event
                }
            };
            let suffix = format!("{:x}", e.first);
            event.metadata.name =
                Some(format!("{}.{}", event.metadata.name.as_deref().unwrap_or_default(), suffix));
            event.type_ = Some(e.type_.to_owned());
            event.first_timestamp = nodelet_resources::common::time::time(e.first);
            event.last_timestamp = nodelet_resources::common::time::time(e.last);
            items.push(event);
        }
    }

    /// Serves `/metrics/probes` from `registry` (where the prober's metrics are registered).
    pub(crate) fn with_probe_registry(mut self, registry: Registry) -> Self {
        self.probe_registry = Some(registry);
        self
    }

    /// Serves `/stats/summary`, `/metrics/resource` and `/metrics/cadvisor` from `stats`.
    pub(crate) fn with_stats(mut self, stats: nodelet_stats::StatsProvider) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Shows the volume engine's failures as events and its gauges as metrics.
    pub(crate) fn with_volumes(mut self, volumes: VolumeView) -> Self {
        self.volumes = Some(volumes);
        self
    }

    /// Shows PersistentVolumes and claims, their events and metrics.
    pub(crate) fn with_claims(
        mut self,
        view: nodelet_resources::claim::status::ClaimView,
        metrics: nodelet_resources::claim::metrics::ClaimMetrics,
    ) -> Self {
        self.claims = Some((view, metrics));
        self
    }

    /// Claims that cannot bind (and why), volumes whose reclaim failed.
    fn claim_events(&self, items: &mut Vec<Event>) {
        let Some((view, _)) = &self.claims else { return };
        for e in view.events() {
            let mut event = self.event(&e.reason, &e.namespace, &e.name, None, e.message, 1);
            event.involved_object.kind = Some(e.kind.to_string());
            if e.namespace.is_empty() {
                event.involved_object.namespace = None;
                event.metadata.namespace = Some("default".to_string());
            }
            event.type_ = Some(e.type_.to_string());
            items.push(event);
        }
    }

    /// Events of failed sandbox operations: `FailedCreatePodSandBox` in the kubelet's words for a
    /// sandbox that could not be made, the runtime's reason otherwise.
    fn sandbox_events(&self, items: &mut Vec<Event>) {
        let Some(view) = self.reconciler.sandboxes(&self.inputs) else { return };
        for (uid, failure) in view.failures() {
            let (namespace, name) = match (self.desired.get(&uid), view.of(&uid)) {
                (Some(d), _) => (d.namespace().to_string(), d.name().to_string()),
                (None, Some(a)) => (a.namespace.clone(), a.name.clone()),
                (None, None) => continue,
            };
            let kind = reconcile_engine::Operation::kind(&failure.op);
            let (reason, message) = match (&failure.op, &failure.error) {
                (SandboxOp::Create { .. }, OpError::Driver(e)) => {
                    ("FailedCreatePodSandBox", format!("Failed to create pod sandbox: {}", e.message))
                }
                (_, OpError::Driver(e)) => (e.reason, format!("{kind} failed: {}", failure.error)),
                (_, OpError::TimedOut(_)) => ("Timeout", format!("{kind} failed: {}", failure.error)),
            };
            items.push(self.event(reason, &namespace, &name, Some(&uid), message, failure.failures));
        }
    }

    /// `FailedMount` events: volumes whose content cannot be made and failed volume operations. A
    /// volume that waits for something under way (a service-account token being requested) is no
    /// failure: no event, as the kubelet, whose SetUp asks for the token synchronously, sends none.
    fn volume_events(&self, items: &mut Vec<Event>) {
        let Some(v) = &self.volumes else { return };
        for (_, volume) in v.desired.entries() {
            if let Some(message) = render_failure(&volume) {
                items.push(self.event(
                    "FailedMount",
                    &volume.namespace,
                    &volume.pod_name,
                    Some(&volume.pod_uid),
                    message,
                    1,
                ));
            }
        }
        let desired = v.desired.entries();
        for (key, failure) in v.failures.entries() {
            if is_device_key(&key) {
                // A device step failed: every pod waiting for the device hears of it.
                let (reason, what) = match failure.op {
                    VolumeOp::Attach { .. } | VolumeOp::Detach { .. } => {
                        ("FailedAttachVolume", "AttachVolume")
                    }
                    VolumeOp::Unstage { .. } => ("FailedUnMount", "UnmountDevice"),
                    _ => ("FailedMount", "MountVolume.MountDevice"),
                };
                for (_, volume) in
                    desired.iter().filter(|(_, d)| d.device().is_some_and(|dev| dev.key() == key))
                {
                    let message = format!("{what} failed for volume {:?} : {}", volume.name, failure.error);
                    items.push(self.event(
                        reason,
                        &volume.namespace,
                        &volume.pod_name,
                        Some(&volume.pod_uid),
                        message,
                        failure.failures,
                    ));
                }
                continue;
            }
            let Some((uid, name)) = split_key(&key) else { continue };
            let (namespace, pod) = match (v.desired.get(&key), self.actual.get(&uid.to_owned())) {
                (Some(d), _) => (d.namespace.clone(), d.pod_name.clone()),
                (None, Some(a)) => (a.namespace.clone(), a.name.clone()),
                (None, None) => continue,
            };
            let (reason, what) = match failure.op {
                VolumeOp::TearDown { .. } => ("FailedUnMount", "UnmountVolume.TearDown"),
                _ => ("FailedMount", "MountVolume.SetUp"),
            };
            let message = format!("{what} failed for volume {name:?} : {}", failure.error);
            items.push(self.event(reason, &namespace, &pod, Some(uid), message, failure.failures));
        }
    }

    fn event(
        &self,
        reason: &str,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        message: String,
        count: u32,
    ) -> Event {
        let suffix = uid.unwrap_or(reason);
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{}", suffix.chars().take(16).collect::<String>())),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".to_string()),
                api_version: Some("v1".to_string()),
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                uid: uid.map(str::to_string),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some("Warning".to_string()),
            count: Some(i32::try_from(count).unwrap_or(i32::MAX)),
            source: Some(EventSource {
                component: Some("nodelet".to_string()),
                host: Some(self.node_name.clone()),
            }),
            reporting_component: Some("nodelet".to_string()),
            reporting_instance: Some(self.node_name.clone()),
            ..Event::default()
        }
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

/// The registry's metrics in the Prometheus text format.
fn encode(registry: &Registry) -> String {
    let mut out = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!(error = %e, "could not encode metrics");
    }
    String::from_utf8(out).unwrap_or_default()
}

impl Node {
    /// Each desired pod, borrowed from `desired`, with its live status and, for a static pod, the time
    /// nodelet first saw it (`kubernetes.io/config.seen`) as its creation time.
    fn pod_entries<'a>(
        &self,
        desired: &'a [(PodUid, Arc<DesiredPod>)],
    ) -> Vec<crate::server::pod_list::PodEntry<'a>> {
        let now = (self.clock)();
        desired
            .iter()
            .map(|(uid, desired)| {
                let actual = self.actual.get(uid);
                let failure = self.failures.get(uid);
                let meta = &desired.pod.metadata;
                let created = meta
                    .annotations
                    .as_ref()
                    .filter(|_| meta.creation_timestamp.is_none())
                    .and_then(|a| a.get("kubernetes.io/config.seen"))
                    .and_then(|seen| seen.parse().ok())
                    .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
                let status = pod_status(
                    &self.reconciler,
                    &self.inputs,
                    desired,
                    actual.as_deref(),
                    failure.as_deref(),
                    now,
                );
                crate::server::pod_list::PodEntry { pod: &desired.pod, created, status }
            })
            .collect()
    }
}

/// The pod of `entry` as `/pods` serves it: with its status and its creation time.
fn served_pod(entry: crate::server::pod_list::PodEntry<'_>) -> Pod {
    let mut pod = entry.pod.clone();
    if pod.metadata.creation_timestamp.is_none() {
        pod.metadata.creation_timestamp = entry.created;
    }
    pod.status = Some(entry.status);
    pod
}

impl NodeView for Node {
    fn add_ephemeral_container(
        &self,
        namespace: &str,
        pod: &str,
        container: k8s_openapi::api::core::v1::EphemeralContainer,
    ) -> Result<(), crate::sources::debug::DebugError> {
        match &self.pod_config {
            Some(config) => config.add_ephemeral_container(namespace, pod, container),
            None => Err(crate::sources::debug::DebugError::NotSupported),
        }
    }

    fn pods(&self) -> List<Pod> {
        let desired = self.desired.entries();
        let mut entries = self.pod_entries(&desired);
        crate::server::pod_list::sort(&mut entries);
        let items = entries.into_iter().map(served_pod).collect();
        List { items, ..List::default() }
    }

    fn pod(&self, uid: &str) -> Option<Pod> {
        let uid = uid.to_owned();
        let desired = self.desired.get(&uid)?;
        self.pod_entries(&[(uid, desired)]).into_iter().next().map(served_pod)
    }

    fn pods_json(&self) -> serde_json::Result<Vec<u8>> {
        crate::server::pod_list::encode(self.pod_entries(&self.desired.entries()))
    }

    fn running_pods(&self) -> List<Pod> {
        let view = self.reconciler.sandboxes(&self.inputs);
        let mut items: Vec<Pod> = self
            .actual
            .entries()
            .into_iter()
            .filter_map(|(uid, actual)| running_pod(&actual, view.and_then(|v| v.of(&uid)).as_deref()))
            .collect();
        items.sort_by(|a, b| {
            (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
                .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
        });
        List { items, ..List::default() }
    }

    fn configz(&self) -> Option<serde_json::Value> {
        self.configz.clone()
    }

    fn events(&self) -> List<Event> {
        let mut items = Vec::new();
        for problem in self.problems.list().iter() {
            let (namespace, name) = match problem.object.as_deref().and_then(|o| o.split_once('/')) {
                Some((ns, name)) => (ns.to_string(), name.to_string()),
                None => ("default".to_string(), problem.location.clone()),
            };
            items.push(self.event("InvalidManifest", &namespace, &name, None, problem.to_string(), 1));
        }
        for (uid, failure) in self.failures.entries() {
            let (namespace, name) = match (self.desired.get(&uid), self.actual.get(&uid)) {
                (Some(d), _) => (d.namespace().to_string(), d.name().to_string()),
                (None, Some(a)) => (a.namespace.clone(), a.name.clone()),
                (None, None) => continue,
            };
            let (reason, message) = match (&failure.op, &failure.error) {
                (op, OpError::Driver(e)) => {
                    (e.reason, format!("{} failed: {}", reconcile_engine::Operation::kind(op), failure.error))
                }
                (op, OpError::TimedOut(_)) => (
                    "Timeout",
                    format!("{} failed: {}", reconcile_engine::Operation::kind(op), failure.error),
                ),
            };
            items.push(self.event(reason, &namespace, &name, Some(&uid), message, failure.failures));
        }
        self.sandbox_events(&mut items);
        self.volume_events(&mut items);
        self.claim_events(&mut items);
        self.probe_events(&mut items);
        self.pull_events(&mut items);
        self.lifecycle_events(&mut items);
        self.oom_events(&mut items);
        self.pressure_events(&mut items);
        List { items, ..List::default() }
    }

    /// The sum (wrapping) of the change counters of everything [`Self::events`] reads: the pod
    /// stores, the engine's failures and side inputs (sandboxes, verdicts, volumes), the volume and
    /// claim engines' stores, the probe results, the image pull records, the pressure events and
    /// the sources' problems. Each counter is bumped after its change lands and only grows, so
    /// any change makes a new sum.
    fn events_generation(&self) -> Option<u64> {
        let volumes = self
            .volumes
            .as_ref()
            .map(|v| v.desired.version().wrapping_add(v.actual.version()).wrapping_add(v.failures.version()));
        let counters = [
            Some(self.desired.version()),
            Some(self.actual.version()),
            Some(self.failures.version()),
            Some(self.inputs.version()),
            Some(self.problems.version()),
            volumes,
            self.claims.as_ref().map(|(view, _)| view.version()),
            self.reconciler.probes().map(Store::version),
            self.pulls.as_ref().map(nodelet_cri::images::PullRecords::version),
            self.pressure.as_ref().map(|p| p.events.version()),
        ];
        Some(counters.into_iter().flatten().fold(0, u64::wrapping_add))
    }

    fn metrics(&self) -> String {
        let mut running_pods = 0;
        let mut states = [0_i64; 4];
        // Pods with a ready sandbox, as the sandbox pair's actual store has them.
        if let Some(view) = self.reconciler.sandboxes(&self.inputs) {
            view.actual().for_each(|_, pod| running_pods += i64::from(pod.ready().is_some()));
        }
        self.actual.for_each(|_, pod| {
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
        let mut desired = [0_i64; 2];
        self.desired.for_each(|_, pod| {
            desired[usize::from(pod.source != PodSource::Api)] += 1;
        });
        for (label, n) in ["false", "true"].into_iter().zip(desired) {
            self.gauges.desired_pods.with_label_values(&[label]).set(n);
        }
        if let Some(v) = &self.volumes {
            v.metrics.refresh(&v.desired, &v.actual);
        }
        if let Some((view, metrics)) = &self.claims {
            metrics.refresh(view.desired(), view.actual());
        }
        encode(&self.registry)
    }

    fn probe_metrics(&self) -> String {
        self.probe_registry.as_ref().map(encode).unwrap_or_default()
    }

    fn machine(&self) -> nodelet_stats::cadvisor::Machine {
        let Some(facts) = &self.facts else { return nodelet_stats::cadvisor::Machine::default() };
        let capacity = |name: &str| {
            facts
                .capacity
                .get(name)
                .and_then(|q| nodelet_resources::quantity::Quantity::parse(&q.0))
                .and_then(|q| u64::try_from(q.scaled_ceil(1)).ok())
        };
        nodelet_stats::cadvisor::Machine {
            cpu_cores: capacity("cpu"),
            memory_bytes: capacity("memory"),
            boot_id: facts.boot_id.clone(),
            machine_id: facts.machine_id.clone(),
            system_uuid: facts.system_uuid.clone(),
        }
    }

    fn stats_summary(
        &self,
    ) -> impl Future<Output = Result<nodelet_stats::summary::Summary, nodelet_stats::StatsError>> + Send {
        let stats = self.stats.clone();
        async move {
            match stats {
                Some(stats) => stats.summary().await,
                None => Err(nodelet_stats::StatsError::Task("stats are not available".to_owned())),
            }
        }
    }

    fn persistent_volumes(&self) -> List<k8s_openapi::api::core::v1::PersistentVolume> {
        let items = self.claims.as_ref().map(|(v, _)| v.persistent_volumes()).unwrap_or_default();
        List { items, ..List::default() }
    }

    fn persistent_volume_claims(&self) -> List<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
        let items = self.claims.as_ref().map(|(v, _)| v.persistent_volume_claims()).unwrap_or_default();
        List { items, ..List::default() }
    }

    fn nodes(&self) -> List<k8s_openapi::api::core::v1::Node> {
        let node = crate::pressure::node_object(
            &self.node_name,
            self.facts.as_deref(),
            self.pressure.as_ref().map(|p| &p.view),
            &self.runtime_ready,
            self.started,
            (self.clock)(),
        );
        let mut node = node;
        if let (Some(v), Some(status)) = (&self.volumes, node.status.as_mut()) {
            // CSI devices, named as the kubelet names them (`kubernetes.io/csi/<driver>^<handle>`):
            // in use once staged (or being staged), attached once ControllerPublish succeeded.
            use nodelet_resources::volume::actual::{CsiActual, Step};
            let mut in_use = Vec::new();
            let mut attached = Vec::new();
            v.actual.for_each(|_, volume| {
                if let Some(CsiActual::Device(d)) = volume.csi.as_deref() {
                    let name = format!("kubernetes.io/csi/{}^{}", d.driver, d.volume_handle);
                    if d.stage != Step::NotDone {
                        in_use.push(name.clone());
                    }
                    if d.attach == Step::Done {
                        attached.push(k8s_openapi::api::core::v1::AttachedVolume {
                            name,
                            device_path: String::new(),
                        });
                    }
                }
            });
            in_use.sort();
            attached.sort_by(|a, b| a.name.cmp(&b.name));
            status.volumes_in_use = (!in_use.is_empty()).then_some(in_use);
            status.volumes_attached = (!attached.is_empty()).then_some(attached);
        }
        List { items: vec![node], ..List::default() }
    }

    fn csi_nodes(&self) -> List<k8s_openapi::api::storage::v1::CSINode> {
        let Some(csi) = &self.csi else { return List::default() };
        let mut node = crate::cluster::csinode::csi_node(&self.node_name, &csi.drivers());
        node.metadata.creation_timestamp = nodelet_resources::common::time::time(self.started);
        List { items: vec![node], ..List::default() }
    }

    fn storage_classes(&self) -> List<k8s_openapi::api::storage::v1::StorageClass> {
        let items = self.claims.as_ref().map(|(v, _)| v.storage_classes()).unwrap_or_default();
        List { items, ..List::default() }
    }

    fn healthy(&self) -> Result<(), crate::server::Unhealthy> {
        if self.runtime_ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(crate::server::Unhealthy::RuntimeNotReady)
        }
    }

    fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf> {
        let desired = self.find(namespace, pod)?;
        let actual = self.actual.get(&desired.uid().to_string())?;
        let record = actual.container(container)?;
        let dir = self.pod_logs_dir.join(format!("{namespace}_{pod}_{}", desired.uid()));
        Some(dir.join(container).join(format!("{}.log", record.restart_count)))
    }

    fn stream_target(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        container: Option<&str>,
    ) -> Result<StreamTarget, StreamTargetError> {
        let desired = self.find(namespace, pod).ok_or(StreamTargetError::PodNotFound)?;
        let pod_uid = desired.uid().to_string();
        if uid.is_some_and(|u| u != pod_uid) {
            return Err(StreamTargetError::UidMismatch);
        }
        let Some(container) = container else {
            // The pod's newest sandbox, as the sandbox pair's actual store has it.
            let sandboxes = self.reconciler.sandboxes(&self.inputs).and_then(|view| view.of(&pod_uid));
            let sandbox =
                sandboxes.as_deref().and_then(PodSandboxes::newest).ok_or(StreamTargetError::NoSandbox)?;
            return Ok(StreamTarget { sandbox_id: sandbox.id.clone(), container_id: None });
        };
        let actual = self.actual.get(&pod_uid);
        let record = actual
            .as_deref()
            .and_then(|a| a.container(container))
            .ok_or(StreamTargetError::ContainerNotFound)?;
        if record.state != ContainerState::Running {
            return Err(StreamTargetError::NotRunning);
        }
        Ok(StreamTarget { sandbox_id: record.sandbox_id.clone(), container_id: Some(record.id.clone()) })
    }

    fn checkpoint_target(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<CheckpointTarget, CheckpointTargetError> {
        let desired = self.find(namespace, pod).ok_or(CheckpointTargetError::PodNotFound)?;
        let in_spec =
            desired.containers().iter().chain(desired.init_containers()).any(|c| c.name == container)
                || desired.ephemeral_specs().iter().any(|c| c.name == container);
        if !in_spec {
            return Err(CheckpointTargetError::NoSuchContainer);
        }
        let pod_uid = desired.uid().to_string();
        let actual = self.actual.get(&pod_uid);
        let record = actual
            .as_deref()
            .and_then(|a| a.container(container))
            .filter(|r| r.state == ContainerState::Running)
            .ok_or(CheckpointTargetError::NotRunning)?;
        Ok(CheckpointTarget { pod_uid, container_id: record.id.clone() })
    }
}

/// A pod as the kubelet's `/runningpods/` shows it (`kubecontainer.Pod.ToAPIPod` of the runtime's
/// running pods): only when it has a ready sandbox (in `sandboxes`, the sandbox pair's record of it) or a
/// running container; name, namespace and uid, and its running containers with their name and image.
fn running_pod(actual: &PodActual, sandboxes: Option<&PodSandboxes>) -> Option<Pod> {
    let ready = sandboxes.is_some_and(|s| s.sandboxes.iter().any(|s| s.ready));
    let containers: Vec<k8s_openapi::api::core::v1::Container> = actual
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
        .map(|c| k8s_openapi::api::core::v1::Container {
            name: c.name.clone(),
            image: Some(c.image.clone()),
            ..Default::default()
        })
        .collect();
    if !ready && containers.is_empty() {
        return None;
    }
    Some(Pod {
        metadata: ObjectMeta {
            name: Some(actual.name.clone()),
            namespace: Some(actual.namespace.clone()),
            uid: Some(actual.uid.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec { containers, ..Default::default() }),
        ..Pod::default()
    })
}

impl Node {
    /// The container lifecycle events the kubelet records, derived from what the runtime has:
    /// `Created` and `Started` (Normal) for each container, counted over its attempts, `Killing`
    /// (Normal) for the containers of a pod being deleted through the API, and `BackOff` (Warning)
    /// while a container waits in CrashLoopBackOff, counted over its restarts.
    fn lifecycle_events(&self, items: &mut Vec<Event>) {
        let now = (self.clock)();
        for (uid, pod) in self.actual.entries() {
            let Some(desired) = self.desired.get(&uid) else { continue };
            let status = pod_status(&self.reconciler, &self.inputs, &desired, Some(&pod), None, now);
            let backing_off: Vec<&str> = status
                .container_statuses
                .iter()
                .flatten()
                .chain(status.init_container_statuses.iter().flatten())
                .filter(|c| {
                    c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
                })
                .map(|c| c.name.as_str())
                .collect();
            let mut names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                let Some(newest) = pod.container(name) else { continue };
                let attempts = newest.restart_count.saturating_add(1);
                let mut push = |reason: &str, kind: &str, message: String, count: u32, at: i64| {
                    let mut event = self.event(reason, &pod.namespace, &pod.name, Some(&uid), message, count);
                    event.metadata.name =
                        Some(format!("{}.{name}.{}", pod.name, reason.to_ascii_lowercase()));
                    event.type_ = Some(kind.to_owned());
                    event.involved_object.field_path = Some(format!("spec.containers{{{name}}}"));
                    event.last_timestamp = nodelet_resources::common::time::time(at);
                    items.push(event);
                };
                if newest.created_at > 0 {
                    push(
                        "Created",
                        "Normal",
                        format!("Created container {name}"),
                        attempts,
                        newest.created_at,
                    );
                }
                if newest.started_at > 0 {
                    push(
                        "Started",
                        "Normal",
                        format!("Started container {name}"),
                        attempts,
                        newest.started_at,
                    );
                }
                if desired.deletion_grace().is_some() {
                    push("Killing", "Normal", format!("Stopping container {name}"), 1, now);
                }
                if backing_off.contains(&name) {
                    let message = format!(
                        "Back-off restarting failed container {name} in pod {}_{}({uid})",
                        pod.name, pod.namespace
                    );
                    push("BackOff", "Warning", message, newest.restart_count.max(1), now);
                }
            }
        }
    }

    /// The kubelet's image events (Normal), from the runtime's record of each container's last image
    /// check: `Pulling` (`Pulling image "x"`) when a pull started, `Pulled` when it ended
    /// (`Successfully pulled image "x" in 1.2s (1.2s including waiting)`) or
    /// when no pull was needed (`Container image "x" already present on machine`). Records of pods
    /// that are gone are dropped here.
    fn pull_events(&self, items: &mut Vec<Event>) {
        use nodelet_cri::images::PullRecord;
        let Some(pulls) = &self.pulls else { return };
        let owner = |uid: &str| -> Option<(String, String)> {
            let uid = uid.to_owned();
            match (self.desired.get(&uid), self.actual.get(&uid)) {
                (Some(d), _) => Some((d.namespace().to_string(), d.name().to_string())),
                (None, Some(a)) => Some((a.namespace.clone(), a.name.clone())),
                (None, None) => None,
            }
        };
        pulls.retain(|uid| owner(uid).is_some());
        for ((uid, container), record) in pulls.entries() {
            let Some((namespace, pod)) = owner(&uid) else { continue };
            let mut push = |reason: &str, message: String, at: i64| {
                let mut event = self.event(reason, &namespace, &pod, Some(&uid), message, 1);
                event.metadata.name = Some(format!("{pod}.{container}.{}", reason.to_ascii_lowercase()));
                event.type_ = Some("Normal".to_owned());
                event.involved_object.field_path = Some(format!("spec.containers{{{container}}}"));
                event.first_timestamp = nodelet_resources::common::time::time(at);
                event.last_timestamp = event.first_timestamp.clone();
                items.push(event);
            };
            match record {
                PullRecord::Present { image, at } => {
                    push("Pulled", format!("Container image {image:?} already present on machine"), at);
                }
                PullRecord::Pulling { image, started_at } => {
                    push("Pulling", format!("Pulling image {image:?}"), started_at);
                }
                PullRecord::Pulled { image, started_at, finished_at, took } => {
                    push("Pulling", format!("Pulling image {image:?}"), started_at);
                    push("Pulled", PullRecord::pulled_message(&image, took), finished_at);
                }
            }
        }
    }

    /// `OOMKilling` (Warning) for every container attempt the runtime reports killed by the OOM killer
    /// (CRI reason `OOMKilled`; the status shows it as the reason of the state or `lastState`).
    fn oom_events(&self, items: &mut Vec<Event>) {
        for (uid, pod) in self.actual.entries() {
            for c in pod.containers.iter().filter(|c| c.reason == "OOMKilled") {
                let message = format!(
                    "Container {} was OOM-killed (memory cgroup out of memory; exit code {}, restart {})",
                    c.name, c.exit_code, c.restart_count
                );
                let mut event = self.event("OOMKilling", &pod.namespace, &pod.name, Some(&uid), message, 1);
                let short: String = c.id.chars().take(12).collect();
                event.metadata.name = Some(format!("{}.{short}.oomkilling", pod.name));
                event.involved_object.field_path = Some(format!("spec.containers{{{}}}", c.name));
                items.push(event);
            }
        }
    }

    /// Probe events, as the kubelet records them: `Unhealthy` (Warning) for failed probe runs, with the
    /// last failure and how many there were, and `Killing` (Normal) for a container restarted because its
    /// liveness or startup probe failed.
    fn probe_events(&self, items: &mut Vec<Event>) {
        use nodelet_resources::probe::status::kill_message;
        let Some(results) = self.reconciler.probes() else { return };
        for (id, entry) in results.entries() {
            let short: String = id.chars().take(12).collect();
            let mut push = |reason: &str, kind: &str, message: String, count: u32| {
                let mut event = self.event(
                    reason,
                    &entry.namespace,
                    &entry.pod_name,
                    Some(&entry.pod_uid),
                    message,
                    count,
                );
                event.metadata.name =
                    Some(format!("{}.{short}.{}", entry.pod_name, reason.to_ascii_lowercase()));
                event.type_ = Some(kind.to_string());
                event.involved_object.field_path = Some(format!("spec.containers{{{}}}", entry.container));
                items.push(event);
            };
            if let Some(failure) = &entry.last_failure {
                let message = format!("{} probe failed: {}", failure.kind.as_str(), failure.message);
                push("Unhealthy", "Warning", message, failure.count);
            }
            if let Some(kind) = entry.fatal_failure() {
                push("Killing", "Normal", kill_message(&entry.container, kind), 1);
            }
        }
    }
}

/// The `FailedMount` message of a volume whose content cannot be made; `None` when it can, or
/// when it only waits for something under way ([`SourceError::is_pending`](nodelet_resources::volume::desired::SourceError::is_pending)).
fn render_failure(volume: &DesiredVolume) -> Option<String> {
    match &volume.source {
        Err(why) if !why.is_pending() => {
            Some(format!("MountVolume.SetUp failed for volume {:?} : {why}", volume.name))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelet_resources::model::actual::{ContainerRecord, SandboxRecord};
    use nodelet_resources::model::volumes::Plugin;
    use nodelet_resources::volume::desired::{RenderError, SourceError};

    /// The projected volume `kube-api-access-x` whose token is not there, for `reason`.
    fn token_volume(reason: nodelet_host::files::TokenError) -> DesiredVolume {
        let error = nodelet_host::files::FilesError::TokenNotReady {
            volume: "kube-api-access-x".into(),
            field: "projected.sources[0].serviceAccountToken".into(),
            reason,
        };
        DesiredVolume {
            pod_uid: "u1".into(),
            namespace: "ns".into(),
            pod_name: "web".into(),
            name: "kube-api-access-x".into(),
            plugin: Plugin::Projected,
            source: Err(SourceError::Render(crate::volumes::render_error(error))),
            memory_limit: None,
            fs_group: None,
        }
    }

    #[test]
    fn a_token_being_requested_is_no_failed_mount_and_a_failed_request_is() {
        let requesting = nodelet_host::files::TokenError::Requesting { service_account: "default".into() };
        let waiting = token_volume(requesting);
        assert!(waiting.source.as_ref().is_err_and(SourceError::is_pending), "{:?}", waiting.source);
        assert_eq!(render_failure(&waiting), None, "a wait reports no FailedMount");

        let io = std::io::Error::other("connection refused");
        let failed = token_volume(nodelet_host::files::TokenError::Failed {
            service_account: "default".into(),
            error: Arc::new(io),
        });
        assert!(failed.source.as_ref().is_err_and(|e| !e.is_pending()), "{:?}", failed.source);
        assert_eq!(
            render_failure(&failed).as_deref(),
            Some(
                "MountVolume.SetUp failed for volume \"kube-api-access-x\" : volume \"kube-api-access-x\": \
                 projected.sources[0].serviceAccountToken: no token yet: the token request for service \
                 account \"default\" failed: connection refused"
            )
        );

        // Any other render error stays a failure (a ConfigMap that does not exist).
        let mut missing = waiting.clone();
        missing.source = Err(SourceError::Render(RenderError::new(std::io::Error::other(
            "volume \"cfg\": configMap \"later\" not found",
        ))));
        assert!(render_failure(&missing).is_some_and(|m| m.ends_with("configMap \"later\" not found")));
    }

    #[test]
    fn every_input_of_the_events_moves_their_generation_and_reading_them_does_not() {
        use nodelet_cri::images::{PullRecord, PullRecords};
        use nodelet_resources::pod::reconciler::CrashLoopBackOff;

        let (desired, mut desired_writer) = reconcile_engine::store::<PodUid, DesiredPod>();
        let (actual, mut actual_writer) = reconcile_engine::store::<PodUid, PodActual>();
        let (failures, _failures_writer) = reconcile_engine::store::<PodUid, PodOpStatus>();
        let (probes, mut probes_writer) =
            reconcile_engine::store::<String, nodelet_resources::probe::results::ContainerProbes>();
        let config = crate::sources::PodConfig::new("node");
        let pulls = PullRecords::default();
        let pressure_events = nodelet_resources::common::events::NodeEvents::new();
        let clock: Clock = Arc::new(|| 1);
        let node = Node::new(
            desired,
            actual,
            failures,
            PodReconciler::new(CrashLoopBackOff::default()).with_probes(probes),
            nodelet_resources::pod::reconciler::PodInputs::default(),
            clock,
            &crate::daemon::MetricFamilies::new(),
            PathBuf::new(),
            Arc::new(AtomicBool::new(true)),
            config.problems(),
            "node".into(),
        )
        .expect("node")
        .with_pulls(pulls.clone())
        .with_pressure(crate::pressure::PressureState {
            view: nodelet_resources::eviction::status::PressureView::new(1),
            events: pressure_events.clone(),
        });
        let mut generation = node.events_generation();
        assert!(generation.is_some(), "the daemon's view has a generation");
        let mut moved = |what: &str| {
            let now = node.events_generation();
            assert_ne!(now, generation, "{what} moves the generation");
            generation = now;
        };

        let pod =
            PodActual { uid: "u1".into(), namespace: "ns".into(), name: "web".into(), ..Default::default() };
        actual_writer.insert("u1".into(), pod);
        moved("a pod of the runtime");
        pulls.set("u1", "app", PullRecord::Present { image: "busybox".into(), at: 1 });
        moved("an image check");
        pressure_events.record(
            nodelet_resources::common::events::Involved::Node,
            "Warning",
            "EvictionThresholdMet",
            "Attempting to reclaim memory".into(),
            1,
        );
        moved("an eviction event");
        let source = config.add_source("file").expect("source");
        source.report(
            Vec::new(),
            vec![crate::sources::Problem {
                location: "/m/a.yaml".into(),
                object: None,
                message: "bad".into(),
            }],
        );
        moved("a source's problem");
        let probes =
            nodelet_resources::probe::results::ContainerProbes::initial("u1", "ns", "web", "app", []);
        probes_writer.insert("c1".into(), probes);
        moved("a probe result");
        desired_writer.remove(&"nothing".to_owned());
        assert_eq!(node.events_generation(), generation, "a write that changed nothing");

        let events = node.events().items;
        assert_eq!(events.len(), 3, "the pull, the eviction event and the problem: {events:?}");
        assert_eq!(node.events_generation(), generation, "reading the events changes nothing");
    }

    fn container(name: &str, state: ContainerState) -> ContainerRecord {
        ContainerRecord { name: name.into(), image: format!("img/{name}"), state, ..Default::default() }
    }

    #[test]
    fn running_pods_are_those_with_a_ready_sandbox_or_a_running_container() {
        let pod = |containers: Vec<ContainerRecord>| PodActual {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "web".into(),
            containers,
            ..Default::default()
        };
        let sandboxes = |ready: bool| PodSandboxes {
            uid: "u1".into(),
            sandboxes: vec![SandboxRecord { id: "s".into(), ready, ..Default::default() }],
            ..Default::default()
        };
        let (ready, dead) = (sandboxes(true), sandboxes(false));
        let shown = running_pod(
            &pod(vec![container("app", ContainerState::Running), container("done", ContainerState::Exited)]),
            Some(&ready),
        )
        .expect("running");
        assert_eq!(
            serde_json::to_value(&shown).expect("json"),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
                "spec": {"containers": [{"name": "app", "image": "img/app"}]},
            }),
            "only the running containers, with name and image"
        );
        assert!(running_pod(&pod(vec![]), Some(&ready)).is_some(), "a ready sandbox alone counts");
        assert!(running_pod(&pod(vec![]), None).is_none(), "nothing in the sandbox pair's store");
        assert!(running_pod(&pod(vec![container("x", ContainerState::Running)]), Some(&dead)).is_some());
        assert!(running_pod(&pod(vec![container("x", ContainerState::Exited)]), Some(&dead)).is_none());
    }
}
