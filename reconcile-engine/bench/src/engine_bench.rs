//! Measurements of reconcile-engine itself: no-op planning passes, and operation throughput of the
//! bare [`Executor`] and of the whole [`Engine`].

use std::future::poll_fn;
use std::hint::black_box;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use prometheus::Registry;
use reconcile_engine::{Engine, Executor, ExecutorConfig, Metrics, Plan, store};

use crate::clock::{Stopwatch, Timed};
use crate::domain::{BenchReconciler, InstantDriver, Op, PodState};

const RECONCILES: &str = "reconcile_engine_reconciles_total";
const LOOP_DURATION: &str = "reconcile_engine_loop_duration_seconds";

/// The value of the counter `name` (first label set), 0 if absent.
fn counter(registry: &Registry, name: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric().iter())
        .map(|metric| metric.get_counter().get_value() as u64)
        .next()
        .unwrap_or(0)
}

/// Sum (seconds) and count of the histogram `name` (first label set).
fn histogram(registry: &Registry, name: &str) -> (f64, u64) {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric().iter())
        .map(|metric| (metric.get_histogram().get_sample_sum(), metric.get_histogram().get_sample_count()))
        .next()
        .unwrap_or((0.0, 0))
}

/// The engine's per-key work of a no-op pass done by hand: two store lookups and the decision,
/// for every key in `order` (indices into `keys`). Returns the time of the loop.
///
/// [`View`](reconcile_engine::View) cannot be built outside the engine, so this calls the
/// reconciler's decision function directly; it is the floor under the engine's planning pass.
/// Visiting the keys in insertion order walks the stores' keys in allocation order, which the
/// hardware prefetches; a shuffled order visits them as the engine does (hash order).
pub(crate) fn manual_pass(keys: &[String], order: &[usize]) -> Duration {
    let (desired, mut desired_writer) = store::<String, PodState>();
    let (actual, mut actual_writer) = store::<String, PodState>();
    for (i, key) in keys.iter().enumerate() {
        desired_writer.insert(key.clone(), PodState::new(i));
        actual_writer.insert(key.clone(), PodState::new(i));
    }
    let started = Instant::now();
    let mut idle = 0usize;
    for &i in order {
        let key = &keys[i];
        let d = desired.get(key);
        let a = actual.get(key);
        if matches!(BenchReconciler::plan(d.as_deref(), a.as_deref()), Plan::Idle) {
            idle += 1;
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(black_box(idle), order.len(), "every key should be idle");
    elapsed
}

/// `0..n` in a fixed pseudo-random order (xorshift64 Fisher–Yates).
pub(crate) fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// What [`engine_passes`] measured.
#[derive(Debug, Clone)]
pub(crate) struct EnginePasses {
    /// From `run` to the end of the first planning pass: reconstruction of every entry into the
    /// actual store, marking every key dirty, and the first planning pass.
    pub(crate) cold_start: Duration,
    /// The first planning pass (loop-duration histogram, first observation).
    pub(crate) first_pass: Duration,
    /// Mean of the resync planning passes (loop-duration histogram, later observations).
    pub(crate) resync_pass: Duration,
    /// Resync passes measured.
    pub(crate) resyncs: u64,
    /// Approximate wall time of a resync, from its tick to the end of its planning pass (includes
    /// marking every key dirty; the tick is known only to the timer's 1 ms granularity).
    pub(crate) resync_wall: Duration,
    /// Operations the driver ran (should be 0: nothing to do).
    pub(crate) operations: usize,
}

/// Runs an engine whose desired and reconstructed actual states are equal: it plans every key
/// once at start-up and again at each of `resyncs` resyncs, and runs nothing.
pub(crate) async fn engine_passes(keys: &[String], resync_period: Duration, resyncs: u64) -> EnginePasses {
    let n = keys.len() as u64;
    let (desired, mut writer) = store::<String, PodState>();
    for (i, key) in keys.iter().enumerate() {
        writer.insert(key.clone(), PodState::new(i));
    }
    writer.mark_synced();
    let existing = keys.iter().enumerate().map(|(i, key)| (key.clone(), PodState::new(i))).collect();
    let driver = Arc::new(InstantDriver::with_existing(existing));
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).expect("registering the engine's metrics in a fresh registry");
    let engine = Engine::builder("bench-pass", BenchReconciler, driver.clone(), desired)
        .metrics(&metrics)
        .resync_period(resync_period)
        .build();
    let actual = engine.actual();

    // The engine polls its shutdown future after every planning pass (it never sleeps between a
    // pass and that poll), so the future can watch the reconcile counter without a waker and
    // stamp the end of each pass.
    let mut pass_ends: Vec<(Instant, (f64, u64))> = Vec::new();
    let started = Instant::now();
    let shutdown = poll_fn(|_| {
        let reconciles = counter(&registry, RECONCILES);
        if reconciles >= n * (pass_ends.len() as u64 + 1) {
            pass_ends.push((Instant::now(), histogram(&registry, LOOP_DURATION)));
        }
        if reconciles >= n * (resyncs + 1) { Poll::Ready(()) } else { Poll::Pending }
    });
    let report = engine.run(shutdown).await;
    assert_eq!(report.reconstructed, keys.len(), "the driver should have reconstructed every key");
    assert_eq!(actual.len(), keys.len());

    let (total_sum, total_count) = histogram(&registry, LOOP_DURATION);
    let (first_end, (first_sum, first_count)) = pass_ends.first().copied().expect("a first pass");
    assert_eq!(first_count, 1, "the first pass should be the histogram's first observation");
    let passes_after = total_count.saturating_sub(first_count).max(1);
    // The resync interval starts just before the first pass: tick k fires at
    // `first_end - first_pass + k * period`.
    let first_pass = Duration::from_secs_f64(first_sum);
    let loop_start = first_end - first_pass;
    let walls: Vec<Duration> = pass_ends
        .iter()
        .enumerate()
        .skip(1)
        .map(|(k, (end, _))| end.saturating_duration_since(loop_start + resync_period * k as u32))
        .collect();
    let resync_wall = walls.iter().sum::<Duration>() / walls.len().max(1) as u32;
    EnginePasses {
        cold_start: first_end - started,
        first_pass,
        resync_pass: Duration::from_secs_f64((total_sum - first_sum) / passes_after as f64),
        resyncs: total_count - first_count,
        resync_wall,
        operations: driver.executed(),
    }
}

/// Submits one `apply` for each key to a bare executor, then drains every completion. Returns
/// the time from the first submit to the last completion.
pub(crate) async fn executor_throughput(keys: Vec<String>, max_concurrent: usize) -> Timed {
    let n = keys.len();
    let driver = Arc::new(InstantDriver::new(n));
    let config = ExecutorConfig::default().with_max_concurrent(max_concurrent).with_seed(1);
    let mut executor = Executor::new("bench-executor", driver.clone(), config, &Metrics::unregistered());
    let ops: Vec<(String, Op)> =
        keys.into_iter().enumerate().map(|(i, key)| (key, Op::Apply(PodState::new(i)))).collect();
    let started = Stopwatch::start();
    for (key, op) in ops {
        executor.submit(key, op);
    }
    for _ in 0..n {
        black_box(executor.next_completion().await);
    }
    let elapsed = started.stop();
    assert!(executor.is_idle(), "every operation should have finished");
    assert_eq!(driver.executed(), n);
    elapsed
}

/// Fills a desired store with one entry per key, starts an engine with an empty actual state, and
/// returns the time from `run` until the actual store holds every key.
pub(crate) async fn engine_throughput(keys: Vec<String>, max_concurrent: usize) -> Timed {
    let n = keys.len();
    let (desired, mut writer) = store::<String, PodState>();
    for (i, key) in keys.into_iter().enumerate() {
        writer.insert(key, PodState::new(i));
    }
    writer.mark_synced();
    let driver = Arc::new(InstantDriver::new(n));
    let engine = Engine::builder("bench-engine", BenchReconciler, driver.clone(), desired)
        .max_concurrent(max_concurrent)
        .build();
    let actual = engine.actual();
    let started = Stopwatch::start();
    // Shutdown is asked for when the last operation starts; `run` then lets the operations still
    // in flight finish and writes their results before it returns.
    let report = engine.run(driver.done()).await;
    let elapsed = started.stop();
    assert_eq!(report.operations, n as u64, "one operation per key");
    assert_eq!(actual.len(), n, "the actual store should hold every key");
    elapsed
}
