//! The `Reconciler` trait: a pure, synchronous function from desired and actual state to a plan.

use std::fmt::Debug;
use std::time::Duration;

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
}

/// What a reconciler decides for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan<Op> {
    /// Nothing to do: desired and actual agree (or nothing can be done yet). An operation in
    /// flight on the key is cancelled, since desired state no longer wants it.
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

/// What a reconciler sees of one key: its desired and actual values, plus read access to both
/// whole stores for decisions that involve other keys (a parent's state, say).
#[non_exhaustive]
pub struct View<'a, K, D, A> {
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
}

impl<K: Debug, D: Debug, A: Debug> Debug for View<'_, K, D, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("key", self.key)
            .field("desired", &self.desired)
            .field("actual", &self.actual)
            .field("desired_synced", &self.desired_synced)
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
/// [`View::now`], so they are tested without a runtime. The engine calls
/// [`reconcile`](Reconciler::reconcile) only for keys whose desired or actual value changed (and
/// their ancestors and descendants, see [`Key`]), after each completion on the key, and for every
/// key on the periodic resync.
///
/// Required: [`reconcile`](Reconciler::reconcile) and [`uncertain`](Reconciler::uncertain).
///
/// `D` is the desired value type and `A` the actual value type of the two stores.
pub trait Reconciler<D, A>: Send + Sync + 'static {
    /// The key type shared by both stores and the operations.
    type Key: Key;
    /// The operation type.
    type Op: Operation;

    /// Plans what to do for one key.
    fn reconcile(&self, view: &View<'_, Self::Key, D, A>) -> Plan<Self::Op>;

    /// Records an operation whose result is unknown (it timed out, or the driver reported
    /// [`Outcome::Uncertain`](crate::Outcome::Uncertain)). Whatever the operation may have created
    /// must now be cleaned up or verified: never assume it absent. Typically this returns
    /// `Update::Set` of an "uncertain" actual value that the next `reconcile` turns into a
    /// cleanup or a retry.
    fn uncertain(&self, key: &Self::Key, op: &Self::Op, actual: Option<&A>) -> Update<A>;
}
