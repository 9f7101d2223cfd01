//! Mirror pods: each static pod shows in the API as a pod of the same name and namespace,
//! annotated `kubernetes.io/config.mirror: <config hash>` and owned by the Node (which the
//! NodeRestriction admission plugin requires).
//!
//! Kept like the kubelet keeps them: a missing mirror is created (again, after a `kubectl delete`:
//! a mirror marked for deletion is deleted at once with grace period 0, then created anew);
//! a mirror whose hash is not the static pod's current one (the manifest changed) is deleted and
//! created anew; a mirror whose static pod is gone is deleted. The static pod itself is never
//! touched by any of this. Mirror pods are not run: the API pod source skips them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::pod::validation::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION};
use reconcile_engine::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::NodeRef;
use super::pods::ApiPodSnapshot;
use super::{Backoff, is_status};

/// The mirror-pod manager; see the [module docs](self).
pub(crate) struct MirrorPods {
    client: kube::Client,
    desired: Store<PodUid, DesiredPod>,
    snapshot: watch::Receiver<Arc<ApiPodSnapshot>>,
    node: watch::Receiver<Option<NodeRef>>,
}

impl std::fmt::Debug for MirrorPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorPods").finish_non_exhaustive()
    }
}

impl MirrorPods {
    /// Mirrors the static pods of `desired` into the API, reading the API's pods from `snapshot`;
    /// waits for the Node (`node`) to own them.
    pub(crate) fn new(
        client: kube::Client,
        desired: Store<PodUid, DesiredPod>,
        snapshot: watch::Receiver<Arc<ApiPodSnapshot>>,
        node: watch::Receiver<Option<NodeRef>>,
    ) -> Self {
        Self { client, desired, snapshot, node }
    }

    /// Keeps the mirrors until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let changes = self.desired.subscribe();
        let mut backoff = Backoff::default();
        let mut retry_in: Option<Duration> = None;
        loop {
            let wait = retry_in.unwrap_or(Duration::from_secs(60));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = changes.changed() => {}
                r = self.snapshot.changed() => if r.is_err() { return },
                r = self.node.changed() => if r.is_err() { return },
                () = tokio::time::sleep(wait) => {}
            }
            changes.drain();
            // Boxed: the requests' state is held only while a sync is under way.
            retry_in = match Box::pin(self.sync()).await {
                Ok(()) => {
                    backoff.reset();
                    None
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?delay, "updating mirror pods failed");
                    Some(delay)
                }
            };
        }
    }

    async fn sync(&mut self) -> Result<(), kube::Error> {
        let snapshot = self.snapshot.borrow_and_update().clone();
        let Some(node) = self.node.borrow_and_update().clone() else { return Ok(()) };
        if !snapshot.synced || !self.desired.is_synced() {
            return Ok(());
        }
        let mut wanted = HashSet::new();
        let mut first_error = None;
        for (_, pod) in self.desired.entries() {
            if matches!(pod.source, PodSource::Api) {
                continue;
            }
            let (namespace, name) = (pod.namespace().to_owned(), pod.name().to_owned());
            wanted.insert((namespace.clone(), name.clone()));
            let hash =
                pod.pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_HASH_ANNOTATION)).cloned();
            let result = match snapshot.get(&namespace, &name) {
                // Deleted through the API (gracefully): finish the deletion; a new mirror follows.
                Some(existing) if existing.is_mirror() && existing.deletion_timestamp.is_some() => {
                    self.delete(&namespace, &name, existing.uid.clone()).await
                }
                Some(existing) if existing.is_mirror() && existing.mirror == hash => Ok(()),
                Some(existing) if existing.is_mirror() => {
                    // An old version of the static pod: replace it (the new one follows on the next pass).
                    self.delete(&namespace, &name, existing.uid.clone()).await
                }
                // A pod of the API under the static pod's name: not ours to touch.
                Some(_) => Ok(()),
                None => self.create(&pod, hash.unwrap_or_else(|| pod.uid().to_owned()), &node).await,
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        for ((namespace, name), existing) in &snapshot.pods {
            if existing.is_mirror()
                && !wanted.contains(&(namespace.clone(), name.clone()))
                && let Err(e) = self.delete(namespace, name, existing.uid.clone()).await
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn create(&self, pod: &DesiredPod, hash: String, node: &NodeRef) -> Result<(), kube::Error> {
        let mut mirror = pod.pod.clone();
        mirror.status = None;
        // The API refuses ephemeral containers on create; those `nodelet debug` added stay nodelet's.
        if let Some(spec) = mirror.spec.as_mut() {
            spec.ephemeral_containers = None;
        }
        mirror.metadata.uid = None;
        mirror.metadata.resource_version = None;
        mirror.metadata.creation_timestamp = None;
        mirror
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_MIRROR_ANNOTATION.to_owned(), hash);
        mirror.metadata.owner_references = Some(vec![node.owner_reference()]);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), pod.namespace());
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{}/{}", pod.namespace(), pod.name()), "created the mirror pod");
                Ok(())
            }
            // Created meanwhile: the watch brings it.
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the mirror pod `namespace/name` of UID `uid`.
    async fn delete(&self, namespace: &str, name: &str, uid: Option<String>) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid, resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "deleted the mirror pod");
                Ok(())
            }
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
