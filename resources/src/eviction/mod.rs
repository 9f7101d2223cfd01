//! Node-pressure eviction and pod admission, as a desired/actual pair.
//!
//! - **Desired**: the thresholds ([`signal::Threshold`]: `evictionHard`, `evictionSoft` with
//!   grace periods, `evictionMinimumReclaim`) and the pressure transition period
//!   ([`state::Policy`]); and the verdict store (`Store<PodUid, `[`Verdict`](crate::model::verdict::Verdict)`>`): which
//!   pods may run (admitted, with the requests granted them), which are refused, which evicted.
//!   Only the [`populator::VerdictPopulator`] writes it: admission first come, first served
//!   ([`verdict::Admission`]), in-place resize decisions, and the evictions the manager decides.
//! - **Actual**: the signals a [`signal::SignalSource`] observes (memory, nodefs, imagefs,
//!   PIDs) and the pods the manager has evicted.
//! - **Comparison**: [`state::EvictionState::observe`], pure, on paused time in the tests.
//! - **Operations**: node-level reclaim through [`Reclaimer`](crate::model::pressure::Reclaimer)s (image and container
//!   garbage collection), then one pod evicted per pass, ranked by [`rank`] (usage above
//!   requests, then priority, then usage), sent to the populator through a
//!   [`populator::EvictionSink`]. System-critical pods (priority ≥ 2,000,000,000) are never evicted.
//! - **Local storage capacity isolation** ([`local_storage`]): each pass, before the thresholds, a
//!   pod over an emptyDir `sizeLimit` or its containers' `ephemeral-storage` limits is evicted, from
//!   the usage a [`signal::SignalSource`] measured in the background.
//! - **Status**: the node's pressure conditions ([`manager::PressureView`]), which admission also
//!   reads; [`events`] and [`metrics`].
//!
//! The pod pair reads the verdict store and never writes it: a pod starts only once admitted;
//! a stopped pod is killed ([`plan_stopped`](crate::pod::verdict::plan_stopped)) and its status shows phase
//! `Failed` with the verdict's reason and message ([`apply`](crate::pod::verdict::apply)). The pod engine watches the verdict
//! store (a declared relation, key = the pod UID), so a pod is planned again when its verdict changes.

pub use crate::common::events;
pub mod local_storage;
pub mod manager;
pub mod metrics;
pub mod populator;
pub mod rank;
pub mod signal;
pub mod state;
pub mod verdict;
