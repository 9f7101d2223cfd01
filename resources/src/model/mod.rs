//! The vocabulary the pairs share, at the bottom of the crate: it imports nothing of `resources/` but
//! [`crate::quantity`], and every pair may import it.
//!
//! - [`pod`]: a pod's identity ([`pod::PodUid`], [`pod::PodSource`]) and the desired pod ([`pod::DesiredPod`]),
//!   the pod pair's desired value that every other pair reads.
//! - [`actual`]: what the runtime reports for a pod ([`actual::PodActual`]): its container records and its
//!   sandbox records ([`actual::SandboxRecord`]).
//! - [`cgroup`]: the cgroup settings of a container's CPU and memory.

pub mod actual;
pub mod cgroup;
pub mod pod;
