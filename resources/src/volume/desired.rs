//! Desired state of volumes: for every pod that needs them, its volumes, content rendered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::model::volumes::Plugin;

/// The key of a volume in the desired and actual stores: `<pod uid>/<volume name>` for a pod's
/// volume, `csi:<driver>:<sha256 of the volume handle>` for the device of a CSI volume (attached
/// to the node and staged at its global mount once, shared by every pod that publishes it).
pub type VolumeKey = String;

/// The key of volume `volume` of pod `pod_uid`.
pub fn volume_key(pod_uid: &str, volume: &str) -> VolumeKey {
    format!("{pod_uid}/{volume}")
}

/// The key of the device of the CSI volume `volume_handle` of driver `driver`. It has no `/`, so
/// [`split_key`] tells it from a pod volume's key.
pub fn device_key(driver: &str, volume_handle: &str) -> VolumeKey {
    let hash: String = Sha256::digest(volume_handle.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("{DEVICE_KEY_PREFIX}{driver}:{hash}")
}

/// How every device key starts.
pub const DEVICE_KEY_PREFIX: &str = "csi:";

/// Whether `key` is a device key ([`device_key`]).
pub fn is_device_key(key: &str) -> bool {
    key.starts_with(DEVICE_KEY_PREFIX) && !key.contains('/')
}

/// Splits a pod volume's key into pod UID and volume name (`None` for a device key).
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('/')
}

/// `<root>/pods/<uid>`: everything nodelet keeps for one pod.
pub fn pod_dir(root: &Path, pod_uid: &str) -> PathBuf {
    root.join("pods").join(pod_uid)
}

/// Where a volume lives: `<root>/pods/<uid>/volumes/<plugin dir>/<name>` as the kubelet lays it
/// out (`.../kubernetes.io~csi/<name>/mount` for CSI), or the host path itself for a hostPath
/// volume.
pub fn volume_path(root: &Path, volume: &DesiredVolume) -> PathBuf {
    if let Ok(VolumeSource::HostPath { path, .. }) = &volume.source {
        return path.clone();
    }
    let dir =
        pod_dir(root, &volume.pod_uid).join("volumes").join(volume.plugin.dir_name()).join(&volume.name);
    // CSI volumes are published into `mount` beside the kubelet's `vol_data.json`.
    if volume.plugin == Plugin::Csi { dir.join("mount") } else { dir }
}

/// One file of a configMap, secret, downwardAPI or projected volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The content: shared, not copied, between the volumes rendered from one ConfigMap, Secret or
    /// token (a clone is a reference count).
    pub data: bytes::Bytes,
    /// The permission bits (`defaultMode` or the item's `mode`).
    pub mode: u32,
}

/// The files of a volume by relative path (validated: no `..`, not absolute).
pub type FileSet = BTreeMap<String, FileEntry>;

/// What a volume is made of, ready to set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A directory on the node's disk, or a tmpfs (`medium: Memory`) limited to `size_limit`.
    EmptyDir {
        /// `medium: Memory`.
        memory: bool,
        /// `sizeLimit` in bytes.
        size_limit: Option<u64>,
    },
    /// A path on the host, checked as its `type` says.
    HostPath {
        /// The host path (absolute).
        path: PathBuf,
        /// The `type` field, as written (`None` or `""`: no check).
        kind: Option<String>,
    },
    /// A `local` PersistentVolume: its path bind-mounted into the pod's volume directory.
    Local {
        /// The PersistentVolume's name.
        volume: String,
        /// The path on this node (`spec.local.path`).
        path: PathBuf,
    },
    /// A CSI PersistentVolume, as one pod uses it: published into the pod's volume directory from
    /// the volume's device (a [`VolumeSource::CsiDevice`] entry, set up first).
    Csi(CsiSource),
    /// The device of a CSI PersistentVolume, shared by every pod on this node that uses it:
    /// attached to the node (`ControllerPublishVolume`, when the driver needs it) and staged at
    /// its global mount (`NodeStageVolume`, when the driver stages).
    CsiDevice(CsiSource),
    /// Files written atomically into the volume directory (configMap, secret, downwardAPI,
    /// projected). Secrets, downwardAPI and projected volumes go on a tmpfs, as the kubelet puts
    /// them; configMaps stay on disk.
    Files {
        /// Which plugin.
        plugin: Plugin,
        /// The files.
        files: Arc<FileSet>,
        /// A digest of the files, to notice updates.
        digest: String,
    },
}

/// What a CSI driver needs to stage and publish a PersistentVolume (its `spec.csi`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiSource {
    /// The PersistentVolume's name.
    pub volume: String,
    /// `driver`.
    pub driver: String,
    /// `volumeHandle`.
    pub volume_handle: String,
    /// `readOnly` of the PV or of the pod's claim reference.
    pub read_only: bool,
    /// `fsType` (empty: the driver's default).
    pub fs_type: String,
    /// `volumeAttributes`.
    pub attributes: BTreeMap<String, String>,
    /// The PV's first access mode (`ReadWriteOnce`, ...), for the CSI volume capability.
    pub access_mode: String,
}

impl VolumeSource {
    /// A `Files` source with its digest computed.
    pub fn files(plugin: Plugin, files: FileSet) -> Self {
        let mut h = Sha256::new();
        for (path, entry) in &files {
            h.update((path.len() as u64).to_le_bytes());
            h.update(path.as_bytes());
            h.update(entry.mode.to_le_bytes());
            h.update((entry.data.len() as u64).to_le_bytes());
            h.update(&entry.data);
        }
        let digest = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
        VolumeSource::Files { plugin, files: Arc::new(files), digest }
    }

    /// The plugin.
    pub fn plugin(&self) -> Plugin {
        match self {
            VolumeSource::EmptyDir { .. } => Plugin::EmptyDir,
            VolumeSource::HostPath { .. } => Plugin::HostPath,
            VolumeSource::Files { plugin, .. } => *plugin,
            VolumeSource::Local { .. } => Plugin::LocalVolume,
            VolumeSource::Csi(_) | VolumeSource::CsiDevice(_) => Plugin::Csi,
        }
    }

    /// Whether the volume is a tmpfs (memory-backed), as the kubelet makes it: an emptyDir with
    /// `medium: Memory`, and the secret, downwardAPI and projected volumes (which the kubelet
    /// writes into a memory emptyDir, their `wrappedVolumeSpec`). A configMap stays on disk.
    pub fn memory_backed(&self) -> bool {
        match self {
            VolumeSource::EmptyDir { memory, .. } => *memory,
            VolumeSource::Files { plugin, .. } => {
                matches!(plugin, Plugin::Secret | Plugin::DownwardApi | Plugin::Projected)
            }
            _ => false,
        }
    }

    /// The content digest of a `Files` source.
    pub fn digest(&self) -> Option<&str> {
        match self {
            VolumeSource::Files { digest, .. } => Some(digest),
            _ => None,
        }
    }
}

/// Why the source of a pod volume cannot be made (now); each names the volume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// A persistentVolumeClaim volume's plugin depends on the volume bound to the claim.
    #[error("volume {volume:?}: persistentVolumeClaim volumes need a bound PersistentVolume")]
    ClaimNeedsVolume {
        /// The volume's name in the pod spec.
        volume: String,
    },
    /// No plugin serves this kind of volume.
    #[error("volume {volume:?}: {kind} volumes are not supported by nodelet yet")]
    Unsupported {
        /// The volume's name in the pod spec.
        volume: String,
        /// The volume's kind (its field in the pod spec, `unknown` when it has none).
        kind: String,
    },
    /// The PersistentVolume bound to the claim has no spec.
    #[error("volume {volume:?}: persistentvolume {pv:?} has no spec")]
    PvNoSpec {
        /// The volume's name in the pod spec.
        volume: String,
        /// The PersistentVolume.
        pv: String,
    },
    /// The PersistentVolume's path (`local.path`, `hostPath.path`) is relative.
    #[error("volume {volume:?}: persistentvolume {pv:?}: {field} must be absolute")]
    PvPathRelative {
        /// The volume's name in the pod spec.
        volume: String,
        /// The PersistentVolume.
        pv: String,
        /// The field.
        field: &'static str,
    },
    /// The PersistentVolume's CSI source references secrets.
    #[error(
        "volume {volume:?}: persistentvolume {pv:?}: CSI secret references are not supported by nodelet yet"
    )]
    PvCsiSecrets {
        /// The volume's name in the pod spec.
        volume: String,
        /// The PersistentVolume.
        pv: String,
    },
    /// No plugin serves the PersistentVolume's kind.
    #[error("volume {volume:?}: persistentvolume {pv:?}: {kind} volumes are not supported by nodelet")]
    PvUnsupported {
        /// The volume's name in the pod spec.
        volume: String,
        /// The PersistentVolume.
        pv: String,
        /// Its kind (its field in the PersistentVolume spec).
        kind: String,
    },
    /// The volume is not an emptyDir.
    #[error("volume {volume:?}: not an emptyDir")]
    NotEmptyDir {
        /// The volume's name in the pod spec.
        volume: String,
    },
    /// `emptyDir.medium` is neither empty nor `Memory`.
    #[error("volume {volume:?}: emptyDir.medium: unsupported value {medium:?}")]
    EmptyDirMedium {
        /// The volume's name in the pod spec.
        volume: String,
        /// The medium.
        medium: String,
    },
    /// `emptyDir.sizeLimit` is not a non-negative quantity.
    #[error("volume {volume:?}: emptyDir.sizeLimit: invalid quantity {quantity:?}")]
    EmptyDirSizeLimit {
        /// The volume's name in the pod spec.
        volume: String,
        /// The quantity as written.
        quantity: String,
    },
    /// The volume is not a hostPath.
    #[error("volume {volume:?}: not a hostPath")]
    NotHostPath {
        /// The volume's name in the pod spec.
        volume: String,
    },
    /// `hostPath.path` is relative.
    #[error("volume {volume:?}: hostPath.path: {path:?} must be an absolute path")]
    HostPathRelative {
        /// The volume's name in the pod spec.
        volume: String,
        /// The path.
        path: String,
    },
    /// The [`Renderer`](super::populator::Renderer) cannot make the files (a configMap that does not exist).
    #[error(transparent)]
    Render(RenderError),
}

impl SourceError {
    /// Whether the volume waits for something under way rather than failed
    /// ([`RenderError::is_pending`]): no `FailedMount` is reported for it.
    pub fn is_pending(&self) -> bool {
        matches!(self, Self::Render(e) if e.is_pending())
    }
}

/// The error of a [`Renderer`](super::populator::Renderer), which names the volume and the object or field.
/// Either a failure (a configMap that does not exist: the node reports a `FailedMount` event) or a
/// wait for something under way ([`pending`](Self::pending): a service-account token being requested),
/// which keeps the volume not ready with this message as its reason and reports no failure.
/// Two are equal when they say the same: the desired store compares them to know what changed.
#[derive(Debug, Clone)]
pub struct RenderError {
    error: Arc<dyn std::error::Error + Send + Sync>,
    pending: bool,
}

impl RenderError {
    /// Wraps the renderer's own error: the content cannot be made (a failure).
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self { error: Arc::new(error), pending: false }
    }

    /// Wraps the reason why the content is not there yet although nothing failed (a token being
    /// requested): the volume waits, and the renderer is run again when what it waits for is there.
    pub fn pending(reason: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self { error: Arc::new(reason), pending: true }
    }

    /// Whether this is a wait ([`pending`](Self::pending)) rather than a failure.
    pub fn is_pending(&self) -> bool {
        self.pending
    }
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for RenderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl PartialEq for RenderError {
    fn eq(&self, other: &Self) -> bool {
        self.pending == other.pending
            && (Arc::ptr_eq(&self.error, &other.error) || self.error.to_string() == other.error.to_string())
    }
}

impl Eq for RenderError {}

/// One volume of one pod, as the pod needs it; or the device of a CSI volume
/// ([`VolumeSource::CsiDevice`], made by [`DesiredVolume::device`]: its pod fields are empty and
/// `name` is the PersistentVolume's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVolume {
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The volume's name in the pod spec.
    pub name: String,
    /// The plugin (known even when the source cannot be made).
    pub plugin: Plugin,
    /// What to set up, or why it cannot be made now (a configMap that does not exist): the
    /// message names the volume and the object. Nothing is set up until it can be; a volume
    /// already set up keeps its last content.
    pub source: Result<VolumeSource, SourceError>,
    /// The pod's memory limit ([`pod_memory_limit`](super::tmpfs::pod_memory_limit)), which
    /// bounds the size of its memory-backed volumes.
    pub memory_limit: Option<u64>,
    /// The group the volume's files are given (the pod's `securityContext.fsGroup`), for the
    /// volume kinds the kubelet applies it to ([`FsGroup::for_volume`]); `None` otherwise.
    pub fs_group: Option<FsGroup>,
}

/// The kubelet's `SetVolumeOwnership` (`pkg/volume/volume_linux.go`) as one volume gets it: every
/// file and directory gets group `gid`, group read (and write, unless `read_only`), directories
/// also group search and the setgid bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsGroup {
    /// The pod's `fsGroup`.
    pub gid: u32,
    /// The mask for a read-only volume (group `r` on files, `r-x` on directories) instead of a
    /// writable one (`rw`, `rwx`).
    pub read_only: bool,
    /// `fsGroupChangePolicy: OnRootMismatch`: nothing is changed when the volume's root already
    /// has the group and the mode bits (only honoured where the kubelet honours it: `local`
    /// PersistentVolumes; emptyDir, configMap, secret, downwardAPI and projected volumes are always
    /// walked).
    pub on_root_mismatch: bool,
}

impl FsGroup {
    /// What the kubelet applies to a volume of `source` for a pod with `security_context`:
    ///
    /// - emptyDir: read-write mask (on the volume's first set-up, `empty_dir.go`);
    /// - configMap, secret, downwardAPI, projected: read-only mask, after every write of new
    ///   content (the `setPerms` of their atomic writer);
    /// - `local` PersistentVolumes not mounted read-only: read-write mask, honouring
    ///   `fsGroupChangePolicy` (`local.go`);
    /// - nothing for hostPath and CSI volumes (a CSI driver's `fsGroupPolicy` comes from its
    ///   CSIDriver object, which nodelet does not read; the `File` policy is not applied).
    ///
    /// `None` without an `fsGroup`, or with one outside 0..=2^32-1.
    pub fn for_volume(
        security_context: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
        source: &VolumeSource,
        read_only_claim: bool,
    ) -> Option<FsGroup> {
        let sc = security_context?;
        let gid = u32::try_from(sc.fs_group?).ok()?;
        let on_root_mismatch = sc.fs_group_change_policy.as_deref() == Some("OnRootMismatch");
        match source {
            VolumeSource::EmptyDir { .. } => Some(FsGroup { gid, read_only: false, on_root_mismatch: false }),
            VolumeSource::Files { .. } => Some(FsGroup { gid, read_only: true, on_root_mismatch: false }),
            VolumeSource::Local { .. } if !read_only_claim => {
                Some(FsGroup { gid, read_only: false, on_root_mismatch })
            }
            _ => None,
        }
    }
}

impl DesiredVolume {
    /// The store key: the pod volume's, or the device's for a [`VolumeSource::CsiDevice`].
    pub fn key(&self) -> VolumeKey {
        match &self.source {
            Ok(VolumeSource::CsiDevice(csi)) => device_key(&csi.driver, &csi.volume_handle),
            _ => volume_key(&self.pod_uid, &self.name),
        }
    }

    /// The device entry that a CSI pod volume is published from (`None` for other volumes).
    pub fn device(&self) -> Option<DesiredVolume> {
        let Ok(VolumeSource::Csi(csi)) = &self.source else { return None };
        // Publishing is per pod (read-only or not); the device is the same for every pod.
        let device = CsiSource { read_only: false, ..csi.clone() };
        Some(DesiredVolume {
            pod_uid: String::new(),
            namespace: String::new(),
            pod_name: String::new(),
            name: csi.volume.clone(),
            plugin: Plugin::Csi,
            source: Ok(VolumeSource::CsiDevice(device)),
            memory_limit: None,
            fs_group: None,
        })
    }
}

#[cfg(test)]
mod fs_group_tests {
    use k8s_openapi::api::core::v1::PodSecurityContext;

    use super::*;

    fn sc(fs_group: Option<i64>, policy: Option<&str>) -> PodSecurityContext {
        PodSecurityContext {
            fs_group,
            fs_group_change_policy: policy.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn fs_group_applies_to_the_kinds_the_kubelet_changes() {
        let empty = VolumeSource::EmptyDir { memory: false, size_limit: None };
        let files = VolumeSource::files(Plugin::Secret, FileSet::new());
        let local = VolumeSource::Local { volume: "pv".into(), path: "/mnt/pv".into() };
        let host = VolumeSource::HostPath { path: "/tmp".into(), kind: None };
        let policy = sc(Some(2000), Some("OnRootMismatch"));
        assert_eq!(
            FsGroup::for_volume(Some(&policy), &empty, false),
            Some(FsGroup { gid: 2000, read_only: false, on_root_mismatch: false })
        );
        assert_eq!(
            FsGroup::for_volume(Some(&policy), &files, false),
            Some(FsGroup { gid: 2000, read_only: true, on_root_mismatch: false })
        );
        assert_eq!(
            FsGroup::for_volume(Some(&policy), &local, false),
            Some(FsGroup { gid: 2000, read_only: false, on_root_mismatch: true })
        );
        assert_eq!(FsGroup::for_volume(Some(&policy), &local, true), None);
        assert_eq!(FsGroup::for_volume(Some(&policy), &host, false), None);
        assert_eq!(FsGroup::for_volume(Some(&sc(None, None)), &empty, false), None);
        assert_eq!(FsGroup::for_volume(None, &empty, false), None);
        assert_eq!(FsGroup::for_volume(Some(&sc(Some(-1), None)), &empty, false), None);
        assert_eq!(
            FsGroup::for_volume(Some(&sc(Some(7), Some("Always"))), &local, false)
                .map(|g| g.on_root_mismatch),
            Some(false)
        );
    }
}
