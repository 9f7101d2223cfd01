//! Node pressure: the eviction pair (its engine and its signal sampler) and the verdict populator
//! (admission and eviction verdicts, the pod pair's input) wired to the stats provider and the pod stores,
//! the local storage measurement (with `localStorageCapacityIsolation`), and the v1 `Node` object that
//! shows the pressure conditions. The daemon starts them as a built-in extension
//! (`crate::daemon::builtin::eviction`), after the image pair (`crate::daemon::builtin::images`), whose
//! reclaimer the eviction pair tries.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodelet_resources::common::clock::Clock;
use nodelet_resources::common::events::NodeEvents;
use nodelet_resources::common::task::Lifetime::UntilShutdown;
use nodelet_resources::common::task::NamedTask;
use nodelet_resources::common::time::time;
use nodelet_resources::eviction::driver::EvictionDriver;
use nodelet_resources::eviction::local_storage::LocalStorage;
use nodelet_resources::eviction::metrics::EvictionMetrics;
use nodelet_resources::eviction::populator::VerdictPopulator;
use nodelet_resources::eviction::reconciler::{
    EvictionConfig, EvictionInputs, EvictionKey, EvictionReconciler,
};
use nodelet_resources::eviction::sampler::SignalSampler;
use nodelet_resources::eviction::signal::{
    Amount, BoxFuture, Observation, Observations, PodUsage, SignalError, SignalSource, Threshold,
};
use nodelet_resources::eviction::state::Policy;
use nodelet_resources::eviction::status::PressureView;
use nodelet_resources::eviction::verdict::Admission;
use nodelet_resources::model::actual::{PodActual, PodSandboxes};
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::model::pressure::{Reclaimers, Signal};
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{VolumeKey, split_key};
use reconcile_engine::{Engine, Store, Writer};
use tokio_util::sync::CancellationToken;

use crate::config::{self, ThresholdValue};
use nodelet_stats::StatsProvider;

/// The eviction signals from the stats provider.
struct StatsSignals(StatsProvider);

/// Where the eviction pair reads the node's signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignalOrigin {
    /// The machine, through the stats provider (`/proc`, cgroups, `statvfs`, the runtime's image
    /// filesystem): `nodelet run`.
    Host,
    /// Nowhere: a hollow node (`nodelet hollow`) has a made-up host, so it measures nothing and no
    /// signal is ever under pressure, as kubemark's hollow kubelet over its fake cAdvisor. The machine's
    /// memory and disks are not the hollow node's: a full disk under the process must not evict its pods.
    Hollow,
}

/// A hollow node's signals ([`SignalOrigin::Hollow`]): none measured.
struct NoSignals;

impl SignalSource for NoSignals {
    fn observe(&self) -> BoxFuture<'_, Result<Observations, SignalError>> {
        Box::pin(async { Ok(Observations::new()) })
    }

    fn pod_usage(&self) -> BoxFuture<'_, Result<BTreeMap<String, PodUsage>, SignalError>> {
        Box::pin(async { Ok(BTreeMap::new()) })
    }
}

/// A configured threshold amount as the eviction pair takes it.
pub(crate) fn amount(v: &ThresholdValue) -> Amount {
    match v {
        ThresholdValue::Quantity(q) => Amount::Quantity(*q),
        ThresholdValue::Percentage(p) => Amount::Percentage(*p),
    }
}

impl SignalSource for StatsSignals {
    fn observe(&self) -> BoxFuture<'_, Result<Observations, SignalError>> {
        Box::pin(async move {
            let node = self.0.node().await.map_err(|e| SignalError(e.to_string()))?;
            let mut out = Observations::new();
            if let Some(m) = &node.memory
                && let (Some(available), Some(ws)) = (m.available_bytes, m.working_set_bytes)
            {
                out.insert(Signal::MemoryAvailable, Observation { available, capacity: available + ws });
            }
            let mut fs = |bytes: Signal, inodes: Signal, f: &nodelet_stats::summary::FsStats| {
                if let (Some(available), Some(capacity)) = (f.available_bytes, f.capacity_bytes) {
                    out.insert(bytes, Observation { available, capacity });
                }
                if let (Some(available), Some(capacity)) = (f.inodes_free, f.inodes) {
                    out.insert(inodes, Observation { available, capacity });
                }
            };
            if let Some(f) = &node.fs {
                fs(Signal::NodeFsAvailable, Signal::NodeFsInodesFree, f);
            }
            if let Some(f) = node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()) {
                fs(Signal::ImageFsAvailable, Signal::ImageFsInodesFree, f);
            }
            if let Some(f) = node.runtime.as_ref().and_then(|r| r.container_fs.as_ref()) {
                fs(Signal::ContainerFsAvailable, Signal::ContainerFsInodesFree, f);
            }
            if let Some(r) = &node.rlimit
                && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
            {
                let capacity = u64::try_from(max).unwrap_or(0);
                let used = u64::try_from(cur).unwrap_or(0);
                out.insert(
                    Signal::PidAvailable,
                    Observation { available: capacity.saturating_sub(used), capacity },
                );
            }
            Ok(out)
        })
    }

    fn pod_usage(&self) -> BoxFuture<'_, Result<BTreeMap<String, PodUsage>, SignalError>> {
        Box::pin(async move {
            // Asked only when a pod is to be evicted: the usage of now, as the kubelet's eviction manager asks
            // its summary provider for updated stats (this gathering also refreshes the cached summary). The
            // volumes are measured again first (a bounded round), so that a pod filling a volume since the
            // last `volumeStatsAggPeriod` ranks by what it holds now.
            if let Err(e) = self.0.measure_volumes().await {
                tracing::debug!(error = %e, "cannot measure the pods' volumes before ranking");
            }
            let summary = self.0.refresh().await.map_err(|e| SignalError(e.to_string()))?;
            Ok(summary
                .pods
                .iter()
                .map(|p| {
                    let usage = PodUsage {
                        memory: p.memory.as_ref().and_then(|m| m.working_set_bytes),
                        disk: p.ephemeral_storage.as_ref().and_then(|f| f.used_bytes),
                        inodes: p.ephemeral_storage.as_ref().and_then(|f| f.inodes_used),
                        processes: p.process_stats.as_ref().and_then(|s| s.process_count),
                    };
                    (p.pod_ref.uid.clone(), usage)
                })
                .collect())
        })
    }

    fn local_storage(&self) -> BoxFuture<'_, Result<LocalStorage, SignalError>> {
        // Measured in the background every monitoring period (see `start`).
        let newest = self.0.local_storage();
        Box::pin(async move { Ok(LocalStorage::clone(&newest)) })
    }
}

/// The eviction pair's settings (its desired state) from the configuration.
pub(crate) fn eviction_config(c: &config::EvictionConfig) -> EvictionConfig {
    let signal = |name: &str| Signal::parse(name);
    let mut thresholds = Vec::new();
    for t in &c.hard {
        if let Some(s) = signal(&t.signal) {
            thresholds.push(Threshold::hard(s, amount(&t.value)));
        }
    }
    for t in &c.soft {
        if let (Some(s), Some(grace)) = (signal(&t.signal), c.soft_grace_period.get(&t.signal)) {
            thresholds.push(Threshold::soft(s, amount(&t.value), *grace));
        }
    }
    for t in &mut thresholds {
        if let Some(v) = c.minimum_reclaim.get(t.signal.as_str()) {
            t.min_reclaim = Some(amount(v));
        }
    }
    // A threshold of 0 is never met; the kubelet drops such thresholds too.
    thresholds.retain(|t| !matches!(t.value, Amount::Quantity(0)) && t.value != Amount::Percentage(0.0));
    EvictionConfig {
        policy: Policy { thresholds, pressure_transition_period: c.pressure_transition_period },
        monitoring_period: c.monitoring_period,
        max_pod_grace_period: Duration::from_secs(u64::try_from(c.max_pod_grace_period).unwrap_or(0)),
        pod_cleanup_timeout: Duration::from_secs(30),
        local_storage_capacity_isolation: c.local_storage_capacity_isolation,
    }
}

/// What the node view shows of the node's pressure: the extension context's conditions (the eviction
/// pair updates them) and event log.
#[derive(Clone)]
pub(crate) struct PressureState {
    /// The pressure conditions.
    pub(crate) view: PressureView,
    /// Eviction and image GC events.
    pub(crate) events: NodeEvents,
}

/// What [`start`] needs.
pub(crate) struct Wiring<'a> {
    pub(crate) config: &'a config::Config,
    /// Where the signals come from (the stats provider, or nowhere for a hollow node).
    pub(crate) signals: SignalOrigin,
    pub(crate) stats: StatsProvider,
    pub(crate) desired: Store<PodUid, DesiredPod>,
    pub(crate) actual: Store<PodUid, PodActual>,
    /// The sandbox pair's actual store.
    pub(crate) sandboxes: Store<PodUid, PodSandboxes>,
    pub(crate) volumes: Store<VolumeKey, VolumeActual>,
    /// The verdict store (a reader) and its writer, for the verdict populator.
    pub(crate) verdicts: Store<PodUid, Verdict>,
    pub(crate) verdict_writer: Writer<PodUid, Verdict>,
    /// What admission checks pods against ([`admission`]).
    pub(crate) admission: Admission,
    /// The node-level reclaimers (container GC, image GC, the extensions'), tried under disk pressure in
    /// the order added, read at every reclaim.
    pub(crate) reclaimers: Reclaimers,
    /// The node's pressure conditions, as handed to the extensions: the eviction pair updates them.
    pub(crate) pressure: PressureView,
    /// The node's event log (eviction events; image GC records there too).
    pub(crate) events: NodeEvents,
    /// The eviction driver's `kubelet_evictions_total` and `nodelet_node_pressure`.
    pub(crate) metrics: EvictionMetrics,
    pub(crate) engine_metrics: &'a reconcile_engine::Metrics,
    pub(crate) clock: Clock,
}

/// Admission as the configuration and the node set it up: the node's allocatable resources and
/// `maxPods`, RuntimeClasses (overhead, node selector, tolerations), the node's labels, the
/// sysctls pods may set (`allowedUnsafeSysctls`) and, in cluster mode, its `registerWithTaints`.
pub(crate) fn admission(
    config: &config::Config,
    facts: &nodelet_node::node_facts::NodeFacts,
    classes: Arc<dyn nodelet_resources::common::runtime_class::RuntimeClasses>,
) -> Admission {
    Admission::new()
        .with_resources(facts.admission_resources(config.pods.max_pods))
        .with_runtime_classes(classes)
        .with_node_taints(config.cluster.as_ref().map(|c| c.register_with_taints.clone()).unwrap_or_default())
        .with_node_labels(node_labels(&config.node_name, config.cluster.as_ref().map(|c| &c.node_labels)))
        .with_sysctls(
            // Checked when the configuration was read; a failure here would be a bug, logged and the
            // safe set kept.
            nodelet_resources::common::sysctl::SysctlAllowlist::new(&config.pods.allowed_unsafe_sysctls)
                .unwrap_or_else(|e| {
                    tracing::error!(error = %e, "allowedUnsafeSysctls: keeping the safe sysctls only");
                    nodelet_resources::common::sysctl::SysctlAllowlist::default()
                }),
        )
}

/// Builds the eviction pair (its engine, `eviction-engine`, and its signal sampler, `eviction-sampler`;
/// with local storage capacity isolation, `local-storage-measure`) and the verdict populator
/// (`verdict-populator`), and returns their tasks for the daemon to spawn, in that order:
/// `local-storage-measure`, `verdict-populator`, `eviction-engine`, `eviction-sampler`, each running until
/// `shutdown`. The pod engine watches the verdict store itself.
pub(crate) fn start(
    w: Wiring<'_>,
    shutdown: &CancellationToken,
) -> Result<Vec<NamedTask>, prometheus::Error> {
    let mut tasks = Vec::with_capacity(4);
    let events = w.events;
    let (sink, evictions) = nodelet_resources::eviction::populator::evictions();
    if w.config.eviction.local_storage_capacity_isolation && w.signals == SignalOrigin::Host {
        let measure = w.stats.clone().measure_local_storage_every(
            w.config.eviction.monitoring_period,
            w.config.eviction.local_storage_entry_budget,
            shutdown.clone(),
        );
        tasks.push(NamedTask::new("local-storage-measure", UntilShutdown, measure));
    }
    let config = eviction_config(&w.config.eviction);
    let source: Arc<dyn SignalSource> = match w.signals {
        SignalOrigin::Host => Arc::new(StatsSignals(w.stats)),
        SignalOrigin::Hollow => Arc::new(NoSignals),
    };
    let driver =
        EvictionDriver::new(source.clone(), sink, w.actual.clone(), w.metrics, events, w.clock.clone())
            .with_reclaimers(w.reclaimers)
            .with_pressure(w.pressure)
            .with_cleanup_check(Arc::new(move |uid: &str| {
                !w.volumes.keys().iter().any(|k| split_key(k).is_some_and(|(u, _)| u == uid))
            }));
    let conditions = driver.conditions();
    // The reconciler reads the driver's list of reclaimers when it plans: one an extension adds later
    // is planned for as the built-in ones are.
    let inputs = EvictionInputs {
        desired: w.desired.clone(),
        actual: w.actual.clone(),
        verdicts: w.verdicts.clone(),
        reclaimers: driver.reclaimers().clone(),
    };
    let reconciler = EvictionReconciler::new();
    let (eviction_desired, mut eviction_desired_writer) = reconcile_engine::store();
    let period = config.monitoring_period;
    let local_storage = config.local_storage_capacity_isolation;
    eviction_desired_writer.insert(EvictionKey::Node, config);
    eviction_desired_writer.mark_synced();
    let mut eviction = Engine::builder("eviction", reconciler, Arc::new(driver), eviction_desired)
        .metrics(w.engine_metrics)
        .build_with(inputs);
    let sampler = SignalSampler::new(source, eviction.observer(), local_storage);
    let populator = VerdictPopulator::new(
        w.desired,
        w.actual,
        w.sandboxes,
        w.verdict_writer,
        w.admission,
        conditions,
        evictions,
    )
    .with_clock(w.clock);
    tasks.push(NamedTask::new("verdict-populator", UntilShutdown, populator.run(shutdown.clone())));
    let stop = shutdown.clone();
    tasks.push(NamedTask::new("eviction-engine", UntilShutdown, async move {
        // The desired state is written once; its writer lives as long as the engine.
        let _desired = eviction_desired_writer;
        eviction.run(stop.cancelled_owned()).await;
    }));
    tasks.push(NamedTask::new(
        "eviction-sampler",
        UntilShutdown,
        sampler.run(period, shutdown.clone().cancelled_owned()),
    ));
    Ok(tasks)
}

/// The node as a v1 `Node`: its name and labels, the `Ready` condition from the runtime's health and
/// the pressure conditions; with `facts`, its capacity, allocatable resources, addresses, system
/// information and kubelet port.
pub(crate) fn node_object(
    name: &str,
    facts: Option<&nodelet_node::node_facts::NodeFacts>,
    pressure: Option<&PressureView>,
    runtime_ready: &AtomicBool,
    started: i64,
    now: i64,
) -> Node {
    let mut conditions: Vec<NodeCondition> = pressure
        .map(|p| p.conditions())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let (reason, message) = c.condition.reason_and_message(c.pressure);
            NodeCondition {
                type_: c.condition.as_str().to_owned(),
                status: if c.pressure { "True" } else { "False" }.to_owned(),
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
                last_heartbeat_time: time(c.last_heartbeat),
                last_transition_time: time(c.last_transition),
            }
        })
        .collect();
    let ready = runtime_ready.load(Ordering::Relaxed);
    conditions.push(NodeCondition {
        type_: "Ready".to_owned(),
        status: if ready { "True" } else { "False" }.to_owned(),
        reason: Some(if ready { "KubeletReady" } else { "KubeletNotReady" }.to_owned()),
        message: Some(
            if ready { "kubelet is posting ready status" } else { "container runtime is not ready" }
                .to_owned(),
        ),
        last_heartbeat_time: time(now),
        last_transition_time: time(started),
    });
    let labels = node_labels(name, None);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            creation_timestamp: time(started),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: facts.map(|f| f.capacity.clone()),
            allocatable: facts.map(|f| f.allocatable.clone()),
            addresses: facts.map(|f| f.addresses.clone()),
            conditions: Some(conditions),
            daemon_endpoints: facts.map(|f| NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(f.kubelet_port) }),
            }),
            node_info: Some(NodeSystemInfo {
                architecture: go_arch().to_owned(),
                operating_system: std::env::consts::OS.to_owned(),
                kubelet_version: format!("nodelet/v{}", env!("CARGO_PKG_VERSION")),
                container_runtime_version: facts
                    .map_or_else(|| "remote".to_owned(), |f| f.container_runtime_version.clone()),
                kernel_version: facts.map(|f| f.kernel_version.clone()).unwrap_or_default(),
                os_image: facts.map(|f| f.os_image.clone()).unwrap_or_default(),
                machine_id: facts.map(|f| f.machine_id.clone()).unwrap_or_default(),
                boot_id: facts.map(|f| f.boot_id.clone()).unwrap_or_default(),
                system_uuid: facts.map(|f| f.system_uuid.clone()).unwrap_or_default(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

/// The architecture as Go names it (`amd64`, `arm64`).
/// The node's labels: the kubelet's own (`kubernetes.io/hostname`, `kubernetes.io/os`,
/// `kubernetes.io/arch` and their `beta.` forms) and, in cluster mode, `--node-labels`.
pub(crate) fn node_labels(name: &str, extra: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", std::env::consts::OS),
        ("kubernetes.io/arch", go_arch()),
        ("beta.kubernetes.io/os", std::env::consts::OS),
        ("beta.kubernetes.io/arch", go_arch()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    labels.extend(extra.into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
