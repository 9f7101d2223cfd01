//! The eviction manager: every monitoring period it observes the signals (the eviction pair's
//! actual state), compares them with the thresholds, updates the node's pressure conditions (the
//! pair's status, also sent to admission), reclaims node-level resources (image and container
//! garbage collection, its operations) and, when a threshold is still met, decides to evict one
//! pod, ranked as the kubelet ranks them. The decision goes to the
//! [`VerdictPopulator`](super::populator::VerdictPopulator) through an [`EvictionSink`]: the
//! pod's verdict becomes `Evicted` and the pod pair kills it. The manager never writes a verdict.
//!
//! With `localStorageCapacityIsolation`, each pass first evicts every running pod over an emptyDir
//! `sizeLimit` or its containers' `ephemeral-storage` limits
//! ([`local_storage`](super::local_storage)), with the hard-eviction grace period, from the newest
//! measurement its [`SignalSource`] took in the background; a pass that does skips the thresholds.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use reconcile_engine::Store;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::local_storage::check;
use super::metrics::EvictionMetrics;
use super::populator::{Eviction, EvictionSink};
use super::rank::{Candidate, eviction_message, is_critical, rank};
use super::signal::SignalSource;
use super::state::{EvictionState, Met, Policy, still_met};
use crate::common::clock::Clock;
use crate::common::events::{Involved, NodeEvents};
use crate::model::actual::PodActual;
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::pressure::{Condition, Reclaimer, Signal};
use crate::model::verdict::Verdict;

/// The grace period of a pod evicted for a hard threshold (the kubelet's
/// `immediateEvictionGracePeriodSeconds`).
pub const HARD_EVICTION_GRACE: Duration = Duration::from_secs(1);

/// The eviction manager's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Thresholds and the pressure transition period.
    pub policy: Policy,
    /// How often signals are checked (the kubelet's 10 s).
    pub monitoring_period: Duration,
    /// `evictionMaxPodGracePeriod`: the longest grace period of a pod evicted for a soft
    /// threshold (its own period when shorter).
    pub max_pod_grace_period: Duration,
    /// How long to wait for an evicted pod to stop before the next pass (the kubelet's 30 s).
    pub pod_cleanup_timeout: Duration,
    /// `localStorageCapacityIsolation`: evict pods over their emptyDir `sizeLimit` or their
    /// containers' `ephemeral-storage` limits ([`local_storage`](super::local_storage)).
    pub local_storage_capacity_isolation: bool,
}

/// One pressure condition as the node status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionStatus {
    /// The condition.
    pub condition: Condition,
    /// Whether the node is under this pressure.
    pub pressure: bool,
    /// When it last changed, nanoseconds since the Unix epoch.
    pub last_transition: i64,
    /// When it was last checked.
    pub last_heartbeat: i64,
}

/// The node's pressure conditions, shared with whoever shows the node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PressureView {
    inner: Arc<RwLock<Vec<ConditionStatus>>>,
}

impl PressureView {
    /// Every condition `False` since `now`.
    pub fn new(now: i64) -> Self {
        let all = Condition::ALL
            .into_iter()
            .map(|condition| ConditionStatus {
                condition,
                pressure: false,
                last_transition: now,
                last_heartbeat: now,
            })
            .collect();
        Self { inner: Arc::new(RwLock::new(all)) }
    }

    /// The conditions, in the kubelet's order.
    pub fn conditions(&self) -> Vec<ConditionStatus> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sets which conditions are true at `now`; returns the ones that changed.
    fn update(&self, pressure: &std::collections::BTreeSet<Condition>, now: i64) -> Vec<(Condition, bool)> {
        let mut changed = Vec::new();
        let mut all = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        for c in all.iter_mut() {
            let p = pressure.contains(&c.condition);
            if p != c.pressure {
                c.pressure = p;
                c.last_transition = now;
                changed.push((c.condition, p));
            }
            c.last_heartbeat = now;
        }
        changed
    }
}

/// What the manager works with.
pub struct EvictionManager {
    config: EvictionConfig,
    source: Arc<dyn SignalSource>,
    reclaimers: Vec<Arc<dyn Reclaimer>>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    verdicts: Store<PodUid, Verdict>,
    evictions: EvictionSink,
    /// The pods it decided to evict (its own record, until the verdict store shows them).
    evicted: HashSet<PodUid>,
    conditions: tokio::sync::watch::Sender<BTreeSet<Condition>>,
    metrics: EvictionMetrics,
    pressure: PressureView,
    events: NodeEvents,
    clock: Clock,
    state: EvictionState,
    cleaned_up: Option<CleanedUp>,
}

/// Whether everything of the pod with this UID besides its containers (its volumes) is released.
pub type CleanedUp = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl std::fmt::Debug for EvictionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionManager").field("config", &self.config).finish_non_exhaustive()
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PassReport {
    /// The signal acted on, if a threshold was met past its grace period.
    pub signal: Option<Signal>,
    /// Bytes node-level reclaim freed.
    pub reclaimed: u64,
    /// The pod evicted (UID), if any.
    pub evicted: Option<String>,
    /// The pods evicted over a local storage limit (UIDs): when any, nothing else was done.
    pub over_limit: Vec<String>,
}

impl EvictionManager {
    /// A manager over the pod stores and the verdict store (read-only: pods already stopped are
    /// not candidates); it sends its evictions to `evictions`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: EvictionConfig,
        source: Arc<dyn SignalSource>,
        desired: Store<PodUid, DesiredPod>,
        actual: Store<PodUid, PodActual>,
        verdicts: Store<PodUid, Verdict>,
        evictions: EvictionSink,
        metrics: EvictionMetrics,
        events: NodeEvents,
        clock: Clock,
    ) -> Self {
        let pressure = PressureView::new(clock());
        Self {
            config,
            source,
            reclaimers: Vec::new(),
            desired,
            actual,
            verdicts,
            evictions,
            evicted: HashSet::new(),
            conditions: tokio::sync::watch::Sender::new(BTreeSet::new()),
            metrics,
            pressure,
            events,
            clock,
            state: EvictionState::new(),
            cleaned_up: None,
        }
    }

    /// After evicting a pod, also waits (within the cleanup timeout) until `cleaned_up` says the
    /// pod's resources are released, e.g. its emptyDir volumes removed, before the next pass: the
    /// kubelet's `podCleanedUpFunc`, so that one eviction's effect is seen before another.
    pub fn with_cleanup_check(mut self, cleaned_up: CleanedUp) -> Self {
        self.cleaned_up = Some(cleaned_up);
        self
    }

    /// Adds a node-level reclaimer, tried in the order added.
    pub fn with_reclaimer(mut self, reclaimer: Arc<dyn Reclaimer>) -> Self {
        self.reclaimers.push(reclaimer);
        self
    }

    /// The node's pressure conditions, updated by [`run`](Self::run).
    pub fn pressure(&self) -> PressureView {
        self.pressure.clone()
    }

    /// The pressure conditions as admission applies them, updated every pass.
    pub fn conditions(&self) -> tokio::sync::watch::Receiver<BTreeSet<Condition>> {
        self.conditions.subscribe()
    }

    /// Runs a pass every monitoring period until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let report = tokio::select! {
                () = &mut shutdown => return,
                report = self.pass() => report,
            };
            for uid in report.evicted.iter().chain(&report.over_limit) {
                tokio::select! {
                    () = &mut shutdown => return,
                    () = self.wait_for_cleanup(uid) => {}
                }
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.config.monitoring_period) => {}
            }
        }
    }

    /// Waits until the evicted pod runs nothing any more, at most the cleanup timeout.
    async fn wait_for_cleanup(&self, uid: &str) {
        let deadline = Instant::now() + self.config.pod_cleanup_timeout;
        while Instant::now() < deadline {
            let running = self.actual.get(&uid.to_string()).is_some_and(|a| a.any_running());
            if !running && self.cleaned_up.as_ref().is_none_or(|f| f(uid)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        warn!(pod = %uid, "evicted pod did not stop within the cleanup timeout");
    }

    fn pod_ref(pod: &DesiredPod) -> Involved {
        Involved::Pod { namespace: pod.namespace().into(), name: pod.name().into(), uid: pod.uid().into() }
    }

    /// One pass: observe, update the conditions, reclaim, evict at most one pod.
    pub async fn pass(&mut self) -> PassReport {
        let mut report = PassReport::default();
        let observations = match self.source.observe().await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "eviction manager: cannot read the node's signals");
                return report;
            }
        };
        let now = (self.clock)();
        let assessment = self.state.observe(&self.config.policy, &observations, Instant::now());
        for (condition, pressure) in self.pressure.update(&assessment.conditions, now) {
            let what = condition.as_str().trim_end_matches("Pressure");
            let (reason, message) = if pressure {
                (format!("NodeHas{what}Pressure"), format!("Node status is now: NodeHas{what}Pressure"))
            } else if condition == Condition::DiskPressure {
                ("NodeHasNoDiskPressure".to_string(), "Node status is now: NodeHasNoDiskPressure".to_string())
            } else {
                (format!("NodeHasSufficient{what}"), format!("Node status is now: NodeHasSufficient{what}"))
            };
            info!(condition = %condition, pressure, "node condition changed");
            self.events.record(Involved::Node, "Normal", &reason, message, now);
        }
        self.metrics.set_pressure(&assessment.conditions);
        self.conditions.send_if_modified(|c| {
            let changed = *c != assessment.conditions;
            c.clone_from(&assessment.conditions);
            changed
        });
        let desired = &self.desired;
        self.evicted.retain(|uid| desired.contains_key(uid));

        // Local storage limits first; a pass that evicts for them does nothing else (the kubelet's
        // `localStorageEviction`).
        if self.config.local_storage_capacity_isolation {
            report.over_limit = self.local_storage_eviction().await;
            if !report.over_limit.is_empty() {
                return report;
            }
        }
        let Some(met) = assessment.act_on.first().cloned() else { return report };
        let signal = met.threshold.signal;
        report.signal = Some(signal);
        self.events.record(
            Involved::Node,
            "Warning",
            "EvictionThresholdMet",
            format!("Attempting to reclaim {}", signal.resource()),
            now,
        );
        debug!(%signal, available = met.observed.available, limit = met.limit(), "eviction threshold met");

        if signal.is_disk() && !self.reclaimers.is_empty() {
            for r in &self.reclaimers {
                match r.reclaim(signal, met.to_reclaim()).await {
                    Ok(freed) => {
                        report.reclaimed += freed;
                        debug!(reclaimer = r.name(), freed, "node-level reclaim");
                    }
                    Err(e) => warn!(reclaimer = r.name(), error = %e, "node-level reclaim failed"),
                }
            }
            match self.source.observe().await {
                Ok(after) if !still_met(&met.threshold, &after) => {
                    let freed = report.reclaimed;
                    info!(%signal, freed, "node-level reclaim relieved the pressure; no pod evicted");
                    return report;
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "cannot read the node's signals after reclaim"),
            }
        }
        report.evicted = self.evict_one(&met).await;
        report
    }

    /// The pods that may be evicted: desired, admitted, not evicted yet, running something.
    fn active_pods(&self) -> Vec<Arc<DesiredPod>> {
        self.desired
            .entries()
            .into_iter()
            .filter(|(uid, _)| !self.evicted.contains(uid))
            .filter(|(uid, _)| self.verdicts.get(uid).is_none_or(|v| v.is_admitted()))
            .filter(|(uid, _)| self.actual.get(uid).is_some_and(|a| a.any_running()))
            .map(|(_, p)| p)
            .collect()
    }

    /// Evicts every active pod over one of its local storage limits, from the newest measurement;
    /// returns their UIDs.
    async fn local_storage_eviction(&mut self) -> Vec<String> {
        let measured = match self.source.local_storage().await {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "eviction manager: cannot read the pods' local storage usage");
                return Vec::new();
            }
        };
        let mut evicted = Vec::new();
        for pod in self.active_pods() {
            let Some(usage) = measured.pods.get(pod.uid()) else { continue };
            let Some(exceeded) = check(&pod, usage, measured.dedicated_image_fs) else { continue };
            if is_critical(&pod) {
                warn!(pod = %pod.name(), namespace = %pod.namespace(), message = %exceeded.message,
                    "cannot evict a critical pod over its local storage limit");
                continue;
            }
            let uid = pod.uid().to_string();
            info!(pod = %pod.name(), namespace = %pod.namespace(), signal = exceeded.signal.as_str(),
                message = %exceeded.message, "evicting pod over its local storage limit");
            let now = (self.clock)();
            let eviction = Eviction {
                uid: uid.clone(),
                message: exceeded.message.clone(),
                grace: HARD_EVICTION_GRACE,
                at: now,
                over_limit: true,
            };
            if !self.evictions.evict(eviction) {
                warn!(pod = %uid, "the verdict populator is gone; the eviction is not applied");
            }
            self.evicted.insert(uid.clone());
            self.metrics.evictions.with_label_values(&[exceeded.signal.as_str()]).inc();
            self.events.record(Self::pod_ref(&pod), "Warning", "Evicted", exceeded.message, now);
            evicted.push(uid);
        }
        evicted
    }

    async fn evict_one(&mut self, met: &Met) -> Option<String> {
        let signal = met.threshold.signal;
        let pods = self.active_pods();
        if pods.is_empty() {
            info!(%signal, "eviction threshold met, but no pod to evict");
            return None;
        }
        let usage = match self.source.pod_usage().await {
            Ok(u) => u,
            Err(e) => {
                warn!(error = %e, "cannot read the pods' usage; ranking without it");
                BTreeMap::new()
            }
        };
        let candidates: Vec<Candidate<'_>> = pods
            .iter()
            .map(|p| Candidate { pod: p, usage: usage.get(p.uid()).cloned().unwrap_or_default() })
            .collect();
        let ranked = rank(signal, candidates);
        let Some(victim) = ranked.first() else {
            info!(%signal, "eviction threshold met, but every running pod is critical");
            return None;
        };
        let message = eviction_message(met, victim);
        let grace = if met.threshold.is_hard() {
            HARD_EVICTION_GRACE
        } else {
            victim.pod.grace_period().min(self.config.max_pod_grace_period)
        };
        let uid = victim.pod.uid().to_string();
        info!(pod = %victim.pod.name(), namespace = %victim.pod.namespace(), %signal, ?grace, "evicting pod");
        let eviction = Eviction {
            uid: uid.clone(),
            message: message.clone(),
            grace,
            at: (self.clock)(),
            over_limit: false,
        };
        if !self.evictions.evict(eviction) {
            warn!(pod = %uid, "the verdict populator is gone; the eviction is not applied");
        }
        self.evicted.insert(uid.clone());
        self.metrics.evictions.with_label_values(&[signal.as_str()]).inc();
        self.events.record(Self::pod_ref(victim.pod), "Warning", "Evicted", message, (self.clock)());
        Some(uid)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::eviction::local_storage::{ContainerStorage, LocalStorage, PodStorage};
    use crate::eviction::signal::{
        Amount, BoxFuture, Observation, Observations, PodUsage, SignalError, Threshold,
    };
    use crate::model::actual::{ContainerRecord, ContainerState};
    use crate::model::pod::PodSource;

    const MI: u64 = 1 << 20;

    /// Signals from a script: each `observe` takes the next reading (the last one repeats).
    struct Script {
        readings: Mutex<Vec<Observations>>,
        usage: BTreeMap<String, PodUsage>,
        storage: LocalStorage,
    }

    impl SignalSource for Script {
        fn observe(&self) -> BoxFuture<'_, Result<Observations, SignalError>> {
            let mut r = self.readings.lock().unwrap_or_else(PoisonError::into_inner);
            let next = if r.len() > 1 { r.remove(0) } else { r.first().cloned().unwrap_or_default() };
            Box::pin(async move { Ok(next) })
        }
        fn pod_usage(&self) -> BoxFuture<'_, Result<BTreeMap<String, PodUsage>, SignalError>> {
            let usage = self.usage.clone();
            Box::pin(async move { Ok(usage) })
        }
        fn local_storage(&self) -> BoxFuture<'_, Result<LocalStorage, SignalError>> {
            let storage = self.storage.clone();
            Box::pin(async move { Ok(storage) })
        }
    }

    struct CountingReclaimer(Mutex<u32>);

    impl Reclaimer for CountingReclaimer {
        fn name(&self) -> &'static str {
            "test"
        }
        fn reclaim(&self, _: Signal, _: u64) -> BoxFuture<'_, Result<u64, String>> {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
            Box::pin(async { Ok(MI) })
        }
    }

    fn pod(name: &str, spec: serde_json::Value) -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": spec,
        }))
        .unwrap_or_default();
        DesiredPod { pod, source: PodSource::Http }
    }

    fn reading(signal: Signal, available: u64) -> Observations {
        [(signal, Observation { available, capacity: 1000 * MI })].into_iter().collect()
    }

    struct Setup {
        manager: EvictionManager,
        evictions: crate::eviction::populator::Evictions,
        _verdicts: reconcile_engine::Writer<PodUid, Verdict>,
        reclaims: Arc<CountingReclaimer>,
        _writers: (reconcile_engine::Writer<PodUid, DesiredPod>, reconcile_engine::Writer<PodUid, PodActual>),
    }

    fn setup(readings: Vec<Observations>, threshold: Threshold) -> Setup {
        setup_with(readings, threshold, LocalStorage::default(), true)
    }

    fn setup_with(
        readings: Vec<Observations>,
        threshold: Threshold,
        storage: LocalStorage,
        isolation: bool,
    ) -> Setup {
        let (desired, mut dw) = reconcile_engine::store::<PodUid, DesiredPod>();
        let (actual, mut aw) = reconcile_engine::store::<PodUid, PodActual>();
        let c = |n: &str| serde_json::json!({"name": "app", "image": "busybox", "resources": {"requests": {"memory": n}}});
        let mut pods = vec![
            ("hog", serde_json::json!({"containers": [{"name": "app", "image": "busybox"}]})),
            ("steady", serde_json::json!({"containers": [c("500Mi")]})),
            ("critical", serde_json::json!({"containers": [c("1Mi")], "priority": 2_000_001_000})),
            (
                "filler",
                serde_json::json!({
                    "containers": [{"name": "app", "image": "busybox",
                        "resources": {"limits": {"ephemeral-storage": "8Mi"}}}],
                    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}],
                }),
            ),
        ];
        // The pod with local storage limits only where a measurement is scripted.
        pods.retain(|(name, _)| *name != "filler" || !storage.pods.is_empty());
        for (name, spec) in pods {
            dw.insert(name.to_string(), pod(name, spec));
            let running = ContainerRecord { state: ContainerState::Running, ..ContainerRecord::default() };
            aw.insert(name.to_string(), PodActual { containers: vec![running], ..PodActual::default() });
        }
        let usage: BTreeMap<String, PodUsage> = [("hog", 300), ("steady", 400), ("critical", 900)]
            .into_iter()
            .map(|(n, m)| (n.to_string(), PodUsage { memory: Some(m * MI), ..PodUsage::default() }))
            .collect();
        let (verdicts, verdict_writer) = reconcile_engine::store();
        let (sink, evictions) = crate::eviction::populator::evictions();
        let reclaims = Arc::new(CountingReclaimer(Mutex::new(0)));
        let registry = prometheus::Registry::new();
        let manager = EvictionManager::new(
            EvictionConfig {
                policy: Policy {
                    thresholds: vec![threshold],
                    pressure_transition_period: Duration::from_secs(60),
                },
                monitoring_period: Duration::from_secs(10),
                max_pod_grace_period: Duration::from_secs(5),
                pod_cleanup_timeout: Duration::from_secs(30),
                local_storage_capacity_isolation: isolation,
            },
            Arc::new(Script { readings: Mutex::new(readings), usage, storage }),
            desired,
            actual,
            verdicts,
            sink,
            EvictionMetrics::new(&registry).unwrap_or_else(|e| panic!("{e}")),
            NodeEvents::new(),
            Arc::new(|| 1),
        )
        .with_reclaimer(reclaims.clone());
        Setup { manager, evictions, _verdicts: verdict_writer, reclaims, _writers: (dw, aw) }
    }

    #[tokio::test(start_paused = true)]
    async fn one_pod_per_pass_ranked_and_never_a_critical_one() {
        let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
        let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
        let report = s.manager.pass().await;
        assert_eq!(report.evicted.as_deref(), Some("hog"), "the only pod above its request goes first");
        assert_eq!(s.reclaims.0.lock().map(|n| *n).unwrap_or(9), 0, "no node-level reclaim for memory");
        let v = s.evictions.try_next().unwrap_or_else(|| panic!("hog is evicted"));
        assert_eq!(v.uid, "hog");
        assert_eq!(v.grace, HARD_EVICTION_GRACE);
        assert!(v.message.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi"));
        assert!(s.manager.pressure().conditions()[0].pressure, "MemoryPressure");
        let gauge = s.manager.metrics.node_pressure.with_label_values(&["MemoryPressure"]).get();
        assert_eq!(gauge, 1, "nodelet_node_pressure follows the condition");
        assert_eq!(s.manager.metrics.evictions.with_label_values(&["memory.available"]).get(), 1);
        assert_eq!(
            *s.manager.conditions().borrow(),
            [Condition::MemoryPressure].into(),
            "admission sees the pressure"
        );
        // Still under pressure: the next pass evicts the next pod, never the critical one.
        assert_eq!(s.manager.pass().await.evicted.as_deref(), Some("steady"));
        assert_eq!(s.manager.pass().await.evicted, None);
        let sent: Vec<String> = std::iter::from_fn(|| s.evictions.try_next()).map(|e| e.uid).collect();
        assert_eq!(sent, ["steady"], "never the critical pod");
    }

    #[tokio::test(start_paused = true)]
    async fn disk_pressure_reclaims_first_and_evicts_nobody_when_that_is_enough() {
        let t = Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0));
        let readings =
            vec![reading(Signal::NodeFsAvailable, 50 * MI), reading(Signal::NodeFsAvailable, 200 * MI)];
        let mut s = setup(readings, t);
        let report = s.manager.pass().await;
        assert_eq!(report.signal, Some(Signal::NodeFsAvailable));
        assert_eq!(report.reclaimed, MI);
        assert_eq!(report.evicted, None, "reclaim relieved the pressure");
        assert!(s.manager.pressure().conditions()[1].pressure, "DiskPressure is still reported");
    }

    #[tokio::test(start_paused = true)]
    async fn a_soft_threshold_evicts_after_its_grace_period_with_the_maximum_pod_grace() {
        let t = Threshold::soft(Signal::MemoryAvailable, Amount::Quantity(100 * MI), Duration::from_secs(30));
        let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
        assert_eq!(s.manager.pass().await.evicted, None, "within the grace period");
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(s.manager.pass().await.evicted.as_deref(), Some("hog"));
        let grace = s.evictions.try_next().map(|e| e.grace);
        assert_eq!(grace, Some(Duration::from_secs(5)), "min(evictionMaxPodGracePeriod, the pod's 30 s)");
    }

    fn over_its_size_limit() -> LocalStorage {
        let filler = PodStorage {
            volumes: [("scratch".to_owned(), 4 * MI)].into(),
            containers: [("app".to_owned(), ContainerStorage { rootfs: Some(0), logs: Some(0) })].into(),
        };
        let critical = PodStorage {
            containers: [("app".to_owned(), ContainerStorage { rootfs: Some(100 * MI), logs: None })].into(),
            ..PodStorage::default()
        };
        LocalStorage {
            pods: [("filler".to_owned(), filler), ("critical".to_owned(), critical)].into(),
            dedicated_image_fs: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_over_a_local_storage_limit_is_evicted_first_and_the_thresholds_wait() {
        let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
        let mut s =
            setup_with(vec![reading(Signal::MemoryAvailable, 50 * MI)], t, over_its_size_limit(), true);
        let report = s.manager.pass().await;
        assert_eq!(report.over_limit, ["filler"], "the critical pod is over its 1Mi too, but never evicted");
        assert_eq!(report.evicted, None, "a pass that evicts over a limit does nothing else");
        let v = s.evictions.try_next().unwrap_or_else(|| panic!("filler is evicted"));
        assert_eq!(
            (v.uid.as_str(), v.message.as_str(), v.grace, v.over_limit),
            (
                "filler",
                "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ",
                HARD_EVICTION_GRACE,
                true
            )
        );
        assert_eq!(s.manager.metrics.evictions.with_label_values(&["emptydirfs.limit"]).get(), 1);
        assert_eq!(s.manager.metrics.evictions.with_label_values(&["memory.available"]).get(), 0);
        let event = s.manager.events.list().into_iter().find(|e| e.reason == "Evicted");
        assert_eq!(event.map(|e| (e.type_, e.message)), Some(("Warning", v.message.clone())));
        // Once evicted, the next pass goes on to the memory threshold.
        let report = s.manager.pass().await;
        assert!(report.over_limit.is_empty());
        assert_eq!(report.evicted.as_deref(), Some("hog"));
    }

    #[tokio::test(start_paused = true)]
    async fn without_local_storage_capacity_isolation_limits_are_not_enforced() {
        let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(MI));
        let mut s =
            setup_with(vec![reading(Signal::MemoryAvailable, 500 * MI)], t, over_its_size_limit(), false);
        let report = s.manager.pass().await;
        assert_eq!(report, PassReport::default());
        assert!(s.evictions.try_next().is_none());
        assert_eq!(s.manager.metrics.evictions.with_label_values(&["emptydirfs.limit"]).get(), 0);
    }
}
