//! The claim pair on fakes, with paused time: the binding rules (class, access modes, size,
//! smallest fit, pre-binding, node affinity, WaitForFirstConsumer), the phases (Pending, Bound,
//! Released, Failed, Lost), reclaim (Retain, Delete), provisioning, and restarts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use nodelet_resources::claim::actual::ClaimActual;
use nodelet_resources::claim::binding::NodeInfo;
use nodelet_resources::claim::desired::{ClaimDesired, ClaimKey};
use nodelet_resources::claim::driver::{
    ClaimDriver, MemoryRecords, ProvisionError, ProvisionRequest, Provisioner, ProvisionerSet,
};
use nodelet_resources::claim::populator::{ClaimObjects, Populator};
use nodelet_resources::claim::reconciler::{ClaimReconciler, watch_provisioners, watch_related};
use nodelet_resources::claim::status::ClaimView;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use reconcile_engine::testing::eventually;
use reconcile_engine::{CancellationToken, Engine, EngineBuilder, Store, Writer, store};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(30);
const NODE: &str = "node-a";

fn pv(yaml: &str) -> PersistentVolume {
    serde_saphyr::from_str(yaml).expect("test PV")
}
fn pvc(yaml: &str) -> PersistentVolumeClaim {
    serde_saphyr::from_str(yaml).expect("test PVC")
}
fn class(yaml: &str) -> StorageClass {
    serde_saphyr::from_str(yaml).expect("test class")
}

fn volume(name: &str, size: &str, modes: &str, class: &str) -> PersistentVolume {
    pv(&format!(
        "metadata: {{name: {name}}}\nspec:\n  capacity: {{storage: {size}}}\n  accessModes: [{modes}]\n  storageClassName: \"{class}\"\n  hostPath: {{path: /data/{name}}}\n"
    ))
}
fn claim(name: &str, size: &str, modes: &str, class: Option<&str>) -> PersistentVolumeClaim {
    let class = class.map(|c| format!("  storageClassName: \"{c}\"\n")).unwrap_or_default();
    pvc(&format!(
        "metadata: {{name: {name}, namespace: default}}\nspec:\n  accessModes: [{modes}]\n  resources: {{requests: {{storage: {size}}}}}\n{class}"
    ))
}

/// A provisioner that records calls and makes hostPath volumes.
#[derive(Debug, Default)]
struct FakeProvisioner {
    created: Mutex<Vec<String>>,
    deleted: Mutex<Vec<String>>,
    fail: Mutex<Option<String>>,
    /// When set, it serves the names of this store (as the CSI provisioner serves the registered
    /// drivers; the value is a driver's topology), not its own name.
    registered: Option<Store<String, Topology>>,
}

/// A registered provisioner's topology: labels of the node.
type Topology = BTreeMap<String, String>;

impl Provisioner for FakeProvisioner {
    fn name(&self) -> &str {
        "fake.example.com"
    }
    fn handles(&self, name: &str) -> bool {
        match &self.registered {
            Some(registered) => registered.contains_key(&name.to_owned()),
            None => name == self.name(),
        }
    }
    fn provision<'a>(
        &'a self,
        r: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<PersistentVolume, ProvisionError>> {
        Box::pin(async move {
            if let Some(e) = self.fail.lock().unwrap().clone() {
                return Err(ProvisionError::failed(e));
            }
            self.created.lock().unwrap().push(r.volume_name.clone());
            let mut pv = r.volume_template("fake.example.com", r.capacity);
            pv.spec.as_mut().unwrap().host_path = Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: format!("/fake/{}", r.volume_name),
                type_: None,
            });
            Ok(pv)
        })
    }
    fn delete<'a>(&'a self, v: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        Box::pin(async move {
            self.deleted.lock().unwrap().push(v.metadata.name.clone().unwrap_or_default());
            Ok(())
        })
    }
}

type ClaimEngineBuilder =
    EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, ClaimDriver<MemoryRecords>>;

struct Harness {
    objects: watch::Sender<Arc<ClaimObjects>>,
    pods: Writer<PodUid, DesiredPod>,
    view: ClaimView,
    provisioner: Arc<FakeProvisioner>,
    records: Arc<MemoryRecords>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Harness {
    async fn start(objects: ClaimObjects) -> Self {
        Self::start_with(objects, Arc::new(MemoryRecords::new()), Arc::new(FakeProvisioner::default())).await
    }

    async fn start_with(
        objects: ClaimObjects,
        records: Arc<MemoryRecords>,
        provisioner: Arc<FakeProvisioner>,
    ) -> Self {
        Self::assemble(objects, records, provisioner, NodeInfo::new(NODE), |builder, _| builder).await
    }

    /// The pair with `node`, its engine's relations on its own stores and those `relate` adds
    /// (given the desired store).
    async fn assemble(
        objects: ClaimObjects,
        records: Arc<MemoryRecords>,
        provisioner: Arc<FakeProvisioner>,
        node: NodeInfo,
        relate: impl FnOnce(ClaimEngineBuilder, &Store<ClaimKey, ClaimDesired>) -> ClaimEngineBuilder,
    ) -> Self {
        let (tx, rx) = watch::channel(Arc::new(objects));
        let (pods_store, mut pods) = store::<PodUid, DesiredPod>();
        pods.mark_synced();
        let (desired, writer) = store();
        let set = ProvisionerSet::new([provisioner.clone() as Arc<dyn Provisioner>]);
        let driver = ClaimDriver::new(records.clone(), set.clone());
        let provisioned = driver.provisioned();
        let reconciler = ClaimReconciler::new(node, set);
        let builder = watch_related(
            Engine::builder("claims", reconciler.clone(), Arc::new(driver), desired.clone()),
            &desired,
        );
        let engine = relate(builder, &desired).build();
        let actual = engine.actual();
        let view =
            ClaimView::new(desired.clone(), actual.clone(), reconciler).with_failures(engine.op_status());
        let stop = CancellationToken::new();
        let populator = Populator::new(rx, provisioned, pods_store, actual.clone(), writer);
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(populator.run(stop.clone())));
        let s = stop.clone();
        tasks.push(tokio::spawn(async move {
            engine.run(s.cancelled_owned()).await;
        }));
        Self { objects: tx, pods, view, provisioner, records, stop, tasks }
    }

    fn set(&self, objects: ClaimObjects) {
        self.objects.send_replace(Arc::new(objects));
    }

    fn add_pod_using(&mut self, uid: &str, claim: &str) {
        let mut pod: Pod = serde_saphyr::from_str(&format!(
            "metadata: {{name: p-{uid}, namespace: default, uid: {uid}}}\nspec:\n  containers: [{{name: c, image: busybox}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]\n"
        ))
        .unwrap();
        pod.metadata.uid = Some(uid.into());
        self.pods.insert(uid.into(), DesiredPod { pod, source: PodSource::Http });
    }

    fn pv_phase(&self, name: &str) -> Option<String> {
        self.view
            .persistent_volumes()
            .into_iter()
            .find(|v| v.metadata.name.as_deref() == Some(name))
            .and_then(|v| v.status.and_then(|s| s.phase))
    }

    fn pvc_phase(&self, name: &str) -> Option<String> {
        self.view.claim_state("default", name).map(|s| s.phase.as_str().to_owned())
    }

    fn bound_to(&self, name: &str) -> Option<String> {
        self.view.bound_volume("default", name).ok().and_then(|v| v.metadata.name)
    }

    async fn stop(self) -> Arc<MemoryRecords> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.records
    }
}

fn objects(
    volumes: Vec<PersistentVolume>,
    claims: Vec<PersistentVolumeClaim>,
    classes: Vec<StorageClass>,
) -> ClaimObjects {
    ClaimObjects { volumes, claims, classes }
}

#[tokio::test(start_paused = true)]
async fn smallest_fitting_volume_of_the_class_binds() {
    let h = Harness::start(objects(
        vec![
            volume("small", "1Gi", "ReadWriteOnce", "fast"),
            volume("big", "20Gi", "ReadWriteOnce", "fast"),
            volume("fit", "10Gi", "ReadWriteOnce", "fast"),
            volume("other-class", "5Gi", "ReadWriteOnce", "slow"),
        ],
        vec![claim("data", "5Gi", "ReadWriteOnce", Some("fast"))],
        vec![],
    ))
    .await;
    assert!(
        eventually(WAIT, || h.bound_to("data").as_deref() == Some("fit")).await,
        "{:?}",
        h.view.claim_state("default", "data")
    );
    assert_eq!(h.pv_phase("fit").as_deref(), Some("Bound"));
    assert_eq!(h.pv_phase("small").as_deref(), Some("Available"));
    assert_eq!(h.pv_phase("big").as_deref(), Some("Available"));
    let pvc = h.view.persistent_volume_claims().into_iter().next().unwrap();
    assert_eq!(pvc.spec.unwrap().volume_name.as_deref(), Some("fit"));
    assert_eq!(pvc.status.unwrap().capacity.unwrap()["storage"].0, "10Gi");
    let pv =
        h.view.persistent_volumes().into_iter().find(|v| v.metadata.name.as_deref() == Some("fit")).unwrap();
    assert_eq!(pv.spec.unwrap().claim_ref.unwrap().name.as_deref(), Some("data"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_larger_claim_stays_pending_and_says_why_until_a_volume_fits() {
    let h = Harness::start(objects(
        vec![volume("small", "1Gi", "ReadWriteOnce", "fast")],
        vec![claim("data", "5Gi", "ReadWriteOnce", Some("fast"))],
        vec![],
    ))
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.pvc_phase("data").as_deref(), Some("Pending"));
    let err = h.view.bound_volume("default", "data").unwrap_err().to_string();
    assert!(err.starts_with("persistentvolumeclaim \"data\" is not bound: "), "{err}");
    assert!(err.contains("of class \"fast\" with at least 5Gi"), "{err}");
    assert!(err.contains("the largest available one has 1Gi"), "{err}");
    assert!(
        h.view
            .events()
            .iter()
            .any(|e| e.name == "data" && e.type_ == "Warning" && e.reason == "FailedBinding")
    );
    // A matching volume appears: the claim binds.
    h.set(objects(
        vec![
            volume("small", "1Gi", "ReadWriteOnce", "fast"),
            volume("large", "8Gi", "ReadWriteOnce", "fast"),
        ],
        vec![claim("data", "5Gi", "ReadWriteOnce", Some("fast"))],
        vec![],
    ));
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("large")).await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn access_modes_class_and_node_affinity_are_honoured() {
    let mut elsewhere = volume("elsewhere", "5Gi", "ReadWriteOnce", "");
    elsewhere.spec.as_mut().unwrap().node_affinity = Some(serde_saphyr::from_str(
        "required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-b]}]}]}",
    ).unwrap());
    let mut here = volume("here", "6Gi", "ReadWriteOnce", "");
    here.spec.as_mut().unwrap().node_affinity = Some(serde_saphyr::from_str(
        "required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [node-a]}]}]}",
    ).unwrap());
    let h = Harness::start(objects(
        vec![
            elsewhere,
            here,
            volume("rwo-only", "1Gi", "ReadWriteOnce", ""),
            volume("shared", "2Gi", "\"ReadWriteOnce\", \"ReadWriteMany\"", ""),
            volume("classy", "1Gi", "ReadWriteOnce", "fast"),
            volume("pod-only", "1Gi", "ReadWriteOncePod", ""),
        ],
        vec![
            claim("rwx", "1Gi", "ReadWriteMany", Some("")),
            claim("local", "5Gi", "ReadWriteOnce", Some("")),
            claim("rwop", "1Gi", "ReadWriteOncePod", Some("")),
            claim("noclass", "1Gi", "ReadWriteOnce", Some("")),
        ],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("rwx").as_deref() == Some("shared")).await);
    assert!(eventually(WAIT, || h.bound_to("local").as_deref() == Some("here")).await);
    assert!(eventually(WAIT, || h.bound_to("rwop").as_deref() == Some("pod-only")).await);
    // "" binds only volumes without a class: not "classy".
    assert!(eventually(WAIT, || h.bound_to("noclass").as_deref() == Some("rwo-only")).await);
    assert_eq!(h.pv_phase("elsewhere").as_deref(), Some("Available"));
    assert_eq!(h.pv_phase("classy").as_deref(), Some("Available"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn volume_name_and_claim_ref_pre_binding() {
    let mut reserved = volume("reserved", "5Gi", "ReadWriteOnce", "");
    reserved.spec.as_mut().unwrap().claim_ref =
        Some(serde_saphyr::from_str("{namespace: default, name: owner}").unwrap());
    let mut by_name = claim("picky", "1Gi", "ReadWriteOnce", Some(""));
    by_name.spec.as_mut().unwrap().volume_name = Some("large".into());
    let h = Harness::start(objects(
        vec![
            reserved,
            volume("large", "50Gi", "ReadWriteOnce", ""),
            volume("tiny", "1Gi", "ReadWriteOnce", ""),
        ],
        vec![by_name, claim("other", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("picky").as_deref() == Some("large")).await);
    // "reserved" is pre-bound to "owner": "other" gets "tiny".
    assert!(eventually(WAIT, || h.bound_to("other").as_deref() == Some("tiny")).await);
    assert_eq!(h.pv_phase("reserved").as_deref(), Some("Available"));
    // The owner appears and gets its volume, though a smaller one would do.
    let mut reserved = volume("reserved", "5Gi", "ReadWriteOnce", "");
    reserved.spec.as_mut().unwrap().claim_ref =
        Some(serde_saphyr::from_str("{namespace: default, name: owner}").unwrap());
    let mut by_name = claim("picky", "1Gi", "ReadWriteOnce", Some(""));
    by_name.spec.as_mut().unwrap().volume_name = Some("large".into());
    h.set(objects(
        vec![
            reserved,
            volume("large", "50Gi", "ReadWriteOnce", ""),
            volume("tiny", "1Gi", "ReadWriteOnce", ""),
            volume("spare", "1Gi", "ReadWriteOnce", ""),
        ],
        vec![
            by_name,
            claim("other", "1Gi", "ReadWriteOnce", Some("")),
            claim("owner", "1Gi", "ReadWriteOnce", Some("")),
        ],
        vec![],
    ));
    assert!(eventually(WAIT, || h.bound_to("owner").as_deref() == Some("reserved")).await);
    assert_eq!(h.pv_phase("spare").as_deref(), Some("Available"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn deleted_claim_releases_its_volume_and_retain_keeps_it_out_of_circulation() {
    let h = Harness::start(objects(
        vec![volume("keep", "5Gi", "ReadWriteOnce", "")],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("keep")).await);
    h.set(objects(vec![volume("keep", "5Gi", "ReadWriteOnce", "")], vec![], vec![]));
    assert!(eventually(WAIT, || h.pv_phase("keep").as_deref() == Some("Released")).await);
    // A new claim does not get a Released volume, even one of the same name.
    h.set(objects(
        vec![volume("keep", "5Gi", "ReadWriteOnce", "")],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.pvc_phase("data").as_deref(), Some("Pending"));
    assert_eq!(h.pv_phase("keep").as_deref(), Some("Released"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn static_volume_with_delete_policy_and_no_deleter_fails() {
    let mut v = volume("gone", "5Gi", "ReadWriteOnce", "");
    v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
    let h = Harness::start(objects(
        vec![v.clone()],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").is_some()).await);
    h.set(objects(vec![v], vec![], vec![]));
    assert!(eventually(WAIT, || h.pv_phase("gone").as_deref() == Some("Failed")).await);
    let pv = h.view.persistent_volumes().pop().unwrap();
    assert!(pv.status.unwrap().message.unwrap().contains("no deletable volume plugin matched"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forged_provisioned_by_annotation_never_deletes_storage() {
    // A manifest volume claiming to be the fake provisioner's: the annotation alone must not get it deleted.
    let mut v = volume("forged", "5Gi", "ReadWriteOnce", "");
    v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
    v.metadata.annotations =
        Some([("pv.kubernetes.io/provisioned-by".to_owned(), "fake.example.com".to_owned())].into());
    let h = Harness::start(objects(
        vec![v.clone()],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").is_some()).await);
    h.set(objects(vec![v], vec![], vec![]));
    assert!(eventually(WAIT, || h.pv_phase("forged").as_deref() == Some("Failed")).await);
    let pv = h.view.persistent_volumes().pop().unwrap();
    let message = pv.status.unwrap().message.unwrap();
    assert!(message.contains("no provisioning record"), "{message}");
    assert!(h.provisioner.deleted.lock().unwrap().is_empty(), "the provisioner was asked to delete it");
    h.stop().await;
}

fn wffc_class(name: &str, provisioner: &str) -> StorageClass {
    class(&format!(
        "metadata: {{name: {name}}}\nprovisioner: {provisioner}\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: Delete\n"
    ))
}

#[tokio::test(start_paused = true)]
async fn wait_for_first_consumer_binds_only_once_a_pod_uses_the_claim() {
    let mut h = Harness::start(objects(
        vec![volume("lazy", "5Gi", "ReadWriteOnce", "late")],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some("late"))],
        vec![wffc_class("late", "kubernetes.io/no-provisioner")],
    ))
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let state = h.view.claim_state("default", "data").unwrap();
    assert_eq!(state.phase.as_str(), "Pending");
    assert_eq!(state.reason.as_deref(), Some("WaitForFirstConsumer"));
    assert_eq!(h.pv_phase("lazy").as_deref(), Some("Available"));
    h.add_pod_using("pod-1", "data");
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("lazy")).await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn dynamic_provisioning_then_delete_on_release() {
    let classes = vec![class(
        "metadata: {name: dyn, annotations: {storageclass.kubernetes.io/is-default-class: \"true\"}}\nprovisioner: fake.example.com\nreclaimPolicy: Delete\n",
    )];
    // No storageClassName: the default class applies.
    let h =
        Harness::start(objects(vec![], vec![claim("data", "3Gi", "ReadWriteOnce", None)], classes.clone()))
            .await;
    assert!(
        eventually(WAIT, || h.bound_to("data").is_some()).await,
        "{:?}",
        h.view.claim_state("default", "data")
    );
    let pv = h.view.bound_volume("default", "data").unwrap();
    let name = pv.metadata.name.clone().unwrap();
    assert!(name.starts_with("pvc-"));
    assert_eq!(pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0, "3Gi");
    assert_eq!(pv.spec.as_ref().unwrap().storage_class_name.as_deref(), Some("dyn"));
    assert_eq!(*h.provisioner.created.lock().unwrap(), vec![name.clone()]);
    h.set(objects(vec![], vec![], classes));
    assert!(eventually(WAIT, || h.provisioner.deleted.lock().unwrap().contains(&name)).await);
    assert!(eventually(WAIT, || h.view.persistent_volumes().is_empty()).await);
    assert!(eventually(WAIT, || h.view.actual().is_empty()).await, "{:?}", h.view.actual().entries());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn provisioning_failure_is_reported_and_retried() {
    let classes = vec![class("metadata: {name: dyn}\nprovisioner: fake.example.com\n")];
    let p = Arc::new(FakeProvisioner::default());
    *p.fail.lock().unwrap() = Some("out of space".into());
    let h = Harness::start_with(
        objects(vec![], vec![claim("data", "3Gi", "ReadWriteOnce", Some("dyn"))], classes),
        Arc::new(MemoryRecords::new()),
        p.clone(),
    )
    .await;
    assert!(
        eventually(WAIT, || h
            .view
            .claim_state("default", "data")
            .and_then(|s| s.message)
            .is_some_and(|m| m.contains("out of space")))
        .await
    );
    assert_eq!(h.view.claim_state("default", "data").unwrap().reason.as_deref(), Some("ProvisioningFailed"));
    *p.fail.lock().unwrap() = None;
    assert!(eventually(Duration::from_secs(600), || h.bound_to("data").is_some()).await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn unknown_provisioner_and_missing_class_say_why() {
    let h = Harness::start(objects(
        vec![],
        vec![
            claim("ext", "1Gi", "ReadWriteOnce", Some("ebs")),
            claim("nocls", "1Gi", "ReadWriteOnce", Some("ghost")),
        ],
        vec![class("metadata: {name: ebs}\nprovisioner: ebs.csi.aws.com\n")],
    ))
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ext = h.view.claim_state("default", "ext").unwrap();
    assert_eq!(ext.reason.as_deref(), Some("ExternalProvisioning"));
    assert!(ext.message.unwrap().contains("ebs.csi.aws.com"));
    let missing = h.view.bound_volume("default", "nocls").unwrap_err().to_string();
    assert!(missing.contains("storageclass.storage.k8s.io \"ghost\" not found"), "{missing}");
    assert_eq!(
        h.view.bound_volume("default", "nope").unwrap_err().to_string(),
        "persistentvolumeclaim \"nope\" not found"
    );
    h.stop().await;
}

/// A pair whose provisioner serves the names of a store of registered provisioners (as the daemon's
/// CSI provisioner serves the registered CSI drivers), whose node is labelled with their topology, and
/// whose engine watches that store through [`watch_provisioners`] (every claim and volume is planned
/// again for a provisioner with a topology, or one that went away, as the daemon does).
async fn with_registered_provisioners(
    objects: ClaimObjects,
    metrics: &reconcile_engine::Metrics,
) -> (Harness, Writer<String, Topology>) {
    let (registered, writer) = store::<String, Topology>();
    let provisioner =
        Arc::new(FakeProvisioner { registered: Some(registered.clone()), ..Default::default() });
    let labels = registered.clone();
    let node = NodeInfo::new(NODE).with_dynamic_labels(Arc::new(move || {
        let mut all = BTreeMap::new();
        labels.for_each(|_, topology| all.extend(topology.clone()));
        all
    }));
    let metrics = metrics.clone();
    let h =
        Harness::assemble(objects, Arc::new(MemoryRecords::new()), provisioner, node, |builder, desired| {
            watch_provisioners(
                builder.metrics(&metrics),
                "provisioners",
                desired,
                registered,
                |t: Option<&Topology>| t.is_none_or(|t| !t.is_empty()),
            )
        })
        .await;
    (h, writer)
}

/// `reconcile_engine_relation_wakeups_total` of the relation `provisioners`.
fn provisioner_wakeups(registry: &prometheus::Registry) -> u64 {
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("encode");
    text.lines()
        .filter(|l| {
            l.starts_with("reconcile_engine_relation_wakeups_total{")
                && l.contains("relation=\"provisioners\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_claim_waiting_for_its_provisioner_is_provisioned_once_it_registers() {
    let registry = prometheus::Registry::new();
    let metrics = reconcile_engine::Metrics::new(&registry).expect("metrics");
    let (h, mut registered) = with_registered_provisioners(
        objects(
            vec![],
            vec![
                claim("data", "1Gi", "ReadWriteOnce", Some("late")),
                claim("other", "1Gi", "ReadWriteOnce", Some("elsewhere")),
            ],
            vec![
                class("metadata: {name: late}\nprovisioner: late.example.com\n"),
                class("metadata: {name: elsewhere}\nprovisioner: other.example.com\n"),
            ],
        ),
        &metrics,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let state = h.view.claim_state("default", "data").expect("claim");
    assert_eq!(state.reason.as_deref(), Some("ExternalProvisioning"), "{state:?}");
    assert_eq!(provisioner_wakeups(&registry), 0);
    // The provisioner registers (without topology): the claim naming it is planned again at once,
    // not at the next resync (30 s), and only that claim.
    registered.insert("late.example.com".into(), Topology::new());
    assert!(
        eventually(Duration::from_secs(5), || h.bound_to("data").is_some()).await,
        "{:?}",
        h.view.claim_state("default", "data")
    );
    assert_eq!(h.provisioner.created.lock().unwrap().len(), 1);
    assert_eq!(provisioner_wakeups(&registry), 1, "only the claim whose class names it");
    assert_eq!(h.pvc_phase("other").as_deref(), Some("Pending"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_provisioner_with_a_topology_plans_every_claim_again() {
    let registry = prometheus::Registry::new();
    let metrics = reconcile_engine::Metrics::new(&registry).expect("metrics");
    // A volume only for nodes in zone a; the node is in no zone until a provisioner with that topology
    // registers.
    let mut zoned = volume("zoned", "5Gi", "ReadWriteOnce", "");
    zoned.spec.as_mut().unwrap().node_affinity = Some(
        serde_saphyr::from_str(
            "required: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}",
        )
        .expect("affinity"),
    );
    let (h, mut registered) = with_registered_provisioners(
        objects(vec![zoned], vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))], vec![]),
        &metrics,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.pvc_phase("data").as_deref(), Some("Pending"));
    assert_eq!(h.bound_to("data"), None);
    registered.insert("zonal.example.com".into(), Topology::from([("zone".to_owned(), "a".to_owned())]));
    assert!(
        eventually(Duration::from_secs(5), || h.bound_to("data").as_deref() == Some("zoned")).await,
        "{:?}",
        h.view.claim_state("default", "data")
    );
    assert!(provisioner_wakeups(&registry) >= 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn removed_volume_makes_its_claim_lost_and_restart_keeps_bindings() {
    let vols = vec![volume("a", "5Gi", "ReadWriteOnce", ""), volume("b", "5Gi", "ReadWriteOnce", "")];
    let claims = vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))];
    let h = Harness::start(objects(vols.clone(), claims.clone(), vec![])).await;
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("a")).await);
    let records = h.stop().await;
    // After a restart with the same records, the claim keeps its volume even if "b" sorts first now.
    let vols2 = vec![volume("0-first", "5Gi", "ReadWriteOnce", ""), volume("a", "5Gi", "ReadWriteOnce", "")];
    let h = Harness::start_with(
        objects(vols2, claims.clone(), vec![]),
        records,
        Arc::new(FakeProvisioner::default()),
    )
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("a")).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.pv_phase("0-first").as_deref(), Some("Available"));
    // The volume disappears: the claim is Lost.
    h.set(objects(vec![volume("0-first", "5Gi", "ReadWriteOnce", "")], claims.clone(), vec![]));
    assert!(eventually(WAIT, || h.pvc_phase("data").as_deref() == Some("Lost")).await);
    assert_eq!(
        h.view.bound_volume("default", "data").unwrap_err().to_string(),
        "persistentvolumeclaim \"data\" lost its volume \"a\""
    );
    // It comes back: Bound again.
    h.set(objects(
        vec![volume("0-first", "5Gi", "ReadWriteOnce", ""), volume("a", "5Gi", "ReadWriteOnce", "")],
        claims,
        vec![],
    ));
    assert!(eventually(WAIT, || h.bound_to("data").as_deref() == Some("a")).await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_in_use_outlives_its_manifest_and_invalid_objects_say_why() {
    let mut h = Harness::start(objects(
        vec![volume("v", "5Gi", "ReadWriteOnce", ""), volume("BAD_NAME", "5Gi", "ReadWriteOnce", "")],
        vec![
            claim("data", "1Gi", "ReadWriteOnce", Some("")),
            claim("broken", "1Gi", "ReadWriteOnce", Some("")),
        ]
        .into_iter()
        .map(|mut c| {
            if c.metadata.name.as_deref() == Some("broken") {
                c.spec.as_mut().unwrap().access_modes = Some(vec![]);
            }
            c
        })
        .collect(),
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").is_some()).await);
    h.add_pod_using("pod-1", "data");
    let broken = h.view.bound_volume("default", "broken").unwrap_err().to_string();
    assert!(broken.contains("at least 1 access mode is required"), "{broken}");
    let bad = h
        .view
        .persistent_volumes()
        .into_iter()
        .find(|v| v.metadata.name.as_deref() == Some("BAD_NAME"))
        .unwrap();
    assert_eq!(bad.status.unwrap().phase.as_deref(), Some("Pending"));
    h.set(objects(vec![volume("v", "5Gi", "ReadWriteOnce", "")], vec![], vec![]));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.bound_to("data").as_deref(), Some("v"));
    let pvc = h.view.persistent_volume_claims().into_iter().next().unwrap();
    assert_eq!(pvc.metadata.finalizers, Some(vec!["kubernetes.io/pvc-protection".to_owned()]));
    h.pods.remove(&"pod-1".to_owned());
    assert!(eventually(WAIT, || h.pv_phase("v").as_deref() == Some("Released")).await);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn binding_records_name_the_right_sides() {
    let h = Harness::start(objects(
        vec![volume("v", "5Gi", "ReadWriteOnce", "")],
        vec![claim("data", "1Gi", "ReadWriteOnce", Some(""))],
        vec![],
    ))
    .await;
    assert!(eventually(WAIT, || h.bound_to("data").is_some()).await);
    let actual: BTreeMap<ClaimKey, ClaimActual> =
        h.view.actual().entries().into_iter().map(|(k, v)| (k, (*v).clone())).collect();
    let ClaimActual::Volume(v) = &actual[&ClaimKey::Volume("v".into())] else { panic!() };
    let ClaimActual::Claim(c) = &actual[&ClaimKey::claim("default", "data")] else { panic!() };
    assert_eq!(v.claim_ref.as_ref().unwrap().uid, c.uid);
    assert!(matches!(
        h.view.desired().get(&ClaimKey::claim("default", "data")).as_deref(),
        Some(ClaimDesired::Claim(_))
    ));
    h.stop().await;
}
