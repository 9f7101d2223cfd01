//! The sandbox pair assembled: its engine, with its declared relations on the pod actual store (read
//! before the pod engine is built, [`EngineBuilder::actual`](reconcile_engine::EngineBuilder::actual)),
//! the volume actual store and the verdict store, and its populator. The pod pair declares its own
//! relation on this pair's actual store ([`pod_of_sandboxes`](super::status::pod_of_sandboxes)),
//! waits for it to be reconstructed before it plans
//! ([`EngineBuilder::waits_for`](reconcile_engine::EngineBuilder::waits_for)), and reads it and its
//! operation status ([`SandboxPair::op_status`]) as side inputs.

use std::sync::Arc;

use reconcile_engine::{BackoffConfig, CancellationToken, Engine, Metrics, Observer, Store, Writer, store};

use super::desired::SandboxSpec;
use super::driver::{DEFAULT_SANDBOX_CREATIONS_AT_ONCE, SandboxDriver, SandboxRuntime};
use super::metrics::SandboxMetrics;
use super::populator::SandboxPopulator;
use super::reconciler::{SandboxInputs, SandboxReconciler};
use super::status::{SandboxOpStatus, SandboxView};
use crate::common::task::{Lifetime, NamedTask, TaskFuture};
use crate::model::actual::PodActual;
use crate::model::actual::PodSandboxes;
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::verdict::Verdict;
use crate::volume::actual::VolumeActual;
use crate::volume::desired::{DesiredVolume, VolumeKey};
use crate::volume::status::VolumeGate;

/// The sandbox pair, built between the pod engine's builder (whose actual store it watches) and the
/// pod engine (which watches this pair's actual store), then started ([`SandboxPair::start`]).
pub struct SandboxPair<R: SandboxRuntime> {
    engine: Engine<SandboxSpec, PodSandboxes, SandboxReconciler, SandboxDriver<R>>,
    desired: Store<PodUid, SandboxSpec>,
    writer: Writer<PodUid, SandboxSpec>,
    pods: Store<PodUid, PodActual>,
}

impl<R: SandboxRuntime> std::fmt::Debug for SandboxPair<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxPair").field("engine", &self.engine).finish_non_exhaustive()
    }
}

/// How many sandbox operations the sandbox engine runs at once: no bound (`0`), as the pod engine
/// ([`crate::pod::ops::MAX_CONCURRENT_OPS`]). The engine runs at most one operation per pod;
/// creations, the runtime's heaviest call, are bounded inside the driver
/// ([`DEFAULT_SANDBOX_CREATIONS_AT_ONCE`]). With the engine's default bound (64), the removal of 110
/// pods queued the last pods' `remove_sandbox` behind 64 in flight for up to 3 s, and creations
/// waiting for a driver slot held engine slots that stops and removals could have used.
pub const MAX_CONCURRENT_OPS: usize = 0;

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
    /// The volume pair's desired and actual stores, side inputs of the reconciler (a sandbox waits
    /// for the pod's volumes, see [`VolumeGate`]); the actual one
    /// is watched, so that a waiting pod is planned again when they change. `None`: pods have no
    /// volumes to wait for.
    pub volumes: Option<(Store<VolumeKey, DesiredVolume>, Store<VolumeKey, VolumeActual>)>,
}

impl<R: SandboxRuntime> SandboxPair<R> {
    /// Builds the pair over `runtime`, reading (and watching) the pod pair's actual store `pods`
    /// (from the pod engine's builder); the verdicts and the volume stores come from `config`.
    pub fn new(
        runtime: Arc<R>,
        pods: Store<PodUid, PodActual>,
        metrics: SandboxMetrics,
        engine_metrics: Option<&Metrics>,
        config: SandboxPairConfig,
    ) -> Self {
        let (desired, writer) = store();
        let slots = config.creations_at_once.unwrap_or(DEFAULT_SANDBOX_CREATIONS_AT_ONCE);
        let mut builder = Engine::builder(
            "sandboxes",
            SandboxReconciler::new(),
            Arc::new(SandboxDriver::new(runtime, metrics, slots)),
            desired.clone(),
        )
        .backoff(config.backoff)
        .max_concurrent(MAX_CONCURRENT_OPS)
        // A pod's containers changed: plan its sandbox again (a sandbox is stopped or replaced only
        // once nothing of the pod runs in it).
        .watches("pods", pods.clone(), |uid: &PodUid, _: Option<&PodActual>| Some(uid.clone()));
        if let Some(verdicts) = config.verdicts.clone() {
            // A pod's verdict came or changed: plan its sandbox again.
            builder =
                builder.watches("verdicts", verdicts, |uid: &PodUid, _: Option<&Verdict>| Some(uid.clone()));
        }
        if let Some((_, volume_actual)) = config.volumes.clone() {
            // A pod's volumes changed: plan its sandbox again (it waits for them).
            builder = builder.watches("volumes", volume_actual, crate::volume::reconciler::pod_of_volume);
        }
        let inputs = SandboxInputs {
            pods: pods.clone(),
            verdicts: config.verdicts,
            volumes: config.volumes.map(|(desired, actual)| VolumeGate::new(desired, actual)),
        };
        if let Some(metrics) = engine_metrics {
            builder = builder.metrics(metrics);
        }
        if let Some(period) = config.resync_period {
            builder = builder.resync_period(period);
        }
        Self { engine: builder.build_with(inputs), desired, writer, pods }
    }

    /// What the servers read of this pair.
    pub fn view(&self) -> SandboxView {
        SandboxView::new(self.engine.actual(), Some(self.engine.op_status()))
    }

    /// The actual store.
    pub fn actual(&self) -> Store<PodUid, PodSandboxes> {
        self.engine.actual()
    }

    /// The operation status store: each pod's last failed sandbox operation.
    pub fn op_status(&self) -> Store<PodUid, SandboxOpStatus> {
        self.engine.op_status()
    }

    /// The desired store.
    pub fn desired(&self) -> Store<PodUid, SandboxSpec> {
        self.desired.clone()
    }

    /// An observer of the actual store (for the PLEG's relist).
    pub fn observer(&mut self) -> Observer<PodUid, PodSandboxes> {
        self.engine.observer()
    }

    /// The pair's tasks, for the caller to spawn, all ending at `shutdown`: the engine (returned first,
    /// ending with its report) and the populator from the desired pods `pods` (`sandbox-populator`).
    /// Nothing else runs at start-up: the engine plans every pod again once the desired sandboxes have
    /// synced (every pod source has reported), and the pod engine waits for this pair's actual store to
    /// be reconstructed ([`EngineBuilder::waits_for`](reconcile_engine::EngineBuilder::waits_for)).
    pub fn start(
        self,
        pods: Store<PodUid, DesiredPod>,
        shutdown: CancellationToken,
    ) -> (TaskFuture<reconcile_engine::RunReport>, Vec<NamedTask>) {
        let pod_actual = self.pods;
        let populator = NamedTask::new(
            "sandbox-populator",
            Lifetime::UntilShutdown,
            SandboxPopulator::new(pods, pod_actual, self.writer).run(shutdown.clone()),
        );
        let engine = self.engine;
        (Box::pin(engine.run(shutdown.cancelled_owned())), vec![populator])
    }
}
