//! The claim driver: where binding records are kept ([`ClaimRecords`]), the [`Provisioner`]
//! trait provisioner drivers implement, and the engine [`Driver`] on top of both.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus::HistogramVec;
use reconcile_engine::{CancellationToken, Driver, Outcome, Update};
use tokio::sync::watch;

use super::actual::{ClaimActual, ClaimPhase, Provisioned, PvActual, PvcActual, VolumePhase};
use super::binding::{NodeInfo, format_bytes};
use super::desired::{ANN_PROVISIONED_BY, ClaimKey, ClaimRef};
use super::ops::ClaimOp;

/// A failed claim operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Storing or reading a binding record failed.
    #[error("binding records: {0}")]
    Records(String),
    /// A provisioner failed.
    #[error("provisioner {provisioner:?}: {message}")]
    Provisioner {
        /// The provisioner.
        provisioner: String,
        /// What went wrong.
        message: String,
    },
    /// No provisioner of that name runs.
    #[error("provisioner {0:?} is not running")]
    NoProvisioner(String),
    /// A provisioner returned a volume that does not fit the request.
    #[error("provisioner {provisioner:?} returned a bad volume: {message}")]
    BadVolume {
        /// The provisioner.
        provisioner: String,
        /// What is wrong.
        message: String,
    },
}

/// A failed provisioner call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProvisionError {
    /// What went wrong.
    pub message: String,
    /// Whether storage may have been created or deleted anyway (a timeout).
    pub uncertain: bool,
}

impl ProvisionError {
    /// A failure that changed nothing.
    pub fn failed(message: impl Into<String>) -> Self {
        Self { message: message.into(), uncertain: false }
    }

    /// A failure after which the storage may exist (or be gone).
    pub fn uncertain(message: impl Into<String>) -> Self {
        Self { message: message.into(), uncertain: true }
    }
}

/// What a provisioner is asked to create.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionRequest {
    /// The volume name to create (`pvc-<claim uid>`): provisioning again with the same name must
    /// return the same volume.
    pub volume_name: String,
    /// The claim the volume is for.
    pub claim: ClaimRef,
    /// The claim's class.
    pub class: Arc<StorageClass>,
    /// The requested size in bytes.
    pub capacity: u64,
    /// The claim's access modes.
    pub access_modes: Vec<String>,
    /// The claim's `volumeMode`.
    pub volume_mode: String,
    /// The node the volume is for (this node).
    pub node: NodeInfo,
}

impl ProvisionRequest {
    /// The class's `parameters`.
    pub fn parameters(&self) -> BTreeMap<String, String> {
        self.class.parameters.clone().unwrap_or_default()
    }

    /// The class's `reclaimPolicy`, defaulted to `Delete`.
    pub fn reclaim_policy(&self) -> &str {
        self.class.reclaim_policy.as_deref().unwrap_or("Delete")
    }

    /// A volume with what every provisioner fills in the same way: name, the provisioned-by
    /// annotation, `capacity` (bytes), access modes, `claimRef` (pre-bound to the claim),
    /// reclaim policy, class, mount options and volume mode. The provisioner adds the source
    /// (`local`, `hostPath`, `csi`) and node affinity.
    pub fn volume_template(&self, provisioner: &str, capacity: u64) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(self.volume_name.clone()),
                annotations: Some(BTreeMap::from([(ANN_PROVISIONED_BY.to_owned(), provisioner.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(self.access_modes.clone()),
                capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity(format_bytes(capacity)))])),
                claim_ref: Some(self.claim.to_object_reference()),
                persistent_volume_reclaim_policy: Some(self.reclaim_policy().to_owned()),
                storage_class_name: self.class.metadata.name.clone(),
                mount_options: self.class.mount_options.clone(),
                volume_mode: Some(self.volume_mode.clone()),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        }
    }
}

/// Creates and deletes storage for one StorageClass `provisioner` name. Implementations are
/// idempotent: provisioning a name that exists returns the existing volume, deleting what is
/// gone succeeds.
pub trait Provisioner: Send + Sync + std::fmt::Debug + 'static {
    /// The provisioner name StorageClasses use (`provisioner:`), for logs and metrics.
    fn name(&self) -> &str;

    /// Whether it serves StorageClasses with `provisioner: <name>`. Default: `name` is
    /// [`Provisioner::name`]. A provisioner may serve several names (the CSI provisioner serves
    /// every registered CSI driver that creates volumes).
    fn handles(&self, name: &str) -> bool {
        name == self.name()
    }

    /// Creates the volume `request.volume_name` (at least `request.capacity` bytes) and returns
    /// its PersistentVolume (start from [`ProvisionRequest::volume_template`]).
    fn provision<'a>(
        &'a self,
        request: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<PersistentVolume, ProvisionError>>;

    /// Deletes the storage of a volume it provisioned (reclaim policy `Delete`).
    fn delete<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>>;

    /// After a restart, makes a volume it provisioned usable again (mounts it again). Default:
    /// nothing to do.
    fn restore<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        let _ = volume;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Where binding records and provisioned volumes are kept across restarts. Every method is
/// idempotent.
pub trait ClaimRecords: Send + Sync + 'static {
    /// Stores the record of `key`.
    fn save(
        &self,
        key: &ClaimKey,
        actual: &ClaimActual,
    ) -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Removes the record of `key` (absent: fine).
    fn remove(&self, key: &ClaimKey) -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Every record.
    fn load(&self) -> impl Future<Output = Result<Vec<(ClaimKey, ClaimActual)>, ClaimError>> + Send;
    /// Stores a provisioned volume.
    fn save_volume(&self, volume: &PersistentVolume) -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Removes a provisioned volume (absent: fine).
    fn remove_volume(&self, name: &str) -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Every provisioned volume.
    fn load_volumes(&self) -> impl Future<Output = Result<Vec<PersistentVolume>, ClaimError>> + Send;
}

/// Records kept in memory only (tests, or no root directory).
#[derive(Debug, Default)]
pub struct MemoryRecords {
    records: std::sync::Mutex<BTreeMap<ClaimKey, ClaimActual>>,
    volumes: std::sync::Mutex<BTreeMap<String, PersistentVolume>>,
}

impl MemoryRecords {
    /// Empty records.
    pub fn new() -> Self {
        Self::default()
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ClaimRecords for MemoryRecords {
    async fn save(&self, key: &ClaimKey, actual: &ClaimActual) -> Result<(), ClaimError> {
        lock(&self.records).insert(key.clone(), actual.clone());
        Ok(())
    }
    async fn remove(&self, key: &ClaimKey) -> Result<(), ClaimError> {
        lock(&self.records).remove(key);
        Ok(())
    }
    async fn load(&self) -> Result<Vec<(ClaimKey, ClaimActual)>, ClaimError> {
        Ok(lock(&self.records).iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
    async fn save_volume(&self, volume: &PersistentVolume) -> Result<(), ClaimError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        lock(&self.volumes).insert(name, volume.clone());
        Ok(())
    }
    async fn remove_volume(&self, name: &str) -> Result<(), ClaimError> {
        lock(&self.volumes).remove(name);
        Ok(())
    }
    async fn load_volumes(&self) -> Result<Vec<PersistentVolume>, ClaimError> {
        Ok(lock(&self.volumes).values().cloned().collect())
    }
}

/// Provisioned volumes by name.
pub type VolumeMap = Arc<BTreeMap<String, Arc<PersistentVolume>>>;

/// The volumes provisioners created, by name: the populator adds them to the desired volumes.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProvisionedVolumes {
    tx: Arc<watch::Sender<VolumeMap>>,
}

impl Default for ProvisionedVolumes {
    fn default() -> Self {
        Self { tx: Arc::new(watch::channel(Arc::new(BTreeMap::new())).0) }
    }
}

impl ProvisionedVolumes {
    /// None yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The volumes now.
    pub fn snapshot(&self) -> VolumeMap {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<VolumeMap> {
        self.tx.subscribe()
    }

    /// Whether `volume` is one a provisioner of nodelet created: a record of that name exists and names the same
    /// storage (the same volume source and provisioner). Only such volumes have their storage deleted.
    pub fn holds(&self, volume: &PersistentVolume) -> bool {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        let snapshot = self.snapshot();
        let Some(recorded) = snapshot.get(name) else { return false };
        let by = |pv: &PersistentVolume| {
            pv.metadata.annotations.as_ref().and_then(|a| a.get(ANN_PROVISIONED_BY)).cloned()
        };
        let source = |pv: &PersistentVolume| {
            pv.spec.as_ref().map(|s| (s.local.clone(), s.csi.clone(), s.host_path.clone()))
        };
        by(recorded) == by(volume) && source(recorded) == source(volume)
    }

    fn insert(&self, volume: PersistentVolume) {
        let name = volume.metadata.name.clone().unwrap_or_default();
        self.tx.send_modify(|m| {
            Arc::make_mut(m).insert(name, Arc::new(volume));
        });
    }

    fn remove(&self, name: &str) {
        self.tx.send_if_modified(|m| Arc::make_mut(m).remove(name).is_some());
    }
}

/// The provisioners that run. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ProvisionerSet(Arc<Vec<Arc<dyn Provisioner>>>);

impl ProvisionerSet {
    /// These provisioners (the first that handles a name serves it).
    pub fn new(provisioners: impl IntoIterator<Item = Arc<dyn Provisioner>>) -> Self {
        Self(Arc::new(provisioners.into_iter().collect()))
    }

    /// The provisioner serving StorageClass provisioner name `name`.
    pub fn find(&self, name: &str) -> Option<&Arc<dyn Provisioner>> {
        self.0.iter().find(|p| p.handles(name))
    }

    /// Whether some provisioner serves `name`.
    pub fn handles(&self, name: &str) -> bool {
        self.find(name).is_some()
    }
}

/// The engine driver for claims and volumes.
#[derive(Debug)]
pub struct ClaimDriver<R> {
    records: Arc<R>,
    provisioners: ProvisionerSet,
    provisioned: ProvisionedVolumes,
    operation_duration: Option<HistogramVec>,
}

impl<R: ClaimRecords + std::fmt::Debug> ClaimDriver<R> {
    /// A driver keeping records in `records` and provisioning through `provisioners`.
    pub fn new(records: Arc<R>, provisioners: ProvisionerSet) -> Self {
        Self { records, provisioners, provisioned: ProvisionedVolumes::new(), operation_duration: None }
    }

    /// Times provisioning and deletion in `storage_operation_duration_seconds` (the volume
    /// metrics' histogram: [`crate::volume::metrics::VolumeMetrics::operation_duration`]).
    #[must_use]
    pub fn with_operation_metrics(mut self, histogram: HistogramVec) -> Self {
        self.operation_duration = Some(histogram);
        self
    }

    /// The provisioners (for the reconciler).
    pub fn provisioners(&self) -> &ProvisionerSet {
        &self.provisioners
    }

    /// The volumes the provisioners created (for the populator).
    pub fn provisioned(&self) -> ProvisionedVolumes {
        self.provisioned.clone()
    }

    fn provisioner(&self, name: &str) -> Result<&Arc<dyn Provisioner>, ClaimError> {
        self.provisioners.find(name).ok_or_else(|| ClaimError::NoProvisioner(name.to_owned()))
    }

    async fn set(&self, key: &ClaimKey, actual: ClaimActual) -> Outcome<ClaimActual, ClaimError> {
        match self.records.save(key, &actual).await {
            Ok(()) => Outcome::Done(Update::Set(actual)),
            Err(e) => Outcome::Failed(e),
        }
    }

    async fn provision(
        &self,
        key: &ClaimKey,
        request: &ProvisionRequest,
    ) -> Outcome<ClaimActual, ClaimError> {
        let record = |done| {
            ClaimActual::Claim(PvcActual {
                uid: request.claim.uid.clone(),
                volume: None,
                phase: ClaimPhase::Pending,
                provisioned: Some(Provisioned { volume: request.volume_name.clone(), done }),
            })
        };
        let provisioner = match self.provisioner(request.class.provisioner.as_str()) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(e),
        };
        // The intent first: after a crash the record says storage may exist.
        if let Err(e) = self.records.save(key, &record(false)).await {
            return Outcome::Failed(e);
        }
        let name = request.class.provisioner.clone();
        let mut volume = match provisioner.provision(request).await {
            Ok(v) => v,
            Err(e) => {
                let err = ClaimError::Provisioner { provisioner: name, message: e.message };
                return if e.uncertain { Outcome::Uncertain(err) } else { Outcome::Failed(err) };
            }
        };
        if volume.metadata.name.as_deref() != Some(request.volume_name.as_str()) {
            return Outcome::Uncertain(ClaimError::BadVolume {
                provisioner: name,
                message: format!("named {:?}, not {:?}", volume.metadata.name, request.volume_name),
            });
        }
        // Whatever the provisioner wrote, the volume is pre-bound to its claim and says who made it.
        volume
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANN_PROVISIONED_BY.to_owned(), name);
        if let Some(spec) = volume.spec.as_mut() {
            spec.claim_ref = Some(request.claim.to_object_reference());
        }
        volume.status = None;
        if let Err(e) = self.records.save_volume(&volume).await {
            return Outcome::Uncertain(e);
        }
        self.provisioned.insert(volume);
        self.set(key, record(true)).await
    }

    async fn delete(
        &self,
        key: &ClaimKey,
        pv: &PersistentVolume,
        provisioner: &str,
        after: &PvActual,
    ) -> Outcome<ClaimActual, ClaimError> {
        let p = match self.provisioner(provisioner) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(e),
        };
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        if !self.provisioned.holds(pv) {
            let message = format!(
                "volume {name:?} does not match nodelet's provisioning record of it: its storage is not deleted"
            );
            tracing::warn!(volume = name, "{message}");
            let failed = PvActual {
                phase: VolumePhase::Failed,
                message: Some(message),
                deleted: false,
                ..after.clone()
            };
            return self.set(key, ClaimActual::Volume(failed)).await;
        }
        if let Err(e) = p.delete(pv).await {
            let err = ClaimError::Provisioner { provisioner: provisioner.to_owned(), message: e.message };
            return if e.uncertain { Outcome::Uncertain(err) } else { Outcome::Failed(err) };
        }
        if let Err(e) = self.records.remove_volume(name).await {
            return Outcome::Failed(e);
        }
        self.provisioned.remove(name);
        self.set(key, ClaimActual::Volume(after.clone())).await
    }

    fn record(&self, op: &ClaimOp, provisioner: &str, started: tokio::time::Instant, ok: bool) {
        if let (Some(h), Some(name)) = (&self.operation_duration, op.storage_operation()) {
            let status = if ok { "success" } else { "fail-unknown" };
            h.with_label_values(&[provisioner, name, status, "false"])
                .observe(started.elapsed().as_secs_f64());
        }
    }
}

impl<R: ClaimRecords + std::fmt::Debug> Driver<ClaimKey, ClaimOp, ClaimActual> for ClaimDriver<R> {
    type Error = ClaimError;

    async fn execute(
        &self,
        key: &ClaimKey,
        op: &ClaimOp,
        _cancel: &CancellationToken,
    ) -> Outcome<ClaimActual, ClaimError> {
        let started = tokio::time::Instant::now();
        let outcome = match op {
            ClaimOp::BindVolume(a) | ClaimOp::ReleaseVolume(a) | ClaimOp::FailVolume(a) => {
                self.set(key, ClaimActual::Volume(a.clone())).await
            }
            ClaimOp::BindClaim(a) | ClaimOp::LoseClaim(a) => {
                self.set(key, ClaimActual::Claim(a.clone())).await
            }
            ClaimOp::UnbindVolume | ClaimOp::Forget => match self.records.remove(key).await {
                Ok(()) => Outcome::Done(Update::Remove),
                Err(e) => Outcome::Failed(e),
            },
            ClaimOp::Provision(request) => self.provision(key, request).await,
            ClaimOp::DeleteVolume { pv, provisioner, after } => {
                self.delete(key, pv, provisioner, after).await
            }
        };
        let provisioner = match op {
            ClaimOp::Provision(r) => r.class.provisioner.as_str(),
            ClaimOp::DeleteVolume { provisioner, .. } => provisioner.as_str(),
            _ => "",
        };
        self.record(op, provisioner, started, matches!(outcome, Outcome::Done(_)));
        if let Outcome::Failed(e) | Outcome::Uncertain(e) = &outcome {
            tracing::warn!(%key, op = op.kind_name(), error = %e, "claim operation failed");
        }
        outcome
    }

    async fn reconstruct(&self) -> Result<Vec<(ClaimKey, ClaimActual)>, ClaimError> {
        let volumes = self.records.load_volumes().await?;
        for volume in volumes {
            let by = volume.metadata.annotations.as_ref().and_then(|a| a.get(ANN_PROVISIONED_BY)).cloned();
            if let Some(p) = by.as_deref().and_then(|b| self.provisioners.find(b))
                && let Err(e) = p.restore(&volume).await
            {
                tracing::warn!(volume = ?volume.metadata.name, error = %e, "cannot restore a provisioned volume");
            }
            self.provisioned.insert(volume);
        }
        self.records.load().await
    }
}

impl ClaimOp {
    fn kind_name(&self) -> &'static str {
        reconcile_engine::Operation::kind(self)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolumeSpec};

    use super::*;

    fn local(name: &str, path: &str, by: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: by.map(|b| BTreeMap::from([(ANN_PROVISIONED_BY.to_owned(), b.to_owned())])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource { path: path.into(), fs_type: None }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn only_the_recorded_volume_with_the_same_storage_is_held() {
        let volumes = ProvisionedVolumes::new();
        let mine = local("pvc-1", "/base/pvc-1", Some("p"));
        assert!(!volumes.holds(&mine), "nothing recorded yet");
        volumes.insert(mine.clone());
        assert!(volumes.holds(&mine));
        assert!(!volumes.holds(&local("pvc-1", "/etc", Some("p"))), "same name, other storage");
        assert!(!volumes.holds(&local("pvc-1", "/base/pvc-1", Some("q"))), "other provisioner");
        assert!(!volumes.holds(&local("pvc-2", "/base/pvc-2", Some("p"))), "not recorded");
        volumes.remove("pvc-1");
        assert!(!volumes.holds(&mine));
    }
}
