//! Runtime errors: a failed call to the container runtime, with the reason the pod status shows it as. Every
//! runtime interface of the pairs (pods, sandboxes) returns them.

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
