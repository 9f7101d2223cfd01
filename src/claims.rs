//! The claim pair's parts that depend on the daemon: the PersistentVolume, PersistentVolumeClaim and
//! StorageClass objects of the manifest directory, the provisioners the configuration asks for, the claim
//! driver's records, the node as binding sees it, and the store of registered CSI drivers the claim
//! engine watches (a driver registering or going away changes what can be provisioned and the node's
//! topology labels). The pair's stores and engine builder are made in `daemon::topology::claim_stores`; it
//! starts (relations, engine, populator, tasks) as the built-in extension `daemon::builtin::claims`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use nodelet_resources::claim::actual::ClaimActual;
use nodelet_resources::claim::binding::NodeInfo;
use nodelet_resources::claim::desired::{ClaimDesired, ClaimKey};
use nodelet_resources::claim::driver::{ClaimDriver, Provisioner, ProvisionerSet};
use nodelet_resources::claim::ops::ClaimOp;
use nodelet_resources::claim::populator::{ClaimObjects, ObjectFeed};
use nodelet_resources::claim::reconciler::{ClaimReconciler, watch_provisioners};
use reconcile_engine::{CancellationToken, Driver, EngineBuilder, Store, Writer};
use tokio::sync::watch;

use crate::config::Config;
use crate::sources::ManifestObjects;

/// The storage objects among the manifest directory's objects (the last document of a name wins).
fn claim_objects(objects: &ManifestObjects) -> ClaimObjects {
    fn parse<T: serde::de::DeserializeOwned>(objects: &ManifestObjects, kind: &str) -> Vec<T> {
        objects.get(kind).into_iter().flatten().filter_map(|o| o.parse(kind)).collect()
    }
    ClaimObjects {
        volumes: parse::<PersistentVolume>(objects, "PersistentVolume"),
        claims: parse::<PersistentVolumeClaim>(objects, "PersistentVolumeClaim"),
        classes: parse::<StorageClass>(objects, "StorageClass"),
    }
}

/// The claim pair's provisioners: a local directory under `storage.localBasePath`, an LVM volume group
/// when `storage.lvmVolumeGroup` is set, and the CSI plugins of `csi`.
pub(crate) fn provisioners(
    config: &Config,
    csi: &Arc<nodelet_csi::Registry>,
) -> Result<ProvisionerSet, nodelet_storage::lvm::LvmError> {
    let mut provisioners: Vec<Arc<dyn Provisioner>> = vec![Arc::new(
        nodelet_storage::local::LocalDirProvisioner::new(&config.storage.local_base_path, &config.node_name),
    )];
    if let Some(vg) = &config.storage.lvm_volume_group {
        provisioners.push(Arc::new(nodelet_storage::lvm::LvmProvisioner::new(
            vg,
            &config.root_dir,
            &config.node_name,
        )?));
    }
    provisioners.push(Arc::new(nodelet_storage::csi::CsiProvisioner::new(csi.clone())));
    Ok(ProvisionerSet::new(provisioners))
}

/// The claim driver over `set`, its records under `<root-dir>/storage/claims`.
pub(crate) fn driver(
    config: &Config,
    set: ProvisionerSet,
    operation_duration: prometheus::HistogramVec,
) -> ClaimDriver<nodelet_storage::records::FileRecords> {
    let records =
        Arc::new(nodelet_storage::records::FileRecords::new(config.root_dir.join("storage").join("claims")));
    ClaimDriver::new(records, set).with_operation_metrics(operation_duration)
}

/// What the claim pair keeps of a registered CSI driver (an entry of the store [`csi_drivers`] writes,
/// by driver name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CsiDriverInfo {
    /// It provisions volumes (`CREATE_DELETE_VOLUME`). Nothing reads it from the store: the provisioner
    /// asks the registry itself. It is kept so that a driver re-registering with another capability is a
    /// change of its entry, which plans the claims that name it again.
    pub(crate) can_create_volumes: bool,
    /// Its accessible topology on this node (`NodeGetInfo`): labels of the node.
    pub(crate) topology: BTreeMap<String, String>,
}

impl CsiDriverInfo {
    fn of(driver: &nodelet_csi::Driver) -> Self {
        Self {
            can_create_volumes: driver.can_create_volumes(),
            topology: driver.node.accessible_topology.clone(),
        }
    }
}

/// Copies the drivers of `csi` into `drivers` (by name) whenever the registry changes, and marks the
/// store synced once the registry's first scan has finished; ends at `stop`.
pub(crate) async fn csi_drivers(
    csi: Arc<nodelet_csi::Registry>,
    mut drivers: Writer<String, CsiDriverInfo>,
    stop: CancellationToken,
) {
    let mut changes = csi.subscribe();
    let mut synced = false;
    loop {
        changes.mark_unchanged();
        // Read after `mark_unchanged`: a change made meanwhile is seen on the next round.
        let scanned = csi.has_scanned();
        drivers.replace_all(csi.drivers().iter().map(|d| (d.name().to_owned(), CsiDriverInfo::of(d))));
        if scanned && !synced {
            drivers.mark_synced();
            synced = true;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = csi.scanned(), if !synced => {}
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

/// The node as claim binding sees it: its name, labelled (as the kubelet labels its Node) with the
/// topology of the CSI drivers registered on it (read from the store [`csi_drivers`] writes, which the
/// claim engine watches).
pub(crate) fn node_info(config: &Config, drivers: &Store<String, CsiDriverInfo>) -> NodeInfo {
    let drivers = drivers.clone();
    let topology = Arc::new(move || {
        let mut labels = BTreeMap::new();
        drivers.for_each(|_, d| labels.extend(d.topology.iter().map(|(k, v)| (k.clone(), v.clone()))));
        labels
    });
    NodeInfo::new(&config.node_name).with_dynamic_labels(topology)
}

/// Declares the claim engine's relation `csi-drivers` on the registered CSI drivers: a driver
/// registering, changing or going away plans again the claims whose class names it as provisioner,
/// and every claim and volume when the node's topology labels may have moved (the driver has a
/// topology, or is gone).
pub(crate) fn watch_csi_drivers<Dr>(
    builder: EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>,
    desired: &Store<ClaimKey, ClaimDesired>,
    drivers: &Store<String, CsiDriverInfo>,
) -> EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>
where
    Dr: Driver<ClaimKey, ClaimOp, ClaimActual>,
{
    watch_provisioners(builder, "csi-drivers", desired, drivers.clone(), |driver: Option<&CsiDriverInfo>| {
        driver.is_none_or(|d| !d.topology.is_empty())
    })
}

/// The claim populator's objects: the storage objects of the manifest directory, read again whenever
/// they change.
pub(crate) fn objects(manifests: watch::Receiver<Arc<ManifestObjects>>) -> ObjectFeed {
    ObjectFeed::mapped(manifests, claim_objects)
}
