//! Relations and side inputs: an engine watching another store plans the mapped keys again when
//! that store changes (set or removed), coalesced, without polling, and not after it stopped.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Actual, K, Op, fake};
use reconcile_engine::testing::{eventually, settle};
use reconcile_engine::{Engine, Metrics, Plan, Reconciler, Store, Update, View, store};
use tokio::time::Instant;

/// A gate per device, in another pair's store.
type Gates = Store<u8, bool>;

/// What the relation's mapper was called with: the gate and its value (`None` once removed).
type Mapped = Arc<Mutex<Vec<(u8, Option<bool>)>>>;

/// Puts the desired value of a device while its gate is open; removes it once its gate is
/// gone. Counts its calls per run.
#[derive(Default)]
struct Gated {
    calls: Arc<AtomicUsize>,
}

impl Reconciler<u32, Actual> for Gated {
    type Key = K;
    type Op = Op;
    type Inputs = Gates;

    fn reconcile(&self, v: &View<'_, K, u32, Actual, Gates>) -> Plan<Op> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let K::Dev(d) = v.key else { return Plan::Idle };
        let gates = v.inputs;
        match (gates.get(d).map(|open| *open), v.desired, v.actual) {
            (None, _, Some(_)) => Plan::Run(Op::Delete),
            (Some(true), Some(want), actual) if actual != Some(&Actual::Val(*want)) => {
                Plan::Run(Op::Put(*want))
            }
            _ => Plan::Idle,
        }
    }

    fn uncertain(&self, _: &K, _: &Op, _: Option<&Actual>) -> Update<Actual> {
        Update::Set(Actual::Uncertain)
    }
}

struct Setup {
    desired: reconcile_engine::Writer<K, u32>,
    gates: reconcile_engine::Writer<u8, bool>,
    actual: Store<K, Actual>,
    driver: Arc<common::Fake>,
    mapped: Mapped,
    calls: Arc<AtomicUsize>,
    registry: prometheus::Registry,
    stop: tokio::sync::oneshot::Sender<()>,
    join: tokio::task::JoinHandle<reconcile_engine::RunReport>,
}

/// An engine whose reconciler reads the gates and whose relation maps gate `d` to `Dev(d)`; the
/// resync is far away, so only the relation can wake a key.
fn start() -> Setup {
    let (desired_store, desired) = store::<K, u32>();
    let (gate_store, gates): (Gates, _) = store();
    let driver = fake();
    let mapped: Mapped = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let registry = prometheus::Registry::new();
    let metrics = Metrics::new(&registry).expect("metrics");
    let seen = mapped.clone();
    let engine = Engine::builder("gated", Gated { calls: calls.clone() }, driver.clone(), desired_store)
        .metrics(&metrics)
        .resync_period(Duration::from_secs(3600))
        .watches("gates", gate_store.clone(), move |d: &u8, open: Option<&bool>| {
            seen.lock().expect("lock").push((*d, open.copied()));
            [K::Dev(*d)]
        })
        .build_with(gate_store);
    let actual = engine.actual();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let join = tokio::spawn(engine.run(async move {
        let _ = stopped.await;
    }));
    Setup { desired, gates, actual, driver, mapped, calls, registry, stop, join }
}

fn wakeups(registry: &prometheus::Registry) -> u64 {
    use prometheus::Encoder;
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut out).expect("encode");
    let text = String::from_utf8(out).expect("utf8");
    let series = r#"reconcile_engine_relation_wakeups_total{reconciler="gated",relation="gates"} "#;
    text.lines().find_map(|l| l.strip_prefix(series)).map_or(0, |v| v.parse().expect("a count"))
}

#[tokio::test(start_paused = true)]
async fn a_change_in_a_watched_store_should_plan_the_mapped_key_at_once() {
    let mut s = start();
    s.desired.insert(K::Dev(1), 7);
    s.desired.mark_synced();
    settle().await;
    assert_eq!(s.driver.calls().len(), 0, "the gate is closed");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let opened = Instant::now();
    s.gates.insert(1, true);
    assert!(eventually(Duration::from_secs(1), || s.actual.get(&K::Dev(1)).is_some()).await);
    assert_eq!(s.actual.get(&K::Dev(1)).as_deref(), Some(&Actual::Val(7)));
    assert_eq!(s.driver.calls()[0].started, opened, "woken by the relation, not by a poll or resync");
    assert_eq!(*s.mapped.lock().expect("lock"), vec![(1, Some(true))]);
    assert_eq!(wakeups(&s.registry), 1);
}

#[tokio::test(start_paused = true)]
async fn a_removed_key_of_a_watched_store_should_map_with_no_value() {
    let mut s = start();
    s.gates.insert(2, true);
    s.desired.insert(K::Dev(2), 3);
    s.desired.mark_synced();
    assert!(eventually(Duration::from_secs(1), || s.actual.get(&K::Dev(2)).is_some()).await);
    s.mapped.lock().expect("lock").clear();
    s.gates.remove(&2);
    assert!(eventually(Duration::from_secs(1), || s.actual.get(&K::Dev(2)).is_none()).await);
    assert_eq!(s.driver.call_count(&K::Dev(2), "delete"), 1);
    assert_eq!(*s.mapped.lock().expect("lock"), vec![(2, None)]);
}

#[tokio::test(start_paused = true)]
async fn many_changes_of_one_watched_key_should_be_mapped_and_planned_once() {
    let mut s = start();
    s.desired.insert(K::Dev(3), 1);
    s.desired.mark_synced();
    settle().await;
    let calls_before = s.calls.load(Ordering::SeqCst);
    // A burst with no await in between: the engine sees it as one change.
    for i in 0..1000 {
        s.gates.insert(3, i % 2 == 1);
    }
    settle().await;
    assert_eq!(*s.mapped.lock().expect("lock"), vec![(3, Some(true))]);
    assert_eq!(wakeups(&s.registry), 1);
    // One plan for the wake-up, one after the put completed.
    assert_eq!(s.calls.load(Ordering::SeqCst) - calls_before, 2);
    assert_eq!(s.driver.kind_count("put"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stopped_engine_should_not_be_woken() {
    let mut s = start();
    s.desired.insert(K::Dev(4), 1);
    s.desired.mark_synced();
    settle().await;
    s.stop.send(()).expect("engine runs");
    s.join.await.expect("join");
    s.gates.insert(4, true);
    settle().await;
    assert!(s.mapped.lock().expect("lock").is_empty(), "the relation was dropped with the engine");
    assert_eq!(s.driver.calls().len(), 0);
    assert_eq!(wakeups(&s.registry), 0);
}

#[tokio::test(start_paused = true)]
async fn an_engine_with_a_relation_should_not_spin_while_nothing_changes() {
    let s = start();
    settle().await;
    let before = s.calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(s.calls.load(Ordering::SeqCst), before, "nothing planned without a change");
    drop(s.gates);
}
