//! Actual state of volumes: what is set up on the host for each (pod, volume), and for each CSI
//! device (attached, staged).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::desired::VolumeKey;

use crate::model::volumes::Plugin;

/// Whether a volume is known to be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountState {
    /// Set up and ready for containers (for a device: attached and staged).
    Mounted,
    /// An operation's result is unknown (it timed out, or failed half-way): maybe set up. The
    /// reconciler sets it up again (every setup is idempotent) or tears it down. A device that
    /// is only part of the way (attached, not yet staged) is uncertain too.
    Uncertain,
}

/// Where one step of a CSI device (attach or stage) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Not done, or undone.
    NotDone,
    /// Done, and known to be.
    Done,
    /// Maybe done: a call timed out or failed half-way, or nodelet restarted. The reconciler
    /// repeats the step (it is idempotent) or undoes it.
    Uncertain,
}

/// A CSI volume's device on this node: the actual state of a device key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceActual {
    /// The CSI driver.
    pub driver: String,
    /// The volume handle (the CSI `volume_id`).
    pub volume_handle: String,
    /// `ControllerPublishVolume` to this node (done at once for drivers that need no attach).
    pub attach: Step,
    /// `NodeStageVolume` at the global mount (done at once for drivers that do not stage).
    pub stage: Step,
    /// What `ControllerPublishVolume` returned, passed to the stage and publish calls. Empty
    /// until attached (and after a restart, until attached again: the call is idempotent).
    pub publish_context: BTreeMap<String, String>,
}

impl DeviceActual {
    /// The device of volume `volume_handle` of `driver` with both steps at `steps` and no
    /// publish context (a device not yet attached: `NotDone`; one found again after a restart:
    /// `Uncertain`).
    pub fn new(driver: &str, volume_handle: &str, steps: Step) -> Self {
        DeviceActual {
            driver: driver.to_owned(),
            volume_handle: volume_handle.to_owned(),
            attach: steps,
            stage: steps,
            publish_context: BTreeMap::new(),
        }
    }
}

/// What a CSI entry of the actual store is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsiActual {
    /// A pod's volume, published from the device with this key.
    Published {
        /// The device's key.
        device: VolumeKey,
    },
    /// A device.
    Device(DeviceActual),
}

/// One volume as it exists on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeActual {
    /// The plugin.
    pub plugin: Plugin,
    /// The path containers bind-mount: `<root>/pods/<uid>/volumes/<plugin dir>/<name>`, or the
    /// host path of a hostPath volume. For a CSI device, its global mount (empty when the driver
    /// does not stage, or before it is staged).
    pub path: PathBuf,
    /// Set up, or maybe.
    pub state: MountState,
    /// The content digest written (configMap, secret, downwardAPI, projected); `None` when
    /// unknown (reconstructed after a restart).
    pub digest: Option<String>,
    /// Whether a tmpfs is mounted at `path` (a Memory emptyDir; a secret, downwardAPI or projected
    /// volume).
    pub tmpfs: bool,
    /// For CSI entries: the device a pod volume is published from, or the device's own state.
    pub csi: Option<Arc<CsiActual>>,
}

impl VolumeActual {
    /// Whether containers may use it (for a device: whether pods may publish from it).
    pub fn is_mounted(&self) -> bool {
        self.state == MountState::Mounted
    }

    /// The device state, for a device entry.
    pub fn device(&self) -> Option<&DeviceActual> {
        match self.csi.as_deref() {
            Some(CsiActual::Device(d)) => Some(d),
            _ => None,
        }
    }

    /// The key of the device a CSI pod volume is published from.
    pub fn published_from(&self) -> Option<&VolumeKey> {
        match self.csi.as_deref() {
            Some(CsiActual::Published { device }) => Some(device),
            _ => None,
        }
    }

    /// A CSI pod volume published at `path` from the device `device` (its key).
    pub fn published(path: PathBuf, device: VolumeKey, state: MountState) -> Self {
        Self::csi_entry(path, state, CsiActual::Published { device })
    }

    fn csi_entry(path: PathBuf, state: MountState, csi: CsiActual) -> Self {
        VolumeActual {
            plugin: Plugin::Csi,
            path,
            state,
            digest: None,
            tmpfs: false,
            csi: Some(Arc::new(csi)),
        }
    }

    /// The actual value of a device in state `device`, staged at `path`: mounted when attached
    /// and staged, else uncertain.
    pub fn of_device(device: DeviceActual, path: PathBuf) -> Self {
        let state = if device.attach == Step::Done && device.stage == Step::Done {
            MountState::Mounted
        } else {
            MountState::Uncertain
        };
        Self::csi_entry(path, state, CsiActual::Device(device))
    }
}
