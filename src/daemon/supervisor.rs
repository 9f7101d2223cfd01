//! Supervised tasks: every task the daemon spawns has a name and a policy saying what happens when it ends
//! before shutdown.
//!
//! - [`Policy::Critical`]: the task must run until shutdown (an engine, a PLEG, a populator, a source, a
//!   server). If it returns or panics before, the daemon stops with [`TaskFailure`] naming it.
//! - [`Supervisor::spawn_restartable`]: a worker that can be made again from clones of its inputs (the runtime
//!   health check, the runtime event forwarder, log rotation, stats housekeeping, the wake-up forwarders).
//!   If it returns or panics before shutdown it is restarted after a back-off (1 s doubling to 60 s, reset
//!   after it ran for 60 s), counted in `nodelet_task_restarts_total{task}`.
//! - [`Policy::MayFinish`]: returning is fine (a task with a bounded job); a panic stops the daemon.
//!
//! Nothing ends silently: each end is logged, and [`Supervisor::failed`] resolves with the first failure.
//!
//! Every long-lived task of the node runs here, or on a task that runs here and owns it (the prober's workers,
//! the pod-data object watches: a `JoinSet` whose panics it re-raises). The libraries spawn none: they hand
//! their tasks to the daemon as futures (`nodelet_resources::common::task::NamedTask`, the CSI registry's
//! `watcher`, the runtime's `RuntimeEventFeed`, the embedded containerd's `ContainerdSupervision`, which runs
//! on a second supervisor that outlives the node's: `daemon::topology::run`). A bare `tokio::spawn` is left
//! only for per-connection or per-request work, each listed with its reason in the test `daemon::bare_spawns`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the supervisor does when a task ends before shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Returning or panicking before shutdown stops the daemon.
    Critical,
    /// Returning is fine; a panic stops the daemon.
    MayFinish,
}

/// A task that ended when it should not have: the reason the daemon stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task {task:?} {how}")]
pub struct TaskFailure {
    /// The task's name.
    pub task: String,
    /// What happened (`returned before shutdown`, `panicked: …`).
    pub how: String,
}

/// The first back-off before a restart.
const RESTART_INITIAL: Duration = Duration::from_secs(1);
/// The longest back-off before a restart.
const RESTART_MAX: Duration = Duration::from_secs(60);
/// A task that ran this long before ending starts its back-off again from [`RESTART_INITIAL`].
const RESTART_RESET_AFTER: Duration = Duration::from_secs(60);

/// `nodelet_task_restarts_total`, by task: what a [`Supervisor`] counts its restarts in.
#[derive(Debug, Clone)]
pub struct TaskRestarts(IntCounterVec);

impl TaskRestarts {
    /// The counter, registered in `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let restarts = IntCounterVec::new(
            Opts::new(
                "nodelet_task_restarts_total",
                "Restarts of a supervised nodelet task after it ended or panicked before shutdown",
            ),
            &["task"],
        )?;
        registry.register(Box::new(restarts.clone()))?;
        Ok(TaskRestarts(restarts))
    }
}

/// Spawns named tasks and watches them; cheap to clone (all clones share the tasks).
#[derive(Debug, Clone)]
pub struct Supervisor {
    shutdown: CancellationToken,
    tracker: TaskTracker,
    failure: Arc<watch::Sender<Option<TaskFailure>>>,
    restarts: IntCounterVec,
    names: Arc<Mutex<Vec<String>>>,
}

impl Supervisor {
    /// A supervisor whose tasks stop with `shutdown`; registers `nodelet_task_restarts_total` in `registry`.
    pub fn new(shutdown: CancellationToken, registry: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self::with_restarts(shutdown, TaskRestarts::new(registry)?))
    }

    /// A supervisor whose tasks stop with `shutdown`, counting its restarts in `restarts`.
    pub fn with_restarts(shutdown: CancellationToken, restarts: TaskRestarts) -> Self {
        Supervisor {
            shutdown,
            tracker: TaskTracker::new(),
            failure: Arc::new(watch::channel(None).0),
            restarts: restarts.0,
            names: Arc::default(),
        }
    }

    /// The token cancelled at shutdown.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The names of the tasks spawned so far, in order.
    pub fn task_names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Spawns `task` under `name` with `policy`.
    pub fn spawn<F>(&self, name: impl Into<String>, policy: Policy, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // A bare spawn: the supervisor's own, watched at once.
        self.watch(name, policy, tokio::spawn(task));
    }

    /// Supervises a task spawned elsewhere (its [`JoinHandle`](tokio::task::JoinHandle)) under `name` with
    /// `policy`.
    pub fn watch<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        policy: Policy,
        handle: tokio::task::JoinHandle<T>,
    ) {
        let name = self.register(name.into());
        let this = self.clone();
        self.tracker.spawn(async move {
            let result = handle.await;
            let stopping = this.shutdown.is_cancelled();
            match (result.map(drop), policy) {
                (Ok(()), _) if stopping => tracing::debug!(task = %name, "task stopped"),
                (Ok(()), Policy::MayFinish) => tracing::debug!(task = %name, "task finished"),
                (Ok(()), Policy::Critical) => this.fail(name, "returned before shutdown".to_owned()),
                (Err(e), _) => this.fail(name, ended_how(e)),
            }
        });
    }

    /// Spawns the task `make()` under `name`, and makes and starts it again after a back-off each time it
    /// returns or panics before shutdown.
    pub fn spawn_restartable<M, F>(&self, name: impl Into<String>, mut make: M)
    where
        M: FnMut() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let name = self.register(name.into());
        let this = self.clone();
        let restarts = self.restarts.with_label_values(&[name.as_str()]);
        self.tracker.spawn(async move {
            let mut delay = RESTART_INITIAL;
            loop {
                let started = tokio::time::Instant::now();
                // A bare spawn: the supervisor's own, awaited here.
                let result = tokio::spawn(make()).await;
                if this.shutdown.is_cancelled() {
                    tracing::debug!(task = %name, "task stopped");
                    return;
                }
                let how = match result {
                    Ok(()) => "returned before shutdown".to_owned(),
                    Err(e) => ended_how(e),
                };
                if started.elapsed() >= RESTART_RESET_AFTER {
                    delay = RESTART_INITIAL;
                }
                tracing::error!(task = %name, how = %how, retry_in = ?delay, "task ended; restarting it");
                tokio::select! {
                    () = this.shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                restarts.inc();
                delay = (delay * 2).min(RESTART_MAX);
            }
        });
    }

    /// Supervises the tasks of `set` (spawned by a module that takes a `JoinSet`) as the group `name` with
    /// [`Policy::MayFinish`]: a task of it that panics stops the daemon, naming the group.
    pub fn adopt(&self, name: impl Into<String>, mut set: tokio::task::JoinSet<()>) {
        let name = self.register(name.into());
        let this = self.clone();
        self.tracker.spawn(async move {
            while let Some(result) = set.join_next().await {
                match result {
                    Ok(()) => tracing::debug!(group = %name, "task finished"),
                    Err(e) if e.is_cancelled() && this.shutdown.is_cancelled() => {}
                    Err(e) => this.fail(format!("{name} (one of its tasks)"), ended_how(e)),
                }
            }
        });
    }

    /// Resolves with the first task that failed (see [`Policy`]); pending while none has.
    pub async fn failed(&self) -> TaskFailure {
        let mut rx = self.failure.subscribe();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// After shutdown: waits until every task has ended.
    pub async fn join(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    fn register(&self, name: String) -> String {
        self.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(name.clone());
        name
    }

    fn fail(&self, task: String, how: String) {
        tracing::error!(task = %task, how = %how, "a supervised task failed; stopping nodelet");
        let failure = TaskFailure { task, how };
        self.failure.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(failure);
                true
            } else {
                false
            }
        });
    }
}

/// The message of a panic's payload (`nodelet-shared`, where the servers and the sources read it too).
pub use nodelet_shared::panic_message;

/// Spawns a library's tasks ([`NamedTask`](nodelet_resources::common::task::NamedTask)s) on `sup`: one
/// that runs until shutdown is [`Policy::Critical`], a bounded one [`Policy::MayFinish`].
pub(crate) fn spawn_tasks(sup: &Supervisor, tasks: Vec<nodelet_resources::common::task::NamedTask>) {
    use nodelet_resources::common::task::Lifetime;
    for task in tasks {
        let policy = match task.lifetime {
            Lifetime::UntilShutdown => Policy::Critical,
            Lifetime::Bounded => Policy::MayFinish,
        };
        sup.spawn(task.name, policy, task.future);
    }
}

/// `panicked: <message>` or `was cancelled`.
fn ended_how(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
        Err(_) => "was cancelled".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervisor() -> (Supervisor, Registry) {
        let registry = Registry::new();
        let sup = Supervisor::new(CancellationToken::new(), &registry).unwrap_or_else(|e| panic!("{e}"));
        (sup, registry)
    }

    #[tokio::test]
    async fn a_critical_task_that_panics_should_fail_the_daemon_naming_it() {
        let (sup, _) = supervisor();
        sup.spawn("steady", Policy::Critical, std::future::pending());
        sup.spawn("doomed", Policy::Critical, async { panic!("boom") });
        let failure = tokio::time::timeout(Duration::from_secs(5), sup.failed()).await;
        assert_eq!(failure, Ok(TaskFailure { task: "doomed".into(), how: "panicked: boom".into() }),);
        sup.shutdown().cancel();
    }

    #[tokio::test]
    async fn a_critical_task_that_returns_before_shutdown_should_fail_but_not_after() {
        let (sup, _) = supervisor();
        sup.spawn("early", Policy::Critical, async {});
        let failure = tokio::time::timeout(Duration::from_secs(5), sup.failed()).await;
        assert_eq!(failure.map(|f| (f.task, f.how)), Ok(("early".into(), "returned before shutdown".into())));

        let (sup, _) = supervisor();
        let stop = sup.shutdown().clone();
        sup.spawn("worker", Policy::Critical, async move { stop.cancelled().await });
        sup.spawn("finisher", Policy::MayFinish, async {});
        sup.shutdown().cancel();
        tokio::time::timeout(Duration::from_secs(5), sup.join()).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(tokio::time::timeout(Duration::from_millis(50), sup.failed()).await.is_err());
    }

    #[tokio::test]
    async fn a_may_finish_task_that_panics_should_fail_the_daemon() {
        let (sup, _) = supervisor();
        sup.spawn("bounded", Policy::MayFinish, async { panic!("bad input") });
        let failure = tokio::time::timeout(Duration::from_secs(5), sup.failed()).await;
        assert_eq!(failure.map(|f| f.how), Ok("panicked: bad input".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restartable_task_that_panics_should_be_restarted_with_back_off_and_counted() {
        let (sup, registry) = supervisor();
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (counter, stop) = (runs.clone(), sup.shutdown().clone());
        sup.spawn_restartable("flaky", move || {
            let (counter, stop) = (counter.clone(), stop.clone());
            async move {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n < 2 {
                    panic!("run {n} fails");
                }
                stop.cancelled().await;
            }
        });
        // Back-offs of 1 s and 2 s: the third run starts after 3 s.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains("nodelet_task_restarts_total{task=\"flaky\"} 2"), "{text}");
        assert!(tokio::time::timeout(Duration::from_millis(10), sup.failed()).await.is_err());
        sup.shutdown().cancel();
        sup.join().await;
    }
}
