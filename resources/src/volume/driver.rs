//! The volume driver: the host interface the operations call ([`VolumeHost`]), and the engine
//! [`Driver`] on top of it ([`VolumeDriver`]), which times operations for the metrics.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use reconcile_engine::{CancellationToken, Driver, Outcome, Update};

use super::actual::{DeviceActual, Step, VolumeActual};
use super::desired::{CsiSource, DesiredVolume, VolumeKey};
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

    /// Attaches the device of a CSI volume to this node (`ControllerPublishVolume` when the
    /// driver needs it) and returns the publish context. Default: no CSI on this host.
    fn attach(
        &self,
        source: &CsiSource,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, VolumeError>> + Send {
        std::future::ready(Err(no_csi(&source.driver)))
    }

    /// Stages an attached device at its global mount (`NodeStageVolume` when the driver
    /// stages); returns the global mount (`None` for drivers that do not stage).
    fn stage(
        &self,
        source: &CsiSource,
        publish_context: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Option<PathBuf>, VolumeError>> + Send {
        let _ = publish_context;
        std::future::ready(Err(no_csi(&source.driver)))
    }

    /// Publishes a CSI pod volume from its staged device (`NodePublishVolume`); returns the
    /// volume as set up.
    fn publish(
        &self,
        volume: &DesiredVolume,
        device_key: &VolumeKey,
        device: &DeviceActual,
    ) -> impl Future<Output = Result<VolumeActual, VolumeError>> + Send {
        let _ = (volume, device_key);
        std::future::ready(Err(no_csi(&device.driver)))
    }

    /// Unstages a device (`NodeUnstageVolume` when the driver stages). Called only when no pod
    /// volume is published from it; implementations check again and fail if one is.
    fn unstage(&self, device: &DeviceActual) -> impl Future<Output = Result<(), VolumeError>> + Send {
        std::future::ready(Err(no_csi(&device.driver)))
    }

    /// Detaches an unstaged device from this node (`ControllerUnpublishVolume` when the driver
    /// attaches).
    fn detach(&self, device: &DeviceActual) -> impl Future<Output = Result<(), VolumeError>> + Send {
        std::future::ready(Err(no_csi(&device.driver)))
    }
}

fn no_csi(driver: &str) -> VolumeError {
    VolumeError::failed(format!("CSI driver {driver:?}: this host runs no CSI volumes"))
}

/// The outcome of a step: done with `update`, or failed (uncertain when the step may have
/// changed something).
fn outcome(result: Result<Update<VolumeActual>, VolumeError>) -> Outcome<VolumeActual, VolumeError> {
    match result {
        Ok(update) => Outcome::Done(update),
        Err(e) if e.uncertain => Outcome::Uncertain(e),
        Err(e) => Outcome::Failed(e),
    }
}

/// The device of `source` before a step: `prior`'s, or a new one with nothing done.
fn device_before(source: &CsiSource, prior: Option<&VolumeActual>) -> (DeviceActual, PathBuf) {
    match prior.and_then(|p| p.device().map(|d| (d.clone(), p.path.clone()))) {
        Some(found) => found,
        None => (DeviceActual::new(&source.driver, &source.volume_handle, Step::NotDone), PathBuf::new()),
    }
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
            VolumeOp::SetUp(volume) => outcome(self.host.set_up(volume).await.map(Update::Set)),
            VolumeOp::TearDown { .. } => match self.host.tear_down(key, op).await {
                Ok(()) => Outcome::Done(Update::Remove),
                Err(e) => Outcome::Uncertain(e),
            },
            VolumeOp::Publish { volume, device_key, device } => {
                outcome(self.host.publish(volume, device_key, device).await.map(Update::Set))
            }
            VolumeOp::Attach { source, prior } => {
                let (mut device, path) = device_before(source, prior.as_deref());
                outcome(self.host.attach(source).await.map(|context| {
                    device.attach = Step::Done;
                    device.publish_context = context;
                    Update::Set(VolumeActual::of_device(device, path))
                }))
            }
            VolumeOp::Stage { source, prior } => {
                let (mut device, _) = device_before(source, Some(prior));
                outcome(self.host.stage(source, &device.publish_context).await.map(|path| {
                    device.stage = Step::Done;
                    Update::Set(VolumeActual::of_device(device, path.unwrap_or_default()))
                }))
            }
            VolumeOp::Unstage { prior } => match prior.device() {
                Some(d) => outcome(self.host.unstage(d).await.map(|()| {
                    let device = DeviceActual { stage: Step::NotDone, ..d.clone() };
                    Update::Set(VolumeActual::of_device(device, PathBuf::new()))
                })),
                None => Outcome::Done(Update::Remove),
            },
            VolumeOp::Detach { prior } => match prior.device() {
                Some(d) => outcome(self.host.detach(d).await.map(|()| Update::Remove)),
                None => Outcome::Done(Update::Remove),
            },
        };
        self.record(op, started, matches!(outcome, Outcome::Done(_)));
        outcome
    }

    async fn reconstruct(&self) -> Result<Vec<(VolumeKey, VolumeActual)>, VolumeError> {
        self.host.reconstruct().await
    }
}
