//! Claim wiring of the daemon: PersistentVolume, PersistentVolumeClaim and StorageClass objects
//! from the manifest directory, the provisioners from the configuration, and the claim engine.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use nodelet_resources::claim::binding::NodeInfo;
use nodelet_resources::claim::desired::ClaimKey;
use nodelet_resources::claim::driver::{ClaimDriver, Provisioner, ProvisionerSet};
use nodelet_resources::claim::metrics::ClaimMetrics;
use nodelet_resources::claim::populator::{ClaimObjects, ObjectFeed, Populator};
use nodelet_resources::claim::reconciler::{ClaimReconciler, watch_related};
use nodelet_resources::claim::status::ClaimView;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use reconcile_engine::{Engine, Metrics, Store};
use tokio::sync::watch;

use crate::config::Config;
use crate::daemon::Policy;
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

/// The running claim engine's handles.
pub(crate) struct Claims {
    /// What the servers and the volume populator read.
    pub(crate) view: ClaimView,
    /// Binding counts and `kubelet_volume_stats_*`.
    pub(crate) metrics: ClaimMetrics,
}

/// Starts the claim engine's populator (`claim-populator`) and the wake-up of every claim when a CSI
/// driver registers or goes (`claim-csi-drivers`) and the engine (`claim-engine`) on `sup`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    config: &Config,
    manifests: watch::Receiver<Arc<ManifestObjects>>,
    pods: Store<PodUid, DesiredPod>,
    registry: &prometheus::Registry,
    engine_metrics: &Metrics,
    operation_duration: prometheus::HistogramVec,
    csi: Arc<nodelet_csi::Registry>,
    sup: &crate::daemon::Supervisor,
) -> anyhow::Result<Claims> {
    let shutdown = sup.shutdown();
    // Objects: read from the manifest directory's objects whenever they change.
    let objects = ObjectFeed::mapped(manifests, claim_objects);

    // Provisioners.
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
    let set = ProvisionerSet::new(provisioners);

    let records =
        Arc::new(nodelet_storage::records::FileRecords::new(config.root_dir.join("storage").join("claims")));
    let driver = ClaimDriver::new(records, set.clone()).with_operation_metrics(operation_duration);
    let provisioned = driver.provisioned();
    // As the kubelet labels its Node with the topology of the CSI drivers registered on it.
    let csi_drivers = csi.clone();
    let topology = Arc::new(move || {
        csi_drivers
            .drivers()
            .iter()
            .flat_map(|d| d.node.accessible_topology.clone())
            .collect::<BTreeMap<_, _>>()
    });
    let node = NodeInfo::new(&config.node_name).with_dynamic_labels(topology);
    let reconciler = ClaimReconciler::new(node, set);
    let (desired, writer) = reconcile_engine::store();
    let engine = Engine::builder("claims", reconciler.clone(), Arc::new(driver), desired.clone())
        .metrics(engine_metrics);
    let engine = watch_related(engine, &desired).build();
    let actual = engine.actual();
    let view = ClaimView::new(desired.clone(), actual.clone(), reconciler).with_failures(engine.op_status());
    let waker = engine.waker();

    let populator = Populator::new(objects, provisioned, pods, actual.clone(), writer);
    sup.spawn("claim-populator", Policy::Critical, populator.run(shutdown.clone()));
    // A CSI driver registering (or going away) changes what can be provisioned (the caller runs the
    // registry's watcher).
    let mut drivers = csi.subscribe();
    let stop = shutdown.clone();
    sup.spawn("claim-csi-drivers", Policy::MayFinish, async move {
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
    });
    sup.spawn(
        "claim-engine",
        Policy::Critical,
        crate::daemon::start::log_report("claim", engine.run(shutdown.clone().cancelled_owned())),
    );
    Ok(Claims { view, metrics: ClaimMetrics::new(registry)? })
}
