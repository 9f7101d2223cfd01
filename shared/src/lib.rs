//! What the nodelet daemon (the `nodelet` library) and its client (`nodelet-cli`) both use, so that
//! neither depends on the other:
//!
//! - [`yaml`]: YAML as nodelet reads it (manifests, the config file) and writes it (`-o yaml`, kubeconfigs);
//! - [`units`]: Go durations (`1m30s`), in flags and config fields of both;
//! - [`names`]: DNS-1123 names, as Kubernetes checks them;
//! - [`cri_log`]: CRI container log files: the daemon's `/containerLogs` and `nodelet logs` read them;
//! - `log` (feature `log`): the `-v` flag and the log filter of every command;
//! - [`GET_TYPES`]: the resource types `nodelet get` has; an extension may not take their names;
//! - [`panic_message`]: the message of a caught panic, as the daemon's tasks, servers and sources log it.

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

/// The message of a panic's payload (`panic!("…")` gives a `&str` or a `String`), or `(no message)`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}
