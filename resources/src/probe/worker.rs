//! The prober: one timer-driven tokio task per probe of each running container (no threads; time
//! only through `tokio::time`), started when the pod actual store shows the container running in the
//! pod's newest sandbox and the sandbox pair's actual store shows that sandbox ready, and stopped when
//! either stops, and one manager task that owns the results store and applies what the
//! workers report. The pod engine watches the results store (a relation, mapped to the pod by
//! [`pod_of_probes`](super::results::pod_of_probes)), so a result written plans its pod again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use reconcile_engine::{CancellationToken, Store, Writer, store};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::desired::{ProbeKind, ProbeSpec, container_probes};
use super::handler::{ProbeHandler, ProbeOutcome, ProbeTarget};
use super::metrics::{ProbeLabels, ProbeMetrics, RESULTS};
use super::results::{ContainerProbes, ProbeFailure, ProbeResult, ProbeResults};
use crate::common::clock::Clock;
use crate::model::actual::{ContainerState, PodActual, PodSandboxes};
use crate::model::pod::{DesiredPod, PodUid};

/// What the prober waits for a handler beyond the probe's own timeout before it gives up on it
/// (handlers enforce the timeout; this only keeps a hung handler from stopping the worker).
pub const HANDLER_GRACE: Duration = Duration::from_secs(10);

/// What a worker tells the manager.
#[derive(Debug)]
struct Report {
    container_id: String,
    pod_uid: String,
    kind: ProbeKind,
    /// The new result, when it flipped.
    flipped: Option<ProbeResult>,
    /// The message of a failed run.
    failure: Option<String>,
}

/// A worker's stop signal, given when dropped: the worker ends before its next run, or once the run
/// in progress finishes (bounded by the probe's timeout), whose outcome is then dropped.
///
/// A run in progress is never cancelled, as the kubelet never cancels one: containerd 1.6 wedges the
/// container for 30 s when an `ExecSync` is cancelled while its process starts (containerd closes
/// the exec's output pipes and the shim waits to open them, holding the container), and a stop of
/// the container waits for it. A pod removed right after its container started took 30 s to go.
#[derive(Debug)]
struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The prober; see the [module docs](self). Build it with [`Prober::new`], hand
/// [`results`](Prober::results) to the pod reconciler, then [`run`](Prober::run) it.
pub struct Prober<H> {
    handler: Arc<H>,
    desired: Store<PodUid, DesiredPod>,
    results: ProbeResults,
    writer: Writer<String, ContainerProbes>,
    metrics: ProbeMetrics,
    clock: Clock,
    /// When the prober was made (the clock's nanoseconds): containers that started before ran
    /// while nodelet was down, and their first probes are spread over a period.
    created_at: i64,
    /// Per pod: the probed containers (by ID) and their workers.
    workers: HashMap<PodUid, HashMap<String, Vec<StopOnDrop>>>,
    /// Per pod: the container IDs with an entry in the results store.
    entries: HashMap<PodUid, HashSet<String>>,
    /// Per desired pod: the probes that have metric series, deleted when the pod leaves.
    series: HashMap<PodUid, PodSeries>,
    tx: mpsc::UnboundedSender<Report>,
    rx: mpsc::UnboundedReceiver<Report>,
    /// The workers' tasks, owned by [`run`](Prober::run)'s task: a worker's panic is the prober's, and the
    /// prober ends only once its workers have.
    tasks: JoinSet<()>,
}

impl<H> std::fmt::Debug for Prober<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").field("pods", &self.workers.len()).finish_non_exhaustive()
    }
}

impl<H> std::fmt::Debug for WorkerCtx<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCtx")
            .field("spec", &self.spec)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// The metric series of one pod's probes.
#[derive(Debug)]
struct PodSeries {
    /// Cleared (under the write lock) before the series are deleted; workers count a run only
    /// while it is set (under the read lock), so a stopped worker that was mid-run cannot bring a
    /// deleted series back.
    alive: Arc<RwLock<bool>>,
    labels: HashSet<ProbeLabels>,
}

/// Everything one worker needs.
struct WorkerCtx<H> {
    handler: Arc<H>,
    spec: ProbeSpec,
    target: ProbeTarget,
    /// Waits before the first run (what is left of `initialDelaySeconds`).
    delay: Duration,
    /// Liveness and readiness of a container with a startup probe: skip runs until it succeeded.
    gate: Option<ProbeResults>,
    tx: mpsc::UnboundedSender<Report>,
    metrics: ProbeMetrics,
    labels: ProbeLabels,
    /// The pod's [`PodSeries::alive`].
    alive: Arc<RwLock<bool>>,
    /// Cancelled when the worker must stop (see [`StopOnDrop`]).
    stop: CancellationToken,
}

impl<H: ProbeHandler> Prober<H> {
    /// A prober of the pods in `desired`, running probes through `handler`. `clock` is the wall
    /// clock the containers' start times are compared with (for `initialDelaySeconds`).
    pub fn new(
        handler: Arc<H>,
        desired: Store<PodUid, DesiredPod>,
        metrics: ProbeMetrics,
        clock: Clock,
    ) -> Self {
        let (results, writer) = store();
        let (tx, rx) = mpsc::unbounded_channel();
        let created_at = clock();
        Prober {
            handler,
            desired,
            results,
            writer,
            metrics,
            clock,
            created_at,
            workers: HashMap::new(),
            entries: HashMap::new(),
            series: HashMap::new(),
            tx,
            rx,
            tasks: JoinSet::new(),
        }
    }

    /// A reader of the results (for the pod reconciler and status).
    pub fn results(&self) -> ProbeResults {
        self.results.clone()
    }

    /// How many probe workers run now.
    pub fn worker_count(&self) -> usize {
        self.workers.values().flat_map(HashMap::values).map(Vec::len).sum()
    }

    /// Follows the desired and `actual` pod stores and the sandbox pair's actual store `sandboxes`, and
    /// runs the probes of running containers, writing
    /// their results to the results store (which the pod engine watches), until `shutdown`
    /// completes; then stops every worker and returns once they have ended (a run in progress is
    /// abandoned: a handler's runtime call, such as an `ExecSync`, goes on by itself). A worker that panics
    /// panics the prober with its message.
    pub async fn run(
        mut self,
        actual: Store<PodUid, PodActual>,
        sandboxes: Store<PodUid, PodSandboxes>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let desired_sub = self.desired.subscribe();
        let actual_sub = actual.subscribe();
        let sandboxes_sub = sandboxes.subscribe();
        let mut all: HashSet<PodUid> = self.desired.keys().into_iter().collect();
        all.extend(actual.keys());
        for uid in all {
            self.sync_pod(&uid, &actual, &sandboxes);
        }
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = desired_sub.changed() => {
                    for uid in desired_sub.drain() {
                        self.sync_pod(&uid, &actual, &sandboxes);
                    }
                }
                () = actual_sub.changed() => {
                    for uid in actual_sub.drain() {
                        self.sync_pod(&uid, &actual, &sandboxes);
                    }
                }
                () = sandboxes_sub.changed() => {
                    for uid in sandboxes_sub.drain() {
                        self.sync_pod(&uid, &actual, &sandboxes);
                    }
                }
                Some(report) = self.rx.recv() => {
                    self.apply(report);
                    while let Ok(report) = self.rx.try_recv() {
                        self.apply(report);
                    }
                }
                Some(ended) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(e) = ended
                        && e.is_panic()
                    {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
        }
        self.workers.clear();
        self.tasks.shutdown().await;
    }

    fn apply(&mut self, report: Report) {
        let Some(current) = self.results.get(&report.container_id) else {
            // The container stopped meanwhile.
            return;
        };
        let mut entry = (*current).clone();
        if let Some(result) = report.flipped {
            *entry.result_mut(report.kind) = Some(result);
            tracing::info!(
                pod = %report.pod_uid, container = %entry.container, probe = report.kind.as_str(), ?result,
                "probe result changed"
            );
        }
        if let Some(message) = report.failure {
            let count = entry.last_failure.as_ref().map_or(0, |f| f.count).saturating_add(1);
            tracing::debug!(
                pod = %report.pod_uid, container = %entry.container, probe = report.kind.as_str(), %message,
                "probe failed"
            );
            entry.last_failure = Some(ProbeFailure { kind: report.kind, message, count });
        }
        self.writer.insert(report.container_id, entry);
    }

    /// Starts and stops the pod's workers to match its running containers; drops the results of
    /// containers the runtime no longer has.
    fn sync_pod(
        &mut self,
        uid: &PodUid,
        actual: &Store<PodUid, PodActual>,
        sandboxes: &Store<PodUid, PodSandboxes>,
    ) {
        let desired = self.desired.get(uid);
        let state = actual.get(uid);
        let pod_sandboxes = sandboxes.get(uid);
        let mut wanted = Vec::new();
        if let (Some(pod), Some(state)) = (desired.as_deref(), state.as_deref())
            && let Some(sandbox) = pod_sandboxes.as_deref().and_then(PodSandboxes::ready)
        {
            for c in pod.long_running() {
                let probes = container_probes(c);
                if probes.is_empty() {
                    continue;
                }
                if let Some(record) = state
                    .container(&c.name)
                    .filter(|r| r.state == ContainerState::Running && r.sandbox_id == sandbox.id)
                {
                    wanted.push((record.clone(), probes, sandbox.ip.clone()));
                }
            }
        }
        let running = self.workers.entry(uid.clone()).or_default();
        running.retain(|id, _| wanted.iter().any(|(r, _, _)| r.id == *id));
        let entries = self.entries.entry(uid.clone()).or_default();
        for (record, probes, pod_ip) in wanted {
            if running.contains_key(&record.id) {
                continue;
            }
            let Some(pod) = desired.as_deref() else { continue };
            if !entries.contains(&record.id) {
                let kinds = probes.iter().map(|p| p.kind);
                let initial = ContainerProbes::initial(uid, pod.namespace(), pod.name(), &record.name, kinds);
                self.writer.insert(record.id.clone(), initial);
                entries.insert(record.id.clone());
            }
            let target = ProbeTarget {
                pod_uid: uid.clone(),
                namespace: pod.namespace().to_string(),
                pod_name: pod.name().to_string(),
                container: record.name.clone(),
                container_id: record.id.clone(),
                pod_ip,
            };
            let ran_for = Duration::from_nanos(
                u64::try_from((self.clock)().saturating_sub(record.started_at)).unwrap_or(0),
            );
            let ran_for = if record.started_at > 0 { ran_for } else { Duration::ZERO };
            let has_startup = probes.iter().any(|p| p.kind == ProbeKind::Startup);
            let mut tasks = Vec::with_capacity(probes.len());
            let series = self
                .series
                .entry(uid.clone())
                .or_insert_with(|| PodSeries { alive: Arc::new(RwLock::new(true)), labels: HashSet::new() });
            for spec in probes {
                let labels = ProbeLabels {
                    probe_type: spec.kind.as_str(),
                    container: target.container.clone(),
                    pod: target.pod_name.clone(),
                    namespace: target.namespace.clone(),
                    pod_uid: uid.clone(),
                };
                series.labels.insert(labels.clone());
                // As the kubelet does after a restart: containers that were already running get
                // their first probe at a random point of the first period, not all at once.
                let jitter = if record.started_at > 0 && record.started_at < self.created_at {
                    spec.period.mul_f64(fastrand::f64())
                } else {
                    Duration::ZERO
                };
                let stop = CancellationToken::new();
                let ctx = WorkerCtx {
                    handler: self.handler.clone(),
                    delay: spec.initial_delay.saturating_sub(ran_for).max(jitter),
                    gate: (spec.kind != ProbeKind::Startup && has_startup).then(|| self.results.clone()),
                    tx: self.tx.clone(),
                    metrics: self.metrics.clone(),
                    labels,
                    alive: series.alive.clone(),
                    target: target.clone(),
                    spec,
                    stop: stop.clone(),
                };
                self.tasks.spawn(ctx.run());
                tasks.push(StopOnDrop(stop));
            }
            tracing::debug!(pod = %uid, container = %record.name, id = %record.id, probes = tasks.len(), "probing");
            running.insert(record.id.clone(), tasks);
        }
        if running.is_empty() {
            self.workers.remove(uid);
        }
        // Results live as long as the runtime has the container (the last attempt's explain its
        // lastState); the workers only while it runs.
        let present: HashSet<&str> = state
            .as_deref()
            .map(|s| s.containers.iter().map(|c| c.id.as_str()).collect())
            .unwrap_or_default();
        entries.retain(|id| {
            let keep = present.contains(id.as_str());
            if !keep {
                self.writer.remove(id);
            }
            keep
        });
        if entries.is_empty() {
            self.entries.remove(uid);
        }
        // The pod is gone (its workers stopped above): so are its metric series.
        if desired.is_none()
            && let Some(series) = self.series.remove(uid)
        {
            *series.alive.write().unwrap_or_else(std::sync::PoisonError::into_inner) = false;
            for labels in &series.labels {
                self.metrics.forget(labels);
            }
        }
    }
}

/// The result a probe of `kind` starts with.
fn initial_result(kind: ProbeKind) -> ProbeResult {
    match kind {
        ProbeKind::Liveness => ProbeResult::Success,
        ProbeKind::Readiness => ProbeResult::Failure,
        ProbeKind::Startup => ProbeResult::Unknown,
    }
}

impl<H: ProbeHandler> WorkerCtx<H> {
    /// Probes every period until the container stops (the worker is told to stop), or for good
    /// after a liveness or startup failure (the container is restarted with a new ID and new
    /// workers) or a startup success.
    async fn run(self) {
        let spec = &self.spec;
        tokio::select! {
            biased;
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep(self.delay) => {}
        }
        let mut ticker = tokio::time::interval(spec.period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut reported = initial_result(spec.kind);
        let mut last = ProbeResult::Unknown;
        let mut run: u32 = 0;
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if let Some(results) = &self.gate
                && !results.get(&self.target.container_id).is_some_and(|r| r.started())
            {
                continue;
            }
            let started = Instant::now();
            let outcome = match tokio::time::timeout(
                spec.timeout + HANDLER_GRACE,
                self.handler.probe(&self.target, &spec.action, spec.timeout),
            )
            .await
            {
                Ok(outcome) => outcome,
                Err(_) => ProbeOutcome::Error(format!("probe did not finish within {:?}", spec.timeout)),
            };
            // Told to stop while the run was in progress: its outcome is for nobody.
            if self.stop.is_cancelled() {
                return;
            }
            let i = match outcome {
                ProbeOutcome::Success => 0,
                ProbeOutcome::Failure(_) => 1,
                ProbeOutcome::Error(_) => 2,
            };
            {
                let alive = self.alive.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                if *alive {
                    self.metrics.observe(&self.labels, RESULTS[i], started.elapsed().as_secs_f64());
                }
            }
            let result = outcome.result();
            if result == last {
                run = run.saturating_add(1);
            } else {
                last = result;
                run = 1;
            }
            let threshold =
                if result == ProbeResult::Success { spec.success_threshold } else { spec.failure_threshold };
            let flipped = (run >= threshold && result != reported).then_some(result);
            let failure = outcome.message().map(|m| m.chars().take(1024).collect::<String>());
            if flipped.is_some() || failure.is_some() {
                let report = Report {
                    container_id: self.target.container_id.clone(),
                    pod_uid: self.target.pod_uid.clone(),
                    kind: spec.kind,
                    flipped,
                    failure,
                };
                if self.tx.send(report).is_err() {
                    return;
                }
            }
            if let Some(result) = flipped {
                reported = result;
                let fatal = spec.kind != ProbeKind::Readiness && result == ProbeResult::Failure;
                let startup_done = spec.kind == ProbeKind::Startup && result == ProbeResult::Success;
                if fatal || startup_done {
                    return;
                }
            }
        }
    }
}
