//! The engine loop: wakes on desired-state changes, completions, rechecks and a periodic resync,
//! asks the reconciler for a plan per changed key, and hands the plan to the executor.
//!
//! One planning pass plans the keys whose operation finished (with the actual value the
//! completion just wrote, and the desired value the operation was planned from while the desired
//! store has not been written since), then the keys marked changed. At start-up and on each
//! resync the pass walks both stores instead and plans every key with the values found there.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::delay_queue;

use crate::executor::OpError;
use crate::executor::{Completion, Core, Done, ExecutorConfig};
use crate::metrics::{Metrics, OpResult};
use crate::reconciler::View;
use crate::relation::{RelationSpec, Relations};
use crate::store::{Subscription, Writer};
use crate::timers::Timers;
use crate::{
    BackoffConfig, Driver, Key, Map, Operation, Outcome, Plan, Reconciler, Set, Store, Update, WallClock,
    store,
};

/// Engine settings: [`Default`], then set the public fields (or use the setters of
/// [`EngineBuilder`], which change the same fields).
///
/// ```
/// use std::time::Duration;
/// use reconcile_engine::{EngineConfig, ExecutorConfig};
///
/// let config = EngineConfig {
///     resync_period: Duration::from_secs(60),
///     executor: ExecutorConfig::default().with_max_concurrent(8),
///     ..EngineConfig::default()
/// };
/// assert_eq!(config.shutdown_deadline, EngineConfig::DEFAULT_SHUTDOWN_DEADLINE);
/// ```
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Every key is reconsidered at this period, whether or not it changed. Default:
    /// [`EngineConfig::DEFAULT_RESYNC`].
    pub resync_period: Duration,
    /// How long [`Engine::run`] lets running operations finish after shutdown was asked for.
    /// Default: [`EngineConfig::DEFAULT_SHUTDOWN_DEADLINE`].
    pub shutdown_deadline: Duration,
    /// Executor settings.
    pub executor: ExecutorConfig,
}

impl EngineConfig {
    /// 30 s: changes are handled as they happen; the resync only catches what nobody reported.
    pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);
    /// 30 s, like a pod's default termination grace period.
    pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            resync_period: Self::DEFAULT_RESYNC,
            shutdown_deadline: Self::DEFAULT_SHUTDOWN_DEADLINE,
            executor: ExecutorConfig::default(),
        }
    }
}

/// The last unsuccessful operation on a key, kept until an operation on the key succeeds:
/// what status pages show as "why is this not done yet" and "when is the next try".
#[derive(Debug)]
pub struct OpStatus<Op, E> {
    /// The operation.
    pub op: Op,
    /// How it ended: `failed`, `uncertain` or `timeout` (a cancelled operation leaves the status
    /// as it was).
    pub result: OpResult,
    /// The error.
    pub error: OpError<E>,
    /// Failures of this kind in a row.
    pub failures: u32,
    /// When the next attempt may start, if the key backs off.
    pub retry_at: Option<Instant>,
}

/// Reports changes of the world that no operation made (a process died, a file was deleted):
/// [`observe`](Observer::observe) sets a key's actual value, and the engine plans the key (with
/// its ancestors and descendants) again. Cheap to clone; [`Engine::observer`] hands one out,
/// before [`Engine::run`] consumes the engine.
///
/// Use it for a relist that compares the world with the actual store (what the kubelet's PLEG
/// does for containers) or for an event stream of the world; the engine itself writes the actual
/// store only from [`Driver::reconstruct`] and from operations' outcomes.
///
/// An observation is dropped
/// - while an operation runs on the key (its result is newer), and
/// - if an operation on the key finished strictly after the observation's time: the engine times
///   each completion with `tokio::time::Instant::now()` when it handles it, and an observation
///   made at exactly that instant is kept (on paused time the two are often equal).
///
/// A dropped observation is not retried: observers report again on their next relist, comparing
/// with the actual store. The [guide](crate::guide) (section 8) has a relist.
pub struct Observer<K, A> {
    tx: tokio::sync::mpsc::UnboundedSender<Observation<K, A>>,
}

/// An observation in flight, boxed: a channel allocates its slots 32 at a time, at its creation,
/// so an unboxed `Update<A>` would cost every engine 32 actual records up front.
type Observation<K, A> = Box<(K, Update<A>, Instant)>;

impl<K, A> Clone for Observer<K, A> {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone() }
    }
}

impl<K, A> fmt::Debug for Observer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl<K, A> Observer<K, A> {
    /// Reports that `key`'s actual value changed as `update` says, as seen at `observed_at`: a
    /// [`tokio::time::Instant`][Instant] (paused with tokio's clock in tests; from a
    /// `std::time::Instant` with `Instant::from_std`), taken before reading the world. See
    /// [`Observer`] for when the engine drops it. Returns `false` if the engine has stopped.
    ///
    /// [Instant]: https://docs.rs/tokio/1/tokio/time/struct.Instant.html
    pub fn observe(&self, key: K, update: Update<A>, observed_at: Instant) -> bool {
        self.tx.send(Box::new((key, update, observed_at))).is_ok()
    }
}

/// Completions handled in one go before the engine plans again.
const COMPLETION_BATCH: usize = 256;

/// What [`Engine::run`] did before it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunReport {
    /// Operations that finished (any result).
    pub operations: u64,
    /// Entries the driver reported at start-up.
    pub reconstructed: usize,
    /// Operations still running at the shutdown deadline, cancelled and abandoned.
    pub abandoned: usize,
}

/// Builds an [`Engine`].
pub struct EngineBuilder<D, A: Send + 'static, R: Reconciler<D, A>, Dr: Driver<R::Key, R::Op, A>> {
    name: String,
    reconciler: R,
    driver: Arc<Dr>,
    desired: Store<R::Key, D>,
    config: EngineConfig,
    metrics: Option<Metrics>,
    actual: Store<R::Key, A>,
    actual_writer: Writer<R::Key, A>,
    status: Store<R::Key, OpStatus<R::Op, Dr::Error>>,
    status_writer: Writer<R::Key, OpStatus<R::Op, Dr::Error>>,
    relations: Vec<RelationSpec<R::Key>>,
    gates: Vec<Gate>,
    wall_clock: WallClock,
    _actual: PhantomData<fn() -> A>,
}

/// Waits until a store has synced: `true`, or `false` if its writer was dropped before.
type GateFn = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// A store the engine waits for before it plans anything ([`EngineBuilder::waits_for`]).
struct Gate {
    name: String,
    wait: GateFn,
}

impl<D, A: Send + 'static, R: Reconciler<D, A>, Dr: Driver<R::Key, R::Op, A>> fmt::Debug
    for EngineBuilder<D, A, R, Dr>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("relations", &self.relations.iter().map(|r| r.name.as_str()).collect::<Vec<_>>())
            .field("gates", &self.gates.iter().map(|g| g.name.as_str()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<D, A, R, Dr> EngineBuilder<D, A, R, Dr>
where
    D: Send + Sync + 'static,
    A: Send + Sync + 'static,
    R: Reconciler<D, A>,
    Dr: Driver<R::Key, R::Op, A>,
{
    /// Sets the whole configuration.
    #[must_use]
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets the resync period.
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.config.resync_period = period;
        self
    }

    /// Sets the bound on concurrent operations (`0` = unbounded).
    #[must_use]
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.config.executor.max_concurrent = n;
        self
    }

    /// Sets the default operation timeout.
    #[must_use]
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.executor.default_timeout = timeout;
        self
    }

    /// Sets the backoff policy.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.config.executor.backoff = backoff;
        self
    }

    /// Sets the shutdown deadline.
    #[must_use]
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.config.shutdown_deadline = deadline;
        self
    }

    /// Reports metrics through `metrics` (shared by several engines; each adds its own
    /// `reconciler` label). Without it the engine's metrics go to a private registry.
    #[must_use]
    pub fn metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }

    /// A reader of the actual store the engine will write, already before it is built: to
    /// declare a relation on it ([`watches`](Self::watches)) or hand it to another pair.
    pub fn actual(&self) -> Store<R::Key, A> {
        self.actual.clone()
    }

    /// A reader of the operation status store the engine will write (see [`Engine::op_status`]),
    /// already before it is built: for the reconciler to read it as a side input (a field of its
    /// [`Reconciler::Inputs`], given to [`build_with`](Self::build_with)), or to hand it to another pair.
    pub fn op_status(&self) -> Store<R::Key, OpStatus<R::Op, Dr::Error>> {
        self.status.clone()
    }

    /// Sets the wall clock read into [`View::wall`] at every planning pass. Default:
    /// [`WallClock::system`]. Tests on paused time give [`WallClock::tokio`].
    #[must_use]
    pub fn wall_clock(mut self, clock: WallClock) -> Self {
        self.wall_clock = clock;
        self
    }

    /// Makes the engine wait, after [`Driver::reconstruct`] and before it plans anything, until
    /// `store` has synced once ([`Writer::mark_synced`]); once every store it waits for has, it
    /// plans every key. `name` names the store in the engine's logs.
    ///
    /// For a reconciler that cannot decide before another pair has loaded: a pod whose sandboxes
    /// are not read yet looks as if they were gone. Events that come meanwhile (desired changes,
    /// observations, relations) are kept and handled after. A store whose writer is dropped
    /// before it ever synced no longer holds the engine back (a warning is logged).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use reconcile_engine::testing::FakeDriver;
    /// use reconcile_engine::{CancellationToken, Engine, Plan, Reconciler, Update, View, store};
    /// # #[derive(Clone, Debug, PartialEq)] struct Start;
    /// # impl reconcile_engine::Operation for Start { fn kind(&self) -> &'static str { "start" } }
    /// struct Rec;
    /// impl Reconciler<u32, u32> for Rec {
    ///     type Key = String;
    ///     type Op = Start;
    ///     type Inputs = ();
    ///     fn reconcile(&self, v: &View<'_, String, u32, u32>) -> Plan<Start> {
    ///         if v.actual.is_none() { Plan::Run(Start) } else { Plan::Idle }
    ///     }
    ///     fn uncertain(&self, _: &String, _: &Start, _: Option<&u32>) -> Update<u32> { Update::Keep }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (desired, mut writer) = store::<String, u32>();
    /// let (sandboxes, mut sandbox_writer) = store::<String, bool>(); // another pair's store
    /// let driver = Arc::new(FakeDriver::new(|_: &String, _: &Start| Update::Set(1)));
    /// writer.insert("a".into(), 1);
    /// let engine = Engine::builder("gated", Rec, driver.clone(), desired)
    ///     .waits_for("sandboxes", sandboxes)
    ///     .build();
    /// let stop = CancellationToken::new();
    /// let run = tokio::spawn(engine.run(stop.clone().cancelled_owned()));
    /// tokio::time::sleep(Duration::from_secs(1)).await;
    /// assert!(driver.calls().is_empty(), "nothing planned before the sandboxes loaded");
    /// sandbox_writer.mark_synced();
    /// tokio::time::sleep(Duration::from_secs(1)).await;
    /// assert_eq!(driver.calls().len(), 1);
    /// stop.cancel();
    /// run.await.unwrap();
    /// # }
    /// ```
    #[must_use]
    pub fn waits_for<K2: Key, V2: Send + Sync + 'static>(
        mut self,
        name: impl Into<String>,
        store: Store<K2, V2>,
    ) -> Self {
        let wait: GateFn = Box::new(move || Box::pin(async move { store.wait_until_synced().await.is_ok() }));
        self.gates.push(Gate { name: name.into(), wait });
        self
    }

    /// Declares a relation named `name` (the `relation` label of
    /// `reconcile_engine_relation_wakeups_total`): whenever a key of `store` changes (is set or
    /// removed), `mapper` maps it, with its new value (`None` once removed), to keys of this
    /// engine, and the engine plans those again. The reconciler reads the store through its
    /// [`Inputs`](Reconciler::Inputs) (give the engine a clone of it there).
    ///
    /// Changes are coalesced per key between two passes of the engine (a key written many times
    /// is mapped once, with its latest value); none is lost, and nothing is polled. A removed
    /// key's value is gone by the time the mapper runs: a mapper that must know what a removed
    /// key was related to reads it from a store it keeps (this engine's actual store, say, which
    /// still holds the relation until an operation removes it). The mapper runs on the engine's
    /// task: keep it cheap, and never write to a store from it.
    ///
    /// A relation may watch this engine's own stores (the desired store, or [`actual`](Self::actual)),
    /// for keys related other than by [`Key::parent`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use reconcile_engine::{Engine, Plan, Reconciler, Store, Update, View, store};
    /// # use reconcile_engine::{Driver, Operation, Outcome, CancellationToken};
    /// # #[derive(Clone, Debug, PartialEq)] struct Start;
    /// # impl Operation for Start { fn kind(&self) -> &'static str { "start" } }
    /// # struct Runtime;
    /// # impl Driver<String, Start, bool> for Runtime {
    /// #     type Error = std::io::Error;
    /// #     async fn execute(&self, _: &String, _: &Start, _: &CancellationToken) -> Outcome<bool, std::io::Error> {
    /// #         Outcome::Done(Update::Set(true))
    /// #     }
    /// # }
    ///
    /// /// Starts a pod once every volume it needs (key "pod/volume") is mounted.
    /// struct Pods;
    /// /// What the pod reconciler reads besides its own stores.
    /// struct PodInputs {
    ///     /// The volume engine's actual store: key "pod/volume", `true` once mounted.
    ///     volumes: Store<String, bool>,
    /// }
    /// impl Reconciler<Vec<String>, bool> for Pods {
    ///     type Key = String;
    ///     type Op = Start;
    ///     type Inputs = PodInputs;
    ///     fn reconcile(&self, v: &View<'_, String, Vec<String>, bool, PodInputs>) -> Plan<Start> {
    ///         let volumes = &v.inputs.volumes;
    ///         let ready = v.desired.is_some_and(|names| {
    ///             names.iter().all(|n| volumes.get(&format!("{}/{n}", v.key)).is_some_and(|m| *m))
    ///         });
    ///         if ready && v.actual.is_none() { Plan::Run(Start) } else { Plan::Idle }
    ///     }
    ///     fn uncertain(&self, _: &String, _: &Start, _: Option<&bool>) -> Update<bool> { Update::Keep }
    /// }
    ///
    /// let (pods, _pod_writer) = store::<String, Vec<String>>();
    /// let (mounted, _volume_writer) = store::<String, bool>(); // another engine's actual store
    /// let engine = Engine::builder("pods", Pods, Arc::new(Runtime), pods)
    ///     // "p1/data" changed (or went away): plan pod "p1" again.
    ///     .watches("volumes", mounted.clone(), |key: &String, _mounted: Option<&bool>| {
    ///         key.split_once('/').map(|(pod, _)| pod.to_owned())
    ///     })
    ///     .build_with(PodInputs { volumes: mounted });
    /// # drop(engine);
    /// ```
    #[must_use]
    pub fn watches<K2, V2, I, F>(mut self, name: impl Into<String>, store: Store<K2, V2>, mapper: F) -> Self
    where
        K2: Key,
        V2: Send + Sync + 'static,
        I: IntoIterator<Item = R::Key>,
        F: Fn(&K2, Option<&V2>) -> I + Send + Sync + 'static,
    {
        self.relations.push(RelationSpec::new(name.into(), store, mapper));
        self
    }

    /// Builds the engine of a reconciler without side inputs (`type Inputs = ()`). Nothing runs
    /// until [`Engine::run`].
    ///
    /// A reconciler with side inputs is built with [`build_with`](Self::build_with): calling
    /// `build` on it does not compile.
    pub fn build(self) -> Engine<D, A, R, Dr>
    where
        R: Reconciler<D, A, Inputs = ()>,
    {
        self.build_with(())
    }

    /// Builds the engine with the reconciler's side inputs `inputs`, which every [`View`] shows
    /// ([`View::inputs`]). Nothing runs until [`Engine::run`].
    ///
    /// The inputs are often built from the builder's own stores first
    /// ([`actual`](Self::actual), [`op_status`](Self::op_status)) and other pairs' stores; a store
    /// whose changes should plan keys again is also watched ([`watches`](Self::watches)).
    pub fn build_with(self, inputs: R::Inputs) -> Engine<D, A, R, Dr> {
        let metrics = self.metrics.unwrap_or_else(Metrics::unregistered);
        let executor = Core::new(&self.name, self.driver, self.config.executor.clone(), &metrics);
        let (actual, actual_writer) = (self.actual, self.actual_writer);
        let relations =
            Relations::start(self.relations, |relation| metrics.relation_wakeups(&self.name, relation));
        let desired_sub = self.desired.subscribe();
        let (status, status_writer) = (self.status, self.status_writer);
        let (tx, observations) = tokio::sync::mpsc::unbounded_channel();
        Engine {
            name: self.name,
            reconciler: self.reconciler,
            executor,
            desired: self.desired,
            desired_sub,
            actual,
            actual_writer,
            config: self.config,
            dirty: Set::default(),
            resync: false,
            completed: Vec::new(),
            children: Map::default(),
            held: Set::default(),
            rechecks: Timers::new(),
            recheck_keys: Map::default(),
            operations: 0,
            status,
            status_writer,
            observations,
            observer: Observer { tx },
            last_completion: Map::default(),
            observed_by_others: false,
            relations,
            gates: self.gates,
            wall_clock: self.wall_clock,
            inputs,
        }
    }
}

/// Runs one reconciler: desired store → reconciler → executor → driver → actual store.
///
/// Only operation completions, start-up reconstruction and an [`Observer`]'s observations write
/// the actual store, which the engine owns; read it through [`Engine::actual`]. Build it with
/// [`Engine::builder`]; [`run`](Engine::run) consumes it.
///
/// # When a key is planned again
///
/// The engine asks the reconciler for a plan for a key only when one of these happened (keys
/// planned for several reasons between two passes are planned once):
///
/// | trigger | keys planned |
/// |---|---|
/// | the desired store's writer set or removed a key (changes coalesce between passes) | that key, its ancestors and its descendants ([`Key::parent`]) |
/// | an operation on a key finished, whatever its result | that key, its ancestors and its descendants |
/// | an [`Observer`] reported a key and the observation was kept | that key, its ancestors and its descendants |
/// | a store watched by a relation ([`EngineBuilder::watches`]) set or removed a key | the keys the relation's mapper returns |
/// | [`Plan::RecheckAfter(delay)`](Plan::RecheckAfter) for a key | that key, after `delay` (the timer goes if the key is planned earlier) |
/// | start-up: [`Driver::reconstruct`] succeeded and every store of [`EngineBuilder::waits_for`] synced | every key of both stores |
/// | the desired store synced ([`Writer::mark_synced`]), or its writer was dropped before it ever synced | every key of both stores |
/// | every [`EngineConfig::resync_period`] | every key of both stores |
///
/// Nothing else does: a side input ([`Reconciler::Inputs`]) that no relation watches is read,
/// not watched, and the end of a backoff starts the operation already planned without planning
/// again. Something the reconciler reads that is not a store (a registry of plugins) is copied
/// into a store by a task of its own (a populator, which writes it whenever the source changes)
/// and watched through a relation.
pub struct Engine<D, A, R, Dr>
where
    A: Send + 'static,
    R: Reconciler<D, A>,
    Dr: Driver<R::Key, R::Op, A>,
{
    name: String,
    reconciler: R,
    executor: Core<R::Key, R::Op, A, Dr, Planned<D>>,
    desired: Store<R::Key, D>,
    desired_sub: Subscription<R::Key>,
    actual: Store<R::Key, A>,
    actual_writer: Writer<R::Key, A>,
    config: EngineConfig,
    dirty: Set<R::Key>,
    /// Every key is to be planned in the next pass (start-up and resyncs).
    resync: bool,
    /// Keys whose operation finished since the last pass. They are planned in the next pass
    /// without going through `dirty` (one operation per key, so each appears once).
    completed: Vec<Finished<R::Key, D, A>>,
    /// Parent → children present in either store, to reconsider descendants of a changed key.
    children: Map<R::Key, Set<R::Key>>,
    /// Keys whose teardown waits for the desired store to sync.
    held: Set<R::Key>,
    rechecks: Timers<R::Key>,
    recheck_keys: Map<R::Key, delay_queue::Key>,
    operations: u64,
    status: Store<R::Key, OpStatus<R::Op, Dr::Error>>,
    status_writer: Writer<R::Key, OpStatus<R::Op, Dr::Error>>,
    observations: tokio::sync::mpsc::UnboundedReceiver<Observation<R::Key, A>>,
    observer: Observer<R::Key, A>,
    /// When the last operation on a key finished, to drop older observations (kept only once an
    /// observer was handed out).
    last_completion: Map<R::Key, Instant>,
    observed_by_others: bool,
    relations: Relations<R::Key>,
    /// Stores to wait for before the first pass; emptied once they synced.
    gates: Vec<Gate>,
    wall_clock: WallClock,
    inputs: R::Inputs,
}

impl<D, A, R, Dr> fmt::Debug for Engine<D, A, R, Dr>
where
    A: Send + 'static,
    R: Reconciler<D, A>,
    Dr: Driver<R::Key, R::Op, A>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("dirty", &self.dirty.len())
            .field("resync", &self.resync)
            .finish_non_exhaustive()
    }
}

/// What the engine attaches to an operation it submits: the desired value it planned from, and
/// the desired store's version when it read it.
struct Planned<D> {
    desired: Option<Arc<D>>,
    version: u64,
}

/// What one planning pass shares between its keys.
struct Pass {
    synced: bool,
    now: Instant,
    wall: std::time::SystemTime,
    /// The desired store's version at the start of the pass.
    version: u64,
}

/// What the engine already knows of a key it plans; `None` fields are read from the stores.
struct Known<D, A> {
    desired: Option<Option<Arc<D>>>,
    actual: Option<Option<Arc<A>>>,
    /// The executor keeps nothing for the key.
    released: bool,
}

impl<D, A> Known<D, A> {
    const NOTHING: Self = Self { desired: None, actual: None, released: false };
}

/// A key whose operation finished, waiting for the next planning pass.
struct Finished<K, D, A> {
    key: K,
    /// The actual value if the completion set or removed it (`None`: read the store).
    actual: Option<Option<Arc<A>>>,
    /// What the operation was planned from; still the desired value if the store's version did
    /// not change since.
    planned: Option<Planned<D>>,
    /// The executor keeps nothing for the key (nothing to withdraw or cancel).
    released: bool,
}

enum Event<K, Op, A, E, C> {
    Shutdown,
    Completion(Done<K, Op, A, E, C>),
    DesiredChanged,
    Resync,
    Synced,
    Recheck(K),
    Observed(K, Update<A>, Instant),
    Related,
}

impl<D, A, R, Dr> Engine<D, A, R, Dr>
where
    D: Send + Sync + 'static,
    A: Send + Sync + 'static,
    R: Reconciler<D, A>,
    Dr: Driver<R::Key, R::Op, A>,
{
    /// Starts building an engine named `name` (its `reconciler` metric label and tracing field)
    /// that reconciles `desired` through `reconciler` and `driver`.
    pub fn builder(
        name: impl Into<String>,
        reconciler: R,
        driver: Arc<Dr>,
        desired: Store<R::Key, D>,
    ) -> EngineBuilder<D, A, R, Dr> {
        let (actual, actual_writer) = store();
        let (status, status_writer) = store();
        EngineBuilder {
            name: name.into(),
            reconciler,
            driver,
            desired,
            config: EngineConfig::default(),
            metrics: None,
            actual,
            actual_writer,
            status,
            status_writer,
            relations: Vec::new(),
            gates: Vec::new(),
            wall_clock: WallClock::system(),
            _actual: PhantomData,
        }
    }

    /// A reader of the actual store.
    pub fn actual(&self) -> Store<R::Key, A> {
        self.actual.clone()
    }

    /// A reader of the operation status store: for each key whose last operation did not
    /// succeed, what happened and when it retries.
    pub fn op_status(&self) -> Store<R::Key, OpStatus<R::Op, Dr::Error>> {
        self.status.clone()
    }

    /// An observer that reports changes of the world seen outside operations (see [`Observer`]).
    /// From this call on the engine records when each key's operations finish, to drop older
    /// observations.
    pub fn observer(&mut self) -> Observer<R::Key, A> {
        self.observed_by_others = true;
        self.observer.clone()
    }

    /// The engine's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs until `shutdown` completes, then lets running operations finish within the shutdown
    /// deadline, cancels what is left and returns.
    ///
    /// It takes the engine by value: take the readers and handles you need
    /// ([`actual`](Engine::actual), [`op_status`](Engine::op_status),
    /// [`observer`](Engine::observer)) before, and spawn the returned
    /// future on a task of its own. `shutdown` is any `Future<Output = ()>`:
    /// `CancellationToken::cancelled_owned()`, a `oneshot` receiver mapped to `()`, a signal.
    /// Operations not yet started when it completes are dropped.
    ///
    /// First the driver reconstructs what exists into the actual store (retried with backoff
    /// until it succeeds or shutdown is asked for), which then counts as synced
    /// ([`Store::is_synced`] on [`Engine::actual`]); nothing is planned before that. Teardown
    /// operations are held until the desired store has synced once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> RunReport {
        let mut report = RunReport::default();
        tokio::pin!(shutdown);
        // Boxed: reconstruction runs once, and its state would otherwise stay in this future's size.
        match Box::pin(self.reconstruct(&mut shutdown)).await {
            Some(n) => report.reconstructed = n,
            None => return report,
        }
        if !self.wait_for_gates(&mut shutdown).await {
            return report;
        }
        self.dirty_all();
        let mut sync_watch = self.desired.sync_watch();
        let mut synced_seen = self.desired.is_synced();
        let mut resync =
            tokio::time::interval_at(Instant::now() + self.config.resync_period, self.config.resync_period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.plan_dirty();
            self.update_gauges();
            let event = {
                let rechecks = &mut self.rechecks;
                tokio::select! {
                    biased;
                    () = &mut shutdown => Event::Shutdown,
                    c = self.executor.next_done() => Event::Completion(c),
                    () = self.desired_sub.changed() => Event::DesiredChanged,
                    synced = self.desired.synced_changed(&mut sync_watch), if !synced_seen => {
                        if synced { Event::Synced } else { Event::Resync }
                    }
                    Some(key) = std::future::poll_fn(|cx| rechecks.poll_expired(cx)), if !rechecks.is_empty() => {
                        Event::Recheck(key)
                    }
                    Some(observed) = self.observations.recv() => {
                        let (key, update, at) = *observed;
                        Event::Observed(key, update, at)
                    }
                    () = self.relations.changed(), if !self.relations.is_empty() => Event::Related,
                    _ = resync.tick() => Event::Resync,
                }
            };
            match event {
                Event::Shutdown => break,
                Event::Completion(c) => {
                    self.operations += 1;
                    self.complete(c);
                    // Take the rest of a burst before planning again.
                    for _ in 0..COMPLETION_BATCH {
                        let Some(c) = self.executor.try_next_done() else { break };
                        self.operations += 1;
                        self.complete(c);
                    }
                }
                Event::DesiredChanged => {
                    for key in self.desired_sub.drain() {
                        self.mark_changed(key);
                    }
                }
                Event::Synced => {
                    synced_seen = true;
                    tracing::debug!(reconciler = %self.name, held = self.held.len(), "desired state synced");
                    // Every key, not only the held teardowns: a reconciler may have waited for the
                    // complete desired state in other ways (`View::desired_synced`).
                    self.dirty_all();
                }
                Event::Recheck(key) => {
                    self.recheck_keys.remove(&key);
                    self.dirty.insert(key);
                }
                Event::Resync => self.dirty_all(),
                Event::Related => {
                    let dirty = &mut self.dirty;
                    self.relations.drain(|key| {
                        dirty.insert(key);
                    });
                }
                Event::Observed(key, update, at) => {
                    self.observed(key, update, at);
                    while let Ok(observed) = self.observations.try_recv() {
                        let (key, update, at) = *observed;
                        self.observed(key, update, at);
                    }
                }
            }
        }
        report.abandoned = self.shut_down().await;
        report.operations = self.operations;
        report
    }

    /// Waits until every store of [`EngineBuilder::waits_for`] has synced; `false` if shutdown was
    /// asked for first.
    async fn wait_for_gates(&mut self, shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
        for gate in std::mem::take(&mut self.gates) {
            let wait = (gate.wait)();
            tracing::debug!(reconciler = %self.name, store = %gate.name, "waiting for a store to sync");
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return false,
                synced = wait => if !synced {
                    tracing::warn!(reconciler = %self.name, store = %gate.name, "a store's writer was dropped before it synced; planning without it");
                },
            }
        }
        true
    }

    async fn reconstruct(
        &mut self,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Option<usize> {
        let backoff = self.config.executor.backoff.clone();
        let mut rng = fastrand::Rng::new();
        let mut failures = 0;
        loop {
            let attempt = self.executor.driver().clone();
            tokio::select! {
                biased;
                () = shutdown.as_mut() => return None,
                res = attempt.reconstruct() => match res {
                    Ok(entries) => {
                        let n = entries.len();
                        for (key, value) in entries {
                            self.actual_writer.insert(key, value);
                        }
                        self.actual_writer.mark_synced();
                        tracing::info!(reconciler = %self.name, entries = n, "reconstructed actual state");
                        return Some(n);
                    }
                    Err(e) => {
                        failures += 1;
                        let delay = backoff.delay(failures, &mut rng);
                        tracing::warn!(reconciler = %self.name, error = %e, retry_in = ?delay, "reconstruction failed");
                        tokio::select! {
                            biased;
                            () = shutdown.as_mut() => return None,
                            () = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
        }
    }

    async fn shut_down(&mut self) -> usize {
        self.executor.withdraw_all();
        let deadline = Instant::now() + self.config.shutdown_deadline;
        while self.executor.in_flight() > 0 {
            match tokio::time::timeout_at(deadline, self.executor.next_done()).await {
                Ok(done) => {
                    self.operations += 1;
                    self.apply(done.completion, done.released);
                }
                Err(_) => {
                    let left = self.executor.in_flight();
                    tracing::warn!(reconciler = %self.name, operations = left, "shutdown deadline passed; abandoning running operations");
                    self.executor.cancel_all();
                    return left;
                }
            }
        }
        0
    }

    fn observed(&mut self, key: R::Key, update: Update<A>, at: Instant) {
        let stale = self.executor.running_op(&key).is_some()
            || self.last_completion.get(&key).is_some_and(|done| *done > at);
        if stale {
            tracing::trace!(reconciler = %self.name, key = ?key, "dropped an observation older than an operation");
            return;
        }
        self.write_actual(&key, update);
        self.mark_changed(key);
    }

    fn write_actual(&mut self, key: &R::Key, update: Update<A>) {
        match update {
            Update::Set(value) => self.actual_writer.insert(key.clone(), value),
            Update::Remove => {
                self.actual_writer.remove(key);
            }
            Update::Keep => {}
        }
    }

    /// Writes a completion's effect into the actual and status stores; returns the key, and its
    /// actual value if the completion set or removed it. `spare` is a copy of the key the
    /// executor handed back, written to the store instead of a new copy.
    fn apply(
        &mut self,
        c: Completion<R::Key, R::Op, A, Dr::Error>,
        spare: Option<R::Key>,
    ) -> (R::Key, Option<Option<Arc<A>>>) {
        if self.observed_by_others {
            self.last_completion.insert(c.key.clone(), Instant::now());
        }
        let (update, error) = match c.outcome {
            Outcome::Done(update) => (update, None),
            Outcome::Failed(e) => (Update::Keep, Some(e)),
            Outcome::Uncertain(e) => {
                let actual = self.actual.get(&c.key);
                (self.reconciler.uncertain(&c.key, &c.op, actual.as_deref()), Some(e))
            }
        };
        match error {
            // Most keys never failed: skip the lookup while the status store is empty.
            None if self.status.is_empty() => {}
            None => {
                self.status_writer.remove(&c.key);
            }
            Some(_) if c.result == OpResult::Cancelled => {}
            Some(error) => self.status_writer.insert(
                c.key.clone(),
                OpStatus {
                    op: c.op.clone(),
                    result: c.result,
                    error,
                    failures: c.failures,
                    retry_at: c.retry_at,
                },
            ),
        }
        let known = match update {
            Update::Set(value) => {
                let value = Arc::new(value);
                let key = spare.unwrap_or_else(|| c.key.clone());
                self.actual_writer.insert_arc(key, value.clone());
                Some(Some(value))
            }
            Update::Remove => {
                self.actual_writer.remove(&c.key);
                Some(None)
            }
            Update::Keep => None,
        };
        (c.key, known)
    }

    fn complete(&mut self, done: Done<R::Key, R::Op, A, Dr::Error, Planned<D>>) {
        let Done { completion, context, released } = done;
        let was_released = released.is_some();
        let (key, actual) = self.apply(completion, released);
        self.mark_relatives(&key);
        self.completed.push(Finished { key, actual, planned: context, released: was_released });
    }

    /// Marks every key of both stores for reconsideration and rebuilds the children index.
    ///
    /// The next pass does it ([`plan_everything`](Self::plan_everything)), walking the stores
    /// instead of marking every key in `dirty`.
    fn dirty_all(&mut self) {
        self.resync = true;
    }

    /// Plans every key of both stores, and every other key marked since the last pass, and
    /// rebuilds the children index; returns the number of keys planned. Walking a store hands
    /// each key's value over with the key, so a key's values are not looked up again.
    fn plan_everything(&mut self, pass: &Pass) -> u64 {
        self.children.clear();
        let mut planned = 0;
        // Keys marked for any other reason are planned below unless a store still holds them.
        let mut rest: Vec<R::Key> = std::mem::take(&mut self.dirty).into_iter().collect();
        rest.extend(self.held.drain());
        rest.extend(self.completed.drain(..).map(|done| done.key));
        // Collected first: the stores' locks are not held while the reconciler runs.
        for (key, desired) in self.desired.entries() {
            self.index_child(&key);
            planned += 1;
            self.plan_key(key, Known { desired: Some(Some(desired)), actual: None, released: false }, pass);
        }
        // Only the keys the desired store does not hold (it is read, not written, meanwhile).
        let desired = &self.desired;
        for (key, actual) in self.actual.entries_where(|key| !desired.contains_key(key)) {
            self.index_child(&key);
            planned += 1;
            let known = Known { desired: Some(None), actual: Some(Some(actual)), released: false };
            self.plan_key(key, known, pass);
        }
        for key in rest {
            if !self.desired.contains_key(&key) && !self.actual.contains_key(&key) {
                planned += 1;
                self.plan_key(key, Known::NOTHING, pass);
            }
        }
        planned
    }

    /// Adds `key` under its parent in the children index.
    fn index_child(&mut self, key: &R::Key) {
        if let Some(parent) = key.parent() {
            self.children.entry(parent).or_default().insert(key.clone());
        }
    }

    /// Marks `key` for reconsideration with its ancestors and descendants, and keeps the
    /// parent → children index up to date.
    fn mark_changed(&mut self, key: R::Key) {
        self.mark_relatives(&key);
        self.dirty.insert(key);
    }

    /// Marks the ancestors and descendants of `key` for reconsideration, and keeps the parent →
    /// children index up to date.
    fn mark_relatives(&mut self, key: &R::Key) {
        let mut cur = key.parent();
        if let Some(parent) = &cur {
            let present = self.desired.contains_key(key) || self.actual.contains_key(key);
            if present {
                self.children.entry(parent.clone()).or_default().insert(key.clone());
            } else if let Some(set) = self.children.get_mut(parent) {
                set.remove(key);
                if set.is_empty() {
                    self.children.remove(parent);
                }
            }
        }
        while let Some(parent) = cur {
            cur = parent.parent();
            self.dirty.insert(parent);
        }
        if !self.children.is_empty() {
            let mut stack = vec![key.clone()];
            while let Some(k) = stack.pop() {
                if let Some(kids) = self.children.get(&k) {
                    for kid in kids {
                        if self.dirty.insert(kid.clone()) {
                            stack.push(kid.clone());
                        }
                    }
                }
            }
        }
    }

    /// Plans every key that changed (`dirty`) or finished an operation (`completed`) since the
    /// last pass.
    fn plan_dirty(&mut self) {
        if !self.resync && self.dirty.is_empty() && self.completed.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        // Read before any value of this pass: a value read after it is at least as new.
        let version = self.desired.version();
        let pass = Pass {
            synced: self.desired.is_synced(),
            now: Instant::now(),
            wall: self.wall_clock.now(),
            version,
        };
        if std::mem::take(&mut self.resync) {
            let planned = self.plan_everything(&pass);
            self.executor.metrics().reconciles.inc_by(planned);
            self.executor.metrics().loop_duration.observe(started.elapsed().as_secs_f64());
            return;
        }
        let mut planned = 0u64;
        let mut completed = std::mem::take(&mut self.completed);
        for done in completed.drain(..) {
            // A key also marked dirty is planned with the dirty ones.
            if !self.dirty.is_empty() && self.dirty.contains(&done.key) {
                continue;
            }
            planned += 1;
            // The desired value the operation was planned from is still current if nothing
            // wrote the desired store since.
            let desired = done.planned.filter(|p| p.version == version).map(|p| p.desired);
            self.plan_key(done.key, Known { desired, actual: done.actual, released: done.released }, &pass);
        }
        // Keep the buffer's capacity for the next burst of completions.
        self.completed = completed;
        if !self.dirty.is_empty() {
            let keys = std::mem::take(&mut self.dirty);
            planned += keys.len() as u64;
            for key in keys {
                self.plan_key(key, Known::NOTHING, &pass);
            }
        }
        self.executor.metrics().reconciles.inc_by(planned);
        self.executor.metrics().loop_duration.observe(started.elapsed().as_secs_f64());
    }

    /// Asks the reconciler for a plan for `key` and hands it to the executor. `known` says what
    /// the caller already knows of the key, to save lookups.
    fn plan_key(&mut self, key: R::Key, known: Known<D, A>, pass: &Pass) {
        let desired = match known.desired {
            Some(desired) => desired,
            None => self.desired.get(&key),
        };
        let actual = match known.actual {
            Some(actual) => actual,
            None => self.actual.get(&key),
        };
        let synced = pass.synced;
        if desired.is_none() && actual.is_none() && (known.released || self.executor.release(&key)) {
            if !self.held.is_empty() {
                self.held.remove(&key);
            }
            if !self.last_completion.is_empty() {
                self.last_completion.remove(&key);
            }
            if !self.status.is_empty() {
                self.status_writer.remove(&key);
            }
            self.cancel_recheck(&key);
            return;
        }
        let view = View {
            key: &key,
            desired: desired.as_deref(),
            actual: actual.as_deref(),
            desired_store: &self.desired,
            actual_store: &self.actual,
            desired_synced: synced,
            now: pass.now,
            wall: pass.wall,
            inputs: &self.inputs,
        };
        let plan = self.reconciler.reconcile(&view);
        self.cancel_recheck(&key);
        match plan {
            Plan::Run(op) => {
                if op.is_teardown() && !synced {
                    self.executor.withdraw(&key);
                    self.held.insert(key);
                    return;
                }
                if !self.held.is_empty() {
                    self.held.remove(&key);
                }
                let planned = Planned { desired, version: pass.version };
                self.executor.submit(key, op, Some(planned), true);
            }
            Plan::Idle => {
                if !self.held.is_empty() {
                    self.held.remove(&key);
                }
                if !known.released {
                    self.executor.stop(&key);
                }
            }
            Plan::RecheckAfter(delay) => {
                if !self.held.is_empty() {
                    self.held.remove(&key);
                }
                if !known.released {
                    self.executor.stop(&key);
                }
                let timer = self.rechecks.insert(key.clone(), delay);
                self.recheck_keys.insert(key, timer);
            }
        }
    }

    fn cancel_recheck(&mut self, key: &R::Key) {
        if self.recheck_keys.is_empty() {
            return;
        }
        if let Some(timer) = self.recheck_keys.remove(key) {
            self.rechecks.remove(&timer);
        }
    }

    fn update_gauges(&mut self) {
        self.executor.update_gauges();
        let m = self.executor.metrics_mut();
        m.desired_keys.set(self.desired.len() as i64);
        m.actual_keys.set(self.actual.len() as i64);
    }
}
