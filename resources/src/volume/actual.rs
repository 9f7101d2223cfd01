//! Actual state of volumes: what is set up on the host for each (pod, volume).

use std::path::PathBuf;

use super::desired::Plugin;

/// Whether a volume is known to be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountState {
    /// Set up and ready for containers.
    Mounted,
    /// An operation's result is unknown (it timed out, or failed half-way): maybe set up. The
    /// reconciler sets it up again (every setup is idempotent) or tears it down.
    Uncertain,
}

/// One volume as it exists on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeActual {
    /// The plugin.
    pub plugin: Plugin,
    /// The path containers bind-mount: `<root>/pods/<uid>/volumes/<plugin dir>/<name>`, or the
    /// host path of a hostPath volume.
    pub path: PathBuf,
    /// Set up, or maybe.
    pub state: MountState,
    /// The content digest written (configMap, secret, downwardAPI, projected); `None` when
    /// unknown (reconstructed after a restart).
    pub digest: Option<String>,
    /// Whether a tmpfs is mounted at `path` (a Memory emptyDir, a secret).
    pub tmpfs: bool,
}

impl VolumeActual {
    /// Whether containers may use it.
    pub fn is_mounted(&self) -> bool {
        self.state == MountState::Mounted
    }
}
