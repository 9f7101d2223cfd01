//! Volume wiring of the daemon: the renderer that reads ConfigMaps, Secrets and tokens (and, for
//! the pod runtime and admission, RuntimeClasses) from the manifest directory and (cluster mode) the
//! API server; the daemon's CSI volume host ([`NodeVolumes`]); the volume pair's tasks that read them
//! (`volume-watch`, `volume-refresh`, `claim-volume-stats`, spawned by `daemon::builtin::volumes`). (The
//! pod engine is woken when a pod's volumes change by its relation on the volume actual store, see
//! `daemon::builtin::pods`.)
//!
//! **Objects do not cross sources.** An API pod's volumes and variables read the API server's ConfigMaps,
//! Secrets and tokens only; a static pod's (file, URL, HTTP) the manifest directory's only: a Secret a
//! manifest declares for static pods is never an API pod's, and a static pod never reads an API Secret (the
//! Kubernetes documentation: static pods cannot refer to API objects).
//!
//! **One copy of an object's content.** The files of every volume rendered from one version of a
//! ConfigMap or Secret share its bytes: the API's are kept with the watched object (`PodData`), the manifest
//! directory's once per version of the directory ([`NodeObjects`]).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Volume};
use k8s_openapi::api::node::v1::RuntimeClass;
use nodelet_host::files::{ObjectData, ObjectLookup};
use nodelet_resources::common::runtime_class::RuntimeClasses;
use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::actual::{DeviceActual, MountState, VolumeActual};
use nodelet_resources::volume::desired::{
    CsiSource, DesiredVolume, VolumeKey, VolumeSource, device_key, split_key,
};
use nodelet_resources::volume::driver::{VolumeError, VolumeHost};
use nodelet_resources::volume::ops::VolumeOp;
use nodelet_resources::volume::populator::Renderer;
use reconcile_engine::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sources::ManifestObjects;

/// The ConfigMaps, Secrets and service-account tokens pods get, kept apart by source: the manifest
/// directory's for static pods ([`local`](Self::local)), in cluster mode the API server's for API pods
/// ([`api`](Self::api)). Cheap to clone; reads from memory.
#[derive(Clone)]
pub(crate) struct NodeObjects {
    manifest: watch::Receiver<Arc<ManifestObjects>>,
    /// The content of the manifest directory's ConfigMaps and Secrets, as volumes read it.
    manifest_data: Arc<std::sync::Mutex<ManifestData>>,
    api: Option<crate::cluster::podobjects::PodData>,
    api_classes: Option<crate::cluster::runtimeclasses::ApiRuntimeClasses>,
}

impl std::fmt::Debug for NodeObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeObjects").field("api", &self.api.is_some()).finish_non_exhaustive()
    }
}

impl NodeObjects {
    /// The manifest directory's objects, and in cluster mode the API's.
    pub(crate) fn new(
        manifest: watch::Receiver<Arc<ManifestObjects>>,
        api: Option<crate::cluster::podobjects::PodData>,
    ) -> Self {
        Self { manifest, manifest_data: Arc::default(), api, api_classes: None }
    }

    /// Also looks RuntimeClasses up in the API server's (before the manifest directory's).
    pub(crate) fn with_api_runtime_classes(
        mut self,
        classes: Option<crate::cluster::runtimeclasses::ApiRuntimeClasses>,
    ) -> Self {
        self.api_classes = classes;
        self
    }

    /// The static pods' objects: the manifest directory's, and nothing of the API server's.
    pub(crate) fn local(&self) -> ManifestLookup {
        ManifestLookup(self.manifest.clone())
    }

    /// The API pods' objects (cluster mode): the API server's, and nothing of the manifest directory's.
    pub(crate) fn api(&self) -> Option<crate::cluster::podobjects::PodData> {
        self.api.clone()
    }

    fn manifest(&self) -> Snapshot {
        Snapshot(self.manifest.borrow().clone())
    }
}

/// The manifest directory's ConfigMaps and Secrets, as they are now: what static pods read.
#[derive(Clone)]
pub(crate) struct ManifestLookup(watch::Receiver<Arc<ManifestObjects>>);

impl ObjectLookup for ManifestLookup {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        Snapshot(self.0.borrow().clone()).config_map(namespace, name)
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        Snapshot(self.0.borrow().clone()).secret(namespace, name)
    }
}

impl RuntimeClasses for NodeObjects {
    fn runtime_class(&self, name: &str) -> Option<RuntimeClass> {
        // Cluster-scoped: a manifest's RuntimeClass has no namespace (`default` is what `find` assumes).
        self.api_classes
            .as_ref()
            .and_then(|a| a.get(name))
            .or_else(|| self.manifest().find("RuntimeClass", "default", name))
    }

    /// The API server's classes once listed (asked for now if they were not yet); the manifest
    /// directory's are always complete.
    fn listed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        match &self.api_classes {
            Some(api) => Box::pin(api.wait_listed()),
            None => Box::pin(std::future::ready(true)),
        }
    }
}

/// Renders configMap, secret, downwardAPI and projected volumes from the [`NodeObjects`] of the pod's
/// kind.
#[derive(Debug)]
pub(crate) struct ManifestRenderer {
    objects: NodeObjects,
}

impl ManifestRenderer {
    /// A renderer reading `objects`.
    pub(crate) fn new(objects: NodeObjects) -> Self {
        Self { objects }
    }
}

/// A snapshot of the manifest objects, looked up by kind, namespace and name.
struct Snapshot(Arc<ManifestObjects>);

/// The content of the manifest directory's ConfigMaps and Secrets as volumes read it, made once per
/// version of the directory, so that every volume rendered from one object shares its bytes. Holds the
/// objects that were asked for (at most every object of the directory).
#[derive(Default)]
struct ManifestData {
    /// The version of the directory the entries were made from.
    of: Option<Arc<ManifestObjects>>,
    /// By kind (`ConfigMap`, `Secret`), namespace and name.
    entries: HashMap<(&'static str, String, String), ObjectData>,
}

/// A [`Snapshot`] whose objects' content is kept in `data` (made on the first render that reads it).
struct SharedSnapshot<'a> {
    snapshot: Snapshot,
    data: &'a std::sync::Mutex<ManifestData>,
}

impl SharedSnapshot<'_> {
    fn data(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        make: impl FnOnce(&Snapshot) -> Option<ObjectData>,
    ) -> Option<ObjectData> {
        let mut data = self.data.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !data.of.as_ref().is_some_and(|of| Arc::ptr_eq(of, &self.snapshot.0)) {
            *data = ManifestData { of: Some(self.snapshot.0.clone()), entries: HashMap::new() };
        }
        let key = (kind, namespace.to_owned(), name.to_owned());
        if let Some(made) = data.entries.get(&key) {
            return Some(made.clone());
        }
        let made = make(&self.snapshot)?;
        data.entries.insert(key, made.clone());
        Some(made)
    }
}

impl ObjectLookup for SharedSnapshot<'_> {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.snapshot.config_map(namespace, name)
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.snapshot.secret(namespace, name)
    }

    fn config_map_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        self.data("ConfigMap", namespace, name, |s| s.config_map_data(namespace, name))
    }

    fn secret_data(&self, namespace: &str, name: &str) -> Option<ObjectData> {
        self.data("Secret", namespace, name, |s| s.secret_data(namespace, name))
    }
}

impl Snapshot {
    fn find<T: serde::de::DeserializeOwned>(&self, kind: &str, namespace: &str, name: &str) -> Option<T> {
        // The last document wins, as a later `kubectl apply` would.
        self.0.get(kind)?.iter().rev().find_map(|object| {
            let meta = object.value.get("metadata")?;
            let ns = meta.get("namespace").and_then(|v| v.as_str()).unwrap_or("default");
            let n = meta.get("name").and_then(|v| v.as_str())?;
            if ns != namespace || n != name {
                return None;
            }
            object.parse(kind)
        })
    }
}

impl ObjectLookup for Snapshot {
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.find("ConfigMap", namespace, name)
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.find("Secret", namespace, name)
    }
}

impl Renderer for ManifestRenderer {
    fn render(
        &self,
        pod: &DesiredPod,
        volume: &Volume,
        plugin: Plugin,
    ) -> Result<VolumeSource, nodelet_resources::volume::desired::RenderError> {
        let files = match (&pod.source, &self.objects.api) {
            (PodSource::Api, Some(api)) => nodelet_host::files::volume_files(&pod.pod, volume, api),
            // (an API pod without an API server cannot be; it reads nothing)
            (PodSource::Api, None) => {
                nodelet_host::files::volume_files(&pod.pod, volume, &Snapshot(Arc::default()))
            }
            _ => {
                let shared =
                    SharedSnapshot { snapshot: self.objects.manifest(), data: &self.objects.manifest_data };
                nodelet_host::files::volume_files(&pod.pod, volume, &shared)
            }
        }
        .map_err(render_error)?;
        Ok(VolumeSource::files(plugin, files))
    }
}

/// A render error as the volume engine sees it: a token being requested is a wait (the token's
/// arrival renders the volume again, see `cluster::podobjects`), anything else a failure.
pub(crate) fn render_error(
    e: nodelet_host::files::FilesError,
) -> nodelet_resources::volume::desired::RenderError {
    if e.is_pending() {
        nodelet_resources::volume::desired::RenderError::pending(e)
    } else {
        nodelet_resources::volume::desired::RenderError::new(e)
    }
}

/// The daemon's volume host: CSI volumes through their drivers (found in the plugin registry),
/// everything else on the host ([`nodelet_host::driver::HostVolumes`]).
#[derive(Debug, Clone)]
pub(crate) struct NodeVolumes {
    host: nodelet_host::driver::HostVolumes,
    registry: Arc<nodelet_csi::Registry>,
    layout: nodelet_csi::VolumeLayout,
    /// One lock per CSI device: its publishes, unpublishes and unstage never overlap, so no pod
    /// publishes from a device while it is being unstaged.
    device_locks: Arc<std::sync::Mutex<std::collections::HashMap<VolumeKey, Arc<tokio::sync::Mutex<()>>>>>,
}

/// A CSI volume of `src` as pod `pod_uid` uses it as `volume_name` (both empty for the device
/// steps, which are not per pod).
fn csi_volume(src: &CsiSource, pod_uid: &str, volume_name: &str) -> nodelet_csi::CsiVolume {
    use nodelet_csi::proto::volume_capability::{AccessType, access_mode::Mode};
    let mut csi = nodelet_csi::CsiVolume::filesystem(&src.driver, &src.volume_handle, pod_uid, volume_name);
    let mode = match src.access_mode.as_str() {
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        _ => Mode::SingleNodeWriter,
    };
    csi.capability = nodelet_csi::mount_capability(mode);
    if let Some(AccessType::Mount(m)) = csi.capability.access_type.as_mut() {
        m.fs_type = src.fs_type.clone();
    }
    csi.readonly = src.read_only;
    csi.volume_context = src.attributes.clone().into_iter().collect();
    csi
}

/// A failed CSI step as a volume error: uncertain when the step may have happened.
fn step_error(what: &str, e: &nodelet_csi::VolumeOpError) -> VolumeError {
    if e.is_uncertain() {
        VolumeError::uncertain(format!("{what}: {e}"))
    } else {
        VolumeError::failed(format!("{what}: {e}"))
    }
}

impl NodeVolumes {
    /// Volumes under `root`; CSI drivers from `registry`; memory-backed volumes no larger than
    /// `allocatable_memory` (the node's allocatable memory, bytes); hostPaths under one of
    /// `allowed_host_paths` resolved beneath it; with `no_mounts` (hollow nodes), nothing mounted
    /// ([`nodelet_host::driver::HostVolumes::without_mounts`]).
    pub(crate) fn new(
        root: &std::path::Path,
        registry: Arc<nodelet_csi::Registry>,
        allocatable_memory: Option<u64>,
        allowed_host_paths: Vec<std::path::PathBuf>,
        no_mounts: bool,
    ) -> Self {
        Self {
            host: nodelet_host::driver::HostVolumes::new(root)
                .with_allocatable_memory(allocatable_memory)
                .with_allowed_host_paths(allowed_host_paths)
                .without_mounts(no_mounts),
            registry,
            layout: nodelet_csi::VolumeLayout::new(root),
            device_locks: Arc::default(),
        }
    }

    fn ops(&self, driver: &str) -> Result<nodelet_csi::VolumeOps, VolumeError> {
        let found = self.registry.get(driver).ok_or_else(|| {
            VolumeError::failed(format!("CSI driver {driver:?} is not registered on this node"))
        })?;
        Ok(nodelet_csi::VolumeOps::new(found, self.layout.clone()))
    }

    /// The lock of device `key`, held for the returned guard's life.
    async fn lock_device(&self, key: &VolumeKey) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.device_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            locks.entry(key.clone()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// Forgets the lock of a device that is gone.
    fn forget_device(&self, key: &VolumeKey) {
        let mut locks = self.device_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if locks.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(key);
        }
    }

    /// Unpublishes a CSI pod volume (its device is unstaged later, when no pod publishes it).
    async fn csi_tear_down(&self, key: &VolumeKey, target: &std::path::Path) -> Result<(), VolumeError> {
        let Some((uid, name)) = split_key(key) else {
            return Err(VolumeError::failed(format!("bad volume key {key:?}")));
        };
        let what = format!("volume {name:?} of pod {uid}");
        let dir = target.parent().unwrap_or(target);
        let data = match nodelet_csi::read_vol_data(&dir.join(nodelet_csi::VOL_DATA_FILE_NAME)).await {
            Ok(data) => data,
            // Never published: only the directory may be left.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = tokio::fs::remove_dir(target).await;
                let _ = tokio::fs::remove_dir(dir).await;
                return Ok(());
            }
            Err(e) => return Err(VolumeError::uncertain(format!("{what}: {e}"))),
        };
        let ops = self.ops(&data.driver_name).map_err(|e| VolumeError::uncertain(format!("{what}: {e}")))?;
        let csi = nodelet_csi::CsiVolume::filesystem(&data.driver_name, &data.volume_handle, uid, name);
        let device = device_key(&data.driver_name, &data.volume_handle);
        {
            let _guard = self.lock_device(&device).await;
            ops.unpublish(&csi).await.map_err(|e| VolumeError::uncertain(format!("{what}: {e}")))?;
        }
        let pod = self.host.root().join("pods").join(uid);
        for d in [pod.join("volumes").join(Plugin::Csi.dir_name()), pod.join("volumes"), pod] {
            let _ = tokio::fs::remove_dir(d).await;
        }
        Ok(())
    }

    /// A pod volume on this node that still publishes the CSI volume `handle` of `driver`
    /// (from the `vol_data.json` files on disk), as `<pod uid>/<volume name>`.
    async fn published_by(&self, driver: &str, handle: &str) -> Option<String> {
        let pods = self.host.root().join("pods");
        let Ok(mut entries) = tokio::fs::read_dir(&pods).await else { return None };
        while let Ok(Some(pod)) = entries.next_entry().await {
            let csi_dir = pod.path().join("volumes").join(Plugin::Csi.dir_name());
            let Ok(mut volumes) = tokio::fs::read_dir(&csi_dir).await else { continue };
            while let Ok(Some(v)) = volumes.next_entry().await {
                let file = v.path().join(nodelet_csi::VOL_DATA_FILE_NAME);
                if let Ok(other) = nodelet_csi::read_vol_data(&file).await
                    && other.driver_name == driver
                    && other.volume_handle == handle
                {
                    return Some(format!(
                        "{}/{}",
                        pod.file_name().to_string_lossy(),
                        v.file_name().to_string_lossy()
                    ));
                }
            }
        }
        None
    }

    /// The CSI entries on disk: every pod volume's device (from its `vol_data.json`), and every
    /// device with a global directory. Devices come back with both steps uncertain: they are
    /// attached and staged again (idempotent) if still needed, else unstaged and detached.
    async fn reconstruct_csi(
        &self,
        found: &mut [(VolumeKey, VolumeActual)],
    ) -> Vec<(VolumeKey, VolumeActual)> {
        use nodelet_resources::volume::actual::{CsiActual, DeviceActual, Step};
        let mut devices: std::collections::BTreeMap<VolumeKey, VolumeActual> = Default::default();
        let device = |driver: &str, handle: &str, path: std::path::PathBuf| {
            VolumeActual::of_device(DeviceActual::new(driver, handle, Step::Uncertain), path)
        };
        let global = self.host.root().join("plugins").join("kubernetes.io").join("csi");
        if let Ok(mut drivers) = tokio::fs::read_dir(&global).await {
            while let Ok(Some(driver_dir)) = drivers.next_entry().await {
                let Ok(mut volumes) = tokio::fs::read_dir(driver_dir.path()).await else { continue };
                while let Ok(Some(v)) = volumes.next_entry().await {
                    let file = v.path().join(nodelet_csi::VOL_DATA_FILE_NAME);
                    let Ok(data) = nodelet_csi::read_vol_data(&file).await else { continue };
                    let path = v.path().join(nodelet_csi::GLOBAL_MOUNT_DIR_NAME);
                    devices.insert(
                        device_key(&data.driver_name, &data.volume_handle),
                        device(&data.driver_name, &data.volume_handle, path),
                    );
                }
            }
        }
        for (_, actual) in found.iter_mut().filter(|(_, a)| a.plugin == Plugin::Csi) {
            let dir = actual.path.parent().unwrap_or(&actual.path);
            let Ok(data) = nodelet_csi::read_vol_data(&dir.join(nodelet_csi::VOL_DATA_FILE_NAME)).await
            else {
                continue;
            };
            let key = device_key(&data.driver_name, &data.volume_handle);
            devices
                .entry(key.clone())
                .or_insert_with(|| device(&data.driver_name, &data.volume_handle, Default::default()));
            actual.csi = Some(Arc::new(CsiActual::Published { device: key }));
        }
        devices.into_iter().collect()
    }
}

impl VolumeHost for NodeVolumes {
    async fn set_up(&self, volume: &DesiredVolume) -> Result<VolumeActual, VolumeError> {
        match &volume.source {
            Ok(VolumeSource::Csi(_) | VolumeSource::CsiDevice(_)) => Err(VolumeError::failed(format!(
                "volume {:?} of pod {}/{}: CSI volumes are published from their device, not set up",
                volume.name, volume.namespace, volume.pod_name
            ))),
            _ => self.host.set_up(volume).await,
        }
    }

    async fn tear_down(&self, key: &VolumeKey, op: &VolumeOp) -> Result<(), VolumeError> {
        match op {
            VolumeOp::TearDown { plugin: Plugin::Csi, path } => self.csi_tear_down(key, path).await,
            _ => self.host.tear_down(key, op).await,
        }
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        let mut found = self.host.reconstruct().await?;
        let devices = self.reconstruct_csi(&mut found).await;
        found.extend(devices);
        Ok(found)
    }

    async fn attach(
        &self,
        source: &CsiSource,
    ) -> Result<std::collections::BTreeMap<String, String>, VolumeError> {
        let what = format!("attaching persistentvolume {:?}", source.volume);
        let ops =
            self.ops(&source.driver).map_err(|e| VolumeError::failed(format!("{what}: {}", e.message)))?;
        let context = ops.attach(&csi_volume(source, "", "")).await.map_err(|e| step_error(&what, &e))?;
        Ok(context.into_iter().collect())
    }

    async fn stage(
        &self,
        source: &CsiSource,
        publish_context: &std::collections::BTreeMap<String, String>,
    ) -> Result<Option<std::path::PathBuf>, VolumeError> {
        let what = format!("staging persistentvolume {:?}", source.volume);
        let ops =
            self.ops(&source.driver).map_err(|e| VolumeError::failed(format!("{what}: {}", e.message)))?;
        let context = publish_context.clone().into_iter().collect();
        let _guard = self.lock_device(&device_key(&source.driver, &source.volume_handle)).await;
        ops.stage(&csi_volume(source, "", ""), &context).await.map_err(|e| step_error(&what, &e))
    }

    async fn publish(
        &self,
        volume: &DesiredVolume,
        device_key: &VolumeKey,
        device: &DeviceActual,
    ) -> Result<VolumeActual, VolumeError> {
        let what = format!("volume {:?} of pod {}/{}", volume.name, volume.namespace, volume.pod_name);
        let Ok(VolumeSource::Csi(source)) = &volume.source else {
            return Err(VolumeError::failed(format!("{what}: not a CSI volume")));
        };
        let ops =
            self.ops(&source.driver).map_err(|e| VolumeError::failed(format!("{what}: {}", e.message)))?;
        let context = device.publish_context.clone().into_iter().collect();
        let _guard = self.lock_device(device_key).await;
        let target = ops
            .publish(&csi_volume(source, &volume.pod_uid, &volume.name), &context)
            .await
            .map_err(|e| step_error(&what, &e))?;
        Ok(VolumeActual::published(target, device_key.clone(), MountState::Mounted))
    }

    async fn unstage(&self, device: &DeviceActual) -> Result<(), VolumeError> {
        let what = format!("unstaging CSI volume {:?} of driver {:?}", device.volume_handle, device.driver);
        let ops =
            self.ops(&device.driver).map_err(|e| VolumeError::failed(format!("{what}: {}", e.message)))?;
        let key = device_key(&device.driver, &device.volume_handle);
        let _guard = self.lock_device(&key).await;
        if let Some(user) = self.published_by(&device.driver, &device.volume_handle).await {
            return Err(VolumeError::failed(format!("{what}: still published by pod volume {user}")));
        }
        let csi = nodelet_csi::CsiVolume::filesystem(&device.driver, &device.volume_handle, "", "");
        ops.unstage(&csi).await.map_err(|e| step_error(&what, &e))
    }

    async fn detach(&self, device: &DeviceActual) -> Result<(), VolumeError> {
        let what = format!("detaching CSI volume {:?} of driver {:?}", device.volume_handle, device.driver);
        let ops =
            self.ops(&device.driver).map_err(|e| VolumeError::failed(format!("{what}: {}", e.message)))?;
        let csi = nodelet_csi::CsiVolume::filesystem(&device.driver, &device.volume_handle, "", "");
        ops.detach(&csi).await.map_err(|e| step_error(&what, &e))?;
        self.forget_device(&device_key(&device.driver, &device.volume_handle));
        Ok(())
    }
}

/// Pokes `tx` whenever the manifest objects or the claims change, until `shutdown`.
pub(crate) async fn forward_changes(
    mut objects: watch::Receiver<Arc<ManifestObjects>>,
    claims: nodelet_resources::claim::status::ClaimSubscription,
    tx: watch::Sender<()>,
    shutdown: CancellationToken,
) {
    let mut objects_open = true;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = objects.changed(), if objects_open => objects_open = r.is_ok(),
            () = claims.changed() => { claims.drain(); }
        }
        tx.send_replace(());
    }
}

/// How long one `NodeGetVolumeStats` call may take before the volume's stats are read with
/// `statvfs` instead.
const CSI_STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A mounted claim-backed volume whose stats are wanted.
struct StatsTarget {
    namespace: String,
    claim: String,
    path: std::path::PathBuf,
    /// For a CSI volume: its device (driver, volume handle, global mount).
    csi: Option<DeviceActual>,
    staging: std::path::PathBuf,
}

/// The stats of a CSI volume from its driver (`NodeGetVolumeStats`), with its condition
/// (`Some(abnormal)` when the driver reports one); `None` when the driver does not offer them,
/// is not registered, fails or reports no byte usage.
async fn csi_volume_stats(
    registry: &nodelet_csi::Registry,
    target: &StatsTarget,
) -> Option<(nodelet_resources::claim::metrics::FsStats, Option<bool>)> {
    let device = target.csi.as_ref()?;
    let driver = registry.get(&device.driver)?;
    if !driver.node_capabilities.get_volume_stats {
        return None;
    }
    let staging = (!target.staging.as_os_str().is_empty()).then_some(target.staging.as_path());
    let call = driver.client().node_get_volume_stats(&device.volume_handle, &target.path, staging);
    let stats = match tokio::time::timeout(CSI_STATS_TIMEOUT, call).await {
        Ok(Ok(stats)) => stats,
        Ok(Err(e)) => {
            tracing::debug!(driver = %device.driver, path = %target.path.display(), error = %e, "NodeGetVolumeStats failed");
            return None;
        }
        Err(_) => {
            tracing::debug!(driver = %device.driver, path = %target.path.display(), "NodeGetVolumeStats timed out");
            return None;
        }
    };
    let bytes = stats.bytes?;
    let inodes = stats.inodes.unwrap_or_default();
    let fs = nodelet_resources::claim::metrics::FsStats {
        capacity_bytes: bytes.total,
        available_bytes: bytes.available,
        used_bytes: bytes.used,
        inodes: inodes.total,
        inodes_free: inodes.available,
        inodes_used: inodes.used,
    };
    Some((fs, stats.condition.map(|(abnormal, _)| abnormal)))
}

/// Keeps `kubelet_volume_stats_*` for every mounted volume of a desired pod that comes from a
/// claim: at start, when volumes are set up or torn down, and every `period`
/// (`volumeStatsAggPeriod`). CSI
/// volumes are asked of their driver (`NodeGetVolumeStats`, with the volume's health when the
/// driver reports it) when it offers that; other volumes, and CSI volumes whose driver does not
/// answer, are measured with `statvfs`.
pub(crate) async fn claim_volume_stats(
    pods: Store<PodUid, DesiredPod>,
    actual: Store<VolumeKey, VolumeActual>,
    registry: Arc<nodelet_csi::Registry>,
    metrics: nodelet_resources::claim::metrics::ClaimMetrics,
    period: std::time::Duration,
    shutdown: CancellationToken,
) {
    let changes = actual.subscribe();
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            () = changes.changed() => { changes.drain(); }
        }
        let mut mounted = Vec::new();
        pods.for_each(|uid, pod| {
            for volume in pod.spec().volumes.iter().flatten() {
                let Some(claim) = &volume.persistent_volume_claim else { continue };
                let key = nodelet_resources::volume::desired::volume_key(uid, &volume.name);
                let Some(a) = actual.get(&key).filter(|a| a.is_mounted()) else { continue };
                let device = a.published_from().and_then(|d| actual.get(d));
                mounted.push(StatsTarget {
                    namespace: pod.namespace().to_owned(),
                    claim: claim.claim_name.clone(),
                    path: a.path.clone(),
                    csi: device.as_ref().and_then(|d| d.device().cloned()),
                    staging: device.map(|d| d.path.clone()).unwrap_or_default(),
                });
            }
        });
        if mounted.is_empty() {
            metrics.retain_volume_stats(&std::collections::BTreeSet::new());
            continue;
        }
        let mut stats = Vec::new();
        let mut by_statvfs = Vec::new();
        for target in mounted {
            match csi_volume_stats(&registry, &target).await {
                Some((fs, health)) => stats.push((target.namespace, target.claim, fs, health)),
                None => by_statvfs.push(target),
            }
        }
        let measured = tokio::task::spawn_blocking(move || {
            by_statvfs
                .into_iter()
                .filter_map(|t| match nodelet_storage::stats::fs_stats(&t.path) {
                    Ok(s) => Some((t.namespace, t.claim, s, None)),
                    Err(e) => {
                        tracing::debug!(path = %t.path.display(), error = %e, "no volume stats");
                        None
                    }
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        stats.extend(measured);
        let mut seen = std::collections::BTreeSet::new();
        for (ns, claim, s, health) in &stats {
            metrics.set_volume_stats(ns, claim, s);
            if let Some(abnormal) = health {
                metrics.set_volume_health(ns, claim, *abnormal);
            }
            seen.insert((ns.clone(), claim.clone()));
        }
        metrics.retain_volume_stats(&seen);
    }
}

/// Of the volumes found `gone` from the host, those that vanished behind nodelet's back: still desired, and
/// with the same actual record as when the host was looked at (a teardown that ended meanwhile, or one
/// whose pod went, removed the volume itself).
fn behind_our_back(
    gone: Vec<(VolumeKey, Arc<VolumeActual>)>,
    desired: &Store<VolumeKey, DesiredVolume>,
    actual: &Store<VolumeKey, VolumeActual>,
) -> Vec<(VolumeKey, Arc<VolumeActual>)> {
    gone.into_iter()
        .filter(|(k, seen)| {
            desired.contains_key(k) && actual.get(k).is_some_and(|now| Arc::ptr_eq(&now, seen))
        })
        .collect()
}

/// How often set-up volumes are checked against the host.
pub(crate) const VOLUME_CHECK_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the volume that `actual` describes is still there on the host: its directory exists and,
/// for tmpfs, bind and CSI volumes, is still a mount point. hostPath volumes are the host's own.
fn still_there(actual: &VolumeActual) -> bool {
    use nodelet_host::mounts::is_mount_point;
    match actual.plugin {
        Plugin::HostPath => true,
        Plugin::Csi if actual.path.as_os_str().is_empty() => true,
        Plugin::LocalVolume | Plugin::Csi => is_mount_point(&actual.path).unwrap_or(true),
        _ if actual.tmpfs => is_mount_point(&actual.path).unwrap_or(true),
        _ => actual.path.is_dir(),
    }
}

/// Every [`VOLUME_CHECK_PERIOD`], reports volumes that vanished behind nodelet's back (a tmpfs or
/// bind mount unmounted, a directory removed) as uncertain, so the volume reconciler sets them up
/// again (every setup is idempotent). A volume no longer in `desired` (its pod is going: the engine tears
/// it down) or whose actual record changed while the host was looked at (an operation of the engine's own
/// ended) is not reported. Stops at `shutdown`.
pub(crate) async fn watch_volumes(
    desired: Store<VolumeKey, DesiredVolume>,
    actual: Store<VolumeKey, VolumeActual>,
    observer: reconcile_engine::Observer<VolumeKey, VolumeActual>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(VOLUME_CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let observed_at = tokio::time::Instant::now();
        let mounted: Vec<(VolumeKey, Arc<VolumeActual>)> = actual
            .entries()
            .into_iter()
            .filter(|(k, a)| a.is_mounted() && a.plugin != Plugin::HostPath && desired.contains_key(k))
            .collect();
        if mounted.is_empty() {
            continue;
        }
        let gone = tokio::task::spawn_blocking(move || {
            mounted.into_iter().filter(|(_, a)| !still_there(a)).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let gone = behind_our_back(gone, &desired, &actual);
        for (key, a) in gone {
            tracing::warn!(volume = %key, path = %a.path.display(), "volume vanished from the host; setting it up again");
            let update = VolumeActual { state: MountState::Uncertain, ..(*a).clone() };
            if !observer.observe(key, reconcile_engine::Update::Set(update), observed_at) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(uid: &str) -> DesiredVolume {
        DesiredVolume {
            pod_uid: uid.into(),
            namespace: "default".into(),
            pod_name: "p".into(),
            name: "data".into(),
            plugin: Plugin::EmptyDir,
            source: Ok(VolumeSource::EmptyDir { memory: false, size_limit: None }),
            memory_limit: None,
            fs_group: None,
        }
    }

    fn mounted(path: &str) -> VolumeActual {
        VolumeActual {
            plugin: Plugin::EmptyDir,
            path: path.into(),
            state: MountState::Mounted,
            digest: None,
            tmpfs: false,
            csi: None,
        }
    }

    fn manifest_with_ca(content: &str) -> Arc<ManifestObjects> {
        let value = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ca", "namespace": "default"},
            "data": {"ca.crt": content},
        });
        let object = crate::sources::file::ManifestObject { file: "/m/ca.yaml".into(), value };
        Arc::new(ManifestObjects::from([("ConfigMap".to_owned(), vec![object])]))
    }

    #[test]
    fn the_volumes_of_static_pods_share_the_bytes_of_one_version_of_a_manifest_object() {
        let (tx, rx) = watch::channel(manifest_with_ca("first"));
        let renderer = ManifestRenderer::new(NodeObjects::new(rx, None));
        let volume: Volume =
            serde_json::from_value(serde_json::json!({"name": "ca", "configMap": {"name": "ca"}}))
                .expect("volume");
        let render = |uid: &str| {
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "namespace": "default", "uid": uid},
                "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": [volume.clone()]},
            }))
            .expect("pod");
            let pod = DesiredPod { pod, source: PodSource::File("/m/p.yaml".into()) };
            match renderer.render(&pod, &volume, Plugin::ConfigMap).expect("rendered") {
                VolumeSource::Files { files, .. } => files["ca.crt"].data.clone(),
                other => panic!("{other:?}"),
            }
        };
        let (a, b) = (render("a"), render("b"));
        assert_eq!(&a[..], b"first");
        assert_eq!(a.as_ptr(), b.as_ptr(), "one copy for both pods");
        // A new version of the directory: its bytes, shared again.
        tx.send_replace(manifest_with_ca("second"));
        let (c, d) = (render("c"), render("d"));
        assert_eq!(&c[..], b"second");
        assert_eq!(c.as_ptr(), d.as_ptr());
    }

    #[test]
    fn only_a_volume_still_desired_and_unchanged_since_the_look_vanished_behind_our_back() {
        let (desired_store, mut desired_writer) = reconcile_engine::store();
        let (actual, mut actual_writer) = reconcile_engine::store();
        for uid in ["kept", "going", "torn-down", "redone"] {
            actual_writer.insert(format!("{uid}/data"), mounted(&format!("/nowhere/{uid}")));
            if uid != "going" {
                desired_writer.insert(format!("{uid}/data"), desired(uid));
            }
        }
        // What the host check saw gone: all four, with the records it read.
        let gone: Vec<_> = actual.entries();
        // Meanwhile the engine's own operations ended: one volume's record removed, one's rewritten.
        actual_writer.remove(&"torn-down/data".to_string());
        actual_writer.insert("redone/data".into(), mounted("/nowhere/redone"));
        let vanished: Vec<VolumeKey> =
            behind_our_back(gone, &desired_store, &actual).into_iter().map(|(k, _)| k).collect();
        assert_eq!(vanished, ["kept/data"]);
    }
}
