//! Host-volume primitives for nodelet's volume resource: the low-level, security-critical pieces the
//! volume reconciler calls, each in its own module with its own error type.
//!
//! - [`files`]: renders the content of `configMap`, `secret`, `downwardAPI` and `projected` volumes
//!   (a [`files::FileSet`]) with the kubelet's semantics for `items`, `defaultMode` and `optional`.
//! - [`atomic`]: the kubelet's AtomicWriter: writes a [`files::FileSet`] into a volume directory with
//!   the `..data` symlink swap, so a running container sees either the old or the new content.
//! - [`hostpath`]: the kubelet's `hostPath` `type` checks.
//! - [`mounts`]: tmpfs mounts, unmounts, mount-point queries from `/proc/self/mountinfo`, and a
//!   directory removal that refuses to descend into mounts.
//! - [`ownership`]: the kubelet's `SetVolumeOwnership` (`fsGroup`): group and group permissions of
//!   every entry of a volume, without following symlinks.
//! - [`driver`]: [`driver::HostVolumes`], the volume resource's host driver built on the above.
//! - [`subpath`]: safe `subPath` / `subPathExpr` binds (the CVE-2017-1002101 and CVE-2021-25741
//!   classes): the path is resolved beneath the volume by the kernel (`openat2` with
//!   `RESOLVE_BENEATH`) and bind-mounted from the open descriptor.
//! - [`usage`]: bounded `du -x` of a directory tree (no symlinks followed, no mount crossed, early stop
//!   over a limit, a shared budget of entries), for local storage capacity isolation.
//!
//! Everything here is Linux-only and synchronous (blocking system calls); callers on an async runtime
//! run these functions on a blocking thread. Every string from a pod spec or a ConfigMap/Secret is
//! treated as hostile: paths are validated, and file system walks never follow symlinks except where
//! the kernel confines the resolution beneath a directory.

#![deny(missing_docs)]

pub mod atomic;
pub mod driver;
pub mod files;
mod fsutil;
pub mod hostpath;
pub mod mounts;
pub mod ownership;
pub mod subpath;
pub mod usage;
