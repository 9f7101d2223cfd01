//! Actual state of claims and volumes: the binding, as the binder recorded it. Every record is
//! persisted by the driver, so a restart never binds a claim to a different volume.

use serde::{Deserialize, Serialize};

use super::desired::ClaimRef;

/// The phase of a PersistentVolume (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VolumePhase {
    /// Free for a claim.
    Available,
    /// Bound to a claim.
    Bound,
    /// Its claim was deleted; the reclaim policy decides what happens.
    Released,
    /// Reclaiming failed.
    Failed,
}

impl VolumePhase {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumePhase::Available => "Available",
            VolumePhase::Bound => "Bound",
            VolumePhase::Released => "Released",
            VolumePhase::Failed => "Failed",
        }
    }
}

/// The phase of a PersistentVolumeClaim (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimPhase {
    /// Not bound yet.
    Pending,
    /// Bound to a volume.
    Bound,
    /// Its volume is gone.
    Lost,
}

impl ClaimPhase {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimPhase::Pending => "Pending",
            ClaimPhase::Bound => "Bound",
            ClaimPhase::Lost => "Lost",
        }
    }
}

/// The volume side of a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvActual {
    /// The claim the volume is bound to (`spec.claimRef` as the PV controller sets it).
    pub claim_ref: Option<ClaimRef>,
    /// Whether the binder chose the claim (not a pre-binding in the volume's spec); such a
    /// binding is undone if the claim ends up bound elsewhere.
    pub bound_by_controller: bool,
    /// The phase.
    pub phase: VolumePhase,
    /// Why the volume is in its phase (a failed reclaim).
    pub message: Option<String>,
    /// The reclaim policy `Delete` deleted the volume's storage.
    pub deleted: bool,
}

impl PvActual {
    /// A volume bound to `claim`.
    pub fn bound(claim: ClaimRef, bound_by_controller: bool) -> Self {
        Self {
            claim_ref: Some(claim),
            bound_by_controller,
            phase: VolumePhase::Bound,
            message: None,
            deleted: false,
        }
    }
}

/// The claim side of a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvcActual {
    /// The claim UID the record belongs to.
    pub uid: String,
    /// The volume the claim is bound to (`spec.volumeName` as the PV controller sets it).
    pub volume: Option<String>,
    /// The phase.
    pub phase: ClaimPhase,
    /// The volume a provisioner was asked to create for the claim, and whether it finished.
    pub provisioned: Option<Provisioned>,
}

/// A dynamic provisioning started for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provisioned {
    /// The volume name (`pvc-<claim uid>`).
    pub volume: String,
    /// Whether the provisioner returned the volume (else the result is unknown and provisioning
    /// runs again: provisioners are idempotent).
    pub done: bool,
}

/// One entry of the actual claim store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimActual {
    /// The volume side.
    Volume(PvActual),
    /// The claim side.
    Claim(PvcActual),
}

impl ClaimActual {
    /// The volume side, if this is one.
    pub fn as_volume(&self) -> Option<&PvActual> {
        match self {
            ClaimActual::Volume(v) => Some(v),
            ClaimActual::Claim(_) => None,
        }
    }

    /// The claim side, if this is one.
    pub fn as_claim(&self) -> Option<&PvcActual> {
        match self {
            ClaimActual::Claim(c) => Some(c),
            ClaimActual::Volume(_) => None,
        }
    }
}
