//! Test kit (feature `testing`): a recording fake driver with scripted faults, an invariant
//! checker for overlapping operations, and helpers for tests on paused tokio time.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use reconcile_engine::testing::{FakeDriver, Step};
//! use reconcile_engine::{Operation, Update};
//!
//! #[derive(Clone, PartialEq, Debug)]
//! struct Put(u32);
//! impl Operation for Put {
//!     fn kind(&self) -> &'static str { "put" }
//! }
//!
//! let driver = Arc::new(FakeDriver::<String, Put, u32>::new(|_key, op| Update::Set(op.0)));
//! driver.script("a".to_string(), [Step::Fail, Step::Hang, Step::Succeed]);
//! driver.set_latency(Duration::from_millis(5));
//! assert_eq!(driver.calls().len(), 0);
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Driver, Key, Operation, Outcome, Store, Update};

/// What the fake driver does for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Succeed after the configured latency (the default step).
    Succeed,
    /// Succeed after this extra delay (so the call can be cancelled or time out meanwhile).
    Delay(Duration),
    /// Fail: nothing changes.
    Fail,
    /// Report an uncertain result.
    Uncertain,
    /// Never finish on its own: the call ends only by cancellation or by the executor's timeout.
    Hang,
}

/// Errors of the fake driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FakeError {
    /// A scripted or injected failure.
    #[error("injected failure")]
    Injected,
    /// The call observed its cancellation token.
    #[error("cancelled")]
    Cancelled,
}

/// One recorded call.
#[derive(Debug, Clone)]
pub struct Call<K, Op> {
    /// The key.
    pub key: K,
    /// The operation.
    pub op: Op,
    /// What the driver was told to do.
    pub step: Step,
    /// When it started.
    pub started: Instant,
    /// When it returned or was dropped (timeout); `None` while it runs.
    pub finished: Option<Instant>,
}

/// Detects operations that overlap on conflicting keys (equal, or one an ancestor of the other).
/// Share one between drivers with `Arc` to check across them.
#[derive(Debug)]
pub struct OverlapChecker<K> {
    inner: Mutex<CheckerState<K>>,
}

#[derive(Debug)]
struct CheckerState<K> {
    in_flight: Vec<K>,
    violations: Vec<(K, K)>,
    max_in_flight: usize,
}

impl<K: Key> Default for OverlapChecker<K> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(CheckerState {
                in_flight: Vec::new(),
                violations: Vec::new(),
                max_in_flight: 0,
            }),
        }
    }
}

impl<K: Key> OverlapChecker<K> {
    fn lock(&self) -> MutexGuard<'_, CheckerState<K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the start of an operation on `key`; returns a guard that records its end when
    /// dropped (so a timed-out, dropped operation ends too).
    pub fn enter(self: &Arc<Self>, key: &K) -> OverlapGuard<K> {
        let mut state = self.lock();
        let clashes: Vec<K> = state.in_flight.iter().filter(|k| k.conflicts_with(key)).cloned().collect();
        for other in clashes {
            state.violations.push((other, key.clone()));
        }
        state.in_flight.push(key.clone());
        state.max_in_flight = state.max_in_flight.max(state.in_flight.len());
        OverlapGuard { checker: self.clone(), key: key.clone() }
    }

    /// Every pair of overlapping operations seen: (the one running, the one that started).
    pub fn violations(&self) -> Vec<(K, K)> {
        self.lock().violations.clone()
    }

    /// The most operations ever running at once.
    pub fn max_in_flight(&self) -> usize {
        self.lock().max_in_flight
    }

    /// Operations running now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// Panics if two operations ever overlapped on conflicting keys.
    #[track_caller]
    pub fn assert_no_overlap(&self) {
        let violations = self.violations();
        assert!(violations.is_empty(), "operations overlapped on conflicting keys: {violations:?}");
    }
}

/// Ends an operation in an [`OverlapChecker`] when dropped.
#[derive(Debug)]
pub struct OverlapGuard<K: Key> {
    checker: Arc<OverlapChecker<K>>,
    key: K,
}

impl<K: Key> Drop for OverlapGuard<K> {
    fn drop(&mut self) {
        let mut state = self.checker.lock();
        if let Some(i) = state.in_flight.iter().position(|k| *k == self.key) {
            state.in_flight.swap_remove(i);
        }
    }
}

/// Wraps any driver and records overlapping operations in an [`OverlapChecker`].
/// [`Driver::execute`] runs the inner driver's inside the check; [`Driver::reconstruct`] is the
/// inner driver's, unchanged (reconstruction runs before any operation, so there is nothing to
/// check).
#[derive(Debug)]
pub struct Checked<Dr, K> {
    inner: Dr,
    checker: Arc<OverlapChecker<K>>,
}

impl<Dr, K: Key> Checked<Dr, K> {
    /// Wraps `inner`.
    pub fn new(inner: Dr) -> Self {
        Self { inner, checker: Arc::default() }
    }

    /// The checker.
    pub fn checker(&self) -> &Arc<OverlapChecker<K>> {
        &self.checker
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &Dr {
        &self.inner
    }
}

impl<K: Key, Op: Operation, A: Send + 'static, Dr: Driver<K, Op, A>> Driver<K, Op, A> for Checked<Dr, K> {
    type Error = Dr::Error;

    async fn execute(&self, key: &K, op: &Op, cancel: &CancellationToken) -> Outcome<A, Self::Error> {
        let _guard = self.checker.enter(key);
        self.inner.execute(key, op, cancel).await
    }

    fn reconstruct(&self) -> impl Future<Output = Result<Vec<(K, A)>, Self::Error>> + Send {
        self.inner.reconstruct()
    }
}

type ApplyFn<K, Op, A> = Box<dyn Fn(&K, &Op) -> Update<A> + Send + Sync>;
type InjectFn<K, Op> = Box<dyn FnMut(&K, &Op) -> Step + Send>;

/// A recording fake driver: succeeds by default (the `apply` function says how the actual value
/// changes), with scripted steps per key and an optional fault injector. It checks for overlapping
/// operations itself.
///
/// Its [`Driver::reconstruct`] reports the entries given to
/// [`set_existing`](FakeDriver::set_existing) (none by default), after failing as many times as
/// [`fail_reconstruct`](FakeDriver::fail_reconstruct) asked; reconstructions are not recorded as
/// calls.
pub struct FakeDriver<K, Op, A> {
    apply: ApplyFn<K, Op, A>,
    state: Mutex<FakeState<K, Op, A>>,
    checker: Arc<OverlapChecker<K>>,
}

struct FakeState<K, Op, A> {
    scripts: HashMap<K, VecDeque<Step>>,
    injector: Option<InjectFn<K, Op>>,
    calls: Vec<Call<K, Op>>,
    existing: Vec<(K, A)>,
    reconstruct_failures: usize,
    latency: Duration,
}

impl<K: Key, Op, A> fmt::Debug for FakeDriver<K, Op, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeDriver").finish_non_exhaustive()
    }
}

impl<K: Key, Op: Operation, A: Clone + Send + Sync + 'static> FakeDriver<K, Op, A> {
    /// A fake whose successful operations change the actual value as `apply` says.
    pub fn new(apply: impl Fn(&K, &Op) -> Update<A> + Send + Sync + 'static) -> Self {
        Self {
            apply: Box::new(apply),
            state: Mutex::new(FakeState {
                scripts: HashMap::new(),
                injector: None,
                calls: Vec::new(),
                existing: Vec::new(),
                reconstruct_failures: 0,
                latency: Duration::ZERO,
            }),
            checker: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FakeState<K, Op, A>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues steps for the next calls on `key` (after them, calls use the injector or succeed).
    pub fn script(&self, key: K, steps: impl IntoIterator<Item = Step>) {
        self.lock().scripts.entry(key).or_default().extend(steps);
    }

    /// Decides the step of every call that has no scripted step left.
    pub fn inject(&self, injector: impl FnMut(&K, &Op) -> Step + Send + 'static) {
        self.lock().injector = Some(Box::new(injector));
    }

    /// Removes the injector: unscripted calls succeed again.
    pub fn stop_injecting(&self) {
        self.lock().injector = None;
    }

    /// Every call takes this long before its step (cancellation ends the wait with
    /// [`FakeError::Cancelled`]).
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// What [`Driver::reconstruct`] reports.
    pub fn set_existing(&self, entries: Vec<(K, A)>) {
        self.lock().existing = entries;
    }

    /// Makes the next `n` reconstructions fail.
    pub fn fail_reconstruct(&self, n: usize) {
        self.lock().reconstruct_failures = n;
    }

    /// Every call so far, in start order.
    pub fn calls(&self) -> Vec<Call<K, Op>> {
        self.lock().calls.clone()
    }

    /// How many calls ran `kind` on `key`.
    pub fn call_count(&self, key: &K, kind: &str) -> usize {
        self.lock().calls.iter().filter(|c| c.key == *key && c.op.kind() == kind).count()
    }

    /// How many calls ran `kind` on any key.
    pub fn kind_count(&self, kind: &str) -> usize {
        self.lock().calls.iter().filter(|c| c.op.kind() == kind).count()
    }

    /// The overlap checker of this driver.
    pub fn checker(&self) -> &Arc<OverlapChecker<K>> {
        &self.checker
    }

    /// Panics if two operations ever overlapped on conflicting keys.
    #[track_caller]
    pub fn assert_no_overlap(&self) {
        self.checker.assert_no_overlap();
    }
}

struct CallGuard<'a, K, Op, A> {
    driver: &'a FakeDriver<K, Op, A>,
    index: usize,
}

impl<K, Op, A> Drop for CallGuard<'_, K, Op, A> {
    fn drop(&mut self) {
        let mut state = self.driver.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(call) = state.calls.get_mut(self.index) {
            call.finished = Some(Instant::now());
        }
    }
}

impl<K: Key, Op: Operation, A: Clone + Send + Sync + 'static> Driver<K, Op, A> for FakeDriver<K, Op, A> {
    type Error = FakeError;

    async fn execute(&self, key: &K, op: &Op, cancel: &CancellationToken) -> Outcome<A, FakeError> {
        let _overlap = self.checker.enter(key);
        let (step, latency, index) = {
            let mut state = self.lock();
            let scripted = state.scripts.get_mut(key).and_then(VecDeque::pop_front);
            let step = match scripted {
                Some(step) => step,
                None => state.injector.as_mut().map_or(Step::Succeed, |inject| inject(key, op)),
            };
            state.calls.push(Call {
                key: key.clone(),
                op: op.clone(),
                step: step.clone(),
                started: Instant::now(),
                finished: None,
            });
            (step, state.latency, state.calls.len() - 1)
        };
        let _call = CallGuard { driver: self, index };
        let wait = match step {
            Step::Delay(d) => latency + d,
            Step::Hang => Duration::MAX,
            _ => latency,
        };
        if !wait.is_zero() {
            tokio::select! {
                () = cancel.cancelled() => return Outcome::Failed(FakeError::Cancelled),
                () = sleep_or_forever(wait) => {}
            }
        }
        match step {
            Step::Succeed | Step::Delay(_) => Outcome::Done((self.apply)(key, op)),
            Step::Fail => Outcome::Failed(FakeError::Injected),
            Step::Uncertain => Outcome::Uncertain(FakeError::Injected),
            Step::Hang => Outcome::Failed(FakeError::Cancelled),
        }
    }

    async fn reconstruct(&self) -> Result<Vec<(K, A)>, FakeError> {
        let mut state = self.lock();
        if state.reconstruct_failures > 0 {
            state.reconstruct_failures -= 1;
            return Err(FakeError::Injected);
        }
        Ok(state.existing.clone())
    }
}

async fn sleep_or_forever(d: Duration) {
    match Instant::now().checked_add(d) {
        Some(deadline) if d < Duration::from_secs(365 * 24 * 3600) => {
            tokio::time::sleep_until(deadline).await
        }
        _ => std::future::pending().await,
    }
}

/// Lets spawned tasks run until they block: many cooperative yields. With paused time it does
/// not advance the clock.
pub async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Waits until `cond` holds, checking it on (possibly paused) tokio time; returns whether it
/// held before `timeout`. It checks every millisecond for the first second, then every 10 ms, and
/// every 100 ms after a minute, so that waits of virtual hours stay cheap.
pub async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let step = match now - start {
            waited if waited < Duration::from_secs(1) => Duration::from_millis(1),
            waited if waited < Duration::from_secs(60) => Duration::from_millis(10),
            _ => Duration::from_millis(100),
        };
        tokio::time::sleep(step.min(deadline - now)).await;
    }
}

/// Whether `actual` matches `desired` exactly: every desired key has an actual value that
/// `matches` it, and no actual key lacks a desired one.
pub fn converged<K: Key, D: Send + Sync + 'static, A: Send + Sync + 'static>(
    desired: &Store<K, D>,
    actual: &Store<K, A>,
    matches: impl Fn(&D, &A) -> bool,
) -> bool {
    let mut ok = true;
    desired.for_each(|k, d| ok &= actual.get(k).is_some_and(|a| matches(d, &a)));
    actual.for_each(|k, _| ok &= desired.contains_key(k));
    ok
}

/// Waits (on tokio time) until [`converged`] holds; panics with both stores' sizes if it does not
/// within `timeout`.
#[track_caller]
pub fn wait_converged<'a, K: Key, D: Send + Sync + 'static, A: Send + Sync + 'static>(
    desired: &'a Store<K, D>,
    actual: &'a Store<K, A>,
    timeout: Duration,
    matches: impl Fn(&D, &A) -> bool + 'a,
) -> impl Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        let ok = eventually(timeout, || converged(desired, actual, &matches)).await;
        assert!(
            ok,
            "not converged within {timeout:?} (called at {caller}): desired has {} keys, actual has {}",
            desired.len(),
            actual.len()
        );
    }
}
