//! The `Driver` trait: the only code that touches the outside world.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::{Key, Operation, Update};

/// The result of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<A, E> {
    /// The operation succeeded; the actual value changes as given. Resets the key's backoff.
    Done(Update<A>),
    /// The operation failed and changed nothing. The actual value is kept and the key backs off;
    /// if the operation's cancellation token had fired, it counts as
    /// [`OpResult::Cancelled`](crate::OpResult::Cancelled) instead, and the key does not back off.
    Failed(E),
    /// The result is unknown (the driver lost track, a call timed out). The reconciler's
    /// [`uncertain`](crate::Reconciler::uncertain) records it and the key backs off.
    Uncertain(E),
}

/// Carries out operations against the outside world, and reports what exists at start-up.
///
/// Required: [`execute`](Driver::execute). [`reconstruct`](Driver::reconstruct) defaults to
/// reporting nothing.
///
/// `execute` may be called concurrently for unrelated keys, never for two conflicting keys (see
/// [`Key`]). The `cancel` token fires when desired state no longer wants the operation; a driver
/// should then stop as soon as it safely can and return [`Outcome::Failed`] (nothing happened)
/// or [`Outcome::Uncertain`] (something may have happened). The executor also enforces a timeout
/// per operation: a timed-out operation is dropped and recorded as uncertain.
pub trait Driver<K: Key, Op: Operation, A: Send + 'static>: Send + Sync + 'static {
    /// The driver's error type.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs one operation for `key`.
    fn execute(
        &self,
        key: &K,
        op: &Op,
        cancel: &CancellationToken,
    ) -> impl Future<Output = Outcome<A, Self::Error>> + Send;

    /// Reports what already exists, so the engine can fill the actual store before it plans
    /// anything (no duplicate creation, no leaked objects after a restart). Default: nothing.
    fn reconstruct(&self) -> impl Future<Output = Result<Vec<(K, A)>, Self::Error>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
}
