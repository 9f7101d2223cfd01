//! The pod lifecycle event generator: reports every pod whose containers in the runtime differ from the
//! actual store. The same reads feed the sandbox pair's actual store ([`Pleg::with_sandboxes`]) with the
//! pods' sandboxes, which each read gives apart from the containers ([`ListedPod`]): one read, two
//! stores, each compared with its own part and applied by its engine in its own loop; why joining the
//! two decides as the one read did is in [`crate::model::actual`].
//!
//! It relists the runtime (every pod) periodically, and between relists follows the runtime's events
//! through its [`PlegWaker`]: an event that names a container or sandbox makes the PLEG read just the
//! pods it belongs to ([`MAX_POD_READS`] at most, else it relists); the exit of one that no store has
//! recorded yet is placed by asking the runtime ([`PodRuntime::pod_of`]), and ignored when it is not
//! nodelet's. While the event stream is connected ([`PlegWaker::set_evented`]) the periodic relist is only
//! the safety net for what events cannot show (an observation the engine dropped while an operation
//! ran on the pod, an event the runtime lost), every `evented_period`; otherwise every `period`, the
//! kubelet's 1 s.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reconcile_engine::{Observer, Store, Update};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::driver::PodRuntime;
use super::metrics::PodMetrics;
use crate::model::actual::{ListedPod, PodActual, PodSandboxes};
use crate::model::pod::PodUid;

/// The kubelet's relist period.
pub const DEFAULT_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// The relist period while the runtime's event stream is connected. The kubelet's evented PLEG
/// relists every 300 s; nodelet's events come from containerd's task events rather than the CRI's,
/// so it keeps a shorter safety net.
pub const DEFAULT_EVENTED_RELIST_PERIOD: Duration = Duration::from_secs(60);

/// How soon the PLEG looks again after a runtime event (at the pods it named) or after a relist that
/// reported changes (at the pods it reported; every pod when they are more than [`MAX_POD_READS`]);
/// the follow-ups double up to the (non-evented) period; a relist's follow-ups end sooner, at the
/// first look that finds the stores matching the runtime. Two races make one look not enough:
/// - containerd's CRI view lags its native events by tens of milliseconds, so the read an exit event
///   triggers can still see the container running, and no further event comes;
/// - the engine drops an observation that races an operation on the same pod (a container that exits
///   while the operation that started it completes), and the PLEG must report it again.
pub const FOLLOW_UP_RELIST: Duration = Duration::from_millis(100);

/// A look woken by a runtime event waits until at least this many times the previous look's
/// duration has passed since that look ended (and never longer than [`FOLLOW_UP_RELIST`]), so
/// that a storm of events (a hundred pods starting or stopping at once) costs at most a third of
/// the time in relists instead of relisting back to back, while a lone event on a quiet node is
/// still seen at once.
pub const COALESCE_FACTOR: u32 = 2;

/// While the event stream is connected, each periodic relist comes up to this fraction of the period
/// later than the period (at random): the node's other periodic work (statistics every 10 s, volume
/// statistics every minute) starts with the daemon, and a relist exactly every minute ran at the
/// same moment as all of it, on the same cores and the same runtime.
pub const EVENTED_RELIST_JITTER: f64 = 0.1;

/// The evented relist period `period` with its jitter: up to [`EVENTED_RELIST_JITTER`] of it more,
/// `unit` (in `0..1`) saying how much.
fn jittered(period: Duration, unit: f64) -> Duration {
    period + period.mul_f64(EVENTED_RELIST_JITTER * unit.clamp(0.0, 1.0))
}

/// Runtime events that name more pods than this at once make a relist instead of one read per pod.
pub const MAX_POD_READS: usize = 8;

/// At most this many container IDs that no store knows are asked about at once (one `ContainerStatus`
/// each; the runtime's other clients' containers are among them); more make a relist.
const MAX_ASKED: usize = 32;

/// Container IDs kept pending between two looks; more make a relist (memory stays bounded in a storm).
const MAX_PENDING_IDS: usize = 64;

/// How long a look woken at `since_last` after the previous look ended, which took `last_cost`,
/// waits first (see [`COALESCE_FACTOR`]).
fn coalesce_delay(last_cost: Duration, since_last: Duration) -> Duration {
    last_cost.saturating_mul(COALESCE_FACTOR).min(FOLLOW_UP_RELIST).saturating_sub(since_last)
}

/// The keys of `store` that `listed` lacks (without copying the keys that it has).
fn gone<V: Send + Sync + 'static>(
    store: &Store<PodUid, V>,
    listed: &HashMap<PodUid, ListedPod>,
) -> Vec<PodUid> {
    let mut gone = Vec::new();
    store.for_each(|uid, _| {
        if !listed.contains_key(uid) {
            gone.push(uid.clone());
        }
    });
    gone
}

/// What runtime events asked for since the PLEG last looked.
#[derive(Debug, Default)]
struct Pending {
    /// Relist everything.
    relist: bool,
    /// Container and sandbox IDs named by events; `true` when an ID the stores do not know must be
    /// placed by asking the runtime (an exit of a container that no store has recorded yet), `false`
    /// when it may be ignored (the removal of a container the stores have already forgotten).
    ids: HashMap<String, bool>,
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    notify: Notify,
    evented: AtomicBool,
}

/// Tells the PLEG what the runtime's event stream reported. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PlegWaker(Arc<Shared>);

impl PlegWaker {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Relist everything soon (events may have been missed).
    pub fn relist(&self) {
        let mut pending = self.pending();
        pending.relist = true;
        pending.ids.clear();
        drop(pending);
        self.0.notify.notify_one();
    }

    /// The container or sandbox `id` changed in a way nodelet did not cause (it exited, was killed for
    /// memory): read its pod soon (when no store knows `id`, the runtime is asked whose it is).
    pub fn changed(&self, id: &str) {
        self.named(id, true);
    }

    /// The container or sandbox `id` was removed from the runtime: read its pod soon; nothing when no
    /// store knows `id` (then no store holds it either).
    pub fn removed(&self, id: &str) {
        self.named(id, false);
    }

    fn named(&self, id: &str, relist_if_unknown: bool) {
        let mut pending = self.pending();
        if pending.relist {
            return;
        }
        if pending.ids.len() >= MAX_PENDING_IDS && !pending.ids.contains_key(id) {
            pending.relist = true;
            pending.ids.clear();
        } else {
            *pending.ids.entry(id.to_owned()).or_default() |= relist_if_unknown;
        }
        drop(pending);
        self.0.notify.notify_one();
    }

    /// Whether the runtime's event stream is connected: while it is, the PLEG relists every
    /// `evented_period` instead of every `period`.
    pub fn set_evented(&self, connected: bool) {
        if self.0.evented.swap(connected, Ordering::Relaxed) != connected {
            self.0.notify.notify_one();
        }
    }

    fn evented(&self) -> bool {
        self.0.evented.load(Ordering::Relaxed)
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending())
    }
}

/// What one look reads: every pod (a relist), or some pods.
#[derive(Debug, Clone, PartialEq)]
enum Scope {
    All,
    Pods(BTreeSet<PodUid>),
}

impl Scope {
    /// Some pods, or every pod when they are more than [`MAX_POD_READS`].
    fn of(uids: BTreeSet<PodUid>) -> Scope {
        if uids.len() > MAX_POD_READS { Scope::All } else { Scope::Pods(uids) }
    }

    fn merge(self, other: Scope) -> Scope {
        match (self, other) {
            (Scope::Pods(mut a), Scope::Pods(b)) => {
                a.extend(b);
                Scope::of(a)
            }
            _ => Scope::All,
        }
    }
}

/// Why a look happens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cause {
    Period,
    Event,
    /// The `step`th delay of a chain; `until_quiet`: the chain ends at a look that reports nothing.
    FollowUp {
        step: Duration,
        until_quiet: bool,
    },
}

/// A follow-up look planned at `due`, the `step`th delay of its chain.
///
/// A chain that a runtime event started runs to the period whatever its looks find (the runtime's
/// CRI view may still show the state from before the event, so a look that finds nothing proves
/// nothing). A chain that a periodic relist started (`until_quiet`) is there to report again what
/// the engine dropped: it ends at the first look that finds the stores matching the runtime.
#[derive(Debug)]
struct FollowUp {
    scope: Scope,
    step: Duration,
    due: Instant,
    until_quiet: bool,
}

/// The follow-up that continues a chain after a look at `scope` that took its `step`th delay
/// (`reported`: whether the look reported anything), ending at `ended`; `None` when the chain
/// ends: its next delay would reach `period`, or it ends when quiet and the look was.
fn next_follow_up(
    scope: Scope,
    step: Duration,
    until_quiet: bool,
    reported: bool,
    ended: Instant,
    period: Duration,
) -> Option<FollowUp> {
    if until_quiet && !reported {
        return None;
    }
    let step = step.saturating_mul(2);
    (step < period).then(|| FollowUp { scope, step, due: ended + step, until_quiet })
}

/// What the last look at a pod found equal to the stores: the runtime's state it read (the pod
/// runtime hands out the same `Arc`s for a pod that has not changed, see [`PodRuntime::list_pods`])
/// and each store's value it equalled (`None`: not equal, or not compared). Values behind an `Arc`
/// never change and the `Arc`s held here keep them alive, so when a look reads the same `Arc`s and
/// a store holds the same `Arc` as then, they are still equal: a quiet node's relist compares
/// pointers instead of every pod's containers, field by field.
#[derive(Debug)]
struct Seen {
    listed: ListedPod,
    pod: Option<Arc<PodActual>>,
    sandboxes: Option<Arc<PodSandboxes>>,
}

/// Whether `remembered` and `current` are the same allocation.
fn same_arc<T>(remembered: Option<&Arc<T>>, current: Option<&Arc<T>>) -> bool {
    matches!((remembered, current), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
}

/// The relist loop.
#[derive(Debug)]
pub struct Pleg<R> {
    runtime: Arc<R>,
    actual: Store<PodUid, PodActual>,
    observer: Observer<PodUid, PodActual>,
    period: Duration,
    evented_period: Duration,
    waker: PlegWaker,
    metrics: PodMetrics,
    sandboxes: Option<(Store<PodUid, PodSandboxes>, Observer<PodUid, PodSandboxes>)>,
    /// Per pod, what the last look found equal to the stores (see [`Seen`]).
    seen: Mutex<HashMap<PodUid, Seen>>,
}

impl<R: PodRuntime> Pleg<R> {
    /// A PLEG that compares `runtime`'s listing with `actual` and reports through `observer`,
    /// relisting every `period` (every [`DEFAULT_EVENTED_RELIST_PERIOD`] while events come, see
    /// [`Pleg::with_evented_period`]).
    pub fn new(
        runtime: Arc<R>,
        actual: Store<PodUid, PodActual>,
        observer: Observer<PodUid, PodActual>,
        period: Duration,
        metrics: PodMetrics,
    ) -> Self {
        Self {
            runtime,
            actual,
            observer,
            period,
            evented_period: DEFAULT_EVENTED_RELIST_PERIOD,
            waker: PlegWaker::default(),
            metrics,
            sandboxes: None,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Relists every `period` while the runtime's event stream is connected (never more often than
    /// the PLEG's own period).
    pub fn with_evented_period(mut self, period: Duration) -> Self {
        self.evented_period = period;
        self
    }

    /// Also reports the pods' sandboxes that differ from the sandbox pair's actual store `actual`,
    /// through its `observer`.
    pub fn with_sandboxes(
        mut self,
        actual: Store<PodUid, PodSandboxes>,
        observer: Observer<PodUid, PodSandboxes>,
    ) -> Self {
        self.sandboxes = Some((actual, observer));
        self
    }

    /// The handle through which the runtime's event stream wakes the PLEG.
    pub fn waker(&self) -> PlegWaker {
        self.waker.clone()
    }

    /// One relist: returns the pods it reported. `kubelet_pleg_relist_duration_seconds` observes the
    /// whole of it, as the kubelet's does: the listing and the comparison with the stores.
    pub async fn relist(&self) -> Result<BTreeSet<PodUid>, crate::model::runtime::RuntimeError> {
        let started = Instant::now();
        let listed = self.runtime.list_pods().await?;
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).retain(|uid, _| listed.contains_key(uid));
        let mut reported = BTreeSet::new();
        for (uid, state) in &listed {
            if self.report(uid, Some(state), started) {
                reported.insert(uid.clone());
            }
        }
        let mut gone: BTreeSet<PodUid> = gone(&self.actual, &listed).into_iter().collect();
        if let Some((actual, _)) = &self.sandboxes {
            gone.extend(self::gone(actual, &listed));
        }
        for uid in gone {
            if self.report(&uid, None, started) {
                reported.insert(uid);
            }
        }
        self.metrics.pleg_relist_duration.observe(started.elapsed().as_secs_f64());
        Ok(reported)
    }

    /// Reads the pods `uids` (at once) and returns those it reported, that differed from the stores.
    /// `nodelet_pleg_pod_read_duration_seconds` observes it.
    async fn read_pods(
        &self,
        uids: &BTreeSet<PodUid>,
    ) -> Result<BTreeSet<PodUid>, crate::model::runtime::RuntimeError> {
        let started = Instant::now();
        let states = futures::future::join_all(uids.iter().map(|uid| self.runtime.pod_state(uid))).await;
        let mut reported = BTreeSet::new();
        for (uid, state) in uids.iter().zip(states) {
            if self.report(uid, state?.as_ref(), started) {
                reported.insert(uid.clone());
            }
        }
        self.metrics.pleg_pod_read_duration.observe(started.elapsed().as_secs_f64());
        Ok(reported)
    }

    /// Reports pod `uid` if `state` (read at `started`; `None`: not in the runtime) differs from the
    /// stores: its containers from the pod store, its sandboxes from the sandbox store; returns whether
    /// it reported anything.
    fn report(&self, uid: &PodUid, state: Option<&ListedPod>, started: Instant) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(state) = state else {
            seen.remove(uid);
            return self.report_gone(uid, started);
        };
        let before = seen.remove(uid).filter(|s| s.listed.same(state));
        let mut reported = false;
        let current = self.actual.get(uid);
        let pod_same = same_arc(before.as_ref().and_then(|s| s.pod.as_ref()), current.as_ref())
            || current.as_ref().is_some_and(|a| **a == *state.pod);
        if !pod_same {
            self.observer.observe(uid.clone(), Update::Set(PodActual::clone(&state.pod)), started);
            reported = true;
        }
        let mut sandboxes_same = None;
        if let Some((actual, observer)) = &self.sandboxes {
            let current = actual.get(uid);
            let same = same_arc(before.as_ref().and_then(|s| s.sandboxes.as_ref()), current.as_ref())
                || current.as_ref().is_some_and(|a| {
                    !a.needs_refresh
                        && match &state.sandboxes {
                            Some(listed) => {
                                a.sandboxes == listed.sandboxes
                                    && a.namespace == listed.namespace
                                    && a.name == listed.name
                            }
                            None => {
                                a.sandboxes.is_empty()
                                    && a.namespace == state.pod.namespace
                                    && a.name == state.pod.name
                            }
                        }
                });
            if same {
                sandboxes_same = current;
            } else {
                let update = state
                    .sandboxes
                    .as_deref()
                    .map_or(Update::Remove, |s| Update::Set(PodSandboxes::clone(s)));
                if !matches!(update, Update::Remove) || current.is_some() {
                    observer.observe(uid.clone(), update, started);
                    reported = true;
                }
            }
        }
        seen.insert(
            uid.clone(),
            Seen {
                listed: state.clone(),
                pod: pod_same.then_some(current).flatten(),
                sandboxes: sandboxes_same,
            },
        );
        reported
    }

    /// Reports pod `uid` gone from the runtime where a store still has it; returns whether it
    /// reported anything.
    fn report_gone(&self, uid: &PodUid, started: Instant) -> bool {
        let mut reported = false;
        if self.actual.contains_key(uid) {
            self.observer.observe(uid.clone(), Update::Remove, started);
            reported = true;
        }
        if let Some((actual, observer)) = &self.sandboxes
            && actual.contains_key(uid)
        {
            observer.observe(uid.clone(), Update::Remove, started);
            reported = true;
        }
        reported
    }

    /// What the events in `pending` ask to look at: `None` when nothing.
    async fn resolve(&self, pending: Pending) -> Option<Scope> {
        if pending.relist {
            return Some(Scope::All);
        }
        if pending.ids.is_empty() {
            return None;
        }
        let mut found: HashSet<&str> = HashSet::new();
        let mut uids = BTreeSet::new();
        let mut place = |uid: &PodUid, ids: &mut dyn Iterator<Item = &str>| {
            for id in ids {
                if let Some((known, _)) = pending.ids.get_key_value(id) {
                    found.insert(known.as_str());
                    uids.insert(uid.clone());
                }
            }
        };
        self.actual.for_each(|uid, pod| place(uid, &mut pod.containers.iter().map(|c| c.id.as_str())));
        if let Some((actual, _)) = &self.sandboxes {
            actual.for_each(|uid, pod| place(uid, &mut pod.sandboxes.iter().map(|s| s.id.as_str())));
        }
        let unknown: Vec<&str> = pending
            .ids
            .iter()
            .filter(|(id, ask)| **ask && !found.contains(id.as_str()))
            .map(|(id, _)| id.as_str())
            .collect();
        if uids.len() > MAX_POD_READS || unknown.len() > MAX_ASKED {
            return Some(Scope::All);
        }
        let owners = futures::future::join_all(unknown.iter().map(|id| self.runtime.pod_of(id))).await;
        for owner in owners {
            match owner {
                Ok(Some(uid)) => {
                    uids.insert(uid);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot place a runtime event: relisting");
                    return Some(Scope::All);
                }
            }
        }
        match uids.len() {
            0 => None,
            n if n > MAX_POD_READS => Some(Scope::All),
            _ => Some(Scope::Pods(uids)),
        }
    }

    /// Relists at once, then every period, and follows the runtime's events, with follow-ups (see
    /// [`FOLLOW_UP_RELIST`]), until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last_relist = Instant::now();
        let mut follow_up: Option<FollowUp> = None;
        let (mut cause, mut scope) = (Cause::Period, Scope::All);
        // the evented period of the next relist, jitter included (drawn at each relist, the first included)
        let mut evented_period = self.evented_period;
        loop {
            let now = Instant::now();
            let looked = match &scope {
                Scope::All => {
                    self.metrics.pleg_relist_interval.observe((now - last_relist).as_secs_f64());
                    last_relist = now;
                    evented_period = jittered(self.evented_period, fastrand::f64());
                    // Boxed: a relist's state (the runtime's answers) is held only while it runs.
                    Box::pin(self.relist()).await
                }
                Scope::Pods(uids) => self.read_pods(uids).await,
            };
            let reported = looked.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "relist failed");
                BTreeSet::new()
            });
            let ended = Instant::now();
            let cost = ended - now;
            follow_up = match cause {
                Cause::Event => {
                    let scope = match follow_up.take() {
                        Some(f) => f.scope.merge(scope),
                        None => scope,
                    };
                    Some(FollowUp {
                        scope,
                        step: FOLLOW_UP_RELIST,
                        due: ended + FOLLOW_UP_RELIST,
                        until_quiet: false,
                    })
                }
                // a chain of follow-ups ends at the period (or, started by a relist, when quiet)
                Cause::FollowUp { step, until_quiet } => {
                    next_follow_up(scope, step, until_quiet, !reported.is_empty(), ended, self.period)
                }
                // the pods a relist reported are looked at again (an observation the engine
                // dropped is reported again); the others matched the stores
                Cause::Period if !reported.is_empty() => {
                    let scope = Scope::of(reported);
                    // an event's chain that was pending keeps running to the period
                    let (scope, until_quiet) = match follow_up.take() {
                        Some(f) => (f.scope.merge(scope), f.until_quiet),
                        None => (scope, true),
                    };
                    Some(FollowUp {
                        scope,
                        step: FOLLOW_UP_RELIST,
                        due: ended + FOLLOW_UP_RELIST,
                        until_quiet,
                    })
                }
                Cause::Period => follow_up,
            };
            (cause, scope) = loop {
                let period = if self.waker.evented() { evented_period.max(self.period) } else { self.period };
                let periodic = last_relist + period;
                let due = follow_up.as_ref().map_or(periodic, |f| f.due.min(periodic));
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep_until(due) => match follow_up.take() {
                        Some(f) if f.due < periodic => {
                            break (Cause::FollowUp { step: f.step, until_quiet: f.until_quiet }, f.scope);
                        }
                        kept => {
                            follow_up = kept;
                            break (Cause::Period, Scope::All);
                        }
                    },
                    () = self.waker.0.notify.notified() => {
                        if let Some(scope) = self.resolve(self.waker.take()).await {
                            break (Cause::Event, scope);
                        }
                    }
                }
            };
            if cause == Cause::Event {
                let delay = coalesce_delay(cost, ended.elapsed());
                if !delay.is_zero() {
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    if let Some(more) = self.resolve(self.waker.take()).await {
                        scope = scope.merge(more);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_gone_are_those_of_the_store_the_listing_lacks() {
        let (store, mut writer) = reconcile_engine::store::<PodUid, u8>();
        let listed = |uids: &[&str]| -> std::collections::HashMap<PodUid, ListedPod> {
            uids.iter().map(|u| ((*u).to_owned(), ListedPod::default())).collect()
        };
        assert!(gone(&store, &listed(&["a"])).is_empty(), "an empty store lacks nothing");
        for uid in ["a", "b", "c"] {
            writer.insert(uid.to_owned(), 0);
        }
        let mut left = gone(&store, &listed(&["b", "d"]));
        left.sort();
        assert_eq!(left, ["a", "c"]);
        assert!(gone(&store, &listed(&["a", "b", "c"])).is_empty());
        writer.remove(&"a".to_owned());
        assert_eq!(gone(&store, &listed(&["b", "c"])), Vec::<PodUid>::new(), "a removed key is not reported");
        assert_eq!(gone(&store, &listed(&[])).len(), 2);
    }

    #[test]
    fn an_events_chain_runs_to_the_period_and_a_relists_ends_when_quiet() {
        let (ended, period, step) = (Instant::now(), Duration::from_secs(1), FOLLOW_UP_RELIST);
        let pods = || Scope::Pods(BTreeSet::from(["u".to_owned()]));
        let next = |until_quiet, reported| next_follow_up(pods(), step, until_quiet, reported, ended, period);
        for reported in [false, true] {
            let f = next(false, reported).expect("an event's chain goes on, found or not");
            assert_eq!((f.step, f.due, f.until_quiet), (step * 2, ended + step * 2, false));
        }
        assert!(next(true, false).is_none(), "a relist's chain ends at a quiet look");
        let f = next(true, true).expect("and goes on while its looks report");
        assert_eq!((f.step, f.scope, f.until_quiet), (step * 2, pods(), true));
        let last = next_follow_up(pods(), Duration::from_millis(800), false, true, ended, period);
        assert!(last.is_none(), "no chain goes past the period");
        assert!(
            next_follow_up(Scope::All, Duration::MAX, false, true, ended, period).is_none(),
            "no overflow"
        );
    }

    #[test]
    fn the_evented_relist_comes_up_to_a_tenth_of_its_period_late() {
        let minute = Duration::from_secs(60);
        assert_eq!(jittered(minute, 0.0), minute);
        assert_eq!(jittered(minute, 0.5), Duration::from_secs(63));
        assert_eq!(jittered(minute, 1.0), Duration::from_secs(66));
        assert_eq!(jittered(minute, 7.0), Duration::from_secs(66), "never more");
        assert_eq!(jittered(minute, -1.0), minute, "never less");
    }

    #[test]
    fn a_woken_relist_waits_twice_the_last_cost_at_most_the_follow_up() {
        let ms = Duration::from_millis;
        assert_eq!(coalesce_delay(ms(0), ms(0)), ms(0), "a cheap relist is not delayed");
        assert_eq!(coalesce_delay(ms(20), ms(0)), ms(40));
        assert_eq!(coalesce_delay(ms(20), ms(15)), ms(25), "time already passed counts");
        assert_eq!(coalesce_delay(ms(20), ms(500)), ms(0), "a lone event on a quiet node is seen at once");
        assert_eq!(coalesce_delay(ms(300), ms(0)), FOLLOW_UP_RELIST, "never longer than a follow-up");
        assert_eq!(coalesce_delay(Duration::MAX, ms(0)), FOLLOW_UP_RELIST, "no overflow");
    }
}
