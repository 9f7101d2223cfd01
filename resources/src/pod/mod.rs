//! Pods: one desired/actual pair per pod, keyed by pod UID.
//!
//! The pair's desired value ([`DesiredPod`](crate::model::pod::DesiredPod)) and actual value
//! ([`PodActual`](crate::model::actual::PodActual)) are in [`crate::model`]: the other pairs read them too.
//!
//! - [`validation`]: what the sources ask for, validated and defaulted as the API server would.
//! - [`driver`]: the narrow runtime interface ([`driver::PodRuntime`]) the operations use.
//! - [`gc`]: container garbage collection, planned as operations of the pod pair.
//! - [`grace`]: the node's upper bound on grace periods.
//! - [`resize`]: in-place resize of running containers.
//! - [`runtime_class`]: RuntimeClass handlers, overhead and node selectors (in [`crate::common`]).

pub mod driver;
pub mod gc;
pub mod grace;
pub mod metrics;
pub mod ops;
pub mod pleg;
pub mod reconciler;
pub mod resize;
pub use crate::common::runtime_class;
pub mod security;
pub mod status;
pub mod validation;
pub mod verdict;
