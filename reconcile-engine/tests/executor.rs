//! The executor on its own: submission results, coalescing, hierarchy, backoff and timeouts.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reconcile_engine::testing::Step;
use reconcile_engine::{
    BackoffConfig, Executor, ExecutorConfig, Metrics, OpError, OpResult, Outcome, Submitted,
};
use tokio::time::Instant;

fn executor(driver: &Arc<Fake>, config: ExecutorConfig) -> Executor<K, Op, Actual, Fake> {
    Executor::new("unit", driver.clone(), config, &Metrics::unregistered())
}

fn exact() -> ExecutorConfig {
    ExecutorConfig::default().with_backoff(BackoffConfig::default().without_jitter()).with_seed(1)
}

#[tokio::test(start_paused = true)]
async fn executor_should_coalesce_requests_for_a_busy_key_and_run_only_the_latest_after() {
    let driver = fake();
    driver.script(K::Dev(0), [Step::Delay(Duration::from_secs(1))]);
    let mut ex = executor(&driver, exact());
    assert_eq!(ex.submit(K::Dev(0), Op::Put(1)), Submitted::Started);
    assert_eq!(ex.submit(K::Dev(0), Op::Put(1)), Submitted::Coalesced);
    assert_eq!(ex.submit(K::Dev(0), Op::Put(2)), Submitted::Queued);
    assert_eq!(ex.submit(K::Dev(0), Op::Put(3)), Submitted::Queued);
    assert_eq!(ex.queued(), 1);
    let first = ex.next_completion().await;
    assert_eq!(first.op, Op::Put(1));
    let second = ex.next_completion().await;
    assert_eq!(second.op, Op::Put(3));
    let ops: Vec<Op> = driver.calls().into_iter().map(|c| c.op).collect();
    assert_eq!(ops, vec![Op::Put(1), Op::Put(3)]);
    assert!(ex.is_idle());
}

#[tokio::test(start_paused = true)]
async fn executor_should_park_a_child_while_its_parent_runs_and_release_it_after() {
    let driver = fake();
    driver.set_latency(Duration::from_millis(100));
    let mut ex = executor(&driver, exact());
    assert_eq!(ex.submit(K::Dev(0), Op::Put(1)), Submitted::Started);
    assert_eq!(ex.submit(K::Pod(0, 1), Op::Put(1)), Submitted::Queued);
    assert_eq!(ex.submit(K::Pod(1, 1), Op::Put(1)), Submitted::Started, "another device's pod is unrelated");
    assert_eq!(ex.in_flight(), 2);
    let mut done = Vec::new();
    for _ in 0..3 {
        done.push(ex.next_completion().await.key);
    }
    assert_eq!(done.iter().filter(|k| **k == K::Pod(0, 1)).count(), 1);
    let calls = driver.calls();
    let dev = calls.iter().find(|c| c.key == K::Dev(0)).expect("dev");
    let pod = calls.iter().find(|c| c.key == K::Pod(0, 1)).expect("pod");
    assert!(pod.started >= dev.finished.expect("finished"));
    driver.assert_no_overlap();
}

#[tokio::test(start_paused = true)]
async fn executor_should_park_a_parent_while_a_child_runs() {
    let driver = fake();
    driver.set_latency(Duration::from_millis(100));
    let mut ex = executor(&driver, exact());
    assert_eq!(ex.submit(K::Pod(0, 1), Op::Put(1)), Submitted::Started);
    assert_eq!(ex.submit(K::Pod(0, 2), Op::Put(1)), Submitted::Started, "siblings run in parallel");
    assert_eq!(ex.submit(K::Dev(0), Op::Delete), Submitted::Queued);
    for _ in 0..3 {
        ex.next_completion().await;
    }
    driver.assert_no_overlap();
    assert_eq!(driver.checker().max_in_flight(), 2);
}

#[tokio::test(start_paused = true)]
async fn executor_should_hold_a_retry_until_the_backoff_ends_and_then_run_it_by_itself() {
    let driver = fake();
    driver.script(K::Dev(0), [Step::Fail, Step::Fail]);
    let mut ex = executor(&driver, exact());
    ex.submit(K::Dev(0), Op::Put(1));
    let c = ex.next_completion().await;
    assert_eq!(c.result, OpResult::Failed);
    assert_eq!(c.failures, 1);
    let t0 = Instant::now();
    match ex.submit(K::Dev(0), Op::Put(1)) {
        Submitted::BackingOff { until } => assert_eq!(until - t0, Duration::from_millis(500)),
        other => panic!("expected backoff, got {other:?}"),
    }
    assert_eq!(ex.retry_at(&K::Dev(0), "put"), Some(t0 + Duration::from_millis(500)));
    let c = ex.next_completion().await;
    assert_eq!(c.failures, 2);
    assert_eq!(Instant::now() - t0, Duration::from_millis(500));
    ex.submit(K::Dev(0), Op::Put(1));
    let c = ex.next_completion().await;
    assert_eq!(c.result, OpResult::Done);
    assert_eq!(c.failures, 0);
    assert_eq!(Instant::now() - t0, Duration::from_millis(1500));
    assert_eq!(ex.backing_off(), 0);
}

#[tokio::test(start_paused = true)]
async fn executor_should_time_out_an_operation_as_uncertain() {
    let driver = fake();
    driver.script(K::Dev(0), [Step::Hang]);
    let mut ex = executor(&driver, exact().with_default_timeout(Duration::from_secs(3)));
    ex.submit(K::Dev(0), Op::Put(1));
    let c = ex.next_completion().await;
    assert_eq!(c.result, OpResult::Timeout);
    assert!(matches!(c.outcome, Outcome::Uncertain(OpError::TimedOut(d)) if d == Duration::from_secs(3)));
    assert_eq!(driver.checker().in_flight(), 0, "the dropped operation ended");
}

#[tokio::test(start_paused = true)]
async fn executor_should_cancel_a_running_operation_on_request() {
    let driver = fake();
    driver.script(K::Dev(0), [Step::Hang]);
    let mut ex = executor(&driver, exact());
    ex.submit(K::Dev(0), Op::Put(1));
    assert!(ex.cancel(&K::Dev(0)));
    let c = ex.next_completion().await;
    assert_eq!(c.result, OpResult::Cancelled);
    assert_eq!(c.failures, 0, "a cancellation is not a failure");
    assert_eq!(c.retry_at, None, "and starts no backoff");
    assert_eq!(ex.backing_off(), 0);
    assert!(!ex.cancel(&K::Dev(0)));
}

#[tokio::test(start_paused = true)]
async fn executor_should_start_teardown_before_setup_when_slots_are_scarce() {
    let driver = fake();
    driver.set_latency(Duration::from_millis(10));
    let mut ex = executor(&driver, exact().with_max_concurrent(1));
    ex.submit(K::Dev(0), Op::Put(1));
    ex.submit(K::Dev(1), Op::Put(1));
    ex.submit(K::Dev(2), Op::Delete);
    for _ in 0..3 {
        ex.next_completion().await;
    }
    let keys: Vec<K> = driver.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys, vec![K::Dev(0), K::Dev(2), K::Dev(1)]);
}

#[tokio::test(start_paused = true)]
async fn withdrawn_operations_should_not_run() {
    let driver = fake();
    driver.set_latency(Duration::from_millis(10));
    let mut ex = executor(&driver, exact());
    ex.submit(K::Dev(0), Op::Put(1));
    ex.submit(K::Dev(0), Op::Put(2));
    ex.withdraw(&K::Dev(0));
    ex.next_completion().await;
    ex.pump();
    assert!(ex.is_idle());
    assert_eq!(driver.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_operation_that_finishes_at_once_should_run_in_submit_and_stay_in_flight_until_taken() {
    let driver = fake();
    driver.script(K::Dev(1), [Step::Delay(Duration::from_millis(10))]);
    let mut ex = executor(&driver, exact());
    assert_eq!(ex.submit(K::Dev(0), Op::Put(1)), Submitted::Started);
    assert_eq!(driver.calls().len(), 1, "the driver ran inside submit");
    assert_eq!(ex.submit(K::Dev(1), Op::Put(1)), Submitted::Started);
    assert_eq!(ex.in_flight(), 2, "a finished operation counts until its completion is taken");
    assert_eq!(ex.submit(K::Dev(0), Op::Put(1)), Submitted::Coalesced, "still running for the executor");
    let first = ex.try_next_completion().expect("the instant operation is ready");
    assert_eq!((first.key, first.result), (K::Dev(0), OpResult::Done));
    assert!(ex.try_next_completion().is_none(), "the delayed one is still running");
    let second = ex.next_completion().await;
    assert_eq!((second.key, second.result), (K::Dev(1), OpResult::Done));
    assert!(ex.is_idle());
    assert_eq!(driver.calls().len(), 2);
}
