//! The runtime interface the sandbox operations use, and the engine driver over it. The CRI
//! implementation lives in `drivers/cri` (networking through the runtime's CNI); the pod module's
//! fake implements it for unit tests.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use reconcile_engine::{CancellationToken, Driver, Outcome, Update};

use super::desired::SandboxSpec;
use super::metrics::SandboxMetrics;
use super::ops::SandboxOp;
use crate::model::actual::PodSandboxes;
use crate::model::pod::PodUid;
use crate::model::runtime::{RuntimeError, RuntimeResult};

/// What the sandbox operations need from a container runtime; implementations label what they
/// create so that [`list_sandboxes`](SandboxRuntime::list_sandboxes) finds it after a restart.
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Creates and starts the pod's sandbox (with its network, hostname, DNS config, port
    /// mappings, log directory and labels); returns the sandbox ID.
    fn run_sandbox(
        &self,
        spec: &SandboxSpec,
        attempt: u32,
    ) -> impl Future<Output = RuntimeResult<String>> + Send;

    /// Stops a sandbox (its network is torn down). Stopping a stopped or missing one succeeds.
    fn stop_sandbox(&self, sandbox_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Removes a stopped sandbox. Removing a missing one succeeds.
    fn remove_sandbox(&self, sandbox_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Every sandbox nodelet manages, grouped by pod UID.
    fn list_sandboxes(&self) -> impl Future<Output = RuntimeResult<HashMap<String, PodSandboxes>>> + Send;

    /// The sandboxes of one pod now (`None` if it has none).
    fn sandboxes_of(&self, uid: &str) -> impl Future<Output = RuntimeResult<Option<PodSandboxes>>> + Send;

    /// Brings the pod-level settings of pods found in the runtime at start-up (`pods`, as
    /// [`list_sandboxes`](SandboxRuntime::list_sandboxes) gave them) to the node's configuration,
    /// which may have changed while nodelet was down (the pod cgroup's `podPidsLimit`). Reports
    /// problems itself; a pod it cannot update keeps running. Default: nothing to do.
    fn adopt(&self, pods: &HashMap<String, PodSandboxes>) -> impl Future<Output = ()> + Send {
        let _ = pods;
        async {}
    }
}

/// Sandbox creations that run at once. Creating a sandbox (network namespace, CNI, pause
/// container) is the runtime's heaviest call; on a small machine dozens at once make each one slow
/// and the whole batch slower than a few at a time. Other operations are not limited by this.
pub const DEFAULT_SANDBOX_CREATIONS_AT_ONCE: usize = 8;

/// The engine driver of the sandbox reconciler.
#[derive(Debug)]
pub struct SandboxDriver<R> {
    runtime: Arc<R>,
    metrics: SandboxMetrics,
    slots: Arc<tokio::sync::Semaphore>,
}

impl<R: SandboxRuntime> SandboxDriver<R> {
    /// A driver over `runtime` that creates at most `slots` sandboxes at once (at least one).
    pub fn new(runtime: Arc<R>, metrics: SandboxMetrics, slots: usize) -> Self {
        Self { runtime, metrics, slots: Arc::new(tokio::sync::Semaphore::new(slots.max(1))) }
    }

    async fn state(&self, uid: &str) -> Outcome<PodSandboxes, RuntimeError> {
        match self.runtime.sandboxes_of(uid).await {
            Ok(Some(state)) => Outcome::Done(Update::Set(state)),
            Ok(None) => Outcome::Done(Update::Remove),
            Err(e) => Outcome::Uncertain(e),
        }
    }

    async fn create(
        &self,
        uid: &str,
        spec: &SandboxSpec,
        attempt: u32,
    ) -> Outcome<PodSandboxes, RuntimeError> {
        let started = tokio::time::Instant::now();
        let created = {
            let _slot = self.slots.acquire().await;
            self.runtime.run_sandbox(spec, attempt).await
        };
        match created {
            Ok(id) => {
                self.metrics.started_pods.inc();
                let outcome = self.state(uid).await;
                let handler = match &outcome {
                    Outcome::Done(Update::Set(s)) => {
                        s.sandboxes.iter().find(|s| s.id == id).map(|s| s.runtime_handler.clone())
                    }
                    _ => None,
                };
                self.metrics
                    .run_duration
                    .with_label_values(&[handler.as_deref().unwrap_or_default()])
                    .observe(started.elapsed().as_secs_f64());
                outcome
            }
            Err(e) => {
                self.metrics.started_pods_errors.inc();
                // The handler the pod asked for is unknown when the creation failed before it was
                // looked up: the label is then empty.
                self.metrics.run_errors.with_label_values(&[""]).inc();
                Outcome::Failed(e)
            }
        }
    }

    async fn stop(&self, uid: &str, ids: &[String], remove: bool) -> Outcome<PodSandboxes, RuntimeError> {
        let mut errors = Vec::new();
        for id in ids {
            if let Err(e) = self.runtime.stop_sandbox(id).await {
                errors.push(e);
            }
        }
        if remove && errors.is_empty() {
            for id in ids {
                if let Err(e) = self.runtime.remove_sandbox(id).await {
                    errors.push(e);
                }
            }
        }
        match errors.into_iter().next() {
            // Something may have been stopped or removed: read the state again before going on.
            Some(e) => Outcome::Uncertain(e),
            None => self.state(uid).await,
        }
    }
}

impl<R: SandboxRuntime> SandboxDriver<R> {
    /// Removes dead sandboxes chosen by container GC; a missing one is fine. Then reads the pod's
    /// sandboxes again.
    async fn prune(&self, uid: &str, ids: &[String]) -> Outcome<PodSandboxes, RuntimeError> {
        let mut removed = 0usize;
        let mut failed = None;
        for id in ids {
            match self.runtime.remove_sandbox(id).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(pod = %uid, id = %id, error = %e, "container GC: cannot remove the sandbox");
                    failed = Some(e);
                }
            }
        }
        if removed > 0 {
            tracing::info!(pod = %uid, sandboxes = removed, "container GC removed dead sandboxes");
        }
        match failed {
            // Some may be gone: the runtime knows.
            Some(e) if removed > 0 => Outcome::Uncertain(e),
            Some(e) => Outcome::Failed(e),
            None => self.state(uid).await,
        }
    }
}

impl<R: SandboxRuntime> Driver<PodUid, SandboxOp, PodSandboxes> for SandboxDriver<R> {
    type Error = RuntimeError;

    async fn execute(
        &self,
        uid: &PodUid,
        op: &SandboxOp,
        _cancel: &CancellationToken,
    ) -> Outcome<PodSandboxes, RuntimeError> {
        match op {
            SandboxOp::Refresh => self.state(uid).await,
            SandboxOp::Create { spec, attempt } => self.create(uid, spec, *attempt).await,
            SandboxOp::Stop { ids } => self.stop(uid, ids, false).await,
            SandboxOp::Remove { ids } => self.stop(uid, ids, true).await,
            SandboxOp::Prune { ids } => self.prune(uid, ids).await,
        }
    }

    async fn reconstruct(&self) -> Result<Vec<(PodUid, PodSandboxes)>, RuntimeError> {
        let pods = self.runtime.list_sandboxes().await?;
        self.runtime.adopt(&pods).await;
        Ok(pods.into_iter().collect())
    }
}
