//! What others read of claims: [`ClaimView`] answers "which volume is this claim bound to"
//! for the volume populator, and renders v1 PersistentVolume / PersistentVolumeClaim objects
//! with their status (phase, and why) for the API and the client.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimStatus,
    PersistentVolumeStatus,
};
use k8s_openapi::api::storage::v1::StorageClass;
use reconcile_engine::{OpStatus, Store, Subscription};

use super::actual::{ClaimActual, ClaimPhase, PvcActual, VolumePhase};
use super::binding::Decision;
use super::desired::{ClaimDesired, ClaimKey, DesiredPvc};
use super::driver::ClaimError;
use super::ops::ClaimOp;
use super::reconciler::ClaimReconciler;
use crate::model::pod::{DesiredPod, PodSource};
use crate::model::volumes::{BoundVolumeError, ClaimLookup};

/// The failures the claim engine records per key ([`reconcile_engine::Engine::op_status`]).
pub type ClaimFailures = Store<ClaimKey, OpStatus<ClaimOp, ClaimError>>;

/// A claim's state for people: phase, volume and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimState {
    /// The phase.
    pub phase: ClaimPhase,
    /// The volume it is bound to (or was, when Lost).
    pub volume: Option<String>,
    /// Why it is not Bound: a CamelCase reason (`WaitForFirstConsumer`, `FailedBinding`,
    /// `ProvisioningFailed`, `ClaimLost`, ...).
    pub reason: Option<String>,
    /// Why, for people.
    pub message: Option<String>,
}

/// A warning or note about a claim or volume (an event for `/api/v1/events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimEvent {
    /// `PersistentVolumeClaim` or `PersistentVolume`.
    pub kind: &'static str,
    /// The namespace (empty for volumes).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// A CamelCase reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// Reads the claim engine's stores. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ClaimView {
    desired: Store<ClaimKey, ClaimDesired>,
    actual: Store<ClaimKey, ClaimActual>,
    failures: Option<ClaimFailures>,
    reconciler: ClaimReconciler,
}

/// Notices changes of claims and volumes (see [`ClaimView::subscribe`]).
#[derive(Debug)]
pub struct ClaimSubscription {
    desired: Subscription<ClaimKey>,
    actual: Subscription<ClaimKey>,
}

impl ClaimSubscription {
    /// Waits until some claim, volume or class changed since the last [`drain`](Self::drain).
    pub async fn changed(&self) {
        tokio::select! {
            () = self.desired.changed() => {}
            () = self.actual.changed() => {}
        }
    }

    /// The keys that changed, and resets.
    pub fn drain(&self) -> Vec<ClaimKey> {
        let mut keys = self.desired.drain();
        keys.extend(self.actual.drain());
        keys.sort();
        keys.dedup();
        keys
    }
}

impl ClaimView {
    /// A view of the claim engine's desired and actual stores; `reconciler` explains pending
    /// claims (it is the engine's reconciler, or one configured the same way).
    pub fn new(
        desired: Store<ClaimKey, ClaimDesired>,
        actual: Store<ClaimKey, ClaimActual>,
        reconciler: ClaimReconciler,
    ) -> Self {
        Self { desired, actual, failures: None, reconciler }
    }

    /// Also shows failed operations (provisioning, deletion) in the status.
    #[must_use]
    pub fn with_failures(mut self, failures: ClaimFailures) -> Self {
        self.failures = Some(failures);
        self
    }

    /// The desired store.
    pub fn desired(&self) -> &Store<ClaimKey, ClaimDesired> {
        &self.desired
    }

    /// The actual store.
    pub fn actual(&self) -> &Store<ClaimKey, ClaimActual> {
        &self.actual
    }

    /// The sum of its stores' [versions](Store::version) (wrapping): the same while none of them
    /// changed, and with them what [`events`](Self::events) and the status show.
    pub fn version(&self) -> u64 {
        let failures = self.failures.as_ref().map_or(0, Store::version);
        self.desired.version().wrapping_add(self.actual.version()).wrapping_add(failures)
    }

    /// Resolves once both stores have synced: the claims, volumes and classes the sources
    /// declare are known, and so are the bindings recorded before a restart. Also resolves if
    /// the claim engine is gone (there is nothing more to wait for).
    pub async fn wait_until_synced(&self) {
        let _ = self.desired.wait_until_synced().await;
        let _ = self.actual.wait_until_synced().await;
    }

    /// Notices every change of a claim, volume, class or binding.
    pub fn subscribe(&self) -> ClaimSubscription {
        ClaimSubscription { desired: self.desired.subscribe(), actual: self.actual.subscribe() }
    }

    fn desired_claim(&self, namespace: &str, name: &str) -> Option<DesiredPvc> {
        self.desired.get(&ClaimKey::claim(namespace, name)).and_then(|d| d.as_claim().cloned())
    }

    fn record(&self, claim: &DesiredPvc) -> Option<PvcActual> {
        self.actual.get(&claim.key()).and_then(|a| a.as_claim().filter(|a| a.uid == claim.uid).cloned())
    }

    fn failure(&self, key: &ClaimKey) -> Option<String> {
        self.failures.as_ref()?.get(key).map(|s| s.error.to_string())
    }

    /// The volume claim `namespace/claim` is bound to, or why there is none
    /// (`persistentvolumeclaim "data" is not bound: no persistent volume of class "fast" ...`).
    pub fn bound_volume(&self, namespace: &str, claim: &str) -> Result<PersistentVolume, BoundVolumeError> {
        let Some(c) = self.desired_claim(namespace, claim) else {
            return Err(BoundVolumeError::NotFound { claim: claim.to_owned() });
        };
        let state = self.claim_state_of(&c);
        match (state.phase, &state.volume) {
            (ClaimPhase::Bound, Some(v)) => {
                let pv = self.desired.get(&ClaimKey::Volume(v.clone())).and_then(|d| d.as_volume().cloned());
                pv.map(|pv| (*pv.pv).clone()).ok_or_else(|| BoundVolumeError::VolumeGone {
                    claim: claim.to_owned(),
                    volume: v.clone(),
                })
            }
            (ClaimPhase::Lost, v) => {
                Err(BoundVolumeError::Lost { claim: claim.to_owned(), volume: v.clone().unwrap_or_default() })
            }
            _ => Err(BoundVolumeError::NotBound {
                claim: claim.to_owned(),
                reason: state.message.clone().unwrap_or_else(|| "waiting for binding".to_owned()),
            }),
        }
    }

    /// The state of claim `namespace/name`, if it is declared.
    pub fn claim_state(&self, namespace: &str, name: &str) -> Option<ClaimState> {
        self.desired_claim(namespace, name).map(|c| self.claim_state_of(&c))
    }

    fn claim_state_of(&self, claim: &DesiredPvc) -> ClaimState {
        self.claim_state_with(claim, None)
    }

    fn claim_state_with(
        &self,
        claim: &DesiredPvc,
        decisions: Option<&BTreeMap<ClaimKey, Decision>>,
    ) -> ClaimState {
        let record = self.record(claim);
        if let Some(r) = &record
            && let Some(v) = &r.volume
        {
            return match r.phase {
                ClaimPhase::Lost => ClaimState {
                    phase: ClaimPhase::Lost,
                    volume: Some(v.clone()),
                    reason: Some("ClaimLost".into()),
                    message: Some(
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!".into(),
                    ),
                },
                phase => ClaimState { phase, volume: Some(v.clone()), reason: None, message: None },
            };
        }
        let key = claim.key();
        let owned;
        let decision = match decisions {
            Some(d) => d.get(&key),
            None => {
                owned = self.reconciler.decisions(&self.desired, &self.actual);
                owned.get(&key)
            }
        };
        let (reason, message) = match decision {
            Some(Decision::Bind(v)) => ("Binding".to_owned(), format!("binding to volume {v:?}")),
            Some(Decision::Provision { volume, provisioner }) => match self.failure(&key) {
                Some(e) => ("ProvisioningFailed".to_owned(), e),
                None => (
                    "Provisioning".to_owned(),
                    format!("provisioner {provisioner:?} is creating volume {volume:?} for the claim"),
                ),
            },
            Some(Decision::Wait { reason, message }) => ((*reason).to_owned(), message.clone()),
            None => ("Pending".to_owned(), "waiting for binding".to_owned()),
        };
        ClaimState { phase: ClaimPhase::Pending, volume: None, reason: Some(reason), message: Some(message) }
    }

    /// The declared claims with their status, sorted by namespace and name. A claim that is
    /// not bound has a condition of type `Bound`, status `False`, with the reason and message.
    pub fn persistent_volume_claims(&self) -> Vec<PersistentVolumeClaim> {
        let decisions = self.reconciler.decisions(&self.desired, &self.actual);
        let mut claims: Vec<PersistentVolumeClaim> = Vec::new();
        self.desired.for_each(|_, d| {
            let ClaimDesired::Claim(c) = d else { return };
            let state = self.claim_state_with(c, Some(&decisions));
            let mut pvc = (*c.pvc).clone();
            pvc.metadata.namespace = Some(c.namespace().to_owned());
            pvc.metadata.uid = Some(c.uid.clone());
            if c.deleting {
                pvc.metadata.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
            }
            let spec = pvc.spec.get_or_insert_with(Default::default);
            if spec.storage_class_name.is_none() && !c.class.is_empty() {
                spec.storage_class_name = Some(c.class.clone());
            }
            if let Some(v) = &state.volume {
                spec.volume_name = Some(v.clone());
            }
            let mut status = PersistentVolumeClaimStatus {
                phase: Some(state.phase.as_str().to_owned()),
                ..Default::default()
            };
            if state.phase == ClaimPhase::Bound
                && let Some(v) =
                    state.volume.as_ref().and_then(|v| self.desired.get(&ClaimKey::Volume(v.clone())))
                && let Some(v) = v.as_volume()
            {
                status.access_modes = Some(v.access_modes().to_vec());
                status.capacity = v.pv.spec.as_ref().and_then(|s| s.capacity.clone());
            }
            if let (Some(reason), Some(message)) = (&state.reason, &state.message) {
                status.conditions = Some(vec![PersistentVolumeClaimCondition {
                    type_: "Bound".into(),
                    status: "False".into(),
                    reason: Some(reason.clone()),
                    message: Some(message.clone()),
                    ..Default::default()
                }]);
            }
            pvc.status = Some(status);
            claims.push(pvc);
        });
        claims.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        claims
    }

    /// The volumes (declared and provisioned) with their status, sorted by name.
    pub fn persistent_volumes(&self) -> Vec<PersistentVolume> {
        let mut volumes: Vec<PersistentVolume> = Vec::new();
        self.desired.for_each(|key, d| {
            let ClaimDesired::Volume(v) = d else { return };
            let record = self.actual.get(key).and_then(|a| a.as_volume().cloned());
            let mut pv = (*v.pv).clone();
            let mut status = PersistentVolumeStatus::default();
            if let Some(invalid) = &v.invalid {
                status.phase = Some("Pending".into());
                status.reason = Some("Invalid".into());
                status.message = Some(invalid.to_string());
            } else if let Some(r) = &record {
                status.phase = Some(r.phase.as_str().to_owned());
                status.message = r.message.clone();
                if let Some(claim_ref) = &r.claim_ref {
                    pv.spec.get_or_insert_with(Default::default).claim_ref =
                        Some(claim_ref.to_object_reference());
                }
                if r.phase == VolumePhase::Failed {
                    status.reason = Some("VolumeFailedRecycle".into());
                }
            } else {
                status.phase = Some("Available".into());
            }
            if let Some(e) = self.failure(key) {
                status.phase = Some("Failed".into());
                status.reason = Some("VolumeFailedDelete".into());
                status.message = Some(e);
            }
            pv.status = Some(status);
            volumes.push(pv);
        });
        volumes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        volumes
    }

    /// The storage classes, sorted by name.
    pub fn storage_classes(&self) -> Vec<StorageClass> {
        let mut classes: Vec<StorageClass> = Vec::new();
        self.desired.for_each(|_, d| {
            if let ClaimDesired::Class(c) = d {
                classes.push((**c).clone());
            }
        });
        classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        classes
    }

    /// Why claims wait and volumes failed, as events (one per object, the latest reason); a claim bound
    /// to a volume a provisioner made has the external-provisioner's `ProvisioningSucceeded` (Normal,
    /// `Successfully provisioned volume NAME`).
    pub fn events(&self) -> Vec<ClaimEvent> {
        let mut events = Vec::new();
        let volumes = self.persistent_volumes();
        for pvc in self.persistent_volume_claims() {
            let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            if let Some(volume) = volume.filter(|_| bound)
                && volumes.iter().any(|v| {
                    v.metadata.name.as_deref() == Some(volume)
                        && v.metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(crate::claim::desired::ANN_PROVISIONED_BY))
                })
            {
                events.push(ClaimEvent {
                    kind: "PersistentVolumeClaim",
                    namespace: pvc.metadata.namespace.clone().unwrap_or_default(),
                    name: pvc.metadata.name.clone().unwrap_or_default(),
                    type_: "Normal",
                    reason: "ProvisioningSucceeded".to_owned(),
                    message: format!("Successfully provisioned volume {volume}"),
                });
            }
            let Some(condition) =
                pvc.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.first())
            else {
                continue;
            };
            let reason = condition.reason.clone().unwrap_or_default();
            let normal = matches!(reason.as_str(), "WaitForFirstConsumer" | "Provisioning" | "Binding");
            events.push(ClaimEvent {
                kind: "PersistentVolumeClaim",
                namespace: pvc.metadata.namespace.clone().unwrap_or_default(),
                name: pvc.metadata.name.clone().unwrap_or_default(),
                type_: if normal { "Normal" } else { "Warning" },
                reason,
                message: condition.message.clone().unwrap_or_default(),
            });
        }
        for pv in self.persistent_volumes() {
            let Some(status) = &pv.status else { continue };
            if let (Some(reason), Some(message)) = (&status.reason, &status.message) {
                events.push(ClaimEvent {
                    kind: "PersistentVolume",
                    namespace: String::new(),
                    name: pv.metadata.name.clone().unwrap_or_default(),
                    type_: "Warning",
                    reason: reason.clone(),
                    message: message.clone(),
                });
            }
        }
        events
    }
}

impl ClaimLookup for ClaimView {
    fn bound_volume(&self, pod: &DesiredPod, claim: &str) -> Result<PersistentVolume, BoundVolumeError> {
        // nodelet's own binder serves static pods only: an API pod's claims are the API server's.
        if pod.source == PodSource::Api {
            return Err(BoundVolumeError::ApiPod { claim: claim.to_owned() });
        }
        ClaimView::bound_volume(self, pod.namespace(), claim)
    }

    fn wait_synced(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(ClaimView::wait_until_synced(self))
    }
}
