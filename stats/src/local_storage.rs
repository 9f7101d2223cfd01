//! The measurement behind local storage capacity isolation: every eviction monitoring period, in the
//! background, what each pod with a local storage limit (a disk emptyDir `sizeLimit`, a container's
//! `ephemeral-storage` limit) takes on disk, kept as the newest [`LocalStorage`] for the eviction
//! manager to read.
//!
//! | What | Where from |
//! |---|---|
//! | a container's writable layer | CRI `ListContainerStats` `writable_layer.used_bytes` (containerd 1.6 refreshes it from its snapshotter every `stats_collect_period`, 10 s) |
//! | a container's logs | bounded walk of `<podLogsDir>/<ns>_<pod>_<uid>/<container>/` |
//! | its volumes on disk (emptyDir, configMap; not a tmpfs) | bounded walk of the volume's directory, every pass; what a walk counts in full also updates the background volume measurement ([`volume_usage`](super::volume_usage)) that `/stats/summary` reads |
//! | dedicated image filesystem | the device of the runtime's image filesystem (`ImageFsInfo`) against `--root-dir`'s |
//!
//! Pods without limits are not measured here (the volume measurement, every `volumeStatsAggPeriod`,
//! covers every pod for `/stats/summary`). A pod with limits has its volumes walked on every pass,
//! so an emptyDir over its `sizeLimit` is found within the eviction monitoring period, not only
//! after the next `volumeStatsAggPeriod`. The walks ([`nodelet_host::usage`]) never follow a
//! symlink, never cross a mount, stop once a part is over the limit it is checked against, and
//! share a budget of `nodelet.localStorageEntryBudget` entries per measurement (default
//! [`ENTRY_BUDGET`]); pods are taken in turn from a rotating start so that a budget spent on one
//! pod's tree reaches the others next time. A walk the budget cuts short is kept, by the path it
//! measures, and resumed where it stopped by the next measurement ([`Walk`]): a tree with more
//! files than one budget is still counted whole, over several periods, and until then the part
//! reports the larger of its last whole count and what the walk under way has counted (a lower
//! bound: it can delay an eviction, never cause a wrong one, and more files cannot hide usage).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nodelet_cri::{ContainerFilter, labels};
use nodelet_host::usage::End;
use nodelet_host::usage::{Budget, Walk};
use nodelet_resources::eviction::local_storage::{ContainerStorage, LocalStorage, PodStorage, StorageLimits};
use nodelet_resources::model::pod::DesiredPod;
use nodelet_resources::model::volumes::Plugin;
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{VolumeKey, split_key};
use tokio_util::sync::CancellationToken;

use super::volume_usage::VolumeUsage;
use super::{StatsError, StatsProvider, every, is_path_segment};

/// Directory entries the walks of one measurement may examine in all: a few hundred milliseconds of
/// `fstatat` at most, whatever the pods hold.
pub const ENTRY_BUDGET: u64 = nodelet_config::DEFAULT_LOCAL_STORAGE_ENTRY_BUDGET;

/// The walks of the local storage measurement, by the path they measure: those of the previous
/// measurement (taken from) and those of this one (kept for the next).
#[derive(Debug, Default)]
pub(crate) struct Walks {
    previous: HashMap<PathBuf, Walk>,
    current: HashMap<PathBuf, Walk>,
}

impl Walks {
    /// The walks to keep for the next measurement: those of the paths this one measured (the walks
    /// of pods and volumes gone are dropped).
    fn into_next(self) -> Self {
        Walks { previous: self.current, current: HashMap::new() }
    }
}

/// One pod to measure: its identity, limits, and the paths of its local ephemeral volumes.
struct Wanted {
    pod: Arc<DesiredPod>,
    limits: StorageLimits,
    /// (volume name, volume key, path) of its volumes on disk.
    volumes: Vec<(String, VolumeKey, PathBuf)>,
    /// Its log directory.
    logs: Option<PathBuf>,
}

impl StatsProvider {
    /// Measures now and every `period` until `shutdown`.
    pub async fn measure_local_storage_every(
        self,
        period: Duration,
        entry_budget: u64,
        shutdown: CancellationToken,
    ) {
        every(period, &shutdown, || async {
            if let Err(e) = self.measure_local_storage(entry_budget).await {
                tracing::debug!(error = %e, "cannot measure the pods' local storage");
            }
        })
        .await;
    }

    /// The newest measurement (empty before the first).
    pub fn local_storage(&self) -> Arc<LocalStorage> {
        self.inner.local_storage.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Measures the pods with local storage limits, `entry_budget` directory entries at most, and
    /// keeps the result as the newest; walks cut short by the budget go on next time.
    pub(crate) async fn measure_local_storage(
        &self,
        entry_budget: u64,
    ) -> Result<Arc<LocalStorage>, StatsError> {
        let i = &self.inner;
        let mut wanted = Vec::new();
        for (uid, pod) in i.pods.as_ref().map(|p| p.entries()).unwrap_or_default() {
            let limits = StorageLimits::of(&pod);
            if limits.is_empty() {
                continue;
            }
            let volumes = i
                .volumes
                .as_ref()
                .map(|v| v.entries())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|(key, v)| {
                    let (u, name) = split_key(&key)?;
                    (u == uid && is_local_ephemeral(&v))
                        .then(|| (name.to_owned(), key.clone(), v.path.clone()))
                })
                .collect();
            let logs = i.runtime.pod_log_dir(pod.namespace(), pod.name(), &uid);
            wanted.push(Wanted { pod, limits, volumes, logs });
        }
        if wanted.is_empty() {
            *i.local_storage_walks.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Walks::default();
            let empty = Arc::new(LocalStorage::default());
            *i.local_storage.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = empty.clone();
            return Ok(empty);
        }
        let (rootfs, image_fs) = tokio::join!(self.writable_layers(), self.image_fs_mountpoint());
        let rootfs = rootfs?;
        let start = i.local_storage_cursor.fetch_add(1, Ordering::Relaxed) % wanted.len();
        wanted.rotate_left(start);
        let root_dir = i.config.root_dir.clone();
        let clock = i.clock.clone();
        // Taken out while the walks run (a measurement that fails starts them again).
        let mut walks = std::mem::take(
            &mut *i.local_storage_walks.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let (measured, fresh, walks) = tokio::task::spawn_blocking(move || {
            let dedicated_image_fs =
                image_fs.is_some_and(|m| device(&m).is_some_and(|d| Some(d) != device(&root_dir)));
            let mut budget = Budget::new(entry_budget);
            let mut fresh = Vec::new();
            let pods = wanted
                .into_iter()
                .map(|w| {
                    let uid = w.pod.uid().to_owned();
                    let (storage, walked) = measure_pod(&w, &rootfs, &mut budget, &mut walks, clock());
                    fresh.extend(walked);
                    (uid, storage)
                })
                .collect();
            (LocalStorage { pods, dedicated_image_fs }, fresh, walks.into_next())
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;
        *i.local_storage_walks.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = walks;
        // What the fresh walks counted in full is the volumes' newest usage for the summary too.
        self.update_volume_usage(fresh);
        let measured = Arc::new(measured);
        *i.local_storage.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = measured.clone();
        Ok(measured)
    }

    /// Each container's writable layer (bytes) by (pod UID, container name), the newest attempt's.
    async fn writable_layers(&self) -> Result<HashMap<(String, String), u64>, StatsError> {
        let node = &self.inner.config.node_name;
        let mut filter = ContainerFilter::managed();
        if !node.is_empty() {
            filter = filter.label(labels::NODE, node.clone());
        }
        let stats = self.inner.runtime.client().list_container_stats(&filter).await?;
        let mut newest: HashMap<(String, String), (u32, u64)> = HashMap::new();
        for s in stats {
            let Some(a) = &s.attributes else { continue };
            let (Some(uid), Some(name)) =
                (a.labels.get(labels::POD_UID), a.labels.get(labels::CONTAINER_NAME))
            else {
                continue;
            };
            let Some(used) = s.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref()).map(|v| v.value)
            else {
                continue;
            };
            let attempt = a.metadata.as_ref().map_or(0, |m| m.attempt);
            let entry = newest.entry((uid.clone(), name.clone())).or_insert((attempt, used));
            if attempt > entry.0 {
                *entry = (attempt, used);
            }
        }
        Ok(newest.into_iter().map(|(k, (_, used))| (k, used)).collect())
    }

    /// Where the runtime keeps its images (and the writable layers).
    async fn image_fs_mountpoint(&self) -> Option<PathBuf> {
        let info = self.inner.runtime.client().image_fs_info().await.ok()?;
        let fs = info.container_filesystems.first().or(info.image_filesystems.first())?;
        let mountpoint = PathBuf::from(&fs.fs_id.as_ref()?.mountpoint);
        mountpoint.is_absolute().then_some(mountpoint)
    }
}

/// Whether a volume counts as the pod's local ephemeral storage, as `/stats/summary` counts it: on
/// disk (not a tmpfs), written by nodelet for the pod (not a hostPath or a persistent volume).
fn is_local_ephemeral(v: &VolumeActual) -> bool {
    !v.tmpfs
        && matches!(
            v.plugin,
            Plugin::EmptyDir | Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected
        )
}

/// The device of the filesystem holding `path`.
fn device(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// A bounded pass over `path`, going on with the walk of the previous measurement, stopped once
/// over `limit` (blocking); `None` when it is gone or cannot be measured.
fn walk(
    path: &Path,
    limit: Option<u64>,
    budget: &mut Budget,
    walks: &mut Walks,
) -> Option<nodelet_host::usage::Measured> {
    let mut walk = walks.previous.remove(path).unwrap_or_default();
    let measured = walk.step(path, limit, budget);
    walks.current.insert(path.to_path_buf(), walk);
    match measured {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot measure local storage");
            None
        }
    }
}

/// Whether a volume of `w` counts: towards its emptyDir `sizeLimit` or the pod's limit.
fn volume_limit(w: &Wanted, name: &str) -> Option<u64> {
    let size_limit = w.limits.empty_dirs.get(name).map(|(b, _)| *b);
    // The emptyDir's own limit is checked first: stopping there keeps the kubelet's message.
    size_limit.or(w.limits.pod.as_ref().map(|(b, _)| *b))
}

/// Walks the volumes of `w` now, each stopped once over the limit it is checked against, and puts
/// what they count into `storage` (blocking); returns the walks that counted a whole volume.
fn walk_volumes(
    w: &Wanted,
    storage: &mut PodStorage,
    budget: &mut Budget,
    walks: &mut Walks,
    now: i64,
) -> Vec<(VolumeKey, VolumeUsage)> {
    let mut complete = Vec::new();
    for (name, key, path) in &w.volumes {
        let Some(limit) = volume_limit(w, name) else { continue };
        match walk(path, Some(limit), budget, walks) {
            Some(m) => {
                storage.volumes.insert(name.clone(), m.usage.bytes);
                if m.end == End::Complete {
                    let usage = VolumeUsage {
                        bytes: m.usage.bytes,
                        inodes: m.usage.inodes,
                        complete: true,
                        time: now,
                    };
                    complete.push((key.clone(), usage));
                }
            }
            None => {
                storage.volumes.remove(name);
            }
        }
    }
    complete
}

/// One pod's parts, walked now (blocking): the volumes that count towards a limit and the
/// containers' logs, each walk stopped once over the limits it is checked against. Also returns the
/// walks that counted a whole volume, for the volume measurement.
fn measure_pod(
    w: &Wanted,
    rootfs: &HashMap<(String, String), u64>,
    budget: &mut Budget,
    walks: &mut Walks,
    now: i64,
) -> (PodStorage, Vec<(VolumeKey, VolumeUsage)>) {
    let pod_limit = w.limits.pod.as_ref().map(|(b, _)| *b);
    let mut storage = PodStorage::default();
    let fresh = walk_volumes(w, &mut storage, budget, walks, now);
    if w.limits.containers.is_empty() && pod_limit.is_none() {
        return (storage, fresh);
    }
    let uid = w.pod.uid();
    let names = w.pod.containers().iter().chain(w.pod.init_containers()).map(|c| c.name.as_str());
    for name in names {
        let container_limit = w.limits.containers.get(name).map(|(b, _)| *b);
        // The pod's limit is checked before the container's: stop only past both, so that the first
        // check met is the one a full count would meet.
        let limit = match (container_limit, pod_limit) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let logs = w
            .logs
            .as_ref()
            .filter(|_| is_path_segment(name))
            .and_then(|dir| walk(&dir.join(name), limit, budget, walks))
            .map(|m| m.usage.bytes);
        let rootfs = rootfs.get(&(uid.to_owned(), name.to_owned())).copied();
        if logs.is_some() || rootfs.is_some() {
            storage.containers.insert(name.to_owned(), ContainerStorage { rootfs, logs });
        }
    }
    (storage, fresh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelet_resources::eviction::local_storage::check;
    use nodelet_resources::model::pod::PodSource;

    const MI: u64 = 1 << 20;

    fn write(path: &Path, bytes: u64) {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(path, vec![7_u8; usize::try_from(bytes).unwrap_or(0)])
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn wanted(dir: &Path) -> Wanted {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {
                "containers": [{"name": "app", "image": "busybox",
                    "resources": {"limits": {"ephemeral-storage": "100Mi"}}}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}, {"name": "cm", "configMap": {"name": "x"}}],
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let pod = Arc::new(DesiredPod { pod, source: PodSource::Http });
        Wanted {
            limits: StorageLimits::of(&pod),
            pod,
            volumes: vec![
                ("scratch".into(), "u1/scratch".into(), dir.join("scratch")),
                ("cm".into(), "u1/cm".into(), dir.join("cm")),
            ],
            logs: Some(dir.join("logs")),
        }
    }

    #[test]
    fn volumes_and_logs_are_walked_each_stopping_at_its_limit() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let w = wanted(dir.path());
        write(&dir.path().join("scratch/f"), MI / 2);
        write(&dir.path().join("cm/data"), 100);
        write(&dir.path().join("logs/app/0.log"), 3 * MI);
        let rootfs: HashMap<(String, String), u64> = [(("u1".to_owned(), "app".to_owned()), 5 * MI)].into();
        let mut budget = Budget::new(ENTRY_BUDGET);
        let (s, fresh) = measure_pod(&w, &rootfs, &mut budget, &mut Walks::default(), 5);
        assert!(s.volumes.get("scratch").is_some_and(|b| *b >= MI / 2 && *b < MI), "{s:?}");
        assert!(s.volumes.get("cm").is_some_and(|b| *b > 0 && *b < MI), "{s:?}");
        let app = s.containers.get("app").copied().unwrap_or_default();
        assert_eq!(app.rootfs, Some(5 * MI));
        assert!(app.logs.is_some_and(|b| b >= 3 * MI), "{app:?}");
        assert!(budget.remaining() < ENTRY_BUDGET);
        assert_eq!(check(&w.pod, &s, false), None);
        // Both volumes were counted whole: they go back into the volume measurement.
        let mut keys: Vec<&str> = fresh.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["u1/cm", "u1/scratch"]);
    }

    #[test]
    fn a_volume_over_its_limit_is_caught_by_the_pass_itself_and_an_emptied_one_is_not_held_against_the_pod() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let w = wanted(dir.path());
        let scratch = dir.path().join("scratch");
        for i in 0..8 {
            write(&scratch.join(format!("f{i}")), MI / 2);
        }
        write(&dir.path().join("cm/data"), 100);
        let mut budget = Budget::new(ENTRY_BUDGET);
        let (s, fresh) = measure_pod(&w, &HashMap::new(), &mut budget, &mut Walks::default(), 5);
        let walked = s.volumes.get("scratch").copied().unwrap_or(0);
        assert!(walked > MI && walked < 4 * MI, "stopped soon after 1Mi, not all 4Mi: {walked}");
        // Only whole counts go back into the volume measurement: the configMap's, not the cut emptyDir's.
        assert_eq!(fresh.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["u1/cm"]);
        assert_eq!(
            check(&w.pod, &s, false).map(|e| e.message),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".to_owned())
        );

        std::fs::remove_dir_all(&scratch).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(&scratch).unwrap_or_else(|e| panic!("{e}"));
        let (s, _) = measure_pod(&w, &HashMap::new(), &mut budget, &mut Walks::default(), 6);
        assert_eq!(check(&w.pod, &s, false), None, "{s:?}");
    }

    #[test]
    fn a_volume_with_more_files_than_the_budget_is_measured_whole_over_several_passes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let w = wanted(dir.path());
        // 300 files of 8 KiB: 2.3 MiB, over the 1Mi sizeLimit, in more entries than a pass may examine.
        for i in 0..300 {
            write(&dir.path().join(format!("scratch/{}/f{i}", i % 3)), 8192);
        }
        let mut walks = Walks::default();
        let mut reported = Vec::new();
        let evicted = loop {
            assert!(reported.len() < 20, "the walk makes progress: {reported:?}");
            let mut budget = Budget::new(40);
            let (s, _) = measure_pod(&w, &HashMap::new(), &mut budget, &mut walks, 5);
            walks = walks.into_next();
            reported.push(s.volumes.get("scratch").copied().unwrap_or(0));
            if let Some(e) = check(&w.pod, &s, false) {
                break e;
            }
        };
        assert_eq!(evicted.signal, nodelet_resources::eviction::local_storage::LimitSignal::EmptyDirFs);
        assert!(reported.len() > 2, "no single pass could count past 1Mi: {reported:?}");
        assert!(reported.windows(2).all(|p| p[0] <= p[1]), "{reported:?}");
        // Without the walks kept, every pass counts the same first 40 entries and never finds it.
        let mut budget = Budget::new(40);
        let (s, _) = measure_pod(&w, &HashMap::new(), &mut budget, &mut Walks::default(), 5);
        assert_eq!(check(&w.pod, &s, false), None);
    }
}
