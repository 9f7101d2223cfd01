//! The operation executor: runs operations through a driver, at most one in flight per key, with
//! per-key backoff, timeouts, cancellation and bounded concurrency.
//!
//! The executor starts operations and never awaits them for the caller: [`Executor::submit`]
//! returns at once, and finished operations come back from [`Executor::next_completion`]. The
//! [`Engine`](crate::Engine) drives one; it can also be used on its own.
//!
//! An operation's future is polled once when the operation starts (inside `submit`, `pump` or
//! `next_completion`, whichever starts it). One that finishes on that poll waits in a queue for
//! `next_completion`; the others are polled from then on by `next_completion`. All of them run
//! on the task that calls the executor.
//!
//! Each key the executor knows (something waits, runs or backs off on it) has a slot in a slab;
//! a hash table of slot indices finds a slot by key. The queues, the backoff timers and the
//! running operations refer to slots by index, so starting and finishing an operation hashes
//! no key and compares no key's bytes.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Future, StreamExt};
use hashbrown::HashTable;
use slab::Slab;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::delay_queue;
use tracing::Instrument;

use crate::metrics::{Metrics, OpResult, ReconcilerMetrics};
use crate::{BackoffConfig, Driver, Key, Map, Operation, Outcome};

/// Executor settings. Build with [`Default`] and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// At most this many operations run at once; `0` means no limit. Default:
    /// [`ExecutorConfig::DEFAULT_MAX_CONCURRENT`].
    pub max_concurrent: usize,
    /// Timeout of an operation that does not set its own ([`Operation::timeout`]). Default:
    /// [`ExecutorConfig::DEFAULT_TIMEOUT`].
    pub default_timeout: Duration,
    /// Per-key backoff after failures.
    pub backoff: BackoffConfig,
    /// Seed of the random numbers of the backoff jitter ([`BackoffConfig::jitter`]), for
    /// reproducible delays in tests. Default: random. It seeds the jitter of operations' backoff
    /// and nothing else: the retries of [`Driver::reconstruct`] draw their jitter unseeded, and the
    /// order in which one planning pass visits its keys follows randomly seeded hash sets.
    pub seed: Option<u64>,
}

impl ExecutorConfig {
    /// 64 operations at once: enough to keep a node's runtime busy without flooding it.
    pub const DEFAULT_MAX_CONCURRENT: usize = 64;
    /// 2 minutes, as the kubelet's runtime request timeout and CSI call timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

    /// Sets the concurrency bound (`0` = unbounded).
    #[must_use]
    pub fn with_max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n;
        self
    }

    /// Sets the default operation timeout.
    #[must_use]
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// Sets the backoff policy.
    #[must_use]
    pub fn with_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }

    /// Seeds the backoff jitter (only; see [`seed`](ExecutorConfig::seed)).
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            max_concurrent: Self::DEFAULT_MAX_CONCURRENT,
            default_timeout: Self::DEFAULT_TIMEOUT,
            backoff: BackoffConfig::default(),
            seed: None,
        }
    }
}

/// What [`Executor::submit`] did with an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// It started now.
    Started,
    /// An equal operation is already running on the key; nothing more will run.
    Coalesced,
    /// It will start when the key (or a related key) is free and a slot is available. A later
    /// submit for the same key replaces it: requests coalesce, the latest wins, none is lost.
    Queued,
    /// The key is backing off after a failure of the same kind; it starts at `until`.
    BackingOff {
        /// When the backoff ends.
        until: Instant,
    },
}

/// Why an operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum OpError<E> {
    /// The driver reported an error.
    #[error(transparent)]
    Driver(E),
    /// The operation ran longer than its timeout and was dropped; its effect is unknown.
    #[error("operation timed out after {0:?}")]
    TimedOut(Duration),
}

/// A finished operation.
#[derive(Debug)]
#[non_exhaustive]
pub struct Completion<K, Op, A, E> {
    /// The key it ran on.
    pub key: K,
    /// The operation.
    pub op: Op,
    /// How it ended. A timeout is an [`Outcome::Uncertain`] with [`OpError::TimedOut`].
    pub outcome: Outcome<A, OpError<E>>,
    /// The `result` label it was counted under.
    pub result: OpResult,
    /// How long it ran.
    pub duration: Duration,
    /// Failures of this kind in a row on this key, counting this one (0 after a success).
    pub failures: u32,
    /// When the key may retry this kind of operation, if it now backs off.
    pub retry_at: Option<Instant>,
}

struct Running<Op, C> {
    op: Op,
    cancel: CancellationToken,
    /// What the submitter attached to the operation that runs.
    context: Option<C>,
}

struct Backoff {
    kind: &'static str,
    failures: u32,
    until: Instant,
    timer: Option<delay_queue::Key>,
}

/// The index of a key's [`Slot`] in [`Executor::slots`]. It stays valid while anything refers to
/// it: the slot is freed only once it is idle, and an idle slot is in no queue, no blocked list,
/// no timer and no running operation.
type Idx = usize;

/// Everything the executor knows about one key. Slots live in a slab, so that the queues, the
/// timers and the running operations refer to a key by index, without hashing it again or
/// comparing its bytes; [`Executor::index`] finds a slot by key.
struct Slot<K, Op, C> {
    key: K,
    /// `key`'s hash, so that the index never rehashes a key and finds a slot by index alone.
    hash: u64,
    running: Option<Running<Op, C>>,
    pending: Option<Op>,
    /// What the submitter attached to `pending`.
    context: Option<C>,
    /// Boxed: most keys never fail, and a small slot keeps the slab cache-friendly.
    backoff: Option<Box<Backoff>>,
    /// In the teardown or setup queue.
    queued: bool,
    /// In the blocked list (an ancestor or descendant runs).
    blocked: bool,
}

impl<K, Op, C> Slot<K, Op, C> {
    fn is_idle(&self) -> bool {
        self.running.is_none()
            && self.pending.is_none()
            && self.backoff.is_none()
            && !self.queued
            && !self.blocked
    }
}

struct Finished<K, Op, A, E> {
    idx: Idx,
    key: K,
    op: Op,
    result: Result<Outcome<A, E>, Duration>,
    duration: Duration,
    /// Whether the token had fired when the operation failed (asked only of failures).
    cancelled: bool,
}

type OpFuture<K, Op, A, E> = Pin<Box<dyn Future<Output = Finished<K, Op, A, E>> + Send>>;

/// Runs operations through a [`Driver`]: one in flight per key (and none on a key while one runs
/// on an ancestor or descendant of it), per-key exponential backoff with jitter, a timeout per
/// operation, cancellation, and a bound on concurrency.
pub struct Executor<K: Key, Op: Operation, A: Send + 'static, Dr: Driver<K, Op, A>> {
    core: Core<K, Op, A, Dr, ()>,
}

/// A finished operation as the [`Engine`](crate::Engine) sees it: the [`Completion`], what the
/// engine attached to the operation when it submitted it, and the key's own copy if the executor
/// no longer keeps anything for it.
pub(crate) struct Done<K, Op, A, E, C> {
    pub(crate) completion: Completion<K, Op, A, E>,
    pub(crate) context: Option<C>,
    /// The executor's copy of the key, handed back because it forgot the key (nothing waits,
    /// runs or backs off on it): until the key is submitted again, withdrawing or cancelling
    /// it has nothing to do.
    pub(crate) released: Option<K>,
}

/// The executor itself, with a context of type `C` that a submitter may attach to each
/// operation and gets back with its completion (the engine attaches what it planned from).
pub(crate) struct Core<K: Key, Op: Operation, A: Send + 'static, Dr: Driver<K, Op, A>, C> {
    driver: Arc<Dr>,
    config: ExecutorConfig,
    hasher: ahash::RandomState,
    /// Key → slot index, hashed with `hasher` (the hash is kept in the slot).
    index: HashTable<Idx>,
    slots: Slab<Slot<K, Op, C>>,
    /// For each key, how many operations run on its strict descendants.
    busy_below: Map<K, usize>,
    running: usize,
    pending: usize,
    teardown_queue: VecDeque<Idx>,
    setup_queue: VecDeque<Idx>,
    blocked: Vec<Idx>,
    futures: FuturesUnordered<OpFuture<K, Op, A, Dr::Error>>,
    /// Operations that finished on their first poll, when they started.
    ready: VecDeque<Finished<K, Op, A, Dr::Error>>,
    timers: crate::timers::Timers<Idx>,
    rng: fastrand::Rng,
    metrics: ReconcilerMetrics,
}

impl<K: Key, Op: Operation, A: Send + 'static, Dr: Driver<K, Op, A>> fmt::Debug for Executor<K, Op, A, Dr> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.fmt(f)
    }
}

impl<K: Key, Op: Operation, A: Send + 'static, Dr: Driver<K, Op, A>, C> fmt::Debug for Core<K, Op, A, Dr, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("name", &self.metrics.name())
            .field("running", &self.running)
            .field("pending", &self.pending)
            .field("backing_off", &self.timers.len())
            .finish_non_exhaustive()
    }
}

enum Wake<K, Op, A, E> {
    Finished(Finished<K, Op, A, E>),
    Timer(Idx),
}

impl<K, Op, A, Dr> Executor<K, Op, A, Dr>
where
    K: Key,
    Op: Operation,
    A: Send + 'static,
    Dr: Driver<K, Op, A>,
{
    /// An executor named `name` (the `reconciler` metric label) over `driver`.
    pub fn new(name: &str, driver: Arc<Dr>, config: ExecutorConfig, metrics: &Metrics) -> Self {
        Self { core: Core::new(name, driver, config, metrics) }
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<Dr> {
        self.core.driver()
    }

    /// Operations running now.
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// Operations planned but not started.
    pub fn queued(&self) -> usize {
        self.core.pending
    }

    /// Keys backing off now.
    pub fn backing_off(&self) -> usize {
        self.core.timers.len()
    }

    /// Whether nothing runs, waits or backs off.
    pub fn is_idle(&self) -> bool {
        self.core.running == 0 && self.core.pending == 0
    }

    /// The operation running on `key`, if any.
    pub fn running_op(&self, key: &K) -> Option<&Op> {
        self.core.running_op(key)
    }

    /// When `key` may next run an operation of `kind`, if it is backing off.
    pub fn retry_at(&self, key: &K, kind: &str) -> Option<Instant> {
        self.core.retry_at(key, kind)
    }

    /// Asks for `op` to run on `key`. Returns at once; see [`Submitted`]. If `op` starts, its
    /// future is polled once before `submit` returns (see the [module docs](self)).
    ///
    /// If a different operation runs on `key`, `op` waits for it to finish (it is not cancelled:
    /// call [`cancel`](Executor::cancel) for that). If the key is backing off after a failure of
    /// the same kind, `op` waits out the backoff; an operation of another kind resets the
    /// backoff and may run at once.
    pub fn submit(&mut self, key: K, op: Op) -> Submitted {
        self.core.submit(key, op, None, false)
    }

    /// Drops the operation waiting for `key`, if any (the running one is unaffected).
    pub fn withdraw(&mut self, key: &K) {
        self.core.withdraw(key);
    }

    /// Drops every waiting operation (for shutdown).
    pub fn withdraw_all(&mut self) {
        self.core.withdraw_all();
    }

    /// Fires the cancellation token of the operation running on `key`; returns whether one runs.
    pub fn cancel(&mut self, key: &K) -> bool {
        self.core.cancel(key)
    }

    /// Cancels every running operation.
    pub fn cancel_all(&mut self) {
        self.core.cancel_all();
    }

    /// Forgets the backoff history of `key` (when it left both desired and actual state).
    pub fn forget(&mut self, key: &K) {
        self.core.forget(key);
    }

    /// Starts whatever can start now: queued operations whose keys are free, teardown first.
    pub fn pump(&mut self) {
        self.core.pump();
    }

    /// Waits for the next operation to finish. Starts queued operations (as [`pump`]) and those
    /// whose backoff ended while it waits. Never returns while nothing runs or backs off.
    /// Cancel-safe: dropping the future loses nothing.
    ///
    /// [`pump`]: Executor::pump
    pub async fn next_completion(&mut self) -> Completion<K, Op, A, Dr::Error> {
        self.core.next_done().await.completion
    }

    /// A finished operation if one is ready now, without waiting and without starting anything.
    /// Lets a caller handle a burst of completions in one go.
    pub fn try_next_completion(&mut self) -> Option<Completion<K, Op, A, Dr::Error>> {
        self.core.try_next_done().map(|done| done.completion)
    }
}

impl<K, Op, A, Dr, C> Core<K, Op, A, Dr, C>
where
    K: Key,
    Op: Operation,
    A: Send + 'static,
    Dr: Driver<K, Op, A>,
    C: Send + 'static,
{
    pub(crate) fn new(name: &str, driver: Arc<Dr>, config: ExecutorConfig, metrics: &Metrics) -> Self {
        let rng = config.seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        Self {
            driver,
            config,
            hasher: ahash::RandomState::new(),
            index: HashTable::new(),
            slots: Slab::new(),
            busy_below: Map::default(),
            running: 0,
            pending: 0,
            teardown_queue: VecDeque::new(),
            setup_queue: VecDeque::new(),
            blocked: Vec::new(),
            futures: FuturesUnordered::new(),
            ready: VecDeque::new(),
            timers: crate::timers::Timers::new(),
            rng,
            metrics: metrics.for_reconciler(name),
        }
    }

    pub(crate) fn driver(&self) -> &Arc<Dr> {
        &self.driver
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.running
    }

    pub(crate) fn running_op(&self, key: &K) -> Option<&Op> {
        let idx = self.find(key)?;
        self.slots[idx].running.as_ref().map(|r| &r.op)
    }

    fn retry_at(&self, key: &K, kind: &str) -> Option<Instant> {
        let idx = self.find(key)?;
        self.slots[idx]
            .backoff
            .as_ref()
            .filter(|b| b.kind == kind && b.until > Instant::now())
            .map(|b| b.until)
    }

    /// [`Executor::submit`], with `context` attached to `op`; with `replace`, the operation
    /// running on `key` is cancelled first if it is not equal to `op` and
    /// [given up](crate::Operation::given_up_for) for it (what the engine does with a plan). One
    /// lookup of the key.
    pub(crate) fn submit(&mut self, key: K, op: Op, context: Option<C>, replace: bool) -> Submitted {
        let idx = self.find_or_insert(key);
        let slot = &mut self.slots[idx];
        if let Some(running) = &slot.running {
            if running.op == op {
                if slot.pending.take().is_some() {
                    slot.context = None;
                    self.pending -= 1;
                }
                return Submitted::Coalesced;
            }
            if replace && running.op.given_up_for(Some(&op)) {
                running.cancel.cancel();
            }
            slot.context = context;
            if slot.pending.replace(op).is_none() {
                self.pending += 1;
            }
            return Submitted::Queued;
        }
        let mut backing_off = None;
        if let Some(backoff) = &slot.backoff {
            if backoff.kind != op.kind() {
                if let Some(timer) = backoff.timer {
                    self.timers.remove(&timer);
                }
                slot.backoff = None;
            } else if backoff.until > Instant::now() {
                backing_off = Some(backoff.until);
            }
        }
        slot.context = context;
        if slot.pending.replace(op).is_none() {
            self.pending += 1;
        }
        if let Some(until) = backing_off {
            return Submitted::BackingOff { until };
        }
        if slot.blocked {
            return Submitted::Queued;
        }
        if self.try_start(idx) { Submitted::Started } else { Submitted::Queued }
    }

    pub(crate) fn withdraw(&mut self, key: &K) {
        if let Some(idx) = self.find(key) {
            self.withdraw_at(idx);
            self.cleanup(idx);
        }
    }

    fn withdraw_at(&mut self, idx: Idx) {
        let slot = &mut self.slots[idx];
        if slot.pending.take().is_some() {
            slot.context = None;
            self.pending -= 1;
        }
    }

    /// [`withdraw`](Executor::withdraw) and [`cancel`](Executor::cancel) (if the running operation is
    /// [given up](crate::Operation::given_up_for) for no operation) in one lookup of the key: what
    /// the engine does when a plan no longer asks for an operation.
    pub(crate) fn stop(&mut self, key: &K) {
        if let Some(idx) = self.find(key) {
            self.withdraw_at(idx);
            if let Some(running) = self.slots[idx].running.as_ref().filter(|r| r.op.given_up_for(None)) {
                running.cancel.cancel();
            }
            self.cleanup(idx);
        }
    }

    /// If no operation runs on `key`: [`withdraw`](Executor::withdraw) and
    /// [`forget`](Executor::forget) it and return `true`. Returns `false`, doing nothing, while
    /// one runs. One lookup of the key.
    pub(crate) fn release(&mut self, key: &K) -> bool {
        let Some(idx) = self.find(key) else { return true };
        if self.slots[idx].running.is_some() {
            return false;
        }
        self.withdraw_at(idx);
        self.forget_at(idx);
        true
    }

    pub(crate) fn withdraw_all(&mut self) {
        for (_, slot) in &mut self.slots {
            slot.pending = None;
            slot.context = None;
        }
        self.pending = 0;
    }

    fn cancel(&mut self, key: &K) -> bool {
        match self.find(key).and_then(|idx| self.slots[idx].running.as_ref()) {
            Some(running) => {
                running.cancel.cancel();
                true
            }
            None => false,
        }
    }

    pub(crate) fn cancel_all(&mut self) {
        for running in self.slots.iter().filter_map(|(_, s)| s.running.as_ref()) {
            running.cancel.cancel();
        }
    }

    fn forget(&mut self, key: &K) {
        if let Some(idx) = self.find(key) {
            self.forget_at(idx);
        }
    }

    fn forget_at(&mut self, idx: Idx) {
        if let Some(timer) = self.slots[idx].backoff.take().and_then(|b| b.timer) {
            self.timers.remove(&timer);
        }
        self.cleanup(idx);
    }

    fn pump(&mut self) {
        loop {
            if self.slots_full() {
                return;
            }
            let Some(idx) = self.teardown_queue.pop_front().or_else(|| self.setup_queue.pop_front()) else {
                return;
            };
            self.slots[idx].queued = false;
            self.try_start(idx);
        }
    }

    /// [`Executor::next_completion`].
    pub(crate) async fn next_done(&mut self) -> Done<K, Op, A, Dr::Error, C> {
        loop {
            self.pump();
            if let Some(finished) = self.ready.pop_front() {
                return self.finish(finished);
            }
            let wake = {
                let futures = &mut self.futures;
                let timers = &mut self.timers;
                tokio::select! {
                    Some(finished) = futures.next(), if !futures.is_empty() => Wake::Finished(finished),
                    Some(idx) = std::future::poll_fn(|cx| timers.poll_expired(cx)), if !timers.is_empty() => {
                        Wake::Timer(idx)
                    }
                    else => std::future::pending().await,
                }
            };
            match wake {
                Wake::Finished(finished) => return self.finish(finished),
                Wake::Timer(idx) => self.backoff_expired(idx),
            }
        }
    }

    /// [`Executor::try_next_completion`].
    pub(crate) fn try_next_done(&mut self) -> Option<Done<K, Op, A, Dr::Error, C>> {
        use futures::FutureExt;
        if let Some(finished) = self.ready.pop_front() {
            return Some(self.finish(finished));
        }
        if self.futures.is_empty() {
            return None;
        }
        let finished = self.futures.next().now_or_never().flatten()?;
        Some(self.finish(finished))
    }

    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The slot of `key`, if the executor knows it.
    fn find(&self, key: &K) -> Option<Idx> {
        if self.index.is_empty() {
            return None;
        }
        let hash = self.hash(key);
        let slots = &self.slots;
        self.index.find(hash, |&i| slots[i].hash == hash && slots[i].key == *key).copied()
    }

    /// The slot of `key`, created (idle) if the executor does not know it yet.
    fn find_or_insert(&mut self, key: K) -> Idx {
        let hash = self.hash(&key);
        let slots = &mut self.slots;
        let entry =
            self.index.entry(hash, |&i| slots[i].hash == hash && slots[i].key == key, |&i| slots[i].hash);
        match entry {
            hashbrown::hash_table::Entry::Occupied(e) => *e.get(),
            hashbrown::hash_table::Entry::Vacant(e) => {
                let idx = slots.insert(Slot {
                    key,
                    hash,
                    running: None,
                    pending: None,
                    context: None,
                    backoff: None,
                    queued: false,
                    blocked: false,
                });
                e.insert(idx);
                idx
            }
        }
    }

    fn slots_full(&self) -> bool {
        self.config.max_concurrent != 0 && self.running >= self.config.max_concurrent
    }

    fn conflicts(&self, idx: Idx) -> bool {
        let key = &self.slots[idx].key;
        if !self.busy_below.is_empty() && self.busy_below.get(key).is_some_and(|n| *n > 0) {
            return true;
        }
        let mut cur = key.parent();
        while let Some(parent) = cur {
            if self.find(&parent).is_some_and(|p| self.slots[p].running.is_some()) {
                return true;
            }
            cur = parent.parent();
        }
        false
    }

    fn enqueue(&mut self, idx: Idx) {
        let slot = &mut self.slots[idx];
        if slot.queued || slot.blocked {
            return;
        }
        let Some(op) = &slot.pending else { return };
        slot.queued = true;
        if op.is_teardown() {
            self.teardown_queue.push_back(idx);
        } else {
            self.setup_queue.push_back(idx);
        }
    }

    /// Starts the pending operation of slot `idx` if everything allows it; otherwise parks it
    /// where something will wake it (queue, blocked list, or backoff timer).
    fn try_start(&mut self, idx: Idx) -> bool {
        let slot = &self.slots[idx];
        let Some(op) = &slot.pending else {
            self.cleanup(idx);
            return false;
        };
        if slot.running.is_some() {
            return false;
        }
        if let Some(backoff) = &slot.backoff
            && backoff.kind == op.kind()
            && backoff.until > Instant::now()
        {
            return false; // its timer re-queues it
        }
        if self.conflicts(idx) {
            let slot = &mut self.slots[idx];
            if !slot.blocked {
                slot.blocked = true;
                self.blocked.push(idx);
            }
            return false;
        }
        if self.slots_full() {
            self.enqueue(idx);
            return false;
        }
        let slot = &mut self.slots[idx];
        let Some(op) = slot.pending.take() else { return false };
        self.pending -= 1;
        let cancel = CancellationToken::new();
        slot.running = Some(Running { op: op.clone(), cancel: cancel.clone(), context: slot.context.take() });
        self.running += 1;
        let key = slot.key.clone();
        let mut cur = key.parent();
        while let Some(parent) = cur {
            cur = parent.parent();
            *self.busy_below.entry(parent).or_default() += 1;
        }
        let timeout = op.timeout().unwrap_or(self.config.default_timeout);
        let driver = self.driver.clone();
        let span = tracing::info_span!("operation", reconciler = self.metrics.name(), op.kind = op.kind(), op.key = ?key);
        let mut future: OpFuture<K, Op, A, Dr::Error> = Box::pin(
            async move {
                let started = Instant::now();
                let result = {
                    let run = driver.execute(&key, &op, &cancel);
                    let mut run = std::pin::pin!(run);
                    // Most operations that finish at once never need their timer: poll once
                    // before arming it.
                    match futures::poll!(run.as_mut()) {
                        Poll::Ready(outcome) => Ok(outcome),
                        Poll::Pending => match started.checked_add(timeout) {
                            Some(deadline) => {
                                tokio::time::timeout_at(deadline, run).await.map_err(|_| timeout)
                            }
                            None => Ok(run.await),
                        },
                    }
                };
                // A lock: asked only of failures, which it tells from cancellations.
                let cancelled = matches!(result, Ok(Outcome::Failed(_))) && cancel.is_cancelled();
                Finished { idx, key, op, result, duration: started.elapsed(), cancelled }
            }
            .instrument(span),
        );
        // Poll it once now: an operation that finishes at once then costs no task in `futures`.
        // One that does not is polled again there, with a waker that works (a future registers
        // the waker of its latest poll).
        match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(finished) => self.ready.push_back(finished),
            Poll::Pending => self.futures.push(future),
        }
        true
    }

    fn finish(&mut self, finished: Finished<K, Op, A, Dr::Error>) -> Done<K, Op, A, Dr::Error, C> {
        let Finished { idx, key, op, result, duration, cancelled } = finished;
        self.running -= 1;
        let mut cur = key.parent();
        while let Some(parent) = cur {
            if let Some(n) = self.busy_below.get_mut(&parent) {
                *n -= 1;
                if *n == 0 {
                    self.busy_below.remove(&parent);
                }
            }
            cur = parent.parent();
        }
        let kind = op.kind();
        let (outcome, result_label) = match result {
            Ok(Outcome::Done(update)) => (Outcome::Done(update), OpResult::Done),
            Ok(Outcome::Failed(e)) if cancelled => (Outcome::Failed(OpError::Driver(e)), OpResult::Cancelled),
            Ok(Outcome::Failed(e)) => (Outcome::Failed(OpError::Driver(e)), OpResult::Failed),
            Ok(Outcome::Uncertain(e)) => (Outcome::Uncertain(OpError::Driver(e)), OpResult::Uncertain),
            Err(timeout) => (Outcome::Uncertain(OpError::TimedOut(timeout)), OpResult::Timeout),
        };
        self.metrics.observe_operation(kind, result_label, duration.as_secs_f64());
        let failures = self.record_backoff(idx, kind, result_label);
        let retry_at = self.slots[idx].backoff.as_ref().map(|b| b.until);
        match &outcome {
            Outcome::Done(_) => {
                tracing::debug!(reconciler = self.metrics.name(), op.kind = kind, op.key = ?key, ?duration, "operation done")
            }
            Outcome::Failed(e) | Outcome::Uncertain(e) if result_label != OpResult::Cancelled => {
                // The first failure of a streak, then every tenth, at warn; the rest at debug.
                if failures <= 1 || failures.is_multiple_of(10) {
                    tracing::warn!(reconciler = self.metrics.name(), op.kind = kind, op.key = ?key, failures, result = %result_label, error = %e, "operation failed");
                } else {
                    tracing::debug!(reconciler = self.metrics.name(), op.kind = kind, op.key = ?key, failures, result = %result_label, error = %e, "operation failed");
                }
            }
            _ => {
                tracing::debug!(reconciler = self.metrics.name(), op.kind = kind, op.key = ?key, "operation cancelled")
            }
        }
        let context = self.slots[idx].running.take().and_then(|r| r.context);
        // Operations parked behind this key may start now.
        if !self.blocked.is_empty() {
            let mut i = 0;
            while i < self.blocked.len() {
                let b = self.blocked[i];
                if self.slots[b].key.conflicts_with(&key) {
                    self.blocked.swap_remove(i);
                    self.slots[b].blocked = false;
                    self.enqueue(b);
                    self.cleanup(b);
                } else {
                    i += 1;
                }
            }
        }
        self.enqueue(idx);
        let released = self.cleanup(idx).map(|slot| slot.key);
        Done {
            completion: Completion { key, op, outcome, result: result_label, duration, failures, retry_at },
            context,
            released,
        }
    }

    fn record_backoff(&mut self, idx: Idx, kind: &'static str, result: OpResult) -> u32 {
        let slot = &mut self.slots[idx];
        match result {
            OpResult::Done => {
                if let Some(timer) = slot.backoff.take().and_then(|b| b.timer) {
                    self.timers.remove(&timer);
                }
                0
            }
            OpResult::Cancelled => slot.backoff.as_ref().map_or(0, |b| b.failures),
            OpResult::Failed | OpResult::Uncertain | OpResult::Timeout => {
                let failures = match &slot.backoff {
                    Some(b) if b.kind == kind => b.failures.saturating_add(1),
                    _ => 1,
                };
                if let Some(timer) = slot.backoff.take().and_then(|b| b.timer) {
                    self.timers.remove(&timer);
                }
                let delay = self.config.backoff.delay(failures, &mut self.rng);
                let until = Instant::now() + delay;
                let timer = Some(self.timers.insert_at(idx, until));
                slot.backoff = Some(Box::new(Backoff { kind, failures, until, timer }));
                failures
            }
        }
    }

    fn backoff_expired(&mut self, idx: Idx) {
        let slot = &mut self.slots[idx];
        if let Some(backoff) = &mut slot.backoff {
            backoff.timer = None;
        }
        // Keep the failure count (the next failure backs off longer) but let the key run.
        if slot.running.is_none() && slot.pending.is_some() {
            self.enqueue(idx);
        }
        self.cleanup(idx);
    }

    /// Frees the slot of a key that has nothing left (no operation, no live backoff timer) and
    /// returns it.
    fn cleanup(&mut self, idx: Idx) -> Option<Slot<K, Op, C>> {
        let slot = &mut self.slots[idx];
        if slot.backoff.as_ref().is_some_and(|b| b.timer.is_none() && b.until <= Instant::now())
            && slot.pending.is_none()
        {
            // An expired backoff with nothing waiting carries only the failure count; keep it
            // while the key may fail again soon, drop it once nothing refers to the key.
            if slot.running.is_none() && !slot.queued && !slot.blocked {
                slot.backoff = None;
            }
        }
        if slot.is_idle() {
            let hash = slot.hash;
            if let Ok(entry) = self.index.find_entry(hash, |&i| i == idx) {
                entry.remove();
            }
            return Some(self.slots.remove(idx));
        }
        None
    }

    pub(crate) fn metrics(&self) -> &ReconcilerMetrics {
        &self.metrics
    }

    pub(crate) fn metrics_mut(&mut self) -> &mut ReconcilerMetrics {
        &mut self.metrics
    }

    pub(crate) fn update_gauges(&self) {
        self.metrics.in_flight.set(self.running as i64);
        self.metrics.queue_depth.set(self.pending as i64);
        self.metrics.backing_off.set(self.timers.len() as i64);
    }
}
