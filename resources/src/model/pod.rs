//! The desired pod: what the sources ask for, after validation and defaulting (the pod pair's desired value,
//! which every other pair reads), and the identity of a pod (its UID, its source).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, PodSpec};

/// The key of a pod in the desired and actual stores: its UID.
pub type PodUid = String;

/// Where a desired pod came from (the `kubernetes.io/config.source` annotation says the same). Its `Debug`
/// leaves the manifest URL out: it may hold a credential.
#[derive(Clone, PartialEq, Eq, Hash)]
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

impl std::fmt::Debug for PodSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PodSource::File(path) => f.debug_tuple("File").field(path).finish(),
            // (user information or a token in the query string may be in it)
            PodSource::Url(_) => f.write_str("Url(<redacted>)"),
            PodSource::Http => f.write_str("Http"),
            PodSource::Api => f.write_str("Api"),
        }
    }
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

    /// The ephemeral containers (`spec.ephemeralContainers`, added through the API's
    /// `ephemeralcontainers` subresource or `nodelet debug`), in order.
    pub fn ephemeral_specs(&self) -> &[EphemeralContainer] {
        self.spec().ephemeral_containers.as_deref().unwrap_or_default()
    }

    /// The ephemeral containers as [`Container`]s (their common fields), in order: what the
    /// runtime creates for them.
    pub fn ephemeral_containers(&self) -> Vec<Container> {
        self.ephemeral_specs().iter().map(ephemeral_as_container).collect()
    }

    /// The ephemeral container `name`'s `targetContainerName`: the container whose process
    /// namespace it joins.
    pub fn ephemeral_target(&self, name: &str) -> Option<&str> {
        self.ephemeral_specs()
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.target_container_name.as_deref())
            .filter(|t| !t.is_empty())
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

/// An ephemeral container's common fields as a [`Container`] (the API's `EphemeralContainerCommon`
/// is a `Container`; only `targetContainerName` is left out).
pub fn ephemeral_as_container(c: &EphemeralContainer) -> Container {
    let c = c.clone();
    Container {
        name: c.name,
        image: c.image,
        command: c.command,
        args: c.args,
        working_dir: c.working_dir,
        ports: c.ports,
        env_from: c.env_from,
        env: c.env,
        resources: c.resources,
        resize_policy: c.resize_policy,
        restart_policy: c.restart_policy,
        restart_policy_rules: c.restart_policy_rules,
        volume_mounts: c.volume_mounts,
        volume_devices: c.volume_devices,
        liveness_probe: c.liveness_probe,
        readiness_probe: c.readiness_probe,
        startup_probe: c.startup_probe,
        lifecycle: c.lifecycle,
        termination_message_path: c.termination_message_path,
        termination_message_policy: c.termination_message_policy,
        image_pull_policy: c.image_pull_policy,
        security_context: c.security_context,
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
    }
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
