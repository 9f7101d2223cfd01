//! The narrow runtime interface the pod operations use. The CRI implementation lives in
//! `drivers/cri`; a fake with fault injection backs the unit tests.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

pub use reconcile_engine::CancellationToken;
use reconcile_engine::{Driver, Outcome, Update};

use super::grace::GraceCap;
use super::metrics::PodMetrics;
use super::ops::PodOp;
use crate::model::actual::{ContainerRecord, ContainerState, ListedPod, PodActual, PodSandboxes};
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::runtime::{RuntimeError, RuntimeResult};
use crate::model::volumes::PodVolumes;

/// The shortest grace period a sidecar is stopped with when the app containers used up the pod's
/// (the kubelet's `minimumGracePeriodInSeconds`).
pub const MIN_SIDECAR_GRACE: Duration = Duration::from_secs(2);

/// Whether a container is an init container, an app container or an ephemeral container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// Runs to completion before the app containers, one at a time.
    Init,
    /// A regular container.
    App,
    /// An ephemeral (debug) container (`spec.ephemeralContainers`): started at most once in the
    /// running pod, never restarted; with a `targetContainerName` it joins that container's
    /// process namespace.
    Ephemeral,
}

/// What the pod operations need from a container runtime. Every method is one step the kubelet
/// also takes through CRI; implementations must label what they create so that
/// [`list_pods`](PodRuntime::list_pods) finds it again after a restart. Sandboxes are made and
/// removed through [`SandboxRuntime`](crate::sandbox::driver::SandboxRuntime); the reads here
/// report them too, apart from the containers ([`ListedPod`]: one relist feeds both pairs).
pub trait PodRuntime: Send + Sync + 'static {
    /// Makes sure the container's image is present as its `imagePullPolicy` says, then creates
    /// and starts the container in the sandbox and runs its `postStart` hook; returns the
    /// container ID. The container is labelled and annotated with its restart count, the restart
    /// count its spec first ran at (`backoff_since`, read back as
    /// [`ContainerRecord::backoff_since`]) and its spec hash. Its `volumeMounts` refer to `volumes`, which are set up.
    ///
    /// `cancel` fires when the pod is being terminated (deleted, evicted, …: see
    /// [`PodOp::given_up_for`](reconcile_engine::Operation::given_up_for)), never for a plan
    /// change that keeps the pod: a `postStart` hook still running is then abandoned and the container killed with the
    /// pod's grace period, as when the hook fails (`PostStartHookError`), so that a hook that
    /// never returns cannot hold the pod.
    #[allow(clippy::too_many_arguments)] // the CRI call's inputs, plus the operation's cancellation
    fn start_container(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        backoff_since: u32,
        volumes: &PodVolumes,
        cancel: &CancellationToken,
    ) -> impl Future<Output = RuntimeResult<String>> + Send;

    /// Stops a container: SIGTERM (or its stop signal), then SIGKILL after `grace`. Stopping an
    /// exited or missing container succeeds.
    fn stop_container(
        &self,
        container_id: &str,
        grace: Duration,
    ) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Changes a running container's CPU and memory cgroup settings in place (in-place resize);
    /// fails if the runtime does not report them changed afterwards.
    fn update_container_resources(
        &self,
        container_id: &str,
        resources: &crate::model::cgroup::CgroupResources,
    ) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Removes a container and its log. Removing a missing one succeeds.
    fn remove_container(&self, container_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Everything nodelet manages (containers and sandboxes, apart), grouped by pod UID. A runtime may
    /// hand out the same `Arc`s again for a pod that has not changed since its last listing (the PLEG
    /// relists every second).
    fn list_pods(&self) -> impl Future<Output = RuntimeResult<HashMap<String, ListedPod>>> + Send;

    /// What the runtime has for one pod now (`None` if nothing).
    fn pod_state(&self, uid: &str) -> impl Future<Output = RuntimeResult<Option<ListedPod>>> + Send;

    /// The UID of the pod that the container or sandbox `id` belongs to, when it is one that nodelet
    /// manages (on this node); `None` when it is another's, or no longer exists. For the PLEG to place
    /// a runtime event about an object that no store has recorded yet.
    fn pod_of(&self, id: &str) -> impl Future<Output = RuntimeResult<Option<String>>> + Send;

    /// Removes what the pod left outside the runtime (its log directory) once it is gone.
    /// Default: nothing to remove.
    fn remove_pod_leftovers(
        &self,
        _namespace: &str,
        _name: &str,
        _uid: &str,
    ) -> impl Future<Output = RuntimeResult<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// The hash nodelet records on each container, to notice a changed container spec: 64-bit
/// FNV-1a of the container's JSON, stable across nodelet versions and restarts.
pub fn container_hash(container: &Container) -> String {
    let json = serde_json::to_vec(container).unwrap_or_default();
    let hash = json
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// The engine driver of the pod reconciler: carries out [`PodOp`]s through a [`PodRuntime`] and
/// reports the pod's state as the runtime has it afterwards.
#[derive(Debug)]
pub struct PodDriver<R> {
    runtime: Arc<R>,
    metrics: PodMetrics,
    /// Pods whose start was observed (for `kubelet_pod_start_duration_seconds`, once per pod).
    started: Arc<std::sync::Mutex<std::collections::HashSet<PodUid>>>,
    /// Pods the driver has synced (for the `create`/`update` label of `kubelet_pod_worker_duration_seconds`).
    synced: Arc<std::sync::Mutex<std::collections::HashSet<PodUid>>>,
    /// The node's bound on the grace period of every kill.
    grace_cap: GraceCap,
}

impl<R: PodRuntime> PodDriver<R> {
    /// A driver over `runtime`, counting started containers in `metrics`.
    pub fn new(runtime: Arc<R>, metrics: PodMetrics) -> Self {
        Self { runtime, metrics, started: Arc::default(), synced: Arc::default(), grace_cap: GraceCap::NONE }
    }

    /// Kills (of containers and of pods) get at most `cap` as their grace period, whatever the
    /// pod, the deletion or the eviction asked for.
    #[must_use]
    pub fn with_grace_cap(mut self, cap: GraceCap) -> Self {
        self.grace_cap = cap;
        self
    }

    /// The runtime.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    fn started(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<PodUid>> {
        self.started.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn synced(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<PodUid>> {
        self.synced.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Observes the pod's start duration, from the creation of its first sandbox (among `sandboxes`,
    /// those the read of `outcome` saw), when all its app containers first run (each in its first
    /// attempt).
    fn observe_started(
        &self,
        uid: &str,
        pod: &DesiredPod,
        outcome: &Outcome<PodActual, RuntimeError>,
        sandboxes: Option<&PodSandboxes>,
    ) {
        let Outcome::Done(Update::Set(state)) = outcome else { return };
        let first_run = pod.containers().iter().all(|spec| {
            state
                .container(&spec.name)
                .is_some_and(|c| c.state == ContainerState::Running && c.restart_count == 0)
        });
        let Some(sandbox) = sandboxes.and_then(|s| s.sandboxes.iter().find(|s| s.attempt == 0)) else {
            return;
        };
        if !first_run || !self.started().insert(uid.to_owned()) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let nanos = u64::try_from(now.saturating_sub(sandbox.created_at)).unwrap_or(0);
        self.metrics.pod_start_duration.observe(Duration::from_nanos(nanos).as_secs_f64());
    }

    /// The pod's containers as the runtime has them now, and its sandboxes as the same read saw them.
    async fn read(&self, uid: &str) -> (Outcome<PodActual, RuntimeError>, Option<Arc<PodSandboxes>>) {
        match self.runtime.pod_state(uid).await {
            Ok(Some(listed)) => {
                (Outcome::Done(Update::Set(Arc::unwrap_or_clone(listed.pod))), listed.sandboxes)
            }
            Ok(None) => (Outcome::Done(Update::Remove), None),
            Err(e) => (Outcome::Uncertain(e), None),
        }
    }

    async fn state(&self, uid: &str) -> Outcome<PodActual, RuntimeError> {
        self.read(uid).await.0
    }

    /// Runs a [`PodOp::StartContainer`], and observes the pod's start duration from its state afterwards.
    async fn start(
        &self,
        uid: &str,
        op: &PodOp,
        cancel: &CancellationToken,
    ) -> Outcome<PodActual, RuntimeError> {
        let (outcome, sandboxes) = self.start_read(uid, op, cancel).await;
        if let PodOp::StartContainer { pod, .. } = op {
            self.observe_started(uid, pod, &outcome, sandboxes.as_deref());
        }
        outcome
    }

    /// Runs a [`PodOp::StartContainer`]; returns its outcome and the pod's sandboxes as the read of
    /// that outcome saw them.
    async fn start_read(
        &self,
        uid: &str,
        op: &PodOp,
        cancel: &CancellationToken,
    ) -> (Outcome<PodActual, RuntimeError>, Option<Arc<PodSandboxes>>) {
        let PodOp::StartContainer { pod, sandbox_id, name, kind, restart_count, backoff_since, volumes } = op
        else {
            let e = RuntimeError::new("CreateContainerError", format!("not a container start: {op:?}"));
            return (Outcome::Failed(e), None);
        };
        let (kind, restart_count, backoff_since, name) =
            (*kind, *restart_count, *backoff_since, name.as_str());
        let ephemeral;
        let containers = match kind {
            ContainerKind::Init => pod.init_containers(),
            ContainerKind::App => pod.containers(),
            ContainerKind::Ephemeral => {
                ephemeral = pod.ephemeral_containers();
                ephemeral.as_slice()
            }
        };
        let Some(container) = containers.iter().find(|c| c.name == name) else {
            let e = RuntimeError::new(
                "CreateContainerConfigError",
                format!("container {name:?} is not in the pod spec"),
            );
            return (Outcome::Failed(e), None);
        };
        let container_type = super::metrics::container_type(kind);
        self.metrics.started_containers.with_label_values(&[container_type]).inc();
        if let Err(e) = self
            .runtime
            .start_container(pod, sandbox_id, container, kind, restart_count, backoff_since, volumes, cancel)
            .await
        {
            self.metrics.started_containers_errors.with_label_values(&[container_type, e.reason]).inc();
            return (Outcome::Failed(e), None);
        }
        let (outcome, sandboxes) = self.read(uid).await;
        // Keep only the newest exited attempt besides the new one (for `lastState` and
        // `--previous` logs); older attempts are removed with their logs.
        if let Outcome::Done(Update::Set(state)) = &outcome {
            let stale: Vec<&ContainerRecord> = state
                .containers
                .iter()
                .filter(|c| c.name == name && c.restart_count.saturating_add(1) < restart_count)
                .collect();
            for c in stale {
                if let Err(e) = self.runtime.remove_container(&c.id).await {
                    tracing::warn!(pod = uid, container = name, id = %c.id, error = %e, "could not remove an old attempt");
                }
            }
            if state
                .containers
                .iter()
                .any(|c| c.name == name && c.restart_count.saturating_add(1) < restart_count)
            {
                return self.read(uid).await;
            }
        }
        (outcome, sandboxes)
    }

    /// Stops the pod's containers that still run: the app (and init) containers together with
    /// `grace`, then the sidecars one at a time, the last one first, each with what is left of
    /// `grace` but at least [`MIN_SIDECAR_GRACE`] (as the kubelet stops sidecars).
    async fn stop_in_order(&self, state: &PodActual, grace: Duration) -> Vec<RuntimeError> {
        let started = tokio::time::Instant::now();
        let (mut sidecars, others): (Vec<&ContainerRecord>, Vec<&ContainerRecord>) = state
            .containers
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
            .partition(|c| c.sidecar.is_some());
        let stops = others.iter().map(|c| self.runtime.stop_container(&c.id, grace));
        let mut errors: Vec<RuntimeError> =
            futures::future::join_all(stops).await.into_iter().filter_map(Result::err).collect();
        sidecars.sort_by_key(|c| std::cmp::Reverse(c.sidecar));
        for sidecar in sidecars {
            let left = grace.saturating_sub(started.elapsed()).max(MIN_SIDECAR_GRACE);
            if let Err(e) = self.runtime.stop_container(&sidecar.id, left).await {
                errors.push(e);
            }
        }
        errors
    }

    async fn kill(&self, uid: &str, grace: Duration, remove: bool) -> Outcome<PodActual, RuntimeError> {
        let state = match self.runtime.pod_state(uid).await {
            Ok(Some(listed)) => listed.pod,
            Ok(None) => return Outcome::Done(Update::Remove),
            Err(e) => return Outcome::Failed(e),
        };
        let mut errors = self.stop_in_order(&state, grace).await;
        if remove && errors.is_empty() {
            for c in &state.containers {
                if let Err(e) = self.runtime.remove_container(&c.id).await {
                    errors.push(e);
                }
            }
        }
        if remove
            && errors.is_empty()
            && let Err(e) = self.runtime.remove_pod_leftovers(&state.namespace, &state.name, uid).await
        {
            tracing::warn!(pod = uid, error = %e, "could not remove the pod's logs");
        }
        match errors.into_iter().next() {
            // Something may have been stopped or removed: read the state again before going on.
            Some(e) => Outcome::Uncertain(e),
            // What is left is the sandboxes, until the sandbox pair removes them.
            None => self.state(uid).await,
        }
    }
}

impl<R: PodRuntime> Driver<PodUid, PodOp, PodActual> for PodDriver<R> {
    type Error = RuntimeError;

    async fn execute(
        &self,
        uid: &PodUid,
        op: &PodOp,
        cancel: &CancellationToken,
    ) -> Outcome<PodActual, RuntimeError> {
        let started = tokio::time::Instant::now();
        let kind = match op {
            // The kubelet's pod worker syncs a pod it has not seen before as `create` (SyncPodCreate),
            // later ones as `update`.
            PodOp::StartContainer { .. } | PodOp::KillContainers { .. } | PodOp::ResizeContainer { .. } => {
                Some(if self.synced().insert(uid.clone()) { "create" } else { "update" })
            }
            PodOp::KillPod { .. } => Some("kill"),
            PodOp::Refresh => Some("sync"),
            // Container GC is no pod worker step in the kubelet.
            PodOp::PruneContainers { .. } => None,
        };
        let outcome = self.execute_op(uid, op, cancel).await;
        if let Some(kind) = kind {
            self.metrics
                .pod_worker_duration
                .with_label_values(&[kind])
                .observe(started.elapsed().as_secs_f64());
        }
        if let PodOp::KillPod { remove: true, .. } = op {
            self.started().remove(uid);
            self.synced().remove(uid);
        }
        outcome
    }

    async fn reconstruct(&self) -> Result<Vec<(PodUid, PodActual)>, RuntimeError> {
        Ok(self
            .runtime
            .list_pods()
            .await?
            .into_iter()
            .map(|(uid, listed)| (uid, Arc::unwrap_or_clone(listed.pod)))
            .collect())
    }
}

impl<R: PodRuntime> PodDriver<R> {
    async fn execute_op(
        &self,
        uid: &PodUid,
        op: &PodOp,
        cancel: &CancellationToken,
    ) -> Outcome<PodActual, RuntimeError> {
        match op {
            PodOp::Refresh => self.state(uid).await,
            PodOp::StartContainer { .. } => self.start(uid, op, cancel).await,
            PodOp::KillContainers { ids, grace } => {
                let grace = self.grace_cap.apply(*grace);
                let stops = ids.iter().map(|id| self.runtime.stop_container(id, grace));
                let errors: Vec<RuntimeError> =
                    futures::future::join_all(stops).await.into_iter().filter_map(Result::err).collect();
                match errors.into_iter().next() {
                    Some(e) => Outcome::Uncertain(e),
                    None => self.state(uid).await,
                }
            }
            PodOp::KillPod { grace, remove } => self.kill(uid, self.grace_cap.apply(*grace), *remove).await,
            PodOp::ResizeContainer { id, resources } => {
                match self.runtime.update_container_resources(id, resources).await {
                    Ok(()) => self.state(uid).await,
                    Err(e) => Outcome::Failed(e),
                }
            }
            PodOp::PruneContainers { ids } => self.prune(uid, ids).await,
        }
    }

    /// Removes dead containers (with their logs) chosen by container GC; a missing one is fine.
    /// Then reads the pod's state again. (Dead sandboxes are pruned by the sandbox pair.)
    async fn prune(&self, uid: &str, ids: &[String]) -> Outcome<PodActual, RuntimeError> {
        let mut removed = 0usize;
        let mut failed = None;
        for id in ids {
            match self.runtime.remove_container(id).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(pod = %uid, id = %id, error = %e, "container GC: cannot remove");
                    failed = Some(e);
                }
            }
        }
        if removed > 0 {
            tracing::info!(pod = %uid, containers = removed, "container GC removed dead containers");
        }
        match failed {
            // Some may be gone: the runtime knows.
            Some(e) if removed > 0 => Outcome::Uncertain(e),
            Some(e) => Outcome::Failed(e),
            None => self.state(uid).await,
        }
    }
}
