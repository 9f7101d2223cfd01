//! Container probes (liveness, readiness, startup) and the specs of lifecycle hooks. Probes are not a
//! desired/actual pair on the engine: they are timer-driven workers (as the kubelet's prober
//! manager) that turn the probes the desired pods ask for into results the pod pair reads:
//!
//! - [`desired`]: the probes a container spec asks for, resolved with the kubelet's defaults
//!   (`initialDelaySeconds` 0, `periodSeconds` 10, `timeoutSeconds` 1, `successThreshold` 1,
//!   `failureThreshold` 3, probe-level `terminationGracePeriodSeconds`), and the actions of
//!   `postStart`/`preStop` hooks.
//! - [`handler`]: the [`ProbeHandler`](handler::ProbeHandler) trait that runs one probe (`exec`,
//!   `httpGet`, `tcpSocket`, `grpc`); the CRI implementation is in `drivers/cri`.
//! - [`worker`]: the [`Prober`](worker::Prober): a timer-driven tokio task per probe of each running
//!   container, with the kubelet's semantics (initial results readiness = failure, liveness =
//!   success, startup = unknown; thresholds; liveness and readiness held until the startup probe
//!   succeeded; a worker stops with its container, and for good after a liveness or startup failure).
//! - [`results`]: the results store (per container ID) the prober writes and the pod reconciler and
//!   status read. The pod engine watches it (relation `probes`, mapper
//!   [`pod_of_probes`](results::pod_of_probes)), so a changed result plans its pod again; the reconciler kills a
//!   container whose liveness or startup probe failed (restartPolicy and CrashLoopBackOff then
//!   apply as to any exit), and status shows `ready`, `started` and the `Ready`/`ContainersReady`
//!   conditions from the readiness and startup results.
//! - [`status`]: those pure functions of the results.
//! - [`metrics`]: `prober_probe_total` and `prober_probe_duration_seconds` (served on `/metrics/probes`);
//!   a pod's series are deleted when it leaves the desired store.

pub mod desired;
pub mod handler;
pub mod metrics;
pub mod results;
pub mod status;
pub mod worker;
