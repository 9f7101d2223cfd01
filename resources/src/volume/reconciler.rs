//! The volume reconciler: set up what a pod needs, refresh stale content, tear down the rest;
//! for CSI volumes, attach and stage each device once before any pod publishes it, and unstage
//! and detach it only once no pod publishes it any more.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reconcile_engine::{Plan, Reconciler, Update, View};

use super::actual::{DeviceActual, MountState, Step, VolumeActual};
use super::desired::{CsiSource, DesiredVolume, Plugin, VolumeKey, VolumeSource, device_key, volume_path};
use super::ops::VolumeOp;

/// How soon a key waiting for another key (a pod volume for its device, a device for its pods
/// to unpublish) looks again: the kubelet's volume reconciler loop period.
pub const WAIT_PERIOD: Duration = Duration::from_millis(100);

/// The volume reconciler.
#[derive(Debug, Clone)]
pub struct VolumeReconciler {
    root: PathBuf,
}

impl VolumeReconciler {
    /// A reconciler for volumes under `root` (nodelet's `--root-dir`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

type VolumeView<'a> = View<'a, VolumeKey, DesiredVolume, VolumeActual>;

/// The next step of a desired device.
fn device_up(source: &CsiSource, actual: Option<&VolumeActual>) -> Plan<VolumeOp> {
    let source = Arc::new(source.clone());
    match actual.and_then(|a| a.device().map(|d| (a, d))) {
        Some((a, d)) if d.attach == Step::Done => {
            if d.stage == Step::Done && a.is_mounted() {
                Plan::Idle
            } else {
                Plan::Run(VolumeOp::Stage { source, prior: Arc::new(a.clone()) })
            }
        }
        _ => Plan::Run(VolumeOp::Attach { source, prior: actual.cloned().map(Arc::new) }),
    }
}

/// The next step of a device no pod needs: wait until no pod volume is published from it, then
/// unstage, then detach.
fn device_down(view: &VolumeView<'_>, actual: &VolumeActual) -> Plan<VolumeOp> {
    let mut in_use = false;
    view.actual_store.for_each(|_, a| in_use |= a.published_from() == Some(view.key));
    if in_use {
        return Plan::RecheckAfter(WAIT_PERIOD);
    }
    let prior = Arc::new(actual.clone());
    match actual.device() {
        Some(d) if d.stage != Step::NotDone => Plan::Run(VolumeOp::Unstage { prior }),
        _ => Plan::Run(VolumeOp::Detach { prior }),
    }
}

/// Whether a pod volume must be set up (again).
fn needs_set_up(desired: &DesiredVolume, source: &VolumeSource, actual: Option<&VolumeActual>) -> bool {
    match actual {
        None => true,
        Some(a) => {
            a.state == MountState::Uncertain
                || a.plugin != desired.plugin
                || source.digest().is_some_and(|d| a.digest.as_deref() != Some(d))
        }
    }
}

impl Reconciler<DesiredVolume, VolumeActual> for VolumeReconciler {
    type Key = VolumeKey;
    type Op = VolumeOp;

    fn reconcile(&self, view: &VolumeView<'_>) -> Plan<VolumeOp> {
        match (view.desired, view.actual) {
            (Some(desired), actual) => {
                // Content that cannot be made now: wait (the status says why); what is set up
                // keeps its last content.
                let Ok(source) = &desired.source else { return Plan::Idle };
                if let VolumeSource::CsiDevice(csi) = source {
                    return device_up(csi, actual);
                }
                if !needs_set_up(desired, source, actual) {
                    return Plan::Idle;
                }
                let VolumeSource::Csi(csi) = source else {
                    return Plan::Run(VolumeOp::SetUp(Arc::new(desired.clone())));
                };
                // Published only from a device that is attached and staged.
                let device_key = device_key(&csi.driver, &csi.volume_handle);
                match view.actual_store.get(&device_key) {
                    Some(d) if d.is_mounted() => match d.device() {
                        Some(device) => Plan::Run(VolumeOp::Publish {
                            volume: Arc::new(desired.clone()),
                            device_key,
                            device: Arc::new(device.clone()),
                        }),
                        None => Plan::RecheckAfter(WAIT_PERIOD),
                    },
                    _ => Plan::RecheckAfter(WAIT_PERIOD),
                }
            }
            (None, Some(actual)) if actual.device().is_some() => device_down(view, actual),
            (None, Some(actual)) => {
                Plan::Run(VolumeOp::TearDown { plugin: actual.plugin, path: actual.path.clone() })
            }
            (None, None) => Plan::Idle,
        }
    }

    fn uncertain(
        &self,
        _key: &VolumeKey,
        op: &VolumeOp,
        actual: Option<&VolumeActual>,
    ) -> Update<VolumeActual> {
        // A device step: that step is now uncertain (repeated if the device is still needed,
        // undone if not).
        if let Some(update) = uncertain_device(op, actual) {
            return update;
        }
        match (op, actual) {
            (_, Some(a)) => Update::Set(VolumeActual { state: MountState::Uncertain, ..a.clone() }),
            // A setup that may have created something: record where, so that a teardown cleans
            // it up if the pod goes away before a setup succeeds.
            (VolumeOp::SetUp(desired), None) => Update::Set(VolumeActual {
                plugin: desired.plugin,
                path: volume_path(&self.root, desired),
                state: MountState::Uncertain,
                digest: None,
                tmpfs: matches!(&desired.source, Ok(VolumeSource::EmptyDir { memory: true, .. }))
                    || desired.plugin == Plugin::Secret,
                csi: None,
            }),
            (VolumeOp::Publish { volume, device_key, .. }, None) => Update::Set(VolumeActual::published(
                volume_path(&self.root, volume),
                device_key.clone(),
                MountState::Uncertain,
            )),
            (_, None) => Update::Keep,
        }
    }
}

/// The uncertain actual value of a device after step `op` (`None` if `op` is no device step).
fn uncertain_device(op: &VolumeOp, actual: Option<&VolumeActual>) -> Option<Update<VolumeActual>> {
    let path = actual.map(|a| a.path.clone()).unwrap_or_default();
    let mut device = match (op, actual.and_then(VolumeActual::device)) {
        (
            VolumeOp::Attach { .. }
            | VolumeOp::Stage { .. }
            | VolumeOp::Unstage { .. }
            | VolumeOp::Detach { .. },
            Some(d),
        ) => d.clone(),
        (VolumeOp::Attach { source, .. }, None) => {
            DeviceActual::new(&source.driver, &source.volume_handle, Step::NotDone)
        }
        _ => return None,
    };
    match op {
        VolumeOp::Attach { .. } | VolumeOp::Detach { .. } => device.attach = Step::Uncertain,
        _ => device.stage = Step::Uncertain,
    }
    Some(Update::Set(VolumeActual::of_device(device, path)))
}
