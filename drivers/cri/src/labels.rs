//! CRI label and annotation keys shared with the kubelet, plus nodelet's own marker label.
//!
//! The `io.kubernetes.*` keys are the ones the kubelet puts on CRI sandboxes and containers
//! (`pkg/kubelet/types/labels.go` and `pkg/kubelet/kuberuntime/labels.go`). Using the same keys keeps
//! `crictl` output, log collectors and other node tooling working unchanged.
//!
//! Labels are indexed by the runtime and can be used in list filters; annotations are not and carry
//! bookkeeping values (restart count, spec hash, grace period).
//!
//! Every object nodelet creates carries [`MANAGED`]`=`[`MANAGED_VALUE`], so that after a restart nodelet can
//! list exactly its own sandboxes and containers with [`managed_selector`] and leave foreign ones alone. With a
//! node name, they also carry [`NODE`], and nodelet lists only its node's objects (two nodelets sharing one
//! runtime do not tear down each other's pods).

use std::collections::HashMap;

/// Label: the pod's name (sandboxes and containers).
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace (sandboxes and containers).
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label: the pod's UID (sandboxes and containers).
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the container's name within the pod (containers only).
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

/// Annotation: how many times the container was restarted; decimal (containers only).
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: hash of the container spec the container was created from; lowercase hex like the kubelet's
/// `strconv.FormatUint(hash, 16)` (containers only).
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation (the kubelet's): the container spec's hash without `resources`, which decides whether a
/// changed spec replaces the container (a resources change is resized in place instead).
pub const CONTAINER_HASH_WITHOUT_RESOURCES: &str = "io.kubernetes.container.hashWithoutResources";
/// Annotation: the pod's `terminationGracePeriodSeconds`; decimal seconds (containers only).
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation: path of the termination message file inside the container (containers only).
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation: the termination message policy, `File` or `FallbackToLogsOnError` (containers only).
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Container annotation: the container's `lifecycle.preStop` handler as JSON, so that the hook runs even
/// when the pod's spec is gone (the kubelet's key).
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Container annotation: the container's `ports` as JSON, to resolve a hook's named port (the kubelet's key).
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";

/// Annotation (nodelet's): whether the container is an init container ([`CONTAINER_KIND_INIT`]), an app
/// container ([`CONTAINER_KIND_APP`]) or an ephemeral container ([`CONTAINER_KIND_EPHEMERAL`]) (containers
/// only).
pub const CONTAINER_KIND: &str = "io.nodelet.container.kind";
/// Value of [`CONTAINER_KIND`] for init containers.
pub const CONTAINER_KIND_INIT: &str = "init";
/// Value of [`CONTAINER_KIND`] for app containers.
pub const CONTAINER_KIND_APP: &str = "app";
/// Value of [`CONTAINER_KIND`] for ephemeral containers.
pub const CONTAINER_KIND_EPHEMERAL: &str = "ephemeral";
/// Annotation (nodelet's): the restart count at which the container's spec (its hash without `resources`)
/// first ran; the crash-loop back-off counts the restarts since then, as the kubelet keys its back-off by
/// the spec's hash (containers only).
pub const CONTAINER_BACKOFF_SINCE: &str = "io.nodelet.container.backoffSince";
/// Annotation (nodelet's): on a sidecar (an init container with `restartPolicy: Always`), its index
/// among the init containers (they are stopped after the app containers, the last one first).
pub const CONTAINER_SIDECAR_INDEX: &str = "io.nodelet.container.sidecarIndex";
/// Annotation (nodelet's): the image as the pod spec names it; the container itself is created from the
/// image ID, like the kubelet does (containers only).
pub const CONTAINER_IMAGE: &str = "io.nodelet.container.image";

/// Label: marks sandboxes and containers created by nodelet.
pub const MANAGED: &str = "io.nodelet.managed";
/// The value of [`MANAGED`] on nodelet's objects.
pub const MANAGED_VALUE: &str = "true";
/// Label (nodelet's): the node whose nodelet created the sandbox or container (set when the runtime
/// knows its node name). A nodelet lists, and so tears down, only its own node's objects: several
/// nodelets sharing one runtime (tests, a second instance) leave each other's pods alone.
pub const NODE: &str = "io.nodelet.node";

/// The identity of the pod a sandbox or container belongs to, as recorded in its labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodIdentity {
    /// Pod name ([`POD_NAME`]).
    pub name: String,
    /// Pod namespace ([`POD_NAMESPACE`]).
    pub namespace: String,
    /// Pod UID ([`POD_UID`]).
    pub uid: String,
}

impl PodIdentity {
    /// Creates an identity from its parts.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>, uid: impl Into<String>) -> Self {
        PodIdentity { name: name.into(), namespace: namespace.into(), uid: uid.into() }
    }

    /// Reads the identity back from a sandbox's or container's labels; `None` if any of the three is missing.
    pub fn from_labels(labels: &(impl Lookup + ?Sized)) -> Option<Self> {
        Some(PodIdentity {
            name: labels.value(POD_NAME)?.to_owned(),
            namespace: labels.value(POD_NAMESPACE)?.to_owned(),
            uid: labels.value(POD_UID)?.to_owned(),
        })
    }
}

/// Read access to a label or annotation map, in whichever form the runtime's answer was decoded: a
/// `HashMap` (the CRI types) or a list of entries (the lean listings of [`crate::listing`]).
pub trait Lookup {
    /// The value of `key`, if the map has it.
    fn value(&self, key: &str) -> Option<&str>;
}

impl<S: std::hash::BuildHasher> Lookup for HashMap<String, String, S> {
    fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// Labels for a pod sandbox: pod name, namespace, UID and the nodelet marker.
pub fn sandbox_labels(pod: &PodIdentity) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.to_owned(), pod.name.clone()),
        (POD_NAMESPACE.to_owned(), pod.namespace.clone()),
        (POD_UID.to_owned(), pod.uid.clone()),
        (MANAGED.to_owned(), MANAGED_VALUE.to_owned()),
    ])
}

/// Labels for a container: the sandbox labels plus the container name.
pub fn container_labels(pod: &PodIdentity, container_name: &str) -> HashMap<String, String> {
    let mut labels = sandbox_labels(pod);
    labels.insert(CONTAINER_NAME.to_owned(), container_name.to_owned());
    labels
}

/// Annotations for a container: spec hash, restart count and, if known, the pod's termination grace period.
pub fn container_annotations(
    spec_hash: u64,
    restart_count: u32,
    termination_grace_period_secs: Option<i64>,
) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (CONTAINER_HASH.to_owned(), format!("{spec_hash:x}")),
        (CONTAINER_RESTART_COUNT.to_owned(), restart_count.to_string()),
    ]);
    if let Some(secs) = termination_grace_period_secs {
        annotations.insert(POD_TERMINATION_GRACE_PERIOD.to_owned(), secs.to_string());
    }
    annotations
}

/// The label selector that matches every object nodelet created (`io.nodelet.managed=true`).
pub fn managed_selector() -> HashMap<String, String> {
    HashMap::from([(MANAGED.to_owned(), MANAGED_VALUE.to_owned())])
}

/// True if the labels carry the nodelet marker.
pub fn is_managed(labels: &(impl Lookup + ?Sized)) -> bool {
    labels.value(MANAGED) == Some(MANAGED_VALUE)
}

/// Parses [`CONTAINER_RESTART_COUNT`]; `None` if absent or malformed.
pub fn restart_count(annotations: &(impl Lookup + ?Sized)) -> Option<u32> {
    annotations.value(CONTAINER_RESTART_COUNT)?.parse().ok()
}

/// Parses [`CONTAINER_BACKOFF_SINCE`]; `None` if absent (a container created before nodelet recorded it)
/// or malformed.
pub fn backoff_since(annotations: &(impl Lookup + ?Sized)) -> Option<u32> {
    annotations.value(CONTAINER_BACKOFF_SINCE)?.parse().ok()
}

/// Parses [`CONTAINER_SIDECAR_INDEX`]; `None` if absent (not a sidecar) or malformed.
pub fn sidecar_index(annotations: &(impl Lookup + ?Sized)) -> Option<u32> {
    annotations.value(CONTAINER_SIDECAR_INDEX)?.parse().ok()
}

/// Parses [`CONTAINER_HASH`] (hex); `None` if absent or malformed.
pub fn spec_hash(annotations: &(impl Lookup + ?Sized)) -> Option<u64> {
    u64::from_str_radix(annotations.value(CONTAINER_HASH)?, 16).ok()
}

/// Parses [`POD_TERMINATION_GRACE_PERIOD`] (seconds); `None` if absent or malformed.
pub fn termination_grace_period_secs(annotations: &(impl Lookup + ?Sized)) -> Option<i64> {
    annotations.value(POD_TERMINATION_GRACE_PERIOD)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_compatible_keys() {
        assert_eq!(POD_NAME, "io.kubernetes.pod.name");
        assert_eq!(POD_NAMESPACE, "io.kubernetes.pod.namespace");
        assert_eq!(POD_UID, "io.kubernetes.pod.uid");
        assert_eq!(CONTAINER_NAME, "io.kubernetes.container.name");
        assert_eq!(CONTAINER_RESTART_COUNT, "io.kubernetes.container.restartCount");
        assert_eq!(CONTAINER_HASH, "io.kubernetes.container.hash");
        assert_eq!(POD_TERMINATION_GRACE_PERIOD, "io.kubernetes.pod.terminationGracePeriod");
        assert_eq!((MANAGED, MANAGED_VALUE), ("io.nodelet.managed", "true"));
    }

    #[test]
    fn round_trips() {
        let pod = PodIdentity::new("web", "default", "1234-abcd");
        let labels = container_labels(&pod, "nginx");
        assert!(is_managed(&labels));
        assert_eq!(PodIdentity::from_labels(&labels), Some(pod.clone()));
        assert_eq!(labels.get(CONTAINER_NAME).map(String::as_str), Some("nginx"));
        assert!(!sandbox_labels(&pod).contains_key(CONTAINER_NAME));

        let ann = container_annotations(0xdead_beef, 3, Some(30));
        assert_eq!(ann.get(CONTAINER_HASH).map(String::as_str), Some("deadbeef"));
        assert_eq!(spec_hash(&ann), Some(0xdead_beef));
        assert_eq!(restart_count(&ann), Some(3));
        assert_eq!(termination_grace_period_secs(&ann), Some(30));
        assert_eq!(termination_grace_period_secs(&container_annotations(1, 0, None)), None);

        let mut bad = HashMap::new();
        bad.insert(CONTAINER_RESTART_COUNT.to_owned(), "-1".to_owned());
        bad.insert(CONTAINER_HASH.to_owned(), "xyz".to_owned());
        assert_eq!(restart_count(&bad), None);
        assert_eq!(spec_hash(&bad), None);
        assert!(!is_managed(&bad));
        assert_eq!(PodIdentity::from_labels(&bad), None);
    }
}
