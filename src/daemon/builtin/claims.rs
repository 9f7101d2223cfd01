//! The claim pair (PersistentVolumes, claims, classes, provisioners) as an [`Extension`]: [`ClaimPair`]
//! spawns the CSI plugin registry's watcher and the store of its registered drivers, declares the claim
//! engine's relations (`desired` and `actual`, its own two stores: `watch_related`; `csi-drivers`:
//! `claims::watch_csi_drivers`), builds it and spawns it with its populator. Tasks, all critical, in
//! order: `csi-plugin-watcher`, `csi-drivers`, `claim-populator`, `claim-engine`.
//!
//! Its stores are made before any pair starts (`super::super::topology`, "stores before engines"): the
//! claim view the volume pair and status read is made from the engine builder's actual and operation
//! status stores, so the pair is given at construction what only it holds: the registry, the writer of the
//! drivers' store, the engine builder (its reconciler and driver inside), the writer of its desired store,
//! and its populator's objects and provisioned volumes. What it reads of the rest of the node comes from the
//! [`ExtensionContext`]: the desired pods, the engine metrics, the supervisor and the shutdown token. It has
//! no status table.

use std::sync::Arc;
use std::time::Duration;

use nodelet_resources::claim::actual::ClaimActual;
use nodelet_resources::claim::desired::{ClaimDesired, ClaimKey};
use nodelet_resources::claim::driver::{ClaimDriver, ProvisionedVolumes};
use nodelet_resources::claim::populator::{ObjectFeed, Populator};
use nodelet_resources::claim::reconciler::{ClaimReconciler, watch_related};
use nodelet_storage::records::FileRecords;
use reconcile_engine::{EngineBuilder, Store, Writer};

use super::log_report;
use crate::claims::{self, CsiDriverInfo};
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::supervisor::Policy;

/// The claim engine's builder, before its relations are declared.
pub(crate) type ClaimEngineBuilder =
    EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, ClaimDriver<FileRecords>>;

/// The claim pair, with what only it holds.
pub(crate) struct ClaimPair {
    /// The CSI plugin registry, for its watcher (the registry itself is shared: provisioners, volumes).
    csi: Arc<nodelet_csi::Registry>,
    /// The registered CSI drivers (watched by the engine) and the writer `claims::csi_drivers` fills it
    /// with.
    csi_drivers: (Store<String, CsiDriverInfo>, Writer<String, CsiDriverInfo>),
    /// The engine's builder (reconciler, driver, desired store).
    builder: ClaimEngineBuilder,
    /// The desired store and its writer, for the populator.
    desired: (Store<ClaimKey, ClaimDesired>, Writer<ClaimKey, ClaimDesired>),
    /// The populator's storage objects (the manifest directory's).
    objects: ObjectFeed,
    /// The volumes the driver has provisioned (the populator reads them as PersistentVolumes).
    provisioned: ProvisionedVolumes,
}

impl ClaimPair {
    /// The pair over the registry `csi`, the drivers' store and its writer, the engine `builder`, its
    /// desired store and writer, the populator's `objects` and `provisioned` volumes.
    pub(crate) fn new(
        csi: Arc<nodelet_csi::Registry>,
        csi_drivers: (Store<String, CsiDriverInfo>, Writer<String, CsiDriverInfo>),
        builder: ClaimEngineBuilder,
        desired: (Store<ClaimKey, ClaimDesired>, Writer<ClaimKey, ClaimDesired>),
        objects: ObjectFeed,
        provisioned: ProvisionedVolumes,
    ) -> Self {
        Self { csi, csi_drivers, builder, desired, objects, provisioned }
    }
}

impl Extension for ClaimPair {
    fn name(&self) -> &str {
        "claims"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let ClaimPair { csi, csi_drivers, builder, desired, objects, provisioned } = *self;
        let ((drivers, drivers_writer), (desired, writer)) = (csi_drivers, desired);
        let (sup, shutdown) = (ctx.supervisor(), ctx.shutdown());
        // CSI node plugins register by socket in nodelet.storage.csi.pluginDir.
        sup.spawn(
            "csi-plugin-watcher",
            Policy::Critical,
            csi.watcher(Duration::from_secs(2), shutdown.clone()),
        );
        // The registered CSI drivers as a store: a driver registering (or going away) changes what can be
        // provisioned and the node's topology labels, and the claim engine watches it.
        sup.spawn(
            "csi-drivers",
            Policy::Critical,
            claims::csi_drivers(csi, drivers_writer, shutdown.clone()),
        );
        let engine = watch_related(builder.metrics(ctx.engine_metrics()), &desired);
        let engine = claims::watch_csi_drivers(engine, &desired, &drivers).build();
        let populator = Populator::new(objects, provisioned, ctx.pods_desired(), engine.actual(), writer);
        sup.spawn("claim-populator", Policy::Critical, populator.run(shutdown.clone()));
        sup.spawn(
            "claim-engine",
            Policy::Critical,
            log_report("claim", engine.run(shutdown.clone().cancelled_owned())),
        );
        Ok(None)
    }
}
