//! PersistentVolumes, PersistentVolumeClaims and StorageClasses: a second desired/actual pair,
//! binding claims to volumes as the kube-controller-manager's PV controller does, provisioning
//! volumes dynamically and reclaiming them.
//!
//! ```text
//! manifests (PV, PVC, StorageClass) ─┐
//! provisioned volumes ───────────────┼▶ populator ─▶ desired ─▶ reconciler (binding rules) ─▶ ops
//! desired pods (claims in use) ──────┘                              ▲                          │
//!                                                                   │                          ▼
//!        ClaimView (bound_volume, v1 status) ◀── actual (binding records) ◀── ClaimDriver
//!                                                                     (records, Provisioners)
//! ```
//!
//! - [`desired`]: the objects, keyed [`desired::ClaimKey`], with each claim's effective class,
//!   UID and whether a pod on this node uses it.
//! - [`actual`]: the binding records: volume phase (Available, Bound, Released, Failed) and
//!   claim reference; claim phase (Pending, Bound, Lost), volume, provisioning.
//! - [`binding`]: the binding rules ([`binding::decide`]).
//! - [`reconciler`] and [`ops`]: bind in two steps (volume side, then claim side), provision,
//!   release, reclaim (Retain, Delete), lose, forget.
//! - [`driver`]: the [`driver::Provisioner`] trait, the [`driver::ClaimRecords`] persistence
//!   trait, and the engine driver.
//! - [`populator`]: the desired state from the objects, the provisioned volumes and the pods.
//! - [`status`]: [`status::ClaimView`] for the volume populator (`bound_volume`) and the API.
//! - [`metrics`]: binding counts and `kubelet_volume_stats_*`.

pub mod actual;
pub mod binding;
pub mod desired;
pub mod driver;
pub mod metrics;
pub mod ops;
pub mod populator;
pub mod reconciler;
pub mod status;
