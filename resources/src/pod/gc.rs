//! Container garbage collection as operations of the pod pair, as the kubelet's
//! (`pkg/kubelet/kuberuntime/kuberuntime_gc.go`) decides it: dead containers beyond the newest
//! `maxPerPodContainer` (1) of each container of a pod, and older than `minAge` (0), are removed
//! with their logs ([`PodOp::PruneContainers`]); when `maxContainers` (-1: no limit) is set, the
//! oldest dead containers beyond it across the node too. The sandboxes that are not ready, hold no
//! container and are not their pod's newest
//! ([`dead_sandboxes`](crate::model::actual::dead_sandboxes)) are the sandbox pair's to remove (its
//! `SandboxOp::Prune`): it owns the sandboxes, and the pod pair plans none.
//!
//! The pod reconciler plans these for a pod when nothing more urgent is due for it ([`after`]),
//! from the policy and the wall clock, so the pod pair stays the only writer of its runtime
//! objects. `maxContainers` is a batch decision over every pod: the [`SurplusPopulator`] makes it
//! every `nodelet.containerGC.period` over one snapshot of the pods and writes, per pod, the dead
//! containers beyond the node's cap into a store the reconciler reads as a side input (the pod
//! engine watches it: a pod whose entry changed is planned again); each removal is still an
//! operation on its own pod's key, and the reconciler checks every chosen container again (dead,
//! not shown by status, old enough).
//!
//! What pod status still shows is never removed: the newest attempt of every container, and the
//! attempt before it when the newest has exited for good (its `lastState`). This agrees with the pod
//! driver, which removes attempts older than the previous one whenever it starts a container. Pods
//! that are no longer desired are torn down completely by the pod pair.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{CancellationToken, Plan, Store, Writer};
use tokio::sync::watch;

use super::ops::PodOp;
use crate::common::clock::Clock;
use crate::model::actual::{ContainerRecord, ContainerState, PodActual};
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::pressure::Signal;
use crate::model::pressure::{ReclaimError, Reclaimer};
use futures::future::BoxFuture;

/// How the collector chooses; the kubelet's `GCPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// How often the node-wide decision (`maxContainers`) is made again.
    pub period: Duration,
    /// Dead containers created less than this long ago stay.
    pub min_age: Duration,
    /// Dead containers kept per container of a pod (at least 1).
    pub max_per_pod_container: u32,
    /// Dead containers kept on the node; `None`: no limit (the kubelet's -1).
    pub max_containers: Option<u32>,
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

/// Per pod, the dead containers beyond the node's `maxContainers` (written by [`SurplusPopulator`]).
pub type Surplus = BTreeSet<String>;

/// What [`after`] decides from: the policy and the node-wide decision.
#[derive(Debug, Clone)]
pub struct ContainerGc {
    /// The policy.
    pub policy: ContainerGcPolicy,
    /// The surplus store, when `maxContainers` is set (the pod reconciler's side input, watched by
    /// the pod engine with the identity mapping).
    pub surplus: Option<Store<PodUid, Surplus>>,
}

/// What one collection removes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Container IDs, with their pods.
    pub containers: Vec<(PodUid, String)>,
    /// When the next container becomes old enough to go (wall clock, ns), if one waits for `minAge`.
    pub next_due: Option<i64>,
}

/// One dead container that may go.
struct Candidate<'a> {
    uid: &'a str,
    record: &'a ContainerRecord,
    /// Status shows it: never removed.
    protected: bool,
}

/// Chooses what to remove from the pods in `actual`, at wall-clock time `now` (ns since the epoch).
/// `restarts(uid, exit_code)` says whether the pod restarts a container that exited with that code
/// (`None`: the pod is not desired; the pod pair removes it, so it is skipped here). `extra(uid, id)`
/// marks dead containers to remove besides the policy's own choice (the node-wide surplus), still
/// only when unprotected and old enough.
pub fn plan(
    policy: &ContainerGcPolicy,
    now: i64,
    actual: &[(PodUid, Arc<PodActual>)],
    restarts: impl Fn(&str, i32) -> Option<bool>,
    extra: impl Fn(&str, &str) -> bool,
) -> GcPlan {
    let min_age = i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX);
    let keep = usize::try_from(policy.max_per_pod_container.max(1)).unwrap_or(usize::MAX);
    let mut out = GcPlan::default();
    // Evict units (pod, container name): dead attempts, newest first.
    let mut units: Vec<Vec<Candidate<'_>>> = Vec::new();
    for (uid, pod) in actual {
        // Probe the pod once: not desired → the pod pair's teardown.
        if restarts(uid, 0).is_none() {
            continue;
        }
        let mut by_name: BTreeMap<&str, Vec<&ContainerRecord>> = BTreeMap::new();
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
                .map(|record| Candidate { uid, record, protected: protected.contains(record.id.as_str()) })
                .collect();
            if !dead.is_empty() {
                units.push(dead);
            }
        }
    }
    let due = |c: &ContainerRecord| c.created_at.saturating_add(min_age);
    // Beyond the newest `keep` dead attempts of each unit (or marked by `extra`).
    let enforce = |units: &mut Vec<Vec<Candidate<'_>>>, keep: usize, out: &mut GcPlan| {
        for unit in units.iter_mut() {
            let mut kept = 0;
            unit.retain(|c| {
                let wanted = kept >= keep || extra(c.uid, &c.record.id);
                if c.protected || !wanted {
                    kept += 1;
                    return true;
                }
                if due(c.record) > now {
                    out.next_due = Some(out.next_due.map_or(due(c.record), |d| d.min(due(c.record))));
                    kept += 1;
                    return true;
                }
                out.containers.push((c.uid.to_owned(), c.record.id.clone()));
                false
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
                units.iter().flatten().filter(|c| !c.protected && due(c.record) <= now).collect();
            rest.sort_by_key(|c| c.record.created_at);
            let total: usize = units.iter().map(Vec::len).sum();
            for c in rest.into_iter().take(total.saturating_sub(max)) {
                out.containers.push((c.uid.to_owned(), c.record.id.clone()));
            }
        }
    }
    out
}

/// The node-wide decision: per pod, the dead containers that only `maxContainers` removes (those
/// the per-pod policy removes anyway are left to it). Empty without a node limit.
pub fn node_surplus(
    policy: &ContainerGcPolicy,
    now: i64,
    actual: &[(PodUid, Arc<PodActual>)],
    restarts: impl Fn(&str, i32) -> Option<bool>,
) -> BTreeMap<PodUid, Surplus> {
    if policy.max_containers.is_none() {
        return BTreeMap::new();
    }
    let per_pod = ContainerGcPolicy { max_containers: None, ..*policy };
    let anyway: HashSet<String> = plan(&per_pod, now, actual, &restarts, |_, _| false)
        .containers
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    let mut out: BTreeMap<PodUid, Surplus> = BTreeMap::new();
    for (uid, id) in plan(policy, now, actual, &restarts, |_, _| false).containers {
        if !anyway.contains(&id) {
            out.entry(uid).or_default().insert(id);
        }
    }
    out
}

/// For a pod the reconciler has nothing more urgent to do for (`next` is `Idle` or a recheck):
/// a pruning of its dead containers, else `next` (with a recheck when
/// a dead container becomes old enough to go). `now`: the wall clock, ns since the epoch.
pub fn after(
    gc: &ContainerGc,
    now: i64,
    pod: &DesiredPod,
    actual: &PodActual,
    next: Plan<PodOp>,
) -> Plan<PodOp> {
    if matches!(next, Plan::Run(_)) || actual.containers.is_empty() {
        return next;
    }
    let uid = pod.uid().to_owned();
    let surplus = gc.surplus.as_ref().and_then(|s| s.get(&uid));
    let policy = ContainerGcPolicy { max_containers: None, ..gc.policy };
    let restart_policy = pod.restart_policy();
    let pods = [(uid, Arc::new(actual.clone()))];
    let planned = plan(
        &policy,
        now,
        &pods,
        |_, code| Some(restart_policy.restarts(code)),
        |_, id| surplus.as_ref().is_some_and(|s| s.contains(id)),
    );
    if !planned.containers.is_empty() {
        return Plan::Run(PodOp::PruneContainers {
            ids: planned.containers.into_iter().map(|(_, id)| id).collect(),
        });
    }
    let Some(due) = planned.next_due else { return next };
    let wait = Duration::from_nanos(u64::try_from(due.saturating_sub(now)).unwrap_or(0));
    match next {
        Plan::RecheckAfter(d) => Plan::RecheckAfter(d.min(wait)),
        _ => Plan::RecheckAfter(wait),
    }
}

/// Makes the node-wide decision every `period` (and when asked through [`ContainerGcReclaimer`]) and
/// writes it into the surplus store; the pod engine watches that store, so a pod whose entry changed
/// is planned again. When asked (disk pressure), every pod's entry is written again, so that every
/// pod is planned again.
pub struct SurplusPopulator {
    policy: ContainerGcPolicy,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    surplus: Writer<PodUid, Surplus>,
    clock: Clock,
    requests: watch::Receiver<u64>,
}

impl std::fmt::Debug for SurplusPopulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SurplusPopulator").field("policy", &self.policy).finish_non_exhaustive()
    }
}

/// The surplus store (the pod reconciler's side input, to be watched by the pod engine), its
/// [`SurplusPopulator`] over the desired pods and the pod engine's `actual` store, and a
/// [`ContainerGcReclaimer`] for the eviction pair.
pub fn container_gc(
    policy: ContainerGcPolicy,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    clock: Clock,
) -> (Store<PodUid, Surplus>, SurplusPopulator, ContainerGcReclaimer) {
    let (store, surplus) = reconcile_engine::store();
    let (tx, requests) = watch::channel(0u64);
    let populator = SurplusPopulator { policy, desired, actual, surplus, clock, requests };
    (store, populator, ContainerGcReclaimer(Arc::new(tx)))
}

impl SurplusPopulator {
    /// One decision, written into the surplus store (only the pods whose surplus changed); with
    /// `all`, every pod's entry is written again (empty where it has none), which plans every pod
    /// again.
    pub fn pass(&mut self, all: bool) {
        let actual = self.actual.entries();
        let desired = &self.desired;
        let surplus = node_surplus(&self.policy, (self.clock)(), &actual, |uid, code| {
            desired.get(&uid.to_owned()).map(|p| p.restart_policy().restarts(code))
        });
        if all {
            for (uid, _) in &actual {
                self.surplus.insert(uid.clone(), surplus.get(uid).cloned().unwrap_or_default());
            }
            let stale: Vec<PodUid> = self
                .surplus
                .reader()
                .keys()
                .into_iter()
                .filter(|uid| !actual.iter().any(|(u, _)| u == uid))
                .collect();
            for uid in stale {
                self.surplus.remove(&uid);
            }
        } else {
            self.surplus.replace_all(surplus);
        }
        self.surplus.mark_synced();
    }

    /// Decides every period (the first time one period after the start) and on request, until
    /// `stop` is cancelled.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.policy.period, self.policy.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        loop {
            let all = tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => false,
                r = self.requests.changed(), if open => {
                    open = r.is_ok();
                    open
                }
            };
            self.pass(all);
        }
    }
}

/// Container GC as node-level reclaim: under disk pressure it asks for a collection now (every pod
/// is planned again, so the pod reconciler prunes what the policy allows), before images go, as the
/// kubelet reclaims on a single filesystem. The runtime does not say how much a removed container
/// took: the signals show it.
#[derive(Debug, Clone)]
pub struct ContainerGcReclaimer(Arc<watch::Sender<u64>>);

impl Reclaimer for ContainerGcReclaimer {
    fn name(&self) -> &'static str {
        "container-gc"
    }

    fn reclaim(&self, signal: Signal, _bytes: u64) -> BoxFuture<'_, Result<u64, ReclaimError>> {
        if signal.is_disk() {
            self.0.send_modify(|n| *n = n.wrapping_add(1));
            tracing::debug!("container GC for disk pressure");
        }
        Box::pin(std::future::ready(Ok(0)))
    }
}

#[cfg(test)]
mod tests {
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
        vec![("u1".to_owned(), Arc::new(PodActual { uid: "u1".into(), containers, ..PodActual::default() }))]
    }

    fn ids(p: &GcPlan) -> Vec<&str> {
        let mut v: Vec<&str> = p.containers.iter().map(|(_, id)| id.as_str()).collect();
        v.sort_unstable();
        v
    }

    fn none(_: &str, _: &str) -> bool {
        false
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
        let p = plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, always, none);
        assert_eq!(ids(&p), vec!["c0", "c1"]);
        // Min age: the ones created less than 95 s ago stay (c1 is 90 s old), due 5 s later.
        let policy = ContainerGcPolicy { min_age: Duration::from_secs(95), ..ContainerGcPolicy::default() };
        let p = plan(&policy, 100 * SEC, &actual, always, none);
        assert_eq!(ids(&p), vec!["c0"]);
        assert_eq!(p.next_due, Some(105 * SEC));
        // Not desired: the pod pair's teardown.
        assert!(
            plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, |_, _| None, none).containers.is_empty()
        );
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
            ids(&plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, on_failure, none)),
            vec!["c0"]
        );
        // Crash looping (the newest will restart): only the newest is needed.
        let p = plan(&ContainerGcPolicy::default(), 100 * SEC, &actual, |_, _| Some(true), none);
        assert_eq!(ids(&p), vec!["c0", "c1"]);
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
        // b1 is b's newest (protected); b0 goes to get each container down to one, then a1 (the oldest
        // unprotected) to get the node down towards one.
        assert_eq!(ids(&plan(&policy, 100 * SEC, &actual, |_, _| Some(true), none)), vec!["a1", "b0"]);
        // As a batch decision: both are surplus (the per-pod policy alone keeps 5 per container).
        let surplus = node_surplus(&policy, 100 * SEC, &actual, |_, _| Some(true));
        assert_eq!(
            surplus.get("u1").map(|s| s.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(vec!["a1", "b0"])
        );
        // Without a node limit, nothing is surplus.
        let policy = ContainerGcPolicy { max_containers: None, ..policy };
        assert!(node_surplus(&policy, 100 * SEC, &actual, |_, _| Some(true)).is_empty());
    }

    fn desired(restart_policy: &str) -> DesiredPod {
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"restartPolicy": restart_policy, "containers": [{"name": "app", "image": "busybox"}]}
        });
        DesiredPod {
            pod: serde_json::from_value(pod).unwrap_or_default(),
            source: crate::model::pod::PodSource::Http,
        }
    }

    #[test]
    fn the_reconciler_prunes_only_when_nothing_more_urgent_is_due() {
        let actual = pod(vec![
            record("c2", "app", 2, Exited, 20 * SEC, 1),
            record("c1", "app", 1, Exited, 10 * SEC, 1),
            record("c0", "app", 0, Exited, 0, 1),
        ]);
        let policy = ContainerGcPolicy { min_age: Duration::from_secs(85), ..ContainerGcPolicy::default() };
        let gc = ContainerGc { policy, surplus: None };
        let pod = desired("Always");
        let start = Plan::Run(PodOp::Refresh);
        assert_eq!(
            after(&gc, 100 * SEC, &pod, &actual[0].1, start.clone()),
            start,
            "a step of the pod goes first"
        );
        // While the newest waits in its back-off: the older attempt old enough goes (c1 is 90 s old, c0 100 s).
        let backoff = Plan::RecheckAfter(Duration::from_secs(40));
        assert_eq!(
            after(&gc, 100 * SEC, &pod, &actual[0].1, backoff.clone()),
            Plan::Run(PodOp::PruneContainers { ids: vec!["c1".into(), "c0".into()] })
        );
        // Not old enough yet: looked at again when it is, or when the pod's own recheck is due.
        assert_eq!(
            after(&gc, 80 * SEC, &pod, &actual[0].1, Plan::Idle),
            Plan::RecheckAfter(Duration::from_secs(5))
        );
        assert_eq!(
            after(&gc, 80 * SEC, &pod, &actual[0].1, Plan::RecheckAfter(Duration::from_secs(2))),
            Plan::RecheckAfter(Duration::from_secs(2))
        );
        // The node-wide surplus removes beyond the per-pod policy, never the newest.
        let policy = ContainerGcPolicy { max_per_pod_container: 5, ..ContainerGcPolicy::default() };
        let (store, mut writer) = reconcile_engine::store::<PodUid, Surplus>();
        writer.insert("u1".into(), ["c0".to_owned(), "c2".to_owned()].into());
        let gc = ContainerGc { policy, surplus: Some(store) };
        assert_eq!(
            after(&gc, 100 * SEC, &pod, &actual[0].1, Plan::Idle),
            Plan::Run(PodOp::PruneContainers { ids: vec!["c0".into()] })
        );
    }
}
