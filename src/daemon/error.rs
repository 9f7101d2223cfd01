//! The daemon's errors: [`Error`] (why the daemon could not start or stopped), and [`StartError`], the
//! failure of one [`Stage`] of the start ([`super::topology`]), with the message of what failed.

use std::error::Error as _;

use super::extension::BoxError;
use super::supervisor::TaskFailure;

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line or the configuration is invalid, or logging cannot be set up.
    #[error(transparent)]
    Config(BoxError),
    /// Two extensions have the same name, or a name is not allowed.
    #[error(transparent)]
    Extension(#[from] super::extension::NameError),
    /// An extension failed to start.
    #[error("extension {name:?} failed to start: {source}")]
    ExtensionStart {
        /// The extension.
        name: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A standard pair or concern failed to start ([`StartError::stage`] says which).
    #[error(transparent)]
    Start(#[from] StartError),
    /// A supervised task ended or panicked before shutdown.
    #[error(transparent)]
    TaskFailed(#[from] TaskFailure),
    /// The tokio runtime cannot be built, or a signal handler cannot be installed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The part of the node's start that failed, in the order the node starts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// The root directory, the metrics registries and the supervisor.
    Setup,
    /// The container runtime: the embedded containerd, the CRI connection, preloaded images, the node's facts.
    Runtime,
    /// The pod sources (manifest directory, URL, HTTP endpoint) and, in cluster mode, the API server's.
    Sources,
    /// The CRI pod runtime, the CSI plugin registry and the claim pair.
    Claims,
    /// The volume pair, with its populator.
    Volumes,
    /// The sandbox pair, and the pod pair with the prober, the PLEG and container GC.
    Pods,
    /// Node, pod and container statistics.
    Stats,
    /// Image garbage collection, admission and eviction.
    Pressure,
    /// The node's status (what the servers and cluster mode read).
    Status,
    /// Cluster mode's tasks (Node, Lease, pod status, mirror pods, events).
    Cluster,
    /// The HTTP servers.
    Servers,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Setup => "setup",
            Stage::Runtime => "runtime",
            Stage::Sources => "sources",
            Stage::Claims => "claims",
            Stage::Volumes => "volumes",
            Stage::Pods => "pods",
            Stage::Stats => "stats",
            Stage::Pressure => "pressure",
            Stage::Status => "status",
            Stage::Cluster => "cluster",
            Stage::Servers => "servers",
        })
    }
}

/// A standard pair or concern could not start: the [`Stage`], and what failed. Its message is what failed
/// followed by each of its causes (`cannot create the root directory /x: Permission denied (os error 13)`).
#[derive(Debug)]
pub struct StartError {
    stage: Stage,
    cause: StartCause,
}

impl StartError {
    /// `cause` at `stage`.
    pub(crate) fn new(stage: Stage, cause: impl Into<StartCause>) -> Self {
        StartError { stage, cause: cause.into() }
    }

    /// A function that puts a cause at `stage` (for `map_err`).
    pub(crate) fn at<E: Into<StartCause>>(stage: Stage) -> impl FnOnce(E) -> StartError {
        move |cause| StartError::new(stage, cause)
    }

    /// The part of the start that failed.
    pub fn stage(&self) -> Stage {
        self.stage
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.cause)?;
        let mut source = self.cause.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

// The message already holds the causes, one after the other: no `source`, so nothing prints them twice.
impl std::error::Error for StartError {}

/// What failed while the node started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartCause {
    /// A directory the node needs cannot be created.
    #[error("cannot create {what}")]
    CreateDir {
        /// The directory, as the message names it.
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Cluster mode's heartbeat thread (`cluster::HeartbeatLane`) could not be started.
    #[error("cannot start the thread that renews the node's Lease")]
    HeartbeatLane(#[source] std::io::Error),
    /// The container runtime's endpoint is not one nodelet can connect to.
    #[error("bad container runtime endpoint {endpoint}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: nodelet_cri::CriError,
    },
    /// The runtime did not answer `Version`, asked before preloading images.
    #[error("CRI Version (to preload images)")]
    Version(#[source] nodelet_cri::CriError),
    /// `--preload-images` with an external runtime that is not containerd.
    #[error(
        "--preload-images imports with containerd's `ctr images import`, but the runtime at {endpoint} is \
         {name} {version}: load the images with that runtime's own tools instead"
    )]
    NotContainerd { endpoint: String, name: String, version: String },
    /// The embedded containerd (start, stop) or the import of the preloaded images.
    #[error(transparent)]
    Containerd(#[from] nodelet_node::containerd::ContainerdError),
    /// A metric cannot be registered.
    #[error(transparent)]
    Metrics(#[from] prometheus::Error),
    /// A pod source cannot be added.
    #[error(transparent)]
    PodConfig(#[from] crate::sources::PodConfigError),
    /// The URL source's configuration is invalid.
    #[error(transparent)]
    UrlSource(#[from] crate::sources::url::UrlSourceError),
    /// The HTTP source cannot be set up.
    #[error(transparent)]
    HttpSource(#[from] crate::sources::http::HttpSourceError),
    /// Cluster mode cannot be set up.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The LVM provisioner's volume group is invalid.
    #[error(transparent)]
    Lvm(#[from] nodelet_storage::lvm::LvmError),
    /// The servers cannot be bound.
    #[error(transparent)]
    Server(#[from] crate::server::ServerError),
    /// One of nodelet's own pairs started as an extension (`super::builtin`) failed to start.
    #[error(transparent)]
    Builtin(BoxError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_error_names_its_stage_and_prints_every_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = StartError::new(
            Stage::Setup,
            StartCause::CreateDir { what: "the root directory /x".into(), source: io },
        );
        assert_eq!(e.stage(), Stage::Setup);
        assert_eq!(e.to_string(), "cannot create the root directory /x: denied");
        let e = Error::from(e);
        assert_eq!(e.to_string(), "cannot create the root directory /x: denied");
        assert!(e.source().is_none(), "the causes are in the message, not printed twice");
        assert!(matches!(e, Error::Start(ref s) if s.stage() == Stage::Setup));
        assert_eq!(Stage::Pressure.to_string(), "pressure");
    }

    #[test]
    fn an_extension_name_error_says_which_name_and_why() {
        use super::super::extension::{NameError, check_name};
        assert_eq!(check_name("prepull"), Ok(()));
        let e = check_name("Bad_Name").unwrap_err();
        assert_eq!(e, NameError::NotLabel("Bad_Name".into()));
        assert_eq!(e.to_string(), "extension name \"Bad_Name\" is not a lowercase DNS label");
        let e = check_name("pods").unwrap_err();
        assert_eq!(
            Error::from(e).to_string(),
            "extension name \"pods\" is one of nodelet get's own resource types"
        );
        assert_eq!(NameError::Duplicate("x".into()).to_string(), "two extensions are named \"x\"");
    }
}
