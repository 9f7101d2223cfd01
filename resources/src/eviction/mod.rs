//! Node-pressure eviction and pod admission, as a desired/actual pair on the engine.
//!
//! - **Desired**: the thresholds ([`signal::Threshold`]: `evictionHard`, `evictionSoft` with
//!   grace periods, `evictionMinimumReclaim`), the pressure transition period ([`state::Policy`])
//!   and the other settings ([`reconciler::EvictionConfig`]), at the key
//!   [`reconciler::EvictionKey::Node`]; and the verdicts the pod pair reaches, the verdict store
//!   (`Store<PodUid, `[`Verdict`](crate::model::verdict::Verdict)`>`): which pods may run (admitted,
//!   with the requests granted them), which are refused, which evicted. Only the
//!   [`populator::VerdictPopulator`] writes it: admission first come, first served
//!   ([`verdict::Admission`]), in-place resize decisions, and the evictions the pair's driver sends.
//! - **Actual**: the newest sample of the signals (memory, nodefs, imagefs, PIDs, and the pods'
//!   local storage usage), which the [`sampler::SignalSampler`] (the pair's populator) writes every
//!   monitoring period at [`reconciler::EvictionKey::Signals`]; and what the passes did
//!   ([`reconciler::NodeEviction`]: what the comparison remembers, the pressure conditions, the
//!   current pass, the pods evicted, why and when).
//! - **Reconciler** ([`reconciler::EvictionReconciler`]), pure: compares each sample with the
//!   thresholds ([`state::EvictionState::observe`]), then plans a pass one step at a time: local
//!   storage limits first ([`local_storage`]), node-level reclaim for a disk signal (when the node's
//!   shared list of reclaimers, a side input, holds one as the step is planned), then one pod
//!   evicted, ranked by [`rank`] (usage above requests, then priority, then usage).
//!   System-critical pods (priority ≥ 2,000,000,000) are never evicted.
//! - **Operations and driver** ([`reconciler::EvictionOp`], [`driver::EvictionDriver`]): publish the
//!   conditions, reclaim through [`Reclaimer`](crate::model::pressure::Reclaimer)s (container and
//!   image garbage collection), measure the pods' usage, evict (through a
//!   [`populator::EvictionSink`] to the verdict populator, then wait for the pod to stop).
//! - **Status**: the node's pressure conditions ([`status::PressureView`]), which admission also
//!   reads; [`events`] and [`metrics`] (`kubelet_evictions_total`, `nodelet_node_pressure`).
//!
//! The pod pair reads the verdict store and never writes it: a pod starts only once admitted;
//! a stopped pod is killed ([`plan_stopped`](crate::pod::verdict::plan_stopped)) and its status shows phase
//! `Failed` with the verdict's reason and message ([`apply`](crate::pod::verdict::apply)). The pod engine watches the verdict
//! store (a declared relation, key = the pod UID), so a pod is planned again when its verdict changes.

pub use crate::common::events;
pub mod driver;
pub mod local_storage;
pub mod metrics;
pub mod populator;
pub mod rank;
pub mod reconciler;
pub mod sampler;
pub mod signal;
pub mod state;
pub mod status;
pub mod verdict;

#[cfg(test)]
mod tests;
