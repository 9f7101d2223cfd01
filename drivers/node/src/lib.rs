//! nodelet's access to its own host, for the daemon (`src/` wires these; it reads no host file itself):
//!
//! - [`host_stats`]: readers of the host's own numbers (`/proc`, cgroups v1 and v2, `statvfs`, disk usage).
//! - [`node_facts`]: what the `Node` object shows of this machine (capacity, addresses, system info).
//! - [`containerd`]: the embedded containerd: its configuration and CNI network files, the supervised
//!   process, image imports.
//! - [`log_rotation`]: the rotation of running containers' logs.
//! - [`atomic`]: the daemon's own files written atomically and durably.
//! - [`cidr`]: IPv4 networks in CIDR notation (the embedded containerd's pod network).
//! - [`allocator`]: gives the memory allocator's free pages back to the system (glibc's `malloc_trim`).

#![deny(missing_docs)]

pub mod allocator;
pub mod atomic;
pub mod cidr;
pub mod containerd;
pub mod host_stats;
pub mod log_rotation;
pub mod node_facts;

/// The wall clock as a timestamp (the Unix epoch if the clock is before it).
pub(crate) fn wall_clock() -> k8s_openapi::jiff::Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i128::try_from(d.as_nanos()).ok())
        .and_then(|n| k8s_openapi::jiff::Timestamp::from_nanosecond(n).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}
