//! The prober on paused time with a fake probe handler, over the pod engine and the fake runtime:
//! thresholds, initial delay, period, startup gating, workers stopping with their container (a run in
//! progress is let finish), liveness restarts through the pod reconciler, readiness in status.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use nodelet_resources::common::clock::Clock;
use nodelet_resources::fake::FakeRuntime;
use nodelet_resources::model::actual::{ContainerState, PodActual};
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::pleg::{DEFAULT_RELIST_PERIOD, Pleg};
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodInputs, PodReconciler};
use nodelet_resources::pod::status::pod_status;
use nodelet_resources::probe::desired::{Action, ProbeKind};
use nodelet_resources::probe::handler::{ProbeHandler, ProbeOutcome, ProbeTarget};
use nodelet_resources::probe::metrics::ProbeMetrics;
use nodelet_resources::probe::results::ProbeResults;
use nodelet_resources::probe::worker::Prober;
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use reconcile_engine::testing::eventually;
use reconcile_engine::{Engine, Store, Writer, store};
use tokio::time::{Instant, sleep};

const LONG: Duration = Duration::from_secs(3600);

/// One probe run the fake handler saw.
#[derive(Debug, Clone)]
struct Run {
    kind: ProbeKind,
    container: String,
    container_id: String,
    at: Instant,
}

/// Answers probes by the `exec` command's first word: the outcome set with [`FakeHandler::set`] for
/// that word (default success); the word `panic` panics. Records every run.
#[derive(Debug, Default)]
struct FakeHandler {
    outcomes: Mutex<HashMap<String, bool>>,
    /// How long a run of a word takes (default: no time).
    delays: Mutex<HashMap<String, Duration>>,
    runs: Mutex<Vec<Run>>,
    /// How many runs finished (a run cancelled midway does not count).
    finished: Mutex<usize>,
}

impl FakeHandler {
    fn set(&self, word: &str, ok: bool) {
        self.outcomes.lock().unwrap_or_else(PoisonError::into_inner).insert(word.to_string(), ok);
    }

    fn take_time(&self, word: &str, delay: Duration) {
        self.delays.lock().unwrap_or_else(PoisonError::into_inner).insert(word.to_string(), delay);
    }

    fn finished(&self) -> usize {
        *self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn runs(&self, kind: ProbeKind) -> Vec<Run> {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|r| r.kind == kind)
            .cloned()
            .collect()
    }
}

impl ProbeHandler for FakeHandler {
    async fn probe(&self, target: &ProbeTarget, action: &Action, _timeout: Duration) -> ProbeOutcome {
        let Action::Exec { command } = action else { return ProbeOutcome::Error("not exec".into()) };
        let word = command.first().cloned().unwrap_or_default();
        assert_ne!(word, "panic", "the handler panicked");
        let kind = match command.get(1).map(String::as_str) {
            Some("live") => ProbeKind::Liveness,
            Some("ready") => ProbeKind::Readiness,
            _ => ProbeKind::Startup,
        };
        self.runs.lock().unwrap_or_else(PoisonError::into_inner).push(Run {
            kind,
            container: target.container.clone(),
            container_id: target.container_id.clone(),
            at: Instant::now(),
        });
        let delay = self.delays.lock().unwrap_or_else(PoisonError::into_inner).get(&word).copied();
        if let Some(delay) = delay {
            sleep(delay).await;
        }
        *self.finished.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let ok =
            self.outcomes.lock().unwrap_or_else(PoisonError::into_inner).get(&word).copied().unwrap_or(true);
        if ok { ProbeOutcome::Success } else { ProbeOutcome::Failure(format!("{word} said no")) }
    }
}

struct Node {
    runtime: Arc<FakeRuntime>,
    handler: Arc<FakeHandler>,
    writer: Writer<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    /// The sandbox pair's actual store.
    sandboxes: Store<PodUid, nodelet_resources::model::actual::PodSandboxes>,
    desired: Store<PodUid, DesiredPod>,
    reconciler: PodReconciler,
    inputs: PodInputs,
    results: ProbeResults,
    clock: Clock,
    metrics: ProbeMetrics,
    /// The prober's task, and what stops it.
    prober: tokio::task::JoinHandle<()>,
    stop: reconcile_engine::CancellationToken,
}

fn clock() -> Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || {
        1_700_000_000_000_000_000 + i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    })
}

fn node() -> Node {
    let clock = clock();
    let runtime = Arc::new(FakeRuntime::new(clock.clone()));
    let handler = Arc::new(FakeHandler::default());
    let (desired, mut writer) = store();
    writer.mark_synced();
    let metrics = ProbeMetrics::unregistered();
    let prober = Prober::new(handler.clone(), desired.clone(), metrics.clone(), clock.clone());
    let results = prober.results();
    // Short crash-loop back-off so restarts are quick.
    let backoff = CrashLoopBackOff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(2),
        reset_after: Duration::from_secs(600),
    };
    let builder = Engine::builder(
        "pods",
        PodReconciler::new(backoff.clone()).with_probes(results.clone()),
        Arc::new(PodDriver::new(runtime.clone(), PodMetrics::unregistered())),
        desired.clone(),
    )
    .wall_clock(nodelet_resources::common::clock::wall_clock(&clock));
    let mut sandboxes = SandboxPair::new(
        runtime.clone(),
        builder.actual(),
        SandboxMetrics::unregistered(),
        None,
        SandboxPairConfig::default(),
    );
    let inputs = PodInputs { sandboxes: Some(sandboxes.view()), ..PodInputs::default() };
    let mut engine = builder
        .watches("sandboxes", sandboxes.actual(), nodelet_resources::sandbox::status::pod_of_sandboxes)
        .waits_for("sandboxes", sandboxes.actual())
        .watches("probes", results.clone(), nodelet_resources::probe::results::pod_of_probes)
        .build_with(inputs.clone());
    let actual = engine.actual();
    let pleg = Pleg::new(
        runtime.clone(),
        actual.clone(),
        engine.observer(),
        DEFAULT_RELIST_PERIOD,
        PodMetrics::unregistered(),
    )
    .with_sandboxes(sandboxes.actual(), sandboxes.observer());
    let sandbox_actual = sandboxes.actual();
    let (sandbox_engine, sandbox_tasks) =
        sandboxes.start(desired.clone(), reconcile_engine::CancellationToken::new());
    tokio::spawn(sandbox_engine);
    for task in sandbox_tasks {
        tokio::spawn(task.future);
    }
    tokio::spawn(engine.run(std::future::pending()));
    tokio::spawn(pleg.run(std::future::pending()));
    let stop = reconcile_engine::CancellationToken::new();
    let prober =
        tokio::spawn(prober.run(actual.clone(), sandbox_actual.clone(), stop.clone().cancelled_owned()));
    let reconciler = PodReconciler::new(backoff).with_probes(results.clone());
    Node {
        runtime,
        handler,
        writer,
        actual,
        sandboxes: sandbox_actual,
        desired,
        reconciler,
        inputs,
        results,
        clock,
        metrics,
        prober,
        stop,
    }
}

/// The `prober_probe_total` series of pod `uid`: (probe type, result) → count.
fn probe_series(metrics: &ProbeMetrics, uid: &str) -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    for family in prometheus::core::Collector::collect(&metrics.probe_total) {
        for m in family.get_metric() {
            let label = |name: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value().to_owned())
                    .unwrap_or_default()
            };
            if label("pod_uid") == uid {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let count = m.get_counter().get_value() as u64;
                out.insert((label("probe_type"), label("result")), count);
            }
        }
    }
    out
}

fn pod(uid: &str, yaml: &str) -> DesiredPod {
    let mut pod: Pod = match serde_saphyr::from_str(yaml) {
        Ok(p) => p,
        Err(e) => panic!("bad test manifest: {e}"),
    };
    pod.metadata.uid = Some(uid.to_string());
    DesiredPod { pod, source: PodSource::Http }
}

impl Node {
    fn add(&mut self, pod: DesiredPod) {
        self.writer.insert(pod.uid().to_string(), pod);
    }

    fn status(&self, uid: &str) -> PodStatus {
        let Some(desired) = self.desired.get(&uid.to_string()) else { panic!("no desired pod {uid}") };
        let actual = self.actual.get(&uid.to_string());
        pod_status(&self.reconciler, &self.inputs, &desired, actual.as_deref(), None, (self.clock)())
    }

    fn container(&self, uid: &str, name: &str) -> ContainerStatus {
        let status = self.status(uid);
        match status.container_statuses.into_iter().flatten().find(|c| c.name == name) {
            Some(c) => c,
            None => panic!("no status of container {name}"),
        }
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

    fn running_id(&self, uid: &str, name: &str) -> Option<String> {
        let actual = self.actual.get(&uid.to_string())?;
        actual.container(name).filter(|c| c.state == ContainerState::Running).map(|c| c.id.clone())
    }
}

/// A pod whose container `app` has the probes given as YAML (each an `exec` of `[<word>, <kind>]`).
fn probed(probes: &str) -> String {
    format!(
        "metadata: {{name: p, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: busybox\n{probes}"
    )
}

#[tokio::test(start_paused = true)]
async fn liveness_failures_restart_the_container_after_the_failure_threshold() {
    let mut n = node();
    n.add(pod(
        "u1",
        &probed(
            "    livenessProbe: {exec: {command: [alive, live]}, periodSeconds: 2, failureThreshold: 3, terminationGracePeriodSeconds: 1}\n",
        ),
    ));
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some()).await);
    let first = n.running_id("u1", "app").unwrap_or_default();
    // Probed every period while it passes; nothing restarts.
    sleep(Duration::from_secs(9)).await;
    let runs = n.handler.runs(ProbeKind::Liveness);
    assert!((4..=6).contains(&runs.len()), "about one run per 2 s period: {runs:?}");
    for w in runs.windows(2) {
        assert_eq!(w[1].at - w[0].at, Duration::from_secs(2), "period: {runs:?}");
    }
    assert_eq!(n.container("u1", "app").restart_count, 0);

    n.handler.set("alive", false);
    let failing_since = Instant::now();
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some_and(|id| id != first)).await);
    // Three failed runs, two periods apart, before the kill: at least 4 s after the first failure.
    let failed_runs = n
        .handler
        .runs(ProbeKind::Liveness)
        .into_iter()
        .filter(|r| r.container_id == first && r.at >= failing_since)
        .count();
    assert_eq!(failed_runs, 3, "killed after exactly failureThreshold failures");
    assert!(failing_since.elapsed() >= Duration::from_secs(4));
    // The failure plans the pod at once (the engine watches the results), not at the next resync (30 s).
    assert!(failing_since.elapsed() < Duration::from_secs(10), "{:?}", failing_since.elapsed());
    let stops = n.runtime.calls_of("stop_container");
    assert_eq!(stops.len(), 1, "{stops:?}");

    let app = n.container("u1", "app");
    assert_eq!(app.restart_count, 1);
    let message = app.last_state.and_then(|s| s.terminated).and_then(|t| t.message).unwrap_or_default();
    assert_eq!(message, "Container app failed liveness probe, will be restarted");

    // The new container is probed afresh (and fails again: restarts go on with back-off).
    let second = n.running_id("u1", "app").unwrap_or_default();
    assert!(
        eventually(LONG, || n.handler.runs(ProbeKind::Liveness).iter().any(|r| r.container_id == second))
            .await
    );
    assert!(eventually(LONG, || n.container("u1", "app").restart_count >= 2).await);
}

#[tokio::test(start_paused = true)]
async fn readiness_starts_false_and_follows_the_probe_both_ways_with_thresholds() {
    let mut n = node();
    n.handler.set("ok", false);
    n.add(pod(
        "u1",
        &probed("    readinessProbe: {exec: {command: [ok, ready]}, periodSeconds: 1, successThreshold: 2, failureThreshold: 2}\n"),
    ));
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some()).await);
    // Running but not ready: readiness starts as failure.
    sleep(Duration::from_secs(3)).await;
    assert!(!n.container("u1", "app").ready);
    assert_eq!(n.condition("u1", "Ready"), "False");
    assert_eq!(n.condition("u1", "ContainersReady"), "False");
    assert_eq!(n.container("u1", "app").started, Some(true), "started without a startup probe");

    n.handler.set("ok", true);
    let since = Instant::now();
    assert!(eventually(LONG, || n.container("u1", "app").ready).await);
    assert!(since.elapsed() >= Duration::from_secs(1), "two successes in a row, one period apart");
    assert_eq!(n.condition("u1", "Ready"), "True");
    assert_eq!(n.condition("u1", "ContainersReady"), "True");

    n.handler.set("ok", false);
    let since = Instant::now();
    assert!(eventually(LONG, || !n.container("u1", "app").ready).await);
    assert!(since.elapsed() >= Duration::from_secs(1), "two failures in a row");
    assert_eq!(n.condition("u1", "Ready"), "False");
    // A readiness failure never restarts the container.
    sleep(Duration::from_secs(10)).await;
    assert_eq!(n.container("u1", "app").restart_count, 0);
    assert!(n.runtime.calls_of("stop_container").is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_first_run_waits_for_the_initial_delay() {
    let mut n = node();
    n.add(pod(
        "u1",
        &probed(
            "    readinessProbe: {exec: {command: [ok, ready]}, initialDelaySeconds: 7, periodSeconds: 3}\n",
        ),
    ));
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some()).await);
    let started = Instant::now();
    assert!(eventually(LONG, || !n.handler.runs(ProbeKind::Readiness).is_empty()).await);
    let first = n.handler.runs(ProbeKind::Readiness)[0].at;
    let waited = first - started;
    assert!(
        waited >= Duration::from_secs(6) && waited <= Duration::from_secs(8),
        "first run after {waited:?}"
    );
    assert!(!n.container("u1", "app").ready || first <= Instant::now());
    assert!(eventually(LONG, || n.container("u1", "app").ready).await);
}

#[tokio::test(start_paused = true)]
async fn a_startup_probe_holds_liveness_and_readiness_until_it_succeeds() {
    let mut n = node();
    n.handler.set("booted", false);
    n.add(pod(
        "u1",
        &probed(
            "    startupProbe: {exec: {command: [booted, start]}, periodSeconds: 1, failureThreshold: 30}\n    livenessProbe: {exec: {command: [alive, live]}, periodSeconds: 1}\n    readinessProbe: {exec: {command: [ok, ready]}, periodSeconds: 1}\n",
        ),
    ));
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some()).await);
    sleep(Duration::from_secs(10)).await;
    assert!(n.handler.runs(ProbeKind::Startup).len() >= 9);
    assert!(n.handler.runs(ProbeKind::Liveness).is_empty(), "liveness held by the startup probe");
    assert!(n.handler.runs(ProbeKind::Readiness).is_empty(), "readiness held by the startup probe");
    let app = n.container("u1", "app");
    assert_eq!((app.started, app.ready), (Some(false), false));

    n.handler.set("booted", true);
    assert!(eventually(LONG, || n.container("u1", "app").ready).await);
    assert_eq!(n.container("u1", "app").started, Some(true));
    let startup_runs = n.handler.runs(ProbeKind::Startup).len();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        n.handler.runs(ProbeKind::Startup).len(),
        startup_runs,
        "the startup probe stops once it passed"
    );
    assert!(n.handler.runs(ProbeKind::Liveness).len() >= 4, "liveness runs after startup");
}

#[tokio::test(start_paused = true)]
async fn a_failed_startup_probe_restarts_the_container() {
    let mut n = node();
    n.handler.set("booted", false);
    n.add(pod(
        "u1",
        &probed(
            "    startupProbe: {exec: {command: [booted, start]}, periodSeconds: 1, failureThreshold: 3}\n",
        ),
    ));
    assert!(eventually(LONG, || n.container("u1", "app").restart_count >= 1).await);
    let app = n.container("u1", "app");
    let message = app.last_state.and_then(|s| s.terminated).and_then(|t| t.message).unwrap_or_default();
    assert_eq!(message, "Container app failed startup probe, will be restarted");
}

#[tokio::test(start_paused = true)]
async fn probes_stop_when_the_container_stops_and_start_again_with_the_new_one() {
    let mut n = node();
    n.add(pod(
        "u1",
        &probed("    readinessProbe: {exec: {command: [ok, ready]}, periodSeconds: 1}\n    livenessProbe: {exec: {command: [alive, live]}, periodSeconds: 1}\n"),
    ));
    assert!(eventually(LONG, || n.container("u1", "app").ready).await);
    let first = n.running_id("u1", "app").unwrap_or_default();
    assert!(n.results.get(&first).is_some());
    n.runtime.exit("u1", "app", 3);
    assert!(eventually(LONG, || n.running_id("u1", "app").is_some_and(|id| id != first)).await);
    let exited_at = Instant::now();
    sleep(Duration::from_secs(5)).await;
    let after: Vec<Run> = n
        .handler
        .runs(ProbeKind::Readiness)
        .into_iter()
        .chain(n.handler.runs(ProbeKind::Liveness))
        .filter(|r| r.container_id == first && r.at > exited_at)
        .collect();
    assert!(after.is_empty(), "no probe of the exited container: {after:?}");
    let second = n.running_id("u1", "app").unwrap_or_default();
    assert!(
        n.handler.runs(ProbeKind::Readiness).iter().any(|r| r.container_id == second && r.container == "app")
    );
    assert!(n.container("u1", "app").ready);
    // The metric series are the container's (by name), counting on across the restart; only results
    // that happened have one.
    let series = probe_series(&n.metrics, "u1");
    let ready_runs = n.handler.runs(ProbeKind::Readiness).len();
    let counted = series.get(&("Readiness".to_owned(), "successful".to_owned())).copied().unwrap_or(0);
    assert!(
        counted + 1 >= u64::try_from(ready_runs).unwrap_or(u64::MAX) && counted >= 3,
        "{series:?} vs {ready_runs} runs"
    );
    assert!(!series.contains_key(&("Readiness".to_owned(), "failed".to_owned())), "{series:?}");

    // Gone from desired state: workers, results and metric series go with the pod.
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&"u1".to_string()).is_none()).await);
    assert!(eventually(LONG, || n.results.is_empty()).await);
    assert!(probe_series(&n.metrics, "u1").is_empty(), "{:?}", probe_series(&n.metrics, "u1"));
    let count = n.handler.runs(ProbeKind::Readiness).len();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(n.handler.runs(ProbeKind::Readiness).len(), count);
    assert!(probe_series(&n.metrics, "u1").is_empty(), "no series comes back");
}

/// A worker told to stop lets the run in progress finish rather than cancel it, as the kubelet does:
/// containerd 1.6 wedges a container for 30 s when an `ExecSync` is cancelled while its process
/// starts, and the pod's removal waited for that. No run starts after the stop.
#[tokio::test(start_paused = true)]
async fn a_run_in_progress_finishes_when_the_pod_goes_and_none_starts_after() {
    let mut n = node();
    n.handler.take_time("slow", Duration::from_secs(5));
    n.add(pod(
        "u1",
        &probed(
            "    startupProbe: {exec: {command: [slow, start]}, periodSeconds: 1, timeoutSeconds: 30, failureThreshold: 60}\n",
        ),
    ));
    assert!(eventually(LONG, || !n.handler.runs(ProbeKind::Startup).is_empty()).await);
    assert_eq!(n.handler.finished(), 0, "the first run is in progress");
    n.writer.remove(&"u1".to_string());
    assert!(eventually(LONG, || n.actual.get(&"u1".to_string()).is_none()).await);
    sleep(Duration::from_secs(10)).await;
    assert_eq!(n.handler.runs(ProbeKind::Startup).len(), 1, "no run after the pod went");
    assert_eq!(n.handler.finished(), 1, "the run in progress finished: it was not cancelled");
    assert!(n.results.is_empty());
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_the_first_probes_of_running_containers_are_spread_over_a_period() {
    let mut n = node();
    let uids: Vec<String> = (0..20).map(|i| format!("u{i}")).collect();
    for uid in &uids {
        n.add(pod(uid, &probed("    readinessProbe: {exec: {command: [ok, ready]}, periodSeconds: 10}\n")));
    }
    assert!(eventually(LONG, || uids.iter().all(|u| n.running_id(u, "app").is_some())).await);
    sleep(Duration::from_secs(30)).await;
    // A prober made now sees containers that started before it, as after a nodelet restart.
    let handler = Arc::new(FakeHandler::default());
    let prober =
        Prober::new(handler.clone(), n.desired.clone(), ProbeMetrics::unregistered(), n.clock.clone());
    let restarted = Instant::now();
    tokio::spawn(prober.run(n.actual.clone(), n.sandboxes.clone(), std::future::pending()));
    sleep(Duration::from_secs(25)).await;
    let mut first: HashMap<String, Instant> = HashMap::new();
    for run in handler.runs(ProbeKind::Readiness) {
        first.entry(run.container_id).and_modify(|t| *t = (*t).min(run.at)).or_insert(run.at);
    }
    assert_eq!(first.len(), uids.len(), "every running container is probed again");
    let offsets: Vec<Duration> = first.values().map(|t| *t - restarted).collect();
    assert!(offsets.iter().all(|d| *d <= Duration::from_secs(11)), "{offsets:?}");
    let distinct: std::collections::HashSet<u128> = offsets.iter().map(|d| d.as_millis() / 100).collect();
    assert!(distinct.len() >= 5, "first probes not spread over the period: {offsets:?}");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_panics_panics_the_prober_with_its_message() {
    let mut n = node();
    n.add(pod("u1", &probed("    readinessProbe: {exec: {command: [panic, ready]}, periodSeconds: 1}\n")));
    let ended = tokio::time::timeout(LONG, &mut n.prober).await;
    let Ok(Err(e)) = ended else { panic!("the prober should have panicked: {ended:?}") };
    let message = panic_message(e.into_panic());
    assert!(message.contains("the handler panicked"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn at_shutdown_the_prober_returns_once_its_workers_ended_abandoning_a_run_in_progress() {
    let mut n = node();
    n.handler.take_time("slow", Duration::from_secs(30));
    n.add(pod("u1", &probed("    readinessProbe: {exec: {command: [slow, ready]}, periodSeconds: 1}\n")));
    assert!(eventually(LONG, || !n.handler.runs(ProbeKind::Readiness).is_empty()).await);
    n.stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(1), &mut n.prober).await;
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    assert_eq!(n.handler.finished(), 0, "the run in progress was abandoned, not awaited");
}

/// The message of a panic's payload.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn the_prober_takes_a_pods_sandbox_from_the_sandbox_pairs_store() {
    use nodelet_resources::model::actual::{ContainerRecord, PodSandboxes, SandboxRecord};
    let handler = Arc::new(FakeHandler::default());
    let (desired, mut writer) = store::<PodUid, DesiredPod>();
    let (actual, mut actual_writer) = store::<PodUid, PodActual>();
    let (sandboxes, mut sandbox_writer) = store::<PodUid, PodSandboxes>();
    writer.insert(
        "u1".into(),
        pod("u1", &probed("    readinessProbe: {exec: {command: [ok, ready]}, periodSeconds: 1}\n")),
    );
    let running = ContainerRecord {
        id: "c1".into(),
        name: "app".into(),
        sandbox_id: "s1".into(),
        state: ContainerState::Running,
        ..ContainerRecord::default()
    };
    // The pod store holds the containers; only the sandbox pair's store has the pod's sandbox.
    actual_writer.insert(
        "u1".into(),
        PodActual { uid: "u1".into(), containers: vec![running], ..PodActual::default() },
    );
    let prober = Prober::new(handler.clone(), desired, ProbeMetrics::unregistered(), clock());
    let results = prober.results();
    let stop = reconcile_engine::CancellationToken::new();
    let task = tokio::spawn(prober.run(actual, sandboxes, stop.clone().cancelled_owned()));
    sleep(Duration::from_secs(3)).await;
    assert!(handler.runs(ProbeKind::Readiness).is_empty(), "no sandbox in the sandbox pair's store yet");
    let sandbox = |ready| PodSandboxes {
        uid: "u1".into(),
        sandboxes: vec![SandboxRecord { id: "s1".into(), ready, ..SandboxRecord::default() }],
        ..PodSandboxes::default()
    };
    sandbox_writer.insert("u1".into(), sandbox(true));
    sleep(Duration::from_secs(3)).await;
    let runs = handler.runs(ProbeKind::Readiness).len();
    assert!(runs >= 2, "probed once the sandbox pair's store shows the sandbox ready: {runs} runs");
    assert!(results.get(&"c1".to_owned()).is_some());
    // The sandbox died: the workers stop.
    sandbox_writer.insert("u1".into(), sandbox(false));
    sleep(Duration::from_secs(1)).await;
    let before = handler.runs(ProbeKind::Readiness).len();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(handler.runs(ProbeKind::Readiness).len(), before, "no run once the sandbox is not ready");
    stop.cancel();
    task.await.unwrap_or_else(|e| panic!("{e}"));
    drop((writer, actual_writer, sandbox_writer));
}
