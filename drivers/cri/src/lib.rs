//! Async CRI v1 client for containerd, used by nodelet's sandbox, pod, image and PLEG reconcilers.
//!
//! * [`CriClient`] speaks the CRI v1 runtime and image services (the [`k8s_cri`] protobufs, re-exported as
//!   [`proto`]) over a unix socket, with one shared HTTP/2 channel, a deadline on every call and typed errors
//!   ([`CriError`]).
//! * [`events`] subscribes to the runtime's container events on the same connection — the fast path of an
//!   evented PLEG: CRI `GetContainerEvents` where the runtime serves it (containerd 2.x), containerd's native
//!   task events where it does not (containerd 1.6) — and exposes them as a [`futures::Stream`] of
//!   [`RuntimeEvent`]s that reconnects by itself.
//! * [`CriPodRuntime`] is nodelet's `PodRuntime` (from `nodelet-resources`) on this client: the pod → CRI mapping
//!   (sandbox and container configs, DNS, ports, resources, security context), image pull policies ([`images`]),
//!   the kubelet's log layout under [`CriPodRuntimeConfig::pod_log_root`], and relists that rebuild every pod
//!   from labels and annotations.
//! * [`pod_cgroup`] makes the pod-level cgroup and sets its process limit (`podPidsLimit`) before the sandbox
//!   starts.
//! * [`netns`] dials `localhost:PORT` inside a sandbox's network namespace ([`NetnsDialer`], on a dedicated
//!   thread per dial), for port-forwarding without the runtime's streaming server.
//! * [`labels`] has the kubelet's CRI label/annotation keys and nodelet's `io.nodelet.managed=true` marker,
//!   with which nodelet finds its own sandboxes and containers after a restart ([`SandboxFilter::managed`],
//!   [`ContainerFilter::managed`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use nodelet_cri::{CriClient, CriConfig, EventsConfig, RuntimeEvent, SandboxFilter};
//!
//! # async fn run() -> Result<(), nodelet_cri::CriError> {
//! let cri = CriClient::connect(CriConfig::new("unix:///run/containerd/containerd.sock")).await?;
//! let readiness = cri.status().await?;
//! assert!(readiness.is_ready(), "{:?}", readiness.not_ready_reason());
//!
//! let (mut events, feed) = cri.events(EventsConfig::default());
//! tokio::spawn(feed);
//! while let Some(event) = events.recv().await {
//!     match event {
//!         // (Re)subscribed: events may have been missed, relist everything nodelet owns.
//!         RuntimeEvent::Reconnected { .. } => {
//!             let sandboxes = cri.list_pod_sandboxes(&SandboxFilter::managed()).await?;
//!             println!("{} sandboxes", sandboxes.len());
//!         }
//!         RuntimeEvent::ContainerExited { id, exit_status, .. } => println!("{id} exited: {exit_status:?}"),
//!         _ => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Deadlines
//!
//! Every call is bounded by [`CriConfig::runtime_request_timeout`] (2 minutes by default, like the
//! kubelet's `--runtime-request-timeout`), except: `RunPodSandbox` (twice that, as the kubelet),
//! `StopContainer` (plus the grace period), `ExecSync` (the command timeout plus
//! [`CriConfig::exec_sync_margin`]) and `PullImage` ([`CriConfig::image_pull_timeout`]). Only the
//! deadline cancels an `ExecSync`: a caller that drops it leaves the command to its end (see
//! [`CriClient::exec_sync`]).
//!
//! # containerd specifics worth knowing
//!
//! * `RemoveImage` deletes every tag of the image, not only the reference passed.
//! * `ContainerStatus` lags the native exit event by tens of milliseconds (not the CRI event).
//! * `StopPodSandbox` kills the sandbox's containers without grace period: stop containers first.
//! * CRI does not delete a sandbox's `log_directory`; the caller owns it.
//! * A cancelled `ExecSync` kills its command; one cancelled while its process starts holds the
//!   container for 30 s in containerd 1.6, and a `StopContainer` waits that long.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod client;
mod config;
mod dns;
mod error;
mod etc_hosts;
pub mod events;
mod filter;
pub mod image_gc;
pub mod images;
pub mod labels;
pub mod listing;
pub mod log_rotation;
pub mod netns;
pub mod pod_cgroup;
mod pod_runtime;
pub mod probe;
mod sandbox_stats_hazard;
pub mod service_env;
mod spec;
mod termination;
pub mod userns;

pub use client::{CriClient, CriMetrics, ExecSyncOutput, NETWORK_READY, RUNTIME_READY, RuntimeReadiness};
pub use config::{
    CriConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONTAINERD_NAMESPACE, DEFAULT_EXEC_SYNC_MARGIN,
    DEFAULT_IMAGE_PULL_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_RUNTIME_REQUEST_TIMEOUT, parse_endpoint,
};
pub use error::{CriError, Result};
pub use events::{EventSource, EventsConfig, RuntimeEvent, RuntimeEventFeed, RuntimeEventStream};
pub use filter::{ContainerFilter, SandboxFilter};
pub use netns::{NetnsDialer, NetnsError, SandboxNetwork};
pub use pod_runtime::{
    CriPodRuntime, CriPodRuntimeConfig, DEFAULT_CGROUP_FS, DEFAULT_CLUSTER_DOMAIN, DEFAULT_POD_LOG_ROOT,
    DEFAULT_RESOLV_CONF, DEFAULT_SECCOMP_PROFILE_ROOT, EnvObjects, OwnChanges, ServiceLookup,
    apparmor_enabled,
};
pub use probe::CriProber;

/// The CRI v1 protobuf types (request/response messages, configs, enums), from the `k8s-cri` crate.
pub mod proto {
    pub use k8s_cri::v1::*;
}
