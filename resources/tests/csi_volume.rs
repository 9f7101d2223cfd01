//! CSI volumes on the volume pair, with a fake CSI host and paused time: each device is attached
//! and staged once before any pod publishes from it, shared by every pod that uses it, and
//! unstaged and detached only after the last pod unpublished it; uncertain steps are repeated or
//! undone; reconstructed devices are torn down or taken over.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Volume};
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::model::volumes::VolumeReadiness;
use nodelet_resources::model::volumes::{BoundVolumeError, ClaimLookup};
use nodelet_resources::volume::actual::{DeviceActual, MountState, Step, VolumeActual};
use nodelet_resources::volume::desired::{
    CsiSource, DesiredVolume, RenderError, VolumeKey, VolumeSource, device_key, volume_key, volume_path,
};
use nodelet_resources::volume::driver::{VolumeDriver, VolumeError, VolumeHost};
use nodelet_resources::volume::metrics::VolumeMetrics;
use nodelet_resources::volume::ops::VolumeOp;
use nodelet_resources::volume::populator::{Populator, Renderer};
use nodelet_resources::volume::reconciler::{VolumeReconciler, related_volumes};
use nodelet_resources::volume::status::VolumeGate;
use reconcile_engine::testing::eventually;
use reconcile_engine::{CancellationToken, Engine, Store, Writer, store};

const LONG: Duration = Duration::from_secs(3600);
const ROOT: &str = "/nodelet-root";
const DRIVER: &str = "fake.csi.nodelet.dev";
const HANDLE: &str = "vol-1";

/// A CSI host in memory: records every step with its key, fails or turns uncertain on request.
#[derive(Default)]
struct FakeCsi {
    calls: Mutex<Vec<(&'static str, String)>>,
    /// Steps (by name) whose next calls are uncertain, with how many.
    uncertain: Mutex<BTreeMap<&'static str, u32>>,
    /// Teardowns of pod volumes fail while this is above zero (decremented per call).
    failing_tear_downs: AtomicU32,
    existing: Vec<(VolumeKey, VolumeActual)>,
}

impl FakeCsi {
    fn record(&self, method: &'static str, key: String) -> Result<(), VolumeError> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push((method, key));
        }
        let mut uncertain = self.uncertain.lock().map_err(|_| VolumeError::failed("poisoned"))?;
        match uncertain.get_mut(method) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(VolumeError::uncertain(format!("{method} timed out")))
            }
            _ => Ok(()),
        }
    }

    fn calls(&self) -> Vec<(&'static str, String)> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn methods(&self) -> Vec<&'static str> {
        self.calls().into_iter().map(|(m, _)| m).collect()
    }

    fn uncertain_next(&self, method: &'static str, times: u32) {
        if let Ok(mut u) = self.uncertain.lock() {
            u.insert(method, times);
        }
    }
}

fn context() -> BTreeMap<String, String> {
    BTreeMap::from([("devicePath".to_string(), "/dev/fake-1".to_string())])
}

impl VolumeHost for FakeCsi {
    async fn set_up(&self, volume: &DesiredVolume) -> Result<VolumeActual, VolumeError> {
        Err(VolumeError::failed(format!("{}: only CSI volumes here", volume.name)))
    }

    async fn tear_down(&self, key: &VolumeKey, _op: &VolumeOp) -> Result<(), VolumeError> {
        self.record("unpublish", key.clone())?;
        if self.failing_tear_downs.load(Ordering::SeqCst) > 0 {
            self.failing_tear_downs.fetch_sub(1, Ordering::SeqCst);
            return Err(VolumeError::uncertain(format!("{key}: target is busy")));
        }
        Ok(())
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        Ok(self.existing.clone())
    }

    async fn attach(&self, source: &CsiSource) -> Result<BTreeMap<String, String>, VolumeError> {
        self.record("attach", device_key(&source.driver, &source.volume_handle))?;
        Ok(context())
    }

    async fn stage(
        &self,
        source: &CsiSource,
        publish_context: &BTreeMap<String, String>,
    ) -> Result<Option<PathBuf>, VolumeError> {
        if *publish_context != context() {
            return Err(VolumeError::failed(format!(
                "stage without the publish context: {publish_context:?}"
            )));
        }
        self.record("stage", device_key(&source.driver, &source.volume_handle))?;
        Ok(Some(PathBuf::from(format!("{ROOT}/plugins/kubernetes.io/csi/{DRIVER}/h/globalmount"))))
    }

    async fn publish(
        &self,
        volume: &DesiredVolume,
        device_key: &VolumeKey,
        device: &DeviceActual,
    ) -> Result<VolumeActual, VolumeError> {
        if device.publish_context != context() || device.stage != Step::Done {
            return Err(VolumeError::failed(format!("publish from a device not ready: {device:?}")));
        }
        self.record("publish", volume.key())?;
        Ok(VolumeActual::published(
            volume_path(std::path::Path::new(ROOT), volume),
            device_key.clone(),
            MountState::Mounted,
        ))
    }

    async fn unstage(&self, device: &DeviceActual) -> Result<(), VolumeError> {
        self.record("unstage", device_key(&device.driver, &device.volume_handle))
    }

    async fn detach(&self, device: &DeviceActual) -> Result<(), VolumeError> {
        self.record("detach", device_key(&device.driver, &device.volume_handle))
    }
}

/// Every claim is bound to the same CSI PersistentVolume, unless the lookup is switched off.
#[derive(Default)]
struct OneVolume {
    unknown: std::sync::atomic::AtomicBool,
}

impl ClaimLookup for OneVolume {
    fn bound_volume(&self, _pod: &DesiredPod, claim: &str) -> Result<PersistentVolume, BoundVolumeError> {
        if self.unknown.load(Ordering::SeqCst) {
            return Err(BoundVolumeError::NotFound { claim: claim.to_owned() });
        }
        Ok(serde_saphyr::from_str(&format!(
            "metadata: {{name: pv-1}}\nspec:\n  accessModes: [ReadWriteOnce]\n  csi: {{driver: {DRIVER}, volumeHandle: {HANDLE}}}\n"
        ))
        .expect("test volume"))
    }
}

struct NoFiles;

impl Renderer for NoFiles {
    fn render(
        &self,
        _pod: &DesiredPod,
        volume: &Volume,
        _plugin: Plugin,
    ) -> Result<VolumeSource, RenderError> {
        Err(RenderError::new(std::io::Error::other(format!("volume {:?}: no files here", volume.name))))
    }
}

fn pod(uid: &str) -> DesiredPod {
    let yaml = format!(
        "metadata: {{name: p-{uid}, namespace: default, uid: {uid}}}\nspec:\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}\n  containers: [{{name: app, image: fake/app}}]\n"
    );
    let pod: Pod = serde_saphyr::from_str(&yaml).expect("test manifest");
    DesiredPod { pod, source: PodSource::Http }
}

struct Node {
    gate: VolumeGate,
    host: Arc<FakeCsi>,
    claims: Arc<OneVolume>,
    pods: Writer<PodUid, DesiredPod>,
    actual: Store<VolumeKey, VolumeActual>,
    // Kept so that the pod actual store stays open (no pod runs: volumes follow the pods).
    _pod_actual: Writer<PodUid, PodActual>,
}

fn node(host: FakeCsi) -> Node {
    let host = Arc::new(host);
    let (desired, volume_writer) = store();
    let builder = Engine::builder(
        "volumes",
        VolumeReconciler::new(ROOT),
        Arc::new(VolumeDriver::new(host.clone(), VolumeMetrics::unregistered())),
        desired.clone(),
    )
    .backoff(reconcile_engine::BackoffConfig::default().without_jitter());
    let own_actual = builder.actual();
    let related = related_volumes(desired.clone(), own_actual.clone());
    let engine = builder.watches("devices", own_actual, related).build();
    let actual = engine.actual();
    let gate = VolumeGate::new(desired, actual.clone());
    let (pod_store, mut pods) = store();
    pods.mark_synced();
    let (pod_actual_store, mut pod_actual) = store();
    pod_actual.mark_synced();
    let claims = Arc::new(OneVolume::default());
    let populator = Populator::new(pod_store, pod_actual_store, volume_writer, Arc::new(NoFiles))
        .with_claims(claims.clone());
    tokio::spawn(populator.run(tokio::sync::watch::channel(()).1, CancellationToken::new()));
    tokio::spawn(engine.run(std::future::pending()));
    Node { gate, host, claims, pods, actual, _pod_actual: pod_actual }
}

fn device() -> VolumeKey {
    device_key(DRIVER, HANDLE)
}

impl Node {
    fn mounted(&self, uid: &str) -> bool {
        self.actual.get(&volume_key(uid, "data")).is_some_and(|a| a.is_mounted())
    }
}

#[tokio::test(start_paused = true)]
async fn a_device_should_be_attached_and_staged_once_and_published_to_every_pod_that_uses_it() {
    let mut n = node(FakeCsi::default());
    n.pods.insert("u1".into(), pod("u1"));
    n.pods.insert("u2".into(), pod("u2"));
    assert!(eventually(LONG, || n.mounted("u1") && n.mounted("u2")).await);
    let methods = n.host.methods();
    assert_eq!(methods[..2], ["attach", "stage"], "{methods:?}");
    assert_eq!(methods[2..], ["publish", "publish"], "{methods:?}");
    let found = n.actual.get(&device()).expect("device in the actual state");
    assert!(found.is_mounted());
    assert_eq!(found.device().map(|d| (d.attach, d.stage)), Some((Step::Done, Step::Done)));
    assert_eq!(
        n.actual.get(&volume_key("u1", "data")).and_then(|a| a.published_from().cloned()),
        Some(device())
    );
}

#[tokio::test(start_paused = true)]
async fn a_device_should_be_unstaged_and_detached_only_after_the_last_pod_unpublished_it() {
    let mut n = node(FakeCsi::default());
    n.pods.insert("u1".into(), pod("u1"));
    n.pods.insert("u2".into(), pod("u2"));
    assert!(eventually(LONG, || n.mounted("u1") && n.mounted("u2")).await);

    n.pods.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&volume_key("u1", "data")).is_none()).await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after_first: Vec<_> = n.host.methods().into_iter().skip(4).collect();
    assert_eq!(after_first, ["unpublish"], "the device must stay while u2 uses it");
    assert!(n.actual.get(&device()).is_some_and(|d| d.is_mounted()));

    n.pods.remove(&"u2".to_string());
    assert!(eventually(LONG, || n.actual.is_empty()).await);
    let after_second: Vec<_> = n.host.methods().into_iter().skip(5).collect();
    assert_eq!(after_second, ["unpublish", "unstage", "detach"]);
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_stage_should_be_repeated_before_any_publish() {
    let host = FakeCsi::default();
    host.uncertain_next("stage", 2);
    let mut n = node(host);
    n.pods.insert("u1".into(), pod("u1"));
    assert!(eventually(LONG, || n.mounted("u1")).await);
    assert_eq!(n.host.methods(), ["attach", "stage", "stage", "stage", "publish"]);
}

#[tokio::test(start_paused = true)]
async fn a_device_should_wait_while_a_pod_volume_cannot_be_unpublished() {
    let host = FakeCsi::default();
    host.failing_tear_downs.store(3, Ordering::SeqCst);
    let mut n = node(host);
    n.pods.insert("u1".into(), pod("u1"));
    assert!(eventually(LONG, || n.mounted("u1")).await);
    n.pods.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.is_empty()).await);
    let teardown: Vec<_> = n.host.methods().into_iter().skip(3).collect();
    assert_eq!(teardown, ["unpublish", "unpublish", "unpublish", "unpublish", "unstage", "detach"]);
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_attach_of_a_device_nobody_needs_any_more_should_still_be_detached() {
    let host = FakeCsi::default();
    // Every attach times out: nobody knows whether the device is attached to the node.
    host.uncertain_next("attach", u32::MAX);
    let mut n = node(host);
    n.pods.insert("u1".into(), pod("u1"));
    assert!(eventually(LONG, || n.actual.get(&device()).is_some()).await);
    assert_eq!(n.actual.get(&device()).and_then(|d| d.device().map(|d| d.attach)), Some(Step::Uncertain));
    // The pod says what it waits for.
    match n.gate.check(&pod("u1")) {
        VolumeReadiness::Waiting(why) => assert_eq!(
            why,
            format!(
                "volume \"data\": waiting for persistentvolume \"pv-1\" to be attached by CSI driver \"{DRIVER}\""
            )
        ),
        other => panic!("{other:?}"),
    }
    n.pods.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.is_empty()).await);
    let methods = n.host.methods();
    assert_eq!(methods.last(), Some(&"detach"), "{methods:?}");
    assert!(methods[..methods.len() - 1].iter().all(|m| *m == "attach"), "{methods:?}");
}

fn reconstructed() -> Vec<(VolumeKey, VolumeActual)> {
    let published = VolumeActual::published(
        PathBuf::from(format!("{ROOT}/pods/u1/volumes/kubernetes.io~csi/data/mount")),
        device(),
        MountState::Mounted,
    );
    let device_actual = VolumeActual::of_device(
        DeviceActual::new(DRIVER, HANDLE, Step::Uncertain),
        PathBuf::from(format!("{ROOT}/plugins/kubernetes.io/csi/{DRIVER}/h/globalmount")),
    );
    vec![(volume_key("u1", "data"), published), (device(), device_actual)]
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_a_device_nobody_needs_should_be_unpublished_unstaged_and_detached_in_order() {
    let n = node(FakeCsi { existing: reconstructed(), ..FakeCsi::default() });
    assert!(eventually(LONG, || n.host.methods().contains(&"detach")).await);
    assert_eq!(n.host.methods(), ["unpublish", "unstage", "detach"]);
    assert!(eventually(LONG, || n.actual.is_empty()).await);
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_a_device_still_needed_should_be_attached_and_staged_again_but_not_republished() {
    let mut n = node(FakeCsi { existing: reconstructed(), ..FakeCsi::default() });
    n.pods.insert("u1".into(), pod("u1"));
    assert!(eventually(LONG, || n.actual.get(&device()).is_some_and(|d| d.is_mounted())).await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    // Attach again for the publish context (idempotent), stage again to be sure; the pod's
    // mount was found in place and is left alone.
    assert_eq!(n.host.methods(), ["attach", "stage"]);
    assert!(n.mounted("u1"));
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_cannot_be_looked_up_any_more_takes_nothing_from_a_pod_that_uses_it() {
    let mut n = node(FakeCsi::default());
    n.pods.insert("u1".into(), pod("u1"));
    assert!(eventually(LONG, || n.mounted("u1")).await);
    // The claim disappears from view (deleted while in use, or not loaded yet).
    n.claims.unknown.store(true, Ordering::SeqCst);
    n.pods.insert("u2".into(), pod("u2"));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(n.mounted("u1"));
    assert_eq!(n.host.methods(), ["attach", "stage", "publish"], "nothing torn down, nothing new set up");
    // The pod goes: now its volume does.
    n.pods.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.is_empty()).await);
    assert_eq!(n.host.methods()[3..], ["unpublish", "unstage", "detach"]);
}

#[tokio::test(start_paused = true)]
async fn a_pod_volume_and_its_device_should_wake_each_other_without_polling() {
    let mut n = node(FakeCsi::default());
    n.pods.insert("u1".into(), pod("u1"));
    // The fake steps take no (virtual) time: the publish follows the stage at once (the volume
    // engine's relation on its actual store), not after a poll period or the 30 s resync.
    assert!(eventually(Duration::from_millis(20), || n.mounted("u1")).await);
    n.pods.remove(&"u1".to_string());
    // And the unstage follows the last unpublish at once.
    assert!(eventually(Duration::from_millis(20), || n.actual.is_empty()).await);
    assert_eq!(n.host.methods(), ["attach", "stage", "publish", "unpublish", "unstage", "detach"]);
}
