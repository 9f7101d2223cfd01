//! The status manager: every pod's status, as nodelet computes it, written to the API server.
//!
//! - **What is written.** For a pod from the API, its own `pods/status`; for a static pod, the
//!   status of its mirror pod (once the mirror exists). The status is the one `/pods` shows plus
//!   `hostIP`/`hostIPs`, with each condition's `lastTransitionTime` kept from when its status last
//!   changed; conditions nodelet does not own (set by the scheduler, controllers or readiness
//!   gates) are kept as the API has them.
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
//! pods, and every 10 s at the latest (the kubelet's status batch period); statuses are computed
//! locally, API calls happen only for changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{HostIP, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use nodelet_resources::pod::actual::PodActual;
use nodelet_resources::pod::desired::{DesiredPod, PodUid};
use nodelet_resources::pod::validation::{
    CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION,
};
use nodelet_resources::sandbox::actual::PodSandboxes;
use reconcile_engine::Store;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Backoff;
use super::pods::ApiPodSnapshot;
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
    probes: nodelet_resources::probe::results::ProbeResults,
    snapshot: watch::Receiver<Arc<ApiPodSnapshot>>,
    host_ips: Vec<String>,
    /// What was last written, per target UID.
    sent: HashMap<String, PodStatus>,
    /// When each (target UID, condition type) last changed status.
    transitions: HashMap<(String, String), (String, Time)>,
    /// Targets deleted with grace 0 already.
    finalized: HashSet<String>,
    /// Targets whose last write failed: when to try again, and the back-off.
    retry: HashMap<String, (Instant, Backoff)>,
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
        let PodStores { desired, actual, sandboxes } = pods;
        Self {
            api: client,
            view,
            desired,
            actual,
            sandboxes,
            probes,
            snapshot,
            host_ips,
            sent: HashMap::new(),
            transitions: HashMap::new(),
            finalized: HashSet::new(),
            retry: HashMap::new(),
        }
    }

    /// Writes statuses until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let desired_changes = self.desired.subscribe();
        let actual_changes = self.actual.subscribe();
        let sandbox_changes = self.sandboxes.subscribe();
        let probe_changes = self.probes.subscribe();
        // Failed writes are retried on the next pass: soon, while there are any.
        let mut next_pass = BATCH_PERIOD;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = desired_changes.changed() => {}
                () = actual_changes.changed() => {}
                () = sandbox_changes.changed() => {}
                () = probe_changes.changed() => {}
                r = self.snapshot.changed() => if r.is_err() { return },
                () = tokio::time::sleep(next_pass) => {}
            }
            // Coalesce a burst of changes into one pass.
            tokio::time::sleep(Duration::from_millis(20)).await;
            desired_changes.drain();
            actual_changes.drain();
            sandbox_changes.drain();
            probe_changes.drain();
            self.sync().await;
            let now = Instant::now();
            next_pass = self
                .retry
                .values()
                .map(|(at, _)| at.saturating_duration_since(now))
                .min()
                .map_or(BATCH_PERIOD, |d| d.clamp(Duration::from_millis(100), BATCH_PERIOD));
        }
    }

    /// One pass over every pod.
    async fn sync(&mut self) {
        let snapshot = self.snapshot.borrow_and_update().clone();
        if !snapshot.synced {
            return;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut live = HashSet::new();
        for pod in self.view.pods().items {
            let Some((target, api_pod)) = target_of(&pod, &snapshot) else { continue };
            live.insert(target.uid.clone());
            if self.finalized.contains(&target.uid) {
                continue;
            }
            if self.retry.get(&target.uid).is_some_and(|(at, _)| Instant::now() < *at) {
                continue;
            }
            let terminated = is_terminated(&pod);
            let status = self.status_for(&target, &pod, api_pod, terminated, &now);
            if self.sent.get(&target.uid) != Some(&status) {
                match self.write(&target, &status).await {
                    Ok(()) => {
                        self.retry.remove(&target.uid);
                        self.sent.insert(target.uid.clone(), status);
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
        // Forget pods that are gone.
        self.sent.retain(|uid, _| live.contains(uid));
        self.transitions.retain(|(uid, _), _| live.contains(uid));
        self.retry.retain(|uid, _| live.contains(uid));
        self.finalized.retain(|uid| live.contains(uid));
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
        api_pod: &Pod,
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
        let mut conditions = status.conditions.take().unwrap_or_default();
        for c in &mut conditions {
            let key = (target.uid.clone(), c.type_.clone());
            let api_same = api_status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|a| a.type_ == c.type_))
                .filter(|a| a.status == c.status)
                .and_then(|a| a.last_transition_time.clone());
            let entry = self
                .transitions
                .entry(key)
                .or_insert_with(|| (c.status.clone(), api_same.clone().unwrap_or_else(|| now.clone())));
            if entry.0 != c.status {
                *entry = (c.status.clone(), now.clone());
            }
            c.last_transition_time = Some(entry.1.clone());
        }
        // Conditions others own stay as the API has them.
        let ours: HashSet<String> = conditions.iter().map(|c| c.type_.clone()).collect();
        let theirs: Vec<PodCondition> = api_status
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !ours.contains(&c.type_))
            .collect();
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

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn is_api_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION) == Some("api")
}

/// Where `pod`'s status goes, and the API's copy of it.
fn target_of<'a>(pod: &Pod, snapshot: &'a ApiPodSnapshot) -> Option<(Target, &'a Pod)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref()?;
    let api_pod = snapshot.get(namespace, name)?;
    let matches = if is_api_pod(pod) {
        api_pod.metadata.uid == pod.metadata.uid
    } else {
        // A static pod: its mirror, when the mirror reflects this version of it.
        annotation(api_pod, CONFIG_MIRROR_ANNOTATION).is_some()
            && annotation(api_pod, CONFIG_MIRROR_ANNOTATION) == annotation(pod, CONFIG_HASH_ANNOTATION)
    };
    if !matches {
        return None;
    }
    let target =
        Target { namespace: namespace.to_owned(), name: name.to_owned(), uid: api_pod.metadata.uid.clone()? };
    Some((target, api_pod.as_ref()))
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
