//! The image pair on a fake runtime, with paused time: the populator's batch decision becomes one
//! removal per image, images in use or pinned stay, a pod that appears after the decision keeps its
//! image, and a request to free space is answered with the bytes freed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodelet_resources::common::clock::Clock;
use nodelet_resources::common::events::NodeEvents;
use nodelet_resources::eviction::signal::BoxFuture;
use nodelet_resources::image::actual::ImageId;
use nodelet_resources::image::desired::DesiredImage;
use nodelet_resources::image::driver::{
    ContainerImage, ImageDriver, ImageFs, ImageGcDriver, ImageGcError, RuntimeImage,
};
use nodelet_resources::image::metrics::ImageGcMetrics;
use nodelet_resources::image::plan::ImageGcPolicy;
use nodelet_resources::image::populator::{ImagePopulator, ImageStores};
use nodelet_resources::image::reconciler::{ImageReconciler, PodImages, removals_on_pod_change};
use nodelet_resources::image::status::{FreeSpace, free_space};
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use reconcile_engine::testing::eventually;
use reconcile_engine::{BackoffConfig, CancellationToken, Engine, Store, Writer, store};

const MI: u64 = 1 << 20;
const LONG: Duration = Duration::from_secs(3600);

fn clock() -> Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || {
        1_700_000_000_000_000_000 + i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    })
}

fn image(id: &str, tag: &str, size: u64) -> RuntimeImage {
    RuntimeImage { id: id.into(), tags: vec![tag.into()], digests: vec![], size, pinned: false }
}

fn pod(uid: &str, image: &str) -> DesiredPod {
    let pod = serde_json::json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "app", "image": image}]}
    });
    let pod: Pod = serde_json::from_value(pod).unwrap_or_default();
    DesiredPod { pod, source: PodSource::Http }
}

/// A runtime's images in memory; removal can fail on request.
#[derive(Default)]
struct FakeImages {
    images: Mutex<Vec<RuntimeImage>>,
    containers: Mutex<Vec<ContainerImage>>,
    fs: Mutex<ImageFs>,
    removed: Mutex<Vec<String>>,
    fail_removes: AtomicU32,
}

impl FakeImages {
    fn removed(&self) -> Vec<String> {
        self.removed.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl ImageGcDriver for FakeImages {
    fn list_images(&self) -> BoxFuture<'_, Result<Vec<RuntimeImage>, ImageGcError>> {
        let images = self.images.lock().map(|i| i.clone()).unwrap_or_default();
        Box::pin(std::future::ready(Ok(images)))
    }

    fn list_containers(&self) -> BoxFuture<'_, Result<Vec<ContainerImage>, ImageGcError>> {
        let containers = self.containers.lock().map(|c| c.clone()).unwrap_or_default();
        Box::pin(std::future::ready(Ok(containers)))
    }

    fn image_fs(&self) -> BoxFuture<'_, Result<ImageFs, ImageGcError>> {
        let fs = self.fs.lock().map(|f| *f).unwrap_or_default();
        Box::pin(std::future::ready(Ok(fs)))
    }

    fn remove_image(&self, id: &str) -> BoxFuture<'_, Result<(), ImageGcError>> {
        if self.fail_removes.load(Ordering::SeqCst) > 0 {
            self.fail_removes.fetch_sub(1, Ordering::SeqCst);
            return Box::pin(std::future::ready(Err(ImageGcError("image is busy".into()))));
        }
        let mut images = self.images.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let size = images.iter().find(|i| i.id == id).map_or(0, |i| i.size);
        images.retain(|i| i.id != id);
        let mut fs = self.fs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        fs.available += size;
        if let Ok(mut r) = self.removed.lock() {
            r.push(id.to_owned());
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

struct Pair {
    runtime: Arc<FakeImages>,
    pods: Writer<PodUid, DesiredPod>,
    _pods_actual: Writer<PodUid, PodActual>,
    image_desired: Store<ImageId, DesiredImage>,
    free: FreeSpace,
    metrics: ImageGcMetrics,
    events: NodeEvents,
    stop: CancellationToken,
}

/// The pair over `images` on a 100 MiB filesystem with `available` free; GC every `period`.
fn start(images: Vec<RuntimeImage>, available: u64, period: Duration) -> Pair {
    let runtime = Arc::new(FakeImages::default());
    *runtime.images.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = images;
    *runtime.fs.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
        ImageFs { capacity: 100 * MI, available };
    let (pods_desired, pods) = store::<PodUid, DesiredPod>();
    let (pods_actual, pods_actual_w) = store::<PodUid, PodActual>();
    let pod_images = PodImages { desired: pods_desired, actual: pods_actual };
    let policy = ImageGcPolicy { minimum_age: Duration::from_secs(60), ..ImageGcPolicy::default() };
    let clock = clock();
    let events = NodeEvents::new();
    let metrics = ImageGcMetrics::unregistered().unwrap_or_else(|e| panic!("{e}"));
    let pinned = vec!["localhost/pause:1".to_owned()];
    let (image_desired, writer) = store();
    let mut engine = Engine::builder(
        "images",
        ImageReconciler::new(pinned.clone(), policy.minimum_age),
        Arc::new(ImageDriver::new(runtime.clone(), metrics.clone(), events.clone(), clock.clone())),
        image_desired.clone(),
    )
    .wall_clock(nodelet_resources::common::clock::wall_clock(&clock))
    .backoff(BackoffConfig::default().without_jitter().with_initial(Duration::from_secs(10)))
    .watches("pods-desired", pod_images.desired.clone(), removals_on_pod_change(image_desired.clone()))
    .watches("pods-actual", pod_images.actual.clone(), removals_on_pod_change(image_desired.clone()))
    .build_with(pod_images.clone());
    let (free, requests) = free_space();
    let populator = ImagePopulator::new(
        policy,
        runtime.clone(),
        pod_images.clone(),
        ImageStores {
            desired: writer,
            actual: engine.actual(),
            observer: engine.observer(),
            failures: engine.op_status(),
        },
        requests,
        events.clone(),
        clock,
    )
    .with_pinned(pinned)
    .with_settle(Duration::from_secs(5));
    let stop = CancellationToken::new();
    tokio::spawn(populator.run(period, stop.clone().cancelled_owned()));
    let s = stop.clone();
    tokio::spawn(async move { engine.run(s.cancelled_owned()).await });
    Pair { runtime, pods, _pods_actual: pods_actual_w, image_desired, free, metrics, events, stop }
}

#[tokio::test(start_paused = true)]
async fn above_the_high_threshold_unused_images_go_until_the_low_threshold() {
    let images = vec![
        image("old", "r/old:1", 3 * MI),
        image("used", "r/used:1", 50 * MI),
        image("pause", "localhost/pause:1", 10 * MI),
        image("newer", "r/newer:1", 3 * MI),
        image("other", "r/other:1", 3 * MI),
    ];
    // 90% used: 5 MiB must go to reach 80%... once the images are older than the minimum age.
    let mut p = start(images, 15 * MI, Duration::from_secs(30));
    p.pods.insert("u1".into(), pod("u1", "r/used:1"));
    p.pods.mark_synced();
    // Any container in the runtime (of any pod, any state) keeps its image.
    p.runtime.containers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(ContainerImage {
        image: "r/other:1".into(),
        image_ref: "other".into(),
        created_at: 1_700_000_010_000_000_000,
        running: false,
    });
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(p.runtime.removed().is_empty(), "nothing before the minimum age");
    assert!(eventually(LONG, || p.runtime.removed().len() == 2).await, "{:?}", p.runtime.removed());
    // One operation per image, in any order; never one in use or pinned.
    let mut removed = p.runtime.removed();
    removed.sort();
    assert_eq!(removed, ["newer", "old"]);
    assert_eq!(p.metrics.collected.with_label_values(&["space"]).get(), 2);
    // Until the images were old enough, nothing could be freed: warned. Then 5 MiB were needed and 6
    // freed: no more warnings, and nothing more goes.
    let warnings = |p: &Pair| {
        p.events.list().iter().filter(|e| e.reason == "FreeDiskSpaceFailed").map(|e| e.count).sum::<u32>()
    };
    let before = warnings(&p);
    assert!(before >= 1);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(p.runtime.removed().len(), 2);
    assert_eq!(warnings(&p), before);
    p.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_appears_after_the_decision_keeps_its_image() {
    let images = vec![image("v2", "docker.io/library/busybox:v2", 20 * MI)];
    let mut p = start(images, 5 * MI, Duration::from_secs(30));
    p.pods.mark_synced();
    // The first removal fails: the image is decided `Remove` and its removal waits in back-off.
    p.runtime.fail_removes.store(1, Ordering::SeqCst);
    let decided = |p: &Pair| {
        p.image_desired.get(&"v2".to_owned()).as_deref()
            == Some(&DesiredImage::Remove(nodelet_resources::image::plan::Reason::Space))
    };
    assert!(eventually(LONG, || decided(&p) && p.runtime.fail_removes.load(Ordering::SeqCst) == 0).await);
    assert!(p.events.list().iter().any(|e| e.reason == "ImageGCFailed"), "{:?}", p.events.list());
    // Before the retry, a pod naming the image appears: the reconciler plans nothing for it.
    p.pods.insert("u1".into(), pod("u1", "busybox:v2"));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(p.runtime.removed().is_empty(), "the image stays");
    assert_eq!(p.image_desired.get(&"v2".to_owned()).as_deref(), Some(&DesiredImage::Keep));
    // The pod goes: the image is collected again.
    p.pods.remove(&"u1".to_owned());
    assert!(eventually(LONG, || p.runtime.removed() == ["v2"]).await);
    p.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_request_frees_bytes_oldest_used_first_and_reports_them() {
    let images = vec![image("a", "r/a:1", 3 * MI), image("b", "r/b:1", 4 * MI), image("c", "r/c:1", 5 * MI)];
    // Plenty of room: periodic passes remove nothing.
    let mut p = start(images, 90 * MI, Duration::from_secs(300));
    p.pods.mark_synced();
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(p.runtime.removed().is_empty());
    let freed = p.free.free(Some(6 * MI), Duration::from_secs(60)).await;
    assert_eq!(freed, Ok(7 * MI), "a then b (equally old: by ID) cover 6 MiB");
    // Which images, not in what order: the engine runs the two removals at once.
    let mut removed = p.runtime.removed();
    removed.sort();
    assert_eq!(removed, ["a", "b"]);
    // Everything unused.
    assert_eq!(p.free.free(None, Duration::from_secs(60)).await, Ok(5 * MI));
    let mut removed = p.runtime.removed();
    removed.sort();
    assert_eq!(removed, ["a", "b", "c"]);
    p.stop.cancel();
}
