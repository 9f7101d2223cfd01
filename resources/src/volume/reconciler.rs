//! The volume reconciler: set up what a pod needs, refresh stale content, tear down the rest.

use std::path::PathBuf;
use std::sync::Arc;

use reconcile_engine::{Plan, Reconciler, Update, View};

use super::actual::{MountState, VolumeActual};
use super::desired::{DesiredVolume, VolumeKey, VolumeSource, volume_path};
use super::ops::VolumeOp;

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

impl Reconciler<DesiredVolume, VolumeActual> for VolumeReconciler {
    type Key = VolumeKey;
    type Op = VolumeOp;

    fn reconcile(&self, view: &View<'_, VolumeKey, DesiredVolume, VolumeActual>) -> Plan<VolumeOp> {
        match (view.desired, view.actual) {
            (Some(desired), actual) => {
                // Content that cannot be made now: wait (the status says why); what is set up
                // keeps its last content.
                let Ok(source) = &desired.source else { return Plan::Idle };
                let needed = match actual {
                    None => true,
                    Some(a) => {
                        a.state == MountState::Uncertain
                            || a.plugin != desired.plugin
                            || source.digest().is_some_and(|d| a.digest.as_deref() != Some(d))
                    }
                };
                if needed { Plan::Run(VolumeOp::SetUp(Arc::new(desired.clone()))) } else { Plan::Idle }
            }
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
                    || desired.plugin == super::desired::Plugin::Secret,
            }),
            (VolumeOp::TearDown { .. }, None) => Update::Keep,
        }
    }
}
