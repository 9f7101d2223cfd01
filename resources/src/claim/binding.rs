//! The binding rules, as the kube-controller-manager's PV controller applies them.
//!
//! [`decide`] looks at every unbound claim, oldest first, and says what should happen to it:
//! bind to a volume, provision one, or wait (and why). It is a pure function of the two stores,
//! so every key the reconciler plans sees the same assignment and no volume is given to two
//! claims.
//!
//! The rules:
//! - a claim asking for a volume by name (`spec.volumeName`) gets that volume if it is free (or
//!   pre-bound to the claim) and satisfies the claim, whatever the binding mode;
//! - a volume pre-bound to a claim (`spec.claimRef`) goes to that claim only;
//! - otherwise the smallest Available volume of the claim's class whose access modes include the
//!   claim's, whose capacity is at least the request, whose `volumeMode` matches, whose labels
//!   match the claim's selector and whose node affinity admits this node (ties: fewer access
//!   modes, then name);
//! - with `WaitForFirstConsumer` nothing but pre-bound volumes binds until a pod on this node
//!   uses the claim;
//! - without a match, a class whose provisioner nodelet runs provisions a volume
//!   (`pvc-<claim uid>`); anything else waits with a reason.
//!
//! Unlike the PV controller (which leaves node affinity to the scheduler for `Immediate`
//! classes), nodelet checks a volume's node affinity in both modes: this node is the only place
//! the claim can be used.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, PersistentVolume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use reconcile_engine::Store;

use super::actual::{ClaimActual, PvActual, PvcActual, VolumePhase};
use super::desired::{ClaimDesired, ClaimKey, DesiredPv, DesiredPvc, NO_PROVISIONER};
use super::driver::ProvisionerSet;

/// This node, as volumes' node affinity sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node name.
    pub name: String,
    /// The node labels: at least `kubernetes.io/hostname`, `kubernetes.io/os` and
    /// `kubernetes.io/arch`.
    pub labels: BTreeMap<String, String>,
    /// Labels that come and go with the node's plugins (the topology segments of registered CSI
    /// drivers, which the kubelet adds to its Node), read at each check.
    pub dynamic: DynamicLabels,
}

/// A source of node labels read at each node-affinity check (see [`NodeInfo::dynamic`]); equal
/// when both are unset or the same source.
#[derive(Clone, Default)]
pub struct DynamicLabels(pub Option<std::sync::Arc<dyn Fn() -> BTreeMap<String, String> + Send + Sync>>);

impl std::fmt::Debug for DynamicLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "DynamicLabels(Some(..))" } else { "DynamicLabels(None)" })
    }
}

impl PartialEq for DynamicLabels {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for DynamicLabels {}

impl NodeInfo {
    /// Node `name` with the well-known labels the kubelet sets.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64le",
            other => other,
        };
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("kubernetes.io/arch".to_owned(), arch.to_owned()),
        ]);
        Self { name, labels, dynamic: DynamicLabels::default() }
    }

    /// Adds labels read at each check (the registered CSI drivers' topology segments).
    pub fn with_dynamic_labels(
        mut self,
        labels: std::sync::Arc<dyn Fn() -> BTreeMap<String, String> + Send + Sync>,
    ) -> Self {
        self.dynamic = DynamicLabels(Some(labels));
        self
    }

    /// Whether `pv`'s `nodeAffinity` admits this node (a volume without one fits every node).
    pub fn admits(&self, pv: &PersistentVolume) -> bool {
        let Some(required) =
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
        else {
            return true;
        };
        let mut labels = self.dynamic.0.as_ref().map(|f| f()).unwrap_or_default();
        labels.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        required.node_selector_terms.iter().any(|term| {
            let exprs = term.match_expressions.as_deref().unwrap_or_default();
            let fields = term.match_fields.as_deref().unwrap_or_default();
            // An empty term matches nothing, as in Kubernetes.
            (!exprs.is_empty() || !fields.is_empty())
                && exprs.iter().all(|r| node_requirement(r, labels.get(&r.key).map(String::as_str)))
                && fields.iter().all(|r| {
                    let value = (r.key == "metadata.name").then_some(self.name.as_str());
                    node_requirement(r, value)
                })
        })
    }
}

fn node_requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [limit]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else {
                return false;
            };
            let Ok(limit) = limit.parse::<i64>() else { return false };
            if r.operator == "Gt" { v > limit } else { v < limit }
        }
        _ => false,
    }
}

/// Whether `labels` match a label selector (`matchLabels` and `matchExpressions`).
pub fn selector_matches(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    selector.match_labels.iter().flatten().all(|(k, v)| get(k) == Some(v.as_str()))
        && selector.match_expressions.iter().flatten().all(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            let value = get(&r.key);
            match r.operator.as_str() {
                "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
                "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// What should happen to an unbound claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bind it to this volume.
    Bind(String),
    /// Have this provisioner create volume `volume` for it.
    Provision {
        /// The volume name (`pvc-<claim uid>`).
        volume: String,
        /// The provisioner (the class's `provisioner`).
        provisioner: String,
    },
    /// Nothing can be done now.
    Wait {
        /// A short CamelCase reason, as an event's (`FailedBinding`, `WaitForFirstConsumer`,
        /// `ExternalProvisioning`, `ProvisioningFailed`, `Provisioning`).
        reason: &'static str,
        /// Why, for people.
        message: String,
    },
}

impl Decision {
    fn wait(reason: &'static str, message: impl Into<String>) -> Self {
        Decision::Wait { reason, message: message.into() }
    }
}

/// The name of the volume provisioned for the claim with UID `uid` (as the PV controller names it).
pub fn provisioned_volume_name(uid: &str) -> String {
    format!("pvc-{uid}")
}

/// Why a volume does not satisfy the claim that names it ([`check_volume_satisfies_claim`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MismatchError {
    /// The volume's capacity is below the claim's request (both as written in the objects).
    #[error("requested PV is too small: it has {capacity}, the claim requests {request}")]
    TooSmall {
        /// The volume's `spec.capacity.storage` (`0` when absent).
        capacity: String,
        /// The claim's `spec.resources.requests.storage`.
        request: String,
    },
    /// The storage classes differ.
    #[error("storageClassName does not match: the volume has {volume:?}, the claim {claim:?}")]
    Class {
        /// The volume's class.
        volume: String,
        /// The claim's class.
        claim: String,
    },
    /// The volume modes (Filesystem, Block) differ.
    #[error("incompatible volumeMode")]
    VolumeMode,
    /// The volume lacks an access mode the claim asks for.
    #[error("incompatible accessMode")]
    AccessMode,
}

/// Whether `volume` satisfies `claim` when the claim names it (`spec.volumeName`): capacity,
/// class, volume mode and access modes (`checkVolumeSatisfyClaim`).
pub fn check_volume_satisfies_claim(volume: &DesiredPv, claim: &DesiredPvc) -> Result<(), MismatchError> {
    if volume.capacity() < claim.request() {
        return Err(MismatchError::TooSmall {
            capacity: volume.capacity_text().unwrap_or("0").to_owned(),
            request: claim.request_text().to_owned(),
        });
    }
    if volume.class() != claim.class {
        return Err(MismatchError::Class { volume: volume.class().to_owned(), claim: claim.class.clone() });
    }
    if volume.volume_mode() != claim.volume_mode() {
        return Err(MismatchError::VolumeMode);
    }
    if !access_modes_satisfied(volume, claim) {
        return Err(MismatchError::AccessMode);
    }
    Ok(())
}

/// Whether the volume offers every access mode the claim asks for.
pub fn access_modes_satisfied(volume: &DesiredPv, claim: &DesiredPvc) -> bool {
    claim.access_modes().iter().all(|m| volume.access_modes().contains(m))
}

/// Sizes as people write them: `5Gi`, `512Mi`, or bytes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] =
        [("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The volume's controller-set or pre-bound claim reference.
pub fn effective_claim_ref(
    volume: &DesiredPv,
    actual: Option<&PvActual>,
) -> Option<super::desired::ClaimRef> {
    actual.and_then(|a| a.claim_ref.clone()).or_else(|| volume.spec_claim_ref())
}

struct Snapshot {
    volumes: Vec<(DesiredPv, Option<PvActual>)>,
    claims: Vec<(DesiredPvc, Option<PvcActual>)>,
}

impl Snapshot {
    fn read(desired: &Store<ClaimKey, ClaimDesired>, actual: &Store<ClaimKey, ClaimActual>) -> Self {
        let mut volumes = Vec::new();
        let mut claims = Vec::new();
        desired.for_each(|key, d| match d {
            ClaimDesired::Volume(v) => {
                let a = actual.get(key).and_then(|a| a.as_volume().cloned());
                volumes.push((v.clone(), a));
            }
            ClaimDesired::Claim(c) => {
                let a = actual.get(key).and_then(|a| a.as_claim().cloned()).filter(|a| a.uid == c.uid);
                claims.push((c.clone(), a));
            }
            ClaimDesired::Class(_) => {}
        });
        volumes.sort_by(|a, b| a.0.name().cmp(b.0.name()));
        // First come, first served; then by name for a stable order.
        claims.sort_by(|a, b| {
            (a.0.created().map(|t| t.0), a.0.namespace(), a.0.name()).cmp(&(
                b.0.created().map(|t| t.0),
                b.0.namespace(),
                b.0.name(),
            ))
        });
        Self { volumes, claims }
    }
}

/// What should happen to every claim that is not bound yet (claims whose record names a volume
/// are left out), keyed by claim.
pub fn decide(
    desired: &Store<ClaimKey, ClaimDesired>,
    actual: &Store<ClaimKey, ClaimActual>,
    node: &NodeInfo,
    provisioners: &ProvisionerSet,
) -> BTreeMap<ClaimKey, Decision> {
    let snap = Snapshot::read(desired, actual);
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut decisions = BTreeMap::new();
    // Bindings already under way (the volume side is done) hold their volume first.
    for (claim, a) in &snap.claims {
        if a.as_ref().is_some_and(|a| a.volume.is_some()) || claim.invalid.is_some() {
            continue;
        }
        let started = snap.volumes.iter().find(|(v, va)| {
            !taken.contains(v.name())
                && va.as_ref().and_then(|a| a.claim_ref.as_ref()).is_some_and(|r| r.designates(claim))
                && va.as_ref().is_some_and(|a| !a.deleted && a.phase == VolumePhase::Bound)
        });
        if let Some((v, _)) = started {
            taken.insert(v.name().to_owned());
            decisions.insert(claim.key(), Decision::Bind(v.name().to_owned()));
        }
    }
    // Volumes bound (or pre-bound) to some claim are out of the pool for every other claim.
    for (claim, a) in &snap.claims {
        let key = claim.key();
        if decisions.contains_key(&key) || a.as_ref().is_some_and(|a| a.volume.is_some()) {
            continue;
        }
        let decision = decide_one(&snap, claim, a.as_ref(), &taken, node, provisioners);
        if let Decision::Bind(v) = &decision {
            taken.insert(v.clone());
        }
        decisions.insert(key, decision);
    }
    decisions
}

fn decide_one(
    snap: &Snapshot,
    claim: &DesiredPvc,
    actual: Option<&PvcActual>,
    taken: &BTreeSet<String>,
    node: &NodeInfo,
    provisioners: &ProvisionerSet,
) -> Decision {
    if let Some(invalid) = &claim.invalid {
        return Decision::wait("FailedBinding", format!("invalid claim: {invalid}"));
    }
    if let Some(name) = claim.volume_name() {
        let Some((v, va)) = snap.volumes.iter().find(|(v, _)| v.name() == name) else {
            return Decision::wait(
                "FailedBinding",
                format!("volume {name:?} requested by the claim does not exist"),
            );
        };
        let other_claim = effective_claim_ref(v, va.as_ref()).is_some_and(|r| !r.designates(claim));
        if taken.contains(name) || other_claim || va.as_ref().is_some_and(|a| a.deleted) {
            return Decision::wait(
                "FailedBinding",
                format!("volume {name:?} requested by the claim is already bound to a different claim"),
            );
        }
        if let Some(invalid) = &v.invalid {
            return Decision::wait("FailedBinding", format!("volume {name:?} is invalid: {invalid}"));
        }
        if let Err(e) = check_volume_satisfies_claim(v, claim) {
            return Decision::wait("FailedBinding", format!("cannot bind to requested volume {name:?}: {e}"));
        }
        if !node.admits(&v.pv) {
            return Decision::wait(
                "FailedBinding",
                format!("volume {name:?} has a node affinity that does not admit node {:?}", node.name),
            );
        }
        return Decision::Bind(name.to_owned());
    }
    let delay = claim.wait_for_first_consumer() && !claim.in_use;
    if let Some(v) = find_best(snap, claim, taken, node, delay) {
        return Decision::Bind(v.name().to_owned());
    }
    if delay {
        return Decision::wait(
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding",
        );
    }
    if claim.class.is_empty() {
        return Decision::wait(
            "FailedBinding",
            format!(
                "no persistent volumes available for this claim and no storage class is set: {}",
                no_match(snap, claim, node)
            ),
        );
    }
    let Some(class) = &claim.storage_class else {
        return Decision::wait(
            "FailedBinding",
            format!(
                "storageclass.storage.k8s.io {:?} not found: {}",
                claim.class,
                no_match(snap, claim, node)
            ),
        );
    };
    if class.provisioner == NO_PROVISIONER {
        return Decision::wait("FailedBinding", no_match(snap, claim, node));
    }
    if !provisioners.handles(&class.provisioner) {
        return Decision::wait(
            "ExternalProvisioning",
            format!(
                "waiting for a volume to be created by the provisioner {:?}, which nodelet does not run, \
                 or declared in the manifests: {}",
                class.provisioner,
                no_match(snap, claim, node)
            ),
        );
    }
    if claim.pvc.spec.as_ref().is_some_and(|s| s.selector.is_some()) {
        return Decision::wait(
            "ProvisioningFailed",
            "claim.Spec.Selector is not supported for dynamic provisioning",
        );
    }
    let volume = provisioned_volume_name(&claim.uid);
    if actual.and_then(|a| a.provisioned.as_ref()).is_some_and(|p| p.done && p.volume == volume) {
        return Decision::wait(
            "Provisioning",
            format!("volume {volume:?} was provisioned by {:?}; binding it", class.provisioner),
        );
    }
    Decision::Provision { volume, provisioner: class.provisioner.clone() }
}

/// The best volume for a claim without `volumeName` (`FindMatchingVolume`).
fn find_best<'a>(
    snap: &'a Snapshot,
    claim: &DesiredPvc,
    taken: &BTreeSet<String>,
    node: &NodeInfo,
    delay: bool,
) -> Option<&'a DesiredPv> {
    let selector = claim.pvc.spec.as_ref().and_then(|s| s.selector.as_ref());
    let mut best: Option<&DesiredPv> = None;
    for (v, va) in &snap.volumes {
        if taken.contains(v.name()) || v.invalid.is_some() || va.as_ref().is_some_and(|a| a.deleted) {
            continue;
        }
        let claim_ref = effective_claim_ref(v, va.as_ref());
        if claim_ref.as_ref().is_some_and(|r| !r.designates(claim)) {
            continue;
        }
        if v.capacity() < claim.request() || v.volume_mode() != claim.volume_mode() {
            continue;
        }
        if !access_modes_satisfied(v, claim) {
            continue;
        }
        let fits_node = node.admits(&v.pv);
        if claim_ref.is_some() {
            // Pre-bound to this claim: it or nothing.
            return fits_node.then_some(v);
        }
        if delay {
            continue;
        }
        let available = va.as_ref().is_none_or(|a| a.phase == VolumePhase::Available);
        if !available
            || selector.is_some_and(|s| !selector_matches(s, v.labels()))
            || v.class() != claim.class
            || !fits_node
        {
            continue;
        }
        let better = best.is_none_or(|b| {
            (v.capacity(), v.access_modes().len(), v.name())
                < (b.capacity(), b.access_modes().len(), b.name())
        });
        if better {
            best = Some(v);
        }
    }
    best
}

/// Why no volume matches: what the claim asks for, and the nearest miss.
fn no_match(snap: &Snapshot, claim: &DesiredPvc, node: &NodeInfo) -> String {
    let class = if claim.class.is_empty() {
        "without a storage class".to_owned()
    } else {
        format!("of class {:?}", claim.class)
    };
    let mut message = format!(
        "no persistent volume {class} with at least {} and access modes [{}] is available",
        claim.request_text(),
        claim.access_modes().join(",")
    );
    let candidates: Vec<&DesiredPv> = snap
        .volumes
        .iter()
        .filter(|(v, va)| {
            v.invalid.is_none()
                && v.class() == claim.class
                && effective_claim_ref(v, va.as_ref()).is_none()
                && va.as_ref().is_none_or(|a| a.phase == VolumePhase::Available)
        })
        .map(|(v, _)| v)
        .collect();
    let with_modes: Vec<&&DesiredPv> =
        candidates.iter().filter(|v| access_modes_satisfied(v, claim)).collect();
    if let Some(largest) = with_modes.iter().map(|v| v.capacity()).max()
        && largest < claim.request()
    {
        message.push_str(&format!(" (the largest available one has {})", format_bytes(largest)));
    } else if with_modes.iter().any(|v| v.capacity() >= claim.request() && !node.admits(&v.pv)) {
        message.push_str(&format!(" (the ones large enough do not allow node {:?})", node.name));
    } else if with_modes.is_empty() && !candidates.is_empty() {
        message.push_str(" (the available ones lack the access modes)");
    }
    message
}
