//! The synthetic workload: pod-like keys and small values, a reconciler that plans one `apply` per
//! key whose actual generation differs from the desired one, and a driver that finishes every
//! operation at once.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use reconcile_engine::{CancellationToken, Driver, Operation, Outcome, Plan, Reconciler, Update, View};
use tokio::sync::Notify;

/// A realistic store key: `namespace-07/pod-name-012345` (28 bytes, heap-allocated exactly).
pub(crate) fn key(i: usize) -> String {
    let mut key = format!("namespace-{:02}/pod-name-{i:06}", i % 50);
    key.shrink_to_fit();
    key
}

/// The keys `0..n`.
pub(crate) fn keys(n: usize) -> Vec<String> {
    (0..n).map(key).collect()
}

/// Phase of a pod-like object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
}

/// A small value, the size of what a node agent keeps per object (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PodState {
    pub(crate) uid: u64,
    pub(crate) generation: u64,
    pub(crate) restarts: u32,
    pub(crate) phase: Phase,
}

impl PodState {
    pub(crate) fn new(i: usize) -> Self {
        Self { uid: i as u64, generation: 1, restarts: 0, phase: Phase::Running }
    }
}

/// The one operation kind of the workload (plus teardown, never planned here).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    Apply(PodState),
    Delete,
}

impl Operation for Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Apply(_) => "apply",
            Op::Delete => "delete",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, Op::Delete)
    }
}

/// Plans an `apply` when the actual generation differs from the desired one.
#[derive(Debug, Default)]
pub(crate) struct BenchReconciler;

impl BenchReconciler {
    /// The decision, callable without a [`View`] (which only the engine can build).
    #[inline]
    pub(crate) fn plan(desired: Option<&PodState>, actual: Option<&PodState>) -> Plan<Op> {
        match (desired, actual) {
            (Some(d), Some(a)) if a.generation == d.generation => Plan::Idle,
            (Some(d), _) => Plan::Run(Op::Apply(*d)),
            (None, Some(_)) => Plan::Run(Op::Delete),
            (None, None) => Plan::Idle,
        }
    }
}

impl Reconciler<PodState, PodState> for BenchReconciler {
    type Key = String;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, view: &View<'_, String, PodState, PodState>) -> Plan<Op> {
        Self::plan(view.desired, view.actual)
    }

    fn uncertain(&self, _key: &String, _op: &Op, _actual: Option<&PodState>) -> Update<PodState> {
        Update::Remove
    }
}

/// A driver whose operations finish at once. It counts executions and wakes [`done`] when the
/// `target`-th one runs; [`Driver::reconstruct`] hands out entries given beforehand.
///
/// [`done`]: InstantDriver::done
#[derive(Debug)]
pub(crate) struct InstantDriver {
    executed: AtomicUsize,
    target: usize,
    done: Notify,
    existing: Mutex<Vec<(String, PodState)>>,
}

impl InstantDriver {
    /// A driver that signals [`done`](InstantDriver::done) after `target` executions.
    pub(crate) fn new(target: usize) -> Self {
        Self { executed: AtomicUsize::new(0), target, done: Notify::new(), existing: Mutex::new(Vec::new()) }
    }

    /// A driver that reports `existing` at start-up.
    pub(crate) fn with_existing(existing: Vec<(String, PodState)>) -> Self {
        Self { existing: Mutex::new(existing), ..Self::new(usize::MAX) }
    }

    /// Completes once `target` operations have run.
    pub(crate) async fn done(&self) {
        self.done.notified().await;
    }

    pub(crate) fn executed(&self) -> usize {
        self.executed.load(Ordering::Relaxed)
    }
}

impl Driver<String, Op, PodState> for InstantDriver {
    type Error = Infallible;

    fn execute(
        &self,
        _key: &String,
        op: &Op,
        _cancel: &CancellationToken,
    ) -> impl Future<Output = Outcome<PodState, Infallible>> + Send {
        if self.executed.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
        std::future::ready(Outcome::Done(match op {
            Op::Apply(state) => Update::Set(*state),
            Op::Delete => Update::Remove,
        }))
    }

    fn reconstruct(&self) -> impl Future<Output = Result<Vec<(String, PodState)>, Infallible>> + Send {
        let existing = std::mem::take(&mut *self.existing.lock().unwrap_or_else(PoisonError::into_inner));
        std::future::ready(Ok(existing))
    }
}
