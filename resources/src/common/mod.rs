//! Helpers every pair shares (and the daemon with them), in one place:
//!
//! - [`clock`]: the wall clock the reconcilers and status read ([`clock::Clock`]).
//! - [`time`]: timestamps of the API objects from wall-clock nanoseconds.
//! - [`events`]: the node's events (eviction, image garbage collection, …) as the kubelet records them.
//! - [`names`]: DNS-1123 label and subdomain checks.
//! - [`sysctl`]: the sysctls pods may set (the kubelet's allowlist: pod validation, admission).
//! - [`runtime_class`]: RuntimeClass handlers, overhead and node selectors (pod validation, admission).
//! - [`task`]: the long-lived tasks a pair hands its caller to spawn (no library of nodelet spawns one).

pub mod clock;
pub mod events;
pub mod names;
pub mod runtime_class;
pub mod sysctl;
pub mod task;
pub mod time;
