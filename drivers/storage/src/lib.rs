//! nodelet's storage drivers for PersistentVolumeClaims
//! ([`nodelet_resources::claim`]):
//!
//! - [`local::LocalDirProvisioner`]: a directory `<base>/<volume>` per claim, as a `local`
//!   volume with node affinity to this node; deletion removes the directory without following
//!   symlinks and refuses mount points.
//! - [`lvm::LvmProvisioner`]: a logical volume per claim in a configured volume group
//!   (`lvcreate`), formatted (`mkfs.ext4`) and mounted under
//!   `<root>/plugins/kubernetes.io~lvm/<vg>/<lv>`, as a `local` volume; deletion unmounts and
//!   `lvremove`s; after a restart, volumes are mounted again.
//! - [`csi::CsiProvisioner`]: `CreateVolume`/`DeleteVolume` on any CSI driver registered in a
//!   [`nodelet_csi::Registry`] that offers them; volumes of type `csi`.
//! - [`records::FileRecords`]: the binding records and provisioned volumes as JSON files, so a
//!   restart binds nothing twice.
//! - [`stats::fs_stats`]: `statvfs` of a mounted volume for `kubelet_volume_stats_*`.
//!
//! Every external command runs with an argument vector (never a shell), and every name that
//! reaches a path or a command is validated first.

#![deny(missing_docs)]

pub mod csi;
pub mod local;
pub mod lvm;
pub mod records;
pub mod stats;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
};

/// Node affinity to this node alone (`kubernetes.io/hostname In [node]`).
pub fn node_affinity(node: &str) -> VolumeNodeAffinity {
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: "kubernetes.io/hostname".into(),
                    operator: "In".into(),
                    values: Some(vec![node.to_owned()]),
                }]),
                match_fields: None,
            }],
        }),
    }
}

/// An annotation value of a volume.
fn annotation<'a>(pv: &'a k8s_openapi::api::core::v1::PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.annotations.as_ref().and_then(|a: &BTreeMap<String, String>| a.get(key)).map(String::as_str)
}
