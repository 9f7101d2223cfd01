//! Discovery of CSI drivers by their sockets in a plugin registration directory.
//!
//! The kubelet layout: every node plugin puts a unix socket into `<root-dir>/plugins_registry/`
//! ([`default_registration_dir`]). A socket there is first asked the kubelet's plugin registration
//! `GetInfo` (what `node-driver-registrar` serves at `<driver>-reg.sock`): a CSI plugin with a 1.x
//! version and an endpoint is discovered at that endpoint, must call itself by the registered name, and
//! is told the outcome with `NotifyRegistrationStatus`. A socket that does not serve the registration
//! protocol is taken as a plain CSI socket (nodelet's own drivers need no registrar). For each driver
//! it calls `GetPluginInfo`, `Probe`, `GetPluginCapabilities`, `NodeGetInfo`, `NodeGetCapabilities` and,
//! for drivers with the Controller service, `ControllerGetCapabilities`, and remembers the driver by
//! name. A socket in the directory that vanishes (or is replaced by a new one at the same path) drops
//! its driver; a replaced socket is discovered again. Sockets that fail are retried on the next scan, as
//! are drivers whose `Probe` says "not ready".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::{
    ControllerCapabilities, CsiClient, CsiClientConfig, NodeCapabilities, NodeInfo, PluginCapabilities,
    PluginInfo,
};
use crate::error::CsiError;
use crate::registration::RegistrationSocket;

/// Name of the registration directory under the root dir (the kubelet's
/// `DefaultKubeletPluginsRegistrationDirName`).
pub const REGISTRATION_DIR_NAME: &str = "plugins_registry";
/// How deep below the registration directory sockets are looked for (the directory itself is depth 1).
const MAX_DEPTH: usize = 3;
/// Deadline of each discovery call: a driver that takes longer to answer `GetPluginInfo` is retried on the
/// next scan instead of holding the scan for the full 2-minute call timeout.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// `<root_dir>/plugins_registry`.
pub fn default_registration_dir(root_dir: &Path) -> PathBuf {
    root_dir.join(REGISTRATION_DIR_NAME)
}

/// Errors of [`Registry::scan`] itself (per-socket failures are reported in [`ScanReport::failed`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The registration directory (or a subdirectory) could not be read.
    #[error("cannot read plugin registration directory {dir}: {source}")]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A discovered CSI driver: what it said about itself and a client for its socket.
#[derive(Debug)]
pub struct Driver {
    /// `GetPluginInfo`.
    pub info: PluginInfo,
    /// The socket it was found at.
    pub socket: PathBuf,
    /// `GetPluginCapabilities`.
    pub plugin_capabilities: PluginCapabilities,
    /// `NodeGetInfo`.
    pub node: NodeInfo,
    /// `NodeGetCapabilities`.
    pub node_capabilities: NodeCapabilities,
    /// `ControllerGetCapabilities`, for drivers with the `CONTROLLER_SERVICE` capability.
    pub controller_capabilities: Option<ControllerCapabilities>,
    /// The registration socket it was registered through (`None`: found as a plain CSI socket).
    pub registered_through: Option<PathBuf>,
    client: CsiClient,
    /// The socket in the registration directory that stands for the driver (the registration socket,
    /// else the driver's own), and its (dev, inode).
    watched: PathBuf,
    socket_id: (u64, u64),
}

impl Driver {
    /// Connects to `socket` and asks the driver who it is and what it can do. Each call has
    /// `discovery_timeout` as deadline; the returned driver's [`client`](Self::client) uses `config`.
    /// Fails if the driver is not ready (a [`CsiError::Status`] with code `UNAVAILABLE`).
    pub async fn discover(
        socket: &Path,
        config: CsiClientConfig,
        discovery_timeout: Duration,
    ) -> Result<Self, CsiError> {
        let socket_id = socket_id(socket)
            .await
            .map_err(|e| CsiError::Connect { socket: socket.display().to_string(), reason: e.to_string() })?;
        let probe_config = CsiClientConfig {
            call_timeout: discovery_timeout.min(config.call_timeout),
            connect_timeout: discovery_timeout.min(config.connect_timeout),
        };
        let probe_client = CsiClient::connect(socket, probe_config).await?;
        let info = probe_client.plugin_info().await?;
        if !probe_client.probe().await? {
            return Err(CsiError::Status {
                call: "Probe",
                code: tonic::Code::Unavailable,
                message: format!("driver {} is not ready", info.name),
            });
        }
        let plugin_capabilities = probe_client.plugin_capabilities().await?;
        let node = probe_client.node_info().await?;
        let node_capabilities = probe_client.node_capabilities().await?;
        let controller_capabilities = if plugin_capabilities.controller_service {
            Some(probe_client.controller_capabilities().await?)
        } else {
            None
        };
        let client = CsiClient::connect_lazy(socket, config)?;
        Ok(Driver {
            info,
            socket: socket.to_path_buf(),
            plugin_capabilities,
            node,
            node_capabilities,
            controller_capabilities,
            registered_through: None,
            client,
            watched: socket.to_path_buf(),
            socket_id,
        })
    }

    /// Registers the driver a registration socket (of the kubelet's plugin registration protocol)
    /// points at: `GetInfo`, validation, discovery at the endpoint (the driver must call itself by the
    /// registered name), then `NotifyRegistrationStatus` with the outcome. `Ok(None)` when the socket
    /// does not serve the registration protocol.
    pub async fn register(
        reg_socket: &Path,
        config: CsiClientConfig,
        discovery_timeout: Duration,
    ) -> Result<Option<Self>, CsiError> {
        let registration = RegistrationSocket::connect(reg_socket, discovery_timeout).await?;
        let (kind, name, endpoint, versions) = match registration.info().await {
            Ok(info) => info,
            Err(CsiError::Status { code: tonic::Code::Unimplemented, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let outcome = match crate::registration::validate(&kind, &name, &endpoint, &versions) {
            Err(e) => {
                Err(CsiError::Connect { socket: reg_socket.display().to_string(), reason: e.to_string() })
            }
            Ok(valid) => match Self::discover(&valid.endpoint, config, discovery_timeout).await {
                Ok(driver) if driver.name() != valid.name => Err(CsiError::Connect {
                    socket: valid.endpoint.display().to_string(),
                    reason: format!(
                        "the driver calls itself {:?}, its registrar {:?}",
                        driver.name(),
                        valid.name
                    ),
                }),
                other => other,
            },
        };
        let reg_id = socket_id(reg_socket).await.map_err(|e| CsiError::Connect {
            socket: reg_socket.display().to_string(),
            reason: e.to_string(),
        })?;
        match outcome {
            Ok(mut driver) => {
                registration.notify(true, "").await?;
                driver.registered_through = Some(reg_socket.to_path_buf());
                driver.watched = reg_socket.to_path_buf();
                driver.socket_id = reg_id;
                Ok(Some(driver))
            }
            Err(e) => {
                if let Err(notify) = registration.notify(false, &e.to_string()).await {
                    tracing::debug!(socket = %reg_socket.display(), error = %notify, "NotifyRegistrationStatus failed");
                }
                Err(e)
            }
        }
    }

    /// The driver name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// A client for the driver's socket (clone it freely).
    pub fn client(&self) -> &CsiClient {
        &self.client
    }

    /// The driver needs `ControllerPublishVolume` before the node calls (`PUBLISH_UNPUBLISH_VOLUME`).
    pub fn requires_controller_publish(&self) -> bool {
        self.controller_capabilities.as_ref().is_some_and(|c| c.publish_unpublish_volume)
    }

    /// The driver provisions volumes (`CREATE_DELETE_VOLUME`).
    pub fn can_create_volumes(&self) -> bool {
        self.controller_capabilities.as_ref().is_some_and(|c| c.create_delete_volume)
    }

    /// The driver needs `NodeStageVolume` before `NodePublishVolume` (`STAGE_UNSTAGE_VOLUME`).
    pub fn requires_stage(&self) -> bool {
        self.node_capabilities.stage_unstage_volume
    }
}

/// What one [`Registry::scan`] changed.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Drivers registered by this scan (names).
    pub added: Vec<String>,
    /// Drivers dropped by this scan because their socket vanished or was replaced (names).
    pub removed: Vec<String>,
    /// Sockets that were not (yet) registered, with the reason; they are tried again on the next scan.
    pub failed: Vec<(PathBuf, String)>,
}

impl ScanReport {
    /// The scan changed the set of drivers.
    pub fn changed(&self) -> bool {
        !self.added.is_empty() || !self.removed.is_empty()
    }
}

/// The CSI drivers registered on this node, by name.
///
/// [`scan`](Self::scan) reconciles it with the registration directory; [`watcher`](Self::watcher)
/// scans periodically. [`subscribe`](Self::subscribe) wakes a consumer (the daemon copies the drivers
/// into a store the claim engine watches) whenever the set of drivers changes;
/// [`scanned`](Self::scanned) waits for the first scan.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    config: CsiClientConfig,
    discovery_timeout: Duration,
    drivers: Mutex<BTreeMap<String, Arc<Driver>>>,
    generation: watch::Sender<u64>,
    /// A scan has finished.
    scanned: watch::Sender<bool>,
}

impl Registry {
    /// A registry of the drivers whose sockets are in `dir` (see [`default_registration_dir`]); their
    /// clients use `config`. Nothing is scanned yet.
    pub fn new(dir: impl Into<PathBuf>, config: CsiClientConfig) -> Self {
        Registry {
            dir: dir.into(),
            config,
            discovery_timeout: DEFAULT_DISCOVERY_TIMEOUT,
            drivers: Mutex::new(BTreeMap::new()),
            generation: watch::Sender::new(0),
            scanned: watch::Sender::new(false),
        }
    }

    /// Sets the deadline of each discovery call (default [`DEFAULT_DISCOVERY_TIMEOUT`]).
    pub fn with_discovery_timeout(mut self, timeout: Duration) -> Self {
        self.discovery_timeout = timeout;
        self
    }

    /// The registration directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The driver registered under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Driver>> {
        self.lock().get(name).cloned()
    }

    /// All registered drivers, ordered by name.
    pub fn drivers(&self) -> Vec<Arc<Driver>> {
        self.lock().values().cloned().collect()
    }

    /// A receiver whose value (a generation counter) changes whenever drivers are added or removed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Whether a [`scan`](Self::scan) has finished: the drivers are those found in the registration
    /// directory, not only none found yet.
    pub fn has_scanned(&self) -> bool {
        *self.scanned.borrow()
    }

    /// Waits until a [`scan`](Self::scan) has finished (at once if one has).
    pub async fn scanned(&self) {
        let mut scanned = self.scanned.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while this borrows it.
        let _ = scanned.wait_for(|s| *s).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Driver>>> {
        self.drivers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reconciles the registered drivers with the sockets in the registration directory: drops drivers
    /// whose socket is gone or was replaced, and discovers sockets not registered yet. A missing directory
    /// counts as empty.
    pub async fn scan(&self) -> Result<ScanReport, RegistryError> {
        let sockets = list_sockets(&self.dir).await?;
        let mut report = ScanReport::default();

        // Drop drivers whose socket vanished or is now a different file.
        {
            let mut drivers = self.lock();
            let gone: Vec<String> = drivers
                .iter()
                .filter(|(_, d)| sockets.get(&d.watched) != Some(&d.socket_id))
                .map(|(name, _)| name.clone())
                .collect();
            for name in gone {
                if let Some(d) = drivers.remove(&name) {
                    tracing::info!(driver = %name, socket = %d.socket.display(), "CSI driver unregistered");
                }
                report.removed.push(name);
            }
        }

        let known: HashSet<PathBuf> = self.lock().values().map(|d| d.watched.clone()).collect();
        let mut candidates: Vec<&PathBuf> = sockets.keys().filter(|s| !known.contains(*s)).collect();
        candidates.sort();
        for socket in candidates {
            let found = match Driver::register(socket, self.config.clone(), self.discovery_timeout).await {
                Ok(Some(driver)) => Ok(driver),
                Ok(None) => Driver::discover(socket, self.config.clone(), self.discovery_timeout).await,
                Err(e) => Err(e),
            };
            match found {
                Ok(driver) => {
                    let name = driver.name().to_owned();
                    let mut drivers = self.lock();
                    if let Some(existing) = drivers.get(&name) {
                        let reason = format!(
                            "driver name {name} is already registered from {}",
                            existing.socket.display()
                        );
                        tracing::warn!(socket = %socket.display(), "{reason}");
                        report.failed.push((socket.clone(), reason));
                        continue;
                    }
                    tracing::info!(
                        driver = %name,
                        version = %driver.info.vendor_version,
                        node_id = %driver.node.node_id,
                        socket = %socket.display(),
                        "CSI driver registered"
                    );
                    drivers.insert(name.clone(), Arc::new(driver));
                    report.added.push(name);
                }
                Err(e) => {
                    tracing::debug!(socket = %socket.display(), error = %e, "socket is not a usable CSI driver");
                    report.failed.push((socket.clone(), e.to_string()));
                }
            }
        }
        if report.changed() {
            self.generation.send_modify(|g| *g = g.wrapping_add(1));
        }
        self.scanned.send_if_modified(|s| !std::mem::replace(s, true));
        Ok(report)
    }

    /// Scans every `period` until `cancel` fires, logging failures. The first scan runs at once. The
    /// returned future is the watcher, for the caller to spawn (the daemon runs it on its supervisor).
    pub fn watcher(
        self: &Arc<Self>,
        period: Duration,
        cancel: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let registry = Arc::clone(self);
        async move {
            let mut last_failed: HashMap<PathBuf, String> = HashMap::new();
            loop {
                match registry.scan().await {
                    Ok(report) => {
                        // Log a socket's failure once per distinct reason, not on every scan.
                        let failed: HashMap<PathBuf, String> = report.failed.into_iter().collect();
                        for (socket, reason) in &failed {
                            if last_failed.get(socket) != Some(reason) {
                                tracing::warn!(socket = %socket.display(), %reason, "CSI socket not registered");
                            }
                        }
                        last_failed = failed;
                    }
                    Err(e) => tracing::warn!(error = %e, "CSI plugin registration scan failed"),
                }
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(period) => {}
                }
            }
        }
    }
}

async fn socket_id(path: &Path) -> std::io::Result<(u64, u64)> {
    let meta = tokio::fs::symlink_metadata(path).await?;
    Ok((meta.dev(), meta.ino()))
}

/// The unix sockets below `dir` (not following symlinks, skipping dot-names), with their (dev, inode).
async fn list_sockets(dir: &Path) -> Result<HashMap<PathBuf, (u64, u64)>, RegistryError> {
    let mut found = HashMap::new();
    let mut pending = vec![(dir.to_path_buf(), 1usize)];
    while let Some((current, depth)) = pending.pop() {
        let mut entries = match tokio::fs::read_dir(&current).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(RegistryError::ReadDir { dir: current, source }),
        };
        loop {
            let entry = match entries.next_entry().await {
                Ok(Some(entry)) => entry,
                Ok(None) => break,
                Err(source) => return Err(RegistryError::ReadDir { dir: current.clone(), source }),
            };
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            // `DirEntry::metadata` does not follow symlinks.
            let Ok(meta) = entry.metadata().await else { continue };
            let file_type = meta.file_type();
            if file_type.is_socket() {
                found.insert(entry.path(), (meta.dev(), meta.ino()));
            } else if file_type.is_dir() && depth < MAX_DEPTH {
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    Ok(found)
}
