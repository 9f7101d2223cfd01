//! Desired state of pods: what the sources ask for, after validation and defaulting.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// The key of a pod in the desired and actual stores: its UID.
pub type PodUid = String;

/// Where a desired pod came from (the `kubernetes.io/config.source` annotation says the same).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PodSource {
    /// A file in the static manifest directory.
    File(PathBuf),
    /// The manifest URL.
    Url(String),
    /// Submitted to the HTTP endpoint.
    Http,
    /// The Kubernetes API server.
    Api,
}

impl PodSource {
    /// The value of the `kubernetes.io/config.source` annotation: `file`, `http` or `api` (the
    /// kubelet calls both the manifest URL and the HTTP endpoint `http`).
    pub fn annotation(&self) -> &'static str {
        match self {
            PodSource::File(_) => "file",
            PodSource::Url(_) | PodSource::Http => "http",
            PodSource::Api => "api",
        }
    }
}

/// A pod as nodelet should run it: validated, defaulted, with its name and UID fixed.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPod {
    /// The pod object. Static pods' names carry the node-name suffix, `metadata.uid` is set and
    /// every default the API server would apply is applied.
    pub pod: Pod,
    /// Where it came from.
    pub source: PodSource,
}

/// The kubelet's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

impl DesiredPod {
    /// The pod's UID (empty only for pods that skipped validation).
    pub fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap_or_default()
    }

    /// The pod's name.
    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    /// The pod's namespace (`default` when unset).
    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The pod's spec (an empty spec if missing; validation rejects that).
    pub fn spec(&self) -> &PodSpec {
        static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
        self.pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
    }

    /// The pod's termination grace period.
    pub fn grace_period(&self) -> Duration {
        self.spec()
            .termination_grace_period_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(DEFAULT_GRACE_PERIOD, Duration::from_secs)
    }

    /// For a pod being deleted through the API (`metadata.deletionTimestamp` set): the grace period
    /// it is stopped with (`metadata.deletionGracePeriodSeconds`, else the spec's); `None` otherwise.
    pub fn deletion_grace(&self) -> Option<Duration> {
        self.pod.metadata.deletion_timestamp.as_ref()?;
        Some(
            self.pod
                .metadata
                .deletion_grace_period_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or_else(|| self.grace_period(), Duration::from_secs),
        )
    }

    /// `restartPolicy`, defaulted to `Always`.
    pub fn restart_policy(&self) -> RestartPolicy {
        match self.spec().restart_policy.as_deref() {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// The init containers, in order.
    pub fn init_containers(&self) -> &[Container] {
        self.spec().init_containers.as_deref().unwrap_or_default()
    }

    /// The app containers.
    pub fn containers(&self) -> &[Container] {
        &self.spec().containers
    }

    /// The sidecar containers (init containers with `restartPolicy: Always`) with their index
    /// among the init containers, in order.
    pub fn sidecars(&self) -> impl Iterator<Item = (usize, &Container)> {
        self.init_containers().iter().enumerate().filter(|(_, c)| is_sidecar(c))
    }

    /// The containers that run for the pod's whole life: the sidecars, then the app containers.
    /// They are the ones probed, restarted when they fail, and counted for readiness.
    pub fn long_running(&self) -> impl Iterator<Item = &Container> {
        self.sidecars().map(|(_, c)| c).chain(self.containers())
    }

    /// Whether the pod uses the host's network namespace.
    pub fn host_network(&self) -> bool {
        self.spec().host_network.unwrap_or(false)
    }
}

/// Whether an init container is a sidecar (KEP-753): `restartPolicy: Always`. It starts in order
/// with the other init containers, keeps running beside the app containers, is restarted whenever
/// it exits (whatever the pod's restart policy) and is stopped after the app containers.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// A pod's restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart every container that exits.
    Always,
    /// Restart containers that exit with a non-zero code.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// Whether a container that exited with `exit_code` should be restarted.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}
