//! Container garbage collection, as the kubelet's (`pkg/kubelet/kuberuntime/kuberuntime_gc.go`): every
//! period (`nodelet.containerGC.period`, 1 min), dead containers beyond the newest
//! `maxPerPodContainer` (1) of each container of each pod, and older than `minAge` (0), are removed with
//! their logs; then, when `maxContainers` (-1: no limit) is set, the oldest dead containers beyond it; then
//! the sandboxes that are not ready, hold no container and are not their pod's newest.
//!
//! What pod status still shows is never removed: the newest attempt of every container, and the attempt
//! before it when the newest has exited for good (its `lastState`). This agrees with the pod driver,
//! which removes attempts older than the previous one whenever it starts a container.
//!
//! Pods that are no longer desired are left to the pod engine, which removes everything of theirs.
//! The collector reads the pod engine's actual store (the PLEG keeps it current) and wakes the PLEG
//! after removing something.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodelet_resources::pod::actual::{ContainerRecord, ContainerState, PodActual};
use nodelet_resources::pod::desired::{DesiredPod, PodUid};
use nodelet_resources::pod::driver::{PodRuntime, RuntimeError};
use nodelet_resources::pod::reconciler::Clock;
use reconcile_engine::Store;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How the collector chooses; the kubelet's `GCPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContainerGcPolicy {
    /// How often it runs.
    pub(crate) period: Duration,
    /// Dead containers created less than this long ago stay.
    pub(crate) min_age: Duration,
    /// Dead containers kept per container of a pod (at least 1).
    pub(crate) max_per_pod_container: u32,
    /// Dead containers kept on the node; `None`: no limit (the kubelet's -1).
    pub(crate) max_containers: Option<u32>,
}

impl Default for ContainerGcPolicy {
    /// The kubelet's: every minute, min age 0, one dead container per container, no node limit.
    fn default() -> Self {
        Self {
            period: Duration::from_secs(60),
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: None,
        }
    }
}

/// What one collection removes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GcPlan {
    /// Container IDs.
    pub(crate) containers: Vec<String>,
    /// Sandbox IDs.
    pub(crate) sandboxes: Vec<String>,
}

/// One dead container that may go.
struct Candidate<'a> {
    record: &'a ContainerRecord,
    /// Status shows it: never removed.
    protected: bool,
}

/// Chooses what to remove from the pods in `actual`, at wall-clock time `now` (ns since the epoch).
/// `restarts(uid, exit_code)` says whether the pod restarts a container that exited with that code
/// (`None`: the pod is not desired; the pod engine removes it, so it is skipped here).
pub(crate) fn plan(
    policy: &ContainerGcPolicy,
    now: i64,
    actual: &[(PodUid, Arc<PodActual>)],
    restarts: impl Fn(&str, i32) -> Option<bool>,
) -> GcPlan {
    let min_age = i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX);
    let keep = usize::try_from(policy.max_per_pod_container.max(1)).unwrap_or(usize::MAX);
    let mut out = GcPlan::default();
    // Evict units (pod, container name): dead attempts, newest first.
    let mut units: Vec<Vec<Candidate<'_>>> = Vec::new();
    for (uid, pod) in actual {
        // Probe the pod once: not desired → the engine's job.
        if restarts(uid, 0).is_none() {
            continue;
        }
        let mut by_name: HashMap<&str, Vec<&ContainerRecord>> = HashMap::new();
        for c in &pod.containers {
            by_name.entry(c.name.as_str()).or_default().push(c);
        }
        for (_, mut attempts) in by_name {
            attempts.sort_by_key(|c| std::cmp::Reverse((c.restart_count, c.created_at)));
            let Some(newest) = attempts.first().copied() else { continue };
            let terminal =
                newest.state == ContainerState::Exited && restarts(uid, newest.exit_code) == Some(false);
            let protected: HashSet<&str> =
                attempts.iter().take(if terminal { 2 } else { 1 }).map(|c| c.id.as_str()).collect();
            let dead: Vec<Candidate<'_>> = attempts
                .into_iter()
                .filter(|c| c.state == ContainerState::Exited)
                .map(|record| Candidate { record, protected: protected.contains(record.id.as_str()) })
                .collect();
            if !dead.is_empty() {
                units.push(dead);
            }
        }
    }
    let old_enough = |c: &ContainerRecord| now.saturating_sub(c.created_at) >= min_age;
    // Beyond the newest `keep` dead attempts of each unit.
    let enforce = |units: &mut Vec<Vec<Candidate<'_>>>, keep: usize, out: &mut GcPlan| {
        for unit in units.iter_mut() {
            let mut kept = 0;
            unit.retain(|c| {
                if c.protected || kept < keep || !old_enough(c.record) {
                    kept += 1;
                    true
                } else {
                    out.containers.push(c.record.id.clone());
                    false
                }
            });
        }
    };
    enforce(&mut units, keep, &mut out);
    if let Some(max) = policy.max_containers.map(|m| usize::try_from(m).unwrap_or(usize::MAX)) {
        let total: usize = units.iter().map(Vec::len).sum();
        if total > max && !units.is_empty() {
            let per_unit = (max / units.len()).max(1);
            enforce(&mut units, per_unit, &mut out);
            // Still too many: the oldest first, across the node.
            let mut rest: Vec<&Candidate<'_>> =
                units.iter().flatten().filter(|c| !c.protected && old_enough(c.record)).collect();
            rest.sort_by_key(|c| c.record.created_at);
            let total: usize = units.iter().map(Vec::len).sum();
            for c in rest.into_iter().take(total.saturating_sub(max)) {
                out.containers.push(c.record.id.clone());
            }
        }
    }
    // Sandboxes: not ready, not the pod's newest, holding no container that stays.
    let removed: HashSet<&str> = out.containers.iter().map(String::as_str).collect();
    for (uid, pod) in actual {
        if restarts(uid, 0).is_none() {
            continue;
        }
        let in_use: HashSet<&str> = pod
            .containers
            .iter()
            .filter(|c| !removed.contains(c.id.as_str()))
            .map(|c| c.sandbox_id.as_str())
            .collect();
        let newest = pod.sandboxes.iter().max_by_key(|s| (s.attempt, s.created_at)).map(|s| s.id.as_str());
        for s in &pod.sandboxes {
            if !s.ready && Some(s.id.as_str()) != newest && !in_use.contains(s.id.as_str()) {
                out.sandboxes.push(s.id.clone());
            }
        }
    }
    out
}

/// What the collector removes through.
pub(crate) trait GcRuntime: Send + Sync + 'static {
    /// Removes a container and its log; a missing one is fine.
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
    /// Removes a sandbox; a missing one is fine.
    fn remove_sandbox(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
}

impl GcRuntime for nodelet_cri::CriPodRuntime {
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        PodRuntime::remove_container(self, id)
    }

    fn remove_sandbox(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        nodelet_resources::sandbox::driver::SandboxRuntime::remove_sandbox(self, id)
    }
}

/// The periodic collector.
pub(crate) struct ContainerGc<R> {
    runtime: Arc<R>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    policy: ContainerGcPolicy,
    clock: Clock,
    pleg: Option<Arc<Notify>>,
}

impl<R> std::fmt::Debug for ContainerGc<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerGc").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl<R: GcRuntime> ContainerGc<R> {
    /// A collector over the pod engine's stores.
    pub(crate) fn new(
        runtime: Arc<R>,
        desired: Store<PodUid, DesiredPod>,
        actual: Store<PodUid, PodActual>,
        policy: ContainerGcPolicy,
        clock: Clock,
    ) -> Self {
        Self { runtime, desired, actual, policy, clock, pleg: None }
    }

    /// Wakes the PLEG (`Pleg::waker`) after removing something, so the actual store catches up at once.
    pub(crate) fn with_pleg(mut self, waker: Arc<Notify>) -> Self {
        self.pleg = Some(waker);
        self
    }

    /// One collection; returns how many containers and sandboxes were removed.
    pub(crate) async fn collect(&self) -> (usize, usize) {
        let actual = self.actual.entries();
        let desired = &self.desired;
        let plan = plan(&self.policy, (self.clock)(), &actual, |uid, code| {
            desired.get(&uid.to_owned()).map(|p| p.restart_policy().restarts(code))
        });
        let mut removed = (0, 0);
        for id in &plan.containers {
            match self.runtime.remove_container(id).await {
                Ok(()) => removed.0 += 1,
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "container GC: cannot remove a dead container")
                }
            }
        }
        for id in &plan.sandboxes {
            match self.runtime.remove_sandbox(id).await {
                Ok(()) => removed.1 += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "container GC: cannot remove a dead sandbox")
                }
            }
        }
        if removed != (0, 0) {
            tracing::info!(
                containers = removed.0,
                sandboxes = removed.1,
                "container GC removed dead containers"
            );
            if let Some(pleg) = &self.pleg {
                pleg.notify_one();
            }
        }
        removed
    }

    /// Collects every period until `stop` is cancelled (the first time one period after the start).
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.policy.period, self.policy.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.collect().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nodelet_resources::pod::actual::SandboxRecord;
    use nodelet_resources::pod::desired::PodSource;

    use super::*;

    const SEC: i64 = 1_000_000_000;

    fn record(
        id: &str,
        name: &str,
        attempt: u32,
        state: ContainerState,
        created: i64,
        code: i32,
    ) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            name: name.into(),
            sandbox_id: "s1".into(),
            restart_count: attempt,
            state,
            created_at: created,
            exit_code: code,
            ..ContainerRecord::default()
        }
    }

    fn pod(containers: Vec<ContainerRecord>) -> Vec<(PodUid, Arc<PodActual>)> {
        let sandboxes =
            vec![SandboxRecord { id: "s1".into(), ready: true, created_at: 0, ..SandboxRecord::default() }];
        vec![(
            "u1".to_owned(),
            Arc::new(PodActual { uid: "u1".into(), sandboxes, containers, ..PodActual::default() }),
        )]
    }

    use ContainerState::{Exited, Running};

    #[test]
    fn keeps_the_newest_dead_attempt_beside_the_running_one() {
        let actual = pod(vec![
            record("c3", "app", 3, Running, 30 * SEC, 0),
            record("c2", "app", 2, Exited, 20 * SEC, 1),
            record("c1", "app", 1, Exited, 10 * SEC, 1),
            record("c0", "app", 0, Exited, 0, 1),
            record("s0", "side", 0, Running, 0, 0),
        ]);
        let always = |_: &str, _: i32| Some(true);
        let p = plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, always);
        let mut removed = p.containers.clone();
        removed.sort();
        assert_eq!(removed, vec!["c0", "c1"]);
        assert!(p.sandboxes.is_empty());
        // Min age: the ones created less than 95 s ago stay (c1 is 90 s old).
        let policy = ContainerGcPolicy { min_age: Duration::from_secs(95), ..ContainerGcPolicy::default() };
        assert_eq!(plan(&policy, 100 * SEC, &actual, always).containers, vec!["c0"]);
        // Not desired: the pod engine's job.
        assert!(plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, |_, _| None).containers.is_empty());
    }

    #[test]
    fn status_keeps_last_state_of_a_finished_container() {
        // OnFailure: attempt 1 failed, attempt 2 succeeded for good; attempt 1 is its lastState.
        let actual = pod(vec![
            record("c2", "job", 2, Exited, 20 * SEC, 0),
            record("c1", "job", 1, Exited, 10 * SEC, 1),
            record("c0", "job", 0, Exited, 0, 1),
        ]);
        let on_failure = |_: &str, code: i32| Some(code != 0);
        assert_eq!(
            plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, on_failure).containers,
            vec!["c0"]
        );
        // Crash looping (the newest will restart): only the newest is needed.
        let mut removed =
            plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, |_, _| Some(true)).containers;
        removed.sort();
        assert_eq!(removed, vec!["c0", "c1"]);
    }

    #[test]
    fn node_limit_removes_the_oldest_but_never_what_status_shows() {
        let actual = pod(vec![
            record("a2", "a", 2, Running, 50 * SEC, 0),
            record("a1", "a", 1, Exited, 40 * SEC, 1),
            record("b1", "b", 1, Exited, 30 * SEC, 1),
            record("b0", "b", 0, Exited, 5 * SEC, 1),
        ]);
        let policy = ContainerGcPolicy {
            max_per_pod_container: 5,
            max_containers: Some(1),
            ..ContainerGcPolicy::default()
        };
        let mut removed = plan(&policy, 100 * SEC, &actual, |_, _| Some(true)).containers;
        removed.sort();
        // b1 is b's newest (protected); b0 goes to get each container down to one, then a1 (the oldest
        // unprotected) to get the node down towards one.
        assert_eq!(removed, vec!["a1", "b0"]);
    }

    #[test]
    fn dead_sandboxes_go_unless_newest_or_in_use() {
        let mut actual = pod(vec![record("c1", "app", 1, Running, 30 * SEC, 0), {
            let mut c = record("c0", "app", 0, Exited, 0, 1);
            c.sandbox_id = "old-with-container".into();
            c
        }]);
        if let Some(p) = Arc::get_mut(&mut actual[0].1) {
            p.sandboxes = vec![
                SandboxRecord {
                    id: "s1".into(),
                    ready: true,
                    attempt: 2,
                    created_at: 20,
                    ..SandboxRecord::default()
                },
                SandboxRecord {
                    id: "old-with-container".into(),
                    attempt: 1,
                    created_at: 10,
                    ..SandboxRecord::default()
                },
                SandboxRecord {
                    id: "old-empty".into(),
                    attempt: 0,
                    created_at: 0,
                    ..SandboxRecord::default()
                },
            ];
        }
        let p = plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, |_, _| Some(true));
        assert!(p.containers.is_empty());
        assert_eq!(p.sandboxes, vec!["old-empty"]);
    }

    #[derive(Default)]
    struct Fake {
        removed: Mutex<Vec<String>>,
    }

    impl GcRuntime for Fake {
        fn remove_container(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
            self.removed.lock().unwrap().push(id.to_owned());
            std::future::ready(Ok(()))
        }
        fn remove_sandbox(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
            self.removed.lock().unwrap().push(id.to_owned());
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runs_every_period_and_honours_min_age_in_wall_time() {
        let (desired, mut desired_w) = reconcile_engine::store::<PodUid, DesiredPod>();
        let (actual, mut actual_w) = reconcile_engine::store::<PodUid, PodActual>();
        let pod_json = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]}
        });
        let k8s_pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_json).unwrap();
        desired_w.insert("u1".to_owned(), DesiredPod { pod: k8s_pod, source: PodSource::Http });
        let start = tokio::time::Instant::now();
        // Wall clock = paused tokio time, starting at 1000 s.
        let clock: Clock = Arc::new(move || 1000 * SEC + i64::try_from(start.elapsed().as_nanos()).unwrap());
        let containers = vec![
            record("c2", "app", 2, Exited, 1000 * SEC, 1),
            record("c1", "app", 1, Exited, 1000 * SEC, 1),
        ];
        actual_w.insert("u1".to_owned(), Arc::unwrap_or_clone(pod(containers).remove(0).1));
        let fake = Arc::new(Fake::default());
        let policy = ContainerGcPolicy {
            period: Duration::from_secs(60),
            min_age: Duration::from_secs(90),
            ..ContainerGcPolicy::default()
        };
        let gc = ContainerGc::new(fake.clone(), desired, actual, policy, clock);
        let stop = CancellationToken::new();
        let task = tokio::spawn(gc.run(stop.clone()));
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(fake.removed.lock().unwrap().is_empty(), "c1 is only 61 s old");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(*fake.removed.lock().unwrap(), vec!["c1"], "121 s old at the second run");
        stop.cancel();
        task.await.unwrap();
    }
}
