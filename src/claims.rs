//! The claim pair's parts that depend on the daemon: the PersistentVolume, PersistentVolumeClaim and
//! StorageClass objects of the manifest directory, the provisioners the configuration asks for, the claim
//! driver's records and the node as binding sees it. The pair is assembled (engine, populator, tasks) in
//! `daemon::topology::start_claims`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use nodelet_resources::claim::binding::NodeInfo;
use nodelet_resources::claim::desired::{ClaimDesired, ClaimKey};
use nodelet_resources::claim::driver::{ClaimDriver, Provisioner, ProvisionerSet};
use nodelet_resources::claim::populator::{ClaimObjects, ObjectFeed};
use reconcile_engine::{CancellationToken, Store, Waker};
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

/// The node as claim binding sees it: its name, labelled (as the kubelet labels its Node) with the
/// topology of the CSI drivers registered on it.
pub(crate) fn node_info(config: &Config, csi: &Arc<nodelet_csi::Registry>) -> NodeInfo {
    let csi_drivers = csi.clone();
    let topology = Arc::new(move || {
        csi_drivers
            .drivers()
            .iter()
            .flat_map(|d| d.node.accessible_topology.clone())
            .collect::<BTreeMap<_, _>>()
    });
    NodeInfo::new(&config.node_name).with_dynamic_labels(topology)
}

/// The claim populator's objects: the storage objects of the manifest directory, read again whenever
/// they change.
pub(crate) fn objects(manifests: watch::Receiver<Arc<ManifestObjects>>) -> ObjectFeed {
    ObjectFeed::mapped(manifests, claim_objects)
}

/// Plans every claim again when a CSI driver registers or goes away (it changes what can be provisioned);
/// ends at `stop` or when the engine is gone.
pub(crate) async fn wake_on_csi_drivers(
    csi: Arc<nodelet_csi::Registry>,
    desired: Store<ClaimKey, ClaimDesired>,
    waker: Waker<ClaimKey>,
    stop: CancellationToken,
) {
    let mut drivers = csi.subscribe();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            r = drivers.changed() => if r.is_err() { return },
        }
        for key in desired.keys() {
            if matches!(key, ClaimKey::Claim { .. }) && !waker.wake(key) {
                return;
            }
        }
    }
}
