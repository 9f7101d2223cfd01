//! The engine's guarantees, each on paused tokio time with the fake driver.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use reconcile_engine::testing::{Step, eventually, settle, wait_converged};
use reconcile_engine::{Engine, Metrics, Operation, Plan, Reconciler, Update, View};
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

#[tokio::test(start_paused = true)]
async fn engine_should_converge_actual_to_desired_with_one_put_per_key() {
    let mut h = harness();
    for d in 0..50 {
        h.writer.insert(K::Dev(d), u32::from(d));
    }
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert_eq!(h.driver.kind_count("put"), 50);
    assert_eq!(h.driver.kind_count("delete"), 0);
    h.driver.assert_no_overlap();
}

#[tokio::test(start_paused = true)]
async fn removed_desired_keys_should_be_torn_down() {
    let mut h = harness();
    h.writer.insert(K::Dev(1), 1);
    h.writer.insert(K::Dev(2), 2);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    h.writer.remove(&K::Dev(1));
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert!(!actual.contains_key(&K::Dev(1)));
    assert_eq!(h.driver.call_count(&K::Dev(1), "delete"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_for_a_busy_key_should_be_coalesced_and_run_after_the_current_one() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(1))]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(0), "put") == 1).await);
    // While put(1) runs, desired changes twice: put(1) is cancelled, the last value wins.
    h.writer.insert(K::Dev(0), 2);
    h.writer.insert(K::Dev(0), 3);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let ops: Vec<Op> = h.driver.calls().into_iter().map(|c| c.op).collect();
    assert_eq!(ops, vec![Op::Put(1), Op::Put(3)]);
    assert_eq!(actual.get(&K::Dev(0)).as_deref(), Some(&Actual::Val(3)));
    h.driver.assert_no_overlap();
}

#[tokio::test(start_paused = true)]
async fn operations_on_a_key_should_never_overlap_even_under_churn() {
    let mut h = harness();
    h.driver.set_latency(Duration::from_millis(30));
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    for round in 0..40u32 {
        for d in 0..5u8 {
            if (round + u32::from(d)) % 3 == 0 {
                h.writer.remove(&K::Dev(d));
            } else {
                h.writer.insert(K::Dev(d), round);
            }
        }
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    wait_converged(&h.desired, &actual, LONG, matches).await;
    h.driver.assert_no_overlap();
}

#[tokio::test(start_paused = true)]
async fn hierarchical_keys_should_serialize_parent_and_children_but_run_siblings_in_parallel() {
    let mut h = harness();
    h.driver.set_latency(Duration::from_millis(100));
    h.writer.insert(K::Dev(0), 1);
    for p in 0..PODS_PER_DEV {
        h.writer.insert(K::Pod(0, p), 1);
    }
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    h.driver.assert_no_overlap();
    // The four pods ran together once the device was up.
    assert_eq!(h.driver.checker().max_in_flight(), usize::from(PODS_PER_DEV));
    let calls = h.driver.calls();
    let dev_done = calls[0].finished.expect("device put finished");
    assert_eq!(calls[0].key, K::Dev(0));
    assert!(calls[1..].iter().all(|c| c.started >= dev_done));

    // A change to the device waits for no pod, but a device delete waits for all pods' deletes.
    for p in 0..PODS_PER_DEV {
        h.writer.remove(&K::Pod(0, p));
    }
    h.writer.remove(&K::Dev(0));
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let calls = h.driver.calls();
    let dev_delete = calls.iter().find(|c| c.key == K::Dev(0) && c.op == Op::Delete).expect("device deleted");
    let last_pod_delete = calls
        .iter()
        .filter(|c| matches!(c.key, K::Pod(..)) && c.op == Op::Delete)
        .filter_map(|c| c.finished)
        .max();
    assert!(dev_delete.started >= last_pod_delete.expect("pods deleted"));
    h.driver.assert_no_overlap();
}

#[tokio::test(start_paused = true)]
async fn failures_should_back_off_exponentially_from_500ms() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Fail, Step::Fail, Step::Fail, Step::Succeed]);
    h.writer.insert(K::Dev(0), 7);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let starts: Vec<Instant> = h.driver.calls().iter().map(|c| c.started).collect();
    assert_eq!(starts.len(), 4);
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, vec![Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)]);
}

#[tokio::test(start_paused = true)]
async fn backoff_should_reset_after_a_success() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Fail, Step::Fail, Step::Succeed, Step::Fail, Step::Succeed]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    h.writer.insert(K::Dev(0), 2);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let starts: Vec<Instant> = h.driver.calls().iter().map(|c| c.started).collect();
    assert_eq!(starts.len(), 5);
    // After the success, the next failure waits 500 ms again, not 2 s.
    assert_eq!(starts[4] - starts[3], Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn backoff_should_reset_when_the_operation_kind_changes() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Succeed]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    // Updates fail repeatedly and back off for seconds...
    h.driver.script(K::Dev(0), [Step::Fail, Step::Fail, Step::Fail, Step::Fail]);
    h.writer.insert(K::Dev(0), 2);
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(0), "put") == 5).await);
    // ...but removing the key runs the delete at once, not after the put's backoff.
    let removed_at = Instant::now();
    h.writer.remove(&K::Dev(0));
    assert!(eventually(LONG, || !actual.contains_key(&K::Dev(0))).await);
    let delete = h.driver.calls().into_iter().find(|c| c.op == Op::Delete).expect("delete ran");
    assert!(delete.started - removed_at < Duration::from_millis(10), "{:?}", delete.started - removed_at);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_operation_should_be_uncertain_and_retried_not_assumed_done() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Hang]);
    h.writer.insert(K::Dev(0), 4);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).default_timeout(Duration::from_secs(2)).build());
    assert!(eventually(LONG, || actual.get(&K::Dev(0)).as_deref() == Some(&Actual::Uncertain)).await);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let calls = h.driver.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].finished.expect("dropped") - calls[0].started, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_result_should_be_cleaned_up_when_no_longer_desired() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Uncertain]);
    h.writer.insert(K::Dev(0), 4);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).build());
    assert!(eventually(LONG, || actual.get(&K::Dev(0)).as_deref() == Some(&Actual::Uncertain)).await);
    h.writer.remove(&K::Dev(0));
    // Never assumed absent: a delete cleans it up, at once (a new kind of operation).
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert_eq!(h.driver.call_count(&K::Dev(0), "delete"), 1);
    assert_eq!(h.driver.call_count(&K::Dev(0), "put"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_operation_no_longer_desired_should_be_cancelled() {
    let mut h = harness();
    let registry = prometheus::Registry::new();
    let metrics = Metrics::new(&registry).expect("metrics");
    h.driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(60))]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).metrics(&metrics).build());
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(0), "put") == 1).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.writer.remove(&K::Dev(0));
    assert!(eventually(LONG, || h.driver.calls()[0].finished.is_some()).await);
    let call = &h.driver.calls()[0];
    assert!(call.finished.expect("finished") - call.started < Duration::from_secs(2));
    settle().await;
    assert!(actual.is_empty());
    assert_eq!(h.driver.calls().len(), 1, "nothing to clean up after a cancelled put that changed nothing");
    let text = gather(&registry);
    assert!(
        text.contains(
            r#"reconcile_engine_operations_total{kind="put",reconciler="test",result="cancelled"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrency_should_be_bounded() {
    let mut h = harness();
    h.driver.set_latency(Duration::from_millis(50));
    for d in 0..30 {
        h.writer.insert(K::Dev(d), 1);
    }
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).max_concurrent(3).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert_eq!(h.driver.checker().max_in_flight(), 3);
}

#[tokio::test(start_paused = true)]
async fn reconstructed_state_should_be_loaded_before_planning_and_teardown_held_until_synced() {
    let mut h = harness();
    h.driver.set_existing(vec![(K::Dev(1), Actual::Val(1)), (K::Dev(2), Actual::Val(2))]);
    h.driver.fail_reconstruct(2);
    h.writer.insert(K::Dev(1), 1);
    h.writer.insert(K::Dev(3), 3);
    let (actual, _stop, _join) = spawn(engine(&h).build());
    // Reconstruction is retried, then Dev(1) already matches and Dev(3) is created...
    assert!(eventually(LONG, || actual.get(&K::Dev(3)).is_some()).await);
    assert_eq!(h.driver.call_count(&K::Dev(1), "put"), 0, "existing state is not created twice");
    // ...but Dev(2), not (yet) desired, is not deleted while the desired state is incomplete.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(h.driver.kind_count("delete"), 0);
    assert!(actual.contains_key(&K::Dev(2)));
    h.writer.mark_synced();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert_eq!(h.driver.call_count(&K::Dev(2), "delete"), 1);
}

/// A reconciler whose plan depends on something outside the stores: only the periodic resync
/// or a recheck notices it.
struct Gated {
    open: Arc<AtomicBool>,
    recheck: Option<Duration>,
}

impl Reconciler<u32, Actual> for Gated {
    type Key = K;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, K, u32, Actual>) -> Plan<Op> {
        if !self.open.load(Ordering::SeqCst) {
            return self.recheck.map_or(Plan::Idle, Plan::RecheckAfter);
        }
        Rec.reconcile(v)
    }

    fn uncertain(&self, key: &K, op: &Op, actual: Option<&Actual>) -> Update<Actual> {
        Rec.uncertain(key, op, actual)
    }
}

#[tokio::test(start_paused = true)]
async fn periodic_resync_should_reconsider_unchanged_keys() {
    let mut h = harness();
    let open = Arc::new(AtomicBool::new(false));
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let engine = Engine::builder(
        "gated",
        Gated { open: open.clone(), recheck: None },
        h.driver.clone(),
        h.desired.clone(),
    )
    .resync_period(Duration::from_secs(10))
    .build();
    let actual = engine.actual();
    let _join = tokio::spawn(engine.run(std::future::pending()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    open.store(true, Ordering::SeqCst);
    let opened = Instant::now();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let started = h.driver.calls()[0].started;
    assert!(started - opened >= Duration::from_secs(8) && started - opened <= Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn recheck_after_should_reconsider_the_key_after_the_delay() {
    let mut h = harness();
    let open = Arc::new(AtomicBool::new(false));
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let gated = Gated { open: open.clone(), recheck: Some(Duration::from_secs(3)) };
    let engine = Engine::builder("gated", gated, h.driver.clone(), h.desired.clone()).build();
    let actual = engine.actual();
    let _join = tokio::spawn(engine.run(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    open.store(true, Ordering::SeqCst);
    let opened = Instant::now();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let started = h.driver.calls()[0].started;
    // Started by the 3 s recheck, long before the 30 s resync.
    assert!(started - opened <= Duration::from_secs(3), "{:?}", started - opened);
    assert_eq!(h.driver.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_should_let_running_operations_finish_within_the_deadline() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(2))]);
    h.driver.script(K::Dev(1), [Step::Hang]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.insert(K::Dev(1), 1);
    h.writer.mark_synced();
    let (actual, stop, join) = spawn(
        engine(&h)
            .default_timeout(Duration::from_secs(600))
            .shutdown_deadline(Duration::from_secs(5))
            .build(),
    );
    assert!(eventually(LONG, || h.driver.calls().len() == 2).await);
    let asked = Instant::now();
    stop.send(()).expect("engine running");
    let report = join.await.expect("engine task");
    assert_eq!(report.abandoned, 1, "the hanging operation is abandoned");
    assert_eq!(asked.elapsed(), Duration::from_secs(5));
    assert_eq!(actual.get(&K::Dev(0)).as_deref(), Some(&Actual::Val(1)), "the finished one was recorded");
}

#[tokio::test(start_paused = true)]
async fn metrics_should_count_operations_and_report_store_sizes() {
    let mut h = harness();
    let registry = prometheus::Registry::new();
    let metrics = Metrics::new(&registry).expect("metrics");
    h.driver.script(K::Dev(0), [Step::Fail]);
    for d in 0..3 {
        h.writer.insert(K::Dev(d), 1);
    }
    h.writer.mark_synced();
    let (actual, _stop, _join) = spawn(engine(&h).metrics(&metrics).build());
    wait_converged(&h.desired, &actual, LONG, matches).await;
    settle().await;
    let text = gather(&registry);
    for line in [
        r#"reconcile_engine_operations_total{kind="put",reconciler="test",result="done"} 3"#,
        r#"reconcile_engine_operations_total{kind="put",reconciler="test",result="failed"} 1"#,
        r#"reconcile_engine_operation_duration_seconds_count{kind="put",reconciler="test"} 4"#,
        r#"reconcile_engine_desired_keys{reconciler="test"} 3"#,
        r#"reconcile_engine_actual_keys{reconciler="test"} 3"#,
        r#"reconcile_engine_operations_in_flight{reconciler="test"} 0"#,
        r#"reconcile_engine_keys_backing_off{reconciler="test"} 0"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(text.contains("reconcile_engine_loop_duration_seconds_count"));
}

#[tokio::test(start_paused = true)]
async fn every_operation_should_run_in_a_span_carrying_its_key() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let subscriber = tracing_subscriber::registry().with(SpanRecorder(spans.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut h = harness();
    h.writer.insert(K::Dev(5), 1);
    h.writer.mark_synced();
    let engine = engine(&h).build();
    let actual = engine.actual();
    let run = engine.run(async {
        let _ = eventually(LONG, || actual.contains_key(&K::Dev(5))).await;
    });
    run.await;
    let spans = spans.lock().expect("spans").clone();
    assert!(
        spans
            .iter()
            .any(|s| s.contains("operation") && s.contains("op.key=Dev(5)") && s.contains("op.kind=put")),
        "{spans:?}"
    );
}

struct SpanRecorder(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanRecorder {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct V(String);
        impl tracing::field::Visit for V {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", field.name(), value));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.push_str(&format!(" {}={}", field.name(), value));
            }
        }
        let mut v = V(attrs.metadata().name().to_string());
        attrs.record(&mut v);
        self.0.lock().expect("spans").push(v.0);
    }
}

fn gather(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut out).expect("encode");
    String::from_utf8(out).expect("utf8")
}

#[test]
fn engine_run_future_should_be_send() {
    fn assert_send<T: Send>(_: &T) {}
    let h = harness();
    let engine = engine(&h).build();
    let fut = engine.run(std::future::pending());
    assert_send(&fut);
    let _ = Op::Delete.kind();
}

#[tokio::test(start_paused = true)]
async fn observations_should_update_actual_state_and_trigger_reconciliation() {
    let mut h = harness();
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let mut engine = engine(&h).build();
    let observer = engine.observer();
    let (actual, _stop, _join) = spawn(engine);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    // The world drifts (someone changed it behind our back): the observation repairs it.
    observer.observe(K::Dev(0), Update::Set(Actual::Val(9)), Instant::now());
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(0), "put") == 2).await);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    // Something appears that nobody wants: it is torn down.
    observer.observe(K::Dev(7), Update::Set(Actual::Val(1)), Instant::now());
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(7), "delete") == 1).await);
    wait_converged(&h.desired, &actual, LONG, matches).await;
}

#[tokio::test(start_paused = true)]
async fn observations_older_than_the_last_completion_should_be_dropped() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(1))]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let mut engine = engine(&h).build();
    let observer = engine.observer();
    let (actual, _stop, _join) = spawn(engine);
    assert!(eventually(LONG, || h.driver.calls().len() == 1).await);
    // A relist taken while the put runs sees nothing yet; it arrives after the put finished.
    let seen_at = Instant::now();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    observer.observe(K::Dev(0), Update::Remove, seen_at);
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(actual.get(&K::Dev(0)).as_deref(), Some(&Actual::Val(1)));
    assert_eq!(h.driver.calls().len(), 1, "the stale observation caused no second put");
}

#[tokio::test(start_paused = true)]
async fn an_observation_made_at_the_instant_of_the_last_completion_should_be_kept() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(1))]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let mut engine = engine(&h).build();
    let observer = engine.observer();
    let (actual, _stop, _join) = spawn(engine);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    // On paused time the engine handles the completion at the instant the driver returned.
    let done_at = h.driver.calls()[0].finished.expect("finished");
    observer.observe(K::Dev(0), Update::Remove, done_at - Duration::from_nanos(1));
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(actual.get(&K::Dev(0)).as_deref(), Some(&Actual::Val(1)), "older: dropped");
    assert_eq!(h.driver.calls().len(), 1);
    // A tie keeps the observation: the key is gone, and the engine puts it again.
    observer.observe(K::Dev(0), Update::Remove, done_at);
    assert!(eventually(LONG, || h.driver.call_count(&K::Dev(0), "put") == 2).await, "equal: kept");
    wait_converged(&h.desired, &actual, LONG, matches).await;
}

#[tokio::test(start_paused = true)]
async fn op_status_should_show_the_last_failure_and_its_retry_time_until_success() {
    let mut h = harness();
    h.driver.script(K::Dev(0), [Step::Fail, Step::Fail]);
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let engine = engine(&h).build();
    let status = engine.op_status();
    let (actual, _stop, _join) = spawn(engine);
    assert!(eventually(LONG, || status.get(&K::Dev(0)).is_some_and(|s| s.failures == 2)).await);
    let s = status.get(&K::Dev(0)).expect("status");
    assert_eq!(s.op, Op::Put(1));
    assert_eq!(s.result, reconcile_engine::OpResult::Failed);
    assert_eq!(s.error.to_string(), "injected failure");
    let retry_at = s.retry_at.expect("backing off");
    let left = retry_at - Instant::now();
    assert!(left > Duration::from_millis(990) && left <= Duration::from_secs(1), "{left:?}");
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert!(status.get(&K::Dev(0)).is_none(), "cleared by the success");
}

/// Puts a device's desired value only while the wall clock of its view is past `after`; until
/// then, checks again in a second. A decision on wall time, read only from the view.
struct NotBefore {
    after: std::time::SystemTime,
}

impl Reconciler<u32, Actual> for NotBefore {
    type Key = K;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, K, u32, Actual>) -> Plan<Op> {
        if v.wall < self.after {
            return Plan::RecheckAfter(Duration::from_secs(1));
        }
        Rec.reconcile(v)
    }

    fn uncertain(&self, key: &K, op: &Op, actual: Option<&Actual>) -> Update<Actual> {
        Rec.uncertain(key, op, actual)
    }
}

#[tokio::test(start_paused = true)]
async fn the_wall_clock_of_the_views_should_be_the_engines_and_follow_paused_time() {
    let mut h = harness();
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let start = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let rec = NotBefore { after: start + Duration::from_secs(60) };
    let engine = Engine::builder("wall", rec, h.driver.clone(), h.desired.clone())
        .wall_clock(reconcile_engine::WallClock::tokio(start))
        .build();
    let began = Instant::now();
    let (actual, _stop, _join) = spawn(engine);
    wait_converged(&h.desired, &actual, LONG, matches).await;
    let started = h.driver.calls()[0].started - began;
    // Started once the engine's clock (not the system's) passed `after`: 60 s of paused time.
    assert!(started >= Duration::from_secs(60) && started <= Duration::from_secs(61), "{started:?}");
}

#[tokio::test(start_paused = true)]
async fn an_engine_should_plan_nothing_before_the_stores_it_waits_for_synced() {
    let mut h = harness();
    h.writer.insert(K::Dev(0), 1);
    h.writer.insert(K::Dev(1), 2);
    h.writer.mark_synced();
    let (first, mut first_writer) = reconcile_engine::store::<u8, bool>();
    let (second, mut second_writer) = reconcile_engine::store::<String, u32>();
    let engine = engine(&h).waits_for("first", first).waits_for("second", second).build();
    let (actual, _stop, _join) = spawn(engine);
    settle().await;
    first_writer.mark_synced();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(h.driver.calls().is_empty(), "planned before every gate synced");
    // A desired change meanwhile is kept, and planned with the rest once the gates open.
    h.writer.insert(K::Dev(2), 3);
    second_writer.mark_synced();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert_eq!(h.driver.kind_count("put"), 3);
}

#[tokio::test(start_paused = true)]
async fn a_gate_whose_writer_was_dropped_unsynced_should_not_hold_the_engine() {
    let mut h = harness();
    h.writer.insert(K::Dev(0), 1);
    h.writer.mark_synced();
    let (gate, gate_writer) = reconcile_engine::store::<u8, bool>();
    let (actual, _stop, _join) = spawn(engine(&h).waits_for("gone", gate).build());
    settle().await;
    assert!(h.driver.calls().is_empty());
    drop(gate_writer);
    wait_converged(&h.desired, &actual, LONG, matches).await;
}

/// Creates desired values; deletes actual ones without a desired value only once the desired
/// store synced, by answering `Idle` before (not a held teardown).
struct WaitsForDesired;

impl Reconciler<u32, Actual> for WaitsForDesired {
    type Key = K;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, K, u32, Actual>) -> Plan<Op> {
        match Rec.reconcile(v) {
            Plan::Run(Op::Delete) if !v.desired_synced => Plan::Idle,
            plan => plan,
        }
    }

    fn uncertain(&self, key: &K, op: &Op, actual: Option<&Actual>) -> Update<Actual> {
        Rec.uncertain(key, op, actual)
    }
}

#[tokio::test(start_paused = true)]
async fn the_desired_store_syncing_should_plan_every_key_again() {
    let mut h = harness();
    h.driver.set_existing(vec![(K::Dev(7), Actual::Val(7))]);
    h.writer.insert(K::Dev(0), 1);
    let engine = Engine::builder("desired-sync", WaitsForDesired, h.driver.clone(), h.desired.clone())
        .resync_period(Duration::from_secs(3600))
        .build();
    let (actual, _stop, _join) = spawn(engine);
    assert!(eventually(LONG, || actual.get(&K::Dev(0)).as_deref() == Some(&Actual::Val(1))).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(actual.contains_key(&K::Dev(7)), "nothing deleted before the desired store synced");
    assert_eq!(h.driver.kind_count("delete"), 0);
    h.writer.mark_synced();
    wait_converged(&h.desired, &actual, LONG, matches).await;
    assert!(!actual.contains_key(&K::Dev(7)));
}
