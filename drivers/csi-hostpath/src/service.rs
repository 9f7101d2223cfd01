//! The CSI services: Identity, Controller (create/delete; attach/detach in attach mode) and Node
//! (bind-mount stage/publish, stats).
//!
//! In attach mode (`Config::attach`) the controller also offers `PUBLISH_UNPUBLISH_VOLUME`: an attachment
//! is a marker in the store, and the node calls refuse (FAILED_PRECONDITION) a volume that is not attached
//! or whose request does not carry the publish context ControllerPublishVolume returned, so a test can see
//! that the CO attached first and passed the context along.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nodelet_proto::csi::v1;
use tonic::{Request, Response, Status};

use crate::calllog::CallLog;
use crate::mounts;
use crate::store::{Store, VolumeRecord, ignore_not_found};

/// Settings of the driver.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Driver name (GetPluginInfo).
    pub(crate) name: String,
    /// Node ID (NodeGetInfo).
    pub(crate) node_id: String,
    /// NodeGetInfo `max_volumes_per_node` (0: unlimited).
    pub(crate) max_volumes_per_node: i64,
    /// Capacity of a volume created without a capacity range.
    pub(crate) default_volume_bytes: i64,
    /// Largest capacity a volume may be created with (larger requests get OUT_OF_RANGE).
    pub(crate) max_volume_bytes: i64,
    /// Attach mode: offer ControllerPublishVolume/ControllerUnpublishVolume and require the attachment (and
    /// its publish context) for NodeStageVolume and NodePublishVolume.
    pub(crate) attach: bool,
    /// NodeGetInfo's accessible topology (empty: none).
    pub(crate) topology: std::collections::HashMap<String, String>,
}

/// The publish context key ControllerPublishVolume returns (attach mode); its value is the volume ID.
pub(crate) const PUBLISH_CONTEXT_DEVICE_KEY: &str = "hostpath.csi.nodelet.dev/device";

/// The driver state shared by the three services.
#[derive(Debug)]
pub(crate) struct Inner {
    config: Config,
    store: Store,
    log: CallLog,
    /// Serialises every operation: the CO should send one call per volume at a time, but need not.
    lock: Mutex<()>,
}

/// The gRPC services over [`Inner`] (cheap to clone).
#[derive(Debug, Clone)]
pub(crate) struct HostPath(Arc<Inner>);

impl HostPath {
    /// The driver over `store`.
    pub(crate) fn new(config: Config, store: Store, log: CallLog) -> Self {
        HostPath(Arc::new(Inner { config, store, log, lock: Mutex::new(()) }))
    }

    /// Runs `f` on a blocking thread (mounts, file system walks), logs and records the call.
    async fn call<T, F>(&self, method: &'static str, volume_id: String, f: F) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, Status> + Send + 'static,
    {
        let inner = Arc::clone(&self.0);
        let outcome = match tokio::task::spawn_blocking(move || {
            let _guard = inner.lock.lock().unwrap_or_else(PoisonError::into_inner);
            f(&inner)
        })
        .await
        {
            Ok(outcome) => outcome,
            Err(e) => Err(Status::internal(format!("{method} task failed: {e}"))),
        };
        let code = outcome.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        match &outcome {
            Ok(_) => tracing::info!(method, volume_id, "ok"),
            Err(s) => tracing::warn!(method, volume_id, code = ?s.code(), message = s.message(), "failed"),
        }
        self.0.log.record(method, &volume_id, code);
        outcome.map(Response::new)
    }
}

// ---------------------------------------------------------------- request validation

fn require(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(())
}

/// A REQUIRED absolute path without `..` components (CSI paths are the CO's, but still checked).
fn require_path(field: &str, value: &str) -> Result<PathBuf, Status> {
    require(field, value)?;
    let path = Path::new(value);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!("{field} {value:?} must be an absolute path")));
    }
    if value.contains('\0') || path.components().any(|c| c == Component::ParentDir) {
        return Err(Status::invalid_argument(format!("{field} {value:?} must not contain '..' or NUL")));
    }
    Ok(path.to_path_buf())
}

/// A volume capability this driver can serve: mount access with a known access mode.
fn check_capability(cap: Option<&v1::VolumeCapability>) -> Result<(), Status> {
    use v1::volume_capability::AccessType;
    use v1::volume_capability::access_mode::Mode;
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    match cap.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => return Err(Status::invalid_argument("block access is not supported")),
        None => return Err(Status::invalid_argument("volume_capability.access_type is required")),
    }
    let mode = cap.access_mode.as_ref().map(|m| Mode::try_from(m.mode));
    match mode {
        Some(Ok(Mode::Unknown)) | Some(Err(_)) | None => {
            Err(Status::invalid_argument("volume_capability.access_mode is required"))
        }
        Some(Ok(_)) => Ok(()),
    }
}

/// The CreateVolume name rules: non-empty, at most 128 bytes, none of the banned control characters.
fn check_name(name: &str) -> Result<(), Status> {
    require("name", name)?;
    if name.len() > 128 {
        return Err(Status::invalid_argument("name is longer than 128 bytes"));
    }
    let banned = |c: char| matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}');
    if name.chars().any(banned) {
        return Err(Status::invalid_argument("name contains a control character"));
    }
    Ok(())
}

fn internal(what: &str, path: &Path, e: &io::Error) -> Status {
    Status::internal(format!("{what} {}: {e}", path.display()))
}

fn canonical(field: &str, path: &Path) -> Result<PathBuf, Status> {
    std::fs::canonicalize(path).map_err(|e| internal(&format!("cannot resolve {field}"), path, &e))
}

fn exists(path: &Path) -> Result<bool, Status> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(internal("cannot stat", path, &e)),
    }
}

fn mount_at(path: &Path) -> Result<Option<mounts::MountEntry>, Status> {
    mounts::mount_at(path).map_err(|e| internal("cannot read the mount table for", path, &e))
}

fn same_dir(path: &Path, other: &Path) -> Result<bool, Status> {
    mounts::same_dir(path, other).map_err(|e| internal("cannot stat", path, &e))
}

/// Disk usage of a directory tree (allocated bytes, like `du`) and its number of inodes, not following
/// symlinks nor crossing into other file systems, counting hard-linked files once.
fn disk_usage(root: &Path) -> io::Result<(u64, u64)> {
    let root_meta = std::fs::symlink_metadata(root)?;
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut inodes) = (root_meta.blocks() * 512, 1u64);
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.dev() != root_meta.dev() || (meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino()))) {
                continue;
            }
            bytes += meta.blocks() * 512;
            inodes += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------- operations

impl Inner {
    fn record(&self, volume_id: &str) -> Result<VolumeRecord, Status> {
        match self.store.get(volume_id) {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(Status::not_found(format!("volume {volume_id:?} does not exist"))),
            Err(e) => Err(Status::internal(format!("cannot read volume {volume_id:?}: {e}"))),
        }
    }

    fn create_volume(&self, req: &v1::CreateVolumeRequest) -> Result<v1::Volume, Status> {
        check_name(&req.name)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        for cap in &req.volume_capabilities {
            check_capability(Some(cap))?;
        }
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument("volume_content_source is not supported"));
        }
        let (required, limit) =
            req.capacity_range.as_ref().map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 {
            return Err(Status::invalid_argument("capacity_range must not be negative"));
        }
        if limit > 0 && required > limit {
            return Err(Status::invalid_argument("capacity_range.required_bytes exceeds limit_bytes"));
        }
        let capacity = if required > 0 {
            required
        } else if limit > 0 {
            limit.min(self.config.default_volume_bytes)
        } else {
            self.config.default_volume_bytes
        };
        if capacity > self.config.max_volume_bytes {
            return Err(Status::out_of_range(format!(
                "capacity {capacity} exceeds the maximum volume size {}",
                self.config.max_volume_bytes
            )));
        }
        let volume_id = Store::id_for_name(&req.name);
        let existing = self.store.get(&volume_id).map_err(|e| Status::internal(e.to_string()))?;
        let record = match existing {
            Some(r) if r.name != req.name => {
                return Err(Status::internal(format!("volume ID collision for name {:?}", req.name)));
            }
            Some(r) => {
                let fits = r.capacity_bytes >= required && (limit == 0 || r.capacity_bytes <= limit);
                if !fits {
                    return Err(Status::already_exists(format!(
                        "volume {:?} exists with capacity {}, incompatible with the requested range",
                        req.name, r.capacity_bytes
                    )));
                }
                r
            }
            None => {
                let r = VolumeRecord { name: req.name.clone(), volume_id, capacity_bytes: capacity };
                self.store.create(&r).map_err(|e| Status::internal(format!("cannot create volume: {e}")))?;
                r
            }
        };
        Ok(v1::Volume {
            capacity_bytes: record.capacity_bytes,
            volume_id: record.volume_id,
            volume_context: Default::default(),
            content_source: None,
            accessible_topology: Vec::new(),
        })
    }

    fn delete_volume(&self, req: &v1::DeleteVolumeRequest) -> Result<(), Status> {
        require("volume_id", &req.volume_id)?;
        if self.store.get(&req.volume_id).map_err(|e| Status::internal(e.to_string()))?.is_none() {
            return Ok(()); // Deleting a volume that does not exist succeeds.
        }
        self.refuse_if_staged(&req.volume_id)?;
        if self.config.attach
            && let Some(node) = self.attachment(&req.volume_id)?
        {
            return Err(Status::failed_precondition(format!(
                "volume {} is still attached to node {node:?}",
                req.volume_id
            )));
        }
        self.store.delete(&req.volume_id).map_err(|e| Status::internal(format!("cannot delete volume: {e}")))
    }

    /// FAILED_PRECONDITION while the staged marker names a staging path that is still a mount point.
    fn refuse_if_staged(&self, volume_id: &str) -> Result<(), Status> {
        let marker = self.store.staged_marker(volume_id);
        match std::fs::read_to_string(&marker) {
            Ok(staging) => {
                let staging = Path::new(staging.trim());
                let mounted = std::fs::canonicalize(staging)
                    .ok()
                    .map(|p| mount_at(&p))
                    .transpose()?
                    .flatten()
                    .is_some();
                if mounted {
                    return Err(Status::failed_precondition(format!(
                        "volume {volume_id} is still staged at {}",
                        staging.display()
                    )));
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("cannot read", &marker, &e)),
        }
    }

    /// The node the volume is attached to, if any.
    fn attachment(&self, volume_id: &str) -> Result<Option<String>, Status> {
        self.store
            .attachment(volume_id)
            .map_err(|e| internal("cannot read the attachment", &self.store.attached_marker(volume_id), &e))
    }

    /// The publish context of an attached volume: deterministic, so a repeated publish returns the same.
    fn publish_context(volume_id: &str) -> HashMap<String, String> {
        HashMap::from([(PUBLISH_CONTEXT_DEVICE_KEY.to_owned(), volume_id.to_owned())])
    }

    /// In attach mode, FAILED_PRECONDITION unless the volume is attached to this node and `publish_context`
    /// carries the value ControllerPublishVolume returned (proof that the CO passed it along).
    fn require_attached(
        &self,
        call: &str,
        volume_id: &str,
        publish_context: &HashMap<String, String>,
    ) -> Result<(), Status> {
        if !self.config.attach {
            return Ok(());
        }
        match self.attachment(volume_id)? {
            Some(node) if node == self.config.node_id => {}
            Some(node) => {
                return Err(Status::failed_precondition(format!(
                    "volume {volume_id} is attached to node {node:?}, not to this node ({:?})",
                    self.config.node_id
                )));
            }
            None => {
                return Err(Status::failed_precondition(format!(
                    "volume {volume_id} is not attached (ControllerPublishVolume first)"
                )));
            }
        }
        match publish_context.get(PUBLISH_CONTEXT_DEVICE_KEY) {
            Some(value) if value == volume_id => Ok(()),
            Some(value) => Err(Status::failed_precondition(format!(
                "{call}: publish_context[{PUBLISH_CONTEXT_DEVICE_KEY:?}] is {value:?}, \
                 not what ControllerPublishVolume returned ({volume_id:?})"
            ))),
            None => Err(Status::failed_precondition(format!(
                "{call}: publish_context lacks {PUBLISH_CONTEXT_DEVICE_KEY:?} (the context \
                 ControllerPublishVolume returned must be passed along)"
            ))),
        }
    }

    fn controller_publish(
        &self,
        req: &v1::ControllerPublishVolumeRequest,
    ) -> Result<v1::ControllerPublishVolumeResponse, Status> {
        if !self.config.attach {
            return Err(unimplemented_status("ControllerPublishVolume"));
        }
        require("volume_id", &req.volume_id)?;
        require("node_id", &req.node_id)?;
        check_capability(req.volume_capability.as_ref())?;
        self.record(&req.volume_id)?;
        if req.node_id != self.config.node_id {
            return Err(Status::not_found(format!("node {:?} does not exist", req.node_id)));
        }
        // `readonly` is accepted and not recorded: NodePublishVolume enforces read-only mounts.
        match self.attachment(&req.volume_id)? {
            Some(node) if node == req.node_id => {} // Already attached here: idempotent.
            Some(node) => {
                return Err(Status::failed_precondition(format!(
                    "volume {} is attached to another node ({node:?})",
                    req.volume_id
                )));
            }
            None => self.store.attach(&req.volume_id, &req.node_id).map_err(|e| {
                internal("cannot record the attachment", &self.store.attached_marker(&req.volume_id), &e)
            })?,
        }
        Ok(v1::ControllerPublishVolumeResponse { publish_context: Self::publish_context(&req.volume_id) })
    }

    fn controller_unpublish(&self, req: &v1::ControllerUnpublishVolumeRequest) -> Result<(), Status> {
        if !self.config.attach {
            return Err(unimplemented_status("ControllerUnpublishVolume"));
        }
        require("volume_id", &req.volume_id)?;
        // An unknown volume, or one not attached (to that node), is already unpublished: OK.
        let Some(node) = self.attachment(&req.volume_id)? else { return Ok(()) };
        if !req.node_id.is_empty() && req.node_id != node {
            return Ok(());
        }
        self.refuse_if_staged(&req.volume_id)?;
        self.store.detach(&req.volume_id).map_err(|e| {
            internal("cannot remove the attachment", &self.store.attached_marker(&req.volume_id), &e)
        })
    }

    fn validate_capabilities(
        &self,
        req: &v1::ValidateVolumeCapabilitiesRequest,
    ) -> Result<v1::ValidateVolumeCapabilitiesResponse, Status> {
        require("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        self.record(&req.volume_id)?;
        if let Some(bad) = req.volume_capabilities.iter().find_map(|c| check_capability(Some(c)).err()) {
            return Ok(v1::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: bad.message().to_owned(),
            });
        }
        Ok(v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(v1::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context.clone(),
                volume_capabilities: req.volume_capabilities.clone(),
                parameters: req.parameters.clone(),
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        })
    }

    fn node_stage(&self, req: &v1::NodeStageVolumeRequest) -> Result<(), Status> {
        require("volume_id", &req.volume_id)?;
        let staging = require_path("staging_target_path", &req.staging_target_path)?;
        check_capability(req.volume_capability.as_ref())?;
        self.record(&req.volume_id)?;
        self.require_attached("NodeStageVolume", &req.volume_id, &req.publish_context)?;
        let source = self.store.volume_dir(&req.volume_id);
        std::fs::create_dir_all(&staging).map_err(|e| internal("cannot create", &staging, &e))?;
        let staging = canonical("staging_target_path", &staging)?;
        if mount_at(&staging)?.is_some() {
            if same_dir(&staging, &source)? {
                return Ok(()); // Already staged: idempotent.
            }
            return Err(Status::already_exists(format!(
                "{} is already a mount point of something else",
                staging.display()
            )));
        }
        let marker = self.store.staged_marker(&req.volume_id);
        std::fs::write(&marker, staging.to_string_lossy().as_bytes())
            .map_err(|e| internal("cannot write", &marker, &e))?;
        mounts::bind(&source, &staging, false).map_err(|e| internal("cannot bind-mount onto", &staging, &e))
    }

    fn node_unstage(&self, req: &v1::NodeUnstageVolumeRequest) -> Result<(), Status> {
        require("volume_id", &req.volume_id)?;
        let staging = require_path("staging_target_path", &req.staging_target_path)?;
        if !exists(&staging)? {
            return ignore_not_found(std::fs::remove_file(self.store.staged_marker(&req.volume_id)))
                .map_err(|e| Status::internal(e.to_string()));
        }
        let staging = canonical("staging_target_path", &staging)?;
        self.unmount_volume(&req.volume_id, &staging)?;
        std::fs::remove_dir(&staging).or_else(|e| match e.kind() {
            io::ErrorKind::NotFound => Ok(()),
            _ => Err(internal("cannot remove", &staging, &e)),
        })?;
        ignore_not_found(std::fs::remove_file(self.store.staged_marker(&req.volume_id)))
            .map_err(|e| Status::internal(e.to_string()))
    }

    /// Unmounts `path` (canonical) if mounted, after checking that what is mounted there is this volume
    /// (when the volume still exists).
    fn unmount_volume(&self, volume_id: &str, path: &Path) -> Result<(), Status> {
        if mount_at(path)?.is_none() {
            return Ok(());
        }
        if self.store.get(volume_id).map_err(|e| Status::internal(e.to_string()))?.is_some()
            && !same_dir(path, &self.store.volume_dir(volume_id))?
        {
            return Err(Status::failed_precondition(format!(
                "{} is mounted, but not with volume {volume_id}",
                path.display()
            )));
        }
        mounts::unmount_all(path).map_err(|e| internal("cannot unmount", path, &e)).map(drop)
    }

    fn node_publish(&self, req: &v1::NodePublishVolumeRequest) -> Result<(), Status> {
        require("volume_id", &req.volume_id)?;
        let target = require_path("target_path", &req.target_path)?;
        let staging = require_path("staging_target_path", &req.staging_target_path)?;
        check_capability(req.volume_capability.as_ref())?;
        self.record(&req.volume_id)?;
        self.require_attached("NodePublishVolume", &req.volume_id, &req.publish_context)?;
        let source = self.store.volume_dir(&req.volume_id);
        let staged = exists(&staging)? && {
            let staging = canonical("staging_target_path", &staging)?;
            mount_at(&staging)?.is_some() && same_dir(&staging, &source)?
        };
        if !staged {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        }
        std::fs::create_dir_all(&target).map_err(|e| internal("cannot create", &target, &e))?;
        let target = canonical("target_path", &target)?;
        if let Some(entry) = mount_at(&target)? {
            if same_dir(&target, &source)? && mounts::is_read_only(&entry) == req.readonly {
                return Ok(()); // Already published the same way: idempotent.
            }
            return Err(Status::already_exists(format!(
                "{} is already mounted, differently (read-only: {})",
                target.display(),
                mounts::is_read_only(&entry)
            )));
        }
        mounts::bind(&staging, &target, req.readonly)
            .map_err(|e| internal("cannot bind-mount onto", &target, &e))
    }

    fn node_unpublish(&self, req: &v1::NodeUnpublishVolumeRequest) -> Result<(), Status> {
        require("volume_id", &req.volume_id)?;
        let target = require_path("target_path", &req.target_path)?;
        if !exists(&target)? {
            return Ok(());
        }
        let target = canonical("target_path", &target)?;
        self.unmount_volume(&req.volume_id, &target)?;
        // Never recursive: a target that is not empty after the unmount was not this driver's mount.
        std::fs::remove_dir(&target).or_else(|e| match e.kind() {
            io::ErrorKind::NotFound => Ok(()),
            _ => Err(internal("cannot remove", &target, &e)),
        })
    }

    fn node_get_volume_stats(
        &self,
        req: &v1::NodeGetVolumeStatsRequest,
    ) -> Result<Vec<v1::VolumeUsage>, Status> {
        use v1::volume_usage::Unit;
        require("volume_id", &req.volume_id)?;
        require("volume_path", &req.volume_path)?;
        if !req.staging_target_path.is_empty() {
            require_path("staging_target_path", &req.staging_target_path)?;
        }
        // The spec's NOT_FOUND: no such volume, or the volume is not at that path (a relative path
        // names nothing a CO could have published to).
        self.record(&req.volume_id)?;
        let path = std::path::PathBuf::from(&req.volume_path);
        if !path.is_absolute() || !exists(&path)? {
            return Err(Status::not_found(format!("volume {} is not at {}", req.volume_id, path.display())));
        }
        let vfs = rustix::fs::statvfs(&path).map_err(|e| internal("cannot statvfs", &path, &e.into()))?;
        let source = self.store.volume_dir(&req.volume_id);
        let (used_bytes, used_inodes) =
            disk_usage(&source).map_err(|e| internal("cannot walk", &source, &e))?;
        Ok(vec![
            v1::VolumeUsage {
                available: to_i64(vfs.f_bavail.saturating_mul(vfs.f_frsize)),
                total: to_i64(vfs.f_blocks.saturating_mul(vfs.f_frsize)),
                used: to_i64(used_bytes),
                unit: Unit::Bytes as i32,
            },
            v1::VolumeUsage {
                available: to_i64(vfs.f_favail),
                total: to_i64(vfs.f_files),
                used: to_i64(used_inodes),
                unit: Unit::Inodes as i32,
            },
        ])
    }
}

// ---------------------------------------------------------------- gRPC services

#[tonic::async_trait]
impl v1::identity_server::Identity for HostPath {
    async fn get_plugin_info(
        &self,
        _: Request<v1::GetPluginInfoRequest>,
    ) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
        self.call("GetPluginInfo", String::new(), |d| {
            Ok(v1::GetPluginInfoResponse {
                name: d.config.name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<v1::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
        use v1::plugin_capability::{Service, Type, service};
        self.call("GetPluginCapabilities", String::new(), |_| {
            Ok(v1::GetPluginCapabilitiesResponse {
                capabilities: vec![v1::PluginCapability {
                    r#type: Some(Type::Service(Service { r#type: service::Type::ControllerService as i32 })),
                }],
            })
        })
        .await
    }

    async fn probe(&self, _: Request<v1::ProbeRequest>) -> Result<Response<v1::ProbeResponse>, Status> {
        self.call("Probe", String::new(), |_| Ok(v1::ProbeResponse { ready: Some(true) })).await
    }
}

fn unimplemented_status(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not implemented by this driver"))
}

fn unimplemented<T>(method: &str) -> Result<Response<T>, Status> {
    Err(unimplemented_status(method))
}

#[tonic::async_trait]
impl v1::controller_server::Controller for HostPath {
    async fn create_volume(
        &self,
        req: Request<v1::CreateVolumeRequest>,
    ) -> Result<Response<v1::CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = Store::id_for_name(&req.name);
        self.call("CreateVolume", id, move |d| {
            d.create_volume(&req).map(|v| v1::CreateVolumeResponse { volume: Some(v) })
        })
        .await
    }

    async fn delete_volume(
        &self,
        req: Request<v1::DeleteVolumeRequest>,
    ) -> Result<Response<v1::DeleteVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("DeleteVolume", id, move |d| d.delete_volume(&req).map(|()| v1::DeleteVolumeResponse {}))
            .await
    }

    async fn controller_publish_volume(
        &self,
        req: Request<v1::ControllerPublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerPublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("ControllerPublishVolume", id, move |d| d.controller_publish(&req)).await
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<v1::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("ControllerUnpublishVolume", id, move |d| {
            d.controller_unpublish(&req).map(|()| v1::ControllerUnpublishVolumeResponse {})
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<v1::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<v1::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("ValidateVolumeCapabilities", id, move |d| d.validate_capabilities(&req)).await
    }

    async fn list_volumes(
        &self,
        _: Request<v1::ListVolumesRequest>,
    ) -> Result<Response<v1::ListVolumesResponse>, Status> {
        unimplemented("ListVolumes")
    }

    async fn get_capacity(
        &self,
        _: Request<v1::GetCapacityRequest>,
    ) -> Result<Response<v1::GetCapacityResponse>, Status> {
        unimplemented("GetCapacity")
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<v1::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v1::ControllerGetCapabilitiesResponse>, Status> {
        use v1::controller_service_capability::{Rpc, Type, rpc};
        self.call("ControllerGetCapabilities", String::new(), |d| {
            let cap = |t: rpc::Type| v1::ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            };
            let mut capabilities = vec![cap(rpc::Type::CreateDeleteVolume)];
            if d.config.attach {
                capabilities.push(cap(rpc::Type::PublishUnpublishVolume));
            }
            Ok(v1::ControllerGetCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        _: Request<v1::CreateSnapshotRequest>,
    ) -> Result<Response<v1::CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<v1::DeleteSnapshotRequest>,
    ) -> Result<Response<v1::DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<v1::ListSnapshotsRequest>,
    ) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn controller_expand_volume(
        &self,
        _: Request<v1::ControllerExpandVolumeRequest>,
    ) -> Result<Response<v1::ControllerExpandVolumeResponse>, Status> {
        unimplemented("ControllerExpandVolume")
    }

    async fn controller_get_volume(
        &self,
        _: Request<v1::ControllerGetVolumeRequest>,
    ) -> Result<Response<v1::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<v1::ControllerModifyVolumeRequest>,
    ) -> Result<Response<v1::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[tonic::async_trait]
impl v1::node_server::Node for HostPath {
    async fn node_stage_volume(
        &self,
        req: Request<v1::NodeStageVolumeRequest>,
    ) -> Result<Response<v1::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("NodeStageVolume", id, move |d| d.node_stage(&req).map(|()| v1::NodeStageVolumeResponse {}))
            .await
    }

    async fn node_unstage_volume(
        &self,
        req: Request<v1::NodeUnstageVolumeRequest>,
    ) -> Result<Response<v1::NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("NodeUnstageVolume", id, move |d| {
            d.node_unstage(&req).map(|()| v1::NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        req: Request<v1::NodePublishVolumeRequest>,
    ) -> Result<Response<v1::NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("NodePublishVolume", id, move |d| {
            d.node_publish(&req).map(|()| v1::NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<v1::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v1::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("NodeUnpublishVolume", id, move |d| {
            d.node_unpublish(&req).map(|()| v1::NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<v1::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<v1::NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        let id = req.volume_id.clone();
        self.call("NodeGetVolumeStats", id, move |d| {
            d.node_get_volume_stats(&req)
                .map(|usage| v1::NodeGetVolumeStatsResponse { usage, volume_condition: None })
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _: Request<v1::NodeExpandVolumeRequest>,
    ) -> Result<Response<v1::NodeExpandVolumeResponse>, Status> {
        unimplemented("NodeExpandVolume")
    }

    async fn node_get_capabilities(
        &self,
        _: Request<v1::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v1::NodeGetCapabilitiesResponse>, Status> {
        use v1::node_service_capability::{Rpc, Type, rpc};
        self.call("NodeGetCapabilities", String::new(), |_| {
            let cap = |t: rpc::Type| v1::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            };
            Ok(v1::NodeGetCapabilitiesResponse {
                capabilities: vec![cap(rpc::Type::StageUnstageVolume), cap(rpc::Type::GetVolumeStats)],
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _: Request<v1::NodeGetInfoRequest>,
    ) -> Result<Response<v1::NodeGetInfoResponse>, Status> {
        self.call("NodeGetInfo", String::new(), |d| {
            Ok(v1::NodeGetInfoResponse {
                node_id: d.config.node_id.clone(),
                max_volumes_per_node: d.config.max_volumes_per_node,
                accessible_topology: (!d.config.topology.is_empty())
                    .then(|| v1::Topology { segments: d.config.topology.clone() }),
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_validated() {
        assert_eq!(require_path("p", "").unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(require_path("p", "relative/x").unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(require_path("p", "/a/../etc").unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(require_path("p", "/a\0b").unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(require_path("p", "/a/b").unwrap(), PathBuf::from("/a/b"));
    }

    #[test]
    fn names_and_capabilities_are_validated() {
        assert!(check_name("pvc-1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\u{1}b").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
        assert!(check_capability(None).is_err());
        let block = v1::VolumeCapability {
            access_type: Some(v1::volume_capability::AccessType::Block(Default::default())),
            access_mode: Some(v1::volume_capability::AccessMode { mode: 1 }),
        };
        assert!(check_capability(Some(&block)).is_err());
        let no_mode = v1::VolumeCapability {
            access_type: Some(v1::volume_capability::AccessType::Mount(Default::default())),
            access_mode: None,
        };
        assert!(check_capability(Some(&no_mode)).is_err());
    }

    #[test]
    fn disk_usage_counts_files_once() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::hard_link(tmp.path().join("a"), tmp.path().join("b")).unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        let (bytes, inodes) = disk_usage(tmp.path()).unwrap();
        assert!(bytes >= 64 * 1024, "{bytes}");
        assert!(bytes < 2 * 64 * 1024 + 16 * 4096, "hard link counted twice: {bytes}");
        assert_eq!(inodes, 3, "root, the file (once), the directory");
    }
}
