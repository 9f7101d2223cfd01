//! Prometheus metrics of the engine, one label set per reconciler.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `reconcile_engine_operations_total` | counter | `reconciler`, `kind`, `result` | operations finished, by result: `done`, `failed`, `uncertain`, `timeout`, `cancelled` |
//! | `reconcile_engine_operation_duration_seconds` | histogram | `reconciler`, `kind` | time from start to finish of an operation |
//! | `reconcile_engine_operations_in_flight` | gauge | `reconciler` | operations running now |
//! | `reconcile_engine_keys_backing_off` | gauge | `reconciler` | keys waiting out a backoff after a failure |
//! | `reconcile_engine_queue_depth` | gauge | `reconciler` | planned operations not yet started (key busy, slots full, or backing off) |
//! | `reconcile_engine_desired_keys` | gauge | `reconciler` | entries in the desired store |
//! | `reconcile_engine_actual_keys` | gauge | `reconciler` | entries in the actual store |
//! | `reconcile_engine_loop_duration_seconds` | histogram | `reconciler` | time of one planning pass over the changed keys |
//! | `reconcile_engine_reconciles_total` | counter | `reconciler` | keys reconsidered by the reconciler |
//! | `reconcile_engine_relation_wakeups_total` | counter | `reconciler`, `relation` | keys planned again because a store the reconciler watches changed ([`EngineBuilder::watches`](crate::EngineBuilder::watches)) |
//!
//! One [`Metrics`] registers these families once in a registry; engines sharing it tell their
//! series apart by the `reconciler` label. Two engines with the **same name** on one `Metrics`
//! share their series: counters add up and each gauge shows whichever engine set it last, so give
//! every engine its own name. Creating a second `Metrics` in the same registry fails with
//! [`prometheus::Error::AlreadyReg`][AlreadyReg]. To print the metrics, or serve them, encode the
//! registry with [`prometheus::TextEncoder`][TextEncoder]:
//!
//! ```
//! let registry = prometheus::Registry::new();
//! let metrics = reconcile_engine::Metrics::new(&registry)?;
//! assert!(matches!(reconcile_engine::Metrics::new(&registry), Err(prometheus::Error::AlreadyReg)));
//! let _counts = metrics.for_reconciler("mirror"); // what an engine named "mirror" does
//! print!("{}", prometheus::TextEncoder::new().encode_to_string(&registry.gather())?);
//! # Ok::<(), prometheus::Error>(())
//! ```
//!
//! [AlreadyReg]: https://docs.rs/prometheus/0.14/prometheus/enum.Error.html#variant.AlreadyReg
//! [TextEncoder]: https://docs.rs/prometheus/0.14/prometheus/struct.TextEncoder.html

use std::fmt;
use std::sync::Arc;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// How an operation ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpResult {
    /// Succeeded.
    Done,
    /// Failed; nothing changed.
    Failed,
    /// Result unknown, reported by the driver.
    Uncertain,
    /// Ran past its timeout; result unknown.
    Timeout,
    /// Cancelled because desired state no longer wanted it, and ended without success: the driver
    /// returned [`Outcome::Failed`](crate::Outcome::Failed) after the operation's cancellation
    /// token fired. Not a failure: it adds nothing to the key's count of failures in a row and
    /// starts no backoff delay, and it changes neither the actual value nor the key's
    /// [`OpStatus`](crate::OpStatus). An `Uncertain` or `Done` outcome after cancellation counts
    /// as [`Uncertain`](OpResult::Uncertain) or [`Done`](OpResult::Done).
    Cancelled,
}

impl OpResult {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            OpResult::Done => "done",
            OpResult::Failed => "failed",
            OpResult::Uncertain => "uncertain",
            OpResult::Timeout => "timeout",
            OpResult::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for OpResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The engine's metric families, registered once in a [`Registry`][Registry] and shared by every
/// reconciler (each gets its own `reconciler` label through [`Metrics::for_reconciler`]).
///
/// [Registry]: https://docs.rs/prometheus/0.14/prometheus/struct.Registry.html
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Families>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct Families {
    operations: IntCounterVec,
    duration: HistogramVec,
    in_flight: IntGaugeVec,
    backing_off: IntGaugeVec,
    queue_depth: IntGaugeVec,
    desired_keys: IntGaugeVec,
    actual_keys: IntGaugeVec,
    loop_duration: HistogramVec,
    reconciles: IntCounterVec,
    relation_wakeups: IntCounterVec,
}

/// Buckets for operation durations: 1 ms to about 2 min (driver calls are I/O, often slow).
const OP_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Buckets for planning passes: 10 µs to 1 s (a pass is CPU only).
const LOOP_BUCKETS: &[f64] = &[0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];

impl Metrics {
    /// Creates the metric families and registers them in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let r = &["reconciler"];
        let families = Families {
            operations: IntCounterVec::new(
                Opts::new("reconcile_engine_operations_total", "Operations finished, by kind and result."),
                &["reconciler", "kind", "result"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "reconcile_engine_operation_duration_seconds",
                    "Duration of operations from start to finish, by kind.",
                )
                .buckets(OP_BUCKETS.to_vec()),
                &["reconciler", "kind"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new("reconcile_engine_operations_in_flight", "Operations running now."),
                r,
            )?,
            backing_off: IntGaugeVec::new(
                Opts::new("reconcile_engine_keys_backing_off", "Keys waiting out a backoff after a failure."),
                r,
            )?,
            queue_depth: IntGaugeVec::new(
                Opts::new("reconcile_engine_queue_depth", "Planned operations not yet started."),
                r,
            )?,
            desired_keys: IntGaugeVec::new(
                Opts::new("reconcile_engine_desired_keys", "Entries in the desired store."),
                r,
            )?,
            actual_keys: IntGaugeVec::new(
                Opts::new("reconcile_engine_actual_keys", "Entries in the actual store."),
                r,
            )?,
            loop_duration: HistogramVec::new(
                HistogramOpts::new(
                    "reconcile_engine_loop_duration_seconds",
                    "Duration of one planning pass over the changed keys.",
                )
                .buckets(LOOP_BUCKETS.to_vec()),
                r,
            )?,
            reconciles: IntCounterVec::new(
                Opts::new("reconcile_engine_reconciles_total", "Keys reconsidered by the reconciler."),
                r,
            )?,
            relation_wakeups: IntCounterVec::new(
                Opts::new(
                    "reconcile_engine_relation_wakeups_total",
                    "Keys planned again because a watched store changed, by relation.",
                ),
                &["reconciler", "relation"],
            )?,
        };
        registry.register(Box::new(families.relation_wakeups.clone()))?;
        registry.register(Box::new(families.operations.clone()))?;
        registry.register(Box::new(families.duration.clone()))?;
        registry.register(Box::new(families.in_flight.clone()))?;
        registry.register(Box::new(families.backing_off.clone()))?;
        registry.register(Box::new(families.queue_depth.clone()))?;
        registry.register(Box::new(families.desired_keys.clone()))?;
        registry.register(Box::new(families.actual_keys.clone()))?;
        registry.register(Box::new(families.loop_duration.clone()))?;
        registry.register(Box::new(families.reconciles.clone()))?;
        Ok(Self { inner: Arc::new(families) })
    }

    /// Metrics in a registry of their own, for an engine whose metrics nobody scrapes.
    pub fn unregistered() -> Self {
        // A fresh registry cannot hold a conflicting family, so registration cannot fail.
        Self::new(&Registry::new()).unwrap_or_else(|e| unreachable!("fresh registry rejected metrics: {e}"))
    }

    /// The wake-up counter of relation `relation` of reconciler `reconciler`.
    pub(crate) fn relation_wakeups(&self, reconciler: &str, relation: &str) -> IntCounter {
        self.inner.relation_wakeups.with_label_values(&[reconciler, relation])
    }

    /// The handles of one reconciler.
    pub fn for_reconciler(&self, name: &str) -> ReconcilerMetrics {
        let f = &self.inner;
        ReconcilerMetrics {
            name: name.into(),
            families: self.inner.clone(),
            in_flight: f.in_flight.with_label_values(&[name]),
            backing_off: f.backing_off.with_label_values(&[name]),
            queue_depth: f.queue_depth.with_label_values(&[name]),
            desired_keys: f.desired_keys.with_label_values(&[name]),
            actual_keys: f.actual_keys.with_label_values(&[name]),
            loop_duration: f.loop_duration.with_label_values(&[name]),
            reconciles: f.reconciles.with_label_values(&[name]),
            op_cache: Vec::new(),
        }
    }
}

/// The metric handles of one reconciler, with a cache so that the hot path never formats labels.
pub struct ReconcilerMetrics {
    name: Arc<str>,
    families: Arc<Families>,
    pub(crate) in_flight: IntGauge,
    pub(crate) backing_off: IntGauge,
    pub(crate) queue_depth: IntGauge,
    pub(crate) desired_keys: IntGauge,
    pub(crate) actual_keys: IntGauge,
    pub(crate) loop_duration: Histogram,
    pub(crate) reconciles: IntCounter,
    /// Handles per operation kind: a reconciler has a handful of kinds, so a list searched by
    /// the kind's address (then its text) beats hashing the text on every operation.
    op_cache: Vec<(&'static str, OpHandles)>,
}

impl fmt::Debug for ReconcilerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcilerMetrics").field("name", &self.name).finish_non_exhaustive()
    }
}

struct OpHandles {
    duration: Histogram,
    results: [Option<IntCounter>; 5],
}

impl ReconcilerMetrics {
    /// The reconciler's name (the `reconciler` label).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts one finished operation and observes its duration.
    pub(crate) fn observe_operation(&mut self, kind: &'static str, result: OpResult, seconds: f64) {
        let families = &self.families;
        let name = &self.name;
        let pos = match self.op_cache.iter().position(|(k, _)| std::ptr::eq(*k, kind) || *k == kind) {
            Some(pos) => pos,
            None => {
                let handles = OpHandles {
                    duration: families.duration.with_label_values(&[name, kind]),
                    results: Default::default(),
                };
                self.op_cache.push((kind, handles));
                self.op_cache.len() - 1
            }
        };
        let handles = &mut self.op_cache[pos].1;
        handles.duration.observe(seconds);
        let slot = &mut handles.results[result as usize];
        slot.get_or_insert_with(|| families.operations.with_label_values(&[name, kind, result.as_str()]))
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn two_reconcilers_should_share_one_registry_with_their_own_labels() {
        let registry = Registry::new();
        let metrics = Metrics::new(&registry).expect("register");
        let mut a = metrics.for_reconciler("a");
        let mut b = metrics.for_reconciler("b");
        a.observe_operation("mount", OpResult::Done, 0.01);
        a.observe_operation("mount", OpResult::Failed, 0.02);
        b.observe_operation("pull", OpResult::Timeout, 1.0);
        let mut out = Vec::new();
        prometheus::TextEncoder::new().encode(&registry.gather(), &mut out).expect("encode");
        let text = String::from_utf8(out).expect("utf8");
        assert!(
            text.contains(
                r#"reconcile_engine_operations_total{kind="mount",reconciler="a",result="done"} 1"#
            )
        );
        assert!(
            text.contains(
                r#"reconcile_engine_operations_total{kind="pull",reconciler="b",result="timeout"} 1"#
            )
        );
        assert!(
            text.contains(
                r#"reconcile_engine_operation_duration_seconds_count{kind="mount",reconciler="a"} 2"#
            )
        );
    }

    #[test]
    fn registering_twice_in_one_registry_should_fail_cleanly() {
        let registry = Registry::new();
        Metrics::new(&registry).expect("first");
        assert!(Metrics::new(&registry).is_err());
    }
}
