//! The claim reconciler: binds claims and volumes in two steps, as the PV controller does
//! (first the volume records its claim, then the claim its volume), releases and reclaims
//! volumes whose claim is gone, and marks claims whose volume is gone Lost.
//!
//! Decisions that involve several objects come from [`decide`], a pure function of both
//! stores. A volume's next step depends on its claim's state and the other way round, and who
//! binds to what depends on every unbound claim and volume: [`watch_related`] declares the
//! engine's relations on its own two stores, which plan again, when a key changes, the keys
//! [`related_keys`] names. What can be provisioned, and the node's labels, may depend on a store
//! of provisioners kept elsewhere (the daemon's registered CSI drivers): [`watch_provisioners`]
//! declares a relation on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use reconcile_engine::{Driver, EngineBuilder, Plan, Reconciler, Store, Update, View};

use super::actual::{ClaimActual, ClaimPhase, Provisioned, PvActual, PvcActual, VolumePhase};
use super::binding::{Decision, NodeInfo, decide};
use super::desired::{ClaimDesired, ClaimKey, ClaimRef, DesiredPv, DesiredPvc};
use super::driver::{ProvisionRequest, ProvisionerSet};
use super::ops::ClaimOp;

/// The claim reconciler.
#[derive(Debug, Clone)]
pub struct ClaimReconciler {
    node: NodeInfo,
    provisioners: ProvisionerSet,
}

impl ClaimReconciler {
    /// A reconciler for this `node`, knowing which provisioners run.
    pub fn new(node: NodeInfo, provisioners: ProvisionerSet) -> Self {
        Self { node, provisioners }
    }

    /// This node.
    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The provisioners that run.
    pub fn provisioners(&self) -> &ProvisionerSet {
        &self.provisioners
    }

    /// What should happen to every unbound claim.
    pub fn decisions(
        &self,
        desired: &Store<ClaimKey, ClaimDesired>,
        actual: &Store<ClaimKey, ClaimActual>,
    ) -> BTreeMap<ClaimKey, Decision> {
        decide(desired, actual, &self.node, &self.provisioners)
    }

    fn volume(&self, view: &View<'_, ClaimKey, ClaimDesired, ClaimActual>, name: &str) -> Plan<ClaimOp> {
        let desired = view.desired.and_then(ClaimDesired::as_volume);
        let actual = view.actual.and_then(ClaimActual::as_volume);
        let Some(d) = desired else {
            return if view.actual.is_some() { Plan::Run(ClaimOp::Forget) } else { Plan::Idle };
        };
        if d.invalid.is_some() || actual.is_some_and(|a| a.deleted) {
            return Plan::Idle;
        }
        let claim_of = |r: &ClaimRef| -> Option<DesiredPvc> {
            view.desired_store.get(&r.key()).and_then(|c| c.as_claim().filter(|c| r.designates(c)).cloned())
        };
        let claim_record = |c: &DesiredPvc| -> Option<PvcActual> {
            view.actual_store.get(&c.key()).and_then(|a| a.as_claim().filter(|a| a.uid == c.uid).cloned())
        };
        if let Some(a) = actual
            && let Some(r) = &a.claim_ref
        {
            let Some(claim) = claim_of(r) else { return self.released(view, d, a, r) };
            let bound = || {
                if a.phase == VolumePhase::Bound {
                    Plan::Idle
                } else {
                    Plan::Run(ClaimOp::BindVolume(PvActual::bound(r.clone(), a.bound_by_controller)))
                }
            };
            return match claim_record(&claim).and_then(|c| c.volume) {
                Some(v) if v == name => bound(),
                Some(_) if a.bound_by_controller => Plan::Run(ClaimOp::UnbindVolume),
                Some(_) => Plan::Idle,
                None => bound(),
            };
        }
        if let Some(r) = d.spec_claim_ref() {
            return match claim_of(&r) {
                Some(c)
                    if self.decisions(view.desired_store, view.actual_store).get(&c.key())
                        == Some(&Decision::Bind(name.to_owned())) =>
                {
                    Plan::Run(ClaimOp::BindVolume(PvActual::bound(c.claim_ref(), false)))
                }
                Some(_) => Plan::Idle,
                // Pre-bound to a claim UID that no longer exists (a provisioned volume whose
                // claim went away before binding): released.
                None if !r.uid.is_empty() && view.desired_synced => {
                    let released = PvActual {
                        claim_ref: Some(r.clone()),
                        bound_by_controller: false,
                        phase: VolumePhase::Released,
                        message: None,
                        deleted: false,
                    };
                    Plan::Run(ClaimOp::ReleaseVolume(released))
                }
                None => Plan::Idle,
            };
        }
        // A claim whose record still names this volume (it was Lost while the volume was gone).
        let mut lost = None;
        view.desired_store.for_each(|key, c| {
            if let ClaimDesired::Claim(c) = c
                && lost.is_none()
                && view
                    .actual_store
                    .get(key)
                    .and_then(|a| a.as_claim().cloned())
                    .is_some_and(|a| a.uid == c.uid && a.volume.as_deref() == Some(name))
            {
                lost = Some(c.claim_ref());
            }
        });
        if let Some(r) = lost {
            return Plan::Run(ClaimOp::BindVolume(PvActual::bound(r, true)));
        }
        let decisions = self.decisions(view.desired_store, view.actual_store);
        let chosen = decisions.iter().find(|(_, d)| **d == Decision::Bind(name.to_owned()));
        if let Some((key, _)) = chosen
            && let Some(c) = view.desired_store.get(key).and_then(|c| c.as_claim().cloned())
        {
            return Plan::Run(ClaimOp::BindVolume(PvActual::bound(c.claim_ref(), true)));
        }
        Plan::Idle
    }

    /// A volume whose claim is gone: Released, then reclaimed as its policy says.
    fn released(
        &self,
        view: &View<'_, ClaimKey, ClaimDesired, ClaimActual>,
        d: &DesiredPv,
        a: &PvActual,
        r: &ClaimRef,
    ) -> Plan<ClaimOp> {
        if !view.desired_synced {
            return Plan::Idle;
        }
        let with = |phase, message: Option<String>| PvActual {
            claim_ref: Some(r.clone()),
            bound_by_controller: a.bound_by_controller,
            phase,
            message,
            deleted: false,
        };
        match a.phase {
            VolumePhase::Available | VolumePhase::Bound => {
                Plan::Run(ClaimOp::ReleaseVolume(with(VolumePhase::Released, None)))
            }
            VolumePhase::Failed => Plan::Idle,
            VolumePhase::Released => match d.reclaim_policy() {
                "Delete" => match d.provisioned_by().filter(|p| self.provisioners.handles(p)) {
                    // The annotation alone proves nothing (a manifest can write it): only a volume nodelet's
                    // own provisioning record holds has its storage deleted.
                    Some(p) if !d.provisioned => Plan::Run(ClaimOp::FailVolume(with(
                        VolumePhase::Failed,
                        Some(format!(
                            "volume {:?} says it was provisioned by {p:?} but nodelet has no provisioning record of \
                             it: its storage is not deleted",
                            d.name()
                        )),
                    ))),
                    Some(p) => Plan::Run(ClaimOp::DeleteVolume {
                        pv: d.pv.clone(),
                        provisioner: p.to_owned(),
                        after: PvActual {
                            deleted: true,
                            message: Some(format!("deleted by {p:?} (reclaim policy Delete)")),
                            ..with(VolumePhase::Released, None)
                        },
                    }),
                    None => Plan::Run(ClaimOp::FailVolume(with(
                        VolumePhase::Failed,
                        Some(format!(
                            "error getting deleter volume plugin for volume {:?}: no deletable volume plugin matched",
                            d.name()
                        )),
                    ))),
                },
                "Recycle" => Plan::Run(ClaimOp::FailVolume(with(
                    VolumePhase::Failed,
                    Some("No recycler plugin found for the volume!".into()),
                ))),
                _ => Plan::Idle,
            },
        }
    }

    fn claim(&self, view: &View<'_, ClaimKey, ClaimDesired, ClaimActual>) -> Plan<ClaimOp> {
        let desired = view.desired.and_then(ClaimDesired::as_claim);
        let actual = view.actual.and_then(ClaimActual::as_claim);
        let Some(d) = desired else {
            return if view.actual.is_some() { Plan::Run(ClaimOp::Forget) } else { Plan::Idle };
        };
        if let Some(a) = actual {
            // The record of an earlier claim of the same name.
            if a.uid != d.uid {
                return Plan::Run(ClaimOp::Forget);
            }
            if let Some(v) = &a.volume {
                let key = ClaimKey::Volume(v.clone());
                let exists = view.desired_store.get(&key).is_some_and(|d| d.as_volume().is_some());
                let vref =
                    view.actual_store.get(&key).and_then(|a| a.as_volume().and_then(|a| a.claim_ref.clone()));
                let with = |phase| PvcActual { phase, ..a.clone() };
                return match (exists, vref) {
                    (false, _) if !view.desired_synced => Plan::Idle,
                    (true, Some(r)) if r.designates(d) => {
                        if a.phase == ClaimPhase::Bound {
                            Plan::Idle
                        } else {
                            Plan::Run(ClaimOp::BindClaim(with(ClaimPhase::Bound)))
                        }
                    }
                    // The volume side will recover the binding.
                    (true, None) => Plan::Idle,
                    // Gone, or bound to another claim.
                    _ if a.phase == ClaimPhase::Lost => Plan::Idle,
                    _ => Plan::Run(ClaimOp::LoseClaim(with(ClaimPhase::Lost))),
                };
            }
        }
        match self.decisions(view.desired_store, view.actual_store).remove(&d.key()) {
            Some(Decision::Bind(v)) => {
                let volume_side = view
                    .actual_store
                    .get(&ClaimKey::Volume(v.clone()))
                    .and_then(|a| a.as_volume().and_then(|a| a.claim_ref.clone()))
                    .is_some_and(|r| r.designates(d));
                if volume_side {
                    Plan::Run(ClaimOp::BindClaim(PvcActual {
                        uid: d.uid.clone(),
                        volume: Some(v),
                        phase: ClaimPhase::Bound,
                        provisioned: actual.and_then(|a| a.provisioned.clone()),
                    }))
                } else {
                    Plan::Idle
                }
            }
            Some(Decision::Provision { volume, .. }) => match &d.storage_class {
                Some(class) => Plan::Run(ClaimOp::Provision(Arc::new(ProvisionRequest {
                    volume_name: volume,
                    claim: d.claim_ref(),
                    class: class.clone(),
                    capacity: d.request(),
                    access_modes: d.access_modes().to_vec(),
                    volume_mode: d.volume_mode().to_owned(),
                    node: self.node.clone(),
                }))),
                None => Plan::Idle,
            },
            _ => Plan::Idle,
        }
    }
}

impl Reconciler<ClaimDesired, ClaimActual> for ClaimReconciler {
    type Key = ClaimKey;
    type Op = ClaimOp;
    type Inputs = ();

    fn reconcile(&self, view: &View<'_, ClaimKey, ClaimDesired, ClaimActual>) -> Plan<ClaimOp> {
        match view.key {
            ClaimKey::Volume(name) => self.volume(view, name),
            ClaimKey::Claim { .. } => self.claim(view),
            ClaimKey::Class(_) => Plan::Idle,
        }
    }

    fn uncertain(&self, _key: &ClaimKey, op: &ClaimOp, _actual: Option<&ClaimActual>) -> Update<ClaimActual> {
        match op {
            // Storage may exist: remember the name, so provisioning runs again (idempotent)
            // rather than forgetting it.
            ClaimOp::Provision(request) => Update::Set(ClaimActual::Claim(PvcActual {
                uid: request.claim.uid.clone(),
                volume: None,
                phase: ClaimPhase::Pending,
                provisioned: Some(Provisioned { volume: request.volume_name.clone(), done: false }),
            })),
            // Record writes and deletions are retried as planned again.
            _ => Update::Keep,
        }
    }
}

/// The keys to plan again when `changed` changed in the claim pair's desired or actual store:
///
/// - its counterparts: for a volume, the claim its spec or its binding names and the claims
///   whose record names it; for a claim, the volume its spec or its record names and the volumes
///   whose spec or binding names it (found by scanning, so this works for removed keys too);
/// - every claim not yet bound (no volume in its record) and every volume not bound to a claim:
///   who binds to what ([`decide`]) depends on all of them, so any change may change their plans.
///
/// Bound pairs that the change does not touch are left alone. StorageClasses are never planned.
pub fn related_keys(
    desired: &Store<ClaimKey, ClaimDesired>,
    actual: &Store<ClaimKey, ClaimActual>,
    changed: &ClaimKey,
) -> Vec<ClaimKey> {
    let mut keys = std::collections::BTreeSet::new();
    match changed {
        ClaimKey::Volume(name) => {
            let key = ClaimKey::Volume(name.clone());
            if let Some(r) = desired.get(&key).and_then(|d| d.as_volume().and_then(DesiredPv::spec_claim_ref))
            {
                keys.insert(r.key());
            }
            if let Some(r) = actual.get(&key).and_then(|a| a.as_volume().and_then(|a| a.claim_ref.clone())) {
                keys.insert(r.key());
            }
        }
        ClaimKey::Claim { .. } => {
            if let Some(v) = desired
                .get(changed)
                .and_then(|d| d.as_claim().and_then(|c| c.volume_name().map(str::to_owned)))
            {
                keys.insert(ClaimKey::Volume(v));
            }
            if let Some(v) = actual.get(changed).and_then(|a| a.as_claim().and_then(|c| c.volume.clone())) {
                keys.insert(ClaimKey::Volume(v));
            }
        }
        ClaimKey::Class(_) => {}
    }
    desired.for_each(|key, d| match d {
        ClaimDesired::Volume(v) => {
            let bound = actual.get(key).is_some_and(|a| a.as_volume().is_some_and(|a| a.claim_ref.is_some()));
            if !bound || v.spec_claim_ref().is_some_and(|r| r.key() == *changed) {
                keys.insert(key.clone());
            }
        }
        ClaimDesired::Claim(_)
            if actual.get(key).and_then(|a| a.as_claim().map(|c| c.volume.is_none())).unwrap_or(true) =>
        {
            keys.insert(key.clone());
        }
        _ => {}
    });
    actual.for_each(|key, a| match a {
        ClaimActual::Volume(v) if v.claim_ref.as_ref().is_some_and(|r| r.key() == *changed) => {
            keys.insert(key.clone());
        }
        ClaimActual::Claim(c)
            if matches!(changed, ClaimKey::Volume(name) if c.volume.as_deref() == Some(name.as_str())) =>
        {
            keys.insert(key.clone());
        }
        _ => {}
    });
    keys.remove(changed);
    keys.into_iter().collect()
}

/// Declares the claim engine's relations on its own stores (`desired`, the store `builder` was
/// made with, and the builder's actual store): a change of a key plans its [`related_keys`]
/// again (the changed key itself the engine plans anyway).
pub fn watch_related<Dr>(
    builder: EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>,
    desired: &Store<ClaimKey, ClaimDesired>,
) -> EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>
where
    Dr: Driver<ClaimKey, ClaimOp, ClaimActual>,
{
    let actual = builder.actual();
    let (d, a) = (desired.clone(), actual.clone());
    let on_desired = move |key: &ClaimKey, _: Option<&ClaimDesired>| related_keys(&d, &a, key);
    let (d, a) = (desired.clone(), actual.clone());
    let on_actual = move |key: &ClaimKey, _: Option<&ClaimActual>| related_keys(&d, &a, key);
    builder.watches("desired", desired.clone(), on_desired).watches("actual", actual, on_actual)
}

/// Declares a relation named `name` on `provisioners`, a store keyed by provisioner name (the
/// `provisioner` of a StorageClass) whose entries change what the reconciler decides: whether a
/// provisioner of the [`ProvisionerSet`] serves that name, and possibly the labels of the
/// [`NodeInfo`] (a CSI driver's topology). When an entry is set or removed, the claims of
/// `desired` whose class names that provisioner are planned again; every claim and every volume
/// are when `affects_all` says so for the entry's new value (`None`: removed), for a change that
/// may move the node's labels (which volumes a claim may bind to: the volume takes the first step
/// of a binding, so it is planned too).
///
/// The reconciler does not read `provisioners` itself: its [`ProvisionerSet`] and [`NodeInfo`]
/// are to answer from the same source, updated no later than the store.
pub fn watch_provisioners<V, Dr>(
    builder: EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>,
    name: &str,
    desired: &Store<ClaimKey, ClaimDesired>,
    provisioners: Store<String, V>,
    affects_all: impl Fn(Option<&V>) -> bool + Send + Sync + 'static,
) -> EngineBuilder<ClaimDesired, ClaimActual, ClaimReconciler, Dr>
where
    V: Send + Sync + 'static,
    Dr: Driver<ClaimKey, ClaimOp, ClaimActual>,
{
    let desired = desired.clone();
    let claims_of = move |provisioner: &String, value: Option<&V>| {
        let all = affects_all(value);
        let mut keys = Vec::new();
        desired.for_each(|key, d| {
            let related = match d {
                ClaimDesired::Claim(c) => {
                    all || c.storage_class.as_ref().is_some_and(|class| class.provisioner == *provisioner)
                }
                ClaimDesired::Volume(_) => all,
                ClaimDesired::Class(_) => false,
            };
            if related {
                keys.push(key.clone());
            }
        });
        keys
    };
    builder.watches(name, provisioners, claims_of)
}
