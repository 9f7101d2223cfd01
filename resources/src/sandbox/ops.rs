//! The operations of the sandbox reconciler.

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::Operation;

use super::desired::SandboxSpec;

/// One step on one pod's sandboxes. At most one runs per pod at a time.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxOp {
    /// Read the pod's sandboxes from the runtime again (after an operation whose result is unknown).
    Refresh,
    /// Create and start a sandbox (network included).
    Create {
        /// What it is for.
        spec: Arc<SandboxSpec>,
        /// Which sandbox attempt of the pod this is (0 for the first).
        attempt: u32,
    },
    /// Stop sandboxes (their network is torn down); they stay for logs and status.
    Stop {
        /// Their IDs.
        ids: Vec<String>,
    },
    /// Stop and remove every sandbox of a pod that is gone.
    Remove {
        /// Their IDs.
        ids: Vec<String>,
    },
    /// Remove dead sandboxes of a pod that is still desired, as the kubelet's container GC does
    /// (see [`dead_sandboxes`](crate::model::actual::dead_sandboxes)).
    Prune {
        /// Their IDs.
        ids: Vec<String>,
    },
}

impl Operation for SandboxOp {
    fn kind(&self) -> &'static str {
        match self {
            SandboxOp::Refresh => "refresh",
            SandboxOp::Create { .. } => "create_sandbox",
            SandboxOp::Stop { .. } => "stop_sandbox",
            SandboxOp::Remove { .. } => "remove_sandbox",
            SandboxOp::Prune { .. } => "prune_sandboxes",
        }
    }

    fn is_teardown(&self) -> bool {
        matches!(self, SandboxOp::Remove { .. })
    }

    fn timeout(&self) -> Option<Duration> {
        match self {
            // The kubelet gives RunPodSandbox twice the runtime request timeout.
            SandboxOp::Create { .. } => Some(Duration::from_secs(240)),
            SandboxOp::Stop { .. } | SandboxOp::Remove { .. } | SandboxOp::Prune { .. } => {
                Some(Duration::from_secs(120))
            }
            SandboxOp::Refresh => None,
        }
    }
}
