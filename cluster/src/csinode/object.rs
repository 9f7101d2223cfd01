//! This node's `CSINode` (storage.k8s.io/v1): the CSI drivers registered on it, with the node ID each
//! knows it by, the topology keys it reports and how many volumes it can take, as the kubelet publishes
//! it. Served on `/apis/storage.k8s.io/v1/csinodes` (`nodelet get csinodes`) and, in cluster mode,
//! kept as the API server's CSINode object by [`crate::csinode`].

use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The CSINode of node `name` for these drivers (ordered by name).
pub fn csi_node(name: &str, drivers: &[std::sync::Arc<nodelet_csi::Driver>]) -> CSINode {
    let drivers = drivers
        .iter()
        .map(|d| CSINodeDriver {
            name: d.name().to_owned(),
            node_id: d.node.node_id.clone(),
            topology_keys: Some(d.node.accessible_topology.keys().cloned().collect::<Vec<_>>())
                .filter(|k| !k.is_empty()),
            allocatable: d
                .node
                .max_volumes_per_node
                .and_then(|n| i32::try_from(n).ok())
                .map(|count| VolumeNodeResources { count: Some(count) }),
        })
        .collect();
    CSINode {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: CSINodeSpec { drivers },
        ..CSINode::default()
    }
}
