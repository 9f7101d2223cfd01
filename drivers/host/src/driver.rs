//! [`HostVolumes`]: the [`VolumeHost`] that sets up emptyDir, hostPath, configMap, secret,
//! downwardAPI and projected volumes on this machine, in the kubelet's layout:
//!
//! ```text
//! <root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>     directory, or a tmpfs (medium: Memory)
//! <root>/pods/<uid>/volumes/kubernetes.io~configmap/<name>     atomic writer (..data symlink swap)
//! <root>/pods/<uid>/volumes/kubernetes.io~secret/<name>        the same, on a tmpfs
//! <root>/pods/<uid>/volumes/kubernetes.io~downward-api/<name>  the same, on a tmpfs
//! <root>/pods/<uid>/volumes/kubernetes.io~projected/<name>     the same, on a tmpfs
//! <root>/pods/<uid>/volume-subpaths/<name>/<container>/<i>     subPath bind mounts
//! ```
//!
//! `<root>/pods/<uid>/volumes/kubernetes.io~local-volume/<name>` a bind mount of a `local` PersistentVolume
//!
//! hostPath volumes are used in place (checked as their `type` says); teardown never touches
//! them. Every operation is idempotent and runs on a blocking thread.
//!
//! Memory-backed volumes (a `medium: Memory` emptyDir; secret, downwardAPI and projected volumes,
//! as the kubelet backs them) get a tmpfs sized as the kubelet sizes it
//! ([`nodelet_resources::volume::tmpfs::tmpfs_size`]): the node's allocatable memory, the pod's
//! memory limit, the emptyDir's `sizeLimit`, whichever is smallest. The tmpfs is mounted before
//! the atomic writer fills it, so their content never touches the node's disk and never counts
//! towards the pod's local ephemeral storage. Teardown unmounts whatever is mounted at the
//! volume's directory; reconstruction after a restart finds the mount.
//!
//! The directory of a configMap, secret, downwardAPI or projected volume is world-readable and
//! searchable, as the kubelet's emptyDir wrapper makes it (so a container running as any user reads
//! its files): on disk 0777, a tmpfs root 1777 (the tmpfs default, which the kubelet keeps). The
//! atomic writer's timestamped directories are 0755 and the files have their `mode`.
//!
//! A pod's `fsGroup` ([`DesiredVolume::fs_group`]) is applied with [`ownership`] where and when the
//! kubelet applies it: to an emptyDir when it is made, to the files of a configMap, secret,
//! downwardAPI or projected volume whenever new content is written (and whenever the volume's root
//! lacks the group, e.g. after a write whose ownership change failed), to a `local` PersistentVolume
//! when it is mounted for the pod (skipped with `fsGroupChangePolicy: OnRootMismatch` when its root
//! already has the group and mode).

use std::io;
use std::path::{Path, PathBuf};

use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::actual::{MountState, VolumeActual};
use nodelet_resources::volume::desired::{
    DesiredVolume, VolumeKey, VolumeSource, pod_dir, split_key, volume_key, volume_path,
};
use nodelet_resources::volume::driver::{VolumeError, VolumeHost};
use nodelet_resources::volume::ops::VolumeOp;

use crate::hostpath::{HostPathType, check_host_path, resolve_beneath_prefix};
use crate::{atomic, mounts, ownership, subpath};

/// Permissions of an emptyDir, as the kubelet makes them (world-writable: any container user).
const EMPTY_DIR_MODE: u32 = 0o777;
/// Permissions of the directory of a configMap volume (the kubelet's emptyDir wrapper's).
const FILES_DIR_MODE: u32 = 0o777;
/// Permissions of the tmpfs root of a secret, downwardAPI or projected volume: the tmpfs default,
/// which the kubelet's memory emptyDir wrapper keeps (it mounts without a `mode` option).
const FILES_TMPFS_MODE: u32 = 0o1777;
/// Permissions of the directories nodelet makes on the way to a volume.
const PARENT_MODE: u32 = 0o750;

/// The name, in `<root>/pods/<uid>/volume-subpaths/<volume>/`, of the bind of a hostPath resolved beneath its
/// allowed prefix (not a container name: those are DNS labels, without `~`).
pub const CONFINED_HOST_PATH: &str = "~host-path";

/// Sets volumes up under nodelet's root directory.
#[derive(Debug, Clone)]
pub struct HostVolumes {
    root: PathBuf,
    /// The node's allocatable memory, the largest a memory-backed volume's tmpfs gets.
    allocatable_memory: Option<u64>,
    /// `nodelet.allowedHostPaths`: a hostPath under one of them is resolved beneath it.
    allowed_host_paths: Vec<PathBuf>,
    /// Mount nothing ([`without_mounts`](Self::without_mounts)).
    no_mounts: bool,
}

impl HostVolumes {
    /// Volumes under `root` (`--root-dir`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), allocatable_memory: None, allowed_host_paths: Vec::new(), no_mounts: false }
    }

    /// With `no_mounts`, mounts nothing, as kubemark's fake mounter: memory-backed volumes are plain
    /// directories on disk, local persistent volumes and hostPaths under an allowed prefix are checked but
    /// not bound (their directory stays empty). For hollow nodes, whose pods run nowhere.
    pub fn without_mounts(mut self, no_mounts: bool) -> Self {
        self.no_mounts = no_mounts;
        self
    }

    /// The allowed hostPath prefixes (`nodelet.allowedHostPaths`): a hostPath volume under one of them is
    /// resolved beneath it, never through a symlink out of it, and the runtime mounts a bind of what was
    /// resolved, kept in the pod's directory ([`CONFINED_HOST_PATH`]), not the path string.
    pub fn with_allowed_host_paths(mut self, prefixes: Vec<PathBuf>) -> Self {
        self.allowed_host_paths = prefixes;
        self
    }

    /// Sizes memory-backed volumes to at most `bytes`, the node's allocatable memory (without it,
    /// a tmpfs of a pod without memory limit gets the kernel's default size, half the RAM).
    pub fn with_allocatable_memory(mut self, bytes: Option<u64>) -> Self {
        self.allocatable_memory = bytes;
        self
    }

    /// The size of the tmpfs of `volume` (memory-backed) whose own limit is `size_limit`.
    fn tmpfs_size(&self, volume: &DesiredVolume, size_limit: Option<u64>) -> Option<u64> {
        nodelet_resources::volume::tmpfs::tmpfs_size(self.allocatable_memory, volume.memory_limit, size_limit)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn set_up_blocking(&self, volume: &DesiredVolume) -> Result<VolumeActual, VolumeError> {
        let what = || format!("volume {:?} of pod {}/{}", volume.name, volume.namespace, volume.pod_name);
        let source = volume.source.as_ref().map_err(|why| VolumeError::failed(why.to_string()))?;
        let path = volume_path(&self.root, volume);
        let actual = |tmpfs: bool, digest: Option<String>| VolumeActual {
            plugin: volume.plugin,
            path: path.clone(),
            state: MountState::Mounted,
            digest,
            tmpfs,
            csi: None,
        };
        match source {
            VolumeSource::HostPath { path: host, kind } => {
                let kind = HostPathType::parse(kind.as_deref())
                    .map_err(|e| VolumeError::failed(format!("{}: hostPath.type: {e}", what())))?;
                let confined = resolve_beneath_prefix(host, &self.allowed_host_paths, kind)
                    .map_err(|e| VolumeError::failed(format!("{}: {e}", what())))?;
                let Some(resolved) = confined else {
                    check_host_path(host, kind)
                        .map_err(|e| VolumeError::failed(format!("{}: {e}", what())))?;
                    return Ok(actual(false, None));
                };
                if self.no_mounts {
                    return Ok(actual(false, None));
                }
                // Beside the volume's subPath binds, which its teardown unmounts.
                let staged = pod_dir(&self.root, &volume.pod_uid)
                    .join("volume-subpaths")
                    .join(&volume.name)
                    .join(CONFINED_HOST_PATH);
                subpath::bind_descriptor(&resolved, &staged).map_err(|e| {
                    VolumeError::uncertain(format!("{}: binding hostPath {}: {e}", what(), host.display()))
                })?;
                Ok(VolumeActual { path: staged, ..actual(false, None) })
            }
            VolumeSource::EmptyDir { memory, size_limit } => {
                let mut fresh =
                    make_dir(&path, EMPTY_DIR_MODE).map_err(|e| io_error(&what(), "creating", &path, &e))?;
                let memory = *memory && !self.no_mounts;
                if memory {
                    let size = self.tmpfs_size(volume, *size_limit);
                    fresh = mount_tmpfs_once(&path, size, EMPTY_DIR_MODE).map_err(|e| {
                        VolumeError::uncertain(format!(
                            "{}: mounting a tmpfs at {}: {e}",
                            what(),
                            path.display()
                        ))
                    })?;
                }
                // The kubelet changes an emptyDir's ownership when it makes it, not again.
                if fresh {
                    apply_fs_group(volume, &path, false)
                        .map_err(|e| VolumeError::failed(format!("{}: {e}", what())))?;
                }
                Ok(actual(memory, None))
            }
            VolumeSource::Local { volume: pv, path: source } => {
                make_dir(&path, PARENT_MODE).map_err(|e| io_error(&what(), "creating", &path, &e))?;
                if self.no_mounts {
                    return Ok(actual(false, None));
                }
                if !mounts::is_mount_point(&path)
                    .map_err(|e| VolumeError::failed(format!("{}: {e}", what())))?
                {
                    mounts::bind_mount(source, &path, false).map_err(|e| {
                        VolumeError::uncertain(format!(
                            "{}: mounting local persistentvolume {pv:?} ({}): {e}",
                            what(),
                            source.display()
                        ))
                    })?;
                    // As the kubelet: once, when the volume is mounted for the pod.
                    apply_fs_group(volume, &path, true)
                        .map_err(|e| VolumeError::uncertain(format!("{}: {e}", what())))?;
                }
                Ok(actual(false, None))
            }
            VolumeSource::Csi(csi) | VolumeSource::CsiDevice(csi) => Err(VolumeError::failed(format!(
                "{}: CSI volume of driver {:?}: not served by the host volume driver",
                what(),
                csi.driver
            ))),
            VolumeSource::Files { files, digest, .. } => {
                make_dir(&path, FILES_DIR_MODE).map_err(|e| io_error(&what(), "creating", &path, &e))?;
                // Secret, downwardAPI and projected volumes never touch the disk: the tmpfs is
                // there before the first file is written.
                let tmpfs = source.memory_backed() && !self.no_mounts;
                if tmpfs {
                    mount_tmpfs_once(&path, self.tmpfs_size(volume, None), FILES_TMPFS_MODE).map_err(
                        |e| {
                            VolumeError::uncertain(format!(
                                "{}: mounting a tmpfs at {}: {e}",
                                what(),
                                path.display()
                            ))
                        },
                    )?;
                } else {
                    // A directory made by an earlier version (0750) or with another umask.
                    ensure_perm(&path, FILES_DIR_MODE).map_err(|e| io_error(&what(), "chmod", &path, &e))?;
                }
                let changed = atomic::write_atomic(&path, files.as_ref())
                    .map_err(|e| VolumeError::uncertain(format!("{}: writing its files: {e}", what())))?;
                // The atomic writer's setPerms: after every write of new content.
                let root_mismatch =
                    volume.fs_group.is_some_and(|g| ownership::requires_change(&path, g.gid, g.read_only));
                if changed || root_mismatch {
                    apply_fs_group(volume, &path, false)
                        .map_err(|e| VolumeError::uncertain(format!("{}: {e}", what())))?;
                }
                Ok(actual(tmpfs, Some(digest.clone())))
            }
        }
    }

    fn tear_down_blocking(&self, key: &VolumeKey, plugin: Plugin, path: &Path) -> Result<(), VolumeError> {
        let Some((uid, name)) = split_key(key) else {
            return Err(VolumeError::failed(format!("bad volume key {key:?}")));
        };
        let pod = pod_dir(&self.root, uid);
        let subpaths = pod.join("volume-subpaths").join(name);
        subpath::unbind_sub_paths(&subpaths).map_err(|e| {
            VolumeError::uncertain(format!("volume {name:?} of pod {uid}: removing subPath binds: {e}"))
        })?;
        remove_empty(&subpaths);
        remove_empty(&pod.join("volume-subpaths"));
        if plugin != Plugin::HostPath {
            // Only ever remove what lies in the pod's own volume directory.
            let expected = pod.join("volumes").join(plugin.dir_name()).join(name);
            if path != expected {
                return Err(VolumeError::failed(format!(
                    "volume {name:?} of pod {uid}: refusing to remove {} (expected {})",
                    path.display(),
                    expected.display()
                )));
            }
            let teardown = || -> Result<(), mounts::MountError> {
                if mounts::is_mount_point(path)? {
                    mounts::unmount(path)?;
                }
                mounts::remove_dir_beneath(path)
            };
            match teardown() {
                Ok(()) => {}
                Err(e) if !path.exists() => tracing::debug!(error = %e, "volume already gone"),
                Err(e) => {
                    return Err(VolumeError::uncertain(format!(
                        "volume {name:?} of pod {uid}: removing {}: {e}",
                        path.display()
                    )));
                }
            }
            remove_empty(&pod.join("volumes").join(plugin.dir_name()));
            remove_empty(&pod.join("volumes"));
        }
        remove_empty(&pod);
        Ok(())
    }

    fn reconstruct_blocking(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        let pods = self.root.join("pods");
        let mut found = Vec::new();
        let uids = match read_dir_names(&pods) {
            Ok(uids) => uids,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(VolumeError::failed(format!("reading {}: {e}", pods.display()))),
        };
        for uid in uids {
            let volumes = pods.join(&uid).join("volumes");
            for dir in read_dir_names(&volumes).unwrap_or_default() {
                let Some(plugin) = Plugin::from_dir_name(&dir) else { continue };
                for name in read_dir_names(&volumes.join(&dir)).unwrap_or_default() {
                    let mut path = volumes.join(&dir).join(&name);
                    if plugin == Plugin::Csi {
                        path.push("mount");
                    }
                    let tmpfs = mounts::is_mount_point(&path).unwrap_or(false);
                    let actual = VolumeActual {
                        plugin,
                        path,
                        state: MountState::Mounted,
                        digest: None,
                        tmpfs,
                        csi: None,
                    };
                    found.push((volume_key(&uid, &name), actual));
                }
            }
            // subPath binds of hostPath volumes (which have no directory of their own).
            let subpaths = pods.join(&uid).join("volume-subpaths");
            for name in read_dir_names(&subpaths).unwrap_or_default() {
                let key = volume_key(&uid, &name);
                if !found.iter().any(|(k, _)| *k == key) {
                    let actual = VolumeActual {
                        plugin: Plugin::HostPath,
                        path: PathBuf::new(),
                        state: MountState::Uncertain,
                        digest: None,
                        tmpfs: false,
                        csi: None,
                    };
                    found.push((key, actual));
                }
            }
        }
        Ok(found)
    }
}

impl VolumeHost for HostVolumes {
    async fn set_up(&self, volume: &DesiredVolume) -> Result<VolumeActual, VolumeError> {
        let (this, volume) = (self.clone(), volume.clone());
        blocking(move || this.set_up_blocking(&volume)).await
    }

    async fn tear_down(&self, key: &VolumeKey, op: &VolumeOp) -> Result<(), VolumeError> {
        let VolumeOp::TearDown { plugin, path } = op else {
            return Err(VolumeError::failed(format!("volume {key:?}: not a teardown: {op:?}")));
        };
        let (this, key, plugin, path) = (self.clone(), key.clone(), *plugin, path.clone());
        blocking(move || this.tear_down_blocking(&key, plugin, &path)).await
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        let this = self.clone();
        blocking(move || this.reconstruct_blocking()).await
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, VolumeError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(VolumeError::uncertain(format!("volume task failed: {e}"))))
}

fn io_error(what: &str, doing: &str, path: &Path, e: &io::Error) -> VolumeError {
    VolumeError::failed(format!("{what}: {doing} {}: {e}", path.display()))
}

/// Creates `path` (and its parents, 0750) and gives it `mode`; returns whether it was made now.
fn make_dir(path: &Path, mode: u32) -> io::Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(PARENT_MODE).create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(path)?;
            if meta.is_dir() {
                Ok(false)
            } else {
                Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a directory"))
            }
        }
        Err(e) => Err(e),
    }
}

/// Gives the directory `path` (not a symlink) the permission bits `mode` when its own differ,
/// keeping the setgid and sticky bits (an `fsGroup`'s).
fn ensure_perm(path: &Path, mode: u32) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if st.st_mode & 0o777 != mode & 0o777 {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode((st.st_mode & 0o7000) | (mode & 0o777)))?;
    }
    Ok(())
}

/// Mounts a tmpfs at `path` unless one is there; returns whether it was mounted now.
fn mount_tmpfs_once(path: &Path, size: Option<u64>, mode: u32) -> Result<bool, mounts::MountError> {
    if mounts::is_mount_point(path)? {
        return Ok(false);
    }
    mounts::mount_tmpfs(path, size, mode).map(|()| true)
}

/// Applies the volume's `fsGroup` (if any) to `path`; `honour_policy`: skip when
/// `fsGroupChangePolicy: OnRootMismatch` finds the root right already.
fn apply_fs_group(
    volume: &DesiredVolume,
    path: &Path,
    honour_policy: bool,
) -> Result<(), ownership::OwnershipError> {
    let Some(group) = volume.fs_group else { return Ok(()) };
    if honour_policy
        && group.on_root_mismatch
        && !ownership::requires_change(path, group.gid, group.read_only)
    {
        tracing::debug!(path = %path.display(), "fsGroup: root already right (OnRootMismatch)");
        return Ok(());
    }
    ownership::set_volume_ownership(path, group.gid, group.read_only)
}

/// Removes `dir` if it is an empty directory; anything else is left alone.
fn remove_empty(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
}

fn read_dir_names(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir()
            && let Some(name) = entry.file_name().to_str()
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}
