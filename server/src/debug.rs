//! The error of `POST /debug/{namespace}/{pod}`: why an ephemeral container could not be added to a static
//! pod. The pod sources, which keep static pods' ephemeral containers, return it through
//! [`NodeView::add_ephemeral_container`](crate::NodeView::add_ephemeral_container); the route maps each case to its HTTP status.

/// Why an ephemeral container could not be added.
#[derive(Debug, thiserror::Error)]
pub enum DebugError {
    /// No pod of that name runs here.
    #[error("pods \"{name}\" not found in namespace \"{namespace}\"")]
    PodNotFound {
        /// The namespace.
        namespace: String,
        /// The pod's name.
        name: String,
    },
    /// The pod is the API server's: its ephemeral containers are added there.
    #[error(
        "pod \"{0}\" comes from the API server: add ephemeral containers through its ephemeralcontainers \
         subresource (kubectl debug)"
    )]
    ApiPod(String),
    /// This nodelet keeps no ephemeral containers (no state file configured).
    #[error("this nodelet does not keep ephemeral containers of static pods")]
    NotSupported,
    /// The container is not valid for the pod.
    #[error(transparent)]
    Invalid(#[from] nodelet_resources::pod::validation::ValidationError),
    /// The pod with the container would break its source's Pod Security level, `--allow-privileged=false`
    /// or placement (the whole message, naming the pod).
    #[error("{0}")]
    Forbidden(String),
    /// The state file could not be written; nothing was added.
    #[error("cannot keep the ephemeral container: {0}")]
    Save(#[from] nodelet_node::atomic::AtomicWriteError),
}
