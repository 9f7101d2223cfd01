//! CSI v1 client for nodelet: driver discovery, calls with deadlines and typed outcomes, and the kubelet's
//! order of calls and directory layout for one volume.
//!
//! * [`Registry`] discovers node plugins by their unix sockets in the plugin registration directory
//!   (`<root-dir>/plugins_registry`, [`default_registration_dir`]): registration sockets of the kubelet's
//!   plugin registration protocol (what `node-driver-registrar` serves, [`RegistrationSocket`]) point it at
//!   the driver's own socket; plain CSI sockets there are taken as they are. It asks each driver for
//!   `GetPluginInfo`, `Probe`, capabilities and `NodeGetInfo`, and keeps them by name;
//!   [`Registry::watcher`] (a future for the caller to spawn) rescans periodically, dropping drivers whose socket vanished.
//! * [`CsiClient`] speaks the Identity, Node and Controller services ([`nodelet_proto::csi::v1`]) over one
//!   shared connection, every call with a deadline (2 minutes, the kubelet's `csiTimeout`).
//! * [`CsiError::is_uncertain`] classifies failures as the kubelet does: after a timeout, `UNAVAILABLE`,
//!   `CANCELLED`, `ABORTED`, `RESOURCE_EXHAUSTED` or a transport error the operation may have happened, so
//!   the volume reconciler must treat an uncertain stage or publish as "maybe mounted".
//! * [`VolumeOps`] runs attach → stage → publish and unpublish → unstage → detach for one volume, skipping
//!   what the driver's capabilities say it does not need, at the kubelet's paths ([`VolumeLayout`]).
//!
//! ```no_run
//! use std::path::Path;
//! use nodelet_csi::{CsiClientConfig, CsiVolume, Registry, VolumeLayout, VolumeOps, default_registration_dir};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let root = Path::new("/var/lib/nodelet");
//! let registry = Registry::new(default_registration_dir(root), CsiClientConfig::default());
//! registry.scan().await?;
//! let driver = registry.get("hostpath.csi.nodelet.dev").ok_or("driver not registered")?;
//! let ops = VolumeOps::new(driver, VolumeLayout::new(root));
//! let volume = CsiVolume::filesystem("hostpath.csi.nodelet.dev", "vol-1", "pod-uid", "data");
//! match ops.set_up(&volume).await {
//!     Ok(target) => println!("mounted at {}", target.display()),
//!     // The volume may be mounted: remember it, and tear it down or retry later.
//!     Err(e) if e.is_uncertain() => eprintln!("maybe mounted: {e}"),
//!     Err(e) => eprintln!("not mounted: {e}"),
//! }
//! # Ok(()) }
//! ```

mod client;
mod error;
mod ops;
mod registration;
mod registry;

pub use client::{
    ControllerCapabilities, CsiClient, CsiClientConfig, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    NodeCapabilities, NodeInfo, PluginCapabilities, PluginInfo, Usage, VolumeStats, socket_path,
    validate_driver_name,
};
pub use error::{CsiError, Result};
pub use nodelet_proto::csi::v1 as proto;
pub use ops::{
    CSI_PLUGIN_DIR_NAME, CSI_PLUGIN_NAME, CsiVolume, GLOBAL_MOUNT_DIR_NAME, Operation, POD_MOUNT_DIR_NAME,
    VOL_DATA_FILE_NAME, VolData, VolumeLayout, VolumeOpError, VolumeOps, mount_capability, read_vol_data,
    volume_handle_hash,
};
pub use registration::{
    CSI_PLUGIN_TYPE, Registration, RegistrationError, RegistrationSocket, validate as validate_registration,
};
pub use registry::{
    DEFAULT_DISCOVERY_TIMEOUT, Driver, REGISTRATION_DIR_NAME, Registry, RegistryError, ScanReport,
    default_registration_dir,
};
