//! The LVM provisioner: one logical volume per claim in a configured volume group (several disks
//! as one group: the "dynamic local volume" pattern), formatted `ext4` and mounted under
//! `<root>/plugins/kubernetes.io~lvm/<vg>/<lv>`, as a `local` volume with node affinity to this
//! node. Every command runs with an argument vector and a deadline; names are validated.
//!
//! Logical volumes are activated the standard way, as device-mapper devices
//! (`/dev/<vg>/<lv>`), when the kernel has device-mapper ([`Activation::DeviceMapper`]). Kernels
//! built without it (some micro-VM kernels) still run LVM's metadata tools; there
//! ([`Activation::Loop`]) each volume is allocated contiguously, so that it is one range of one
//! physical volume, and activated as a loop device over that range. Volumes created that way are
//! ordinary linear logical volumes that a device-mapper kernel activates as they are.

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

/// How logical volumes become block devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// By LVM, as device-mapper devices at `/dev/<vg>/<lv>` (the standard).
    DeviceMapper,
    /// For kernels without device-mapper: LVM keeps the metadata (`--driverloaded n`), volumes
    /// are allocated contiguously (one range of one physical volume) and activated as loop
    /// devices over their range.
    Loop,
}

impl Activation {
    /// [`DeviceMapper`](Activation::DeviceMapper) when the running kernel has device-mapper
    /// (`/proc/misc` or `/proc/devices` names it), else [`Loop`](Activation::Loop).
    pub fn detect() -> Self {
        let dm = ["/proc/misc", "/proc/devices"]
            .iter()
            .any(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("device-mapper")));
        if dm { Activation::DeviceMapper } else { Activation::Loop }
    }
}

/// Tag of a logical volume created but not formatted yet: its extents may hold an earlier
/// volume's data, so it is wiped before it is formatted (loop activation cannot zero it at
/// creation as LVM does).
const UNFORMATTED_TAG: &str = "nodelet_unformatted";

/// Where a logical volume lies on its (only) physical volume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Extent {
    /// The physical volume's device.
    device: String,
    /// Byte offset of the volume on it.
    offset: u64,
    /// Size in bytes.
    size: u64,
}

/// Parses `lvs -o devices,seg_count,lv_size,vg_extent_size --units b --nosuffix` output and the
/// physical volume's `pe_start` into an [`Extent`]; `None` if the volume is not one range.
fn parse_extent(lvs: &str, pe_start: u64) -> Option<Extent> {
    let line = lvs.lines().map(str::trim).find(|l| !l.is_empty())?;
    let fields: Vec<&str> = line.split(';').map(str::trim).collect();
    let [devices, segments, size, extent_size] = fields.as_slice() else { return None };
    if *segments != "1" || devices.contains(',') {
        return None;
    }
    // `/dev/loop0(16)`: the device and the first physical extent.
    let (device, first) = devices.strip_suffix(')')?.rsplit_once('(')?;
    let first: u64 = first.parse().ok()?;
    let extent_size: u64 = extent_size.parse().ok()?;
    let size: u64 = size.parse().ok()?;
    Some(Extent { device: device.to_owned(), offset: pe_start + first * extent_size, size })
}

/// Parses `losetup -n -l -O NAME,OFFSET,SIZELIMIT,BACK-FILE` output: the loop devices over
/// `extent` (one at most, unless someone else made one too).
fn loops_over(losetup: &str, extent: &Extent) -> Vec<String> {
    losetup
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (name, offset, limit, back) = (f.next()?, f.next()?, f.next()?, f.next()?);
            (offset.parse() == Ok(extent.offset) && limit.parse() == Ok(extent.size) && back == extent.device)
                .then(|| name.to_owned())
        })
        .collect()
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
    activation: Activation,
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
        Ok(Self { volume_group, root: root.into(), node: node.into(), activation: Activation::detect() })
    }

    /// Activates volumes as `activation` says instead of as [`Activation::detect`] found.
    #[must_use]
    pub fn with_activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// How volumes are activated.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Runs LVM tool `program` (with `--driverloaded n` under loop activation).
    async fn lvm(&self, program: &str, args: &[&str]) -> Result<String, LvmError> {
        match self.activation {
            Activation::DeviceMapper => Self::run_ok(program, args).await,
            Activation::Loop => {
                let all: Vec<&str> =
                    ["--driverloaded", "n"].into_iter().chain(args.iter().copied()).collect();
                Self::run_ok(program, &all).await
            }
        }
    }

    /// Where logical volume `lv` lies (loop activation).
    async fn extent(&self, lv: &str) -> Result<Extent, LvmError> {
        let name = format!("{}/{lv}", self.volume_group);
        let lvs = self
            .lvm(
                "lvs",
                &[
                    "--noheadings",
                    "--separator",
                    ";",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    "devices,seg_count,lv_size,vg_extent_size",
                    &name,
                ],
            )
            .await?;
        let device = lvs.split(';').next().and_then(|d| d.trim().split('(').next()).unwrap_or_default();
        if !device.starts_with('/') {
            return Err(LvmError::Command {
                command: format!("lvs {name}"),
                message: format!("no device in {lvs:?}"),
            });
        }
        let pe_start = self
            .lvm("pvs", &["--noheadings", "--units", "b", "--nosuffix", "-o", "pe_start", device])
            .await?;
        let pe_start: u64 = pe_start.trim().parse().map_err(|_| LvmError::Command {
            command: format!("pvs {device}"),
            message: format!("unexpected pe_start {pe_start:?}"),
        })?;
        parse_extent(&lvs, pe_start).ok_or_else(|| LvmError::Command {
            command: format!("lvs {name}"),
            message: format!("{name} is not one range of one physical volume: {}", lvs.trim()),
        })
    }

    /// The loop devices over a logical volume's range (loop activation).
    async fn loops_of(&self, extent: &Extent) -> Result<Vec<String>, LvmError> {
        let out = Self::run_ok("losetup", &["-n", "-l", "-O", "NAME,OFFSET,SIZELIMIT,BACK-FILE"]).await?;
        Ok(loops_over(&out, extent))
    }

    /// The block device of logical volume `lv`, activated if it is not.
    async fn activate(&self, lv: &str) -> Result<PathBuf, LvmError> {
        match self.activation {
            Activation::DeviceMapper => Ok(self.device(lv)),
            Activation::Loop => {
                let extent = self.extent(lv).await?;
                if let Some(dev) = self.loops_of(&extent).await?.into_iter().next() {
                    return Ok(PathBuf::from(dev));
                }
                let (offset, size) = (extent.offset.to_string(), extent.size.to_string());
                let dev = Self::run_ok(
                    "losetup",
                    &["--find", "--show", "--offset", &offset, "--sizelimit", &size, &extent.device],
                )
                .await?;
                Ok(PathBuf::from(dev.trim()))
            }
        }
    }

    /// Undoes [`activate`](Self::activate) (loop activation; LVM deactivates device-mapper
    /// volumes itself when it removes them).
    async fn deactivate(&self, lv: &str) -> Result<(), LvmError> {
        if self.activation == Activation::Loop {
            let extent = self.extent(lv).await?;
            for dev in self.loops_of(&extent).await? {
                Self::run_ok("losetup", &["-d", &dev]).await?;
            }
        }
        Ok(())
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
        let out = self.lvm("lvs", &["--noheadings", "-o", "lv_name", &self.volume_group]).await?;
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

    async fn mount(&self, lv: &str, device: &Path) -> Result<PathBuf, LvmError> {
        let target = self.mount_path(lv);
        let device = device.to_path_buf();
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
            let vg = self.volume_group.as_str();
            match self.activation {
                Activation::DeviceMapper => {
                    self.lvm("lvcreate", &["-y", "-W", "y", "-n", lv, "-L", &size, vg]).await?;
                }
                Activation::Loop => {
                    let args = [
                        "-y",
                        "-an",
                        "-Zn",
                        "-W",
                        "n",
                        "--alloc",
                        "contiguous",
                        "--addtag",
                        UNFORMATTED_TAG,
                        "-n",
                        lv,
                        "-L",
                        &size,
                        vg,
                    ];
                    self.lvm("lvcreate", &args).await?;
                }
            }
        }
        let device = self.activate(lv).await?;
        let dev = device.to_string_lossy().into_owned();
        let name = format!("{}/{lv}", self.volume_group);
        let unformatted = self.activation == Activation::Loop
            && self.lvm("lvs", &["--noheadings", "-o", "lv_tags", &name]).await?.contains(UNFORMATTED_TAG);
        if unformatted {
            // Whatever an earlier volume left on these extents goes before anything reads it.
            Self::run_ok("wipefs", &["-a", "-q", &dev]).await?;
        }
        let fresh = unformatted || !self.has_filesystem(&device).await?;
        if fresh {
            Self::run_ok("mkfs.ext4", &["-q", "-F", &dev]).await?;
        }
        if unformatted {
            self.lvm("lvchange", &["--deltag", UNFORMATTED_TAG, &name]).await?;
        }
        let target = self.mount(lv, &device).await?;
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
            self.deactivate(&lv).await?;
            let name = format!("{}/{lv}", self.volume_group);
            self.lvm("lvremove", &["-y", &name]).await?;
        }
        Ok(())
    }

    /// Mounts a volume it created again (after a restart or reboot), if its logical volume exists.
    pub async fn remount(&self, volume: &PersistentVolume) -> Result<(), LvmError> {
        let lv = self.names_of(volume)?;
        if self.exists(&lv).await? {
            let device = self.activate(&lv).await?;
            self.mount(&lv, &device).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_range_of_one_physical_volume_is_an_extent_and_anything_else_is_not() {
        let lvs = "  /dev/loop0(16);1;67108864;4194304\n";
        assert_eq!(
            parse_extent(lvs, 1 << 20),
            Some(Extent { device: "/dev/loop0".into(), offset: (1 << 20) + 16 * 4194304, size: 67108864 })
        );
        assert_eq!(parse_extent("  /dev/loop1(0),/dev/loop0(16);2;1;4194304", 0), None);
        assert_eq!(parse_extent("  /dev/loop1(0);2;1;4194304", 0), None);
        assert_eq!(parse_extent("garbage", 0), None);
        assert_eq!(parse_extent("", 0), None);
    }

    #[test]
    fn the_loop_device_over_an_extent_is_found_by_offset_size_and_backing_device() {
        let extent = Extent { device: "/dev/loop0".into(), offset: 1048576, size: 67108864 };
        let listing = "/dev/loop2 0 0 /tmp/a.img\n/dev/loop3 1048576 67108864 /dev/loop1\n\
                       /dev/loop4 1048576 67108864 /dev/loop0\n";
        assert_eq!(loops_over(listing, &extent), ["/dev/loop4"]);
        assert!(loops_over("/dev/loop4 1048576 4096 /dev/loop0\n", &extent).is_empty());
    }
}
