//! The status manager: every pod's status, as nodelet computes it, written to the API server.
//!
//! - **What is written.** For a pod from the API, its own `pods/status`; for a static pod, the
//!   status of its mirror pod (once the mirror exists). The status is the one `/pods` shows plus
//!   `hostIP`/`hostIPs`, with each condition's `lastTransitionTime` kept from when its status last
//!   changed; conditions nodelet does not own (set by the scheduler, controllers or readiness
//!   gates) are kept as the API has them. `Ready` of a pod with `spec.readinessGates` is decided
//!   here again, over those conditions: `True` only when its containers are ready and every gate's
//!   condition is `True` (else `ReadinessGatesNotReady`, as the kubelet words it). A change of the
//!   API pod (a gate's condition patched by a controller) wakes a pass for that pod.
//! - **Only on change.** A pod's status is patched (JSON merge patch with `metadata.uid`, so a pod
//!   recreated under the same name is never written) when it differs from what was last written;
//!   a failed write is retried with back-off, and only the latest status is ever sent, so nothing is
//!   lost while the API server is away.
//! - **Graceful deletion.** A pod with a `deletionTimestamp` is stopped by the pod engine with its
//!   grace period; once nothing of it runs, its final status (phase `Succeeded` when every container
//!   exited 0, else `Failed`) is written and the pod deleted with grace period 0 (UID
//!   precondition), which finishes the deletion as the kubelet does.
//!
//! Woken by changes of the desired and actual pod stores, of the probe results and of the API's
//! pods; a pass then builds the statuses of just the pods those changes name (a status patch's echo
//! costs one pod's status, not every pod's). Every 10 s (the kubelet's status batch period), and
//! while a failed write waits for its retry, a pass looks at every pod. Statuses are computed
//! locally, API calls happen only for changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{HostIP, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::actual::PodSandboxes;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::pod::status::{KUBELET_CONDITIONS, pod_ready_condition};
use nodelet_resources::pod::validation::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
use reconcile_engine::{Store, Subscription};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Backoff;
use super::pods::{ApiPod, ApiPodSnapshot};
use crate::server::NodeView;

/// Top-level status fields nodelet owns: cleared in the API when nodelet's status lacks them.
const OWNED_FIELDS: [&str; 13] = [
    "phase",
    "message",
    "reason",
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "qosClass",
    "resize",
];

/// The longest time between two passes (the kubelet's status manager syncs every 10 s).
const BATCH_PERIOD: Duration = Duration::from_secs(10);
/// How long after its last write a pod's status in the API is compared with what nodelet would write
/// (before, the API's pods may not show the write yet).
const RECONCILE_AFTER: Duration = Duration::from_secs(2);

/// Where a pod's status goes: the API pod (its own, or the static pod's mirror).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
}

/// The stores a pod's status is computed from, each of which wakes the status manager.
pub(crate) struct PodStores {
    /// The desired pods.
    pub(crate) desired: Store<PodUid, DesiredPod>,
    /// The pod pair's actual store.
    pub(crate) actual: Store<PodUid, PodActual>,
    /// The sandbox pair's actual store: a pod's IP and `PodReadyToStartContainers` come from it,
    /// and a stopped sandbox is what lets a deleted pod go.
    pub(crate) sandboxes: Store<PodUid, PodSandboxes>,
    /// The changes of the other stores by pod that a pod's status is computed from (the pod and
    /// sandbox pairs' operation status, the node's verdicts).
    pub(crate) related: Vec<Subscription<PodUid>>,
}

/// The status manager; see the [module docs](self).
pub(crate) struct StatusManager<V> {
    api: kube::Client,
    view: Arc<V>,
    desired: Store<PodUid, DesiredPod>,
    actual: Store<PodUid, PodActual>,
    /// The sandbox pair's actual store: a pod's IP and `PodReadyToStartContainers` come from it,
    /// and a stopped sandbox is what lets a deleted pod go.
    sandboxes: Store<PodUid, PodSandboxes>,
    /// See [`PodStores::related`].
    related: Vec<Subscription<PodUid>>,
    probes: nodelet_resources::probe::results::ProbeResults,
    snapshot: watch::Receiver<Arc<ApiPodSnapshot>>,
    host_ips: Vec<String>,
    /// What was last written, per target UID: its digest ([`status_digest`]), not the status (a few
    /// kilobytes a pod), and when.
    sent: HashMap<String, ([u8; 32], Instant)>,
    /// When each condition of each target last changed status.
    transitions: Transitions,
    /// Targets deleted with grace 0 already.
    finalized: HashSet<String>,
    /// Targets whose last write failed: when to try again, and the back-off.
    retry: HashMap<String, (Instant, Backoff)>,
    /// The API's pods at the last pass (its changes since name the pods to look at).
    seen_snapshot: Arc<ApiPodSnapshot>,
}

/// When each condition of each target last changed status: per target UID, its conditions' (type,
/// status, when). Kept per target rather than per (target, type) pair: a map keeps room for up to twice
/// the entries it holds, and each pair's entry held its own copy of the UID.
#[derive(Debug, Default)]
struct Transitions(HashMap<String, Vec<Transition>>);

/// A condition's type, its status and when it took that status.
type Transition = (Box<str>, Box<str>, Time);

impl Transitions {
    /// The conditions of target `uid`.
    fn of(&mut self, uid: &str) -> TargetTransitions<'_> {
        TargetTransitions(self.0.entry(uid.to_owned()).or_default())
    }

    /// Keeps the targets whose UID `keep` accepts.
    fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|uid, _| keep(uid));
    }

    #[cfg(test)]
    fn targets(&self) -> usize {
        self.0.len()
    }
}

/// One target's condition transitions ([`Transitions::of`]).
struct TargetTransitions<'a>(&'a mut Vec<Transition>);

impl TargetTransitions<'_> {
    /// When condition `type_`, now `status`, took that status: the time kept if its status is the one
    /// kept; else, for a condition not seen before, `api_same` (the API's time of the same status) or
    /// `now`; else (its status changed) `now`.
    fn at(&mut self, type_: &str, status: &str, api_same: Option<&Time>, now: &Time) -> Time {
        match self.0.iter_mut().find(|(t, _, _)| **t == *type_) {
            Some((_, kept, at)) => {
                if **kept != *status {
                    *kept = status.into();
                    *at = now.clone();
                }
                at.clone()
            }
            None => {
                let at = api_same.unwrap_or(now).clone();
                self.0.push((type_.into(), status.into(), at.clone()));
                at
            }
        }
    }

    /// Gives back the room the list grew beyond its conditions.
    fn done(self) {
        self.0.shrink_to_fit();
    }
}

impl<V> std::fmt::Debug for StatusManager<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager").field("sent", &self.sent.len()).finish_non_exhaustive()
    }
}

impl<V: NodeView> StatusManager<V> {
    /// Writes the statuses of `view`'s pods (computed from `pods`); `host_ips` are the node's
    /// InternalIPs.
    pub(crate) fn new(
        client: kube::Client,
        view: Arc<V>,
        pods: PodStores,
        probes: nodelet_resources::probe::results::ProbeResults,
        snapshot: watch::Receiver<Arc<ApiPodSnapshot>>,
        host_ips: Vec<String>,
    ) -> Self {
        let PodStores { desired, actual, sandboxes, related } = pods;
        Self {
            api: client,
            view,
            desired,
            actual,
            sandboxes,
            related,
            probes,
            snapshot,
            host_ips,
            sent: HashMap::new(),
            transitions: Transitions::default(),
            finalized: HashSet::new(),
            retry: HashMap::new(),
            seen_snapshot: Arc::new(ApiPodSnapshot::default()),
        }
    }

    /// Writes statuses until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut by_pod = vec![self.desired.subscribe(), self.actual.subscribe(), self.sandboxes.subscribe()];
        by_pod.append(&mut self.related);
        let probe_changes = self.probes.subscribe();
        // When the last pass over every pod was (none yet).
        let mut last_full: Option<Instant> = None;
        loop {
            let now = Instant::now();
            // The next pass over every pod: the batch period after the last (at once for the first,
            // once the API's pods are listed), sooner for a retry.
            let first = if self.snapshot.borrow().synced { now } else { now + BATCH_PERIOD };
            let full_due = self
                .retry
                .values()
                .map(|(at, _)| (*at).max(now + Duration::from_millis(100)))
                .chain(Some(last_full.map_or(first, |at| at + BATCH_PERIOD)))
                .min()
                .unwrap_or(now);
            let mut full = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = futures::future::select_all(by_pod.iter().map(|s| Box::pin(s.changed()))) => false,
                () = probe_changes.changed() => false,
                r = self.snapshot.changed() => if r.is_err() { return } else { false },
                () = tokio::time::sleep_until(full_due) => true,
            };
            // Coalesce a burst of changes into one pass.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut dirty: HashSet<PodUid> = by_pod.iter().flat_map(Subscription::drain).collect();
            let probed: HashSet<String> = probe_changes.drain().into_iter().collect();
            if !probed.is_empty() {
                // probe results are kept by container ID
                self.actual.for_each(|uid, pod| {
                    if pod.containers.iter().any(|c| probed.contains(&c.id)) {
                        dirty.insert(uid.clone());
                    }
                });
            }
            full |= Instant::now() >= full_due;
            // Boxed: a pass's state (the patches under way) is held only while it runs.
            if Box::pin(self.sync(if full { None } else { Some(dirty) })).await == Some(true) {
                last_full = Some(Instant::now());
            }
        }
    }

    /// One pass over every pod (`only` `None`, or no pass yet), or over the pods `only` and those
    /// whose API pod changed since the last pass. Returns whether the pass was over every pod;
    /// `None` when none ran (the API's pods are not listed yet).
    async fn sync(&mut self, only: Option<HashSet<PodUid>>) -> Option<bool> {
        let snapshot = self.snapshot.borrow_and_update().clone();
        if !snapshot.synced {
            return None;
        }
        let (pods, all) = match only {
            Some(mut uids) if self.seen_snapshot.synced => {
                uids.extend(changed_in_api(&self.seen_snapshot, &snapshot, &self.desired));
                (uids.iter().filter_map(|uid| self.view.pod(uid)).collect(), false)
            }
            _ => (self.view.pods().items, true),
        };
        self.seen_snapshot = snapshot.clone();
        self.sync_pods(pods, &snapshot, all).await;
        Some(all)
    }

    /// Writes the statuses of `pods` that changed; `all`: `pods` are every pod, and what was kept
    /// for the others is forgotten.
    async fn sync_pods(&mut self, pods: Vec<Pod>, snapshot: &ApiPodSnapshot, all: bool) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut live = HashSet::new();
        for pod in pods {
            let Some((target, api_pod)) = target_of(&pod, snapshot) else { continue };
            live.insert(target.uid.clone());
            if self.finalized.contains(&target.uid) {
                continue;
            }
            if self.retry.get(&target.uid).is_some_and(|(at, _)| Instant::now() < *at) {
                continue;
            }
            let terminated = is_terminated(&pod);
            let status = self.status_for(&target, &pod, api_pod, terminated, &now);
            let digest = status_digest(&status);
            let sent = self.sent.get(&target.uid);
            // Someone else changed a condition of ours in the API (the node lifecycle controller sets
            // Ready=False while the node is NotReady, and leaves it when the node is back): a pass over
            // every pod writes it again, as the kubelet's status manager reconciles every 10 s. A write of
            // the last `RECONCILE_AFTER` may not be in the API's pods yet.
            let overwritten = all
                && sent.is_some_and(|(_, at)| at.elapsed() >= RECONCILE_AFTER)
                && own_conditions_differ(&status, api_pod.status.as_ref());
            if digest.is_none() || sent.map(|(d, _)| d) != digest.as_ref() || overwritten {
                match self.write(&target, &status).await {
                    Ok(()) => {
                        self.retry.remove(&target.uid);
                        match digest {
                            Some(digest) => self.sent.insert(target.uid.clone(), (digest, Instant::now())),
                            None => self.sent.remove(&target.uid),
                        };
                    }
                    Err(e) => {
                        self.failed(&target, "writing the pod status", &e);
                        continue;
                    }
                }
            }
            if terminated && pod.metadata.deletion_timestamp.is_some() && is_api_pod(&pod) {
                match self.finalize(&target).await {
                    Ok(()) => {
                        self.finalized.insert(target.uid.clone());
                    }
                    Err(e) => self.failed(&target, "deleting the terminated pod", &e),
                }
            }
        }
        if all {
            // Forget pods that are gone.
            self.sent.retain(|uid, _| live.contains(uid));
            self.transitions.retain(|uid| live.contains(uid));
            self.retry.retain(|uid, _| live.contains(uid));
            self.finalized.retain(|uid| live.contains(uid));
        }
    }

    fn failed(&mut self, target: &Target, what: &str, e: &kube::Error) {
        let (at, backoff) =
            self.retry.entry(target.uid.clone()).or_insert_with(|| (Instant::now(), Backoff::default()));
        let delay = backoff.next_delay();
        *at = Instant::now() + delay;
        tracing::warn!(pod = %format!("{}/{}", target.namespace, target.name), error = %e, retry_in = ?delay, "{what} failed");
    }

    /// The status to write for `pod` to `target`.
    fn status_for(
        &mut self,
        target: &Target,
        pod: &Pod,
        api_pod: &ApiPod,
        terminated: bool,
        now: &Time,
    ) -> PodStatus {
        let mut status = pod.status.clone().unwrap_or_default();
        if !is_api_pod(pod) {
            // A mirror pod cannot have ephemeral containers (`nodelet debug` adds them to the static pod
            // only): their statuses stay on nodelet's `/pods`.
            status.ephemeral_container_statuses = None;
        }
        if let Some(ip) = self.host_ips.first() {
            status.host_ip = Some(ip.clone());
            status.host_ips = Some(self.host_ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect());
        }
        if terminated && pod.metadata.deletion_timestamp.is_some() {
            let phase = status.phase.as_deref().unwrap_or_default();
            if phase != "Succeeded" && phase != "Failed" {
                let all_zero = status.container_statuses.iter().flatten().all(|c| {
                    c.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0)
                });
                status.phase = Some(if all_zero { "Succeeded" } else { "Failed" }.to_owned());
            }
        }
        let api_status = api_pod.status.as_ref();
        keep_recorded_qos_class(&mut status, api_status);
        let mut conditions = status.conditions.take().unwrap_or_default();
        let theirs = with_conditions_of_others(pod, api_status, &mut conditions);
        let mut transitions = self.transitions.of(&target.uid);
        for c in &mut conditions {
            let api_same = api_status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|a| a.type_ == c.type_))
                .filter(|a| a.status == c.status)
                .and_then(|a| a.last_transition_time.as_ref());
            c.last_transition_time = Some(transitions.at(&c.type_, &c.status, api_same, now));
        }
        transitions.done();
        conditions.extend(theirs);
        status.conditions = Some(conditions);
        status.nominated_node_name = api_status.and_then(|s| s.nominated_node_name.clone());
        status
    }

    async fn write(&self, target: &Target, status: &PodStatus) -> Result<(), kube::Error> {
        let mut status_json = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
        if let Some(map) = status_json.as_object_mut() {
            for field in OWNED_FIELDS {
                map.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let patch = serde_json::json!({
            "metadata": { "uid": target.uid },
            "status": status_json,
        });
        let pods: Api<Pod> = Api::namespaced(self.api.clone(), &target.namespace);
        pods.patch_status(&target.name, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(())
    }

    async fn finalize(&self, target: &Target) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.api.clone(), &target.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(target.uid.clone()), resource_version: None }),
            ..DeleteParams::default()
        };
        match pods.delete(&target.name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{}/{}", target.namespace, target.name), "pod terminated; deleted from the API");
                Ok(())
            }
            // Gone already, or a new pod under the name: nothing of ours to delete.
            Err(e) if super::is_status(&e, 404) || super::is_status(&e, 409) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Whether the API's status `api` lacks or has another status of one of the kubelet's conditions in `ours`.
fn own_conditions_differ(ours: &PodStatus, api: Option<&PodStatus>) -> bool {
    let api = api.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    ours.conditions
        .iter()
        .flatten()
        .filter(|c| KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .any(|c| api.iter().find(|a| a.type_ == c.type_).is_none_or(|a| a.status != c.status))
}

/// A SHA-256 digest of `status` as JSON (serde_json writes a struct's fields in their order and maps in
/// key order: the same status always gives the same digest); `None` if it cannot be serialized (never
/// equal to anything: the status is written).
fn status_digest(status: &PodStatus) -> Option<[u8; 32]> {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    serde_json::to_writer(&mut hasher, status).ok()?;
    Some(hasher.finalize().into())
}

/// Takes the conditions others own (readiness gates, controllers) from the API's status of `pod`,
/// as the API has them, and decides `Ready` among `ours` again over them when `pod` has
/// readiness gates. Returns the others' conditions.
fn with_conditions_of_others(
    pod: &Pod,
    api_status: Option<&PodStatus>,
    ours: &mut Vec<PodCondition>,
) -> Vec<PodCondition> {
    let own: HashSet<&str> = ours.iter().map(|c| c.type_.as_str()).collect();
    let theirs: Vec<PodCondition> = api_status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| !own.contains(c.type_.as_str()) && !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    let gated = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_some_and(|g| !g.is_empty());
    if gated && let Some(containers_ready) = ours.iter().find(|c| c.type_ == "ContainersReady").cloned() {
        let ready = pod_ready_condition(pod.spec.as_ref(), &containers_ready, &theirs);
        match ours.iter_mut().find(|c| c.type_ == "Ready") {
            Some(c) => *c = ready,
            None => ours.push(ready),
        }
    }
    theirs
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn is_api_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION) == Some("api")
}

/// Where `pod`'s status goes, and the API's copy of it.
fn target_of<'a>(pod: &Pod, snapshot: &'a ApiPodSnapshot) -> Option<(Target, &'a ApiPod)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref()?;
    let api_pod = snapshot.get(namespace, name)?;
    let matches = if is_api_pod(pod) {
        api_pod.uid == pod.metadata.uid
    } else {
        // A static pod: its mirror, when the mirror reflects this version of it.
        api_pod.mirror.is_some() && api_pod.mirror.as_deref() == annotation(pod, CONFIG_HASH_ANNOTATION)
    };
    if !matches {
        return None;
    }
    let target = Target { namespace: namespace.to_owned(), name: name.to_owned(), uid: api_pod.uid.clone()? };
    Some((target, api_pod.as_ref()))
}

/// The pods of `desired` whose namesake in the API changed (was added, replaced or removed) from
/// `old` to `now` (compared by pointer: the API source shares the pods that did not change).
fn changed_in_api(
    old: &ApiPodSnapshot,
    now: &ApiPodSnapshot,
    desired: &Store<PodUid, DesiredPod>,
) -> HashSet<PodUid> {
    let old = &old.pods;
    let changed = now.pods.iter().filter(|(key, pod)| old.get(*key).is_none_or(|was| !Arc::ptr_eq(was, pod)));
    let removed = old.keys().filter(|key| !now.pods.contains_key(*key));
    let mut names: HashMap<&str, HashSet<&str>> = HashMap::new();
    for (namespace, name) in changed.map(|(key, _)| key).chain(removed) {
        names.entry(namespace.as_str()).or_default().insert(name.as_str());
    }
    let mut uids = HashSet::new();
    if !names.is_empty() {
        desired.for_each(|uid, pod| {
            if names.get(pod.namespace()).is_some_and(|n| n.contains(pod.name())) {
                uids.insert(uid.clone());
            }
        });
    }
    uids
}

/// The QoS class the API server recorded for the pod is kept: it is immutable once the pod exists, and the
/// kubelet reads it rather than computing it again (`GetPodQOS`). nodelet's own (by value, the same rules) is
/// written only where the API pod has none.
fn keep_recorded_qos_class(status: &mut PodStatus, api_status: Option<&PodStatus>) {
    if let Some(recorded) = api_status.and_then(|s| s.qos_class.as_ref()).filter(|q| !q.is_empty()) {
        status.qos_class = Some(recorded.clone());
    }
}

/// Whether nothing of `pod` runs any more: no running container and no ready sandbox.
fn is_terminated(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return true };
    let running = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    let sandbox_ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "PodReadyToStartContainers" && c.status == "True");
    !running && !sandbox_ready
}

#[cfg(test)]
mod tests {
    use nodelet_resources::model::pod::PodSource;
    use nodelet_resources::pod::validation::prepare;

    use super::*;

    #[test]
    fn a_conditions_transition_time_is_kept_until_its_status_changes_and_kept_per_target() {
        let time = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("a time in range"));
        let (t1, t2, t3, api) = (time(1), time(2), time(3), time(100));
        let mut transitions = Transitions::default();
        let mut a = transitions.of("a");
        // First seen: the API's time of the same status, else now.
        assert_eq!(a.at("Ready", "False", Some(&api), &t1), api);
        assert_eq!(a.at("Initialized", "True", None, &t1), t1);
        a.done();
        let mut a = transitions.of("a");
        // The same status: the time kept (the API's is not looked at again).
        assert_eq!(a.at("Ready", "False", None, &t2), api);
        // Another status: now, then kept.
        assert_eq!(a.at("Ready", "True", None, &t2), t2);
        assert_eq!(a.at("Ready", "True", Some(&api), &t3), t2);
        assert_eq!(a.at("Initialized", "True", None, &t3), t1);
        a.done();
        let mut b = transitions.of("b");
        assert_eq!(b.at("Ready", "False", None, &t3), t3);
        b.done();
        // One entry per target, its conditions' list without spare room.
        assert_eq!(transitions.targets(), 2);
        assert_eq!(transitions.0.get("a").map(|v| (v.len(), v.capacity())), Some((2, 2)));
        transitions.retain(|uid| uid == "b");
        assert_eq!(transitions.targets(), 1);
        let mut a = transitions.of("a");
        assert_eq!(a.at("Ready", "True", None, &t3), t3, "a forgotten target starts over");
    }

    fn api_pod<'a>(name: &'a str, uid: &str) -> (&'a str, Arc<ApiPod>) {
        (name, Arc::new(ApiPod { uid: Some(uid.to_owned()), ..ApiPod::default() }))
    }

    fn snapshot(pods: &[&(&str, Arc<ApiPod>)]) -> ApiPodSnapshot {
        let pods = pods
            .iter()
            .map(|(name, p)| (("default".to_owned(), (*name).to_owned()), Arc::clone(p)))
            .collect();
        ApiPodSnapshot { synced: true, pods }
    }

    /// Issue 37, point 12: requests cpu `1` with limits cpu `1000m` is Guaranteed, as the API server says;
    /// the status nodelet writes says so too, and never replaces the class the API server recorded.
    #[test]
    fn the_status_keeps_the_api_servers_qos_class() {
        use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let list = |cpu: &str| {
            Some(std::collections::BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity("64Mi".to_owned())),
            ]))
        };
        let api_pod = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".to_owned()),
                namespace: Some("default".to_owned()),
                uid: Some("u-1".to_owned()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_owned(),
                    image: Some("busybox".to_owned()),
                    resources: Some(ResourceRequirements {
                        requests: list("1"),
                        limits: list("1000m"),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus { qos_class: Some("Guaranteed".to_owned()), ..Default::default() }),
        };
        // The desired pod as the API source makes it (the recorded class kept), and the status built from it.
        let desired = nodelet_resources::pod::validation::prepare(
            crate::pods::spec_only(api_pod.clone()),
            nodelet_resources::model::pod::PodSource::Api,
            "node-a",
        )
        .expect("a valid pod");
        assert_eq!(nodelet_resources::model::qos::qos_class(&desired).as_str(), "Guaranteed");
        let mut without_record = desired.clone();
        without_record.pod.status = None;
        assert_eq!(
            nodelet_resources::model::qos::qos_class(&without_record).as_str(),
            "Guaranteed",
            "computed by value: 1 == 1000m"
        );
        // Whatever nodelet computed, the API server's class is what is written back.
        let mut status = PodStatus { qos_class: Some("Burstable".to_owned()), ..Default::default() };
        keep_recorded_qos_class(&mut status, api_pod.status.as_ref());
        assert_eq!(status.qos_class.as_deref(), Some("Guaranteed"));
        let mut status = PodStatus { qos_class: Some("Burstable".to_owned()), ..Default::default() };
        keep_recorded_qos_class(&mut status, None);
        assert_eq!(status.qos_class.as_deref(), Some("Burstable"), "nodelet's own where the API has none");
    }

    #[test]
    fn a_condition_of_ours_that_the_api_lacks_or_has_otherwise_differs_and_others_do_not_count() {
        let condition = |type_: &str, status: &str| PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            ..PodCondition::default()
        };
        let with = |conditions: Vec<PodCondition>| PodStatus {
            conditions: Some(conditions),
            ..PodStatus::default()
        };
        let ours = with(vec![condition("Ready", "True"), condition("ContainersReady", "True")]);
        let same = with(vec![
            condition("ContainersReady", "True"),
            condition("Ready", "True"),
            condition("example.com/gate", "False"),
        ]);
        assert!(!own_conditions_differ(&ours, Some(&same)), "the same, in another order, with another's");
        let controller = with(vec![condition("Ready", "False"), condition("ContainersReady", "True")]);
        assert!(own_conditions_differ(&ours, Some(&controller)), "Ready set to False by the node controller");
        assert!(own_conditions_differ(&ours, Some(&with(vec![condition("Ready", "True")]))), "one missing");
        assert!(own_conditions_differ(&ours, None), "no status at all");
        let theirs_only = with(vec![condition("example.com/gate", "True")]);
        assert!(!own_conditions_differ(&theirs_only, Some(&same)), "another's condition is not ours to fix");
    }

    #[test]
    fn the_digest_of_a_status_tells_a_change_of_any_field() {
        let status = PodStatus {
            phase: Some("Running".to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        };
        let digest = status_digest(&status);
        assert!(digest.is_some());
        assert_eq!(status_digest(&status.clone()), digest, "the same status, the same digest");
        let mut not_ready = status.clone();
        if let Some(c) = not_ready.conditions.as_mut().and_then(|c| c.first_mut()) {
            c.status = "False".to_owned();
        }
        assert_ne!(status_digest(&not_ready), digest);
        let with_ip = PodStatus { pod_ip: Some("10.64.0.2".to_owned()), ..status.clone() };
        assert_ne!(status_digest(&with_ip), digest);
    }

    #[test]
    fn readiness_gates_decide_ready_over_the_conditions_others_set_in_the_api() {
        let condition = |type_: &str, status: &str| PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            ..PodCondition::default()
        };
        let pod: Pod = crate::yaml::from_str(
            "metadata: {name: gated, namespace: default, uid: u}\n\
             spec: {containers: [{name: c, image: busybox}], readinessGates: [{conditionType: k8s.io/one}, {conditionType: k8s.io/two}]}",
        )
        .expect("pod");
        let ours = || vec![condition("Ready", "True"), condition("ContainersReady", "True")];
        let api = |conditions: Vec<PodCondition>| PodStatus {
            conditions: Some(conditions),
            ..PodStatus::default()
        };
        let ready_of = |conditions: &[PodCondition]| {
            conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };

        let mut mine = ours();
        let theirs = with_conditions_of_others(&pod, None, &mut mine);
        assert!(theirs.is_empty());
        assert_eq!(
            ready_of(&mine),
            Some((
                "False".to_owned(),
                Some("ReadinessGatesNotReady".to_owned()),
                Some(
                    r#"corresponding condition of pod readiness gate "k8s.io/one" does not exist., corresponding condition of pod readiness gate "k8s.io/two" does not exist."#
                        .to_owned()
                )
            ))
        );

        // The API has one gate True and one False, and stale copies of nodelet's own conditions.
        let status = api(vec![
            condition("k8s.io/one", "True"),
            condition("k8s.io/two", "False"),
            condition("Ready", "False"),
            condition("PodScheduled", "True"),
        ]);
        let mut mine = ours();
        let theirs = with_conditions_of_others(&pod, Some(&status), &mut mine);
        assert_eq!(
            theirs,
            vec![condition("k8s.io/one", "True"), condition("k8s.io/two", "False")],
            "kept as they are"
        );
        assert_eq!(
            ready_of(&mine).and_then(|r| r.2),
            Some(r#"the status of pod readiness gate "k8s.io/two" is not "True", but False"#.to_owned())
        );

        let status = api(vec![condition("k8s.io/one", "True"), condition("k8s.io/two", "True")]);
        let mut mine = ours();
        with_conditions_of_others(&pod, Some(&status), &mut mine);
        assert_eq!(ready_of(&mine), Some(("True".to_owned(), None, None)));

        // Containers not ready: Ready says so whatever the gates.
        let mut mine = vec![
            PodCondition {
                reason: Some("ContainersNotReady".into()),
                message: Some("containers with unready status: [c]".into()),
                ..condition("Ready", "False")
            },
            PodCondition {
                reason: Some("ContainersNotReady".into()),
                message: Some("containers with unready status: [c]".into()),
                ..condition("ContainersReady", "False")
            },
        ];
        with_conditions_of_others(&pod, Some(&status), &mut mine);
        assert_eq!(ready_of(&mine).and_then(|r| r.1), Some("ContainersNotReady".to_owned()));

        // Without gates, Ready is left as computed.
        let mut plain = pod.clone();
        if let Some(spec) = plain.spec.as_mut() {
            spec.readiness_gates = None;
        }
        let mut mine = ours();
        with_conditions_of_others(&plain, None, &mut mine);
        assert_eq!(ready_of(&mine), Some(("True".to_owned(), None, None)));
    }

    #[test]
    fn a_pass_looks_at_the_pods_whose_api_pod_was_added_replaced_or_removed() {
        let (desired, mut writer) = reconcile_engine::store::<PodUid, DesiredPod>();
        for (name, uid) in [("a", "ua"), ("b", "ub"), ("c", "uc"), ("d", "ud")] {
            let yaml = format!(
                "metadata: {{name: {name}, namespace: default, uid: {uid}}}\n\
                 spec: {{containers: [{{name: c, image: busybox}}]}}"
            );
            let pod: Pod = crate::yaml::from_str(&yaml).expect("pod");
            let pod = prepare(pod, PodSource::Api, "node").expect("valid");
            writer.insert(uid.to_owned(), pod);
        }
        let (a, b, c) = (api_pod("a", "ua"), api_pod("b", "ub"), api_pod("c", "uc"));
        let old = snapshot(&[&a, &b, &c]);
        let same = snapshot(&[&a, &b, &c]);
        assert!(changed_in_api(&old, &same, &desired).is_empty(), "the same pods: nothing to look at");
        // b's status patch echoed (a new copy), c deleted, d created, and a pod nobody desires
        let (b2, d, other) = (api_pod("b", "ub"), api_pod("d", "ud"), api_pod("x", "ux"));
        let now = snapshot(&[&a, &b2, &d, &other]);
        let mut changed: Vec<PodUid> = changed_in_api(&old, &now, &desired).into_iter().collect();
        changed.sort();
        assert_eq!(changed, ["ub", "uc", "ud"]);
    }
}
