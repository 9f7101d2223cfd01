//! Desired state of claims and volumes: the PersistentVolume, PersistentVolumeClaim and
//! StorageClass objects, with what the binder needs already worked out (effective class, claim
//! UID, whether a pod on this node uses the claim).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use reconcile_engine::Key;
use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;

/// The key of the claim stores: one volume, one claim or one class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ClaimKey {
    /// A PersistentVolume (cluster-scoped) by name.
    Volume(String),
    /// A PersistentVolumeClaim.
    Claim {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A StorageClass (never reconciled; kept for the claims and for listing).
    Class(String),
}

impl Key for ClaimKey {}

impl ClaimKey {
    /// The key of claim `namespace/name`.
    pub fn claim(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ClaimKey::Claim { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimKey::Volume(n) => write!(f, "persistentvolume/{n}"),
            ClaimKey::Claim { namespace, name } => write!(f, "persistentvolumeclaim/{namespace}/{name}"),
            ClaimKey::Class(n) => write!(f, "storageclass/{n}"),
        }
    }
}

/// The annotation naming the provisioner that created a volume (as the PV controller writes it).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The legacy class annotation, which wins over `storageClassName` as in Kubernetes.
pub const ANN_BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The annotation marking a default StorageClass.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The provisioner name of classes without dynamic provisioning.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// Access modes, as in `accessModes`.
pub mod access_mode {
    /// `ReadWriteOnce`.
    pub const RWO: &str = "ReadWriteOnce";
    /// `ReadOnlyMany`.
    pub const ROX: &str = "ReadOnlyMany";
    /// `ReadWriteMany`.
    pub const RWX: &str = "ReadWriteMany";
    /// `ReadWriteOncePod`.
    pub const RWOP: &str = "ReadWriteOncePod";
    /// All of them.
    pub const ALL: [&str; 4] = [RWO, ROX, RWX, RWOP];
}

/// A reference from a volume to the claim it is bound (or pre-bound) to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID; empty in a pre-binding that names the claim only.
    pub uid: String,
}

impl ClaimRef {
    /// Whether this reference designates `claim` (same namespace and name, and same UID when the
    /// reference has one).
    pub fn designates(&self, claim: &DesiredPvc) -> bool {
        self.namespace == claim.namespace()
            && self.name == claim.name()
            && (self.uid.is_empty() || self.uid == claim.uid)
    }

    /// The claim's store key.
    pub fn key(&self) -> ClaimKey {
        ClaimKey::claim(&self.namespace, &self.name)
    }

    /// As a v1 `ObjectReference`.
    pub fn to_object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: (!self.uid.is_empty()).then(|| self.uid.clone()),
            ..ObjectReference::default()
        }
    }
}

/// A PersistentVolume as desired: declared in the manifests or created by a provisioner.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPv {
    /// The object (its status is ignored).
    pub pv: Arc<PersistentVolume>,
    /// Whether a provisioner of nodelet created it (it is not in the manifests).
    pub provisioned: bool,
    /// Why the object cannot be used (a missing capacity, a bad name): it never binds.
    pub invalid: Option<ValidationError>,
}

impl DesiredPv {
    /// A volume from an object, validated.
    pub fn new(pv: PersistentVolume, provisioned: bool) -> Self {
        let invalid = validate_pv(&pv).err();
        Self { pv: Arc::new(pv), provisioned, invalid }
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.pv.metadata.name.as_deref().unwrap_or_default()
    }

    /// The class: the beta annotation, else `storageClassName`, else `""`.
    pub fn class(&self) -> &str {
        self.pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_BETA_CLASS))
            .map(String::as_str)
            .or_else(|| self.pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
            .unwrap_or_default()
    }

    /// `capacity.storage` in bytes (0 when missing: such a volume is invalid).
    pub fn capacity(&self) -> u64 {
        self.pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(storage_bytes).unwrap_or(0)
    }

    /// `capacity.storage` as written.
    pub fn capacity_text(&self) -> Option<&str> {
        self.pv.spec.as_ref()?.capacity.as_ref()?.get("storage").map(|q| q.0.as_str())
    }

    /// The access modes.
    pub fn access_modes(&self) -> &[String] {
        self.pv.spec.as_ref().and_then(|s| s.access_modes.as_deref()).unwrap_or_default()
    }

    /// `persistentVolumeReclaimPolicy`, defaulted to `Retain` (the API's default for static
    /// volumes; provisioners copy the class's policy).
    pub fn reclaim_policy(&self) -> &str {
        self.pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()).unwrap_or("Retain")
    }

    /// `volumeMode`, defaulted to `Filesystem`.
    pub fn volume_mode(&self) -> &str {
        self.pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem")
    }

    /// The pre-binding in `spec.claimRef`, if any.
    pub fn spec_claim_ref(&self) -> Option<ClaimRef> {
        let r = self.pv.spec.as_ref()?.claim_ref.as_ref()?;
        Some(ClaimRef {
            namespace: r.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()),
            name: r.name.clone()?,
            uid: r.uid.clone().unwrap_or_default(),
        })
    }

    /// The provisioner that created the volume (annotation `pv.kubernetes.io/provisioned-by`).
    pub fn provisioned_by(&self) -> Option<&str> {
        self.pv.metadata.annotations.as_ref()?.get(ANN_PROVISIONED_BY).map(String::as_str)
    }

    /// The labels.
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.pv.metadata.labels.as_ref()
    }
}

/// A PersistentVolumeClaim as desired, with its effective class.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredPvc {
    /// The object (its status is ignored), namespace defaulted.
    pub pvc: Arc<PersistentVolumeClaim>,
    /// The claim's UID: `metadata.uid`, else the one it was bound with, else one made up when
    /// the claim first appeared. A claim deleted and declared again is a new claim.
    pub uid: String,
    /// The effective class name (`""`: no class). An unset `storageClassName` takes the
    /// default class, as the DefaultStorageClass admission plugin does.
    pub class: String,
    /// The class object, when it exists.
    pub storage_class: Option<Arc<StorageClass>>,
    /// Whether a desired pod on this node uses the claim (for `WaitForFirstConsumer`).
    pub in_use: bool,
    /// The claim was removed from the manifests but a pod still uses it: kept until the pod is
    /// gone (the `kubernetes.io/pvc-protection` finalizer).
    pub deleting: bool,
    /// Why the object cannot be bound (no access mode, a bad size): it stays Pending.
    pub invalid: Option<ValidationError>,
}

impl DesiredPvc {
    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.pvc.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.pvc.metadata.name.as_deref().unwrap_or_default()
    }

    /// The store key.
    pub fn key(&self) -> ClaimKey {
        ClaimKey::claim(self.namespace(), self.name())
    }

    /// A reference to this claim, with its UID.
    pub fn claim_ref(&self) -> ClaimRef {
        ClaimRef { namespace: self.namespace().into(), name: self.name().into(), uid: self.uid.clone() }
    }

    /// `resources.requests.storage` in bytes (0 when missing: such a claim is invalid).
    pub fn request(&self) -> u64 {
        self.pvc
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(storage_bytes)
            .unwrap_or(0)
    }

    /// `resources.requests.storage` as written.
    pub fn request_text(&self) -> &str {
        self.pvc
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.as_str())
            .unwrap_or("0")
    }

    /// The access modes asked for.
    pub fn access_modes(&self) -> &[String] {
        self.pvc.spec.as_ref().and_then(|s| s.access_modes.as_deref()).unwrap_or_default()
    }

    /// `volumeMode`, defaulted to `Filesystem`.
    pub fn volume_mode(&self) -> &str {
        self.pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem")
    }

    /// `volumeName`: the volume the claim asks for by name.
    pub fn volume_name(&self) -> Option<&str> {
        self.pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty())
    }

    /// Whether the class binds only once a pod uses the claim (`WaitForFirstConsumer`).
    pub fn wait_for_first_consumer(&self) -> bool {
        self.storage_class
            .as_ref()
            .and_then(|c| c.volume_binding_mode.as_deref())
            .is_some_and(|m| m == "WaitForFirstConsumer")
    }

    /// The creation timestamp, for first-come-first-served binding.
    pub fn created(&self) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
        self.pvc.metadata.creation_timestamp.as_ref()
    }
}

/// One entry of the desired claim store.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimDesired {
    /// A PersistentVolume.
    Volume(DesiredPv),
    /// A PersistentVolumeClaim.
    Claim(DesiredPvc),
    /// A StorageClass.
    Class(Arc<StorageClass>),
}

impl ClaimDesired {
    /// The volume, if this is one.
    pub fn as_volume(&self) -> Option<&DesiredPv> {
        match self {
            ClaimDesired::Volume(v) => Some(v),
            _ => None,
        }
    }

    /// The claim, if this is one.
    pub fn as_claim(&self) -> Option<&DesiredPvc> {
        match self {
            ClaimDesired::Claim(c) => Some(c),
            _ => None,
        }
    }
}

/// `storage` of a resource map, in bytes.
pub fn storage_bytes(
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Option<u64> {
    let q = Quantity::parse(&map.get("storage")?.0)?;
    if q.is_negative() {
        return None;
    }
    u64::try_from(q.scaled_ceil(1)).ok()
}

pub use crate::common::names::is_dns_subdomain;

/// Why a PersistentVolume or PersistentVolumeClaim is invalid (what the API server would reject).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `metadata.name` is not a DNS subdomain; `kind` is `volume` or `claim`.
    #[error("metadata.name: invalid {kind} name {name:?}")]
    Name {
        /// `volume` or `claim`.
        kind: &'static str,
        /// The name as given.
        name: String,
    },
    /// A required field is missing.
    #[error("{0}: required")]
    Required(&'static str),
    /// `spec.capacity.storage` does not parse as a non-negative quantity.
    #[error("spec.capacity.storage: invalid quantity {0:?}")]
    Capacity(String),
    /// `spec.resources.requests.storage` is not a positive quantity.
    #[error("spec.resources.requests.storage: must be greater than zero, got {0:?}")]
    Request(String),
    /// A field holds a value outside its enumeration.
    #[error("{field}: unsupported value {value:?}")]
    Unsupported {
        /// The field's path.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// No access mode is given.
    #[error("{0}: at least 1 access mode is required")]
    NoAccessMode(&'static str),
    /// `ReadWriteOncePod` is combined with other access modes.
    #[error("{0}: may not use ReadWriteOncePod with other access modes")]
    ExclusiveRwop(&'static str),
    /// A path that must be absolute is not.
    #[error("{field}: {path:?} must be an absolute path")]
    RelativePath {
        /// The field's path.
        field: &'static str,
        /// The path as given.
        path: String,
    },
    /// A local volume has no required node affinity.
    #[error("spec.nodeAffinity: required for local volumes")]
    LocalWithoutAffinity,
}

/// Checks a PersistentVolume as the API server would (the parts the binder relies on).
pub fn validate_pv(pv: &PersistentVolume) -> Result<(), ValidationError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        return Err(ValidationError::Name { kind: "volume", name: name.to_owned() });
    }
    let Some(spec) = &pv.spec else { return Err(ValidationError::Required("spec")) };
    match spec.capacity.as_ref().and_then(|c| c.get("storage")) {
        None => return Err(ValidationError::Required("spec.capacity.storage")),
        Some(q) if spec.capacity.as_ref().and_then(storage_bytes).is_none() => {
            return Err(ValidationError::Capacity(q.0.clone()));
        }
        Some(_) => {}
    }
    validate_access_modes(spec.access_modes.as_deref(), "spec.accessModes")?;
    if let Some(p) = &spec.persistent_volume_reclaim_policy
        && !["Retain", "Delete", "Recycle"].contains(&p.as_str())
    {
        return Err(ValidationError::Unsupported {
            field: "spec.persistentVolumeReclaimPolicy",
            value: p.clone(),
        });
    }
    validate_volume_mode(spec.volume_mode.as_deref(), "spec.volumeMode")?;
    if let Some(local) = &spec.local
        && !local.path.starts_with('/')
    {
        return Err(ValidationError::RelativePath { field: "spec.local.path", path: local.path.clone() });
    }
    if let Some(h) = &spec.host_path
        && !h.path.starts_with('/')
    {
        return Err(ValidationError::RelativePath { field: "spec.hostPath.path", path: h.path.clone() });
    }
    if spec.local.is_some() && spec.node_affinity.as_ref().and_then(|a| a.required.as_ref()).is_none() {
        return Err(ValidationError::LocalWithoutAffinity);
    }
    Ok(())
}

/// Checks a PersistentVolumeClaim as the API server would (the parts the binder relies on).
pub fn validate_pvc(pvc: &PersistentVolumeClaim) -> Result<(), ValidationError> {
    let name = pvc.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        return Err(ValidationError::Name { kind: "claim", name: name.to_owned() });
    }
    let Some(spec) = &pvc.spec else { return Err(ValidationError::Required("spec")) };
    validate_access_modes(spec.access_modes.as_deref(), "spec.accessModes")?;
    let requests = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    match requests.and_then(|r| r.get("storage")) {
        None => return Err(ValidationError::Required("spec.resources.requests.storage")),
        Some(q) if requests.and_then(storage_bytes).is_none_or(|b| b == 0) => {
            return Err(ValidationError::Request(q.0.clone()));
        }
        Some(_) => {}
    }
    validate_volume_mode(spec.volume_mode.as_deref(), "spec.volumeMode")?;
    Ok(())
}

fn validate_access_modes(modes: Option<&[String]>, field: &'static str) -> Result<(), ValidationError> {
    let modes = modes.unwrap_or_default();
    if modes.is_empty() {
        return Err(ValidationError::NoAccessMode(field));
    }
    for m in modes {
        if !access_mode::ALL.contains(&m.as_str()) {
            return Err(ValidationError::Unsupported { field, value: m.clone() });
        }
    }
    if modes.iter().any(|m| m == access_mode::RWOP) && modes.len() > 1 {
        return Err(ValidationError::ExclusiveRwop(field));
    }
    Ok(())
}

fn validate_volume_mode(mode: Option<&str>, field: &'static str) -> Result<(), ValidationError> {
    match mode {
        None | Some("Filesystem" | "Block") => Ok(()),
        Some(other) => Err(ValidationError::Unsupported { field, value: other.to_owned() }),
    }
}
