//! The volume pair with the pod pair on fakes, with paused time: pods wait for their volumes,
//! volumes outlive the containers that use them, content updates reach set-up volumes,
//! uncertain setups are cleaned up, reconstruction avoids double setups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use nodelet_resources::common::clock::Clock;
use nodelet_resources::fake::FakeRuntime;
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::model::volumes::VolumeReadiness;
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::pleg::{DEFAULT_RELIST_PERIOD, Pleg};
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodInputs, PodReconciler};
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use nodelet_resources::volume::actual::{MountState, VolumeActual};
use nodelet_resources::volume::desired::{
    DesiredVolume, FileEntry, FileSet, RenderError, VolumeKey, VolumeSource, volume_path,
};
use nodelet_resources::volume::driver::{VolumeDriver, VolumeError, VolumeHost};
use nodelet_resources::volume::metrics::VolumeMetrics;
use nodelet_resources::volume::ops::VolumeOp;
use nodelet_resources::volume::populator::{Populator, Renderer};
use nodelet_resources::volume::reconciler::{VolumeReconciler, pod_of_volume, related_volumes};
use nodelet_resources::volume::status::VolumeGate;
use reconcile_engine::testing::eventually;
use reconcile_engine::{Engine, Store, Writer, store};

const LONG: Duration = Duration::from_secs(3600);
const ROOT: &str = "/nodelet-root";

fn pod(uid: &str, yaml: &str) -> DesiredPod {
    let mut pod: Pod = serde_saphyr::from_str(yaml).expect("test manifest");
    pod.metadata.uid = Some(uid.to_string());
    DesiredPod { pod, source: PodSource::Http }
}

fn clock() -> Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || {
        1_700_000_000_000_000_000 + i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    })
}

/// One recorded host call.
#[derive(Debug, Clone)]
struct HostCall {
    method: &'static str,
    key: String,
    at: i64,
}

/// A host that sets volumes up in memory, slowly if asked, failing or uncertain on request.
struct FakeHost {
    clock: Clock,
    delay: Duration,
    calls: Mutex<Vec<HostCall>>,
    uncertain_next: AtomicU32,
    existing: Vec<(VolumeKey, VolumeActual)>,
}

impl FakeHost {
    fn new(clock: Clock, delay: Duration) -> Self {
        Self {
            clock,
            delay,
            calls: Mutex::new(Vec::new()),
            uncertain_next: AtomicU32::new(0),
            existing: Vec::new(),
        }
    }

    fn calls(&self) -> Vec<HostCall> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn calls_of(&self, method: &str) -> Vec<HostCall> {
        self.calls().into_iter().filter(|c| c.method == method).collect()
    }

    fn record(&self, method: &'static str, key: String) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(HostCall { method, key, at: (self.clock)() });
        }
    }
}

impl VolumeHost for FakeHost {
    async fn set_up(&self, volume: &DesiredVolume) -> Result<VolumeActual, VolumeError> {
        tokio::time::sleep(self.delay).await;
        self.record("set_up", volume.key());
        if self.uncertain_next.load(Ordering::SeqCst) > 0 {
            self.uncertain_next.fetch_sub(1, Ordering::SeqCst);
            return Err(VolumeError::uncertain(format!("volume {:?}: mount timed out", volume.name)));
        }
        let source = volume.source.as_ref().map_err(|e| VolumeError::failed(e.to_string()))?;
        Ok(VolumeActual {
            plugin: volume.plugin,
            path: volume_path(Path::new(ROOT), volume),
            state: MountState::Mounted,
            digest: source.digest().map(str::to_owned),
            tmpfs: false,
            csi: None,
        })
    }

    async fn tear_down(&self, key: &VolumeKey, _op: &VolumeOp) -> Result<(), VolumeError> {
        self.record("tear_down", key.clone());
        Ok(())
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        Ok(self.existing.clone())
    }
}

/// Renders configMap volumes from a shared map of config maps (name → content).
#[derive(Default)]
struct MapRenderer {
    maps: Mutex<BTreeMap<String, String>>,
}

impl Renderer for MapRenderer {
    fn render(
        &self,
        _pod: &DesiredPod,
        volume: &Volume,
        plugin: Plugin,
    ) -> Result<VolumeSource, RenderError> {
        let name = volume.config_map.as_ref().map(|c| c.name.clone()).unwrap_or_default();
        let maps = self.maps.lock().expect("lock");
        let content = maps.get(&name).ok_or_else(|| {
            RenderError::new(std::io::Error::other(format!(
                "volume {:?}: configmap {name:?} not found",
                volume.name
            )))
        })?;
        let files = FileSet::from([(
            "data".into(),
            FileEntry { data: content.clone().into_bytes().into(), mode: 0o644 },
        )]);
        Ok(VolumeSource::files(plugin, files))
    }
}

struct Node {
    runtime: Arc<FakeRuntime>,
    host: Arc<FakeHost>,
    renderer: Arc<MapRenderer>,
    refresh: tokio::sync::watch::Sender<()>,
    pods: Writer<PodUid, DesiredPod>,
    pod_actual: Store<PodUid, PodActual>,
    volumes: Store<VolumeKey, DesiredVolume>,
    volume_actual: Store<VolumeKey, VolumeActual>,
    gate: VolumeGate,
}

fn node_with(host: FakeHost, clock: Clock) -> Node {
    let runtime = Arc::new(FakeRuntime::new(clock.clone()));
    let host = Arc::new(host);
    let renderer = Arc::new(MapRenderer::default());
    let (volumes, volume_writer) = store();
    let volume_builder = Engine::builder(
        "volumes",
        VolumeReconciler::new(ROOT),
        Arc::new(VolumeDriver::new(host.clone(), VolumeMetrics::unregistered())),
        volumes.clone(),
    )
    .backoff(reconcile_engine::BackoffConfig::default().without_jitter());
    let own_actual = volume_builder.actual();
    let related = related_volumes(volumes.clone(), own_actual.clone());
    let volume_engine = volume_builder.watches("devices", own_actual, related).build();
    let volume_actual = volume_engine.actual();
    let gate = VolumeGate::new(volumes.clone(), volume_actual.clone());

    let (desired, mut pods) = store();
    pods.mark_synced();
    let builder = Engine::builder(
        "pods",
        PodReconciler::new(CrashLoopBackOff::default()),
        Arc::new(PodDriver::new(runtime.clone(), PodMetrics::unregistered())),
        desired.clone(),
    )
    .wall_clock(nodelet_resources::common::clock::wall_clock(&clock));
    let mut sandboxes = SandboxPair::new(
        runtime.clone(),
        builder.actual(),
        SandboxMetrics::unregistered(),
        None,
        SandboxPairConfig {
            backoff: reconcile_engine::BackoffConfig::default().without_jitter(),
            volumes: Some((volumes.clone(), volume_actual.clone())),
            ..SandboxPairConfig::default()
        },
    );
    let inputs =
        PodInputs { volumes: Some(gate.clone()), sandboxes: Some(sandboxes.view()), ..PodInputs::default() };
    let mut engine = builder
        .backoff(reconcile_engine::BackoffConfig::default().without_jitter())
        .watches("volumes", volume_actual.clone(), pod_of_volume)
        .watches("sandboxes", sandboxes.actual(), nodelet_resources::sandbox::status::pod_of_sandboxes)
        .waits_for("sandboxes", sandboxes.actual())
        .build_with(inputs);
    let pod_actual = engine.actual();
    let pleg = Pleg::new(
        runtime.clone(),
        pod_actual.clone(),
        engine.observer(),
        DEFAULT_RELIST_PERIOD,
        PodMetrics::unregistered(),
    )
    .with_sandboxes(sandboxes.actual(), sandboxes.observer());
    let (sandbox_engine, sandbox_tasks) =
        sandboxes.start(desired.clone(), reconcile_engine::CancellationToken::new());
    tokio::spawn(sandbox_engine);
    for task in sandbox_tasks {
        tokio::spawn(task.future);
    }
    let (refresh, refresh_rx) = tokio::sync::watch::channel(());
    let populator = Populator::new(desired, pod_actual.clone(), volume_writer, renderer.clone());
    tokio::spawn(populator.run(refresh_rx, reconcile_engine::CancellationToken::new()));
    tokio::spawn(volume_engine.run(std::future::pending()));
    tokio::spawn(engine.run(std::future::pending()));
    tokio::spawn(pleg.run(std::future::pending()));
    Node { runtime, host, renderer, refresh, pods, pod_actual, volumes, volume_actual, gate }
}

impl Node {
    fn add(&mut self, pod: DesiredPod) {
        self.pods.insert(pod.uid().to_string(), pod);
    }

    fn running(&self, uid: &str) -> bool {
        self.pod_actual.get(&uid.to_string()).is_some_and(|a| a.any_running())
    }
}

const SHARED: &str = r#"
metadata: {name: shared, namespace: default}
spec:
  terminationGracePeriodSeconds: 20
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: cfg, configMap: {name: app}}
  containers:
  - name: app
    image: fake/ignore-term
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: cfg, mountPath: /cfg}
"#;

#[tokio::test(start_paused = true)]
async fn containers_should_start_only_once_all_volumes_are_set_up_and_get_their_paths() {
    let clock = clock();
    let mut n = node_with(FakeHost::new(clock.clone(), Duration::from_secs(5)), clock);
    n.renderer.maps.lock().expect("lock").insert("app".into(), "v1".into());
    n.add(pod("u1", SHARED));
    assert!(eventually(LONG, || n.running("u1")).await);
    let set_ups = n.host.calls_of("set_up");
    let sandbox = n.runtime.calls_of("run_sandbox");
    assert_eq!(set_ups.len(), 2, "{set_ups:?}");
    assert!(set_ups.iter().all(|s| s.at <= sandbox[0].at), "sandbox before volumes: {set_ups:?} {sandbox:?}");
    let start = &n.runtime.calls_of("start_container")[0];
    assert_eq!(
        start.volumes,
        vec![
            ("cfg".to_string(), PathBuf::from("/nodelet-root/pods/u1/volumes/kubernetes.io~configmap/cfg")),
            (
                "scratch".to_string(),
                PathBuf::from("/nodelet-root/pods/u1/volumes/kubernetes.io~empty-dir/scratch")
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_config_map_should_hold_the_pod_with_a_reason_until_it_appears() {
    let clock = clock();
    let mut n = node_with(FakeHost::new(clock.clone(), Duration::ZERO), clock);
    n.add(pod("u1", SHARED));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(n.runtime.calls_of("run_sandbox").is_empty());
    let desired = pod("u1", SHARED);
    match n.gate.check(&desired) {
        VolumeReadiness::Waiting(why) => assert!(why.contains("configmap \"app\" not found"), "{why}"),
        ready => panic!("pod not held: {ready:?}"),
    }
    // The other volume is set up meanwhile; the config map arrives: the pod starts.
    assert_eq!(n.host.calls_of("set_up").len(), 1);
    n.renderer.maps.lock().expect("lock").insert("app".into(), "v1".into());
    n.refresh.send_replace(());
    assert!(eventually(LONG, || n.running("u1")).await);
}

#[tokio::test(start_paused = true)]
async fn a_config_map_update_should_reach_the_set_up_volume_without_restarting_the_container() {
    let clock = clock();
    let mut n = node_with(FakeHost::new(clock.clone(), Duration::ZERO), clock);
    n.renderer.maps.lock().expect("lock").insert("app".into(), "v1".into());
    n.add(pod("u1", SHARED));
    assert!(eventually(LONG, || n.running("u1")).await);
    let key = "u1/cfg".to_string();
    let before = n.volume_actual.get(&key).and_then(|a| a.digest.clone());
    n.renderer.maps.lock().expect("lock").insert("app".into(), "v2".into());
    n.refresh.send_replace(());
    assert!(eventually(LONG, || n.volume_actual.get(&key).and_then(|a| a.digest.clone()) != before).await);
    let desired = n.volumes.get(&key).and_then(|d| d.source.clone().ok()).expect("desired");
    assert_eq!(n.volume_actual.get(&key).and_then(|a| a.digest.clone()).as_deref(), desired.digest());
    assert_eq!(n.host.calls_of("set_up").iter().filter(|c| c.key == key).count(), 2);
    assert_eq!(n.runtime.calls_of("start_container").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn volumes_should_be_torn_down_only_after_the_containers_are_gone() {
    let clock = clock();
    let mut n = node_with(FakeHost::new(clock.clone(), Duration::ZERO), clock);
    n.renderer.maps.lock().expect("lock").insert("app".into(), "v1".into());
    n.add(pod("u1", SHARED));
    assert!(eventually(LONG, || n.running("u1")).await);
    n.pods.remove(&"u1".to_string());
    // The container ignores SIGTERM: it runs for the 20 s grace period, its volumes stay.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(n.host.calls_of("tear_down").is_empty());
    assert_eq!(n.volume_actual.len(), 2);
    assert!(eventually(LONG, || n.volume_actual.is_empty()).await);
    let stopped = n.runtime.calls_of("stop_container")[0].at;
    let teardowns = n.host.calls_of("tear_down");
    assert_eq!(teardowns.len(), 2);
    assert!(
        teardowns.iter().all(|t| t.at >= stopped + 20_000_000_000),
        "torn down under a running container: {teardowns:?}"
    );
    assert!(n.volumes.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_uncertain_setup_should_be_retried_and_cleaned_up_if_the_pod_goes_away() {
    let clock = clock();
    let host = FakeHost::new(clock.clone(), Duration::ZERO);
    host.uncertain_next.store(1, Ordering::SeqCst);
    let mut n = node_with(host, clock);
    n.add(pod("u1", "metadata: {name: p}\nspec:\n  volumes: [{name: s, emptyDir: {}}]\n  containers: [{name: c, image: busybox}]\n"));
    assert!(eventually(LONG, || n.running("u1")).await);
    assert_eq!(n.host.calls_of("set_up").len(), 2, "retried after the uncertain result");
    // An uncertain setup of a pod that goes away before it is retried is torn down.
    n.host.uncertain_next.store(10, Ordering::SeqCst);
    n.add(pod("u2", "metadata: {name: q}\nspec:\n  volumes: [{name: s, emptyDir: {}}]\n  containers: [{name: c, image: busybox}]\n"));
    assert!(
        eventually(LONG, || n
            .volume_actual
            .get(&"u2/s".to_string())
            .is_some_and(|a| a.state == MountState::Uncertain))
        .await
    );
    n.pods.remove(&"u2".to_string());
    assert!(eventually(LONG, || n.volume_actual.get(&"u2/s".to_string()).is_none()).await);
    assert!(n.host.calls_of("tear_down").iter().any(|c| c.key == "u2/s"));
    assert!(n.runtime.calls_of("run_sandbox").iter().all(|c| c.target != "u2"));
}

#[tokio::test(start_paused = true)]
async fn reconstructed_volumes_should_not_be_set_up_twice_and_orphans_should_be_torn_down() {
    let clock = clock();
    let mut host = FakeHost::new(clock.clone(), Duration::ZERO);
    let mounted = |uid: &str, name: &str| VolumeActual {
        plugin: Plugin::EmptyDir,
        path: PathBuf::from(format!("{ROOT}/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}")),
        state: MountState::Mounted,
        digest: None,
        tmpfs: false,
        csi: None,
    };
    host.existing = vec![("u1/s".into(), mounted("u1", "s")), ("gone/s".into(), mounted("gone", "s"))];
    let mut n = node_with(host, clock);
    n.add(pod("u1", "metadata: {name: p}\nspec:\n  volumes: [{name: s, emptyDir: {}}]\n  containers: [{name: c, image: busybox}]\n"));
    assert!(eventually(LONG, || n.running("u1")).await);
    assert!(eventually(LONG, || n.volume_actual.get(&"gone/s".to_string()).is_none()).await);
    assert!(n.host.calls_of("set_up").is_empty(), "{:?}", n.host.calls());
    let teardowns: Vec<String> = n.host.calls_of("tear_down").into_iter().map(|c| c.key).collect();
    assert_eq!(teardowns, vec!["gone/s".to_string()]);
}
