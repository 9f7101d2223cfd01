//! The operations of the volume reconciler.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::Operation;

use super::desired::{DesiredVolume, Plugin};

/// One step on one (pod, volume). At most one runs per key at a time.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeOp {
    /// Make the volume ready for the pod's containers (create the directory, mount the tmpfs,
    /// check the host path, write the files). Idempotent: it also refreshes the files of a
    /// configMap/secret volume whose content changed.
    SetUp(Arc<DesiredVolume>),
    /// Undo [`SetUp`](VolumeOp::SetUp): unmount and remove the pod's volume directory. Never
    /// touches the host path of a hostPath volume.
    TearDown {
        /// The plugin.
        plugin: Plugin,
        /// The volume path recorded in the actual state.
        path: PathBuf,
    },
}

impl VolumeOp {
    /// The operation name in `storage_operation_duration_seconds` (the kubelet's names).
    pub fn operation_name(&self) -> &'static str {
        match self {
            VolumeOp::SetUp(_) => "volume_mount",
            VolumeOp::TearDown { .. } => "volume_unmount",
        }
    }

    /// The plugin the operation acts on.
    pub fn plugin(&self) -> Plugin {
        match self {
            VolumeOp::SetUp(v) => v.plugin,
            VolumeOp::TearDown { plugin, .. } => *plugin,
        }
    }
}

impl Operation for VolumeOp {
    fn kind(&self) -> &'static str {
        match self {
            VolumeOp::SetUp(_) => "set_up",
            VolumeOp::TearDown { .. } => "tear_down",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, VolumeOp::TearDown { .. })
    }

    fn timeout(&self) -> Option<Duration> {
        // The kubelet's per-operation bound for volume plugins.
        Some(Duration::from_secs(120))
    }
}
