//! The pod logic on the fake runtime with paused time: start order, restart policies and
//! CrashLoopBackOff, termination grace, spec changes, image pull failures, reconstruction.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use nodelet_resources::common::clock::Clock;
use nodelet_resources::eviction::populator::{VerdictPopulator, evictions};
use nodelet_resources::eviction::verdict::{Admission, NodeResources};
use nodelet_resources::fake::FakeRuntime;
use nodelet_resources::model::actual::{PodActual, SandboxRecord};
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::model::runtime::RuntimeError;
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::driver::PodRuntime;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::pleg::{
    DEFAULT_EVENTED_RELIST_PERIOD, DEFAULT_RELIST_PERIOD, EVENTED_RELIST_JITTER, MAX_POD_READS, Pleg,
};
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodInputs, PodReconciler};
use nodelet_resources::pod::status::pod_status;
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use nodelet_resources::sandbox::status::pod_of_sandboxes;
use reconcile_engine::testing::eventually;
use reconcile_engine::{CancellationToken, Engine, OpStatus, Store, Writer, store};

const LONG: Duration = Duration::from_secs(3600);

fn pod(uid: &str, yaml: &str) -> DesiredPod {
    let mut pod: Pod = serde_saphyr::from_str(yaml).expect("test manifest");
    pod.metadata.uid = Some(uid.to_string());
    DesiredPod { pod, source: PodSource::Http }
}

struct Node {
    runtime: Arc<FakeRuntime>,
    writer: Writer<PodUid, DesiredPod>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    status: Store<PodUid, OpStatus<nodelet_resources::pod::ops::PodOp, RuntimeError>>,
    reconciler: PodReconciler,
    inputs: PodInputs,
    clock: Clock,
    relist: nodelet_resources::pod::pleg::PlegWaker,
    /// Reports to the pod engine as the PLEG does.
    observer: reconcile_engine::Observer<PodUid, PodActual>,
}

fn clock() -> Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || {
        1_700_000_000_000_000_000 + i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    })
}

/// Starts a pod engine over a fake runtime (optionally holding pods from "before a restart").
fn node_with(runtime: Arc<FakeRuntime>, clock: Clock) -> Node {
    node_with_verdicts(runtime, clock, None)
}

/// [`node_with`], with the reconcilers reading `verdicts` when given (and the engine woken when
/// they change).
fn node_with_verdicts(
    runtime: Arc<FakeRuntime>,
    clock: Clock,
    verdicts: Option<Store<PodUid, Verdict>>,
) -> Node {
    let (desired, mut writer) = store();
    writer.mark_synced();
    let builder = Engine::builder(
        "pods",
        PodReconciler::new(CrashLoopBackOff::default()),
        Arc::new(PodDriver::new(runtime.clone(), PodMetrics::unregistered())),
        desired.clone(),
    )
    .wall_clock(nodelet_resources::common::clock::wall_clock(&clock))
    .backoff(reconcile_engine::BackoffConfig::default().without_jitter())
    .max_concurrent(nodelet_resources::pod::ops::MAX_CONCURRENT_OPS);
    let mut sandboxes = SandboxPair::new(
        runtime.clone(),
        builder.actual(),
        SandboxMetrics::unregistered(),
        None,
        SandboxPairConfig {
            backoff: reconcile_engine::BackoffConfig::default().without_jitter(),
            verdicts: verdicts.clone(),
            ..SandboxPairConfig::default()
        },
    );
    let status = builder.op_status();
    let inputs = PodInputs {
        failures: Some(status.clone()),
        verdicts: verdicts.clone(),
        sandboxes: Some(sandboxes.view()),
        ..PodInputs::default()
    };
    let mut builder = builder
        .watches("sandboxes", sandboxes.actual(), pod_of_sandboxes)
        .waits_for("sandboxes", sandboxes.actual());
    if let Some(verdicts) = verdicts {
        builder =
            builder.watches("verdicts", verdicts, |uid: &PodUid, _: Option<&Verdict>| Some(uid.clone()));
    }
    let mut engine = builder.build_with(inputs.clone());
    let actual = engine.actual();
    let observer = engine.observer();
    let pleg = Pleg::new(
        runtime.clone(),
        actual.clone(),
        engine.observer(),
        DEFAULT_RELIST_PERIOD,
        PodMetrics::unregistered(),
    )
    .with_sandboxes(sandboxes.actual(), sandboxes.observer());
    let relist = pleg.waker();
    let (sandbox_engine, sandbox_tasks) =
        sandboxes.start(desired.clone(), reconcile_engine::CancellationToken::new());
    tokio::spawn(sandbox_engine);
    for task in sandbox_tasks {
        tokio::spawn(task.future);
    }
    let reconciler = PodReconciler::new(CrashLoopBackOff::default());
    tokio::spawn(engine.run(std::future::pending()));
    tokio::spawn(pleg.run(std::future::pending()));
    Node { runtime, writer, desired, actual, status, reconciler, inputs, clock, relist, observer }
}

fn node() -> Node {
    let clock = clock();
    node_with(Arc::new(FakeRuntime::new(clock.clone())), clock)
}

fn clock_now(n: &Node) -> i64 {
    (n.clock)()
}

impl Node {
    /// Runs a verdict populator deciding with `admission`, writing `writer`.
    fn admit_with(&self, admission: Admission, writer: Writer<PodUid, Verdict>) {
        let (_, evictions) = evictions();
        let (_, conditions) = tokio::sync::watch::channel(Default::default());
        let sandboxes = self.inputs.sandboxes.as_ref().map(|v| v.actual().clone());
        let populator = VerdictPopulator::new(
            self.desired.clone(),
            self.actual.clone(),
            sandboxes.unwrap_or_else(|| panic!("the test node has a sandbox pair")),
            writer,
            admission,
            conditions,
            evictions,
        );
        tokio::spawn(populator.run(CancellationToken::new()));
    }

    /// The pod's sandboxes as the sandbox pair's actual store has them, newest first.
    fn sandboxes_of(&self, uid: &str) -> Vec<SandboxRecord> {
        let view = self.inputs.sandboxes.as_ref();
        view.and_then(|v| v.of(uid)).map(|s| s.sandboxes.clone()).unwrap_or_default()
    }

    fn add(&mut self, pod: DesiredPod) {
        self.writer.insert(pod.uid().to_string(), pod);
    }

    fn status(&self, uid: &str) -> PodStatus {
        let desired = self.desired.get(&uid.to_string()).expect("desired pod");
        let actual = self.actual.get(&uid.to_string());
        let failure = self.status.get(&uid.to_string());
        pod_status(
            &self.reconciler,
            &self.inputs,
            &desired,
            actual.as_deref(),
            failure.as_deref(),
            (self.clock)(),
        )
    }

    fn phase(&self, uid: &str) -> String {
        self.status(uid).phase.unwrap_or_default()
    }

    fn waiting_reason(&self, uid: &str, container: &str) -> Option<String> {
        let status = self.status(uid);
        let all = status
            .init_container_statuses
            .into_iter()
            .flatten()
            .chain(status.container_statuses.into_iter().flatten());
        all.into_iter()
            .find(|c| c.name == container)
            .and_then(|c| c.state)
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason)
    }

    fn restart_count(&self, uid: &str, container: &str) -> i32 {
        self.status(uid)
            .container_statuses
            .into_iter()
            .flatten()
            .find(|c| c.name == container)
            .map_or(-1, |c| c.restart_count)
    }

    fn starts(&self, target: &str) -> Vec<i64> {
        self.runtime
            .calls_of("start_container")
            .into_iter()
            .filter(|c| c.target == target)
            .map(|c| c.at)
            .collect()
    }
}

const WEB: &str = r#"
metadata: {name: web, namespace: default}
spec:
  containers:
  - {name: web, image: busybox}
"#;

#[tokio::test(start_paused = true)]
async fn a_pod_should_get_a_sandbox_then_its_container_and_be_running_and_ready() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.actual.get(&"u1".into()).is_some_and(|a| a.any_running())).await);
    let methods: Vec<&str> = n
        .runtime
        .calls()
        .iter()
        .map(|c| c.method)
        .filter(|m| !matches!(*m, "pod_state" | "list_pods" | "sandboxes_of" | "list_sandboxes"))
        .collect();
    assert_eq!(methods, vec!["run_sandbox", "start_container"]);
    let status = n.status("u1");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(status.pod_ip.is_some_and(|ip| ip.starts_with("198.18.")));
    let ready = status.conditions.into_iter().flatten().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.status, "True");
}

#[tokio::test(start_paused = true)]
async fn a_new_pods_container_should_start_in_its_new_sandbox_without_waiting_for_a_relist() {
    let mut n = node();
    // Past the PLEG's first relist: the next one is a period away, and nothing wakes it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let added = (n.clock)();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || !n.starts("u1/web").is_empty()).await);
    let sandbox = n.runtime.calls_of("run_sandbox");
    assert_eq!(sandbox.len(), 1, "{sandbox:?}");
    let (made, started) = (sandbox[0].at, n.starts("u1/web")[0]);
    // The sandbox pair's own state read puts the sandbox in its store; the pod pair starts the
    // container from there, not from the pod's first appearance in a relist a period later.
    assert!(
        started - made < 100_000_000,
        "the container started {} ms after its sandbox (pod added at {added})",
        (started - made) / 1_000_000
    );
    assert!(eventually(LONG, || n.actual.get(&"u1".into()).is_some_and(|a| a.any_running())).await);
}

const INIT: &str = r#"
metadata: {name: init, namespace: default}
spec:
  initContainers:
  - {name: first, image: "fake/exit:0"}
  - {name: second, image: "fake/exit:0"}
  containers:
  - {name: app, image: busybox}
"#;

#[tokio::test(start_paused = true)]
async fn init_containers_should_run_one_at_a_time_in_order_before_the_app() {
    let mut n = node();
    n.add(pod("u1", INIT));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    let order: Vec<String> = n.runtime.calls_of("start_container").into_iter().map(|c| c.target).collect();
    assert_eq!(order, vec!["u1/first", "u1/second", "u1/app"]);
    let initialized =
        n.status("u1").conditions.into_iter().flatten().find(|c| c.type_ == "Initialized").expect("cond");
    assert_eq!(initialized.status, "True");
    // Completed init containers are ready, as the kubelet reports them.
    let inits = n.status("u1").init_container_statuses.unwrap_or_default();
    assert!(!inits.is_empty() && inits.iter().all(|s| s.ready), "{inits:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_init_container_should_block_the_app_and_fail_the_pod_under_never() {
    let mut n = node();
    n.add(pod(
        "u1",
        &INIT
            .replace("first, image: \"fake/exit:0\"", "first, image: \"fake/exit:2\"")
            .replace("spec:\n", "spec:\n  restartPolicy: Never\n"),
    ));
    assert!(eventually(LONG, || n.phase("u1") == "Failed").await);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(n.starts("u1/first").len(), 1);
    assert!(n.starts("u1/app").is_empty());
    assert!(n.starts("u1/second").is_empty());
    // Never initialized: the condition says so and the app still waits for the init containers.
    let status = n.status("u1");
    let initialized = status.conditions.iter().flatten().find(|c| c.type_ == "Initialized").expect("cond");
    assert_eq!(
        (initialized.status.as_str(), initialized.reason.as_deref()),
        ("False", Some("ContainersNotInitialized"))
    );
    let app = status.container_statuses.iter().flatten().find(|c| c.name == "app").expect("app status");
    let waiting = app.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref());
    assert_eq!(waiting, Some("PodInitializing"));
}

#[tokio::test(start_paused = true)]
async fn a_failing_init_container_should_be_retried_with_backoff_under_always() {
    let mut n = node();
    n.add(pod("u1", &INIT.replace("first, image: \"fake/exit:0\"", "first, image: \"fake/exit:2\"")));
    assert!(eventually(LONG, || n.starts("u1/first").len() >= 3).await);
    assert!(n.starts("u1/app").is_empty(), "the app never starts while init fails");
    assert_eq!(n.phase("u1"), "Pending");
}

const CRASH: &str = r#"
metadata: {name: crash, namespace: default}
spec:
  containers:
  - {name: c, image: "fake/exit:1"}
"#;

#[tokio::test(start_paused = true)]
async fn a_crashing_container_should_restart_with_the_kubelets_backoff_sequence() {
    let mut n = node();
    n.add(pod("u1", CRASH));
    assert!(eventually(LONG, || n.starts("u1/c").len() >= 7).await);
    let starts = n.starts("u1/c");
    let gaps: Vec<u64> =
        starts.windows(2).map(|w| u64::try_from(w[1] - w[0]).unwrap_or(0) / 1_000_000_000).collect();
    // Immediately, then 10 s doubling, capped at 300 s.
    assert_eq!(gaps, vec![0, 10, 20, 40, 80, 160]);
    assert!(eventually(LONG, || n.starts("u1/c").len() >= 9).await);
    let starts = n.starts("u1/c");
    assert_eq!((starts[8] - starts[7]) / 1_000_000_000, 300);
    // Between restarts, status says why.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(n.waiting_reason("u1", "c").as_deref(), Some("CrashLoopBackOff"));
    assert!(n.restart_count("u1", "c") >= 8);
    // Old attempts are removed: the newest and the one before it are kept.
    assert!(n.runtime.container_count("u1") <= 2, "{}", n.runtime.container_count("u1"));
}

/// e2e "Pods should have their auto-restart back-off timer reset on image update": the kubelet keys its
/// back-off by the container's spec hash, so a new image neither waits for the old one's back-off nor
/// inherits its delays; the restart count goes on.
#[tokio::test(start_paused = true)]
async fn a_new_image_should_restart_at_once_and_start_the_backoff_afresh() {
    let mut n = node();
    n.add(pod("u1", CRASH));
    // Deep in the back-off: the 6th start came 80 s after the 5th; the next waits 160 s.
    assert!(eventually(LONG, || n.starts("u1/c").len() >= 6).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = n.starts("u1/c").len();
    let updated_at = clock_now(&n);
    n.add(pod("u1", &CRASH.replace("fake/exit:1", "fake/exit:2")));
    assert!(eventually(LONG, || n.starts("u1/c").len() >= before + 4).await);
    let starts = n.starts("u1/c");
    let after = &starts[before..];
    assert!(after[0] - updated_at < 2_000_000_000, "the new image waited {} ns", after[0] - updated_at);
    let gaps: Vec<u64> =
        after.windows(2).map(|w| u64::try_from(w[1] - w[0]).unwrap_or(0) / 1_000_000_000).collect();
    // The new spec's first exit restarts at once, then 10 s doubling, as for a new container.
    assert_eq!(gaps[..3], [0, 10, 20], "{gaps:?}");
    assert!(n.restart_count("u1", "c") >= 8, "the restart count goes on");
}

#[tokio::test(start_paused = true)]
async fn on_failure_should_restart_failures_but_not_successes() {
    let mut n = node();
    let yaml = r#"
metadata: {name: jobs, namespace: default}
spec:
  restartPolicy: OnFailure
  containers:
  - {name: ok, image: "fake/exit:0"}
  - {name: bad, image: "fake/exit:1"}
"#;
    n.add(pod("u1", yaml));
    assert!(eventually(LONG, || n.starts("u1/bad").len() >= 3).await);
    assert_eq!(n.starts("u1/ok").len(), 1);
    n.add(pod("u2", &yaml.replace("fake/exit:1", "fake/exit:0")));
    assert!(eventually(LONG, || n.phase("u2") == "Succeeded").await);
}

#[tokio::test(start_paused = true)]
async fn never_should_not_restart_and_the_pod_should_fail_and_release_its_sandbox() {
    let mut n = node();
    n.add(pod("u1", &CRASH.replace("spec:\n", "spec:\n  restartPolicy: Never\n")));
    assert!(eventually(LONG, || n.phase("u1") == "Failed").await);
    assert!(eventually(LONG, || n.sandboxes_of("u1").first().is_some_and(|s| !s.ready)).await);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(n.starts("u1/c").len(), 1);
    let terminated = n
        .status("u1")
        .container_statuses
        .into_iter()
        .flatten()
        .next()
        .and_then(|c| c.state)
        .and_then(|s| s.terminated);
    assert_eq!(terminated.map(|t| (t.exit_code, t.reason)), Some((1, Some("Error".to_string()))));
}

#[tokio::test(start_paused = true)]
async fn removing_a_pod_should_honour_its_grace_period_and_remove_everything() {
    let mut n = node();
    let yaml = r#"
metadata: {name: slow, namespace: default}
spec:
  terminationGracePeriodSeconds: 7
  containers:
  - {name: stubborn, image: fake/ignore-term}
  - {name: polite, image: busybox}
"#;
    n.add(pod("u1", yaml));
    assert!(eventually(LONG, || n.phase("u1") == "Running" && n.starts("u1/polite").len() == 1).await);
    let removed_at = tokio::time::Instant::now();
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&"u1".into()).is_none()).await);
    assert_eq!(removed_at.elapsed().as_secs(), 7, "the stubborn container got its whole grace period");
    assert_eq!(n.runtime.container_count("u1"), 0);
    assert_eq!(n.runtime.calls_of("remove_sandbox").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_changed_container_spec_should_kill_and_start_the_container_again() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    n.add(pod("u1", &WEB.replace("image: busybox", "image: busybox:2")));
    assert!(eventually(LONG, || n.starts("u1/web").len() == 2).await);
    assert!(
        eventually(LONG, || n
            .status("u1")
            .container_statuses
            .into_iter()
            .flatten()
            .any(|c| c.image == "busybox:2" && c.ready))
        .await
    );
    assert_eq!(n.runtime.calls_of("stop_container").len(), 1);
    assert_eq!(n.runtime.calls_of("run_sandbox").len(), 1, "the sandbox is kept");
}

#[tokio::test(start_paused = true)]
async fn an_image_that_cannot_be_pulled_should_show_err_image_pull_then_backoff_then_run() {
    let mut n = node();
    n.add(pod("u1", &WEB.replace("image: busybox", "image: fake/missing:1")));
    assert!(eventually(LONG, || n.waiting_reason("u1", "web").as_deref() == Some("ErrImagePull")).await);
    assert!(eventually(LONG, || n.waiting_reason("u1", "web").as_deref() == Some("ImagePullBackOff")).await);
    n.runtime.add_image("fake/missing:1");
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    assert!(n.status.get(&"u1".into()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_dead_sandbox_should_be_replaced_and_init_containers_run_again() {
    let mut n = node();
    n.add(pod("u1", INIT));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    n.runtime.break_sandbox("u1");
    // The PLEG notices; the pod is killed, gets a new sandbox, and its init containers run again.
    assert!(eventually(LONG, || n.runtime.calls_of("run_sandbox").len() == 2).await);
    assert!(eventually(LONG, || n.starts("u1/app").len() == 2 && n.phase("u1") == "Running").await);
    assert_eq!(n.starts("u1/first").len(), 2);
    assert_eq!(n.starts("u1/second").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_exits_later_should_be_noticed_by_the_pleg_and_restarted() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    n.runtime.exit("u1", "web", 3);
    assert!(eventually(LONG, || n.starts("u1/web").len() == 2).await);
    let last = n
        .status("u1")
        .container_statuses
        .into_iter()
        .flatten()
        .next()
        .and_then(|c| c.last_state)
        .and_then(|s| s.terminated);
    assert_eq!(last.map(|t| t.exit_code), Some(3));
    assert_eq!(n.restart_count("u1", "web"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_runtime_events_should_not_make_the_pleg_relist_back_to_back() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    let cost = Duration::from_millis(20);
    n.runtime.set_list_delay(cost);
    let relists = || n.runtime.calls_of("list_pods").len();
    // Quiet for a while (the follow-ups of the start are over), then one event half a period after
    // the last periodic relist: seen at once (one listing's time, not a coalescing delay).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let periodic = relists();
    assert!(eventually(LONG, || relists() > periodic).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = relists();
    n.relist.relist();
    tokio::time::sleep(cost + Duration::from_millis(1)).await;
    assert_eq!(relists(), before + 1, "a lone event is relisted at once");
    // An event every millisecond for 600 ms: back to back that is 30 relists of 20 ms; coalesced,
    // each relist is followed by twice its cost of waiting, so at most a third of the time relists.
    let before = relists();
    for _ in 0..600 {
        n.relist.relist();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let storm = relists() - before;
    assert!((8..=11).contains(&storm), "{storm} relists in a 600 ms storm of events");
}

impl Node {
    /// How many times the PLEG has relisted.
    fn relists(&self) -> usize {
        self.runtime.calls_of("list_pods").len()
    }

    /// How many times pod `uid` was read alone.
    fn reads_of(&self, uid: &str) -> usize {
        self.runtime.calls_of("pod_state").iter().filter(|c| c.target == uid).count()
    }

    /// The ID of pod `uid`'s newest container.
    fn container_id(&self, uid: &str) -> String {
        let pod = self.actual.get(&uid.to_string()).expect("the pod is in the actual store");
        pod.containers.first().expect("the pod has a container").id.clone()
    }

    /// Starts `pods` pods `u0`, `u1`…, waits until they run, and connects the runtime's events as the
    /// daemon does on `Reconnected`; returns once the relist that follows and its follow-ups are over.
    async fn evented_with(&mut self, pods: usize) {
        for i in 0..pods {
            self.add(pod(&format!("u{i}"), &WEB.replacen("{name: web,", &format!("{{name: web{i},"), 1)));
        }
        for i in 0..pods {
            let uid = format!("u{i}");
            assert!(eventually(LONG, || self.phase(&uid) == "Running").await, "{uid} runs");
        }
        self.relist.set_evented(true);
        self.relist.relist();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn with_runtime_events_the_pleg_should_read_only_the_pod_an_exit_names_and_relist_seldom() {
    let mut n = node();
    n.evented_with(2).await;
    let (relists, others) = (n.relists(), n.reads_of("u1"));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(n.relists(), relists, "no relist within the evented period while events come");
    let id = n.container_id("u0");
    n.runtime.exit("u0", "web", 3);
    n.relist.changed(&id);
    assert!(
        eventually(Duration::from_secs(20), || n.starts("u0/web").len() == 2).await,
        "the exit is seen (and the container restarted) well before the next relist"
    );
    assert_eq!(n.restart_count("u0", "web"), 1);
    assert_eq!(n.relists(), relists, "seen by reading the pod, not by relisting");
    assert_eq!(n.reads_of("u1"), others, "the other pod is not read");
    // The safety net: a relist every evented period.
    tokio::time::sleep(DEFAULT_EVENTED_RELIST_PERIOD).await;
    assert!(n.relists() > relists, "a relist every evented period");
    // The events stop: back to the period.
    n.relist.set_evented(false);
    let relists = n.relists();
    tokio::time::sleep(DEFAULT_RELIST_PERIOD * 3 + Duration::from_millis(500)).await;
    assert!(n.relists() >= relists + 3, "{} relists in 3.5 periods without events", n.relists() - relists);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_differs_from_an_unchanged_runtime_should_be_set_right_by_the_next_relist() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    // Quiet relists: the runtime hands out the same pod each time, and the PLEG remembers that it
    // equalled the store.
    let relists = n.relists();
    assert!(eventually(LONG, || n.relists() >= relists + 3).await);
    let uid = "u1".to_owned();
    let truth = n.actual.get(&uid).expect("the pod is in the store");
    // The store now says something else (a message the reconciler does not act on), the runtime not.
    let mut wrong = PodActual::clone(&truth);
    wrong.containers[0].message = "not what the runtime says".into();
    n.observer.observe(uid.clone(), reconcile_engine::Update::Set(wrong), tokio::time::Instant::now());
    assert!(eventually(LONG, || n.actual.get(&uid).is_some_and(|a| *a != *truth)).await);
    let relists = n.relists();
    n.relist.relist();
    assert!(eventually(Duration::from_secs(5), || n.relists() > relists).await);
    assert!(
        eventually(Duration::from_secs(5), || n.actual.get(&uid).is_some_and(|a| *a == *truth)).await,
        "the relist after the change reports the runtime's state again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_removal_behind_nodelets_back_should_be_seen_by_reading_the_pod() {
    let mut n = node();
    n.evented_with(1).await;
    let relists = n.relists();
    let id = n.container_id("u0");
    n.runtime.exit("u0", "web", 0);
    n.runtime.remove_container(&id).await.expect("the fake removes the container");
    n.relist.removed(&id);
    assert!(
        eventually(Duration::from_secs(20), || n.starts("u0/web").len() == 2).await,
        "the removed container is replaced"
    );
    assert_eq!(n.relists(), relists, "seen by reading the pod, not by relisting");
}

#[tokio::test(start_paused = true)]
async fn an_exit_no_store_knows_should_be_placed_by_asking_the_runtime() {
    let mut n = node();
    n.evented_with(1).await;
    let (relists, reads) = (n.relists(), n.runtime.calls_of("pod_state").len());
    let asked = || n.runtime.calls_of("pod_of").into_iter().map(|c| c.target).collect::<Vec<_>>();
    n.relist.removed("a-container-long-forgotten");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((n.relists(), n.runtime.calls_of("pod_state").len()), (relists, reads), "nothing to do");
    assert_eq!(asked(), Vec::<String>::new(), "a removal no store knows is not asked about");
    n.relist.changed("another-nodes-container");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(asked(), ["another-nodes-container"]);
    assert_eq!((n.relists(), n.runtime.calls_of("pod_state").len()), (relists, reads), "not ours: nothing");
    let id = n.runtime.add_unreported_attempt("u0", "web").expect("u0 has a container web");
    n.relist.changed(&id);
    let recorded =
        || n.actual.get(&"u0".to_string()).is_some_and(|p| p.containers.iter().any(|c| c.id == id));
    assert!(eventually(Duration::from_secs(1), recorded).await, "placed in u0 and read");
    assert_eq!(asked().last(), Some(&id));
    assert_eq!(n.relists(), relists, "without a relist");
}

#[tokio::test(start_paused = true)]
async fn a_relist_that_finds_a_missed_exit_should_look_again_at_that_pod_only() {
    let mut n = node();
    n.evented_with(2).await;
    let (relists, reads, others) = (n.relists(), n.reads_of("u0"), n.reads_of("u1"));
    // The exit's event is lost: the periodic relist finds it.
    n.runtime.exit("u0", "web", 3);
    let late = DEFAULT_EVENTED_RELIST_PERIOD.mul_f64(1.0 + EVENTED_RELIST_JITTER);
    tokio::time::sleep(late + Duration::from_secs(3)).await;
    assert_eq!(n.starts("u0/web").len(), 2, "the exit is found and the container restarted");
    assert_eq!(n.relists(), relists + 1, "one relist: its follow-ups read the pod it reported");
    let read = n.reads_of("u0") - reads;
    assert!(read > 0, "the follow-ups read u0");
    // (four looks, one per follow-up step to the period, before the chain ended when quiet)
    assert!(read <= 2, "{read} reads of u0: the follow-ups end once the stores match the runtime");
    assert_eq!(n.reads_of("u1"), others, "and not the pod that matched the stores");
}

#[tokio::test(start_paused = true)]
async fn events_naming_many_pods_should_make_a_relist() {
    let mut n = node();
    n.evented_with(MAX_POD_READS + 1).await;
    let reads = n.runtime.calls_of("pod_state").len();
    let relists = n.relists();
    for i in 0..=MAX_POD_READS {
        n.relist.changed(&n.container_id(&format!("u{i}")));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(n.relists(), relists + 1, "events naming more than {MAX_POD_READS} pods make one relist");
    assert_eq!(n.runtime.calls_of("pod_state").len(), reads, "and no pod is read alone");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_nodelet_should_adopt_existing_pods_without_creating_them_again() {
    let clock = clock();
    let runtime = Arc::new(FakeRuntime::new(clock.clone()));
    {
        let mut first = node_with(runtime.clone(), clock.clone());
        first.add(pod("u1", WEB));
        assert!(eventually(LONG, || first.phase("u1") == "Running").await);
    }
    // A second engine over the same runtime, as after a restart: nothing is created twice.
    let mut second = node_with(runtime.clone(), clock);
    second.add(pod("u1", WEB));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(runtime.calls_of("run_sandbox").len(), 1);
    assert_eq!(runtime.calls_of("start_container").len(), 1);
    assert_eq!(second.phase("u1"), "Running");
}

#[tokio::test(start_paused = true)]
async fn a_failed_sandbox_creation_should_be_retried_and_reported() {
    let mut n = node();
    n.runtime.fail_next("run_sandbox", RuntimeError::new("CreatePodSandboxError", "network not ready"));
    n.add(pod("u1", WEB));
    assert!(
        eventually(LONG, || n.status("u1").message.is_some_and(|m| m.contains("network not ready"))).await
    );
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    assert_eq!(n.runtime.calls_of("run_sandbox").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_pod_deleted_through_the_api_should_stop_with_the_deletion_grace_and_stay_until_dropped() {
    let mut n = node();
    let yaml = r#"
metadata: {name: slow, namespace: default}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - {name: stubborn, image: fake/ignore-term}
"#;
    let mut desired = pod("u1", yaml);
    desired.source = PodSource::Api;
    n.add(desired.clone());
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    // The API server sets the deletion timestamp and grace period; the pod stays in the source.
    desired.pod.metadata.deletion_timestamp = nodelet_resources::common::time::time((n.clock)());
    desired.pod.metadata.deletion_grace_period_seconds = Some(5);
    let deleted_at = tokio::time::Instant::now();
    n.add(desired);
    let stopped = || {
        n.actual.get(&"u1".into()).is_some_and(|a| !a.any_running())
            && n.sandboxes_of("u1").iter().all(|s| !s.ready)
    };
    assert!(eventually(LONG, stopped).await);
    // 5 s, and the sandbox's stop shows in the sandbox pair's store (its stop's outcome, or the next relist).
    let took = deleted_at.elapsed().as_secs();
    assert!((5..=6).contains(&took), "{took} s: the deletion's grace period (5 s), not the spec's (30 s)");
    // Stopped but kept (for the final status), never started again.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(n.starts("u1/stubborn").len(), 1);
    assert!(n.runtime.container_count("u1") > 0, "containers stay until the pod is dropped");
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&"u1".into()).is_none()).await);
    assert_eq!(n.runtime.container_count("u1"), 0);
}

const SIDECARS: &str = r#"
metadata: {name: mesh, namespace: default}
spec:
  terminationGracePeriodSeconds: 7
  initContainers:
  - {name: setup, image: "fake/exit:0"}
  - {name: proxy, image: busybox, restartPolicy: Always}
  - {name: log, image: busybox, restartPolicy: Always}
  containers:
  - {name: app, image: busybox}
"#;

impl Node {
    fn init_status(&self, uid: &str, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
        self.status(uid).init_container_statuses.into_iter().flatten().find(|c| c.name == name).expect(name)
    }

    fn condition(&self, uid: &str, kind: &str) -> String {
        let status = self.status(uid);
        status
            .conditions
            .into_iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .map(|c| c.status)
            .unwrap_or_default()
    }

    fn running(&self, uid: &str, name: &str) -> bool {
        self.actual.get(&uid.to_string()).is_some_and(|a| {
            a.container(name)
                .is_some_and(|c| c.state == nodelet_resources::model::actual::ContainerState::Running)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn sidecars_should_start_in_order_and_keep_running_beside_the_app() {
    let mut n = node();
    n.add(pod("u1", SIDECARS));
    assert!(eventually(LONG, || n.phase("u1") == "Running" && n.condition("u1", "Ready") == "True").await);
    let order: Vec<String> = n.runtime.calls_of("start_container").into_iter().map(|c| c.target).collect();
    assert_eq!(order, vec!["u1/setup", "u1/proxy", "u1/log", "u1/app"]);
    assert_eq!(n.condition("u1", "Initialized"), "True");
    for sidecar in ["proxy", "log"] {
        assert!(n.running("u1", sidecar), "{sidecar} keeps running");
        let status = n.init_status("u1", sidecar);
        assert_eq!((status.started, status.ready), (Some(true), true), "{status:?}");
        assert!(status.state.and_then(|s| s.running).is_some());
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(n.starts("u1/proxy").len(), 1, "a running sidecar is left alone");
}

#[tokio::test(start_paused = true)]
async fn a_sidecar_that_exits_should_be_restarted_with_backoff_whatever_the_restart_policy() {
    let mut n = node();
    n.add(pod("u1", &SIDECARS.replace("spec:\n", "spec:\n  restartPolicy: Never\n")));
    assert!(eventually(LONG, || n.running("u1", "app")).await);
    n.runtime.exit("u1", "proxy", 1);
    assert!(eventually(LONG, || n.starts("u1/proxy").len() == 2).await, "restarted at once");
    n.runtime.exit("u1", "proxy", 1);
    assert!(
        eventually(Duration::from_secs(5), || n.waiting_reason("u1", "proxy").as_deref()
            == Some("CrashLoopBackOff"))
        .await
    );
    assert!(eventually(LONG, || n.starts("u1/proxy").len() == 3).await);
    let starts = n.starts("u1/proxy");
    assert_eq!((starts[2] - starts[1]) / 1_000_000_000, 10, "the second restart waits the back-off");
    assert_eq!(n.starts("u1/app").len(), 1, "the app is not touched");
    assert_eq!(n.starts("u1/log").len(), 1);
    assert_eq!(n.init_status("u1", "proxy").restart_count, 2);
    assert_eq!(n.phase("u1"), "Running");
}

#[tokio::test(start_paused = true)]
async fn a_job_with_sidecars_should_complete_when_its_app_is_done_and_stop_the_sidecars() {
    let mut n = node();
    n.add(pod(
        "u1",
        &SIDECARS
            .replace("spec:\n", "spec:\n  restartPolicy: Never\n")
            .replace("{name: app, image: busybox}", "{name: app, image: \"fake/exit:0\"}"),
    ));
    assert!(eventually(LONG, || n.phase("u1") == "Succeeded").await);
    assert!(eventually(LONG, || !n.running("u1", "proxy") && !n.running("u1", "log")).await);
    assert!(eventually(LONG, || n.sandboxes_of("u1").first().is_some_and(|s| !s.ready)).await);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(n.phase("u1"), "Succeeded", "stopped sidecars do not fail the pod");
    assert_eq!(n.starts("u1/proxy").len(), 1, "stopped sidecars of a finished pod are not restarted");
    assert_eq!(n.condition("u1", "Initialized"), "True");
    // The stopped sidecars show as terminated, not as waiting to restart.
    for sidecar in ["proxy", "log"] {
        let status = n.init_status("u1", sidecar);
        assert!(status.state.and_then(|s| s.terminated).is_some(), "{sidecar}");
    }
}

#[tokio::test(start_paused = true)]
async fn sidecars_should_be_stopped_after_the_app_containers_last_one_first() {
    let mut n = node();
    n.add(pod(
        "u1",
        &SIDECARS.replace("{name: app, image: busybox}", "{name: app, image: fake/ignore-term}"),
    ));
    assert!(eventually(LONG, || n.running("u1", "app")).await);
    let actual = n.actual.get(&"u1".to_string()).expect("actual");
    let name_of = |id: &str| actual.containers.iter().find(|c| c.id == id).map(|c| c.name.clone());
    let removed_at = tokio::time::Instant::now();
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&"u1".into()).is_none()).await);
    let stops: Vec<(Option<String>, i64)> =
        n.runtime.calls_of("stop_container").into_iter().map(|c| (name_of(&c.target), c.at)).collect();
    let names: Vec<&str> = stops.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(names, vec!["app", "log", "proxy"], "{stops:?}");
    // The app used the whole grace period; each sidecar then gets the minimum of 2 s (they stop at once here).
    assert_eq!((stops[1].1 - stops[0].1) / 1_000_000_000, 7);
    // 7 s of stops, and the pod store drops the pod once the runtime has nothing of it (its sandbox gone) at
    // the next relist (at most a period).
    assert!(removed_at.elapsed() < Duration::from_secs(9), "took {:?}", removed_at.elapsed());
}

const SIZED: &str = r#"
metadata: {name: sized, namespace: default}
spec:
  containers:
  - name: app
    image: busybox
    resources: {requests: {cpu: 100m}, limits: {cpu: 200m, memory: 64Mi}}
    resizePolicy: [{resourceName: memory, restartPolicy: RestartContainer}]
"#;

#[tokio::test(start_paused = true)]
async fn a_resources_change_should_resize_in_place_or_restart_as_the_resize_policy_says() {
    let mut n = node();
    n.add(pod("u1", SIZED));
    assert!(eventually(LONG, || n.running("u1", "app")).await);
    let first = n.actual.get(&"u1".into()).and_then(|a| a.container("app").map(|c| c.id.clone()));
    // CPU: NotRequired (the default) — updated in place, same container
    n.add(pod("u1", &SIZED.replace("cpu: 200m", "cpu: 500m")));
    assert!(eventually(LONG, || !n.runtime.calls_of("update_container_resources").is_empty()).await);
    assert!(
        eventually(LONG, || n
            .actual
            .get(&"u1".into())
            .and_then(|a| a.container("app").and_then(|c| c.applied))
            .is_some_and(|r| r.cpu_quota == 50_000))
        .await
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = n.actual.get(&"u1".into()).and_then(|a| a.container("app").map(|c| c.id.clone()));
    assert_eq!(now, first, "resized in place");
    assert_eq!(n.starts("u1/app").len(), 1);
    let status = n.status("u1");
    assert_eq!(status.resize, None, "nothing pending");
    let app = status.container_statuses.unwrap_or_default().into_iter().next().expect("app");
    let limits = app.resources.and_then(|r| r.limits).unwrap_or_default();
    assert_eq!(limits.get("cpu").map(|q| q.0.as_str()), Some("500m"));
    assert_eq!(
        app.allocated_resources.and_then(|a| a.get("cpu").cloned()).map(|q| q.0),
        Some("100m".to_owned())
    );
    // Memory: RestartContainer — the container is replaced
    n.add(pod("u1", &SIZED.replace("cpu: 200m", "cpu: 500m").replace("64Mi", "128Mi")));
    assert!(eventually(LONG, || n.starts("u1/app").len() == 2).await);
    assert_eq!(n.runtime.calls_of("update_container_resources").len(), 1);
}

// ===== ephemeral containers =====

/// `WEB` with ephemeral containers (as the API's `ephemeralcontainers` subresource adds them).
fn with_ephemeral(yaml: &str, ephemeral: &str) -> String {
    format!("{yaml}  ephemeralContainers:\n{ephemeral}")
}

impl Node {
    fn waiting_reason_ephemeral(&self, uid: &str) -> Option<String> {
        self.ephemeral_status(uid, "debug")?.state?.waiting?.reason
    }

    fn ephemeral_status(&self, uid: &str, name: &str) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
        self.status(uid).ephemeral_container_statuses.into_iter().flatten().find(|c| c.name == name)
    }
}

#[tokio::test(start_paused = true)]
async fn an_ephemeral_container_should_start_once_in_the_running_pod_in_its_targets_pid_namespace() {
    let mut n = node();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    let web_id = n.actual.get(&"u1".into()).and_then(|a| a.container("web").map(|c| c.id.clone()));
    n.add(pod("u1", &with_ephemeral(WEB, "  - {name: debug, image: busybox, targetContainerName: web}\n")));
    assert!(
        eventually(LONG, || n
            .ephemeral_status("u1", "debug")
            .is_some_and(|s| s.state.is_some_and(|st| st.running.is_some())))
        .await
    );
    let start = n.runtime.calls_of("start_container").into_iter().find(|c| c.target == "u1/debug");
    assert_eq!(start.and_then(|c| c.pid_target), web_id, "joins the target's PID namespace");
    let status = n.ephemeral_status("u1", "debug").expect("status");
    assert!(!status.ready && status.started.is_none(), "{status:?}");

    // It exits (successfully or not): never restarted, whatever the pod's restart policy.
    n.runtime.exit("u1", "debug", 1);
    assert!(
        eventually(LONG, || n
            .ephemeral_status("u1", "debug")
            .is_some_and(|s| s.state.is_some_and(|st| st.terminated.is_some_and(|t| t.exit_code == 1))))
        .await
    );
    tokio::time::sleep(Duration::from_secs(900)).await;
    assert_eq!(n.starts("u1/debug").len(), 1);
    assert_eq!(n.starts("u1/web").len(), 1, "the pod itself is untouched");
    assert_eq!(n.phase("u1"), "Running");
    assert_eq!(n.condition("u1", "Ready"), "True");
    assert_eq!(n.status("u1").container_statuses.map(|s| s.len()), Some(1));
}

#[tokio::test(start_paused = true)]
async fn ephemeral_containers_should_wait_for_initialization_and_not_count_for_readiness() {
    let mut n = node();
    n.add(pod(
        "u1",
        &with_ephemeral(
            &INIT.replace("first, image: \"fake/exit:0\"", "first, image: busybox"),
            "  - {name: debug, image: busybox}\n",
        ),
    ));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(n.starts("u1/debug").is_empty(), "not before the pod is initialized");
    assert_eq!(
        n.ephemeral_status("u1", "debug")
            .and_then(|s| s.state)
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason)
            .as_deref(),
        Some("PodInitializing")
    );
    n.runtime.exit("u1", "first", 0);
    assert!(eventually(LONG, || n.starts("u1/debug").len() == 1).await);
    let order: Vec<String> = n.runtime.calls_of("start_container").into_iter().map(|c| c.target).collect();
    assert_eq!(order.last().map(String::as_str), Some("u1/debug"), "after everything else: {order:?}");
    assert!(eventually(LONG, || n.condition("u1", "Ready") == "True").await);
}

#[tokio::test(start_paused = true)]
async fn a_failing_ephemeral_container_should_not_hold_up_or_restart_the_pod() {
    let mut n = node();
    n.add(pod("u1", &with_ephemeral(WEB, "  - {name: debug, image: fake/missing}\n")));
    assert!(eventually(LONG, || n.waiting_reason_ephemeral("u1") == Some("ImagePullBackOff".into())).await);
    assert_eq!(n.phase("u1"), "Running");
    assert_eq!(n.condition("u1", "Ready"), "True");
    // The app container exits: restarted at once (its first restart has no back-off) even though
    // the ephemeral container's start is backing off.
    let before = n.starts("u1/web").len();
    n.runtime.exit("u1", "web", 1);
    assert!(eventually(Duration::from_secs(5), || n.starts("u1/web").len() == before + 1).await);
    assert_eq!(n.runtime.calls_of("run_sandbox").len(), 1, "the pod is not restarted");
    // Once the image can be pulled the ephemeral container starts, once.
    n.runtime.add_image("fake/missing");
    assert!(
        eventually(LONG, || n
            .ephemeral_status("u1", "debug")
            .is_some_and(|s| s.state.is_some_and(|st| st.running.is_some())))
        .await
    );
    n.runtime.exit("u1", "debug", 0);
    tokio::time::sleep(Duration::from_secs(900)).await;
    assert_eq!(n.runtime.containers_named("u1", "debug"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_ephemeral_container_whose_target_is_missing_should_wait_with_the_reason() {
    let mut n = node();
    n.add(pod("u1", &with_ephemeral(WEB, "  - {name: debug, image: busybox, targetContainerName: nope}\n")));
    assert!(
        eventually(LONG, || n.waiting_reason_ephemeral("u1") == Some("CreateContainerConfigError".into()))
            .await
    );
    assert_eq!(n.phase("u1"), "Running");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_nodelet_should_not_start_an_exited_ephemeral_container_again() {
    let clock = clock();
    let runtime = Arc::new(FakeRuntime::new(clock.clone()));
    let manifest = with_ephemeral(WEB, "  - {name: debug, image: \"fake/exit:0\"}\n");
    {
        let mut first = node_with(runtime.clone(), clock.clone());
        first.add(pod("u1", &manifest));
        assert!(
            eventually(LONG, || first
                .ephemeral_status("u1", "debug")
                .is_some_and(|s| s.state.is_some_and(|st| st.terminated.is_some())))
            .await
        );
    }
    let mut second = node_with(runtime.clone(), clock);
    second.add(pod("u1", &manifest));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(runtime.calls_of("start_container").iter().filter(|c| c.target == "u1/debug").count(), 1);
    let status = second.ephemeral_status("u1", "debug").expect("status");
    assert!(status.state.is_some_and(|s| s.terminated.is_some_and(|t| t.exit_code == 0)));
}

#[tokio::test(start_paused = true)]
async fn a_running_ephemeral_container_should_be_stopped_with_the_pod() {
    let mut n = node();
    n.add(pod("u1", &with_ephemeral(WEB, "  - {name: debug, image: busybox}\n")));
    assert!(eventually(LONG, || n.starts("u1/debug").len() == 1).await);
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.runtime.container_count("u1") == 0).await);
}

#[tokio::test(start_paused = true)]
async fn a_failing_ephemeral_container_should_not_delay_a_crash_looping_containers_restarts() {
    let mut n = node();
    n.add(pod("u1", &with_ephemeral(CRASH, "  - {name: debug, image: fake/missing}\n")));
    assert!(eventually(LONG, || n.starts("u1/c").len() >= 7).await);
    let starts = n.starts("u1/c");
    let gaps: Vec<u64> =
        starts.windows(2).map(|w| u64::try_from(w[1] - w[0]).unwrap_or(0) / 1_000_000_000).collect();
    assert_eq!(
        gaps,
        vec![0, 10, 20, 40, 80, 160],
        "the kubelet's sequence, as without the ephemeral container"
    );
    assert!(n.starts("u1/debug").len() > 3, "its start was retried meanwhile");
    let reason = n.waiting_reason_ephemeral("u1");
    assert!(matches!(reason.as_deref(), Some("ErrImagePull" | "ImagePullBackOff")), "{reason:?}");
}

#[tokio::test(start_paused = true)]
async fn a_deferred_resize_is_applied_once_another_pod_frees_room() {
    let admission = Admission::new().with_resources(NodeResources {
        cpu_milli: 1000,
        memory_bytes: 1 << 30,
        max_pods: 10,
    });
    let clock = clock();
    let (verdicts, verdict_writer) = store();
    let mut n = node_with_verdicts(Arc::new(FakeRuntime::new(clock.clone())), clock, Some(verdicts));
    n.admit_with(admission, verdict_writer);
    let sized = |name: &str, cpu: &str| {
        format!(
            "metadata: {{name: {name}, namespace: default}}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    resources: {{requests: {{cpu: {cpu}}}, limits: {{cpu: {cpu}}}}}\n"
        )
    };
    n.add(pod("small", &sized("small", "400m")));
    n.add(pod("other", &sized("other", "500m")));
    assert!(eventually(LONG, || n.running("small", "app") && n.running("other", "app")).await);
    // 400m → 600m does not fit beside the other pod's 500m: deferred, the container untouched
    n.add(pod("small", &sized("small", "600m")));
    assert!(eventually(LONG, || n.status("small").resize.as_deref() == Some("Deferred")).await);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(n.runtime.calls_of("update_container_resources").is_empty());
    // the other pod goes: the resize is decided again and applied in place
    n.writer.remove(&"other".to_string());
    assert!(eventually(LONG, || n.runtime.calls_of("update_container_resources").len() == 1).await);
    assert!(eventually(LONG, || n.status("small").resize.is_none()).await);
    assert_eq!(n.starts("small/app").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_starts_only_once_admitted_and_reconcile_decides_nothing() {
    let clock = clock();
    let (verdicts, mut verdict_writer) = store();
    let mut n = node_with_verdicts(Arc::new(FakeRuntime::new(clock.clone())), clock, Some(verdicts.clone()));
    let changes = verdicts.subscribe();
    let app =
        "metadata: {name: web, namespace: default}\nspec:\n  containers:\n  - {name: app, image: busybox}\n";
    n.add(pod("web", app));
    n.add(pod("refused", &app.replace("web", "refused")));
    // No verdict yet: nothing starts, and the reconciler (which only reads the store) writes none.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(n.runtime.calls_of("run_sandbox").is_empty(), "waits for admission");
    assert!(changes.is_empty() && verdicts.is_empty(), "reconcile() wrote no verdict");
    // The verdicts come (as the populator writes them): the pod engine is woken and acts on them.
    verdict_writer.insert("web".to_owned(), Verdict::admitted(&pod("web", app)));
    verdict_writer
        .insert("refused".to_owned(), Verdict::rejected("OutOfcpu", "Pod was rejected: ...".to_owned()));
    assert!(eventually(Duration::from_secs(5), || n.running("web", "app")).await, "started once admitted");
    assert_eq!(n.phase("refused"), "Failed");
    assert_eq!(n.status("refused").reason.as_deref(), Some("OutOfcpu"));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(n.starts("refused/app").len(), 0, "a refused pod never starts");
    assert_eq!(changes.drain().len(), 2, "only the two verdicts written here");
}

const HOOKED: &str = r#"
metadata: {name: hooked, namespace: default}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - {name: app, image: fake/hang-post-start}
"#;

#[tokio::test(start_paused = true)]
async fn a_pod_whose_post_start_hook_never_returns_should_be_removed_within_its_grace_period() {
    let mut n = node();
    n.add(pod("u1", HOOKED));
    assert!(eventually(LONG, || n.starts("u1/app").len() == 1).await);
    // The hook hangs far longer than any runtime timeout would wait for it.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(n.starts("u1/app").len(), 1, "the start still waits for its hook");
    let removed_at = tokio::time::Instant::now();
    n.writer.remove(&"u1".to_string());
    // (The start never ended, so the pod's actual state may never have been written: wait for the
    // runtime to be empty too.)
    let gone = || n.actual.get(&"u1".into()).is_none() && n.runtime.container_count("u1") == 0;
    assert!(eventually(LONG, gone).await);
    assert!(removed_at.elapsed() <= Duration::from_secs(5), "took {:?}", removed_at.elapsed());
}

/// [`HOOKED`] with a label `rev: <rev>`: a change that keeps the pod.
fn hooked_rev(uid: &str, image: &str, rev: u32) -> DesiredPod {
    let yaml = HOOKED
        .replace("namespace: default}", &format!("namespace: default, labels: {{rev: \"{rev}\"}}}}"))
        .replace("fake/hang-post-start", image);
    pod(uid, &yaml)
}

#[tokio::test(start_paused = true)]
async fn a_change_that_keeps_the_pod_should_not_give_up_its_running_post_start_hook() {
    let mut n = node();
    n.add(hooked_rev("u1", "fake/slow-post-start", 0));
    assert!(eventually(LONG, || n.starts("u1/app").len() == 1).await);
    // The pod changes twice while its hook runs (a new start is planned each time).
    tokio::time::sleep(Duration::from_secs(5)).await;
    n.add(hooked_rev("u1", "fake/slow-post-start", 1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    n.add(hooked_rev("u1", "fake/slow-post-start", 2));
    // The hook returns (30 s after the start): the container started once, was never killed, runs.
    assert!(eventually(LONG, || n.phase("u1") == "Running").await, "{}", n.phase("u1"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(n.starts("u1/app").len(), 1, "the start was not given up nor repeated");
    assert!(n.runtime.calls_of("stop_container").is_empty(), "the container was not killed");
    assert_eq!(n.phase("u1"), "Running");
    assert_eq!(n.waiting_reason("u1", "app"), None);
}

#[tokio::test(start_paused = true)]
async fn a_hook_kept_through_a_change_should_still_be_given_up_when_the_pod_is_deleted() {
    let mut n = node();
    n.add(hooked_rev("u1", "fake/hang-post-start", 0));
    assert!(eventually(LONG, || n.starts("u1/app").len() == 1).await);
    n.add(hooked_rev("u1", "fake/hang-post-start", 1));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(n.starts("u1/app").len(), 1, "the start still waits for its hook");
    assert!(n.runtime.calls_of("stop_container").is_empty(), "the change did not kill the container");
    // Deleted: the hook is given up at once, the pod gone within its grace period.
    let removed_at = tokio::time::Instant::now();
    n.writer.remove(&"u1".to_string());
    // (The start never ended, so the pod's actual state may never have been written: wait for the
    // runtime to be empty too.)
    let gone = || n.actual.get(&"u1".into()).is_none() && n.runtime.container_count("u1") == 0;
    assert!(eventually(LONG, gone).await);
    assert!(removed_at.elapsed() <= Duration::from_secs(5), "took {:?}", removed_at.elapsed());
}

#[tokio::test(start_paused = true)]
async fn many_pods_with_hanging_post_start_hooks_should_not_starve_another_pod() {
    let mut n = node();
    // More hooked pods than the engine's default concurrency bound (64).
    let hooked = reconcile_engine::ExecutorConfig::DEFAULT_MAX_CONCURRENT + 6;
    for i in 0..hooked {
        n.add(pod(&format!("h{i}"), &HOOKED.replace("name: hooked", &format!("name: hooked-{i}"))));
    }
    // (Not all of them: under a bound, the last would wait for the operation timeout of the first.)
    let started = |n: &Node| (0..hooked).filter(|i| n.starts(&format!("h{i}/app")).len() == 1).count();
    assert!(eventually(Duration::from_secs(5), || started(&n) >= hooked - 6).await, "{}", started(&n));
    let added_at = tokio::time::Instant::now();
    n.add(pod("u1", WEB));
    assert!(eventually(LONG, || n.phase("u1") == "Running").await);
    assert!(added_at.elapsed() < Duration::from_secs(5), "took {:?}", added_at.elapsed());
    assert!(eventually(Duration::from_secs(5), || started(&n) == hooked).await, "{}", started(&n));
    let restarted: Vec<usize> = (0..hooked).filter(|i| n.starts(&format!("h{i}/app")).len() != 1).collect();
    assert!(restarted.is_empty(), "hooks given up although their pods stay: {restarted:?}");
    assert!(n.runtime.calls_of("stop_container").is_empty(), "no hooked container was killed");
}
