//! The pod pair (containers of the desired pods) as an [`Extension`]: [`PodPair`] declares the pod
//! engine's relations and gate ([`PodSideInputs::register`]), builds the engine with its side inputs
//! ([`PodSideInputs::inputs`]), and spawns, in order: `prober` (critical), `container-gc` (the node-wide
//! `maxContainers` decision, critical), `log-rotation` (restartable), `runtime-events` (the runtime's
//! events to the PLEG, restartable; a hollow node's fake runtime sends them too), `pleg` and `pod-engine`
//! (critical). It adds container GC's reclaimer to the
//! node's reclaimers ([`ExtensionContext::reclaimers`]), the first the eviction pair tries.
//!
//! Its stores are made before any pair starts (`super::super::topology`, "stores before engines"): the
//! sandbox pair and the volume populator read the pod actual store, status reads the pod reconciler and
//! its side inputs. So it is given at construction what only it holds: the engine builder (its reconciler
//! and driver inside), its side inputs, the prober, the container GC populator and reclaimer, the CRI pod
//! runtime its PLEG lists, the observer the PLEG reports sandboxes through, and its settings. What it reads
//! of the rest of the node comes from the [`ExtensionContext`]: the pod actual store, the sandbox actual
//! store, the CRI client, the engine metrics, the wall clock, the supervisor and the shutdown token. It has
//! no status table.

use std::sync::Arc;
use std::time::Duration;

use nodelet_cri::{CriPodRuntime, CriProber};
use nodelet_node::log_rotation;
use nodelet_resources::model::actual::{PodActual, PodSandboxes};
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::gc::{ContainerGcReclaimer, Surplus, SurplusPopulator};
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::reconciler::{PodInputs, PodReconciler};
use nodelet_resources::pod::status::PodOpStatus;
use nodelet_resources::probe::results::ProbeResults;
use nodelet_resources::probe::worker::Prober;
use nodelet_resources::sandbox::status::{SandboxOpStatus, SandboxView, pod_of_sandboxes};
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey};
use reconcile_engine::{BackoffConfig, EngineBuilder, Observer, Store};

use super::log_report;
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::runtime;
use crate::daemon::supervisor::Policy;

/// The pod engine's builder, before its relations are declared.
pub(crate) type PodEngineBuilder =
    EngineBuilder<DesiredPod, PodActual, PodReconciler, PodDriver<CriPodRuntime>>;

/// The pod reconciler's side inputs, defined once: their relations declared on the pod engine
/// ([`register`](Self::register): what plans a pod again when one changes, and the store it waits for) and
/// the [`PodInputs`] value ([`inputs`](Self::inputs)) that the engine is built with and status reads
/// ([`PodPair::status_inputs`]), so status reads what the engine reads.
pub(crate) struct PodSideInputs {
    /// The engine's own failures: an ephemeral container whose start keeps failing never delays the pod's
    /// other containers, and no prune replaces a failure on record.
    pub(crate) failures: Store<PodUid, PodOpStatus>,
    /// The node's verdicts on its pods.
    pub(crate) verdicts: Store<PodUid, Verdict>,
    /// The volume pair's desired store.
    pub(crate) volumes_desired: Store<VolumeKey, DesiredVolume>,
    /// The volume pair's actual store: a pod's containers wait for its volumes.
    pub(crate) volumes_actual: Store<VolumeKey, VolumeActual>,
    /// The sandbox pair's actual store: a pod's containers wait for a ready sandbox.
    pub(crate) sandboxes: Store<PodUid, PodSandboxes>,
    /// The sandbox pair's operation status.
    pub(crate) sandbox_failures: Store<PodUid, SandboxOpStatus>,
    /// The node-wide container GC decision per pod.
    pub(crate) surplus: Store<PodUid, Surplus>,
    /// The prober's results (the reconciler holds its own reader, [`PodReconciler::with_probes`]): a
    /// container's liveness or startup failure gets it killed.
    pub(crate) probes: ProbeResults,
}

impl PodSideInputs {
    /// Declares on the pod engine's builder the relations that plan a pod again when a side input changes,
    /// and the gate on the sandbox pair's actual store (nothing is planned before it was reconstructed: a
    /// pod would look as if its sandbox were gone).
    fn register<Dr>(
        &self,
        builder: EngineBuilder<DesiredPod, PodActual, PodReconciler, Dr>,
    ) -> EngineBuilder<DesiredPod, PodActual, PodReconciler, Dr>
    where
        Dr: reconcile_engine::Driver<PodUid, nodelet_resources::pod::ops::PodOp, PodActual>,
    {
        let PodSideInputs { verdicts, volumes_actual, sandboxes, surplus, probes, .. } = self;
        builder
            // A pod's verdict came or changed: plan the pod again.
            .watches("verdicts", verdicts.clone(), |uid: &PodUid, _: Option<&Verdict>| Some(uid.clone()))
            // A pod's volumes changed: plan the pod again (its containers wait for them).
            .watches("volumes", volumes_actual.clone(), nodelet_resources::volume::reconciler::pod_of_volume)
            // A pod's sandboxes changed: plan the pod again (its containers wait for a ready sandbox).
            .watches("sandboxes", sandboxes.clone(), pod_of_sandboxes)
            // Nothing is planned before the sandbox pair has read the runtime, then every pod.
            .waits_for("sandboxes", sandboxes.clone())
            // The node-wide container GC decision for a pod changed: plan the pod again.
            .watches("container-gc", surplus.clone(), |uid: &PodUid, _: Option<&Surplus>| Some(uid.clone()))
            // A container's probe results changed: plan its pod again.
            .watches("probes", probes.clone(), nodelet_resources::probe::results::pod_of_probes)
    }

    /// The pod reconciler's side inputs: the engine is built with them, status reads them.
    fn inputs(&self) -> PodInputs {
        let PodSideInputs {
            failures,
            verdicts,
            volumes_desired,
            volumes_actual,
            sandboxes,
            sandbox_failures,
            surplus,
            probes: _,
        } = self;
        PodInputs {
            failures: Some(failures.clone()),
            verdicts: Some(verdicts.clone()),
            volumes: Some(nodelet_resources::volume::status::VolumeGate::new(
                volumes_desired.clone(),
                volumes_actual.clone(),
            )),
            sandboxes: Some(SandboxView::new(sandboxes.clone(), Some(sandbox_failures.clone()))),
            surplus: Some(surplus.clone()),
        }
    }
}

/// How the pod engine and its PLEG run (from the configuration).
#[derive(Debug, Clone)]
pub(crate) struct PodSettings {
    /// The engine's back-off of failed operations (`imagePull*` back-off).
    pub(crate) backoff: BackoffConfig,
    /// The engine's periodic resync (`syncFrequency`).
    pub(crate) resync_period: Duration,
    /// The PLEG's relist period (`plegRelistPeriod`) and its period while the runtime's events come
    /// (`plegEventedRelistPeriod`).
    pub(crate) relist_period: Duration,
    pub(crate) evented_relist_period: Duration,
    /// Log rotation (`containerLogMax*`, `containerLogMonitorInterval`).
    pub(crate) container_logs: crate::config::ContainerLogConfig,
}

/// The container GC of the pod pair: the populator of the node-wide decision, and the reclaimer the
/// eviction pair tries under disk pressure.
pub(crate) struct ContainerGc {
    pub(crate) populator: SurplusPopulator,
    pub(crate) reclaimer: ContainerGcReclaimer,
}

/// The pod pair, with what only it holds: its parts, and the value of its side inputs the engine is built
/// with (status reads a clone).
pub(crate) struct PodPair {
    parts: PodPairParts,
    inputs: PodInputs,
}

/// What the pod pair is built from.
pub(crate) struct PodPairParts {
    /// The engine's builder (reconciler, driver, desired store, wall clock).
    pub(crate) builder: PodEngineBuilder,
    /// Its side inputs.
    pub(crate) side_inputs: PodSideInputs,
    /// The prober (its results are a side input).
    pub(crate) prober: Prober<CriProber>,
    pub(crate) container_gc: ContainerGc,
    /// The runtime the PLEG lists, and whose own changes `runtime-events` leaves out.
    pub(crate) pod_runtime: Arc<CriPodRuntime>,
    pub(crate) pod_metrics: PodMetrics,
    /// The observer the PLEG reports the sandboxes it lists through (the sandbox pair's).
    pub(crate) sandbox_observer: Observer<PodUid, PodSandboxes>,
    pub(crate) settings: PodSettings,
}

impl PodPair {
    /// The pair from its parts; its side inputs' value ([`PodSideInputs::inputs`]) is made here, once.
    pub(crate) fn new(parts: PodPairParts) -> Self {
        let inputs = parts.side_inputs.inputs();
        Self { parts, inputs }
    }

    /// The pod engine's side inputs, for status: a clone of the value the engine is built with.
    pub(crate) fn status_inputs(&self) -> PodInputs {
        self.inputs.clone()
    }
}

impl Extension for PodPair {
    fn name(&self) -> &str {
        "pods"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let PodPair {
            parts:
                PodPairParts {
                    builder,
                    side_inputs,
                    prober,
                    container_gc,
                    pod_runtime,
                    pod_metrics,
                    sandbox_observer,
                    settings,
                },
            inputs,
        } = *self;
        let (sup, shutdown) = (ctx.supervisor(), ctx.shutdown());
        let mut engine = side_inputs
            .register(builder)
            .metrics(ctx.engine_metrics())
            .wall_clock(ctx.wall_clock())
            .backoff(settings.backoff)
            .max_concurrent(nodelet_resources::pod::ops::MAX_CONCURRENT_OPS)
            .resync_period(settings.resync_period)
            .build_with(inputs);
        // The prober: runs the probes of running containers; the pod reconciler and status read its results.
        sup.spawn(
            "prober",
            Policy::Critical,
            prober.run(ctx.pods_actual(), ctx.sandboxes_actual(), shutdown.clone().cancelled_owned()),
        );
        let pleg = nodelet_resources::pod::pleg::Pleg::new(
            pod_runtime.clone(),
            ctx.pods_actual(),
            engine.observer(),
            settings.relist_period,
            pod_metrics.clone(),
        )
        .with_evented_period(settings.evented_relist_period)
        .with_sandboxes(ctx.sandboxes_actual(), sandbox_observer);
        let relist = pleg.waker();
        // The node-wide cap on dead containers (maxContainers), decided over all pods.
        sup.spawn("container-gc", Policy::Critical, container_gc.populator.run(shutdown.clone()));
        let (cri, logs_actual, logs_config, stop) =
            (ctx.cri().clone(), ctx.pods_actual(), settings.container_logs, shutdown.clone());
        sup.spawn_restartable("log-rotation", move || {
            let policy = nodelet_cri::log_rotation::LogRotationPolicy {
                max_size: logs_config.max_size,
                max_files: logs_config.max_files,
            };
            log_rotation::run(
                cri.clone(),
                logs_actual.clone(),
                policy,
                logs_config.monitor_interval,
                stop.clone(),
            )
        });
        // The runtime's container events (a hollow node's fake runtime sends them too): while they come,
        // the PLEG relists every `plegEventedRelistPeriod`.
        let (cri, own, stop) = (ctx.cri().clone(), pod_runtime.own_changes(), shutdown.clone());
        sup.spawn_restartable("runtime-events", move || {
            runtime::forward_runtime_events(
                cri.clone(),
                relist.clone(),
                own.clone(),
                pod_metrics.clone(),
                stop.clone(),
            )
        });
        let stop = shutdown.clone();
        sup.spawn("pleg", Policy::Critical, async move { pleg.run(stop.cancelled_owned()).await });
        sup.spawn(
            "pod-engine",
            Policy::Critical,
            log_report("pod", engine.run(shutdown.clone().cancelled_owned())),
        );
        // Under disk pressure the eviction pair tries container GC first.
        ctx.reclaimers().add(Arc::new(container_gc.reclaimer));
        Ok(None)
    }
}
