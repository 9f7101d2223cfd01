//! Tests of the eviction pair: its reconciler and driver stepped through whole passes (as the engine
//! runs them, one step at a time), and the pair on an engine with its sampler, on paused time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use reconcile_engine::{CancellationToken, Driver, Engine, Outcome, Plan, Reconciler, Update, View, Writer};
use tokio::time::Instant;

use super::driver::EvictionDriver;
use super::local_storage::{ContainerStorage, LocalStorage, PodStorage};
use super::metrics::EvictionMetrics;
use super::populator::Evictions;
use super::reconciler::{
    EvictionActual, EvictionConfig, EvictionInputs, EvictionKey, EvictionOp, EvictionReconciler,
    HARD_EVICTION_GRACE, NodeEviction, Sample, Stage,
};
use super::sampler::SignalSampler;
use super::signal::{
    Amount, BoxFuture, Observation, Observations, PodUsage, SignalError, SignalSource, Threshold,
};
use super::state::Policy;
use crate::common::events::NodeEvents;
use crate::model::actual::{ContainerRecord, ContainerState, PodActual};
use crate::model::pod::{DesiredPod, PodSource, PodUid};
use crate::model::pressure::{Condition, ReclaimError, Reclaimer, Reclaimers, Signal};
use crate::model::verdict::Verdict;

const MI: u64 = 1 << 20;

/// Signals from a script: each `observe` takes the next reading (the last one repeats).
struct Script {
    readings: Mutex<Vec<Observations>>,
    usage: BTreeMap<String, PodUsage>,
    storage: LocalStorage,
}

impl Script {
    fn push(&self, reading: Observations) {
        self.readings.lock().unwrap_or_else(PoisonError::into_inner).push(reading);
    }
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

impl CountingReclaimer {
    fn count(&self) -> u32 {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Reclaimer for CountingReclaimer {
    fn name(&self) -> &'static str {
        "test"
    }
    fn reclaim(&self, _: Signal, _: u64) -> BoxFuture<'_, Result<u64, ReclaimError>> {
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

/// What one pass did (from the steps it ran).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct PassReport {
    /// The signal acted on, if a threshold was met past its grace period.
    signal: Option<Signal>,
    /// Bytes node-level reclaim freed.
    reclaimed: u64,
    /// The pod evicted (UID), if any.
    evicted: Option<String>,
    /// The pods evicted over a local storage limit (UIDs): when any, nothing else was done.
    over_limit: Vec<String>,
    /// The steps, by kind.
    steps: Vec<&'static str>,
}

struct Setup {
    config: EvictionConfig,
    reconciler: EvictionReconciler,
    pods: EvictionInputs,
    driver: EvictionDriver,
    script: Arc<Script>,
    node: NodeEviction,
    seq: u64,
    evictions: Evictions,
    events: NodeEvents,
    reclaims: Arc<CountingReclaimer>,
    writers: (Writer<PodUid, DesiredPod>, Writer<PodUid, PodActual>, Writer<PodUid, Verdict>),
}

fn config(threshold: Threshold, isolation: bool) -> EvictionConfig {
    EvictionConfig {
        policy: Policy { thresholds: vec![threshold], pressure_transition_period: Duration::from_secs(60) },
        monitoring_period: Duration::from_secs(10),
        max_pod_grace_period: Duration::from_secs(5),
        pod_cleanup_timeout: Duration::from_secs(30),
        local_storage_capacity_isolation: isolation,
    }
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
    let (sink, evictions) = super::populator::evictions();
    let reclaims = Arc::new(CountingReclaimer(Mutex::new(0)));
    let registry = prometheus::Registry::new();
    let script = Arc::new(Script { readings: Mutex::new(readings), usage, storage });
    let events = NodeEvents::new();
    let driver = EvictionDriver::new(
        script.clone(),
        sink,
        actual.clone(),
        EvictionMetrics::new(&registry).unwrap_or_else(|e| panic!("{e}")),
        events.clone(),
        Arc::new(|| 1),
    )
    .with_reclaimer(reclaims.clone());
    let pods = EvictionInputs { desired, actual, verdicts, reclaimers: driver.reclaimers().clone() };
    Setup {
        config: config(threshold, isolation),
        reconciler: EvictionReconciler::new(),
        pods,
        driver,
        script,
        node: NodeEviction::default(),
        seq: 0,
        evictions,
        events,
        reclaims,
        writers: (dw, aw, verdict_writer),
    }
}

impl Setup {
    /// Takes a sample as the sampler does.
    async fn sample(&mut self) -> Sample {
        let at = Instant::now();
        let observations = self.script.observe().await.unwrap_or_else(|e| panic!("{e}"));
        self.seq += 1;
        let local_storage = self.config.local_storage_capacity_isolation.then(|| self.script.storage.clone());
        Sample { seq: self.seq, at, observations, local_storage }
    }

    /// One pass over a new sample: every step the reconciler plans, carried out by the driver, until
    /// it plans nothing.
    async fn pass(&mut self) -> PassReport {
        let sample = self.sample().await;
        let mut report = PassReport::default();
        let cancel = CancellationToken::new();
        while let Plan::Run(op) = self.reconciler.plan(&self.pods, &self.config, &self.node, Some(&sample)) {
            assert!(report.steps.len() < 10, "a pass ends: {:?}", report.steps);
            let outcome = self.driver.execute(&EvictionKey::Node, &op, &cancel).await;
            let Outcome::Done(Update::Set(EvictionActual::Node(next))) = outcome else {
                panic!("a step sets the node's actual value")
            };
            report.steps.push(reconcile_engine::Operation::kind(&op));
            match &op {
                EvictionOp::Assess { .. } => {
                    let pass = next.pass.as_ref();
                    if pass.is_some_and(|p| p.over_limit.is_empty()) {
                        report.signal = pass.and_then(|p| p.act_on.as_ref()).map(|m| m.threshold.signal);
                    }
                }
                EvictionOp::Evict { pods, over_limit: true, .. } => {
                    report.over_limit = pods.iter().map(|p| p.uid.clone()).collect();
                }
                EvictionOp::Evict { pods, .. } => report.evicted = pods.first().map(|p| p.uid.clone()),
                EvictionOp::Reclaim { .. } | EvictionOp::MeasureUsage { .. } => {}
            }
            if let Some(Stage::Reclaimed { freed, .. }) = next.pass.as_ref().map(|p| &p.stage) {
                report.reclaimed = *freed;
            }
            self.node = *next;
        }
        report
    }
}

#[tokio::test(start_paused = true)]
async fn one_pod_per_pass_ranked_and_never_a_critical_one() {
    let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
    let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
    let report = s.pass().await;
    assert_eq!(report.evicted.as_deref(), Some("hog"), "the only pod above its request goes first");
    assert_eq!(report.steps, ["assess", "measure", "evict"]);
    assert_eq!(s.reclaims.count(), 0, "no node-level reclaim for memory");
    let v = s.evictions.try_next().unwrap_or_else(|| panic!("hog is evicted"));
    assert_eq!(v.uid, "hog");
    assert_eq!(v.grace, HARD_EVICTION_GRACE);
    assert!(v.message.starts_with("The node was low on resource: memory. Threshold quantity: 100Mi"));
    assert!(s.driver.pressure().conditions()[0].pressure, "MemoryPressure");
    let gauge = s.driver.metrics().node_pressure.with_label_values(&["MemoryPressure"]).get();
    assert_eq!(gauge, 1, "nodelet_node_pressure follows the condition");
    assert_eq!(s.driver.metrics().evictions.with_label_values(&["memory.available"]).get(), 1);
    assert_eq!(
        *s.driver.conditions().borrow(),
        [Condition::MemoryPressure].into(),
        "admission sees the pressure"
    );
    let record = s.node.evicted.get("hog").map(|r| (r.signal, r.message.clone()));
    assert_eq!(record, Some(("memory.available", v.message.clone())), "the actual state records why");
    // Still under pressure: the next pass evicts the next pod, never the critical one.
    assert_eq!(s.pass().await.evicted.as_deref(), Some("steady"));
    assert_eq!(s.pass().await.evicted, None);
    let sent: Vec<String> = std::iter::from_fn(|| s.evictions.try_next()).map(|e| e.uid).collect();
    assert_eq!(sent, ["steady"], "never the critical pod");
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_first_and_evicts_nobody_when_that_is_enough() {
    let t = Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0));
    let readings =
        vec![reading(Signal::NodeFsAvailable, 50 * MI), reading(Signal::NodeFsAvailable, 200 * MI)];
    let mut s = setup(readings, t);
    let report = s.pass().await;
    assert_eq!(report.signal, Some(Signal::NodeFsAvailable));
    assert_eq!(report.reclaimed, MI);
    assert_eq!(report.evicted, None, "reclaim relieved the pressure");
    assert_eq!(report.steps, ["assess", "reclaim"]);
    assert!(s.driver.pressure().conditions()[1].pressure, "DiskPressure is still reported");
    let met = s.events.list().into_iter().find(|e| e.reason == "EvictionThresholdMet").map(|e| e.message);
    assert_eq!(met.as_deref(), Some("Attempting to reclaim ephemeral-storage"));
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_first_then_evicts_when_still_met() {
    let t = Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0));
    let mut s = setup(vec![reading(Signal::NodeFsAvailable, 50 * MI)], t);
    let report = s.pass().await;
    assert_eq!(report.steps, ["assess", "reclaim", "measure", "evict"], "reclaim, then a pod");
    assert_eq!((s.reclaims.count(), report.reclaimed), (1, MI));
    assert!(report.evicted.is_some());
    assert_eq!(s.driver.metrics().evictions.with_label_values(&["nodefs.available"]).get(), 1);
}

/// A reclaimer that records its calls (its name, the signal) in a shared log.
struct LoggingReclaimer(&'static str, Arc<Mutex<Vec<(&'static str, Signal)>>>);

impl Reclaimer for LoggingReclaimer {
    fn name(&self) -> &'static str {
        self.0
    }
    fn reclaim(&self, signal: Signal, _: u64) -> BoxFuture<'_, Result<u64, ReclaimError>> {
        self.1.lock().unwrap_or_else(PoisonError::into_inner).push((self.0, signal));
        Box::pin(async { Ok(2 * MI) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_reclaimer_added_to_the_shared_list_after_the_driver_was_built_is_tried_in_order_under_disk_pressure()
 {
    let t = Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0));
    let readings =
        vec![reading(Signal::NodeFsAvailable, 50 * MI), reading(Signal::NodeFsAvailable, 200 * MI)];
    let mut s = setup(readings, t);
    // As the node does: the list the driver was built with, handed to whoever starts later (an extension).
    let shared = Reclaimers::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    shared.add(Arc::new(LoggingReclaimer("first", log.clone())));
    s.driver = std::mem::replace(&mut s.driver, placeholder()).with_reclaimers(shared.clone());
    s.pods.reclaimers = shared.clone();
    // Added after the driver was built, as an extension that starts after the eviction pair does.
    shared.add(Arc::new(LoggingReclaimer("late", log.clone())));
    let report = s.pass().await;
    assert_eq!(report.steps, ["assess", "reclaim"]);
    assert_eq!(report.reclaimed, 4 * MI, "both reclaimers' bytes count");
    assert_eq!(
        *log.lock().unwrap_or_else(PoisonError::into_inner),
        [("first", Signal::NodeFsAvailable), ("late", Signal::NodeFsAvailable)],
        "the one added after the driver was built is tried too, after the earlier one"
    );
    assert_eq!(s.reclaims.count(), 0, "the shared list took the place of the driver's own");
    assert_eq!(format!("{:?}", s.driver.reclaimers()), r#"["first", "late"]"#);
}

/// A driver that is never run (to move the real one out of a [`Setup`]).
fn placeholder() -> EvictionDriver {
    let (sink, _) = super::populator::evictions();
    let script = Arc::new(Script {
        readings: Mutex::new(Vec::new()),
        usage: BTreeMap::new(),
        storage: LocalStorage::default(),
    });
    EvictionDriver::new(
        script,
        sink,
        reconcile_engine::store().0,
        EvictionMetrics::new(&prometheus::Registry::new()).unwrap_or_else(|e| panic!("{e}")),
        NodeEvents::new(),
        Arc::new(|| 1),
    )
}

#[tokio::test(start_paused = true)]
async fn a_soft_threshold_evicts_after_its_grace_period_with_the_maximum_pod_grace() {
    let t = Threshold::soft(Signal::MemoryAvailable, Amount::Quantity(100 * MI), Duration::from_secs(30));
    let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
    let report = s.pass().await;
    assert_eq!(report.evicted, None, "within the grace period");
    assert_eq!(report.steps, ["assess"]);
    assert!(s.driver.pressure().conditions()[0].pressure, "pressure is reported before the grace period");
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(s.pass().await.evicted.as_deref(), Some("hog"));
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
    let mut s = setup_with(vec![reading(Signal::MemoryAvailable, 50 * MI)], t, over_its_size_limit(), true);
    let report = s.pass().await;
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
    assert_eq!(s.driver.metrics().evictions.with_label_values(&["emptydirfs.limit"]).get(), 1);
    assert_eq!(s.driver.metrics().evictions.with_label_values(&["memory.available"]).get(), 0);
    let event = s.events.list().into_iter().find(|e| e.reason == "Evicted");
    assert_eq!(event.map(|e| (e.type_, e.message)), Some(("Warning", v.message.clone())));
    assert!(
        s.events.list().iter().all(|e| e.reason != "EvictionThresholdMet"),
        "the threshold is not announced in a pass that evicts over a limit"
    );
    // Once evicted, the next pass goes on to the memory threshold.
    let report = s.pass().await;
    assert!(report.over_limit.is_empty());
    assert_eq!(report.evicted.as_deref(), Some("hog"));
}

#[tokio::test(start_paused = true)]
async fn without_local_storage_capacity_isolation_limits_are_not_enforced() {
    let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(MI));
    let mut s = setup_with(vec![reading(Signal::MemoryAvailable, 500 * MI)], t, over_its_size_limit(), false);
    let report = s.pass().await;
    assert_eq!(report, PassReport { steps: vec!["assess"], ..PassReport::default() });
    assert!(s.evictions.try_next().is_none());
    assert_eq!(s.driver.metrics().evictions.with_label_values(&["emptydirfs.limit"]).get(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_condition_outlives_the_pressure_by_the_transition_period_and_events_follow_it() {
    let t = Threshold::hard(Signal::PidAvailable, Amount::Quantity(100));
    let mut s =
        setup(vec![[(Signal::PidAvailable, Observation { available: 50, capacity: 1000 })].into()], t);
    s.writers.0.remove(&"hog".to_owned());
    s.writers.0.remove(&"steady".to_owned());
    let report = s.pass().await;
    assert_eq!(report.signal, Some(Signal::PidAvailable));
    assert_eq!(report.steps, ["assess", "measure"], "ranked, but the critical pod is never evicted");
    assert_eq!(report.evicted, None);
    s.script.push([(Signal::PidAvailable, Observation { available: 900, capacity: 1000 })].into());
    tokio::time::advance(Duration::from_secs(59)).await;
    s.script.readings.lock().unwrap_or_else(PoisonError::into_inner).remove(0);
    s.pass().await;
    assert_eq!(s.node.conditions, [Condition::PidPressure].into(), "59 s of the 60 s transition period");
    assert!(s.driver.pressure().conditions()[2].pressure);
    tokio::time::advance(Duration::from_secs(1)).await;
    s.pass().await;
    assert!(s.node.conditions.is_empty());
    assert!(!s.driver.pressure().conditions()[2].pressure);
    let reasons: Vec<String> =
        s.events.list().into_iter().filter(|e| e.type_ == "Normal").map(|e| e.reason).collect();
    assert_eq!(reasons, ["NodeHasPIDPressure", "NodeHasSufficientPID"]);
}

#[tokio::test(start_paused = true)]
async fn a_pass_runs_to_its_end_and_the_next_takes_a_sample_from_after_it() {
    let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
    let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
    let first = s.sample().await;
    let Plan::Run(assess) = s.reconciler.plan(&s.pods, &s.config, &s.node, Some(&first)) else {
        panic!("assess")
    };
    let cancel = CancellationToken::new();
    let Outcome::Done(Update::Set(EvictionActual::Node(next))) =
        s.driver.execute(&EvictionKey::Node, &assess, &cancel).await
    else {
        panic!("set")
    };
    s.node = *next;
    // A newer sample arrives in the middle of the pass: the pass goes on with its own.
    tokio::time::advance(Duration::from_secs(10)).await;
    let newer = s.sample().await;
    let plan = s.reconciler.plan(&s.pods, &s.config, &s.node, Some(&newer));
    assert!(matches!(plan, Plan::Run(EvictionOp::MeasureUsage { .. })), "{plan:?}");
    let Plan::Run(op) = plan else { return };
    assert!(!reconcile_engine::Operation::given_up_for(&op, None), "never given up for a new sample");
    // The evicted pod takes its time to stop: a sample from before the end of the pass is not used.
    let mut node = s.node.clone();
    if let Some(p) = node.pass.as_mut() {
        p.stage = Stage::Evicted;
    }
    node.updated_at = Some(Instant::now() + Duration::from_secs(5));
    assert_eq!(s.reconciler.plan(&s.pods, &s.config, &node, Some(&newer)), Plan::Idle);
    tokio::time::advance(Duration::from_secs(10)).await;
    let after = s.sample().await;
    assert!(matches!(
        s.reconciler.plan(&s.pods, &s.config, &node, Some(&after)),
        Plan::Run(EvictionOp::Assess { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_plans_the_node_from_the_signals_key_and_an_uncertain_step_moves_on() {
    let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
    let mut s = setup(vec![reading(Signal::MemoryAvailable, 50 * MI)], t);
    let (desired, mut dw) = reconcile_engine::store::<EvictionKey, EvictionConfig>();
    let (actual, mut aw) = reconcile_engine::store::<EvictionKey, EvictionActual>();
    dw.insert(EvictionKey::Node, s.config.clone());
    let sample = s.sample().await;
    aw.insert(EvictionKey::Signals, EvictionActual::Signals(sample));
    let config = desired.get(&EvictionKey::Node);
    let view = View::new(&EvictionKey::Node, config.as_deref(), None, &desired, &actual).with_inputs(&s.pods);
    let Plan::Run(op) = s.reconciler.reconcile(&view) else { panic!("a pass starts") };
    assert_eq!(reconcile_engine::Operation::kind(&op), "assess");
    let signals = actual.get(&EvictionKey::Signals);
    let view =
        View::new(&EvictionKey::Signals, None, signals.as_deref(), &desired, &actual).with_inputs(&s.pods);
    assert_eq!(s.reconciler.reconcile(&view), Plan::Idle, "nothing runs on the signals' key");
    assert_eq!(reconcile_engine::Key::parent(&EvictionKey::Signals), Some(EvictionKey::Node));
    // A step that timed out: measuring moves on without usage.
    let node = op.next().clone();
    let Plan::Run(measure) = s.reconciler.plan(&s.pods, &s.config, &node, None) else { panic!("measure") };
    let Update::Set(EvictionActual::Node(after)) = s.reconciler.uncertain(&EvictionKey::Node, &measure, None)
    else {
        panic!("set")
    };
    assert_eq!(after.pass.map(|p| p.stage), Some(Stage::Measured { usage: BTreeMap::new() }));
}

#[tokio::test(start_paused = true)]
async fn on_an_engine_the_sampler_drives_passes_every_monitoring_period() {
    let t = Threshold::hard(Signal::MemoryAvailable, Amount::Quantity(100 * MI));
    let s = setup(vec![reading(Signal::MemoryAvailable, 500 * MI)], t);
    let Setup { config, reconciler, pods, driver, script, mut evictions, mut writers, .. } = s;
    let pressure = driver.pressure();
    let (desired, mut dw) = reconcile_engine::store::<EvictionKey, EvictionConfig>();
    dw.insert(EvictionKey::Node, config.clone());
    dw.mark_synced();
    let mut engine = Engine::builder("eviction", reconciler, Arc::new(driver), desired).build_with(pods);
    let sampler = SignalSampler::new(script.clone(), engine.observer(), true);
    let actual = engine.actual();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { engine.run(stop.cancelled_owned()).await });
    let sampling = tokio::spawn(sampler.run(config.monitoring_period, shutdown.clone().cancelled_owned()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = |actual: &reconcile_engine::Store<EvictionKey, EvictionActual>| match actual
        .get(&EvictionKey::Node)
        .as_deref()
    {
        Some(EvictionActual::Node(n)) => Some(NodeEviction::clone(n)),
        _ => None,
    };
    assert_eq!(node(&actual).and_then(|n| n.pass).map(|p| p.seq), Some(1), "the first sample at once");
    assert!(!pressure.conditions()[0].pressure);
    // Memory runs low: within one monitoring period, the pressure shows and a pod is evicted.
    script.push(reading(Signal::MemoryAvailable, 50 * MI));
    script.readings.lock().unwrap_or_else(PoisonError::into_inner).remove(0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(pressure.conditions()[0].pressure, "MemoryPressure");
    assert_eq!(evictions.try_next().map(|e| e.uid).as_deref(), Some("hog"));
    assert!(node(&actual).is_some_and(|n| n.evicted.is_empty()), "the driver waits for hog to stop");
    writers.1.insert("hog".into(), PodActual::default());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(node(&actual).is_some_and(|n| n.evicted.contains_key("hog")), "the eviction is recorded");
    shutdown.cancel();
    let _ = task.await;
    let _ = sampling.await;
    drop(writers);
}

#[tokio::test(start_paused = true)]
async fn a_reclaimer_added_after_the_engine_was_built_with_none_is_planned_under_disk_pressure() {
    let t = Threshold::hard(Signal::NodeFsAvailable, Amount::Percentage(10.0));
    let mut s = setup(vec![reading(Signal::NodeFsAvailable, 500 * MI)], t);
    // The node's list, empty when the eviction pair is built (no built-in reclaimer).
    let shared = Reclaimers::new();
    s.driver = std::mem::replace(&mut s.driver, placeholder()).with_reclaimers(shared.clone());
    s.pods.reclaimers = shared.clone();
    let Setup { config, reconciler, pods, driver, script, mut evictions, writers, .. } = s;
    let (desired, mut dw) = reconcile_engine::store::<EvictionKey, EvictionConfig>();
    dw.insert(EvictionKey::Node, config.clone());
    dw.mark_synced();
    let mut engine = Engine::builder("eviction", reconciler, Arc::new(driver), desired).build_with(pods);
    let sampler = SignalSampler::new(script.clone(), engine.observer(), false);
    let actual = engine.actual();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { engine.run(stop.cancelled_owned()).await });
    let sampling = tokio::spawn(sampler.run(config.monitoring_period, shutdown.clone().cancelled_owned()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Added once the engine runs, as an extension that starts after the eviction pair does.
    let late = Arc::new(CountingReclaimer(Mutex::new(0)));
    shared.add(late.clone());
    // The disk fills up; what the reclaimer frees is enough.
    script.push(reading(Signal::NodeFsAvailable, 50 * MI));
    script.push(reading(Signal::NodeFsAvailable, 200 * MI));
    script.readings.lock().unwrap_or_else(PoisonError::into_inner).remove(0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(late.count(), 1, "reclaim is planned with the reclaimer added after the engine was built");
    let stage = match actual.get(&EvictionKey::Node).as_deref() {
        Some(EvictionActual::Node(n)) => n.pass.as_ref().map(|p| p.stage.clone()),
        _ => None,
    };
    assert!(
        matches!(stage, Some(Stage::Reclaimed { freed, after: Some(_) }) if freed == MI),
        "the pass ended at reclaim: {stage:?}"
    );
    assert_eq!(evictions.try_next().map(|e| e.uid), None, "no pod evicted: reclaim was enough");
    shutdown.cancel();
    let _ = task.await;
    let _ = sampling.await;
    drop(writers);
}
