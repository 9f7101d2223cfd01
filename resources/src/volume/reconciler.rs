//! The volume reconciler: set up what a pod needs, refresh stale content, tear down the rest;
//! for CSI volumes, attach and stage each device once before any pod publishes it, and unstage
//! and detach it only once no pod publishes it any more.
//!
//! A key that waits for another key of the same pair (a pod volume for its device to be staged,
//! a device for its pod volumes to be unpublished) plans `Idle`; the relation
//! [`related_volumes`] (the volume engine watching its own actual store) plans it again when the
//! other key changes. [`pod_of_volume`] is the pod engine's relation on this pair's actual store.

use std::path::PathBuf;
use std::sync::Arc;

use reconcile_engine::{Plan, Reconciler, Store, Update, View};

use super::actual::{DeviceActual, MountState, Step, VolumeActual};
use super::desired::{
    CsiSource, DesiredVolume, VolumeKey, VolumeSource, device_key, is_device_key, split_key, volume_path,
};
use super::ops::VolumeOp;

/// The volume engine's relation on its own actual store (`EngineBuilder::watches` with the
/// engine's `actual()`): maps a changed key to the keys that wait for it.
///
/// - A device changed (attached, staged, gone): the desired CSI pod volumes published from it,
///   which wait for it to be staged.
/// - A pod volume changed or went away: the device it is published from and every device no
///   pod needs any more (they wait until no pod volume is published from them; a removed key's
///   device is not known any more, and devices being torn down are few).
pub fn related_volumes(
    desired: Store<VolumeKey, DesiredVolume>,
    actual: Store<VolumeKey, VolumeActual>,
) -> impl Fn(&VolumeKey, Option<&VolumeActual>) -> Vec<VolumeKey> + Send + Sync + 'static {
    move |key, value| {
        let mut keys = Vec::new();
        if is_device_key(key) {
            desired.for_each(|k, d| {
                if let Ok(VolumeSource::Csi(csi)) = &d.source
                    && device_key(&csi.driver, &csi.volume_handle) == *key
                {
                    keys.push(k.clone());
                }
            });
            return keys;
        }
        if let Some(device) = value.and_then(VolumeActual::published_from) {
            keys.push(device.clone());
        }
        actual.for_each(|k, a| {
            if a.device().is_some() && !desired.contains_key(k) && !keys.contains(k) {
                keys.push(k.clone());
            }
        });
        keys
    }
}

/// The pod engine's relation on the volume actual store: a pod volume's key maps to its pod's
/// UID (device keys to nothing), so the pod is planned again when its volumes change.
pub fn pod_of_volume(key: &VolumeKey, _actual: Option<&VolumeActual>) -> Option<crate::model::pod::PodUid> {
    split_key(key).map(|(uid, _)| uid.to_owned())
}

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
        // The declared relation `related_volumes` plans the device again when a pod volume goes away.
        return Plan::Idle;
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
    type Inputs = ();

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
                        None => Plan::Idle,
                    },
                    // The declared relation `related_volumes` plans this volume again when its device changes.
                    _ => Plan::Idle,
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
                tmpfs: desired.source.as_ref().is_ok_and(VolumeSource::memory_backed),
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
