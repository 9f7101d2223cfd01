//! The sandbox pair assembled: its engine (with its declared relations on the volume actual store
//! and the verdict store), its populator, and the wake-up that stands in for its relation on the
//! pod actual store (made after this pair). The pod pair declares its own relation on this pair's
//! actual store ([`pod_of_sandboxes`](super::status::pod_of_sandboxes)).

use std::sync::Arc;

use reconcile_engine::{
    BackoffConfig, CancellationToken, Engine, Metrics, Observer, Store, Waker, Writer, store,
};

use super::actual::PodSandboxes;
use super::desired::SandboxSpec;
use super::driver::{DEFAULT_SANDBOX_CREATIONS_AT_ONCE, SandboxDriver, SandboxRuntime};
use super::metrics::SandboxMetrics;
use super::populator::SandboxPopulator;
use super::reconciler::{PodActualSlot, SandboxReconciler};
use super::status::SandboxView;
use crate::eviction::verdict::Verdict;
use crate::pod::actual::PodActual;
use crate::pod::desired::{DesiredPod, PodUid};
use crate::volume::actual::VolumeActual;
use crate::volume::desired::VolumeKey;

/// The sandbox pair, built before the pod pair (whose reconciler reads [`SandboxPair::view`]) and
/// started once the pod engine exists ([`SandboxPair::start`]).
pub struct SandboxPair<R: SandboxRuntime> {
    engine: Engine<SandboxSpec, PodSandboxes, SandboxReconciler, SandboxDriver<R>>,
    desired: Store<PodUid, SandboxSpec>,
    writer: Writer<PodUid, SandboxSpec>,
    pods: PodActualSlot,
}

impl<R: SandboxRuntime> std::fmt::Debug for SandboxPair<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxPair").field("engine", &self.engine).finish_non_exhaustive()
    }
}

/// How the sandbox pair is built.
#[derive(Debug, Clone, Default)]
pub struct SandboxPairConfig {
    /// The engine's back-off of failed operations (the kubelet retries a failed sandbox at the pod
    /// worker's back-off).
    pub backoff: BackoffConfig,
    /// The engine's periodic resync.
    pub resync_period: Option<std::time::Duration>,
    /// Sandbox creations that run at once (`None`: [`DEFAULT_SANDBOX_CREATIONS_AT_ONCE`]).
    pub creations_at_once: Option<usize>,
    /// The node's verdicts (read-only; written by the verdict populator): a sandbox only for an
    /// admitted pod. `None`: every pod counts as admitted.
    pub verdicts: Option<Store<PodUid, Verdict>>,
    /// The volume actual store, watched so that a pod waiting for its volumes (the reconciler's
    /// [`VolumeGate`](crate::volume::status::VolumeGate)) is planned again when they change.
    pub volumes: Option<Store<VolumeKey, VolumeActual>>,
}

impl<R: SandboxRuntime> SandboxPair<R> {
    /// Builds the pair over `runtime`. `reconciler` adds the volume gate to the reconciler it is
    /// given; the verdicts and the watched volume store come from `config`.
    pub fn new(
        runtime: Arc<R>,
        reconciler: impl FnOnce(SandboxReconciler) -> SandboxReconciler,
        metrics: SandboxMetrics,
        engine_metrics: Option<&Metrics>,
        config: SandboxPairConfig,
    ) -> Self {
        let pods = PodActualSlot::default();
        let (desired, writer) = store();
        let slots = config.creations_at_once.unwrap_or(DEFAULT_SANDBOX_CREATIONS_AT_ONCE);
        let mut sandboxes = reconciler(SandboxReconciler::new(pods.clone()));
        if let Some(verdicts) = &config.verdicts {
            sandboxes = sandboxes.with_verdicts(verdicts.clone());
        }
        let mut builder = Engine::builder(
            "sandboxes",
            sandboxes,
            Arc::new(SandboxDriver::new(runtime, metrics, slots)),
            desired.clone(),
        )
        .backoff(config.backoff);
        if let Some(verdicts) = config.verdicts {
            // A pod's verdict came or changed: plan its sandbox again.
            builder =
                builder.watches("verdicts", verdicts, |uid: &PodUid, _: Option<&Verdict>| Some(uid.clone()));
        }
        if let Some(volumes) = config.volumes {
            // A pod's volumes changed: plan its sandbox again (it waits for them).
            builder = builder.watches("volumes", volumes, crate::volume::reconciler::pod_of_volume);
        }
        if let Some(metrics) = engine_metrics {
            builder = builder.metrics(metrics);
        }
        if let Some(period) = config.resync_period {
            builder = builder.resync_period(period);
        }
        Self { engine: builder.build(), desired, writer, pods }
    }

    /// What the pod pair reads of this pair.
    pub fn view(&self) -> SandboxView {
        SandboxView::new(self.engine.actual(), Some(self.engine.op_status()))
    }

    /// The actual store.
    pub fn actual(&self) -> Store<PodUid, PodSandboxes> {
        self.engine.actual()
    }

    /// The desired store.
    pub fn desired(&self) -> Store<PodUid, SandboxSpec> {
        self.desired.clone()
    }

    /// An observer of the actual store (for the PLEG's relist).
    pub fn observer(&mut self) -> Observer<PodUid, PodSandboxes> {
        self.engine.observer()
    }

    /// A waker of this pair's keys.
    pub fn waker(&self) -> Waker<PodUid> {
        self.engine.waker()
    }

    /// Runs the pair until `shutdown`: the populator from the desired pods `pods`, the engine reading
    /// the pod actual store `pod_actual` (woken by its changes), and the wake-up of every pod
    /// (`pod_waker`) once this pair has reconstructed its store. Returns the engine's task. The pod
    /// engine declares its relation on [`actual`](Self::actual) itself.
    pub fn start(
        self,
        pods: Store<PodUid, DesiredPod>,
        pod_actual: Store<PodUid, PodActual>,
        pod_waker: Waker<PodUid>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<reconcile_engine::RunReport> {
        let _ = self.pods.set(pod_actual.clone());
        let actual = self.engine.actual();
        let waker = self.engine.waker();
        // relation: the sandbox pair watches the pod actual store, key = the pod UID.
        tokio::spawn(wake_on_changes(pod_actual.clone(), waker.clone(), shutdown.clone()));
        // The pod pair plans nothing before this pair has reconstructed its store: then every pod.
        let (sandboxes, desired_pods, stop) = (actual.clone(), pods.clone(), shutdown.clone());
        let pod_store = pod_actual.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                r = sandboxes.wait_until_synced() => if r.is_ok() {
                    for key in desired_pods.keys().into_iter().chain(pod_store.keys()) {
                        pod_waker.wake(key);
                    }
                },
            }
        });
        // Until the desired sandboxes sync (every pod source has reported) the reconciler only
        // creates sandboxes: plan every pod again once they have.
        let (desired, stop) = (self.desired.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                r = desired.wait_until_synced() => if r.is_ok() {
                    for key in actual.keys().into_iter().chain(desired.keys()) {
                        waker.wake(key);
                    }
                },
            }
        });
        tokio::spawn(SandboxPopulator::new(pods, pod_actual, self.writer).run(shutdown.clone()));
        let engine = self.engine;
        tokio::spawn(async move { engine.run(shutdown.cancelled_owned()).await })
    }
}

/// Wakes `waker`'s key for every key of `store` that changes, until `shutdown`.
pub async fn wake_on_changes<A: Send + Sync + 'static>(
    store: Store<PodUid, A>,
    waker: Waker<PodUid>,
    shutdown: CancellationToken,
) {
    let sub = store.subscribe();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = sub.changed() => {}
        }
        for key in sub.drain() {
            if !waker.wake(key) {
                return;
            }
        }
    }
}
