//! The API server pod source: a `kube-runtime` watcher on the pods bound to this node
//! (`spec.nodeName=<node>`, all namespaces), as the kubelet's reflector.
//!
//! Each complete list (the first one, and each relist after a watch expired or failed) and each
//! change after it gives the pod config the source's full set of pods ("api"). Until the first list
//! completes the source has not reported, so nothing is torn down because the API server is slow or
//! away at start-up; while the watch is broken the last set stays. Mirror pods (annotation
//! `kubernetes.io/config.mirror`) are this node's own reflection of its static pods: they are not run,
//! only handed to the mirror-pod manager through the [`ApiPodSnapshot`].
//!
//! Pods are validated and defaulted like every source's ([`prepare`]); what the API server wrote
//! that is not the pod's spec (status, `resourceVersion`, managed fields) is left out first, so a
//! status update does not touch the desired pod: a change of only those (each status patch's echo)
//! updates the snapshot and nothing else, without preparing every pod again. Managed fields are
//! never read and are dropped as each pod arrives. The snapshot keeps of each pod only what its
//! readers, the status manager and the mirror-pod manager, read ([`ApiPod`]); the whole pod is kept
//! only until its desired pod is prepared (the desired pod has the spec): a new version is compared
//! with the prepared one through a digest of what the desired pod is made of ([`fingerprint`],
//! computed once per version received). The desired
//! pod is marked seen here ([`SourceHandle::mark_seen`]) so that the pod config keeps it as it is
//! instead of an annotated copy: each API pod is kept as its [`ApiPod`] plus one desired pod.
//! A pod that fails
//! nodelet's validation is reported as a source problem (an `InvalidManifest` event on the pod) and
//! not run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use nodelet_resources::model::pod::{DesiredPod, PodSource};
use nodelet_resources::pod::validation::{CONFIG_MIRROR_ANNOTATION, prepare};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sources::{Problem, SourceHandle};

/// `(namespace, name)` of a pod.
pub(crate) type PodName = (String, String);

/// This node's pods in the API, as last listed and watched.
#[derive(Debug, Default)]
pub(crate) struct ApiPodSnapshot {
    /// Whether a complete list was received (the pods below are the API's, not a partial view).
    pub(crate) synced: bool,
    /// Every pod bound to this node, mirror pods included, as its readers read it.
    pub(crate) pods: BTreeMap<PodName, Arc<ApiPod>>,
}

impl ApiPodSnapshot {
    /// The pod `namespace/name`, if the API has it.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<&Arc<ApiPod>> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }
}

/// What the snapshot keeps of an API pod: the fields its readers read, the rest of the pod left out (the
/// desired pod has the spec). The status manager reads the UID, the mirror annotation and, of the status,
/// the conditions others own, the QoS class and `nominatedNodeName`; the mirror-pod manager the UID, the
/// mirror annotation and the deletion timestamp. A `Pod` without spec would still take
/// `size_of::<Pod>()` (the spec's fields are inline, about 2.6 KB) plus its metadata and status.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ApiPod {
    /// `metadata.uid`.
    pub(crate) uid: Option<String>,
    /// The annotation `kubernetes.io/config.mirror` (the hash of the static pod a mirror pod reflects).
    pub(crate) mirror: Option<String>,
    /// `metadata.deletionTimestamp`.
    pub(crate) deletion_timestamp: Option<meta::Time>,
    /// The status with `conditions`, `qosClass` and `nominatedNodeName` only.
    pub(crate) status: Option<PodStatus>,
}

impl ApiPod {
    /// What the snapshot keeps of `pod`.
    pub(crate) fn of(pod: &Pod) -> Self {
        Self {
            uid: pod.metadata.uid.clone(),
            mirror: pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION)).cloned(),
            deletion_timestamp: pod.metadata.deletion_timestamp.clone(),
            status: pod.status.as_ref().map(|s| PodStatus {
                conditions: s.conditions.clone(),
                qos_class: s.qos_class.clone(),
                nominated_node_name: s.nominated_node_name.clone(),
                ..PodStatus::default()
            }),
        }
    }

    /// Whether the pod is a mirror pod.
    pub(crate) fn is_mirror(&self) -> bool {
        self.mirror.is_some()
    }
}

fn name_of(pod: &Pod) -> PodName {
    (
        pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The pod as a spec: without status and the server's bookkeeping, but with the QoS class the API server
/// recorded (`status.qosClass`, immutable once the pod exists), which the kubelet's rules take over computing
/// it again (`GetPodQOS`, see [`nodelet_resources::model::qos`]).
pub(crate) fn spec_only(mut pod: Pod) -> Pod {
    let qos_class = pod.status.take().and_then(|s| s.qos_class);
    pod.status =
        qos_class.map(|q| k8s_openapi::api::core::v1::PodStatus { qos_class: Some(q), ..Default::default() });
    pod.metadata.resource_version = None;
    pod.metadata.managed_fields = None;
    pod
}

/// Replaces `pod` by a copy of itself. A pod decoded from JSON has every list with the spare capacity of
/// its growth (a `Vec` of one container has room for four, and `Container`, `Volume` and their kin are
/// kilobytes each); the copy has none. Pods are kept for as long as they are bound to the node, so this
/// is most of what a pod costs in memory.
pub(crate) fn compact(pod: &mut Pod) {
    *pod = pod.clone();
}

/// What the desired pod of an API pod is made of, as a SHA-256 digest: its spec and metadata, without the
/// status, the `resourceVersion` and the managed fields (what the pod source leaves out of the desired
/// pod). Two versions of a pod with the same fingerprint make the same desired pod. `None` if the pod
/// cannot be serialized (never equal to anything: the pod is prepared again). The pod source fingerprints
/// each version of a pod the watch delivers once, on receipt.
pub fn fingerprint(pod: &Pod) -> Option<[u8; 32]> {
    use sha2::Digest as _;
    #[cfg(test)]
    FINGERPRINTS.with(|n| n.set(n.get() + 1));
    // Every field is named, so that a field a newer k8s-openapi adds is not silently ignored.
    let meta::ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields: _,
        name,
        namespace,
        owner_references,
        resource_version: _,
        self_link,
        uid,
    } = &pod.metadata;
    // serde_json writes a struct's fields in their order and maps (`BTreeMap`) in key order: the same
    // pod always gives the same bytes.
    let parts = (
        &pod.spec,
        (annotations, creation_timestamp, deletion_grace_period_seconds, deletion_timestamp, finalizers),
        (generate_name, generation, labels, name, namespace, owner_references, self_link, uid),
    );
    let mut hasher = sha2::Sha256::new();
    serde_json::to_writer(&mut hasher, &parts).ok()?;
    Some(hasher.finalize().into())
}

#[cfg(test)]
thread_local! {
    /// How many times [`fingerprint`] ran on this thread (each test has its own).
    static FINGERPRINTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether `new` differs from `old` in what the desired pod is made of (see [`fingerprint`]).
#[cfg(test)]
fn spec_changed(old: &Pod, new: &Pod) -> bool {
    let (old, new) = (fingerprint(old), fingerprint(new));
    old.is_none() || old != new
}

/// A pod as the source keeps it: what the snapshot has of it, the whole pod until its desired pod is
/// prepared, and the fingerprint of the version received, computed once on receipt.
#[derive(Debug)]
struct Kept {
    /// What the snapshot has of the pod.
    api: Arc<ApiPod>,
    /// The pod as received, until its desired pod is prepared from it (see [`Pods`]); never for a mirror
    /// pod (not run, so never prepared). Boxed: `None` takes a pointer's size, not a `Pod`'s.
    whole: Option<Box<Pod>>,
    /// [`fingerprint`] of the version received.
    print: Option<[u8; 32]>,
}

impl Kept {
    /// A pod as received (its fingerprint computed here).
    fn new(pod: Pod) -> Self {
        let api = ApiPod::of(&pod);
        let print = fingerprint(&pod);
        let whole = (!api.is_mirror()).then(|| Box::new(pod));
        Self { api: Arc::new(api), whole, print }
    }
}

/// A pod prepared for the pod config, or why it cannot run.
type Prepared = Result<Arc<DesiredPod>, PrepareError>;

/// Why a pod of the API server cannot run here (the message of its problem).
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    /// The pod is invalid (the field errors as the API server writes them).
    #[error(transparent)]
    Invalid(#[from] nodelet_resources::pod::validation::ValidationError),
    /// The Pod Security Standards level the API server's pods are held to refuses the pod.
    #[error("pods \"{name}\" is forbidden: {refusal}")]
    Forbidden {
        /// The pod's name.
        name: String,
        /// Why it is refused.
        refusal: nodelet_resources::pod::security::SecurityError,
    },
    /// A pod whose spec was dropped without its preparation kept (never happens: see [`Pods`]).
    #[error("the pod's spec is gone")]
    SpecGone,
}

/// The source's pods as listed and watched, and what was prepared from them.
///
/// A pod is kept whole until its desired pod is prepared; from then on only what the snapshot has of it
/// ([`ApiPod`]) and the preparation, with the fingerprint of the version it was made from: a later
/// version with the same fingerprint (a status patch's echo) reuses it, any other is kept whole until it
/// is prepared again. A pod kept without the whole pod therefore always has its preparation.
#[derive(Debug, Default)]
struct Pods {
    /// The pods of the last complete list and the changes since.
    current: BTreeMap<PodName, Kept>,
    /// The pods of a list in progress.
    building: BTreeMap<PodName, Kept>,
    /// Whether a complete list was received.
    synced: bool,
    /// The last preparation of each pod, by UID, with the fingerprint of the version it was made from.
    prepared: HashMap<String, (Option<[u8; 32]>, Prepared)>,
}

impl Pods {
    /// Takes a watch event's pod (a change after the list); returns whether the desired pods may have
    /// changed. A version that changes only the status or the server's bookkeeping (as after each status
    /// patch) replaces what the snapshot has of the pod, drops the whole pod and leaves the desired pods
    /// as they are.
    fn apply(&mut self, pod: Pod) -> bool {
        let key = name_of(&pod);
        let old = self.current.get(&key).filter(|old| old.api.uid == pod.metadata.uid);
        let prepared =
            pod.metadata.uid.as_deref().and_then(|uid| self.prepared.get(uid)).and_then(|(print, _)| *print);
        // (moved, not copied: the event's pod is ours)
        let mut kept = Kept::new(pod);
        let print = kept.print;
        let same = self.synced
            && print.is_some()
            && match (old, prepared) {
                (Some(_), Some(was)) => Some(was) == print,
                // not prepared (a mirror pod): compared with the version before
                (Some(old), None) => old.print == print,
                (None, _) => false,
            };
        if same && prepared.is_some() {
            kept.whole = None;
        }
        self.current.insert(key, kept);
        !same
    }

    /// The desired pods of the current set (with the problems of those that cannot run), prepared for
    /// `handle`'s node (only those that changed since the last time); the pods prepared are kept without
    /// their spec from now on.
    fn prepare(&mut self, handle: &SourceHandle) -> (Vec<Arc<DesiredPod>>, Vec<Problem>) {
        let mut pods = Vec::new();
        let mut problems = Vec::new();
        let mut seen = HashMap::new();
        let security = handle.security();
        let node = handle.node_name();
        for ((namespace, name), kept) in &mut self.current {
            if kept.api.is_mirror() {
                continue;
            }
            let Some(uid) = kept.api.uid.clone() else { continue };
            let last = self.prepared.remove(&uid);
            let print = kept.print;
            let (print, result) = match (last, kept.whole.take()) {
                // prepared from an earlier version, unchanged since (the whole pod dropped then)
                (Some(last), None) => last,
                (None, None) => (None, Err(PrepareError::SpecGone)),
                (last, Some(whole)) => {
                    if print.is_none() {
                        // never equal to anything: kept whole, prepared again each time
                        kept.whole = Some(whole.clone());
                    }
                    match last {
                        Some((was, result)) if was.is_some() && was == print => (print, result),
                        _ => {
                            let result = prepare(spec_only(*whole), PodSource::Api, node)
                                .map_err(PrepareError::from)
                                .and_then(|mut desired| match security.api.admit(&desired.pod) {
                                    Ok(()) => {
                                        handle.mark_seen(&mut desired);
                                        Ok(Arc::new(desired))
                                    }
                                    Err(refusal) => {
                                        Err(PrepareError::Forbidden { name: name.clone(), refusal })
                                    }
                                });
                            (print, result)
                        }
                    }
                }
            };
            match &result {
                Ok(desired) => pods.push(desired.clone()),
                Err(error) => problems.push(Problem {
                    location: "api server".to_owned(),
                    object: Some(format!("{namespace}/{name}")),
                    message: error.to_string(),
                }),
            }
            seen.insert(uid, (print, result));
        }
        self.prepared = seen;
        (pods, problems)
    }

    /// The snapshot of the current set.
    fn snapshot(&self) -> ApiPodSnapshot {
        ApiPodSnapshot {
            synced: true,
            pods: self.current.iter().map(|(name, kept)| (name.clone(), kept.api.clone())).collect(),
        }
    }
}

/// The API server source; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct ApiPods {
    api: Api<Pod>,
    node: String,
    handle: SourceHandle,
    tx: watch::Sender<Arc<ApiPodSnapshot>>,
    pods: Pods,
}

impl ApiPods {
    /// A source for the pods bound to `handle`'s node.
    pub(crate) fn new(client: kube::Client, handle: SourceHandle) -> Self {
        let node = handle.node_name().to_owned();
        Self {
            api: Api::all(client),
            node,
            handle,
            tx: watch::channel(Arc::new(ApiPodSnapshot::default())).0,
            pods: Pods::default(),
        }
    }

    /// The pods in the API, updated as they change.
    pub(crate) fn snapshot(&self) -> watch::Receiver<Arc<ApiPodSnapshot>> {
        self.tx.subscribe()
    }

    /// Watches until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let config = super::watch_config().fields(&format!("spec.nodeName={}", self.node));
        // The managed fields (often the largest part of a pod's metadata) are never read: they are
        // dropped on receipt instead of being kept with every pod. The pod is then kept as a copy of
        // what was received ([`compact`]).
        let mut stream = watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .modify(|pod| {
                pod.metadata.managed_fields = None;
                compact(pod);
            })
            .boxed();
        let mut failing = false;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            let changed = match event {
                None => return,
                Some(Err(e)) => {
                    if !failing {
                        tracing::warn!(error = %e, "watching this node's pods failed; retrying with back-off");
                        failing = true;
                    }
                    continue;
                }
                Some(Ok(Event::Init)) => {
                    self.pods.building.clear();
                    false
                }
                Some(Ok(Event::InitApply(pod))) => {
                    self.pods.building.insert(name_of(&pod), Kept::new(pod));
                    false
                }
                Some(Ok(Event::InitDone)) => {
                    self.pods.current = std::mem::take(&mut self.pods.building);
                    if failing || !self.pods.synced {
                        tracing::info!(pods = self.pods.current.len(), "listed this node's pods in the API");
                    }
                    failing = false;
                    self.pods.synced = true;
                    true
                }
                Some(Ok(Event::Apply(pod))) => {
                    let changed = self.pods.apply(pod);
                    if !changed && self.pods.synced {
                        // Only the status (or the server's bookkeeping) changed: the desired pods stay,
                        // only the snapshot changes.
                        self.publish_snapshot();
                    }
                    changed
                }
                Some(Ok(Event::Delete(pod))) => self.pods.current.remove(&name_of(&pod)).is_some(),
            };
            if changed && self.pods.synced {
                self.publish();
            }
        }
    }

    /// Gives the pod config the current set and the snapshot's readers the pods.
    fn publish(&mut self) {
        let (pods, problems) = self.pods.prepare(&self.handle);
        // the same `Arc` for a pod that did not change: the pod config neither copies nor compares it
        self.handle.report_shared(pods, problems);
        self.publish_snapshot();
    }

    /// Gives the snapshot's readers the pods.
    fn publish_snapshot(&self) {
        self.tx.send_replace(Arc::new(self.pods.snapshot()));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use nodelet_resources::pod::validation::CONFIG_SEEN_ANNOTATION;

    use super::*;

    /// `pod` with the label `tier=front`.
    fn with_tier(mut pod: Pod) -> Pod {
        pod.metadata.labels.get_or_insert_with(BTreeMap::new).insert("tier".to_owned(), "front".to_owned());
        pod
    }

    #[test]
    fn a_compacted_pod_is_the_same_pod_without_the_spare_capacity_of_its_decoding() {
        let json = serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}],
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        // Decoded from text, as the watch's events are (a `Value`'s arrays would tell serde their length).
        let mut pod: Pod = serde_json::from_str(&json.to_string()).expect("pod");
        let decoded = pod.clone();
        let tolerations = |p: &Pod| p.spec.as_ref().and_then(|s| s.tolerations.as_ref()).map(Vec::capacity);
        assert!(tolerations(&pod) > Some(2), "serde grows a list past its length: {:?}", tolerations(&pod));
        compact(&mut pod);
        assert_eq!(pod, decoded);
        assert_eq!(tolerations(&pod), Some(2));
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).map(Vec::capacity);
        assert_eq!(conditions, Some(1));
    }

    /// A pod as the API server sends it for a Deployment's replica (managed fields already dropped).
    fn api_pod(resource_version: &str, phase: &str) -> Pod {
        let json = serde_json::json!({
            "metadata": {
                "name": "web-7d4b9c-x2x9q", "namespace": "bench", "uid": "u-1", "resourceVersion": resource_version,
                "generateName": "web-7d4b9c-", "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c",
                    "uid": "rs-1", "controller": true, "blockOwnerDeletion": true}],
                "creationTimestamp": "2026-12-05T14:00:00Z",
            },
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "busybox", "image": "busybox:1.36", "command": ["sleep", "36000"],
                    "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
                "serviceAccountName": "default",
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": 300},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": 300}],
            },
            "status": {"phase": phase, "qosClass": "BestEffort",
                "conditions": [{"type": "PodScheduled", "status": "True"}]},
        });
        serde_json::from_str(&json.to_string()).expect("pod")
    }

    fn api_source() -> (crate::sources::PodConfig, SourceHandle) {
        let config = crate::sources::PodConfig::new("node-a");
        let handle = config.add_source("api").expect("api source");
        config.seal();
        (config, handle)
    }

    fn listed(pods: &mut Pods, pod: Pod) {
        pods.building.insert(name_of(&pod), Kept::new(pod));
        pods.current = std::mem::take(&mut pods.building);
        pods.synced = true;
    }

    fn kept(pods: &Pods) -> &Kept {
        pods.current.values().next().expect("one pod")
    }

    #[test]
    fn a_prepared_pod_is_kept_without_its_spec_and_its_desired_pod_once() {
        let (config, handle) = api_source();
        let mut pods = Pods::default();
        let received = api_pod("1", "Pending");
        listed(&mut pods, received.clone());
        let (desired, problems) = pods.prepare(&handle);
        assert!(problems.is_empty(), "{problems:?}");
        handle.report_shared(desired.clone(), problems);
        // What the snapshot's readers read (status manager: UID, the mirror annotation, the status's
        // conditions, QoS class and nominated node; mirror pods: the mirror annotation, UID, deletion) is all
        // there; the whole pod is gone.
        let kept = kept(&pods);
        assert!(kept.whole.is_none(), "the whole pod is dropped once prepared");
        let snapshot = pods.snapshot();
        let api = snapshot.get("bench", "web-7d4b9c-x2x9q").expect("in the snapshot");
        assert_eq!(api.uid.as_deref(), Some("u-1"));
        assert_eq!(api.mirror, None);
        let status = api.status.as_ref().expect("a status");
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(status.conditions, received.status.as_ref().and_then(|s| s.conditions.clone()));
        assert_eq!(status.phase, None, "what no reader reads is not kept");
        // The desired store's pod is the source's own, marked seen: one object, not an annotated copy.
        let stored = config.store().get(&"u-1".to_owned()).expect("in the desired store");
        assert!(Arc::ptr_eq(&stored, &desired[0]), "the pod config kept a copy of the source's desired pod");
        let seen =
            stored.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned();
        assert!(seen.is_some(), "config.seen is set");
        let spec = stored.pod.spec.as_ref().expect("the desired pod has the spec");
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:1.36"));
        assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn a_status_echo_keeps_the_desired_pod_and_a_spec_change_prepares_it_again() {
        let (config, handle) = api_source();
        let mut pods = Pods::default();
        listed(&mut pods, api_pod("1", "Pending"));
        let (first, problems) = pods.prepare(&handle);
        handle.report_shared(first.clone(), problems);
        let seen = |pod: &DesiredPod| {
            pod.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SEEN_ANNOTATION)).cloned()
        };

        // a status patch's echo: only the snapshot changes, without the whole pod
        let mut echo = api_pod("2", "Running");
        echo.status.get_or_insert_with(Default::default).nominated_node_name = Some("node-b".to_owned());
        assert!(!pods.apply(echo), "a status change is not a change of the desired pod");
        assert!(kept(&pods).whole.is_none());
        let api = kept(&pods).api.clone();
        assert_eq!(api.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()), Some("node-b"));
        let (again, _) = pods.prepare(&handle);
        assert!(Arc::ptr_eq(&again[0], &first[0]), "the same desired pod, not prepared again");

        // a change of the metadata the desired pod is made of: kept whole until prepared again
        assert!(pods.apply(with_tier(api_pod("3", "Running"))));
        assert!(kept(&pods).whole.is_some(), "the new version is kept whole until it is prepared");
        let (changed, problems) = pods.prepare(&handle);
        handle.report_shared(changed.clone(), problems);
        assert!(!Arc::ptr_eq(&changed[0], &first[0]));
        assert_eq!(
            changed[0].pod.metadata.labels.as_ref().and_then(|l| l.get("tier")).map(String::as_str),
            Some("front")
        );
        assert_eq!(seen(&changed[0]), seen(&first[0]), "seen since the UID was first seen");
        assert!(kept(&pods).whole.is_none());
        let stored = config.store().get(&"u-1".to_owned()).expect("in the store");
        assert!(Arc::ptr_eq(&stored, &changed[0]));

        // a relist of the same version reuses the preparation
        listed(&mut pods, with_tier(api_pod("4", "Running")));
        let (relisted, _) = pods.prepare(&handle);
        assert!(Arc::ptr_eq(&relisted[0], &changed[0]), "a relist does not prepare an unchanged pod again");
    }

    #[test]
    fn each_version_received_is_fingerprinted_once() {
        let (_config, handle) = api_source();
        let mut pods = Pods::default();
        let count = || FINGERPRINTS.with(std::cell::Cell::get);
        let start = count();
        listed(&mut pods, api_pod("1", "Pending"));
        let _ = pods.prepare(&handle);
        assert_eq!(count() - start, 1, "a listed pod, prepared");
        // a status patch's echo
        assert!(!pods.apply(api_pod("2", "Running")));
        let _ = pods.prepare(&handle);
        assert_eq!(count() - start, 2, "a status echo");
        // a change of the spec's metadata, then its preparation: the digest of its receipt is the one kept
        assert!(pods.apply(with_tier(api_pod("3", "Running"))));
        let (changed, _) = pods.prepare(&handle);
        assert_eq!(count() - start, 3, "a spec change");
        assert_eq!(
            changed[0].pod.metadata.labels.as_ref().and_then(|l| l.get("tier")).map(String::as_str),
            Some("front")
        );
        // nothing changed: nothing to fingerprint
        let _ = pods.prepare(&handle);
        assert_eq!(count() - start, 3);
    }

    #[test]
    fn a_pod_without_spec_and_without_its_preparation_is_a_problem_not_a_pod() {
        let (_config, handle) = api_source();
        let mut pods = Pods::default();
        let mut received = Kept::new(api_pod("1", "Running"));
        received.whole = None;
        pods.current.insert(("bench".to_owned(), "web-7d4b9c-x2x9q".to_owned()), received);
        pods.synced = true;
        let (desired, problems) = pods.prepare(&handle);
        assert!(desired.is_empty());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].message.contains("spec is gone"), "{}", problems[0]);
    }

    #[test]
    fn only_a_change_beyond_the_status_and_the_bookkeeping_changes_the_spec() {
        let mut old = Pod::default();
        old.metadata.name = Some("web".to_owned());
        old.metadata.resource_version = Some("1".to_owned());
        old.spec = Some(PodSpec { node_name: Some("n".to_owned()), ..PodSpec::default() });
        let mut new = old.clone();
        new.metadata.resource_version = Some("2".to_owned());
        new.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        new.status = Some(PodStatus { phase: Some("Running".to_owned()), ..PodStatus::default() });
        assert!(!spec_changed(&old, &new), "a status patch's echo");
        let mut labelled = new.clone();
        labelled.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(spec_changed(&old, &labelled), "metadata");
        let mut deleted = new.clone();
        deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(spec_changed(&old, &deleted), "a deletion");
        let mut finalized = new.clone();
        finalized.metadata.finalizers = Some(vec!["f".to_owned()]);
        assert!(spec_changed(&old, &finalized), "finalizers");
        let mut annotated = new.clone();
        annotated.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(spec_changed(&old, &annotated), "annotations");
        assert!(!spec_changed(&new, &spec_only(new.clone())), "what spec_only drops is what is not compared");
        let mut respecced = new;
        respecced.spec.as_mut().expect("spec").active_deadline_seconds = Some(5);
        assert!(spec_changed(&old, &respecced), "the spec");
    }
}
