//! The desired-state populator: the PersistentVolume, PersistentVolumeClaim and StorageClass
//! objects from the sources, the volumes provisioners created, and which claims the desired
//! pods use.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use reconcile_engine::{CancellationToken, Store, Writer};
use tokio::sync::watch;

use super::actual::ClaimActual;
use super::desired::{
    ANN_BETA_CLASS, ANN_DEFAULT_CLASS, ClaimDesired, ClaimKey, DesiredPv, DesiredPvc, validate_pvc,
};
use super::driver::ProvisionedVolumes;
use crate::model::pod::{DesiredPod, PodUid};

/// The storage objects the sources declare (standalone mode: the manifest directory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimObjects {
    /// PersistentVolumes.
    pub volumes: Vec<PersistentVolume>,
    /// PersistentVolumeClaims.
    pub claims: Vec<PersistentVolumeClaim>,
    /// StorageClasses.
    pub classes: Vec<StorageClass>,
}

/// Where the populator reads the storage objects from: a watch channel of [`ClaimObjects`], or
/// of anything they are read from ([`ObjectFeed::mapped`]), so that they are never behind the
/// channel they come from.
pub struct ObjectFeed(Box<dyn Feed>);

impl std::fmt::Debug for ObjectFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectFeed").finish_non_exhaustive()
    }
}

impl ObjectFeed {
    /// The objects read by `map` from the values of `objects` (once per value).
    pub fn mapped<T: Send + Sync + 'static>(
        objects: watch::Receiver<Arc<T>>,
        map: fn(&T) -> ClaimObjects,
    ) -> Self {
        ObjectFeed(Box::new(Mapped { objects, map, cache: None }))
    }
}

impl From<watch::Receiver<Arc<ClaimObjects>>> for ObjectFeed {
    fn from(objects: watch::Receiver<Arc<ClaimObjects>>) -> Self {
        ObjectFeed::mapped(objects, ClaimObjects::clone)
    }
}

trait Feed: Send + Sync {
    fn current(&mut self) -> Arc<ClaimObjects>;
    fn changed(&mut self) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

struct Mapped<T> {
    objects: watch::Receiver<Arc<T>>,
    map: fn(&T) -> ClaimObjects,
    cache: Option<(Arc<T>, Arc<ClaimObjects>)>,
}

impl<T: Send + Sync + 'static> Feed for Mapped<T> {
    fn current(&mut self) -> Arc<ClaimObjects> {
        let now = self.objects.borrow_and_update().clone();
        match &self.cache {
            Some((from, mapped)) if Arc::ptr_eq(from, &now) => mapped.clone(),
            _ => {
                let mapped = Arc::new((self.map)(&now));
                self.cache = Some((now, mapped.clone()));
                mapped
            }
        }
    }

    fn changed(&mut self) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move { self.objects.changed().await.is_ok() })
    }
}

/// How often the populator recomputes everything even without a change it was told of.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(60);

/// Keeps the desired claim store in step with the objects and the pods.
pub struct Populator {
    objects: ObjectFeed,
    provisioned: ProvisionedVolumes,
    pods: Store<PodUid, DesiredPod>,
    actual: Store<ClaimKey, ClaimActual>,
    writer: Writer<ClaimKey, ClaimDesired>,
    uids: BTreeMap<(String, String), String>,
    uid_seed: std::hash::RandomState,
    uid_counter: u64,
}

impl std::fmt::Debug for Populator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Populator").field("entries", &self.writer.reader().len()).finish_non_exhaustive()
    }
}

/// The claims the static pods use: (namespace, claim name). An API pod's claims are the control plane's
/// to bind (objects do not cross sources): they never count here, so a claim a manifest declares is never
/// bound or provisioned for an API pod.
pub fn claims_in_use(pods: &Store<PodUid, DesiredPod>) -> BTreeSet<(String, String)> {
    let mut used = BTreeSet::new();
    pods.for_each(|_, pod| {
        if pod.source == crate::model::pod::PodSource::Api {
            return;
        }
        for volume in pod.spec().volumes.iter().flatten() {
            if let Some(c) = &volume.persistent_volume_claim {
                used.insert((pod.namespace().to_owned(), c.claim_name.clone()));
            }
        }
    });
    used
}

impl Populator {
    /// A populator writing `writer` from `objects`, the provisioned volumes, the desired pods,
    /// and the claim engine's actual store (claim UIDs survive restarts through it).
    pub fn new(
        objects: impl Into<ObjectFeed>,
        provisioned: ProvisionedVolumes,
        pods: Store<PodUid, DesiredPod>,
        actual: Store<ClaimKey, ClaimActual>,
        writer: Writer<ClaimKey, ClaimDesired>,
    ) -> Self {
        Self {
            objects: objects.into(),
            provisioned,
            pods,
            actual,
            writer,
            uids: BTreeMap::new(),
            uid_seed: std::hash::RandomState::new(),
            uid_counter: 0,
        }
    }

    fn new_uid(&mut self, namespace: &str, name: &str) -> String {
        self.uid_counter += 1;
        let mut parts = [0u64; 2];
        for (i, part) in parts.iter_mut().enumerate() {
            let mut h = self.uid_seed.build_hasher();
            h.write(namespace.as_bytes());
            h.write_u8(0);
            h.write(name.as_bytes());
            h.write_u64(self.uid_counter);
            h.write_usize(i);
            *part = h.finish();
        }
        let hex = format!("{:016x}{:016x}", parts[0], parts[1]);
        format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
    }

    /// Recomputes the whole desired store; returns the number of keys that changed.
    pub fn sync(&mut self) -> usize {
        let objects = self.objects.0.current();
        let current = self.writer.reader();
        let in_use = claims_in_use(&self.pods);
        let mut entries: BTreeMap<ClaimKey, ClaimDesired> = BTreeMap::new();

        // Classes (the last declaration of a name wins, as a later apply would).
        let mut classes: BTreeMap<String, Arc<StorageClass>> = BTreeMap::new();
        for class in &objects.classes {
            if let Some(name) = class.metadata.name.clone().filter(|n| super::desired::is_dns_subdomain(n)) {
                classes.insert(name, Arc::new(class.clone()));
            } else {
                tracing::warn!(name = ?class.metadata.name, "ignoring a StorageClass with an invalid name");
            }
        }
        // The newest default class, as the DefaultStorageClass admission plugin picks it.
        let default_class = classes
            .values()
            .filter(|c| {
                c.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_DEFAULT_CLASS))
                    .is_some_and(|v| v == "true")
            })
            .max_by(|a, b| {
                (a.metadata.creation_timestamp.as_ref().map(|t| t.0), &a.metadata.name)
                    .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), &b.metadata.name))
            })
            .and_then(|c| c.metadata.name.clone());
        for (name, class) in &classes {
            entries.insert(ClaimKey::Class(name.clone()), ClaimDesired::Class(class.clone()));
        }

        // Claims.
        let mut declared: BTreeMap<(String, String), PersistentVolumeClaim> = BTreeMap::new();
        for claim in &objects.claims {
            let mut claim = claim.clone();
            let namespace = claim
                .metadata
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".into());
            claim.metadata.namespace = Some(namespace.clone());
            let name = claim.metadata.name.clone().unwrap_or_default();
            declared.insert((namespace, name), claim);
        }
        // A claim removed while a pod uses it stays until the pod is gone (pvc-protection).
        for (key, value) in current.entries() {
            if let (ClaimKey::Claim { namespace, name }, ClaimDesired::Claim(c)) = (&key, &*value) {
                let id = (namespace.clone(), name.clone());
                if !declared.contains_key(&id) && in_use.contains(&id) {
                    let mut kept = c.clone();
                    kept.deleting = true;
                    entries.insert(key.clone(), ClaimDesired::Claim(kept));
                }
            }
        }
        let kept: BTreeSet<(String, String)> = entries
            .keys()
            .filter_map(|k| match k {
                ClaimKey::Claim { namespace, name } => Some((namespace.clone(), name.clone())),
                _ => None,
            })
            .collect();
        self.uids.retain(|id, _| declared.contains_key(id) || kept.contains(id));
        for ((namespace, name), pvc) in declared {
            let id = (namespace.clone(), name.clone());
            let key = ClaimKey::claim(&namespace, &name);
            let uid = match pvc.metadata.uid.clone().filter(|u| !u.is_empty()) {
                Some(uid) => uid,
                None => match self.uids.get(&id) {
                    Some(uid) => uid.clone(),
                    None => match self.actual.get(&key).and_then(|a| a.as_claim().map(|a| a.uid.clone())) {
                        // After a restart: the claim is the one the record was made for.
                        Some(uid) => uid,
                        None => self.new_uid(&namespace, &name),
                    },
                },
            };
            self.uids.insert(id.clone(), uid.clone());
            let class = pvc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_BETA_CLASS))
                .cloned()
                .or_else(|| pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
                .or_else(|| default_class.clone())
                .unwrap_or_default();
            let invalid = validate_pvc(&pvc).err();
            let claim = DesiredPvc {
                storage_class: classes.get(&class).cloned(),
                class,
                uid,
                in_use: in_use.contains(&id),
                deleting: false,
                invalid,
                pvc: Arc::new(pvc),
            };
            entries.insert(key, ClaimDesired::Claim(claim));
        }

        // Volumes: declared, then provisioned (real storage wins over a declaration of the same name).
        for pv in &objects.volumes {
            let v = DesiredPv::new(pv.clone(), false);
            entries.insert(ClaimKey::Volume(v.name().to_owned()), ClaimDesired::Volume(v));
        }
        for pv in self.provisioned.snapshot().values() {
            let v = DesiredPv::new((**pv).clone(), true);
            entries.insert(ClaimKey::Volume(v.name().to_owned()), ClaimDesired::Volume(v));
        }
        // A volume removed while its claim is in use stays until the pods are gone (pv-protection).
        for (key, value) in current.entries() {
            if let (ClaimKey::Volume(name), ClaimDesired::Volume(_)) = (&key, &*value)
                && !entries.contains_key(&key)
            {
                let used = self.actual.entries().iter().any(|(k, a)| {
                    matches!(k, ClaimKey::Claim { namespace, name: n } if in_use.contains(&(namespace.clone(), n.clone())))
                        && a.as_claim().is_some_and(|a| a.volume.as_deref() == Some(name.as_str()))
                });
                if used {
                    entries.insert(key.clone(), (*value).clone());
                }
            }
        }
        self.writer.replace_all(entries)
    }

    /// Populates until `shutdown`: first once the pod sources and the claim engine's
    /// reconstruction are complete (then the store counts as synced), then on every change of
    /// the objects, the provisioned volumes or the pods, and every [`RESYNC_PERIOD`].
    pub async fn run(mut self, shutdown: CancellationToken) {
        let pods_sub = self.pods.subscribe();
        let mut provisioned = self.provisioned.subscribe();
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = async {
                let _ = self.pods.wait_until_synced().await;
                let _ = self.actual.wait_until_synced().await;
            } => {}
        }
        let changed = self.sync();
        self.writer.mark_synced();
        tracing::debug!(changed, entries = self.writer.reader().len(), "desired claims synced");
        let mut objects_closed = false;
        let mut provisioned_closed = false;
        let mut resync = tokio::time::interval(RESYNC_PERIOD);
        resync.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = pods_sub.changed() => { pods_sub.drain(); }
                open = self.objects.0.changed(), if !objects_closed => objects_closed = !open,
                r = provisioned.changed(), if !provisioned_closed => provisioned_closed = r.is_err(),
                _ = resync.tick() => {}
            }
            let changed = self.sync();
            if changed > 0 {
                tracing::debug!(changed, "desired claims updated");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume};

    use super::*;
    use crate::model::pod::PodSource;

    fn using(claim: &str, source: PodSource) -> DesiredPod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.spec = Some(PodSpec {
            volumes: Some(vec![Volume {
                name: "v".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        });
        DesiredPod { pod, source }
    }

    #[test]
    fn an_api_pods_claims_are_never_nodelets_to_bind() {
        let (pods, mut writer) = reconcile_engine::store();
        writer.insert("a".to_owned(), using("static-data", PodSource::File("/m/a.yaml".into())));
        writer.insert("b".to_owned(), using("api-data", PodSource::Api));
        writer.insert("c".to_owned(), using("http-data", PodSource::Http));
        let used: Vec<(String, String)> = claims_in_use(&pods).into_iter().collect();
        assert_eq!(
            used,
            [("ns".to_owned(), "http-data".to_owned()), ("ns".to_owned(), "static-data".to_owned())]
        );
    }
}
