//! The kubelet's CSI call order for one volume, with its on-disk layout.
//!
//! Set up: `ControllerPublishVolume` (only when the driver has `PUBLISH_UNPUBLISH_VOLUME`) →
//! `NodeStageVolume` at the global mount (only with `STAGE_UNSTAGE_VOLUME`) → `NodePublishVolume` at the
//! pod's target path. Tear down: `NodeUnpublishVolume` → `NodeUnstageVolume` → `ControllerUnpublishVolume`.
//! Each step is idempotent (calling it again after success, or after an uncertain failure, is the way to
//! make sure), so the volume reconciler can run the steps one by one and repeat them.
//!
//! Paths, as the kubelet's [K:pkg/volume/csi/csi_attacher.go, csi_mounter.go]:
//! * staging: `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount`, with
//!   `vol_data.json` beside `globalmount`;
//! * target: `<root>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount`, with `vol_data.json`
//!   beside `mount`.
//!
//! The `vol_data.json` files record which driver and volume handle a directory belongs to, so a restarted
//! nodelet can reconstruct (and tear down) what it mounted.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nodelet_proto::csi::v1;
use sha2::{Digest, Sha256};

use crate::error::CsiError;
use crate::registry::Driver;

/// The kubelet's CSI volume plugin name.
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";
/// [`CSI_PLUGIN_NAME`] escaped for use as one path component (`/` → `~`), as in pod volume directories.
pub const CSI_PLUGIN_DIR_NAME: &str = "kubernetes.io~csi";
/// Name of the staging directory under the per-volume global directory.
pub const GLOBAL_MOUNT_DIR_NAME: &str = "globalmount";
/// Name of the target directory under the pod volume directory.
pub const POD_MOUNT_DIR_NAME: &str = "mount";
/// Name of the metadata file the kubelet keeps beside `globalmount` and `mount`.
pub const VOL_DATA_FILE_NAME: &str = "vol_data.json";

/// A step of a volume's set-up or tear-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `ControllerPublishVolume`.
    Attach,
    /// `NodeStageVolume`.
    Stage,
    /// `NodePublishVolume`.
    Publish,
    /// `NodeUnpublishVolume`.
    Unpublish,
    /// `NodeUnstageVolume`.
    Unstage,
    /// `ControllerUnpublishVolume`.
    Detach,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Attach => "attach",
            Operation::Stage => "stage",
            Operation::Publish => "publish",
            Operation::Unpublish => "unpublish",
            Operation::Unstage => "unstage",
            Operation::Detach => "detach",
        })
    }
}

/// Errors of [`VolumeOps`] and [`VolumeLayout`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeOpError {
    /// A name that becomes a path component is not acceptable (it could escape the layout).
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which name (`"driver name"`, `"pod UID"`, `"volume name"`, `"volume handle"`).
        what: &'static str,
        /// The name as given.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The CSI call of a step failed.
    #[error("CSI {op} of volume {volume_handle:?} failed: {source}")]
    Csi {
        /// The step.
        op: Operation,
        /// The volume handle.
        volume_handle: String,
        /// The CSI error (see [`CsiError::is_uncertain`]).
        source: CsiError,
    },

    /// Preparing or cleaning up a directory or metadata file failed.
    #[error("{op} of volume {volume_handle:?}: {path}: {source}")]
    Io {
        /// The step.
        op: Operation,
        /// The volume handle.
        volume_handle: String,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl VolumeOpError {
    /// True when the step may have happened despite the error (only CSI calls can be uncertain): after an
    /// uncertain stage or publish the volume must be treated as possibly mounted.
    pub fn is_uncertain(&self) -> bool {
        match self {
            VolumeOpError::Csi { source, .. } => source.is_uncertain(),
            VolumeOpError::InvalidName { .. } | VolumeOpError::Io { .. } => false,
        }
    }

    /// The CSI error, when a call failed.
    pub fn csi_error(&self) -> Option<&CsiError> {
        match self {
            VolumeOpError::Csi { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The step that failed (`None` for a rejected name).
    pub fn operation(&self) -> Option<Operation> {
        match self {
            VolumeOpError::Csi { op, .. } | VolumeOpError::Io { op, .. } => Some(*op),
            VolumeOpError::InvalidName { .. } => None,
        }
    }
}

type Result<T, E = VolumeOpError> = std::result::Result<T, E>;

/// Hex SHA-256 of a volume handle: the per-volume directory name under the driver's global directory.
pub fn volume_handle_hash(volume_handle: &str) -> String {
    Sha256::digest(volume_handle.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn invalid(what: &'static str, value: &str, reason: &'static str) -> VolumeOpError {
    VolumeOpError::InvalidName { what, value: value.to_owned(), reason }
}

/// A pod UID as a path component: 1–128 characters of ASCII alphanumerics, `-` and `_` (UUIDs, and the
/// hex hashes of static pods).
fn validate_pod_uid(uid: &str) -> Result<()> {
    if uid.is_empty() || uid.len() > 128 {
        return Err(invalid("pod UID", uid, "must be 1 to 128 characters"));
    }
    if !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(invalid("pod UID", uid, "only ASCII alphanumerics, '-' and '_' are allowed"));
    }
    Ok(())
}

/// A pod volume name: a DNS-1123 label, as the API server requires.
fn validate_volume_name(name: &str) -> Result<()> {
    let bytes = name.as_bytes();
    let ok_char = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) if bytes.len() <= 63 && ok_char(first) && ok_char(last) => {}
        _ => return Err(invalid("volume name", name, "must be a DNS-1123 label")),
    }
    if !bytes.iter().all(|b| ok_char(b) || *b == b'-') {
        return Err(invalid("volume name", name, "must be a DNS-1123 label"));
    }
    Ok(())
}

/// The kubelet's directory layout for CSI volumes under a root dir (`--root-dir`, `/var/lib/kubelet` in
/// the kubelet). Every name that becomes a path component is validated, so no hostile name can leave the
/// layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeLayout {
    root_dir: PathBuf,
}

impl VolumeLayout {
    /// The layout under `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        VolumeLayout { root_dir: root_dir.into() }
    }

    /// The root dir.
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }

    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>`: the per-volume global directory
    /// holding `globalmount` and `vol_data.json`.
    pub fn volume_global_dir(&self, driver: &str, volume_handle: &str) -> Result<PathBuf> {
        crate::client::validate_driver_name(driver)
            .map_err(|reason| invalid("driver name", driver, reason))?;
        if volume_handle.is_empty() {
            return Err(invalid("volume handle", volume_handle, "empty"));
        }
        Ok(self
            .root_dir
            .join("plugins")
            .join(CSI_PLUGIN_NAME)
            .join(driver)
            .join(volume_handle_hash(volume_handle)))
    }

    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount`: the staging path.
    pub fn staging_path(&self, driver: &str, volume_handle: &str) -> Result<PathBuf> {
        Ok(self.volume_global_dir(driver, volume_handle)?.join(GLOBAL_MOUNT_DIR_NAME))
    }

    /// `<root>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>`: holds `mount` and `vol_data.json`.
    pub fn pod_volume_dir(&self, pod_uid: &str, volume_name: &str) -> Result<PathBuf> {
        validate_pod_uid(pod_uid)?;
        validate_volume_name(volume_name)?;
        Ok(self
            .root_dir
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(CSI_PLUGIN_DIR_NAME)
            .join(volume_name))
    }

    /// `<root>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount`: the publish target.
    pub fn target_path(&self, pod_uid: &str, volume_name: &str) -> Result<PathBuf> {
        Ok(self.pod_volume_dir(pod_uid, volume_name)?.join(POD_MOUNT_DIR_NAME))
    }
}

/// One CSI volume as one pod uses it: everything the node and controller calls need.
#[derive(Clone)]
pub struct CsiVolume {
    /// The driver name (the PV's `spec.csi.driver`).
    pub driver: String,
    /// The volume handle (the PV's `spec.csi.volumeHandle`, i.e. the CSI `volume_id`).
    pub volume_handle: String,
    /// The UID of the pod.
    pub pod_uid: String,
    /// The name of the volume in the pod spec.
    pub volume_name: String,
    /// How the pod uses the volume (access type and mode).
    pub capability: v1::VolumeCapability,
    /// Publish read-only (the PV/volume source `readOnly`).
    pub readonly: bool,
    /// The volume context (the PV's `spec.csi.volumeAttributes`).
    pub volume_context: HashMap<String, String>,
    /// Secrets for `ControllerPublishVolume`/`ControllerUnpublishVolume`. Never logged.
    pub controller_publish_secrets: HashMap<String, String>,
    /// Secrets for `NodeStageVolume`. Never logged.
    pub node_stage_secrets: HashMap<String, String>,
    /// Secrets for `NodePublishVolume`. Never logged.
    pub node_publish_secrets: HashMap<String, String>,
}

impl fmt::Debug for CsiVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets and mount flags (which may carry credentials) are left out.
        let access_mode = self.capability.access_mode.as_ref().map(|m| m.mode);
        f.debug_struct("CsiVolume")
            .field("driver", &self.driver)
            .field("volume_handle", &self.volume_handle)
            .field("pod_uid", &self.pod_uid)
            .field("volume_name", &self.volume_name)
            .field("access_mode", &access_mode)
            .field("readonly", &self.readonly)
            .field("volume_context", &self.volume_context)
            .finish_non_exhaustive()
    }
}

impl CsiVolume {
    /// A filesystem volume (`mount` access type, `fs_type` unset, `SINGLE_NODE_WRITER`), read-write, with
    /// no context or secrets.
    pub fn filesystem(driver: &str, volume_handle: &str, pod_uid: &str, volume_name: &str) -> Self {
        CsiVolume {
            driver: driver.to_owned(),
            volume_handle: volume_handle.to_owned(),
            pod_uid: pod_uid.to_owned(),
            volume_name: volume_name.to_owned(),
            capability: mount_capability(v1::volume_capability::access_mode::Mode::SingleNodeWriter),
            readonly: false,
            volume_context: HashMap::new(),
            controller_publish_secrets: HashMap::new(),
            node_stage_secrets: HashMap::new(),
            node_publish_secrets: HashMap::new(),
        }
    }
}

/// A `mount` volume capability with `mode` and no filesystem type or flags.
pub fn mount_capability(mode: v1::volume_capability::access_mode::Mode) -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_type: Some(v1::volume_capability::AccessType::Mount(
            v1::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(v1::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// The kubelet's `vol_data.json` (the keys it writes and reads back on reconstruction).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolData {
    /// `driverName`.
    #[serde(rename = "driverName")]
    pub driver_name: String,
    /// `volumeHandle`.
    #[serde(rename = "volumeHandle")]
    pub volume_handle: String,
    /// `specVolID`: the pod volume name (only in the pod volume directory's file).
    #[serde(rename = "specVolID", default, skip_serializing_if = "String::is_empty")]
    pub spec_vol_id: String,
    /// `nodeName`: the node ID the driver reported (only in the pod volume directory's file).
    #[serde(rename = "nodeName", default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// `volumeLifecycleMode`: always `Persistent` here.
    #[serde(rename = "volumeLifecycleMode", default, skip_serializing_if = "String::is_empty")]
    pub volume_lifecycle_mode: String,
}

/// Runs the CSI steps for volumes of one driver, in the kubelet's order and layout.
#[derive(Debug, Clone)]
pub struct VolumeOps {
    driver: Arc<Driver>,
    layout: VolumeLayout,
}

impl VolumeOps {
    /// Steps for volumes of `driver` under `layout`.
    pub fn new(driver: Arc<Driver>, layout: VolumeLayout) -> Self {
        VolumeOps { driver, layout }
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// The layout.
    pub fn layout(&self) -> &VolumeLayout {
        &self.layout
    }

    fn csi_err(op: Operation, volume: &CsiVolume) -> impl FnOnce(CsiError) -> VolumeOpError + '_ {
        move |source| VolumeOpError::Csi { op, volume_handle: volume.volume_handle.clone(), source }
    }

    fn io_err(
        op: Operation,
        volume: &CsiVolume,
        path: &Path,
    ) -> impl FnOnce(std::io::Error) -> VolumeOpError {
        let volume_handle = volume.volume_handle.clone();
        let path = path.to_path_buf();
        move |source| VolumeOpError::Io { op, volume_handle, path, source }
    }

    fn check_driver(&self, volume: &CsiVolume) -> Result<()> {
        if volume.driver != self.driver.name() {
            return Err(invalid("driver name", &volume.driver, "volume belongs to another driver"));
        }
        Ok(())
    }

    /// Step 1: `ControllerPublishVolume` to this node when the driver has `PUBLISH_UNPUBLISH_VOLUME`,
    /// returning the publish context for [`stage`](Self::stage) and [`publish`](Self::publish) (empty when
    /// the driver needs no attach).
    pub async fn attach(&self, volume: &CsiVolume) -> Result<HashMap<String, String>> {
        self.check_driver(volume)?;
        if !self.driver.requires_controller_publish() {
            return Ok(HashMap::new());
        }
        let req = v1::ControllerPublishVolumeRequest {
            volume_id: volume.volume_handle.clone(),
            node_id: self.driver.node.node_id.clone(),
            volume_capability: Some(volume.capability.clone()),
            readonly: volume.readonly,
            secrets: volume.controller_publish_secrets.clone(),
            volume_context: volume.volume_context.clone(),
        };
        self.driver.client().controller_publish(req).await.map_err(Self::csi_err(Operation::Attach, volume))
    }

    /// Step 2: `NodeStageVolume` at the staging path when the driver has `STAGE_UNSTAGE_VOLUME` (creating
    /// the directory first, as the CO must). Returns the staging path, or `None` for drivers without
    /// staging.
    pub async fn stage(
        &self,
        volume: &CsiVolume,
        publish_context: &HashMap<String, String>,
    ) -> Result<Option<PathBuf>> {
        self.check_driver(volume)?;
        let staging = self.layout.staging_path(&volume.driver, &volume.volume_handle)?;
        if !self.driver.requires_stage() {
            return Ok(None);
        }
        let op = Operation::Stage;
        create_dir_all(&staging).await.map_err(Self::io_err(op, volume, &staging))?;
        if let Some(global_dir) = staging.parent() {
            let data = VolData {
                driver_name: volume.driver.clone(),
                volume_handle: volume.volume_handle.clone(),
                spec_vol_id: String::new(),
                node_name: String::new(),
                volume_lifecycle_mode: String::new(),
            };
            let file = global_dir.join(VOL_DATA_FILE_NAME);
            write_json_atomic(&file, &data).await.map_err(Self::io_err(op, volume, &file))?;
        }
        let req = v1::NodeStageVolumeRequest {
            volume_id: volume.volume_handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(volume.capability.clone()),
            secrets: volume.node_stage_secrets.clone(),
            volume_context: volume.volume_context.clone(),
        };
        self.driver.client().node_stage(req).await.map_err(Self::csi_err(op, volume))?;
        Ok(Some(staging))
    }

    /// Step 3: `NodePublishVolume` at the pod's target path (creating its parent and `vol_data.json`; the
    /// driver creates the target itself). Returns the target path.
    pub async fn publish(
        &self,
        volume: &CsiVolume,
        publish_context: &HashMap<String, String>,
    ) -> Result<PathBuf> {
        self.check_driver(volume)?;
        let op = Operation::Publish;
        let pod_dir = self.layout.pod_volume_dir(&volume.pod_uid, &volume.volume_name)?;
        let target = pod_dir.join(POD_MOUNT_DIR_NAME);
        let staging = if self.driver.requires_stage() {
            self.layout.staging_path(&volume.driver, &volume.volume_handle)?.to_string_lossy().into_owned()
        } else {
            String::new()
        };
        create_dir_all(&pod_dir).await.map_err(Self::io_err(op, volume, &pod_dir))?;
        let data = VolData {
            driver_name: volume.driver.clone(),
            volume_handle: volume.volume_handle.clone(),
            spec_vol_id: volume.volume_name.clone(),
            node_name: self.driver.node.node_id.clone(),
            volume_lifecycle_mode: "Persistent".into(),
        };
        let file = pod_dir.join(VOL_DATA_FILE_NAME);
        write_json_atomic(&file, &data).await.map_err(Self::io_err(op, volume, &file))?;
        let req = v1::NodePublishVolumeRequest {
            volume_id: volume.volume_handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: staging,
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(volume.capability.clone()),
            readonly: volume.readonly,
            secrets: volume.node_publish_secrets.clone(),
            volume_context: volume.volume_context.clone(),
        };
        self.driver.client().node_publish(req).await.map_err(Self::csi_err(op, volume))?;
        Ok(target)
    }

    /// Tear-down step 1: `NodeUnpublishVolume`, then removes the (empty) target if the driver left it,
    /// `vol_data.json` and the pod volume directory. Never removes anything recursively: a target that
    /// is still mounted or not empty makes this step fail.
    pub async fn unpublish(&self, volume: &CsiVolume) -> Result<()> {
        self.check_driver(volume)?;
        let op = Operation::Unpublish;
        let pod_dir = self.layout.pod_volume_dir(&volume.pod_uid, &volume.volume_name)?;
        let target = pod_dir.join(POD_MOUNT_DIR_NAME);
        self.driver
            .client()
            .node_unpublish(&volume.volume_handle, &target)
            .await
            .map_err(Self::csi_err(op, volume))?;
        remove_dir_if_exists(&target).await.map_err(Self::io_err(op, volume, &target))?;
        let file = pod_dir.join(VOL_DATA_FILE_NAME);
        remove_file_if_exists(&file).await.map_err(Self::io_err(op, volume, &file))?;
        remove_dir_if_exists(&pod_dir).await.map_err(Self::io_err(op, volume, &pod_dir))?;
        Ok(())
    }

    /// Tear-down step 2: `NodeUnstageVolume` when the driver stages, then removes `globalmount`,
    /// `vol_data.json` and the per-volume global directory (never recursively). Call it only when no pod
    /// uses the volume any more.
    pub async fn unstage(&self, volume: &CsiVolume) -> Result<()> {
        self.check_driver(volume)?;
        let op = Operation::Unstage;
        let staging = self.layout.staging_path(&volume.driver, &volume.volume_handle)?;
        if !self.driver.requires_stage() {
            return Ok(());
        }
        self.driver
            .client()
            .node_unstage(&volume.volume_handle, &staging)
            .await
            .map_err(Self::csi_err(op, volume))?;
        remove_dir_if_exists(&staging).await.map_err(Self::io_err(op, volume, &staging))?;
        if let Some(global_dir) = staging.parent() {
            let file = global_dir.join(VOL_DATA_FILE_NAME);
            remove_file_if_exists(&file).await.map_err(Self::io_err(op, volume, &file))?;
            remove_dir_if_exists(global_dir).await.map_err(Self::io_err(op, volume, global_dir))?;
        }
        Ok(())
    }

    /// Tear-down step 3: `ControllerUnpublishVolume` from this node when the driver has
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    pub async fn detach(&self, volume: &CsiVolume) -> Result<()> {
        self.check_driver(volume)?;
        if !self.driver.requires_controller_publish() {
            return Ok(());
        }
        self.driver
            .client()
            .controller_unpublish(
                &volume.volume_handle,
                Some(&self.driver.node.node_id),
                volume.controller_publish_secrets.clone(),
            )
            .await
            .map_err(Self::csi_err(Operation::Detach, volume))
    }

    /// All set-up steps for a volume used by one pod: [`attach`](Self::attach), [`stage`](Self::stage),
    /// [`publish`](Self::publish). Returns the target path. Safe to call again after any failure.
    pub async fn set_up(&self, volume: &CsiVolume) -> Result<PathBuf> {
        let publish_context = self.attach(volume).await?;
        self.stage(volume, &publish_context).await?;
        self.publish(volume, &publish_context).await
    }

    /// All tear-down steps for a volume used by one pod only: [`unpublish`](Self::unpublish),
    /// [`unstage`](Self::unstage), [`detach`](Self::detach). Safe to call again after any failure.
    pub async fn tear_down(&self, volume: &CsiVolume) -> Result<()> {
        self.unpublish(volume).await?;
        self.unstage(volume).await?;
        self.detach(volume).await
    }
}

async fn create_dir_all(path: &Path) -> std::io::Result<()> {
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true).mode(0o750);
    builder.create(path).await
}

async fn remove_dir_if_exists(path: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_dir(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

async fn remove_file_if_exists(path: &Path) -> std::io::Result<()> {
    match tokio::fs::remove_file(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Writes `value` as JSON to `path` durably ([`nodelet_durable::write`]: temporary file, fsync, rename,
/// fsync of the directory).
async fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    nodelet_durable::write_async(path.to_owned(), bytes, 0o600)
        .await
        .map_err(|e| std::io::Error::new(e.source.kind(), e))
}

/// Reads a `vol_data.json` (for reconstruction after a restart).
pub async fn read_vol_data(path: &Path) -> std::io::Result<VolData> {
    let bytes = tokio::fs::read(path).await?;
    serde_json::from_slice(&bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_paths() {
        let layout = VolumeLayout::new("/var/lib/nodelet");
        let staging = layout.staging_path("hostpath.csi.nodelet.dev", "vol-1").unwrap();
        assert_eq!(
            staging,
            PathBuf::from(format!(
                "/var/lib/nodelet/plugins/kubernetes.io/csi/hostpath.csi.nodelet.dev/{}/globalmount",
                volume_handle_hash("vol-1")
            ))
        );
        // sha256("vol-1"), computed independently (sha256sum).
        assert_eq!(
            volume_handle_hash("vol-1"),
            "d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49"
        );
        assert_eq!(
            layout.target_path("0d3a2f6c-1c1e-4c8e-9c1c-0a9f5c0c2b11", "data").unwrap(),
            PathBuf::from(
                "/var/lib/nodelet/pods/0d3a2f6c-1c1e-4c8e-9c1c-0a9f5c0c2b11/volumes/kubernetes.io~csi/data/mount"
            )
        );
    }

    #[test]
    fn hostile_names_are_rejected() {
        let layout = VolumeLayout::new("/r");
        for driver in ["..", "a/../../etc", "", "x/y"] {
            assert!(layout.staging_path(driver, "v").is_err(), "driver {driver:?}");
        }
        assert!(layout.staging_path("d", "").is_err());
        // Any volume handle is fine: it is hashed.
        let p = layout.staging_path("d", "../../../etc").unwrap();
        assert!(p.starts_with("/r/plugins/kubernetes.io/csi/d/"));
        for uid in ["..", ".", "a/b", "", "a b"] {
            assert!(layout.target_path(uid, "data").is_err(), "uid {uid:?}");
        }
        for name in ["..", "Data", "a/b", "-a", "a-", "", "a.b"] {
            assert!(layout.target_path("uid", name).is_err(), "volume name {name:?}");
        }
    }

    #[test]
    fn debug_hides_secrets() {
        let mut v = CsiVolume::filesystem("d", "h", "u", "n");
        v.node_publish_secrets.insert("password".into(), "hunter2".into());
        let text = format!("{v:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("\"h\""));
    }

    #[test]
    fn vol_data_uses_kubelet_keys() {
        let data = VolData {
            driver_name: "d".into(),
            volume_handle: "h".into(),
            spec_vol_id: "data".into(),
            node_name: "n".into(),
            volume_lifecycle_mode: "Persistent".into(),
        };
        let json = serde_json::to_string(&data).unwrap();
        assert_eq!(
            json,
            r#"{"driverName":"d","volumeHandle":"h","specVolID":"data","nodeName":"n","volumeLifecycleMode":"Persistent"}"#
        );
    }
}
