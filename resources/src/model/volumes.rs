//! A pod's volumes as the pairs see them: the volume pair sets them up; the pod pair's runtime mounts them into
//! containers ([`PodVolumes`]) once they are all ready ([`VolumeReadiness`]). A PersistentVolumeClaim's volume is
//! the one the claim is bound to ([`ClaimLookup`], which the claim pair implements).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::model::pod::DesiredPod;

/// The volume plugins nodelet knows, named as the kubelet names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plugin {
    /// `kubernetes.io/empty-dir`.
    EmptyDir,
    /// `kubernetes.io/host-path`.
    HostPath,
    /// `kubernetes.io/configmap`.
    ConfigMap,
    /// `kubernetes.io/secret`.
    Secret,
    /// `kubernetes.io/downward-api`.
    DownwardApi,
    /// `kubernetes.io/projected`.
    Projected,
    /// `kubernetes.io/local-volume`: a `local` PersistentVolume, bind-mounted.
    LocalVolume,
    /// `kubernetes.io/csi`: a CSI PersistentVolume, staged and published by its driver.
    Csi,
}

impl Plugin {
    /// Every plugin.
    pub const ALL: [Plugin; 8] = [
        Plugin::EmptyDir,
        Plugin::HostPath,
        Plugin::ConfigMap,
        Plugin::Secret,
        Plugin::DownwardApi,
        Plugin::Projected,
        Plugin::LocalVolume,
        Plugin::Csi,
    ];

    /// The plugin's name (`kubernetes.io/empty-dir`), as in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io/empty-dir",
            Plugin::HostPath => "kubernetes.io/host-path",
            Plugin::ConfigMap => "kubernetes.io/configmap",
            Plugin::Secret => "kubernetes.io/secret",
            Plugin::DownwardApi => "kubernetes.io/downward-api",
            Plugin::Projected => "kubernetes.io/projected",
            Plugin::LocalVolume => "kubernetes.io/local-volume",
            Plugin::Csi => "kubernetes.io/csi",
        }
    }

    /// The directory name under `<root>/pods/<uid>/volumes/` (`kubernetes.io~empty-dir`).
    pub fn dir_name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io~empty-dir",
            Plugin::HostPath => "kubernetes.io~host-path",
            Plugin::ConfigMap => "kubernetes.io~configmap",
            Plugin::Secret => "kubernetes.io~secret",
            Plugin::DownwardApi => "kubernetes.io~downward-api",
            Plugin::Projected => "kubernetes.io~projected",
            Plugin::LocalVolume => "kubernetes.io~local-volume",
            Plugin::Csi => "kubernetes.io~csi",
        }
    }

    /// The plugin whose directory is called `dir` (for reconstruction).
    pub fn from_dir_name(dir: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.dir_name() == dir)
    }

    /// Whether containers always mount it read-only (configMap, secret, downwardAPI, projected).
    pub fn read_only(self) -> bool {
        matches!(self, Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected)
    }
}

/// A volume ready for a pod's containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The host path to bind-mount into containers.
    pub path: PathBuf,
    /// The plugin.
    pub plugin: Plugin,
}

impl MountedVolume {
    /// Whether containers must mount it read-only whatever the mount says (configMap, secret,
    /// downwardAPI, projected).
    pub fn forced_read_only(&self) -> bool {
        self.plugin.read_only()
    }
}

/// A pod's volumes by name, all ready.
pub type PodVolumes = BTreeMap<String, MountedVolume>;

/// Whether a pod may start containers.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeReadiness {
    /// Every volume is set up.
    Ready(Arc<PodVolumes>),
    /// Some volume is not: why (naming the volume).
    Waiting(String),
}

/// Why [`ClaimLookup::bound_volume`] has no volume for a claim (yet).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BoundVolumeError {
    /// The claim does not exist.
    #[error("persistentvolumeclaim {claim:?} not found")]
    NotFound {
        /// The claim's name.
        claim: String,
    },
    /// nodelet's binder has not bound the claim: why (its status message).
    #[error("persistentvolumeclaim {claim:?} is not bound: {reason}")]
    NotBound {
        /// The claim's name.
        claim: String,
        /// The binder's message (`no persistent volume of class "fast" ...`).
        reason: String,
    },
    /// The API server's claim is not bound (its phase).
    #[error("persistentvolumeclaim {claim:?} is not bound (phase {phase})")]
    NotBoundPhase {
        /// The claim's name.
        claim: String,
        /// The claim's `status.phase` (`Pending` when unset).
        phase: String,
    },
    /// The claim lost its volume.
    #[error("persistentvolumeclaim {claim:?} lost its volume {volume:?}")]
    Lost {
        /// The claim's name.
        claim: String,
        /// The volume it was bound to.
        volume: String,
    },
    /// The claim is bound to a volume that does not exist.
    #[error("persistentvolumeclaim {claim:?} is bound to volume {volume:?}, which is gone")]
    VolumeGone {
        /// The claim's name.
        claim: String,
        /// The volume.
        volume: String,
    },
    /// nodelet's own binder was asked for an API pod's claim.
    #[error("persistentvolumeclaim {claim:?} of an API pod: nodelet's own binder serves static pods only")]
    ApiPod {
        /// The claim's name.
        claim: String,
    },
    /// The API server's claim has not been read yet.
    #[error("persistentvolumeclaim {claim:?} has not been read from the API server yet")]
    NotReadYet {
        /// The claim's name.
        claim: String,
    },
    /// Reading the claim or its volume from the API server failed.
    #[error("reading {kind} {name:?}: {error}")]
    Read {
        /// `persistentvolumeclaim` or `persistentvolume`.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// The client's error (in the message, not a `source`, so that it is printed once).
        error: Arc<dyn std::error::Error + Send + Sync>,
    },
}

/// Finds the PersistentVolume bound to a claim.
pub trait ClaimLookup: Send + Sync + 'static {
    /// The PersistentVolume bound to claim `claim` in `pod`'s namespace, as `pod`'s kind resolves it (an API
    /// pod's claims are the API server's, a static pod's the manifests'), or why there is none (yet).
    fn bound_volume(&self, pod: &DesiredPod, claim: &str) -> Result<PersistentVolume, BoundVolumeError>;

    /// Resolves once the answers of [`bound_volume`](Self::bound_volume) are complete (after a
    /// restart: once the claims and their bindings are known again), so that no volume is torn
    /// down for a claim that is merely not loaded yet. Default: at once.
    fn wait_synced(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}
