//! The [`ProbeHandler`] trait: runs one probe (any of the four handlers) against one container.
//! The CRI implementation lives in `drivers/cri` (`CriProber`); tests use fakes.

use std::future::Future;
use std::time::Duration;

use super::desired::Action;
use super::results::ProbeResult;

/// Where a probe runs: the container and its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The container's name.
    pub container: String,
    /// The runtime's container ID (for `exec`).
    pub container_id: String,
    /// The pod IP: the default host of `httpGet` and `tcpSocket`, the host of `grpc`.
    pub pod_ip: Option<String>,
}

/// How one probe run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Passed.
    Success,
    /// Failed: the service answered no (exit code, HTTP status, NOT_SERVING, refused connection).
    Failure(String),
    /// Could not be run or timed out; counts as a failure (metric result `unknown`).
    Error(String),
}

impl ProbeOutcome {
    /// The result this run counts as.
    pub fn result(&self) -> ProbeResult {
        match self {
            ProbeOutcome::Success => ProbeResult::Success,
            ProbeOutcome::Failure(_) | ProbeOutcome::Error(_) => ProbeResult::Failure,
        }
    }

    /// The `result` label of `prober_probe_total`: `successful`, `failed` or `unknown`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ProbeOutcome::Success => "successful",
            ProbeOutcome::Failure(_) => "failed",
            ProbeOutcome::Error(_) => "unknown",
        }
    }

    /// What went wrong, if it did not pass.
    pub fn message(&self) -> Option<&str> {
        match self {
            ProbeOutcome::Success => None,
            ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Some(m),
        }
    }
}

/// Runs probes: `exec`, `httpGet`, `tcpSocket` and `grpc` ([`Action::Sleep`] is for hooks only and
/// [`Action::Unusable`] always fails; implementations may answer both without doing anything).
/// Implementations enforce `timeout` themselves; the prober adds a safety margin on top.
pub trait ProbeHandler: Send + Sync + 'static {
    /// Runs `action` against `target` within `timeout`.
    fn probe(
        &self,
        target: &ProbeTarget,
        action: &Action,
        timeout: Duration,
    ) -> impl Future<Output = ProbeOutcome> + Send;
}
