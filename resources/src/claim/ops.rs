//! The operations of the claim reconciler. Each carries everything the driver needs (the driver
//! does not read the stores), and each is idempotent.

use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::Operation;

use super::actual::{PvActual, PvcActual};
use super::driver::ProvisionRequest;
use k8s_openapi::api::core::v1::PersistentVolume;

/// One step on one volume or claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOp {
    /// Volume side of a binding: record the claim in the volume (phase Bound). Also re-marks a
    /// volume Bound.
    BindVolume(PvActual),
    /// Undo a binding the binder made whose claim ended up bound to another volume (phase
    /// Available).
    UnbindVolume,
    /// The volume's claim is gone: phase Released.
    ReleaseVolume(PvActual),
    /// Reclaiming cannot work (no deleter, `Recycle`): phase Failed with the reason.
    FailVolume(PvActual),
    /// Reclaim policy `Delete`: the provisioner deletes the storage; the record then says so.
    DeleteVolume {
        /// The volume.
        pv: Arc<PersistentVolume>,
        /// The provisioner that deletes it.
        provisioner: String,
        /// The record afterwards.
        after: PvActual,
    },
    /// Claim side of a binding: record the volume in the claim (phase Bound).
    BindClaim(PvcActual),
    /// The claim's volume is gone or bound elsewhere: phase Lost.
    LoseClaim(PvcActual),
    /// Create a volume for the claim through a provisioner.
    Provision(Arc<ProvisionRequest>),
    /// The object is gone from desired state: drop its record.
    Forget,
}

impl ClaimOp {
    /// The operation name in `storage_operation_duration_seconds`, for the operations that
    /// touch storage.
    pub fn storage_operation(&self) -> Option<&'static str> {
        match self {
            ClaimOp::Provision(_) => Some("volume_provision"),
            ClaimOp::DeleteVolume { .. } => Some("volume_delete"),
            _ => None,
        }
    }
}

impl Operation for ClaimOp {
    fn kind(&self) -> &'static str {
        match self {
            ClaimOp::BindVolume(_) => "bind_volume",
            ClaimOp::UnbindVolume => "unbind_volume",
            ClaimOp::ReleaseVolume(_) => "release_volume",
            ClaimOp::FailVolume(_) => "fail_volume",
            ClaimOp::DeleteVolume { .. } => "delete_volume",
            ClaimOp::BindClaim(_) => "bind_claim",
            ClaimOp::LoseClaim(_) => "lose_claim",
            ClaimOp::Provision(_) => "provision",
            ClaimOp::Forget => "forget",
        }
    }

    /// Everything that follows from an object having gone (release, reclaim, loss, forgetting)
    /// waits until the desired state has loaded once: a half-read manifest directory never
    /// releases or deletes volumes.
    fn is_teardown(&self) -> bool {
        matches!(
            self,
            ClaimOp::ReleaseVolume(_)
                | ClaimOp::DeleteVolume { .. }
                | ClaimOp::LoseClaim(_)
                | ClaimOp::Forget
                | ClaimOp::FailVolume(_)
        )
    }

    fn timeout(&self) -> Option<Duration> {
        match self {
            // A provisioner's own calls are bounded at 2 minutes (CSI); leave it room.
            ClaimOp::Provision(_) | ClaimOp::DeleteVolume { .. } => Some(Duration::from_secs(150)),
            _ => Some(Duration::from_secs(30)),
        }
    }
}
