//! nodelet's reconciled resources, one module per resource, each built the same way on
//! [`reconcile_engine`]:
//!
//! ```text
//! sources ─▶ desired (validated, defaulted) ─▶ reconciler ─▶ ops ─▶ driver trait ─▶ runtime
//!                                                 ▲                                   │
//!                                  actual ◀── completions and observations (PLEG) ◀───┘
//!                                    │
//!                                    ▼
//!                           status (v1 PodStatus), metrics
//! ```
//!
//! Start with [`pod`]: its module doc walks through the pod lifecycle. The pairs feed each other
//! through their stores, never by calling each other, and share one vocabulary, [`model`] (the desired pod,
//! container and sandbox records, verdicts, QoS, pod volumes, runtime errors), which imports no pair. A pair
//! imports only [`model`], [`quantity`], [`common`] and the read side of another pair's stores it takes as a
//! side input (the sandbox pair's `SandboxView`, the volume pair's `VolumeGate`, the probe results); a test
//! (`layering.rs`) checks it on the sources and fails on a cycle.
//!
//! - [`volume`]: the volumes the desired pods need (set up before their containers start, torn
//!   down after their containers are gone); the pod reconciler reads its actual store.
//! - [`claim`]: PersistentVolumes, claims and classes, bound and provisioned; the volume
//!   populator mounts the volume bound to a pod's claim.
//! - [`probe`]: liveness, readiness and startup probes of running containers; the pod reconciler
//!   and status read their results.
//! - [`quantity`]: Kubernetes resource quantities, exactly.
//! - [`common`]: helpers every pair may use: the clock, API timestamps, the node's events, DNS-name
//!   checks, RuntimeClasses, the sysctl allowlist.

#![deny(missing_docs)]

pub mod claim;
pub mod common;
pub mod eviction;
#[cfg(feature = "testing")]
pub mod fake;
pub mod image;
#[cfg(test)]
mod layering;
pub mod model;
pub mod pod;
pub mod probe;

pub mod quantity;
pub mod sandbox;
pub mod volume;
