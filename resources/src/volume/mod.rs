//! Volumes: one desired/actual pair per (pod, volume), keyed `<pod uid>/<volume name>`, plus one
//! per CSI device (`csi:<driver>:<handle hash>`), which pods publish from.
//!
//! The kubelet's volume manager is the model:
//!
//! ```text
//! pod desired + pod actual ─▶ populator ─▶ desired volumes ─▶ reconciler ─▶ SetUp / TearDown
//!   (+ ConfigMaps, Secrets)    (renders content)                              │
//!                                                                             ▼
//!  pod reconciler waits ◀── status (VolumeGate) ◀── actual volumes ◀── VolumeHost driver
//! ```
//!
//! - [`desired`]: the volumes the pods need, with their content already rendered (configMap,
//!   secret, downwardAPI, projected) so that an object update is a desired-state change.
//! - [`actual`]: what is set up on the host: the directory containers mount, mounted or uncertain;
//!   for CSI volumes also the device (attached, staged), which pods publish from.
//! - [`reconciler`] and [`ops`]: set up what is missing or stale, tear down what no pod needs;
//!   for CSI: attach → stage (per device) → publish (per pod), and unpublish (per pod) → unstage
//!   → detach (per device, once no pod publishes it), each step its own operation that can be
//!   uncertain.
//! - [`driver`]: the [`driver::VolumeHost`] trait the operations call, and the engine driver.
//! - [`populator`]: derives the desired volumes from the pods. A pod's volumes stay desired
//!   while any of its containers runs, so volumes are torn down only after the containers are gone.
//! - [`status`]: the [`status::VolumeGate`] the pod reconciler asks before it starts containers.
//! - [`metrics`]: `volume_manager_total_volumes` and `storage_operation_duration_seconds`.
//! - [`tmpfs`]: which volumes are memory-backed and how big their tmpfs is, as the kubelet sizes it.

pub mod actual;
pub mod desired;
pub mod driver;
pub mod metrics;
pub mod ops;
pub mod populator;
pub mod reconciler;
pub mod status;
pub mod tmpfs;
