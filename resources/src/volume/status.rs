//! What the pod and sandbox reconcilers ask of volumes: are a pod's volumes ready, and where are they
//! (read from the volume pair's stores among their side inputs, a [`VolumeGate`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Volume;
use reconcile_engine::Store;

use super::actual::{Step, VolumeActual};
use super::desired::{
    CsiSource, DesiredVolume, SourceError, VolumeKey, VolumeSource, device_key, volume_key,
};
use crate::model::pod::DesiredPod;
use crate::model::volumes::ClaimLookup;
use crate::model::volumes::{MountedVolume, Plugin, PodVolumes, VolumeReadiness};

/// The plugin serving a volume of a pod spec, or why none does.
pub fn plugin_of(volume: &Volume) -> Result<Plugin, SourceError> {
    let plugin = if volume.empty_dir.is_some() {
        Plugin::EmptyDir
    } else if volume.host_path.is_some() {
        Plugin::HostPath
    } else if volume.config_map.is_some() {
        Plugin::ConfigMap
    } else if volume.secret.is_some() {
        Plugin::Secret
    } else if volume.downward_api.is_some() {
        Plugin::DownwardApi
    } else if volume.projected.is_some() {
        Plugin::Projected
    } else if volume.persistent_volume_claim.is_some() {
        // Which plugin serves a claim depends on the volume bound to it.
        return Err(SourceError::ClaimNeedsVolume { volume: volume.name.clone() });
    } else {
        let kind = serde_json::to_value(volume)
            .ok()
            .and_then(|v| v.as_object().and_then(|o| o.keys().find(|k| *k != "name").cloned()))
            .unwrap_or_else(|| "unknown".into());
        return Err(SourceError::Unsupported { volume: volume.name.clone(), kind });
    };
    Ok(plugin)
}

/// Reads the volume stores for the pod reconciler. Cheap to clone.
#[derive(Clone)]
pub struct VolumeGate {
    desired: Store<VolumeKey, DesiredVolume>,
    actual: Store<VolumeKey, VolumeActual>,
    claims: Option<Arc<dyn ClaimLookup>>,
}

impl std::fmt::Debug for VolumeGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeGate").field("volumes", &self.actual.len()).finish_non_exhaustive()
    }
}

impl VolumeGate {
    /// Why the CSI volume `name` (of PersistentVolume `csi.volume`) is not published yet.
    fn csi_waiting(&self, name: &str, csi: &CsiSource) -> String {
        let device = self.actual.get(&device_key(&csi.driver, &csi.volume_handle));
        let step = match device.as_deref().and_then(VolumeActual::device) {
            None => "to be attached",
            Some(d) if d.attach != Step::Done => "to be attached",
            Some(d) if d.stage != Step::Done => "to be staged",
            Some(_) if device.as_deref().is_some_and(|d| !d.is_mounted()) => "to be staged again",
            Some(_) => "to be published",
        };
        format!(
            "volume {name:?}: waiting for persistentvolume {:?} {step} by CSI driver {:?}",
            csi.volume, csi.driver
        )
    }

    /// A gate over the volume engine's desired and actual stores.
    pub fn new(desired: Store<VolumeKey, DesiredVolume>, actual: Store<VolumeKey, VolumeActual>) -> Self {
        Self { desired, actual, claims: None }
    }

    /// The sum of the two stores' [versions](Store::version) (wrapping): the same while neither
    /// changed. The claim lookup is not counted.
    pub fn version(&self) -> u64 {
        self.desired.version().wrapping_add(self.actual.version())
    }

    /// Says why a pod waits for a claim that is not bound (from the claim engine).
    pub fn with_claims(mut self, claims: Arc<dyn ClaimLookup>) -> Self {
        self.claims = Some(claims);
        self
    }

    /// Whether all of `pod`'s volumes are set up, and where.
    pub fn check(&self, pod: &DesiredPod) -> VolumeReadiness {
        let mut ready = PodVolumes::new();
        for volume in pod.spec().volumes.iter().flatten() {
            if let (Err(why), None) = (plugin_of(volume), &volume.persistent_volume_claim) {
                return VolumeReadiness::Waiting(why.to_string());
            }
            let key = volume_key(pod.uid(), &volume.name);
            match self.actual.get(&key) {
                Some(a) if a.is_mounted() => {
                    ready.insert(
                        volume.name.clone(),
                        MountedVolume { path: a.path.clone(), plugin: a.plugin },
                    );
                }
                _ => {
                    let why = match (
                        self.desired.get(&key).map(|d| d.source.clone()),
                        &volume.persistent_volume_claim,
                    ) {
                        (Some(Err(why)), _) => why.to_string(),
                        (None, Some(claim)) => {
                            let why = self
                                .claims
                                .as_ref()
                                .and_then(|c| c.bound_volume(pod, &claim.claim_name).err())
                                .map(|e| e.to_string())
                                .unwrap_or_else(|| {
                                    format!(
                                        "persistentvolumeclaim {:?} is not bound to a volume yet",
                                        claim.claim_name
                                    )
                                });
                            format!("volume {:?}: {why}", volume.name)
                        }
                        (Some(Ok(VolumeSource::Csi(csi))), _) => self.csi_waiting(&volume.name, &csi),
                        _ => format!("volume {:?} is not set up yet", volume.name),
                    };
                    return VolumeReadiness::Waiting(why);
                }
            }
        }
        VolumeReadiness::Ready(Arc::new(ready))
    }
}
