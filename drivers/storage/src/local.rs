//! The local-directory provisioner: `<base>/<volume name>` per claim, a `local` volume with node
//! affinity to this node. Capacity is recorded, not enforced (as with any directory volume).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolume};
use nodelet_resources::claim::desired::is_dns_subdomain;
use nodelet_resources::claim::driver::{ProvisionError, ProvisionRequest, Provisioner};

/// The provisioner name StorageClasses use.
pub const NAME: &str = "nodelet.dev/local-path";

/// Errors of the local-directory provisioner.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The volume name cannot be a directory name.
    #[error("invalid volume name {0:?}")]
    BadName(String),
    /// Block volumes need a device.
    #[error("volumeMode Block is not supported by {NAME}")]
    Block,
    /// Something exists at the path and it is not a plain directory.
    #[error("{0:?} exists and is not a directory (a symlink or a file): refusing to use it")]
    NotADirectory(PathBuf),
    /// A volume whose path is not `<base>/<name>`.
    #[error("volume {name:?} has path {path:?}, not under {base:?}: refusing to delete it")]
    Foreign {
        /// The volume.
        name: String,
        /// Its path.
        path: String,
        /// The base path.
        base: PathBuf,
    },
    /// A file-system call failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Removal failed (a mount beneath, a race).
    #[error(transparent)]
    Remove(#[from] nodelet_host::mounts::MountError),
}

/// Creates volumes as directories under a base path.
#[derive(Debug, Clone)]
pub struct LocalDirProvisioner {
    base: PathBuf,
    node: String,
}

impl LocalDirProvisioner {
    /// Directories under `base` (absolute), for node `node`.
    pub fn new(base: impl Into<PathBuf>, node: impl Into<String>) -> Self {
        Self { base: base.into(), node: node.into() }
    }

    /// The base path.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The directory of volume `name`.
    pub fn path_of(&self, name: &str) -> Result<PathBuf, LocalError> {
        if !is_dns_subdomain(name) {
            return Err(LocalError::BadName(name.to_owned()));
        }
        Ok(self.base.join(name))
    }

    /// Creates (or finds) the directory and returns the volume.
    pub fn create(&self, request: &ProvisionRequest) -> Result<PersistentVolume, LocalError> {
        if request.volume_mode == "Block" {
            return Err(LocalError::Block);
        }
        let path = self.path_of(&request.volume_name)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.base)
            .map_err(|source| LocalError::Io { op: "create", path: self.base.clone(), source })?;
        match std::fs::DirBuilder::new().mode(0o777).create(&path) {
            Ok(()) => {
                // World-writable like the local-path provisioner's, whatever the umask: pods
                // run as any user.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                    .map_err(|source| LocalError::Io { op: "chmod", path: path.clone(), source })?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let meta = std::fs::symlink_metadata(&path).map_err(|source| LocalError::Io {
                    op: "stat",
                    path: path.clone(),
                    source,
                })?;
                if !meta.file_type().is_dir() {
                    return Err(LocalError::NotADirectory(path));
                }
            }
            Err(source) => return Err(LocalError::Io { op: "create", path, source }),
        }
        let mut pv = request.volume_template(NAME, request.capacity);
        if let Some(spec) = pv.spec.as_mut() {
            spec.local = Some(LocalVolumeSource { path: path.to_string_lossy().into_owned(), fs_type: None });
            spec.node_affinity = Some(crate::node_affinity(&self.node));
        }
        Ok(pv)
    }

    /// Removes the directory of a volume it created: only `<base>/<name>`, never through a
    /// symlink, never with a mount beneath.
    pub fn remove(&self, volume: &PersistentVolume) -> Result<(), LocalError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let path = self.path_of(&name)?;
        let declared =
            volume.spec.as_ref().and_then(|s| s.local.as_ref()).map(|l| l.path.clone()).unwrap_or_default();
        if Path::new(&declared) != path {
            return Err(LocalError::Foreign { name, path: declared, base: self.base.clone() });
        }
        nodelet_host::mounts::remove_dir_beneath(&path)?;
        Ok(())
    }
}

impl Provisioner for LocalDirProvisioner {
    fn name(&self) -> &str {
        NAME
    }

    fn provision<'a>(
        &'a self,
        request: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<PersistentVolume, ProvisionError>> {
        Box::pin(async move {
            let this = self.clone();
            let request = request.clone();
            tokio::task::spawn_blocking(move || this.create(&request))
                .await
                .map_err(|e| ProvisionError::uncertain(e.to_string()))?
                .map_err(|e| ProvisionError::failed(e.to_string()))
        })
    }

    fn delete<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        Box::pin(async move {
            let this = self.clone();
            let volume = volume.clone();
            tokio::task::spawn_blocking(move || this.remove(&volume))
                .await
                .map_err(|e| ProvisionError::uncertain(e.to_string()))?
                .map_err(|e| ProvisionError::failed(e.to_string()))
        })
    }
}
