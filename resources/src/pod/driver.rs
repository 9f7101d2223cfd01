//! The narrow runtime interface the pod operations use. The CRI implementation lives in
//! `drivers/cri`; a fake with fault injection backs the unit tests.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use super::actual::PodActual;
use super::desired::DesiredPod;

/// Whether a container is an init container or an app container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// Runs to completion before the app containers, one at a time.
    Init,
    /// A regular container.
    App,
}

/// A failed runtime call, with the Kubernetes waiting reason it shows as in pod status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct RuntimeError {
    /// The reason, as the kubelet names it: `ErrImagePull`, `ErrImageNeverPull`,
    /// `InvalidImageName`, `CreateContainerConfigError`, `CreateContainerError`,
    /// `RunContainerError`, `CreatePodSandboxError`, `KillPodSandboxError`, `KillContainerError`,
    /// `RuntimeUnavailable`.
    pub reason: &'static str,
    /// What went wrong, for people.
    pub message: String,
    /// The object did not exist (removal of something already gone counts as success).
    pub not_found: bool,
}

impl RuntimeError {
    /// A runtime error with `reason` and `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), not_found: false }
    }
}

/// Result of runtime calls.
pub type RuntimeResult<T> = Result<T, RuntimeError>;

/// What the pod operations need from a container runtime. Every method is one step the kubelet
/// also takes through CRI; implementations must label what they create so that
/// [`list_pods`](PodRuntime::list_pods) finds it again after a restart.
pub trait PodRuntime: Send + Sync + 'static {
    /// Creates and starts the pod's sandbox (with its network, hostname, DNS config, port
    /// mappings, log directory and labels); returns the sandbox ID.
    fn run_sandbox(
        &self,
        pod: &DesiredPod,
        attempt: u32,
    ) -> impl Future<Output = RuntimeResult<String>> + Send;

    /// Stops a sandbox (its network is torn down). Stopping a stopped or missing one succeeds.
    fn stop_sandbox(&self, sandbox_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Removes a stopped sandbox. Removing a missing one succeeds.
    fn remove_sandbox(&self, sandbox_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Makes sure the container's image is present as its `imagePullPolicy` says, then creates
    /// and starts the container in the sandbox; returns the container ID. The container is
    /// labelled and annotated with its restart count and spec hash.
    fn start_container(
        &self,
        pod: &DesiredPod,
        sandbox_id: &str,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
    ) -> impl Future<Output = RuntimeResult<String>> + Send;

    /// Stops a container: SIGTERM (or its stop signal), then SIGKILL after `grace`. Stopping an
    /// exited or missing container succeeds.
    fn stop_container(
        &self,
        container_id: &str,
        grace: Duration,
    ) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Removes a container and its log. Removing a missing one succeeds.
    fn remove_container(&self, container_id: &str) -> impl Future<Output = RuntimeResult<()>> + Send;

    /// Everything nodelet manages, grouped by pod UID.
    fn list_pods(&self) -> impl Future<Output = RuntimeResult<HashMap<String, PodActual>>> + Send;

    /// What the runtime has for one pod now (`None` if nothing).
    fn pod_state(&self, uid: &str) -> impl Future<Output = RuntimeResult<Option<PodActual>>> + Send;
}

/// The hash nodelet records on each container, to notice a changed container spec.
pub fn container_hash(container: &Container) -> String {
    use std::hash::{Hash, Hasher};
    let json = serde_json::to_string(container).unwrap_or_default();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    json.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}
