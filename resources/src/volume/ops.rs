//! The operations of the volume reconciler.
//!
//! Pod volumes are set up and torn down in one step each. A CSI volume goes through the
//! kubelet's steps, each on its own key: its device is attached ([`VolumeOp::Attach`]) and staged
//! ([`VolumeOp::Stage`]) once for the node, then published into each pod that uses it
//! ([`VolumeOp::Publish`]); on the way back each pod's volume is unpublished
//! ([`VolumeOp::TearDown`]), and when no pod uses the device any more it is unstaged
//! ([`VolumeOp::Unstage`]) and detached ([`VolumeOp::Detach`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::Operation;

use super::actual::{DeviceActual, VolumeActual};
use super::desired::{CsiSource, DesiredVolume, VolumeKey};
use crate::model::volumes::Plugin;

/// One step on one key. At most one runs per key at a time.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeOp {
    /// Make the volume ready for the pod's containers (create the directory, mount the tmpfs,
    /// check the host path, write the files). Idempotent: it also refreshes the files of a
    /// configMap/secret volume whose content changed.
    SetUp(Arc<DesiredVolume>),
    /// Undo [`SetUp`](VolumeOp::SetUp) or [`Publish`](VolumeOp::Publish): unmount and remove the
    /// pod's volume directory. Never touches the host path of a hostPath volume.
    TearDown {
        /// The plugin.
        plugin: Plugin,
        /// The volume path recorded in the actual state.
        path: PathBuf,
    },
    /// `ControllerPublishVolume` of a CSI volume's device to this node (nothing for drivers that
    /// need no attach).
    Attach {
        /// The volume.
        source: Arc<CsiSource>,
        /// The device's actual value before the step, if any.
        prior: Option<Arc<VolumeActual>>,
    },
    /// `NodeStageVolume` of an attached device at its global mount (nothing for drivers that do
    /// not stage).
    Stage {
        /// The volume.
        source: Arc<CsiSource>,
        /// The device's actual value before the step (attached).
        prior: Arc<VolumeActual>,
    },
    /// `NodePublishVolume` of a CSI pod volume from its staged device.
    Publish {
        /// The pod's volume.
        volume: Arc<DesiredVolume>,
        /// The device's key.
        device_key: VolumeKey,
        /// The device (attached and staged).
        device: Arc<DeviceActual>,
    },
    /// `NodeUnstageVolume` of a device no pod publishes any more.
    Unstage {
        /// The device's actual value before the step.
        prior: Arc<VolumeActual>,
    },
    /// `ControllerUnpublishVolume` of an unstaged device; the device is then gone.
    Detach {
        /// The device's actual value before the step.
        prior: Arc<VolumeActual>,
    },
}

impl VolumeOp {
    /// The operation name in `storage_operation_duration_seconds` (the kubelet's names).
    pub fn operation_name(&self) -> &'static str {
        match self {
            VolumeOp::SetUp(_) | VolumeOp::Publish { .. } => "volume_mount",
            VolumeOp::TearDown { .. } => "volume_unmount",
            VolumeOp::Attach { .. } => "volume_attach",
            VolumeOp::Stage { .. } => "mount_device",
            VolumeOp::Unstage { .. } => "unmount_device",
            VolumeOp::Detach { .. } => "volume_detach",
        }
    }

    /// The plugin the operation acts on.
    pub fn plugin(&self) -> Plugin {
        match self {
            VolumeOp::SetUp(v) => v.plugin,
            VolumeOp::TearDown { plugin, .. } => *plugin,
            _ => Plugin::Csi,
        }
    }
}

impl Operation for VolumeOp {
    fn kind(&self) -> &'static str {
        match self {
            VolumeOp::SetUp(_) => "set_up",
            VolumeOp::TearDown { .. } => "tear_down",
            VolumeOp::Attach { .. } => "attach",
            VolumeOp::Stage { .. } => "stage",
            VolumeOp::Publish { .. } => "publish",
            VolumeOp::Unstage { .. } => "unstage",
            VolumeOp::Detach { .. } => "detach",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, VolumeOp::TearDown { .. } | VolumeOp::Unstage { .. } | VolumeOp::Detach { .. })
    }

    fn timeout(&self) -> Option<Duration> {
        // The kubelet's per-operation bound for volume plugins (and CSI's per-call timeout).
        Some(Duration::from_secs(120))
    }
}
