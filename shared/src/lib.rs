//! What the nodelet daemon (the `nodelet` library) and its client (`nodelet-cli`) both use, so that
//! neither depends on the other:
//!
//! - [`yaml`]: YAML as nodelet reads it (manifests, the config file) and writes it (`-o yaml`, kubeconfigs);
//! - [`units`]: Go durations (`1m30s`), in flags and config fields of both;
//! - [`names`]: DNS-1123 names, as Kubernetes checks them;
//! - [`cri_log`]: CRI container log files: the daemon's `/containerLogs` and `nodelet logs` read them;
//! - `log` (feature `log`): the `-v` flag and the log filter of every command;
//! - [`GET_TYPES`]: the resource types `nodelet get` has; an extension may not take their names.

#![deny(missing_docs)]

pub mod cri_log;
#[cfg(feature = "log")]
pub mod log;
pub mod names;
pub mod units;
pub mod yaml;

/// The resource types `nodelet get` knows itself; any other type names an extension of the node (its
/// status table at `/extensions/NAME`), so no extension may be named like one of these.
pub const GET_TYPES: &[&str] = &[
    "pods",
    "pod",
    "po",
    "nodes",
    "node",
    "no",
    "events",
    "event",
    "ev",
    "pv",
    "persistentvolume",
    "persistentvolumes",
    "pvc",
    "persistentvolumeclaim",
    "persistentvolumeclaims",
    "sc",
    "storageclass",
    "storageclasses",
    "csinode",
    "csinodes",
];
