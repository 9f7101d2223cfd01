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
//! never read and are dropped as each pod arrives. A pod that fails
//! nodelet's validation is reported as a source problem (an `InvalidManifest` event on the pod) and
//! not run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
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
    /// Every pod bound to this node, mirror pods included.
    pub(crate) pods: BTreeMap<PodName, Arc<Pod>>,
}

impl ApiPodSnapshot {
    /// The pod `namespace/name`, if the API has it.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Pod>> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }
}

/// Whether `pod` is a mirror pod.
pub(crate) fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
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
pub(crate) fn spec_only(pod: &Pod) -> Pod {
    let mut pod = pod.clone();
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

/// Whether `new` differs from `old` in what the desired pod is made of: everything but the status,
/// the `resourceVersion` and the managed fields (what [`spec_only`] drops). Compares in place,
/// without copying either pod.
fn spec_changed(old: &Pod, new: &Pod) -> bool {
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
    } = &old.metadata;
    let m = &new.metadata;
    old.spec != new.spec
        || (annotations, creation_timestamp, deletion_grace_period_seconds, deletion_timestamp, finalizers)
            != (
                &m.annotations,
                &m.creation_timestamp,
                &m.deletion_grace_period_seconds,
                &m.deletion_timestamp,
                &m.finalizers,
            )
        || (generate_name, generation, labels, name, namespace, owner_references, self_link, uid)
            != (
                &m.generate_name,
                &m.generation,
                &m.labels,
                &m.name,
                &m.namespace,
                &m.owner_references,
                &m.self_link,
                &m.uid,
            )
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
}

/// The API server source; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct ApiPods {
    api: Api<Pod>,
    node: String,
    handle: SourceHandle,
    tx: watch::Sender<Arc<ApiPodSnapshot>>,
    /// The last preparation of each pod, by UID, with the pod it was made from: reused while the
    /// spec stays the same.
    prepared: HashMap<String, (Arc<Pod>, Prepared)>,
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
            prepared: HashMap::new(),
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
        let mut building: BTreeMap<PodName, Arc<Pod>> = BTreeMap::new();
        let mut current: BTreeMap<PodName, Arc<Pod>> = BTreeMap::new();
        let mut synced = false;
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
                    building.clear();
                    false
                }
                Some(Ok(Event::InitApply(pod))) => {
                    building.insert(name_of(&pod), Arc::new(pod));
                    false
                }
                Some(Ok(Event::InitDone)) => {
                    current = std::mem::take(&mut building);
                    if failing || !synced {
                        tracing::info!(pods = current.len(), "listed this node's pods in the API");
                    }
                    failing = false;
                    synced = true;
                    true
                }
                Some(Ok(Event::Apply(pod))) => {
                    let pod = Arc::new(pod);
                    match current.insert(name_of(&pod), pod.clone()) {
                        Some(old) if synced && !spec_changed(&old, &pod) => {
                            // Only the status (or the server's bookkeeping) changed, as after each
                            // status patch: the desired pods stay, only the snapshot changes. The
                            // prepared pod's source is the new version from now on (the same spec), so
                            // that the old version is not kept beside it.
                            if let Some(uid) = pod.metadata.uid.as_deref()
                                && let Some((source, _)) = self.prepared.get_mut(uid)
                                && Arc::ptr_eq(source, &old)
                            {
                                *source = pod.clone();
                            }
                            self.publish_snapshot(&current);
                            false
                        }
                        _ => true,
                    }
                }
                Some(Ok(Event::Delete(pod))) => current.remove(&name_of(&pod)).is_some(),
            };
            if changed && synced {
                self.publish(&current);
            }
        }
    }

    /// Gives the pod config the current set and the snapshot's readers the pods.
    fn publish(&mut self, current: &BTreeMap<PodName, Arc<Pod>>) {
        let mut pods = Vec::new();
        let mut problems = Vec::new();
        let mut seen = HashMap::new();
        let security = self.handle.security();
        for ((namespace, name), pod) in current {
            if is_mirror(pod) {
                continue;
            }
            let Some(uid) = pod.metadata.uid.clone() else { continue };
            let result = match self.prepared.remove(&uid) {
                Some((old, result)) if !spec_changed(&old, pod) => result,
                _ => prepare(spec_only(pod), PodSource::Api, &self.node)
                    .map_err(PrepareError::from)
                    .and_then(|desired| match security.api.admit(&desired.pod) {
                        Ok(()) => Ok(Arc::new(desired)),
                        Err(refusal) => Err(PrepareError::Forbidden { name: name.clone(), refusal }),
                    }),
            };
            match &result {
                Ok(desired) => pods.push(desired.clone()),
                Err(error) => problems.push(Problem {
                    location: "api server".to_owned(),
                    object: Some(format!("{namespace}/{name}")),
                    message: error.to_string(),
                }),
            }
            seen.insert(uid, (pod.clone(), result));
        }
        self.prepared = seen;
        // the same `Arc` for a pod that did not change: the pod config neither copies nor compares it
        self.handle.report_shared(pods, problems);
        self.publish_snapshot(current);
    }

    /// Gives the snapshot's readers the pods.
    fn publish_snapshot(&self, current: &BTreeMap<PodName, Arc<Pod>>) {
        self.tx.send_replace(Arc::new(ApiPodSnapshot { synced: true, pods: current.clone() }));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use super::*;

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
        assert!(!spec_changed(&new, &spec_only(&new)), "what spec_only drops is what is not compared");
        let mut respecced = new;
        respecced.spec.as_mut().expect("spec").active_deadline_seconds = Some(5);
        assert!(spec_changed(&old, &respecced), "the spec");
    }
}
