//! Wiring of the sandbox pair (sandboxes and their network, [`nodelet_resources::sandbox`]) into the
//! daemon. The pair and the pod pair read each other's actual store, so it is wired in two steps:
//! [`build`] before the pod engine (whose reconciler reads [`SandboxPair::view`] and whose PLEG feeds
//! [`SandboxPair::observer`]), [`start`] once the pod engine exists.

use std::sync::Arc;

use nodelet_resources::eviction::verdict::PodVerdicts;
use nodelet_resources::pod::actual::PodActual;
use nodelet_resources::pod::desired::{DesiredPod, PodUid};
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::VolumeKey;
use nodelet_resources::volume::status::VolumeGate;
use reconcile_engine::{BackoffConfig, CancellationToken, Store, Waker};
use tokio::task::JoinSet;

/// The daemon's sandbox pair, over CRI.
pub(crate) type Sandboxes = SandboxPair<nodelet_cri::CriPodRuntime>;

/// Builds the sandbox pair: sandboxes are made once the pod's volumes are set up (`gate`) and the
/// pod was admitted (`verdicts`); failed operations back off as `backoff` says.
pub(crate) fn build(
    runtime: Arc<nodelet_cri::CriPodRuntime>,
    gate: VolumeGate,
    verdicts: PodVerdicts,
    registry: &prometheus::Registry,
    engine_metrics: &reconcile_engine::Metrics,
    backoff: BackoffConfig,
    resync_period: std::time::Duration,
) -> anyhow::Result<Sandboxes> {
    Ok(SandboxPair::new(
        runtime,
        |r| r.with_volumes(gate).with_verdicts(verdicts),
        SandboxMetrics::new(registry)?,
        Some(engine_metrics),
        SandboxPairConfig { backoff, resync_period: Some(resync_period), creations_at_once: None },
    ))
}

/// Runs the sandbox pair until `shutdown`: its populator from the desired pods, its engine, and the
/// wake-ups standing in for relations (pod actual store ↔ sandbox actual store, volume actual
/// store → sandboxes).
pub(crate) fn start(
    pair: Sandboxes,
    pods: Store<PodUid, DesiredPod>,
    pod_actual: Store<PodUid, PodActual>,
    pod_waker: Waker<PodUid>,
    volumes: Store<VolumeKey, VolumeActual>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    // relation: the sandbox pair watches the volume actual store, key (volume, pod UID) → pod UID.
    tasks.spawn(crate::volumes::wake_pods_on_volume_changes(volumes, pair.waker(), shutdown.clone()));
    let engine = pair.start(pods, pod_actual, pod_waker, shutdown.clone());
    tasks.spawn(async move {
        if let Ok(report) = engine.await {
            tracing::info!(
                operations = report.operations,
                abandoned = report.abandoned,
                "sandbox engine stopped"
            );
        }
    });
}
