//! The vocabulary the pairs share, at the bottom of the crate: it imports nothing of `resources/` but
//! [`crate::quantity`] (a leaf), and every pair may import it.
//!
//! - [`pod`]: a pod's identity ([`pod::PodUid`], [`pod::PodSource`]) and the desired pod ([`pod::DesiredPod`]),
//!   the pod pair's desired value that every other pair reads.
//! - [`actual`]: what the runtime reports for a pod, apart ([`actual::ListedPod`]): its container records
//!   ([`actual::PodActual`], the pod pair's) and its sandbox records ([`actual::PodSandboxes`], the sandbox
//!   pair's).
//! - [`cgroup`]: the cgroup settings of a container's CPU and memory.
//! - [`qos`]: a pod's QoS class, the one computation of the project.
//! - [`runtime`]: runtime errors ([`runtime::RuntimeError`]), with the reason the pod status shows.
//! - [`verdict`]: the node's verdicts on its pods ([`verdict::Verdict`]), which eviction's admission writes and
//!   the pod, volume and sandbox pairs read.
//! - [`volumes`]: a pod's volumes as the pairs see them ([`volumes::PodVolumes`], [`volumes::VolumeReadiness`]).
//! - [`pressure`]: eviction signals, node pressure conditions and node-level reclaim ([`pressure::Reclaimer`]).

pub mod actual;
pub mod cgroup;
pub mod pod;
pub mod pressure;
pub mod qos;
pub mod runtime;
pub mod verdict;
pub mod volumes;
