//! The CSI provisioner: StorageClasses whose `provisioner` is a CSI driver registered in a
//! [`nodelet_csi::Registry`] (and offering `CREATE_DELETE_VOLUME`) get volumes through
//! `CreateVolume`, deleted through `DeleteVolume`; the volume is of type `csi` (driver,
//! volumeHandle, volumeAttributes), with node affinity from the driver's accessible topology.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    VolumeNodeAffinity,
};
use nodelet_csi::proto;
use nodelet_csi::proto::volume_capability::access_mode::Mode;
use nodelet_resources::claim::desired::access_mode;
use nodelet_resources::claim::driver::{ProvisionError, ProvisionRequest, Provisioner};

/// The StorageClass parameter naming the file system (as the external-provisioner reads it).
pub const PARAM_FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// The prefix of StorageClass parameters meant for the provisioner, not the driver.
pub const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";

/// Errors of the CSI provisioner.
#[derive(Debug, thiserror::Error)]
pub enum CsiProvisionError {
    /// The driver is not registered (or cannot create volumes).
    #[error("CSI driver {0:?} is not registered or cannot create volumes")]
    NotRegistered(String),
    /// A volume that is not of type `csi`.
    #[error("volume {0:?} is not a CSI volume")]
    NotCsi(String),
    /// The capacity does not fit the protocol.
    #[error("capacity {0} bytes is out of range")]
    Capacity(u64),
    /// A call failed.
    #[error(transparent)]
    Csi(#[from] nodelet_csi::CsiError),
}

/// Provisions through the CSI drivers of a registry.
#[derive(Debug, Clone)]
pub struct CsiProvisioner {
    registry: Arc<nodelet_csi::Registry>,
}

/// The CSI access mode for a Kubernetes one (as the external-provisioner maps them).
pub fn csi_access_mode(mode: &str) -> Mode {
    match mode {
        access_mode::RWO => Mode::SingleNodeWriter,
        access_mode::ROX => Mode::MultiNodeReaderOnly,
        access_mode::RWX => Mode::MultiNodeMultiWriter,
        access_mode::RWOP => Mode::SingleNodeSingleWriter,
        _ => Mode::Unknown,
    }
}

impl CsiProvisioner {
    /// Provisions through the drivers `registry` knows.
    pub fn new(registry: Arc<nodelet_csi::Registry>) -> Self {
        Self { registry }
    }

    fn driver(&self, name: &str) -> Result<Arc<nodelet_csi::Driver>, CsiProvisionError> {
        self.registry
            .get(name)
            .filter(|d| d.can_create_volumes())
            .ok_or_else(|| CsiProvisionError::NotRegistered(name.to_owned()))
    }

    /// `CreateVolume` for the request; the volume.
    pub async fn create(&self, request: &ProvisionRequest) -> Result<PersistentVolume, CsiProvisionError> {
        let driver_name = request.class.provisioner.clone();
        let driver = self.driver(&driver_name)?;
        let params = request.parameters();
        let fs_type = params.get(PARAM_FSTYPE).cloned().unwrap_or_default();
        let block = request.volume_mode == "Block";
        let capabilities = request
            .access_modes
            .iter()
            .map(|m| proto::VolumeCapability {
                access_type: Some(if block {
                    proto::volume_capability::AccessType::Block(Default::default())
                } else {
                    proto::volume_capability::AccessType::Mount(proto::volume_capability::MountVolume {
                        fs_type: fs_type.clone(),
                        mount_flags: request.class.mount_options.clone().unwrap_or_default(),
                        ..Default::default()
                    })
                }),
                access_mode: Some(proto::volume_capability::AccessMode { mode: csi_access_mode(m) as i32 }),
            })
            .collect();
        let required =
            i64::try_from(request.capacity).map_err(|_| CsiProvisionError::Capacity(request.capacity))?;
        let parameters: HashMap<String, String> =
            params.into_iter().filter(|(k, _)| !k.starts_with(RESERVED_PREFIX)).collect();
        let volume = driver
            .client()
            .create_volume(proto::CreateVolumeRequest {
                name: request.volume_name.clone(),
                capacity_range: Some(proto::CapacityRange { required_bytes: required, limit_bytes: 0 }),
                volume_capabilities: capabilities,
                parameters,
                ..Default::default()
            })
            .await?;
        let capacity =
            u64::try_from(volume.capacity_bytes).ok().filter(|c| *c > 0).unwrap_or(request.capacity);
        let mut pv = request.volume_template(&driver_name, capacity);
        if let Some(spec) = pv.spec.as_mut() {
            spec.csi = Some(CSIPersistentVolumeSource {
                driver: driver_name,
                volume_handle: volume.volume_id,
                volume_attributes: Some(volume.volume_context.into_iter().collect::<BTreeMap<_, _>>())
                    .filter(|m| !m.is_empty()),
                fs_type: Some(fs_type).filter(|f| !f.is_empty()),
                ..Default::default()
            });
            let terms: Vec<NodeSelectorTerm> = volume
                .accessible_topology
                .iter()
                .filter(|t| !t.segments.is_empty())
                .map(|t| NodeSelectorTerm {
                    match_expressions: Some(
                        t.segments
                            .iter()
                            .map(|(k, v)| NodeSelectorRequirement {
                                key: k.clone(),
                                operator: "In".into(),
                                values: Some(vec![v.clone()]),
                            })
                            .collect(),
                    ),
                    match_fields: None,
                })
                .collect();
            if !terms.is_empty() {
                spec.node_affinity =
                    Some(VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) });
            }
        }
        Ok(pv)
    }

    /// `DeleteVolume` for a volume it provisioned.
    pub async fn remove(&self, volume: &PersistentVolume) -> Result<(), CsiProvisionError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let csi = volume.spec.as_ref().and_then(|s| s.csi.as_ref()).ok_or(CsiProvisionError::NotCsi(name))?;
        let driver = self.driver(&csi.driver)?;
        driver.client().delete_volume(&csi.volume_handle, HashMap::new()).await?;
        Ok(())
    }
}

fn to_provision_error(e: CsiProvisionError) -> ProvisionError {
    let uncertain = matches!(&e, CsiProvisionError::Csi(c) if c.is_uncertain());
    if uncertain { ProvisionError::uncertain(e.to_string()) } else { ProvisionError::failed(e.to_string()) }
}

impl Provisioner for CsiProvisioner {
    fn name(&self) -> &str {
        "csi"
    }

    fn handles(&self, name: &str) -> bool {
        self.registry.get(name).is_some_and(|d| d.can_create_volumes())
    }

    fn provision<'a>(
        &'a self,
        request: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<PersistentVolume, ProvisionError>> {
        Box::pin(async move { self.create(request).await.map_err(to_provision_error) })
    }

    fn delete<'a>(&'a self, volume: &'a PersistentVolume) -> BoxFuture<'a, Result<(), ProvisionError>> {
        Box::pin(async move { self.remove(volume).await.map_err(to_provision_error) })
    }
}
