//! Pod sandboxes and their network: one desired/actual pair per pod, keyed by pod UID.
//!
//! - [`desired`]: the sandbox each desired pod needs ([`desired::SandboxSpec`]), written by the
//!   [`populator`] from the desired pods.
//! - actual: the sandboxes the runtime reports for each pod (state, IP, attempt, creation time), from
//!   operation outcomes, start-up reconstruction and the pod PLEG's relist
//!   ([`PodSandboxes`](crate::model::actual::PodSandboxes), in the model: the pod pair reads them too).
//! - [`reconciler`]: creates a sandbox for a pod that has no ready one; replaces one that died or
//!   no longer matches the pod (after the pod pair has stopped the pod's containers); stops the
//!   sandbox of a pod that is done or being deleted and removes the sandboxes of pods that are gone,
//!   once their containers are.
//! - [`driver`]: the runtime interface ([`driver::SandboxRuntime`], implemented over CRI in
//!   `drivers/cri`, networking through the runtime's CNI) and the engine driver.
//! - [`status`]: what the pod pair reads of this pair (the ready sandbox a pod's containers start in).
//! - [`metrics`]: the kubelet's sandbox metrics.
//! - [`pair`]: the pair assembled: its engine with its relations on the pod actual, verdict and volume
//!   stores, and its populator.

pub mod desired;
pub mod driver;
pub mod metrics;
pub mod ops;
pub mod pair;
pub mod populator;
pub mod reconciler;
pub mod status;
