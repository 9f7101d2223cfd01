//! The desired-state populator: from the pods, the volumes they need.
//!
//! A pod's volumes are desired while the pod is desired, and after that for as long as any of
//! its containers still runs (so a volume is never torn down under a running container). The
//! content of configMap, secret, downwardAPI and projected volumes is rendered here, by a
//! [`Renderer`], so that an update of a ConfigMap is a change of desired state that the
//! reconciler writes into the running pod's volume.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use reconcile_engine::CancellationToken;
use reconcile_engine::{Store, Subscription, Writer};

use super::desired::{
    CsiSource, DesiredVolume, FsGroup, RenderError, SourceError, VolumeKey, VolumeSource, split_key,
};

use super::status::plugin_of;
use crate::model::actual::PodActual;
use crate::model::pod::{DesiredPod, PodUid};
use crate::model::volumes::{ClaimLookup, Plugin};
use crate::quantity::Quantity;

/// Renders the files of configMap, secret, downwardAPI and projected volumes.
pub trait Renderer: Send + Sync + 'static {
    /// The files of `volume` (of plugin `plugin`) of `pod`, or why they cannot be made now
    /// (naming the volume and the object or field).
    fn render(&self, pod: &DesiredPod, volume: &Volume, plugin: Plugin) -> Result<VolumeSource, RenderError>;
}

/// Keeps the desired volume store in step with the pods.
pub struct Populator<R> {
    pods: Store<PodUid, DesiredPod>,
    pod_actual: Store<PodUid, PodActual>,
    writer: Writer<VolumeKey, DesiredVolume>,
    renderer: Arc<R>,
    claims: Option<Arc<dyn ClaimLookup>>,
    verdicts: Option<Store<PodUid, crate::model::verdict::Verdict>>,
    /// Pods whose rendered content changed outside the stores (a token issued for them).
    pod_refresh: Option<Subscription<PodUid>>,
}

impl<R> std::fmt::Debug for Populator<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Populator").field("volumes", &self.writer.reader().len()).finish_non_exhaustive()
    }
}

/// How often the populator renders everything again even without a change it was told of.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(60);

impl<R: Renderer> Populator<R> {
    /// A populator writing `writer` from the desired pods and the pod engine's actual store.
    pub fn new(
        pods: Store<PodUid, DesiredPod>,
        pod_actual: Store<PodUid, PodActual>,
        writer: Writer<VolumeKey, DesiredVolume>,
        renderer: Arc<R>,
    ) -> Self {
        Self { pods, pod_actual, writer, renderer, claims: None, verdicts: None, pod_refresh: None }
    }

    /// Releases the volumes of pods evicted or refused (their verdict in `verdicts`, read-only)
    /// once nothing of theirs runs (the kubelet tears down the volumes of terminated pods, which
    /// frees their emptyDirs). [`run`](Self::run) populates again whenever a verdict changes.
    pub fn with_verdicts(mut self, verdicts: Store<PodUid, crate::model::verdict::Verdict>) -> Self {
        self.verdicts = Some(verdicts);
        self
    }

    /// Mounts `persistentVolumeClaim` volumes: the PersistentVolume bound to the claim, found
    /// through `claims`. A claim that is not bound gets no desired volume (the pod waits).
    pub fn with_claims(mut self, claims: Arc<dyn ClaimLookup>) -> Self {
        self.claims = Some(claims);
        self
    }

    /// Renders again the volumes of the pods `pods` names (and theirs only) whenever it does: what their
    /// renderer reads changed for those pods alone (a service-account token issued for them).
    pub fn with_pod_refresh(mut self, pods: Subscription<PodUid>) -> Self {
        self.pod_refresh = Some(pods);
        self
    }

    /// Whether the pod `uid` is refused or evicted.
    fn is_stopped(&self, uid: &PodUid) -> bool {
        self.verdicts.as_ref().and_then(|v| v.get(uid)).is_some_and(|v| !v.is_admitted())
    }

    /// The volumes `pod` needs.
    pub fn volumes_of(&self, pod: &DesiredPod) -> Vec<DesiredVolume> {
        let memory_limit = super::tmpfs::pod_memory_limit(pod);
        pod.spec()
            .volumes
            .iter()
            .flatten()
            .filter_map(|volume| {
                let mut read_only_claim = false;
                let (plugin, source) = if let Some(claim) = &volume.persistent_volume_claim {
                    let pv = self.claims.as_ref()?.bound_volume(pod, &claim.claim_name).ok()?;
                    read_only_claim = claim.read_only.unwrap_or(false);
                    claim_source(volume, read_only_claim, &pv)
                } else {
                    let plugin = plugin_of(volume).ok()?;
                    let source = match plugin {
                        Plugin::EmptyDir => empty_dir(volume),
                        Plugin::HostPath => host_path(volume),
                        _ => self.renderer.render(pod, volume, plugin).map_err(SourceError::Render),
                    };
                    (plugin, source)
                };
                let fs_group = source.as_ref().ok().and_then(|source| {
                    FsGroup::for_volume(pod.spec().security_context.as_ref(), source, read_only_claim)
                });
                Some(DesiredVolume {
                    pod_uid: pod.uid().to_owned(),
                    namespace: pod.namespace().to_owned(),
                    pod_name: pod.name().to_owned(),
                    name: volume.name.clone(),
                    plugin,
                    source,
                    memory_limit,
                    fs_group,
                })
            })
            .collect()
    }

    /// Recomputes the whole desired volume store (every pod's volumes rendered again); returns the number of
    /// keys that changed.
    pub fn sync(&mut self) -> usize {
        let current = self.writer.reader();
        let mut entries: Vec<(VolumeKey, DesiredVolume)> = Vec::new();
        let mut uids: std::collections::BTreeSet<PodUid> = self.pods.keys().into_iter().collect();
        // Pods no longer desired keep their volumes while a container of theirs runs.
        uids.extend(current.keys().iter().filter_map(|k| split_key(k)).map(|(uid, _)| uid.to_owned()));
        for uid in &uids {
            self.pod_entries(uid, &current, &mut entries);
        }
        // The devices of the CSI volumes: desired while any pod volume published from them is.
        let mut devices = std::collections::BTreeMap::new();
        for (_, volume) in &entries {
            if let Some(device) = volume.device() {
                devices.entry(device.key()).or_insert(device);
            }
        }
        entries.extend(devices);
        self.writer.replace_all(entries)
    }

    /// Recomputes the volumes of the pods `uids` only (a pod changed, went, was refused or evicted, or its
    /// containers stopped), and the CSI devices from the whole store; returns the number of keys that
    /// changed. The other pods' volumes are not rendered again: a change of one pod costs one pod's
    /// rendering, not the node's.
    pub fn sync_pods(&mut self, uids: &[PodUid]) -> usize {
        if uids.is_empty() {
            return 0;
        }
        let current = self.writer.reader();
        let pods: std::collections::HashSet<&str> = uids.iter().map(String::as_str).collect();
        let mut entries = Vec::new();
        for uid in &pods {
            self.pod_entries(uid, &current, &mut entries);
        }
        let wanted: std::collections::HashSet<&VolumeKey> = entries.iter().map(|(k, _)| k).collect();
        let stale: Vec<VolumeKey> = current
            .keys()
            .into_iter()
            .filter(|k| split_key(k).is_some_and(|(uid, _)| pods.contains(uid)) && !wanted.contains(k))
            .collect();
        let mut changed = 0;
        for key in stale {
            changed += usize::from(self.writer.remove(&key).is_some());
        }
        for (key, volume) in entries {
            changed += usize::from(self.writer.upsert(key, volume));
        }
        // The devices: desired while any pod volume published from them is.
        let mut devices: std::collections::BTreeMap<VolumeKey, DesiredVolume> =
            std::collections::BTreeMap::new();
        let mut held: Vec<VolumeKey> = Vec::new();
        current.for_each(|key, volume| {
            if split_key(key).is_none() {
                held.push(key.clone());
            } else if let Some(device) = volume.device() {
                devices.entry(device.key()).or_insert(device);
            }
        });
        for key in held.into_iter().filter(|k| !devices.contains_key(k)) {
            changed += usize::from(self.writer.remove(&key).is_some());
        }
        for (key, device) in devices {
            changed += usize::from(self.writer.upsert(key, device));
        }
        changed
    }

    /// The volumes pod `uid` needs now, appended to `out`: its rendered volumes while it is desired and
    /// not stopped (a claim that cannot be looked up now keeps the volume it has in `current`), else the
    /// volumes it has in `current` while a container of its still runs, else none.
    fn pod_entries(
        &self,
        uid: &str,
        current: &Store<VolumeKey, DesiredVolume>,
        out: &mut Vec<(VolumeKey, DesiredVolume)>,
    ) {
        let uid: PodUid = uid.to_owned();
        let running = || self.pod_actual.get(&uid).is_some_and(|a| a.any_running());
        let Some(pod) = self.pods.get(&uid) else {
            if running() {
                current.for_each(|key, volume| {
                    if split_key(key).is_some_and(|(u, _)| u == uid) {
                        out.push((key.clone(), volume.clone()));
                    }
                });
            }
            return;
        };
        if self.is_stopped(&uid) && !running() {
            return;
        }
        let volumes = self.volumes_of(&pod);
        // A claim that cannot be looked up now (deleted, lost) takes nothing away from a pod that has its
        // volume: what is desired stays until the pod goes.
        for volume in pod.spec().volumes.iter().flatten().filter(|v| v.persistent_volume_claim.is_some()) {
            if !volumes.iter().any(|v| v.name == volume.name) {
                let key = super::desired::volume_key(&uid, &volume.name);
                if let Some(kept) = current.get(&key) {
                    out.push((key, (*kept).clone()));
                }
            }
        }
        out.extend(volumes.into_iter().map(|v| (v.key(), v)));
    }

    /// Populates until `shutdown`: first everything once the pod sources and the pod engine's
    /// reconstruction are complete (then the volume store counts as synced, and teardowns of
    /// volumes nobody needs may start); then the pods that changed ([`sync_pods`](Self::sync_pods)) on a
    /// change of the pods, when a pod is refused or evicted (with verdicts) and when a pod that is going
    /// stops its containers, and when the pod refresh ([`with_pod_refresh`](Self::with_pod_refresh)) names
    /// them; and everything ([`sync`](Self::sync)) whenever `refresh` fires (the objects a [`Renderer`]
    /// reads changed) and every [`RESYNC_PERIOD`].
    pub async fn run<T: Send + Sync>(
        mut self,
        mut refresh: tokio::sync::watch::Receiver<T>,
        shutdown: CancellationToken,
    ) {
        let pods_sub = self.pods.subscribe();
        let actual_sub = self.pod_actual.subscribe();
        // A verdict that stops a pod re-populates, which releases its volumes (the populator reads
        // the verdict store as one of its sources).
        let verdict_sub = self.verdicts.as_ref().map(Store::subscribe);
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = async {
                let _ = self.pods.wait_until_synced().await;
                let _ = self.pod_actual.wait_until_synced().await;
                if let Some(claims) = &self.claims {
                    claims.wait_synced().await;
                }
            } => {}
        }
        let changed = self.sync();
        self.writer.mark_synced();
        tracing::debug!(changed, volumes = self.writer.reader().len(), "desired volumes synced");
        let mut refresh_closed = false;
        let mut resync = tokio::time::interval(RESYNC_PERIOD);
        resync.tick().await;
        loop {
            // `Some(uids)`: those pods' volumes; `None`: everything.
            let work: Option<Vec<PodUid>> = tokio::select! {
                () = shutdown.cancelled() => return,
                () = pods_sub.changed() => Some(pods_sub.drain()),
                // The runtime's view changes with every container start and exit; it matters here only
                // for pods that keep their volumes without being desired, or that were evicted.
                () = actual_sub.changed() => Some(
                    actual_sub.drain().into_iter().filter(|uid| {
                        !self.pods.contains_key(uid) || self.is_stopped(uid)
                    }).collect()
                ),
                () = async {
                    match &verdict_sub {
                        Some(sub) => sub.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    Some(verdict_sub.as_ref().map(|sub| sub.drain().into_iter().filter(|uid| self.is_stopped(uid)).collect()).unwrap_or_default())
                }
                () = async {
                    match &self.pod_refresh {
                        Some(sub) => sub.changed().await,
                        None => std::future::pending().await,
                    }
                } => Some(self.pod_refresh.as_ref().map(Subscription::drain).unwrap_or_default()),
                r = refresh.changed(), if !refresh_closed => { refresh_closed = r.is_err(); None }
                _ = resync.tick() => None,
            };
            let changed = match work {
                Some(uids) => self.sync_pods(&uids),
                None => self.sync(),
            };
            if changed > 0 {
                tracing::debug!(changed, "desired volumes updated");
            }
        }
    }
}

/// The source of a pod volume backed by the PersistentVolume `pv`.
fn claim_source(
    volume: &Volume,
    read_only: bool,
    pv: &PersistentVolume,
) -> (Plugin, Result<VolumeSource, SourceError>) {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = &pv.spec else {
        return (
            Plugin::LocalVolume,
            Err(SourceError::PvNoSpec { volume: volume.name.clone(), pv: pv_name }),
        );
    };
    if let Some(local) = &spec.local {
        let source = if local.path.starts_with('/') {
            Ok(VolumeSource::Local { volume: pv_name, path: local.path.clone().into() })
        } else {
            Err(SourceError::PvPathRelative { volume: volume.name.clone(), pv: pv_name, field: "local.path" })
        };
        return (Plugin::LocalVolume, source);
    }
    if let Some(h) = &spec.host_path {
        let source = if h.path.starts_with('/') {
            Ok(VolumeSource::HostPath {
                path: h.path.clone().into(),
                kind: h.type_.clone().filter(|t| !t.is_empty()),
            })
        } else {
            Err(SourceError::PvPathRelative {
                volume: volume.name.clone(),
                pv: pv_name,
                field: "hostPath.path",
            })
        };
        return (Plugin::HostPath, source);
    }
    if let Some(csi) = &spec.csi {
        if csi.node_stage_secret_ref.is_some() || csi.node_publish_secret_ref.is_some() {
            return (
                Plugin::Csi,
                Err(SourceError::PvCsiSecrets { volume: volume.name.clone(), pv: pv_name }),
            );
        }
        let source = CsiSource {
            volume: pv_name,
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            read_only: read_only || csi.read_only.unwrap_or(false),
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            attributes: csi.volume_attributes.clone().unwrap_or_default().into_iter().collect(),
            access_mode: spec
                .access_modes
                .iter()
                .flatten()
                .next()
                .cloned()
                .unwrap_or_else(|| "ReadWriteOnce".into()),
        };
        return (Plugin::Csi, Ok(VolumeSource::Csi(source)));
    }
    let kind = serde_json::to_value(spec)
        .ok()
        .and_then(|v| {
            v.as_object().and_then(|o| {
                o.keys()
                    .find(|k| {
                        !matches!(
                            k.as_str(),
                            "accessModes"
                                | "capacity"
                                | "claimRef"
                                | "mountOptions"
                                | "nodeAffinity"
                                | "persistentVolumeReclaimPolicy"
                                | "storageClassName"
                                | "volumeMode"
                                | "volumeAttributesClassName"
                        )
                    })
                    .cloned()
            })
        })
        .unwrap_or_else(|| "unknown".into());
    (Plugin::LocalVolume, Err(SourceError::PvUnsupported { volume: volume.name.clone(), pv: pv_name, kind }))
}

fn empty_dir(volume: &Volume) -> Result<VolumeSource, SourceError> {
    let Some(e) = &volume.empty_dir else {
        return Err(SourceError::NotEmptyDir { volume: volume.name.clone() });
    };
    let memory = match e.medium.as_deref() {
        None | Some("") => false,
        Some("Memory") => true,
        Some(other) => {
            return Err(SourceError::EmptyDirMedium {
                volume: volume.name.clone(),
                medium: other.to_owned(),
            });
        }
    };
    let size_limit = match &e.size_limit {
        None => None,
        Some(q) => {
            let parsed = Quantity::parse(&q.0).filter(|q| !q.is_negative()).ok_or_else(|| {
                SourceError::EmptyDirSizeLimit { volume: volume.name.clone(), quantity: q.0.clone() }
            })?;
            Some(u64::try_from(parsed.scaled_ceil(1)).unwrap_or(u64::MAX))
        }
    };
    Ok(VolumeSource::EmptyDir { memory, size_limit })
}

fn host_path(volume: &Volume) -> Result<VolumeSource, SourceError> {
    let Some(h) = &volume.host_path else {
        return Err(SourceError::NotHostPath { volume: volume.name.clone() });
    };
    if !h.path.starts_with('/') {
        return Err(SourceError::HostPathRelative { volume: volume.name.clone(), path: h.path.clone() });
    }
    Ok(VolumeSource::HostPath {
        path: h.path.clone().into(),
        kind: h.type_.clone().filter(|t| !t.is_empty()),
    })
}

#[cfg(test)]
mod source_error_tests {
    use super::*;

    fn volume(json: serde_json::Value) -> Volume {
        serde_json::from_value(json).expect("test volume")
    }

    fn pv(json: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json).expect("test persistent volume")
    }

    fn message<T: std::fmt::Debug>(result: Result<T, SourceError>) -> String {
        result.expect_err("an error").to_string()
    }

    #[test]
    fn spec_errors_name_the_volume_and_the_field() {
        let v = volume(serde_json::json!({"name": "d", "emptyDir": {"medium": "Disk"}}));
        assert_eq!(message(empty_dir(&v)), r#"volume "d": emptyDir.medium: unsupported value "Disk""#);
        let v = volume(serde_json::json!({"name": "d", "emptyDir": {"sizeLimit": "-1Gi"}}));
        assert_eq!(message(empty_dir(&v)), r#"volume "d": emptyDir.sizeLimit: invalid quantity "-1Gi""#);
        assert_eq!(message(host_path(&v)), r#"volume "d": not a hostPath"#);
        let h = volume(serde_json::json!({"name": "h", "hostPath": {"path": "rel"}}));
        assert_eq!(message(host_path(&h)), r#"volume "h": hostPath.path: "rel" must be an absolute path"#);
        assert_eq!(message(empty_dir(&h)), r#"volume "h": not an emptyDir"#);
        let c = volume(serde_json::json!({"name": "c", "persistentVolumeClaim": {"claimName": "x"}}));
        assert_eq!(
            message(plugin_of(&c)),
            r#"volume "c": persistentVolumeClaim volumes need a bound PersistentVolume"#
        );
        let n = volume(serde_json::json!({"name": "n", "nfs": {"server": "s", "path": "/"}}));
        assert_eq!(message(plugin_of(&n)), r#"volume "n": nfs volumes are not supported by nodelet yet"#);
    }

    #[test]
    fn claim_errors_name_the_volume_and_the_persistent_volume() {
        let c = volume(serde_json::json!({"name": "c", "persistentVolumeClaim": {"claimName": "x"}}));
        let cases = [
            (
                serde_json::json!({"metadata": {"name": "p"}}),
                r#"volume "c": persistentvolume "p" has no spec"#,
            ),
            (
                serde_json::json!({"metadata": {"name": "p"}, "spec": {"local": {"path": "rel"}}}),
                r#"volume "c": persistentvolume "p": local.path must be absolute"#,
            ),
            (
                serde_json::json!({"metadata": {"name": "p"}, "spec": {"hostPath": {"path": "rel"}}}),
                r#"volume "c": persistentvolume "p": hostPath.path must be absolute"#,
            ),
            (
                serde_json::json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": "d", "volumeHandle": "h",
                    "nodePublishSecretRef": {"name": "s"}}}}),
                r#"volume "c": persistentvolume "p": CSI secret references are not supported by nodelet yet"#,
            ),
            (
                serde_json::json!({"metadata": {"name": "p"}, "spec": {"nfs": {"server": "s", "path": "/"}}}),
                r#"volume "c": persistentvolume "p": nfs volumes are not supported by nodelet"#,
            ),
        ];
        for (json, want) in cases {
            assert_eq!(message(claim_source(&c, false, &pv(json)).1), want);
        }
    }

    #[test]
    fn render_errors_say_what_the_renderer_says_and_compare_by_it() {
        let a = SourceError::Render(RenderError::new(std::io::Error::other(
            "volume \"v\": configMap \"m\" not found",
        )));
        let b = SourceError::Render(RenderError::new(std::io::Error::other(
            "volume \"v\": configMap \"m\" not found",
        )));
        assert_eq!(a.to_string(), "volume \"v\": configMap \"m\" not found");
        assert_eq!(a, b);
        assert_ne!(a, SourceError::Render(RenderError::new(std::io::Error::other("other"))));
        assert!(!a.is_pending(), "a failure");
    }

    #[test]
    fn a_pending_render_is_a_wait_and_differs_from_the_same_failure() {
        let msg = "volume \"t\": no token yet: requesting a token for service account \"default\"";
        let waiting = SourceError::Render(RenderError::pending(std::io::Error::other(msg)));
        assert!(waiting.is_pending());
        assert_eq!(waiting.to_string(), msg, "the waiting reason says why");
        let failed = SourceError::Render(RenderError::new(std::io::Error::other(msg)));
        assert_ne!(waiting, failed, "a change from waiting to failed is a change of desired state");
        assert!(!SourceError::NotEmptyDir { volume: "t".into() }.is_pending());
    }
}

#[cfg(test)]
mod sync_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::model::actual::{ContainerRecord, ContainerState};
    use crate::model::pod::PodSource;
    use crate::volume::desired::{FileEntry, FileSet};

    /// Renders every configMap volume as one file, counting its calls.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Renderer for Counting {
        fn render(
            &self,
            pod: &DesiredPod,
            volume: &Volume,
            plugin: Plugin,
        ) -> Result<VolumeSource, RenderError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let data =
                format!("{}:{}", pod.name(), pod.pod.metadata.labels.iter().flatten().count()).into_bytes();
            let files = FileSet::from([(volume.name.clone(), FileEntry { data: data.into(), mode: 0o644 })]);
            Ok(VolumeSource::files(plugin, files))
        }
    }

    fn pod(uid: &str, labels: usize) -> DesiredPod {
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {
                "volumes": [{"name": "cfg", "configMap": {"name": "app"}}, {"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "c", "image": "i"}]
            }
        }))
        .expect("test pod");
        pod.metadata.labels = Some((0..labels).map(|i| (format!("l{i}"), "v".to_owned())).collect());
        DesiredPod { pod, source: PodSource::Http }
    }

    fn running(uid: &str) -> PodActual {
        PodActual {
            uid: uid.into(),
            containers: vec![ContainerRecord {
                state: ContainerState::Running,
                ..ContainerRecord::default()
            }],
            ..PodActual::default()
        }
    }

    #[test]
    fn a_change_of_one_pod_renders_that_pod_only_and_ends_where_a_full_sync_would() {
        let (pods, mut pods_writer) = reconcile_engine::store();
        let (pod_actual, mut actual_writer) = reconcile_engine::store();
        let (volumes, writer) = reconcile_engine::store();
        let renderer = Arc::new(Counting::default());
        let mut populator = Populator::new(pods, pod_actual, writer, renderer.clone());
        for uid in ["a", "b", "c"] {
            pods_writer.insert(uid.to_owned(), pod(uid, 0));
        }
        assert_eq!(populator.sync(), 6);
        assert_eq!(renderer.0.load(Ordering::Relaxed), 3);

        // One pod changes: one render, its content follows, and a full sync finds nothing left to do.
        pods_writer.insert("b".to_owned(), pod("b", 2));
        assert_eq!(populator.sync_pods(&["b".to_owned()]), 1);
        assert_eq!(renderer.0.load(Ordering::Relaxed), 4);
        let rendered = volumes.get(&"b/cfg".to_owned()).expect("b's volume");
        assert!(
            matches!(&rendered.source, Ok(VolumeSource::Files { files, .. }) if files["cfg"].data[..] == b"b:2"[..])
        );
        assert_eq!(populator.sync(), 0, "the same as a full sync");

        // A pod that goes while a container of its runs keeps its volumes; one with nothing running loses
        // them; nobody else is rendered.
        actual_writer.insert("a".to_owned(), running("a"));
        pods_writer.remove(&"a".to_owned());
        pods_writer.remove(&"c".to_owned());
        let before = renderer.0.load(Ordering::Relaxed);
        assert_eq!(populator.sync_pods(&["a".to_owned(), "c".to_owned()]), 2);
        assert_eq!(renderer.0.load(Ordering::Relaxed), before);
        let mut keys = volumes.keys();
        keys.sort();
        assert_eq!(keys, ["a/cfg", "a/scratch", "b/cfg", "b/scratch"]);
        assert_eq!(populator.sync(), 0, "the same as a full sync");

        // Its container stops: its volumes go too.
        actual_writer.remove(&"a".to_owned());
        assert_eq!(populator.sync_pods(&["a".to_owned()]), 2);
        assert_eq!(populator.sync(), 0, "the same as a full sync");
        assert_eq!(volumes.len(), 2);
        assert_eq!(populator.sync_pods(&[]), 0);
    }

    /// A running populator over pods `a`, `b`, `c` (its pod refresh `pod_refresh`, if any), once its first
    /// sync rendered each once; returns the pods' writer, the volume store, the render count, and its stop.
    async fn running_populator(
        pod_refresh: Option<Subscription<PodUid>>,
    ) -> (
        Writer<PodUid, DesiredPod>,
        Store<VolumeKey, DesiredVolume>,
        Arc<Counting>,
        (CancellationToken, tokio::task::JoinHandle<()>),
    ) {
        let (pods, mut pods_writer) = reconcile_engine::store();
        let (pod_actual, mut actual_writer) = reconcile_engine::store::<PodUid, PodActual>();
        let (volumes, writer) = reconcile_engine::store();
        let renderer = Arc::new(Counting::default());
        for uid in ["a", "b", "c"] {
            pods_writer.insert(uid.to_owned(), pod(uid, 0));
        }
        pods_writer.mark_synced();
        actual_writer.mark_synced();
        // The writer stays with the task: a dropped one would end the populator's waits.
        let (refresh, refresh_rx) = tokio::sync::watch::channel(());
        let shutdown = CancellationToken::new();
        let mut populator = Populator::new(pods, pod_actual, writer, renderer.clone());
        if let Some(sub) = pod_refresh {
            populator = populator.with_pod_refresh(sub);
        }
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            let _keep = (refresh, actual_writer);
            populator.run(refresh_rx, stop).await;
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while volumes.len() != 6 {
            assert!(std::time::Instant::now() < deadline, "the first sync");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(renderer.0.load(Ordering::Relaxed), 3);
        (pods_writer, volumes, renderer, (shutdown, task))
    }

    #[tokio::test]
    async fn the_running_populator_renders_only_the_pod_that_changed() {
        let (mut pods_writer, volumes, renderer, (shutdown, task)) = running_populator(None).await;
        let rendered = |uid: &str, labels: usize| {
            volumes.get(&format!("{uid}/cfg")).is_some_and(|v| {
                matches!(&v.source, Ok(VolumeSource::Files { files, .. })
                    if files["cfg"].data == format!("{uid}:{labels}").into_bytes())
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        pods_writer.insert("b".to_owned(), pod("b", 1));
        while !rendered("b", 1) {
            assert!(std::time::Instant::now() < deadline, "b's change");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(renderer.0.load(Ordering::Relaxed), 4, "one pod changed: one render");
        shutdown.cancel();
        task.await.expect("populator");
    }

    #[tokio::test]
    async fn a_pod_refresh_renders_only_the_pods_it_names() {
        // What cluster mode's pod data writes when a token is issued for a pod.
        let (issued, mut issued_writer) = reconcile_engine::store::<PodUid, ()>();
        let (_pods_writer, _volumes, renderer, (shutdown, task)) =
            running_populator(Some(issued.subscribe())).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        issued_writer.insert("b".to_owned(), ());
        while renderer.0.load(Ordering::Relaxed) < 4 {
            assert!(std::time::Instant::now() < deadline, "b's refresh");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Time for more renders, if there were to be any.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(renderer.0.load(Ordering::Relaxed), 4, "one pod named: one render");
        shutdown.cancel();
        task.await.expect("populator");
    }
}
