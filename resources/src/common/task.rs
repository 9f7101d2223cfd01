//! The long-lived tasks a pair needs running (a populator, a start-up step), handed to its caller as named
//! futures: the libraries of nodelet spawn no long-lived task themselves, the daemon spawns these on its
//! supervisor, which names them, reports a failure or panic and waits for them at shutdown.

use std::future::Future;
use std::pin::Pin;

/// A boxed future a caller spawns.
pub type TaskFuture<T = ()> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How long a [`NamedTask`] is meant to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Until shutdown: ending before it is a failure.
    UntilShutdown,
    /// A bounded job (a start-up step): ending is fine, a panic is a failure.
    Bounded,
}

/// A task for the caller to spawn under `name`.
pub struct NamedTask {
    /// The task's name (`sandbox-populator`, …), as the supervisor reports it.
    pub name: &'static str,
    /// How long it is meant to run.
    pub lifetime: Lifetime,
    /// The task.
    pub future: TaskFuture,
}

impl NamedTask {
    /// `future` under `name` with `lifetime`.
    pub fn new(
        name: &'static str,
        lifetime: Lifetime,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        NamedTask { name, lifetime, future: Box::pin(future) }
    }
}

impl std::fmt::Debug for NamedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedTask")
            .field("name", &self.name)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}
