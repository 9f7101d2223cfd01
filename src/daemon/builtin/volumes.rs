//! The volume pair (pod volumes and CSI devices) as an [`Extension`]: [`VolumePair`] declares the volume
//! engine's relation `devices` (its own actual store: pod volumes and their CSI devices wait for each other,
//! `related_volumes`), builds the engine, and spawns, all critical but the restartable
//! `claim-volume-stats`, in order: `volume-watch` (volumes that vanished behind nodelet's back, reported
//! through the engine's observer), `volume-refresh` (the manifest objects or the claims' bindings changed:
//! populate again), `volume-populator` (one desired volume per pod volume), `claim-volume-stats`
//! (`kubelet_volume_stats_*` of the claims' volumes), `volume-engine`.
//!
//! Its stores are made before any pair starts (`super::super::topology`, "stores before engines": the
//! pod and sandbox pairs read the volume stores as side inputs, status reads its view), so it is given at
//! construction what only it holds: the engine builder (reconciler and driver inside), the writer of its
//! desired store, the populator's renderer and claim lookup, the refresh channel (whose sender cluster
//! mode holds too) and, in cluster mode, the pods a service-account token was issued for. What it reads
//! of the rest of the node comes from the [`ExtensionContext`]: the desired and actual pods and the
//! verdicts (the populator's inputs), the engine metrics, the supervisor and the shutdown token. It has no
//! status table.

use std::sync::Arc;
use std::time::Duration;

use nodelet_resources::claim::metrics::ClaimMetrics;
use nodelet_resources::claim::status::ClaimView;
use nodelet_resources::model::pod::PodUid;
use nodelet_resources::model::volumes::ClaimLookup;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey};
use nodelet_resources::volume::driver::VolumeDriver;
use nodelet_resources::volume::populator::Populator;
use nodelet_resources::volume::reconciler::{VolumeReconciler, related_volumes};
use reconcile_engine::{EngineBuilder, Store, Subscription, Writer};
use tokio::sync::watch;

use super::log_report;
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::supervisor::Policy;
use crate::sources::ManifestObjects;
use crate::volumes;

/// The volume engine's builder, before its relation is declared.
pub(crate) type VolumeEngineBuilder =
    EngineBuilder<DesiredVolume, VolumeActual, VolumeReconciler, VolumeDriver<volumes::NodeVolumes>>;

/// The volume pair, with what only it holds.
pub(crate) struct VolumePair {
    /// The engine's builder (reconciler, driver, desired store).
    builder: VolumeEngineBuilder,
    /// The desired store and its writer (the populator's).
    desired: (Store<VolumeKey, DesiredVolume>, Writer<VolumeKey, DesiredVolume>),
    /// What the populator renders volumes from (ConfigMaps, Secrets, tokens).
    renderer: volumes::ManifestRenderer,
    /// The claims the populator binds pod volumes to.
    claim_lookup: Arc<dyn ClaimLookup>,
    /// The claim pair's view: its changes (bindings) populate again.
    claims: ClaimView,
    /// The manifest directory's objects: their changes populate again.
    objects: watch::Receiver<Arc<ManifestObjects>>,
    /// The populator's refresh channel: `volume-refresh` (and cluster mode) send, the populator receives.
    refresh: (watch::Sender<()>, watch::Receiver<()>),
    /// Cluster mode: the pods a service-account token was issued for (their volumes alone render again).
    tokens_issued: Option<Subscription<PodUid>>,
    /// The CSI plugin registry and the claims' volume metrics, for `claim-volume-stats`.
    csi: Arc<nodelet_csi::Registry>,
    claim_metrics: ClaimMetrics,
    /// How often `claim-volume-stats` measures (`volumeStatsAggPeriod`).
    stats_period: Duration,
}

/// What the volume populator reads besides the pod stores and verdicts.
pub(crate) struct VolumeSources {
    /// What it renders volumes from (ConfigMaps, Secrets, tokens).
    pub(crate) renderer: volumes::ManifestRenderer,
    /// The claims it binds pod volumes to.
    pub(crate) claim_lookup: Arc<dyn ClaimLookup>,
    /// The claim pair's view: its changes (bindings) populate again.
    pub(crate) claims: ClaimView,
    /// The manifest directory's objects: their changes populate again.
    pub(crate) objects: watch::Receiver<Arc<ManifestObjects>>,
    /// The refresh channel: `volume-refresh` (and cluster mode) send, the populator receives.
    pub(crate) refresh: (watch::Sender<()>, watch::Receiver<()>),
    /// Cluster mode: the pods a service-account token was issued for (their volumes alone render again).
    pub(crate) tokens_issued: Option<Subscription<PodUid>>,
}

/// What `claim-volume-stats` reads and reports to.
pub(crate) struct ClaimVolumeStats {
    /// The CSI plugin registry (`NodeGetVolumeStats`).
    pub(crate) csi: Arc<nodelet_csi::Registry>,
    /// `kubelet_volume_stats_*`.
    pub(crate) metrics: ClaimMetrics,
    /// How often it measures (`volumeStatsAggPeriod`).
    pub(crate) period: Duration,
}

impl VolumePair {
    /// The pair over the engine `builder`, its desired store and writer, what its populator reads
    /// (`sources`) and what `claim-volume-stats` reads (`stats`).
    pub(crate) fn new(
        builder: VolumeEngineBuilder,
        desired: (Store<VolumeKey, DesiredVolume>, Writer<VolumeKey, DesiredVolume>),
        sources: VolumeSources,
        stats: ClaimVolumeStats,
    ) -> Self {
        let VolumeSources { renderer, claim_lookup, claims, objects, refresh, tokens_issued } = sources;
        let ClaimVolumeStats { csi, metrics: claim_metrics, period: stats_period } = stats;
        Self {
            builder,
            desired,
            renderer,
            claim_lookup,
            claims,
            objects,
            refresh,
            tokens_issued,
            csi,
            claim_metrics,
            stats_period,
        }
    }
}

impl Extension for VolumePair {
    fn name(&self) -> &str {
        "volumes"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let VolumePair {
            builder,
            desired: (desired, writer),
            renderer,
            claim_lookup,
            claims,
            objects,
            refresh: (refresh_tx, refresh),
            tokens_issued,
            csi,
            claim_metrics,
            stats_period,
        } = *self;
        let (sup, shutdown) = (ctx.supervisor(), ctx.shutdown());
        // Pod volumes and their CSI devices wait for each other.
        let own_actual = builder.actual();
        let wanted = desired.clone();
        let related = related_volumes(desired, own_actual.clone());
        let mut engine =
            builder.metrics(ctx.engine_metrics()).watches("devices", own_actual, related).build();
        let actual = engine.actual();
        sup.spawn(
            "volume-watch",
            Policy::Critical,
            volumes::watch_volumes(wanted, actual.clone(), engine.observer(), shutdown.clone()),
        );
        let mut populator = Populator::new(ctx.pods_desired(), ctx.pods_actual(), writer, Arc::new(renderer))
            .with_claims(claim_lookup)
            .with_verdicts(ctx.verdicts());
        if let Some(pods) = tokens_issued {
            populator = populator.with_pod_refresh(pods);
        }
        // Populate again when the objects (ConfigMaps, Secrets) or the claims' bindings change.
        sup.spawn(
            "volume-refresh",
            Policy::Critical,
            volumes::forward_changes(objects, claims.subscribe(), refresh_tx, shutdown.clone()),
        );
        sup.spawn("volume-populator", Policy::Critical, populator.run(refresh, shutdown.clone()));
        let (pods, stop) = (ctx.pods_desired(), shutdown.clone());
        let vol_actual = actual;
        sup.spawn_restartable("claim-volume-stats", move || {
            volumes::claim_volume_stats(
                pods.clone(),
                vol_actual.clone(),
                csi.clone(),
                claim_metrics.clone(),
                stats_period,
                stop.clone(),
            )
        });
        sup.spawn(
            "volume-engine",
            Policy::Critical,
            log_report("volume", engine.run(shutdown.clone().cancelled_owned())),
        );
        Ok(None)
    }
}
