//! Keeps this node's CSINode object (storage.k8s.io/v1) in the API server equal to the CSI drivers
//! registered on the node ([`csi_node`]), as the kubelet does: created once the Node
//! is registered (owned by it, so it goes with the Node), its drivers replaced whenever the set of
//! drivers changes or the Node is registered anew; never polled (a failed write is retried after 5 s).
//! The Node authorizer lets a node manage its own CSINode.
//!
//! The Node object gets what the kubelet's CSI plugin puts on it (before the CSINode is written):
//! - the annotation `csi.volume.kubernetes.io/nodeid`, a JSON map from driver name to the node ID the
//!   driver reported (`{"hostpath.csi.nodelet.dev":"node-1"}`, keys sorted, as Go's `json.Marshal`
//!   writes it), without the drivers that went; removed when no driver is left;
//! - the drivers' accessible topology (`NodeGetInfo`) as labels. A label the Node already has with
//!   another value is left as it is (the kubelet refuses such a driver: "topology value collision"), and so
//!   is one the NodeRestriction admission would not let a node set (a `kubernetes.io` / `k8s.io` key that
//!   is not one of the kubelet's). When a driver goes, its topology labels (the keys its entry in the
//!   CSINode lists) are removed unless a registered driver still reports them or nodelet sets them
//!   itself (the standard labels, `--node-labels`); the kubelet leaves them behind.
//!
//! Both are changed with a JSON merge patch of the Node's own metadata, which NodeRestriction allows. The
//! Node is read (and patched if needed) when the drivers or the Node's identity change: an idle node
//! sends nothing for its CSINode.

use std::sync::Arc;
use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::NodeRef;

mod object;
pub use object::csi_node;

/// Wait after a failed write.
const RETRY: Duration = Duration::from_secs(5);
/// The Node annotation with the drivers' node IDs (the kubelet's `annotationKeyNodeID`).
pub(crate) const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// Writes the node's CSINode; run it with [`run`](Self::run).
pub(crate) struct CsiNodeSync {
    api: Api<CSINode>,
    nodes: Api<Node>,
    registry: Arc<nodelet_csi::Registry>,
    registered: watch::Receiver<Option<NodeRef>>,
    /// Labels nodelet sets on the Node itself: never removed as a driver's topology.
    own_labels: BTreeSet<String>,
    /// The Node and the drivers its metadata was last brought in line with: the Node is read and patched
    /// only when either changes, not on every resync.
    node_done: Option<(NodeRef, Vec<DriverTopology>)>,
}

impl CsiNodeSync {
    /// A writer for the node that `registered` reports, with the drivers of `registry`; `own_labels` are
    /// the label keys nodelet sets on the Node itself (kept when a driver reporting them goes).
    pub(crate) fn new(
        client: kube::Client,
        registry: Arc<nodelet_csi::Registry>,
        registered: watch::Receiver<Option<NodeRef>>,
        own_labels: BTreeSet<String>,
    ) -> Self {
        Self {
            api: Api::all(client.clone()),
            nodes: Api::all(client),
            registry,
            registered,
            own_labels,
            node_done: None,
        }
    }

    /// Keeps the object up to date until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut drivers = self.registry.subscribe();
        loop {
            let node = self.registered.borrow_and_update().clone();
            let wait = match node {
                None => None,
                // Boxed: the requests' state is held only while a sync is under way.
                Some(node) => match Box::pin(self.sync(&node)).await {
                    // As the kubelet: written again when a driver comes or goes or the Node is registered
                    // anew (its garbage collection takes the CSINode with it), never polled.
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!(node = %node.name, error = %e, "cannot write the node's CSINode; retrying");
                        Some(RETRY)
                    }
                },
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = self.registered.changed() => if r.is_err() { return },
                r = drivers.changed() => if r.is_err() { return },
                () = async { match wait { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => {}
            }
        }
    }

    async fn sync(&mut self, node: &NodeRef) -> Result<(), kube::Error> {
        let drivers = self.registry.drivers();
        let existing = self.api.get_opt(&node.name).await?;
        self.sync_node(node, &drivers, existing.as_ref()).await?;
        let mut wanted = object::csi_node(&node.name, &drivers);
        wanted.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name.clone(),
            uid: node.uid.clone(),
            ..OwnerReference::default()
        }]);
        match existing {
            None => {
                self.api.create(&PostParams::default(), &wanted).await?;
                tracing::info!(node = %node.name, drivers = wanted.spec.drivers.len(), "created the node's CSINode");
            }
            Some(existing) if existing.spec.drivers != wanted.spec.drivers => {
                let mut updated = existing;
                updated.spec = wanted.spec;
                self.api.replace(&node.name, &PostParams::default(), &updated).await?;
                tracing::info!(node = %node.name, drivers = updated.spec.drivers.len(), "updated the node's CSINode");
            }
            Some(_) => {}
        }
        Ok(())
    }
}

impl CsiNodeSync {
    /// Brings the Node's node-ID annotation and topology labels in line with `drivers`; `csinode` (the
    /// CSINode before this sync) tells the topology keys of drivers that went.
    async fn sync_node(
        &mut self,
        node_ref: &NodeRef,
        drivers: &[Arc<nodelet_csi::Driver>],
        csinode: Option<&CSINode>,
    ) -> Result<(), kube::Error> {
        let name = node_ref.name.as_str();
        let registered: Vec<DriverTopology> = drivers
            .iter()
            .map(|d| DriverTopology {
                name: d.name().to_owned(),
                node_id: d.node.node_id.clone(),
                topology: d.node.accessible_topology.clone(),
            })
            .collect();
        if self.node_done.as_ref().is_some_and(|(n, d)| n == node_ref && *d == registered) {
            return Ok(());
        }
        let node = self.nodes.get(name).await?;
        let gone_keys: BTreeSet<String> = csinode
            .map(|c| c.spec.drivers.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|d| !registered.iter().any(|r| r.name == d.name))
            .flat_map(|d| d.topology_keys.iter().flatten().cloned())
            .collect();
        let plan = node_metadata_patch(&node.metadata, &registered, &gone_keys, &self.own_labels);
        for skipped in &plan.skipped {
            tracing::warn!(node = %name, %skipped, "a CSI driver's topology label is not set");
        }
        if let Some(patch) = plan.patch {
            self.nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            tracing::info!(node = %name, patch = %patch, "updated the node's CSI node IDs and topology labels");
        }
        self.node_done = Some((node_ref.clone(), registered));
        Ok(())
    }
}

/// What a registered driver puts on the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DriverTopology {
    /// The driver's name.
    pub(crate) name: String,
    /// The node ID it reported.
    pub(crate) node_id: String,
    /// Its accessible topology (label key → value).
    pub(crate) topology: BTreeMap<String, String>,
}

/// The change [`node_metadata_patch`] computed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodePatchPlan {
    /// The JSON merge patch (`{"metadata": {"annotations": …, "labels": …}}`), `None` when nothing changes.
    pub(crate) patch: Option<serde_json::Value>,
    /// Topology labels not set, with the reason.
    pub(crate) skipped: Vec<String>,
}

/// The merge patch that gives a Node with metadata `meta` the node-ID annotation and topology labels of
/// `drivers`, and removes the labels `gone_keys` (topology keys of drivers that went) unless a driver
/// still reports them or they are in `own_labels` (see the [module docs](self)).
pub(crate) fn node_metadata_patch(
    meta: &ObjectMeta,
    drivers: &[DriverTopology],
    gone_keys: &BTreeSet<String>,
    own_labels: &BTreeSet<String>,
) -> NodePatchPlan {
    let mut annotations = serde_json::Map::new();
    let ids: BTreeMap<&str, &str> = drivers.iter().map(|d| (d.name.as_str(), d.node_id.as_str())).collect();
    let current = meta.annotations.as_ref().and_then(|a| a.get(NODE_ID_ANNOTATION));
    if ids.is_empty() {
        if current.is_some() {
            annotations.insert(NODE_ID_ANNOTATION.to_owned(), serde_json::Value::Null);
        }
    } else {
        let wanted = serde_json::to_string(&ids).unwrap_or_default();
        let same = current
            .and_then(|c| serde_json::from_str::<BTreeMap<String, String>>(c).ok())
            .is_some_and(|have| {
                have.len() == ids.len() && have.iter().all(|(k, v)| ids.get(k.as_str()) == Some(&v.as_str()))
            });
        if !same {
            annotations.insert(NODE_ID_ANNOTATION.to_owned(), serde_json::Value::from(wanted));
        }
    }

    let have = meta.labels.clone().unwrap_or_default();
    let mut labels = serde_json::Map::new();
    let mut skipped = Vec::new();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for driver in drivers {
        for (key, value) in &driver.topology {
            reported.insert(key);
            match have.get(key) {
                Some(v) if v == value => {}
                Some(v) => skipped.push(format!(
                    "{key}={value} of driver {}: the Node has {key}={v} (topology value collision)",
                    driver.name
                )),
                None => match crate::config::check_node_label(key, value) {
                    Ok(()) => {
                        labels.insert(key.clone(), serde_json::Value::from(value.clone()));
                    }
                    Err(why) => skipped.push(format!("{key}={value} of driver {}: {why}", driver.name)),
                },
            }
        }
    }
    for key in gone_keys {
        if have.contains_key(key) && !reported.contains(key.as_str()) && !own_labels.contains(key) {
            labels.insert(key.clone(), serde_json::Value::Null);
        }
    }

    let mut metadata = serde_json::Map::new();
    if !annotations.is_empty() {
        metadata.insert("annotations".to_owned(), annotations.into());
    }
    if !labels.is_empty() {
        metadata.insert("labels".to_owned(), labels.into());
    }
    let patch = (!metadata.is_empty()).then(|| serde_json::json!({ "metadata": metadata }));
    NodePatchPlan { patch, skipped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn driver(name: &str, id: &str, topology: &[(&str, &str)]) -> DriverTopology {
        DriverTopology {
            name: name.to_owned(),
            node_id: id.to_owned(),
            topology: topology.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        }
    }

    fn meta(annotation: Option<&str>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            annotations: annotation.map(|a| [(NODE_ID_ANNOTATION.to_owned(), a.to_owned())].into()),
            labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..ObjectMeta::default()
        }
    }

    fn keys(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_registered_driver_adds_its_node_id_and_topology() {
        let drivers = [driver("b.csi", "n-b", &[("topology.b.csi/zone", "z1")]), driver("a.csi", "n-a", &[])];
        let plan = node_metadata_patch(&meta(None, &[]), &drivers, &keys(&[]), &keys(&[]));
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {
                "annotations": {NODE_ID_ANNOTATION: "{\"a.csi\":\"n-a\",\"b.csi\":\"n-b\"}"},
                "labels": {"topology.b.csi/zone": "z1"},
            }}))
        );
        // Already there: nothing to do.
        let done = meta(Some("{\"a.csi\":\"n-a\",\"b.csi\":\"n-b\"}"), &[("topology.b.csi/zone", "z1")]);
        assert_eq!(node_metadata_patch(&done, &drivers, &keys(&[]), &keys(&[])).patch, None);
    }

    #[test]
    fn a_driver_that_went_takes_its_entry_and_labels_along() {
        let node = meta(
            Some("{\"a.csi\":\"n-a\",\"b.csi\":\"n-b\"}"),
            &[("topology.b.csi/zone", "z1"), ("shared/zone", "z"), ("mine", "x")],
        );
        let drivers = [driver("a.csi", "n-a", &[("shared/zone", "z")])];
        let gone = keys(&["topology.b.csi/zone", "shared/zone", "mine", "absent"]);
        let plan = node_metadata_patch(&node, &drivers, &gone, &keys(&["mine"]));
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {
                "annotations": {NODE_ID_ANNOTATION: "{\"a.csi\":\"n-a\"}"},
                "labels": {"topology.b.csi/zone": null},
            }})),
            "a label another driver reports, nodelet's own and a missing one stay"
        );
        let last = node_metadata_patch(&meta(Some("{\"a.csi\":\"n-a\"}"), &[]), &[], &keys(&[]), &keys(&[]));
        assert_eq!(plan.skipped, Vec::<String>::new());
        assert_eq!(last.patch, Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: null}}})));
    }

    #[test]
    fn colliding_and_forbidden_labels_are_not_set() {
        let node = meta(None, &[("topology.x/zone", "other")]);
        let drivers =
            [driver("x.csi", "n", &[("topology.x/zone", "mine"), ("kubernetes.io/not-allowed", "v")])];
        let plan = node_metadata_patch(&node, &drivers, &keys(&[]), &keys(&[]));
        assert_eq!(
            plan.patch,
            Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "{\"x.csi\":\"n\"}"}}}))
        );
        assert_eq!(plan.skipped.len(), 2, "{:?}", plan.skipped);
        assert!(plan.skipped[0].contains("collision") || plan.skipped[1].contains("collision"));
    }
}
