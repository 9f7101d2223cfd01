//! The LVM provisioner: one logical volume per claim in a configured volume group (several disks
//! as one group: the "dynamic local volume" pattern), formatted `ext4` and mounted under
//! `<root>/plugins/kubernetes.io~lvm/<vg>/<lv>`, as a `local` volume with node affinity to this
//! node. Every command runs with an argument vector and a deadline; names are validated.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolume};
use nodelet_resources::claim::driver::{ProvisionError, ProvisionRequest, Provisioner};

/// The provisioner name StorageClasses use.
pub const NAME: &str = "nodelet.dev/lvm";
/// The annotation naming a volume's volume group.
pub const ANN_VOLUME_GROUP: &str = "lvm.nodelet.dev/volume-group";
/// The annotation naming a volume's logical volume.
pub const ANN_LOGICAL_VOLUME: &str = "lvm.nodelet.dev/logical-volume";
/// How long one LVM or mkfs command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of the LVM provisioner.
#[derive(Debug, thiserror::Error)]
pub enum LvmError {
    /// A volume group or logical volume name LVM would not accept (or that could be an option).
    #[error("invalid LVM name {0:?}")]
    BadName(String),
    /// A volume of another volume group.
    #[error("volume group {0:?} is not the configured one")]
    ForeignGroup(String),
    /// Block volumes are not offered.
    #[error("volumeMode Block is not supported by {NAME}")]
    Block,
    /// A command could not run, or failed.
    #[error("{command}: {message}")]
    Command {
        /// The command line (program and arguments).
        command: String,
        /// Its error output or the reason.
        message: String,
    },
    /// A command ran out of time (it may have done its work).
    #[error("{0}: timed out")]
    Timeout(String),
    /// A mount or file-system call failed.
    #[error("{op} {path:?}: {message}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        message: String,
    },
}

impl LvmError {
    fn uncertain(&self) -> bool {
        matches!(self, LvmError::Timeout(_))
    }
}

/// Whether `name` is safe as an LVM volume group or logical volume name: `[A-Za-z0-9+_.-]`, not
/// starting with `-`, not `.`/`..`, at most 127 bytes.
pub fn valid_lvm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b))
}

/// Creates volumes as logical volumes of one volume group.
#[derive(Debug, Clone)]
pub struct LvmProvisioner {
    volume_group: String,
    root: PathBuf,
    node: String,
}

impl LvmProvisioner {
    /// Logical volumes in `volume_group`, mounted under `root` (nodelet's `--root-dir`), for
    /// node `node`.
    pub fn new(
        volume_group: impl Into<String>,
        root: impl Into<PathBuf>,
        node: impl Into<String>,
    ) -> Result<Self, LvmError> {
        let volume_group = volume_group.into();
        if !valid_lvm_name(&volume_group) {
            return Err(LvmError::BadName(volume_group));
        }
        Ok(Self { volume_group, root: root.into(), node: node.into() })
    }

    /// The volume group.
    pub fn volume_group(&self) -> &str {
        &self.volume_group
    }

    /// Where logical volume `lv` is mounted.
    pub fn mount_path(&self, lv: &str) -> PathBuf {
        self.root.join("plugins").join("kubernetes.io~lvm").join(&self.volume_group).join(lv)
    }

    fn device(&self, lv: &str) -> PathBuf {
        Path::new("/dev").join(&self.volume_group).join(lv)
    }

    async fn run(program: &str, args: &[&str]) -> Result<std::process::Output, LvmError> {
        let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
        let child = tokio::process::Command::new(program)
            .args(args)
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(COMMAND_TIMEOUT, child).await {
            Err(_) => Err(LvmError::Timeout(command)),
            Ok(Err(e)) => Err(LvmError::Command { command, message: e.to_string() }),
            Ok(Ok(out)) => Ok(out),
        }
    }

    async fn run_ok(program: &str, args: &[&str]) -> Result<String, LvmError> {
        let out = Self::run(program, args).await?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
            Err(LvmError::Command {
                command,
                message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
            })
        }
    }

    /// Whether logical volume `lv` exists in the group.
    pub async fn exists(&self, lv: &str) -> Result<bool, LvmError> {
        let out = Self::run_ok("lvs", &["--noheadings", "-o", "lv_name", &self.volume_group]).await?;
        Ok(out.lines().any(|l| l.trim() == lv))
    }

    async fn has_filesystem(&self, device: &Path) -> Result<bool, LvmError> {
        let dev = device.to_string_lossy();
        let out = Self::run("blkid", &["-p", "-o", "value", "-s", "TYPE", &dev]).await?;
        match out.status.code() {
            Some(0) => Ok(true),
            // 2: nothing found.
            Some(2) => Ok(false),
            _ => Err(LvmError::Command {
                command: format!("blkid -p {dev}"),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            }),
        }
    }

    async fn mount(&self, lv: &str) -> Result<PathBuf, LvmError> {
        let target = self.mount_path(lv);
        let device = self.device(lv);
        let io = |op, path: &Path, e: &dyn std::fmt::Display| LvmError::Io {
            op,
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        tokio::fs::create_dir_all(&target).await.map_err(|e| io("create", &target, &e))?;
        if nodelet_host::mounts::is_mount_point(&target).map_err(|e| io("stat", &target, &e))? {
            return Ok(target);
        }
        let (t, d) = (target.clone(), device.clone());
        tokio::task::spawn_blocking(move || {
            rustix::mount::mount(
                &d,
                &t,
                "ext4",
                rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
                None,
            )
        })
        .await
        .map_err(|e| io("mount", &target, &e))?
        .map_err(|e| io("mount", &target, &e))?;
        Ok(target)
    }

    /// Creates (or finds) the logical volume, formats it if it has no file system, mounts it,
    /// and returns the volume.
    pub async fn create(&self, request: &ProvisionRequest) -> Result<PersistentVolume, LvmError> {
        if request.volume_mode == "Block" {
            return Err(LvmError::Block);
        }
        let lv = request.volume_name.as_str();
        if !valid_lvm_name(lv) {
            return Err(LvmError::BadName(lv.to_owned()));
        }
        if !self.exists(lv).await? {
            let size = format!("{}b", request.capacity.max(1));
            Self::run_ok("lvcreate", &["-y", "-W", "y", "-n", lv, "-L", &size, &self.volume_group]).await?;
        }
        let device = self.device(lv);
        let fresh = !self.has_filesystem(&device).await?;
        if fresh {
            Self::run_ok("mkfs.ext4", &["-q", &device.to_string_lossy()]).await?;
        }
        let target = self.mount(lv).await?;
        if fresh {
            // World-writable like a fresh emptyDir: pods run as any user.
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| LvmError::Io { op: "chmod", path: target.clone(), message: e.to_string() })?;
        }
        let mut pv = request.volume_template(NAME, request.capacity);
        pv.metadata.annotations.get_or_insert_with(Default::default).extend([
            (ANN_VOLUME_GROUP.to_owned(), self.volume_group.clone()),
            (ANN_LOGICAL_VOLUME.to_owned(), lv.to_owned()),
        ]);
        if let Some(spec) = pv.spec.as_mut() {
            spec.local = Some(LocalVolumeSource {
                path: target.to_string_lossy().into_owned(),
                fs_type: Some("ext4".into()),
            });
            spec.node_affinity = Some(crate::node_affinity(&self.node));
        }
        Ok(pv)
    }

    fn names_of(&self, volume: &PersistentVolume) -> Result<String, LvmError> {
        let vg = crate::annotation(volume, ANN_VOLUME_GROUP).unwrap_or_default();
        let lv = crate::annotation(volume, ANN_LOGICAL_VOLUME).unwrap_or_default();
        if vg != self.volume_group {
            return Err(LvmError::ForeignGroup(vg.to_owned()));
        }
        if !valid_lvm_name(lv) {
            return Err(LvmError::BadName(lv.to_owned()));
        }
        Ok(lv.to_owned())
    }

    /// Unmounts and removes the logical volume of a volume it created.
    pub async fn remove(&self, volume: &PersistentVolume) -> Result<(), LvmError> {
        let lv = self.names_of(volume)?;
        let target = self.mount_path(&lv);
        let io =
            |op, e: &dyn std::fmt::Display| LvmError::Io { op, path: target.clone(), message: e.to_string() };
        if nodelet_host::mounts::is_mount_point(&target).map_err(|e| io("stat", &e))? {
            nodelet_host::mounts::unmount(&target).map_err(|e| io("umount", &e))?;
        }
        match tokio::fs::remove_dir(&target).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("rmdir", &e)),
        }
        if self.exists(&lv).await? {
            let name = format!("{}/{lv}", self.volume_group);
            Self::run_ok("lvremove", &["-y", &name]).await?;
        }
        Ok(())
    }

    /// Mounts a volume it created again (after a restart or reboot), if its logical volume exists.
    pub async fn remount(&self, volume: &PersistentVolume) -> Result<(), LvmError> {
        let lv = self.names_of(volume)?;
        if self.exists(&lv).await? {
            self.mount(&lv).await?;
        }
        Ok(())
    }
}

fn to_provision_error(e: LvmError) -> ProvisionError {
    if e.uncertain() {
        ProvisionError::uncertain(e.to_string())
    } else {
        ProvisionError::failed(e.to_string())
    }
}

impl Provisioner for LvmProvisioner {
    fn name(&self) -> &str {
        NAME
    }

    fn provision<'a>(
        &'a self,
        request: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<PersistentVolume, ProvisionError>> {
        Box::pin(async move { self.create(request).await.map_err(to_provision_error) })
    }

    fn delete<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        Box::pin(async move { self.remove(volume).await.map_err(to_provision_error) })
    }

    fn restore<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        Box::pin(async move { self.remount(volume).await.map_err(to_provision_error) })
    }
}
