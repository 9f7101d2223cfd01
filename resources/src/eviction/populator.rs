//! The verdict populator: the only writer of the verdict store (`Store<PodUid, Verdict>`), the
//! desired state the pod pair reads to know which pods may run.
//!
//! - **Admission**, first come, first served like the kubelet: every pass, the desired pods that
//!   have no verdict yet are decided oldest first (by `metadata.creationTimestamp`, then namespace
//!   and name) against the node's allocatable resources and the pods admitted before them
//!   ([`Admission`]). A pod that already has something in the runtime (containers found by the pod
//!   engine's start-up reconstruction, sandboxes by the sandbox engine's) is always admitted, so the
//!   populator waits for both actual stores to be reconstructed before its first pass. A verdict is final: a refused pod stays refused
//!   until it leaves the desired state, when its verdict and its share of the node go.
//! - **In-place resize**: an admitted pod whose spec asks for other resources is decided again
//!   every pass: the new requests are committed when the node has room, otherwise the verdict
//!   says `Deferred` (decided again as soon as another pod changes or goes) or `Infeasible`.
//! - **Active deadline**: an admitted pod with `spec.activeDeadlineSeconds` is stopped once it has
//!   been active on the node that long (the kubelet's `activeDeadlineHandler`): a `DeadlineExceeded`
//!   verdict, its containers killed with its grace period. It has been active since its first
//!   sandbox was created (as the sandbox pair's actual store has it), or since it was admitted when that is earlier (the pod's `startTime`
//!   as the kubelet sets it when it first syncs the pod). The deadline is read from the current
//!   spec at every pass, so one added or lowered by an update of the pod takes effect; a pass runs
//!   when the earliest deadline of the node comes.
//! - **Eviction**: the eviction pair's [`EvictionDriver`](super::driver::EvictionDriver) sends the
//!   pods it evicts through an [`EvictionSink`]; the populator turns them into `Evicted` verdicts.
//!   The pair's pressure conditions reach admission through a `watch` channel.
//!
//! The pod and sandbox engines watch the verdict store (a declared relation, key = the pod UID), so
//! a pod whose verdict changes is planned again.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use reconcile_engine::{CancellationToken, Store, Writer};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use super::verdict::Admission;
use crate::common::clock::{Clock, system_clock};
use crate::model::actual::{PodActual, PodSandboxes};
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::pressure::Condition;
use crate::model::verdict::{DEADLINE_EXCEEDED, ResizeDecision, Verdict, pod_requests};

/// A pod the eviction pair decided to evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// The pod.
    pub uid: PodUid,
    /// The kubelet's message (`The node was low on resource: memory. ...`).
    pub message: String,
    /// The grace period its containers are killed with.
    pub grace: Duration,
    /// When it was decided, nanoseconds since the Unix epoch.
    pub at: i64,
    /// Over a local storage limit rather than under node pressure (no `DisruptionTarget`
    /// condition).
    pub over_limit: bool,
}

/// Where the eviction pair's driver sends its evictions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EvictionSink(mpsc::UnboundedSender<Eviction>);

impl EvictionSink {
    /// Sends `eviction` to the populator; `false` when the populator is gone.
    pub fn evict(&self, eviction: Eviction) -> bool {
        self.0.send(eviction).is_ok()
    }
}

/// The populator's end of an [`EvictionSink`].
#[derive(Debug)]
pub struct Evictions(mpsc::UnboundedReceiver<Eviction>);

impl Evictions {
    /// The next eviction sent, if one is waiting (for tests).
    pub fn try_next(&mut self) -> Option<Eviction> {
        self.0.try_recv().ok()
    }
}

/// A channel from the eviction pair's driver to the verdict populator.
pub fn evictions() -> (EvictionSink, Evictions) {
    let (tx, rx) = mpsc::unbounded_channel();
    (EvictionSink(tx), Evictions(rx))
}

/// Writes the verdict store from the desired pods, the actual pods and their sandboxes (at start-up;
/// the sandboxes' creation for active deadlines), the eviction pair's pressure conditions and evictions.
pub struct VerdictPopulator {
    pods: Store<PodUid, DesiredPod>,
    pod_actual: Store<PodUid, PodActual>,
    sandboxes: Store<PodUid, PodSandboxes>,
    writer: Writer<PodUid, Verdict>,
    admission: Admission,
    conditions: watch::Receiver<BTreeSet<Condition>>,
    evictions: Evictions,
    clock: Clock,
    /// When each admitted pod was admitted (wall-clock nanoseconds), for its active deadline.
    admitted_at: HashMap<PodUid, i64>,
    /// The earliest active deadline of an admitted pod (wall-clock nanoseconds), if any.
    next_deadline: Option<i64>,
}

impl std::fmt::Debug for VerdictPopulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictPopulator").field("admission", &self.admission).finish_non_exhaustive()
    }
}

/// The order of admission: oldest first (pods without a creation time, e.g. static pods, before
/// the others), then by namespace and name.
fn admission_order(a: &DesiredPod, b: &DesiredPod) -> std::cmp::Ordering {
    let created = |p: &DesiredPod| p.pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a).cmp(&created(b)).then_with(|| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())))
}

impl VerdictPopulator {
    /// A populator of the desired pods `pods`, whose containers and sandboxes are in `pod_actual` and
    /// `sandboxes` (the pod and sandbox pairs' actual stores), deciding with `admission`, writing
    /// through `writer`.
    pub fn new(
        pods: Store<PodUid, DesiredPod>,
        pod_actual: Store<PodUid, PodActual>,
        sandboxes: Store<PodUid, PodSandboxes>,
        writer: Writer<PodUid, Verdict>,
        admission: Admission,
        conditions: watch::Receiver<BTreeSet<Condition>>,
        evictions: Evictions,
    ) -> Self {
        Self {
            pods,
            pod_actual,
            sandboxes,
            writer,
            admission,
            conditions,
            evictions,
            clock: system_clock(),
            admitted_at: HashMap::new(),
            next_deadline: None,
        }
    }

    /// Reads the wall clock from `clock` (active deadlines) instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// When `pod` (admitted) reaches its `activeDeadlineSeconds`, wall-clock nanoseconds: `None`
    /// without one.
    fn deadline_of(&self, pod: &DesiredPod) -> Option<i64> {
        let seconds = pod.pod.spec.as_ref()?.active_deadline_seconds?;
        let uid = pod.uid();
        let sandbox = self
            .sandboxes
            .get(&uid.to_owned())
            .and_then(|a| a.sandboxes.iter().map(|s| s.created_at).filter(|t| *t > 0).min());
        let start = match (self.admitted_at.get(uid).copied(), sandbox) {
            (Some(a), Some(s)) => a.min(s),
            (a, s) => a.or(s)?,
        };
        Some(start.saturating_add(seconds.saturating_mul(1_000_000_000)))
    }

    /// Stops the admitted pods past their active deadline and notes the next deadline to come.
    /// Returns the number of verdicts that changed.
    fn enforce_deadlines(&mut self) -> usize {
        let now = (self.clock)();
        let verdicts = self.writer.reader();
        let mut changed = 0;
        let mut next: Option<i64> = None;
        for (uid, pod) in self.pods.entries() {
            if !verdicts.get(&uid).is_some_and(|v| v.is_admitted()) {
                continue;
            }
            let Some(deadline) = self.deadline_of(&pod) else { continue };
            if deadline <= now {
                info!(pod = %pod.name(), namespace = %pod.namespace(), reason = DEADLINE_EXCEEDED, "pod past its activeDeadlineSeconds; stopping it");
                self.writer.insert(uid, Verdict::deadline_exceeded(pod.grace_period(), now));
                changed += 1;
            } else {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
        }
        self.next_deadline = next;
        changed
    }

    /// A reader of the verdict store.
    pub fn verdicts(&self) -> Store<PodUid, Verdict> {
        self.writer.reader()
    }

    /// One pass over the desired pods: forgets the pods that are gone, decides the pending
    /// resizes of admitted pods, then admits or refuses the new pods oldest first. Returns the
    /// number of verdicts that changed.
    pub fn sync(&mut self) -> usize {
        let verdicts = self.writer.reader();
        let mut changed = 0;
        for uid in verdicts.keys() {
            if !self.pods.contains_key(&uid) {
                self.writer.remove(&uid);
                self.admission.forget(&uid);
                self.admitted_at.remove(&uid);
                changed += 1;
            }
        }
        let mut new = Vec::new();
        for (uid, pod) in self.pods.entries() {
            match verdicts.get(&uid) {
                Some(v) if v.is_admitted() => {
                    let verdict = match (self.admission.resize(&pod), v.granted()) {
                        (
                            Some(d @ (ResizeDecision::Deferred | ResizeDecision::Infeasible)),
                            Some(granted),
                        ) => Verdict::Admitted { granted, resize: Some((pod_requests(&pod), d)) },
                        (decision, _) => {
                            if decision.is_some() {
                                debug!(pod = %pod.name(), namespace = %pod.namespace(), "resize accepted");
                            }
                            Verdict::admitted(&pod)
                        }
                    };
                    changed += usize::from(self.writer.upsert(uid, verdict));
                }
                // A refusal or an eviction is final.
                Some(_) => {}
                None => new.push(pod),
            }
        }
        new.sort_by(|a, b| admission_order(a, b));
        let conditions = self.conditions.borrow().clone();
        for pod in new {
            let uid = pod.uid().to_owned();
            let started = self.pod_actual.get(&uid).is_some_and(|a| !a.containers.is_empty())
                || self.sandboxes.get(&uid).is_some_and(|s| !s.sandboxes.is_empty());
            let verdict = self.admission.admit(&pod, started, &conditions);
            if let Some(stopped) = verdict.stopped() {
                info!(
                    pod = %pod.name(),
                    namespace = %pod.namespace(),
                    reason = %stopped.reason,
                    message = %stopped.message,
                    "pod refused at admission"
                );
            }
            if verdict.is_admitted() {
                self.admitted_at.insert(uid.clone(), (self.clock)());
            }
            self.writer.insert(uid, verdict);
            changed += 1;
        }
        changed + self.enforce_deadlines()
    }

    /// Records `eviction`, unless the pod is gone or already stopped; returns whether it did.
    pub fn evict(&mut self, eviction: Eviction) -> bool {
        let Eviction { uid, message, grace, at, over_limit } = eviction;
        if !self.pods.contains_key(&uid) || self.writer.reader().get(&uid).is_some_and(|v| !v.is_admitted()) {
            return false;
        }
        let verdict = if over_limit {
            Verdict::evicted_over_limit(message, grace, at)
        } else {
            Verdict::evicted(message, grace, at)
        };
        self.writer.insert(uid, verdict);
        true
    }

    /// Populates until `shutdown`: first once the pod engine has reconstructed what the runtime
    /// holds (pods found there are admitted whatever they ask), then on every change of the
    /// desired pods and every eviction.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let pods_sub = self.pods.subscribe();
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = async {
                let _ = self.pod_actual.wait_until_synced().await;
                let _ = self.sandboxes.wait_until_synced().await;
            } => {}
        }
        let changed = self.sync();
        debug!(changed, "verdicts synced");
        loop {
            // The next active deadline, as a delay from now on the wall clock.
            let until_deadline = self.next_deadline.map(|at| {
                Duration::from_nanos(u64::try_from(at.saturating_sub((self.clock)())).unwrap_or(0))
            });
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = pods_sub.changed() => {
                    pods_sub.drain();
                    self.sync();
                }
                () = tokio::time::sleep(until_deadline.unwrap_or_default()), if until_deadline.is_some() => {
                    self.enforce_deadlines();
                }
                Some(eviction) = self.evictions.0.recv() => {
                    self.evict(eviction);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use std::sync::Arc;

    use super::*;
    use crate::eviction::verdict::NodeResources;
    use crate::model::actual::{ContainerRecord, ContainerState};
    use crate::model::pod::PodSource;
    use crate::model::verdict::VerdictKind;

    fn pod(name: &str, created: Option<&str>, cpu: &str) -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "creationTimestamp": created},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        DesiredPod { pod, source: PodSource::Http }
    }

    struct Setup {
        populator: VerdictPopulator,
        pods: Writer<PodUid, DesiredPod>,
        actual: Writer<PodUid, PodActual>,
        sandboxes: Writer<PodUid, PodSandboxes>,
        conditions: watch::Sender<BTreeSet<Condition>>,
        sink: EvictionSink,
    }

    fn setup(cpu_milli: i64) -> Setup {
        let (pod_store, pods) = reconcile_engine::store();
        let (actual_store, actual) = reconcile_engine::store();
        let (sandbox_store, sandboxes) = reconcile_engine::store();
        let (_, writer) = reconcile_engine::store();
        let (conditions, rx) = watch::channel(BTreeSet::new());
        let (sink, evictions) = evictions();
        let admission =
            Admission::new().with_resources(NodeResources { cpu_milli, memory_bytes: 1 << 30, max_pods: 10 });
        let populator =
            VerdictPopulator::new(pod_store, actual_store, sandbox_store, writer, admission, rx, evictions);
        Setup { populator, pods, actual, sandboxes, conditions, sink }
    }

    fn reason(s: &Setup, uid: &str) -> Option<String> {
        let v = s.populator.verdicts().get(&uid.to_owned())?;
        Some(v.stopped().map_or_else(|| "Admitted".to_owned(), |s| s.reason.clone()))
    }

    fn running() -> PodActual {
        let c = ContainerRecord { state: ContainerState::Running, ..ContainerRecord::default() };
        PodActual { containers: vec![c], ..PodActual::default() }
    }

    #[test]
    fn a_pod_with_only_a_sandbox_in_the_runtime_is_admitted_whatever_it_asks() {
        let mut s = setup(1000);
        s.pods.insert("first".into(), pod("first", Some("2026-01-01T00:00:01Z"), "600m"));
        s.pods.insert("sandboxed".into(), pod("sandboxed", Some("2026-01-01T00:00:02Z"), "900m"));
        s.pods.insert("new".into(), pod("new", Some("2026-01-01T00:00:03Z"), "900m"));
        // Its sandbox is in the sandbox pair's actual store; the pod actual store has no container of it.
        let sandbox = crate::model::actual::SandboxRecord { id: "s".into(), ..Default::default() };
        s.sandboxes
            .insert("sandboxed".into(), PodSandboxes { sandboxes: vec![sandbox], ..Default::default() });
        s.actual.insert("sandboxed".into(), PodActual::default());
        assert_eq!(s.populator.sync(), 3);
        assert_eq!(reason(&s, "first").as_deref(), Some("Admitted"));
        assert_eq!(reason(&s, "sandboxed").as_deref(), Some("Admitted"), "already in the runtime");
        assert_eq!(reason(&s, "new").as_deref(), Some("OutOfcpu"));
    }

    #[test]
    fn pods_are_admitted_oldest_first_and_running_pods_always() {
        let mut s = setup(1000);
        // Inserted newest first: the order of arrival in one pass does not matter, creation does.
        s.pods.insert("newer".into(), pod("newer", Some("2026-01-01T00:00:02Z"), "600m"));
        s.pods.insert("older".into(), pod("older", Some("2026-01-01T00:00:01Z"), "600m"));
        s.pods.insert("adopted".into(), pod("adopted", Some("2026-01-01T00:00:03Z"), "900m"));
        s.actual.insert("adopted".into(), running());
        assert_eq!(s.populator.sync(), 3);
        assert_eq!(reason(&s, "older").as_deref(), Some("Admitted"));
        assert_eq!(reason(&s, "newer").as_deref(), Some("OutOfcpu"));
        assert_eq!(reason(&s, "adopted").as_deref(), Some("Admitted"), "already in the runtime");
        assert_eq!(s.populator.sync(), 0, "nothing changed");
        // A refusal is final while the pod is desired; once gone, its verdict goes with it.
        s.pods.remove(&"older".to_owned());
        s.populator.sync();
        assert_eq!(reason(&s, "older"), None);
        assert_eq!(reason(&s, "newer").as_deref(), Some("OutOfcpu"), "still refused");
        s.pods.remove(&"newer".to_owned());
        s.populator.sync();
        s.pods.insert("newer".into(), pod("newer", Some("2026-01-01T00:00:02Z"), "50m"));
        s.populator.sync();
        assert_eq!(
            reason(&s, "newer").as_deref(),
            Some("Admitted"),
            "a new pod with that UID is decided anew"
        );
    }

    #[test]
    fn pressure_conditions_refuse_new_pods_only() {
        let mut s = setup(1000);
        s.pods.insert("before".into(), pod("before", None, "10m"));
        s.populator.sync();
        s.conditions.send_replace([Condition::DiskPressure].into());
        s.pods.insert("after".into(), pod("after", None, "10m"));
        s.populator.sync();
        assert_eq!(reason(&s, "before").as_deref(), Some("Admitted"));
        let verdict = s.populator.verdicts().get(&"after".to_owned());
        let message = verdict.as_deref().and_then(Verdict::stopped).map(|s| s.message.clone());
        assert_eq!(message.as_deref(), Some("The node had condition: [DiskPressure]. "));
    }

    #[test]
    fn a_deferred_resize_is_decided_again_when_another_pod_goes() {
        let mut s = setup(1000);
        s.pods.insert("small".into(), pod("small", None, "400m"));
        s.pods.insert("other".into(), pod("other", None, "500m"));
        s.populator.sync();
        s.pods.insert("small".into(), pod("small", None, "600m"));
        s.populator.sync();
        let resize = |s: &Setup, cpu: &str| {
            s.populator
                .verdicts()
                .get(&"small".to_owned())
                .and_then(|v| v.resize_for(&pod("small", None, cpu)))
        };
        assert_eq!(resize(&s, "600m"), Some(ResizeDecision::Deferred));
        assert_eq!(resize(&s, "400m"), Some(ResizeDecision::Accepted), "it keeps what it has");
        assert_eq!(resize(&s, "700m"), None, "not decided");
        s.pods.remove(&"other".to_owned());
        s.populator.sync();
        assert_eq!(resize(&s, "600m"), Some(ResizeDecision::Accepted));
        let verdict = s.populator.verdicts().get(&"small".to_owned());
        assert_eq!(verdict.as_deref(), Some(&Verdict::admitted(&pod("small", None, "600m"))));
    }

    #[test]
    fn evictions_stop_admitted_pods_that_are_still_desired() {
        let mut s = setup(1000);
        s.pods.insert("victim".into(), pod("victim", None, "10m"));
        s.populator.sync();
        let eviction = |uid: &str| Eviction {
            uid: uid.into(),
            message: "The node was low on resource: memory. ".into(),
            grace: Duration::from_secs(1),
            at: 7,
            over_limit: false,
        };
        assert!(s.sink.evict(eviction("victim")));
        let next = s.populator.evictions.try_next().unwrap_or_else(|| panic!("sent"));
        assert!(s.populator.evict(next));
        let verdict = s.populator.verdicts().get(&"victim".to_owned());
        let stopped = verdict.as_deref().and_then(Verdict::stopped).cloned();
        assert_eq!(
            stopped.map(|s| (s.kind, s.reason, s.grace, s.at)),
            Some((VerdictKind::Evicted, "Evicted".into(), Duration::from_secs(1), 7))
        );
        assert!(!s.populator.evict(eviction("victim")), "already stopped");
        assert!(!s.populator.evict(eviction("gone")), "not desired");
        assert_eq!(s.populator.sync(), 0, "an eviction is final");
    }

    fn with_deadline(name: &str, seconds: Option<i64>) -> DesiredPod {
        let mut p = pod(name, None, "10m");
        if let Some(spec) = p.pod.spec.as_mut() {
            spec.active_deadline_seconds = seconds;
            spec.termination_grace_period_seconds = Some(3);
        }
        p
    }

    /// A wall clock following (paused) tokio time, from 1000 s after the epoch.
    fn tokio_clock() -> Clock {
        let start = tokio::time::Instant::now();
        Arc::new(move || 1_000_000_000_000 + i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX))
    }

    fn stopped(
        verdicts: &Store<PodUid, Verdict>,
        uid: &str,
    ) -> Option<(VerdictKind, String, String, Duration)> {
        let v = verdicts.get(&uid.to_owned())?;
        v.stopped().map(|s| (s.kind.clone(), s.reason.clone(), s.message.clone(), s.grace))
    }

    #[tokio::test(start_paused = true)]
    async fn an_active_deadline_added_or_lowered_by_an_update_stops_the_pod_when_it_passes() {
        let mut s = setup(1000);
        s.populator = s.populator.with_clock(tokio_clock());
        let verdicts = s.populator.verdicts();
        let shutdown = CancellationToken::new();
        s.actual.mark_synced();
        s.sandboxes.mark_synced();
        let Setup {
            populator,
            mut pods,
            actual: _actual,
            sandboxes: _sandboxes,
            conditions: _c,
            sink: _sink,
        } = s;
        pods.insert("added".into(), with_deadline("added", None));
        pods.insert("lowered".into(), with_deadline("lowered", Some(600)));
        let task = tokio::spawn(populator.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(stopped(&verdicts, "added"), None);
        assert!(verdicts.get(&"added".to_owned()).is_some_and(|v| v.is_admitted()));

        // 10 s in: a deadline of 30 s is added to one, the other's goes from 600 s to 5 s (passed).
        pods.insert("added".into(), with_deadline("added", Some(30)));
        pods.insert("lowered".into(), with_deadline("lowered", Some(5)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let expected = Some((
            VerdictKind::Evicted,
            "DeadlineExceeded".to_owned(),
            "Pod was active on the node longer than the specified deadline".to_owned(),
            Duration::from_secs(3),
        ));
        assert_eq!(stopped(&verdicts, "lowered"), expected, "past its lowered deadline at once");
        assert_eq!(stopped(&verdicts, "added"), None, "11 s of 30");
        tokio::time::sleep(Duration::from_secs(18)).await;
        assert_eq!(stopped(&verdicts, "added"), None, "29 s of 30");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(stopped(&verdicts, "added"), expected, "woken by its deadline, no other change");
        shutdown.cancel();
        task.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_pod_found_running_counts_from_its_sandbox() {
        let mut s = setup(1000);
        let now = Arc::new(std::sync::atomic::AtomicI64::new(100_000_000_000));
        let read = now.clone();
        s.populator =
            s.populator.with_clock(Arc::new(move || read.load(std::sync::atomic::Ordering::SeqCst)));
        s.pods.insert("adopted".into(), with_deadline("adopted", Some(60)));
        s.actual.insert("adopted".into(), running());
        let sandbox =
            crate::model::actual::SandboxRecord { created_at: 50_000_000_000, ..Default::default() };
        s.sandboxes.insert("adopted".into(), PodSandboxes { sandboxes: vec![sandbox], ..Default::default() });
        s.populator.sync();
        assert_eq!(reason(&s, "adopted").as_deref(), Some("Admitted"), "50 s of 60");
        now.store(110_000_000_000, std::sync::atomic::Ordering::SeqCst);
        s.populator.sync();
        assert_eq!(reason(&s, "adopted").as_deref(), Some("DeadlineExceeded"), "60 s after its sandbox");
        assert_eq!(s.populator.sync(), 0, "final");
    }

    #[tokio::test(start_paused = true)]
    async fn the_running_populator_decides_a_new_pod_and_wakes_it() {
        let mut s = setup(1000);
        let verdicts = s.populator.verdicts();
        let shutdown = CancellationToken::new();
        s.actual.mark_synced();
        s.sandboxes.mark_synced();
        let Setup {
            populator,
            mut pods,
            actual: _actual,
            sandboxes: _sandboxes,
            conditions: _c,
            sink: _sink,
        } = s;
        let task = tokio::spawn(populator.run(shutdown.clone()));
        tokio::task::yield_now().await;
        pods.insert("p".into(), pod("p", None, "10m"));
        let sub = verdicts.subscribe();
        tokio::time::timeout(Duration::from_secs(1), sub.changed())
            .await
            .unwrap_or_else(|_| panic!("decided"));
        assert_eq!(
            verdicts.get(&"p".to_owned()).as_deref(),
            Some(&Verdict::admitted(&pod("p", None, "10m")))
        );
        shutdown.cancel();
        task.await.unwrap_or_else(|e| panic!("{e}"));
    }
}
