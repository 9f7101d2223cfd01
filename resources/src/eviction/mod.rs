//! Node-pressure eviction, as a desired/actual pair.
//!
//! - **Desired**: the thresholds ([`signal::Threshold`]: `evictionHard`, `evictionSoft` with
//!   grace periods, `evictionMinimumReclaim`) and the pressure transition period
//!   ([`state::Policy`]).
//! - **Actual**: the signals a [`signal::SignalSource`] observes (memory, nodefs, imagefs,
//!   PIDs) and the node's pressure conditions ([`manager::PressureView`]).
//! - **Comparison**: [`state::EvictionState::observe`], pure, on paused time in the tests.
//! - **Operations**: node-level reclaim through [`manager::Reclaimer`]s (image and container
//!   garbage collection), then one pod evicted per pass, ranked by [`rank`] (usage above
//!   requests, then priority, then usage). Eviction goes through the pod engine: the
//!   [`verdict::PodVerdicts`] mark makes the pod reconciler kill the pod and never start it
//!   again, and the pod's status shows phase `Failed`, reason `Evicted` and the kubelet's
//!   message. System-critical pods (priority ≥ 2,000,000,000) are never evicted.
//! - **Admission**: new pods are refused while the node is under the matching pressure
//!   ([`verdict::PodVerdicts::admit`]).

pub mod events;
pub mod manager;
pub mod metrics;
pub mod populator;
pub mod rank;
pub mod signal;
pub mod state;
pub mod verdict;
