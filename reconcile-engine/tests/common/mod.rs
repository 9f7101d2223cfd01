//! A small test domain: hierarchical keys (devices and device+pod pairs), numeric desired
//! values, and an actual state that can be uncertain.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::testing::FakeDriver;
use reconcile_engine::{Engine, Key, Operation, Plan, Reconciler, Store, Update, View, Writer, store};

pub const PODS_PER_DEV: u8 = 4;

#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum K {
    Dev(u8),
    Pod(u8, u8),
}

impl Key for K {
    fn parent(&self) -> Option<Self> {
        match self {
            K::Dev(_) => None,
            K::Pod(d, _) => Some(K::Dev(*d)),
        }
    }
}

#[derive(Clone, PartialEq, Debug)]
pub enum Actual {
    Val(u32),
    Uncertain,
}

#[derive(Clone, PartialEq, Debug)]
pub enum Op {
    Put(u32),
    Delete,
}

impl Operation for Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Put(_) => "put",
            Op::Delete => "delete",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, Op::Delete)
    }
}

/// Puts desired values; a pod key waits for its device to exist; a device is deleted only after
/// its pods are gone; uncertain results are cleaned up (deleted) or retried (put).
#[derive(Debug, Default)]
pub struct Rec;

impl Reconciler<u32, Actual> for Rec {
    type Key = K;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, K, u32, Actual>) -> Plan<Op> {
        match (v.desired, v.actual) {
            (Some(d), Some(Actual::Val(a))) if a == d => Plan::Idle,
            (Some(d), _) => {
                if let Some(parent) = v.key.parent()
                    && !matches!(v.actual_store.get(&parent).as_deref(), Some(Actual::Val(_)))
                {
                    return Plan::Idle;
                }
                Plan::Run(Op::Put(*d))
            }
            (None, Some(_)) => {
                if let K::Dev(d) = v.key
                    && (0..PODS_PER_DEV).any(|p| v.actual_store.contains_key(&K::Pod(*d, p)))
                {
                    return Plan::Idle;
                }
                Plan::Run(Op::Delete)
            }
            (None, None) => Plan::Idle,
        }
    }

    fn uncertain(&self, _key: &K, _op: &Op, _actual: Option<&Actual>) -> Update<Actual> {
        Update::Set(Actual::Uncertain)
    }
}

pub type Fake = FakeDriver<K, Op, Actual>;

pub fn fake() -> Arc<Fake> {
    Arc::new(FakeDriver::new(|_k, op| match op {
        Op::Put(v) => Update::Set(Actual::Val(*v)),
        Op::Delete => Update::Remove,
    }))
}

pub fn matches(d: &u32, a: &Actual) -> bool {
    *a == Actual::Val(*d)
}

pub struct Harness {
    pub desired: Store<K, u32>,
    pub writer: Writer<K, u32>,
    pub driver: Arc<Fake>,
}

pub fn harness() -> Harness {
    let (desired, writer) = store();
    Harness { desired, writer, driver: fake() }
}

pub type TestEngine = Engine<u32, Actual, Rec, Fake>;

/// An engine with exact (unjittered) backoff and a short timeout, not yet running.
pub fn engine(h: &Harness) -> reconcile_engine::EngineBuilder<u32, Actual, Rec, Fake> {
    Engine::builder("test", Rec, h.driver.clone(), h.desired.clone())
        .backoff(reconcile_engine::BackoffConfig::default().without_jitter())
        .default_timeout(Duration::from_secs(5))
}

/// Spawns the engine; returns the actual store, a shutdown trigger and the join handle.
pub fn spawn<R: Reconciler<u32, Actual, Key = K, Op = Op>>(
    engine: Engine<u32, Actual, R, Fake>,
) -> (Store<K, Actual>, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<reconcile_engine::RunReport>)
{
    let actual = engine.actual();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(engine.run(async move {
        let _ = rx.await;
    }));
    (actual, tx, handle)
}
