//! Desired state of sandboxes: what `RunPodSandbox` needs for each desired pod, keyed by pod UID.

use std::sync::Arc;

use crate::model::actual::SandboxRecord;
use crate::model::pod::DesiredPod;

/// The sandbox one pod needs.
///
/// The named fields are what decides whether an existing sandbox still fits the pod; the CRI
/// driver builds the rest of the sandbox configuration (metadata and labels, hostname, DNS config,
/// port mappings, Linux options, log directory) from [`pod`](SandboxSpec::pod) at creation, and
/// looks up the RuntimeClass handler then (as the kubelet does at every sandbox creation).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    /// The pod the sandbox is for.
    pub pod: Arc<DesiredPod>,
    /// Whether the sandbox shares the node's network namespace (`spec.hostNetwork`).
    pub host_network: bool,
    /// The pod's `runtimeClassName` (its handler runs the sandbox).
    pub runtime_class_name: Option<String>,
    /// The pod's hostname as the sandbox gets it.
    pub hostname: String,
}

impl SandboxSpec {
    /// The sandbox `pod` needs.
    pub fn of(pod: Arc<DesiredPod>) -> Self {
        let spec = pod.spec();
        Self {
            host_network: pod.host_network(),
            runtime_class_name: spec.runtime_class_name.clone(),
            hostname: spec.hostname.clone().unwrap_or_else(|| pod.name().to_string()),
            pod,
        }
    }

    /// The pod's UID.
    pub fn uid(&self) -> &str {
        self.pod.uid()
    }

    /// Whether `sandbox` was made for this spec. As the kubelet's `podSandboxChanged`, a sandbox
    /// whose network namespace mode differs from the pod's `hostNetwork` must be replaced. (The
    /// handler is not compared: a pod's `runtimeClassName` cannot change, and a RuntimeClass's
    /// handler cannot either.)
    pub fn matches(&self, sandbox: &SandboxRecord) -> bool {
        super::status::fits(&self.pod, sandbox)
    }
}
