//! The `Reconciler` trait: a pure, synchronous function from desired and actual state to a plan.

use std::fmt::Debug;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::{Key, Store};

/// An operation a reconciler plans and a [`Driver`](crate::Driver) carries out.
///
/// Operations should be idempotent "ensure" steps (create-if-absent, remove-if-present): the
/// engine re-plans a key after every completion, and an operation whose outcome was
/// [uncertain](crate::Outcome::Uncertain) may be run again.
///
/// Required: [`kind`](Operation::kind). The other methods have defaults.
pub trait Operation: Clone + PartialEq + Debug + Send + Sync + 'static {
    /// A short, stable name of the operation's kind (`"mount"`, `"pull"`): a metric label, a
    /// tracing field, and the unit of backoff (a key's backoff resets when the kind changes).
    fn kind(&self) -> &'static str;

    /// Whether the operation tears something down. Teardown is held until the desired store has
    /// synced once, so that a half-loaded desired state never causes mass deletion; teardown
    /// operations also start before setup operations when slots are scarce. Default: `false`.
    fn is_teardown(&self) -> bool {
        false
    }

    /// A timeout for this operation, overriding the executor's default. Default: `None`.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether a new plan gives up this operation while it runs: `next` is the operation now
    /// planned for the key (different from this one), `None` when the plan is
    /// [`Idle`](Plan::Idle) or [`RecheckAfter`](Plan::RecheckAfter). An operation given up has
    /// its cancellation token fired; one that is not runs to its end, and the key is planned
    /// again from its outcome (a planned operation waits until then). Default: `true`.
    fn given_up_for(&self, next: Option<&Self>) -> bool {
        let _ = next;
        true
    }
}

/// What a reconciler decides for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<Op> {
    /// Nothing to do: desired and actual agree (or nothing can be done yet). An operation in
    /// flight on the key is cancelled, since desired state no longer wants it (unless the
    /// operation says otherwise: [`Operation::given_up_for`]).
    Idle,
    /// Run this operation (now, or as soon as the key is free and out of backoff).
    Run(Op),
    /// Nothing to do now; consider the key again after this delay (for decisions that depend on
    /// time, such as a crash-loop back-off). An operation in flight is cancelled as for `Idle`.
    RecheckAfter(Duration),
}

impl<Op> From<Option<Op>> for Plan<Op> {
    fn from(op: Option<Op>) -> Self {
        op.map_or(Plan::Idle, Plan::Run)
    }
}

/// What a reconciler sees of one key: its desired and actual values, read access to both whole
/// stores for decisions that involve other keys (a parent's state, say), its side inputs (`I`,
/// the reconciler's [`Reconciler::Inputs`]: other pairs' stores) and the time of the pass, both
/// monotonic ([`now`](View::now)) and wall-clock ([`wall`](View::wall)).
///
/// The engine builds one per key. Tests of a reconciler build one with [`View::new`], and give it
/// inputs with [`with_inputs`](View::with_inputs):
///
/// ```
/// use reconcile_engine::{Store, View, store};
///
/// /// The side inputs of a reconciler: here one other pair's store.
/// struct Limits {
///     limits: Store<String, u64>,
/// }
///
/// let (desired, mut dw) = store::<String, u32>();
/// let (actual, _aw) = store::<String, u32>();
/// let (limits, mut lw) = store::<String, u64>();
/// dw.insert("a".into(), 1);
/// lw.insert("a".into(), 10);
/// let inputs = Limits { limits };
/// let key = "a".to_string();
/// let want = desired.get(&key);
/// let view = View::new(&key, want.as_deref(), None, &desired, &actual).with_inputs(&inputs);
/// assert_eq!(view.desired, Some(&1));
/// assert!(!view.desired_synced);
/// let limit = view.inputs.limits.get(&key);
/// assert_eq!(limit.as_deref(), Some(&10));
/// ```
#[non_exhaustive]
pub struct View<'a, K, D, A, I = ()> {
    /// The key being reconciled.
    pub key: &'a K,
    /// Its desired value, if any.
    pub desired: Option<&'a D>,
    /// Its actual value, if any.
    pub actual: Option<&'a A>,
    /// The whole desired store.
    pub desired_store: &'a Store<K, D>,
    /// The whole actual store.
    pub actual_store: &'a Store<K, A>,
    /// Whether the desired store has synced once (teardown is held until it has).
    pub desired_synced: bool,
    /// The time of this reconcile pass (`tokio::time`, so paused in tests).
    pub now: Instant,
    /// The wall-clock time of this reconcile pass, from the engine's [`WallClock`](crate::WallClock)
    /// (the system clock unless the builder was given another,
    /// [`EngineBuilder::wall_clock`](crate::EngineBuilder::wall_clock)). Compare it with wall-clock
    /// timestamps of the world (when a process exited); measure delays with [`now`](View::now).
    pub wall: SystemTime,
    /// The side inputs the engine was built with
    /// ([`EngineBuilder::build_with`](crate::EngineBuilder::build_with)).
    pub inputs: &'a I,
}

impl<'a, K: Key, D: Send + Sync + 'static, A: Send + Sync + 'static> View<'a, K, D, A> {
    /// A view of `key` with its `desired` and `actual` values and both stores; `desired_synced`
    /// as `desired_store` says, `now` the current (tokio) time, `wall` the system clock and no
    /// side inputs. Meant for unit tests of reconcilers; change the rest with the `with_*`
    /// methods.
    pub fn new(
        key: &'a K,
        desired: Option<&'a D>,
        actual: Option<&'a A>,
        desired_store: &'a Store<K, D>,
        actual_store: &'a Store<K, A>,
    ) -> Self {
        Self {
            key,
            desired,
            actual,
            desired_store,
            actual_store,
            desired_synced: desired_store.is_synced(),
            now: Instant::now(),
            wall: SystemTime::now(),
            inputs: &(),
        }
    }
}

impl<'a, K, D, A, I> View<'a, K, D, A, I> {
    /// The same view with the side inputs `inputs` (of the reconciler's
    /// [`Inputs`](Reconciler::Inputs) type).
    #[must_use]
    pub fn with_inputs<I2>(self, inputs: &'a I2) -> View<'a, K, D, A, I2> {
        View {
            key: self.key,
            desired: self.desired,
            actual: self.actual,
            desired_store: self.desired_store,
            actual_store: self.actual_store,
            desired_synced: self.desired_synced,
            now: self.now,
            wall: self.wall,
            inputs,
        }
    }

    /// Sets the time of the pass.
    #[must_use]
    pub fn with_now(mut self, now: Instant) -> Self {
        self.now = now;
        self
    }

    /// Sets the wall-clock time of the pass.
    #[must_use]
    pub fn with_wall(mut self, wall: SystemTime) -> Self {
        self.wall = wall;
        self
    }

    /// Sets whether the desired store counts as synced.
    #[must_use]
    pub fn with_desired_synced(mut self, synced: bool) -> Self {
        self.desired_synced = synced;
        self
    }
}

impl<K: Debug, D: Debug, A: Debug, I> Debug for View<'_, K, D, A, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("key", self.key)
            .field("desired", &self.desired)
            .field("actual", &self.actual)
            .field("desired_synced", &self.desired_synced)
            .field("now", &self.now)
            .field("wall", &self.wall)
            .finish_non_exhaustive()
    }
}

/// How a completed operation changes the actual value of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update<A> {
    /// The key now has this actual value.
    Set(A),
    /// The key no longer exists in the actual world.
    Remove,
    /// The actual value is unchanged.
    Keep,
}

/// Compares desired with actual state for one key and plans at most one operation.
///
/// Implementations are plain synchronous functions of their input: no I/O, no clocks but
/// [`View::now`] and [`View::wall`], no writes to shared state, and nothing read but what the
/// [`View`] shows (its stores and side inputs), so they are tested without a runtime, and on
/// paused time when a decision depends on time. The engine calls
/// [`reconcile`](Reconciler::reconcile) only for keys whose desired or actual value changed (and
/// their ancestors and descendants, see [`Key`]), after each completion on the key, and for every
/// key on the periodic resync; and for the keys a relation maps a change of a watched store to
/// (see [`EngineBuilder::watches`](crate::EngineBuilder::watches)).
/// [`Engine`](crate::Engine#when-a-key-is-planned-again) lists every trigger.
///
/// Required: [`reconcile`](Reconciler::reconcile) and [`uncertain`](Reconciler::uncertain).
///
/// `D` is the desired value type and `A` the actual value type of the two stores.
pub trait Reconciler<D, A>: Send + Sync + 'static {
    /// The key type shared by both stores and the operations.
    type Key: Key;
    /// The operation type.
    type Op: Operation;
    /// The side inputs: what the reconciler reads besides its own two stores, typically a struct
    /// of other pairs' [`Store`]s; `()` for none. The engine is built with a value of it
    /// ([`EngineBuilder::build_with`](crate::EngineBuilder::build_with);
    /// [`build`](crate::EngineBuilder::build) when it is `()`), and every [`View`] shows it as
    /// [`View::inputs`]: an input cannot be left out by mistake, the compiler asks for it. An
    /// input that is optional says so in its type (`Option<Store<..>>`).
    type Inputs: Send + Sync + 'static;

    /// Plans what to do for one key.
    fn reconcile(&self, view: &View<'_, Self::Key, D, A, Self::Inputs>) -> Plan<Self::Op>;

    /// Records an operation whose result is unknown (it timed out, or the driver reported
    /// [`Outcome::Uncertain`](crate::Outcome::Uncertain)). Whatever the operation may have created
    /// must now be cleaned up or verified: never assume it absent. Typically this returns
    /// `Update::Set` of an "uncertain" actual value that the next `reconcile` turns into a
    /// cleanup or a retry.
    fn uncertain(&self, key: &Self::Key, op: &Self::Op, actual: Option<&A>) -> Update<A>;
}
