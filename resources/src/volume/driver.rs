//! The volume driver: the host interface the operations call ([`VolumeHost`]), and the engine
//! [`Driver`] on top of it ([`VolumeDriver`]), which times operations for the metrics.

use std::future::Future;
use std::sync::Arc;

use reconcile_engine::{CancellationToken, Driver, Outcome, Update};

use super::actual::VolumeActual;
use super::desired::{DesiredVolume, VolumeKey};
use super::metrics::VolumeMetrics;
use super::ops::VolumeOp;

/// A failed volume operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct VolumeError {
    /// What went wrong, naming the volume and the pod.
    pub message: String,
    /// Whether the operation may have changed something (a mount half done, a timeout): the
    /// volume is then recorded as uncertain.
    pub uncertain: bool,
}

impl VolumeError {
    /// A failure that changed nothing.
    pub fn failed(message: impl Into<String>) -> Self {
        Self { message: message.into(), uncertain: false }
    }

    /// A failure after which the volume may be half set up.
    pub fn uncertain(message: impl Into<String>) -> Self {
        Self { message: message.into(), uncertain: true }
    }
}

/// What sets volumes up on a host. Every method is idempotent.
pub trait VolumeHost: Send + Sync + 'static {
    /// Sets `volume` up (or refreshes its content) and reports what exists afterwards.
    fn set_up(
        &self,
        volume: &DesiredVolume,
    ) -> impl Future<Output = Result<VolumeActual, VolumeError>> + Send;

    /// Tears down the volume `key` whose actual state is described by `op`
    /// ([`VolumeOp::TearDown`]). A volume that does not exist is torn down.
    fn tear_down(
        &self,
        key: &VolumeKey,
        op: &VolumeOp,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;

    /// What is set up on the host (after a restart): read from the volume directories and the
    /// mount table.
    fn reconstruct(&self)
    -> impl Future<Output = Result<Vec<(VolumeKey, VolumeActual)>, VolumeError>> + Send;
}

/// The engine driver for volumes.
#[derive(Debug)]
pub struct VolumeDriver<H> {
    host: Arc<H>,
    metrics: VolumeMetrics,
}

impl<H: VolumeHost> VolumeDriver<H> {
    /// A driver over `host`.
    pub fn new(host: Arc<H>, metrics: VolumeMetrics) -> Self {
        Self { host, metrics }
    }

    /// The host.
    pub fn host(&self) -> &H {
        &self.host
    }

    fn record(&self, op: &VolumeOp, started: tokio::time::Instant, ok: bool) {
        let status = if ok { "success" } else { "fail-unknown" };
        self.metrics
            .operation_duration
            .with_label_values(&[op.plugin().name(), op.operation_name(), status, "false"])
            .observe(started.elapsed().as_secs_f64());
    }
}

impl<H: VolumeHost> Driver<VolumeKey, VolumeOp, VolumeActual> for VolumeDriver<H> {
    type Error = VolumeError;

    async fn execute(
        &self,
        key: &VolumeKey,
        op: &VolumeOp,
        _cancel: &CancellationToken,
    ) -> Outcome<VolumeActual, VolumeError> {
        let started = tokio::time::Instant::now();
        let outcome = match op {
            VolumeOp::SetUp(volume) => match self.host.set_up(volume).await {
                Ok(actual) => Outcome::Done(Update::Set(actual)),
                Err(e) if e.uncertain => Outcome::Uncertain(e),
                Err(e) => Outcome::Failed(e),
            },
            VolumeOp::TearDown { .. } => match self.host.tear_down(key, op).await {
                Ok(()) => Outcome::Done(Update::Remove),
                Err(e) => Outcome::Uncertain(e),
            },
        };
        self.record(op, started, matches!(outcome, Outcome::Done(_)));
        outcome
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        self.host.reconstruct().await
    }
}
