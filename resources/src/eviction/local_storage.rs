//! Local storage capacity isolation: the kubelet's `localStorageEviction`. Every pass, before the
//! node-pressure thresholds, each running pod's measured local ephemeral storage ([`PodStorage`]) is
//! compared with its limits, in the kubelet's order:
//!
//! 1. each disk-backed `emptyDir` over its `sizeLimit`: `Usage of EmptyDir volume "<name>" exceeds
//!    the limit "<sizeLimit>". ` (signal `emptydirfs.limit`);
//! 2. the pod's local ephemeral storage (its containers' writable layers and logs, its volumes on disk)
//!    over the sum of its containers' `ephemeral-storage` limits: `Pod ephemeral local
//!    storage usage exceeds the total limit of containers <limit>. ` (`ephemeralpodfs.limit`);
//! 3. a container's logs, plus its writable layer unless the image filesystem is a filesystem of its
//!    own, over its `ephemeral-storage` limit: `Container <name> exceeded its local ephemeral storage
//!    limit "<limit>". ` (`ephemeralcontainerfs.limit`).
//!
//! The first one met evicts the pod at once (the hard-eviction grace period). Pure: the
//! measurement is data ([`LocalStorage`]), taken in the background by the node's stats and read by
//! the eviction pair's sampler with each sample ([`sampler`](super::sampler)), checked by its
//! [`reconciler`](super::reconciler).

use std::collections::BTreeMap;

use crate::model::pod::{DesiredPod, is_sidecar};
use crate::quantity::Quantity;

/// The resource name of local ephemeral storage.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Which limit a pod went over; the `eviction_signal` label of `kubelet_evictions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitSignal {
    /// An emptyDir over its `sizeLimit`.
    EmptyDirFs,
    /// The pod over the sum of its containers' limits.
    EphemeralPodFs,
    /// A container over its limit.
    EphemeralContainerFs,
}

impl LimitSignal {
    /// Every limit signal.
    pub const ALL: [LimitSignal; 3] =
        [LimitSignal::EmptyDirFs, LimitSignal::EphemeralPodFs, LimitSignal::EphemeralContainerFs];

    /// The kubelet's name (`emptydirfs.limit`, `ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`).
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSignal::EmptyDirFs => "emptydirfs.limit",
            LimitSignal::EphemeralPodFs => "ephemeralpodfs.limit",
            LimitSignal::EphemeralContainerFs => "ephemeralcontainerfs.limit",
        }
    }
}

/// What one container's local ephemeral storage takes, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerStorage {
    /// Its writable layer (the runtime's `writable_layer`), when the runtime reports it.
    pub rootfs: Option<u64>,
    /// Its log files, when measured.
    pub logs: Option<u64>,
}

/// What one pod's local ephemeral storage takes, bytes. A measurement stopped early (over a limit,
/// out of budget) gives a lower bound, which can only miss an eviction, never cause a wrong one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodStorage {
    /// Its local ephemeral volumes (those on disk nodelet writes for the pod: emptyDirs, configMaps,
    /// ...; not a tmpfs), by volume name.
    pub volumes: BTreeMap<String, u64>,
    /// Its containers, by name.
    pub containers: BTreeMap<String, ContainerStorage>,
}

impl PodStorage {
    /// Everything together: the pod's local ephemeral storage usage.
    pub fn total(&self) -> u64 {
        let containers = self
            .containers
            .values()
            .map(|c| c.rootfs.unwrap_or(0).saturating_add(c.logs.unwrap_or(0)))
            .fold(0_u64, u64::saturating_add);
        self.volumes.values().fold(containers, |a, b| a.saturating_add(*b))
    }
}

/// One measurement of the node's pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalStorage {
    /// Each measured pod, by UID (pods without any local storage limit are not measured).
    pub pods: BTreeMap<String, PodStorage>,
    /// Whether the image filesystem (the writable layers) is another filesystem than the root
    /// directory's: then a container's limit counts only its logs, as the kubelet does.
    pub dedicated_image_fs: bool,
}

/// A pod over one of its local storage limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// Which limit.
    pub signal: LimitSignal,
    /// The kubelet's message.
    pub message: String,
}

/// The limits one pod has, as the measurement needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageLimits {
    /// Disk-backed emptyDirs with a positive `sizeLimit`: bytes and the quantity as written.
    pub empty_dirs: BTreeMap<String, (u64, String)>,
    /// App containers with a non-zero `ephemeral-storage` limit: bytes and the quantity as written.
    pub containers: BTreeMap<String, (u64, String)>,
    /// The pod's limit (the kubelet's `PodLimits`): the app and sidecar containers' limits summed,
    /// at least any init container's, plus the RuntimeClass overhead; bytes and as printed.
    pub pod: Option<(u64, String)>,
}

impl StorageLimits {
    /// The limits of `pod`.
    pub fn of(pod: &DesiredPod) -> Self {
        let mut limits = StorageLimits::default();
        for v in pod.spec().volumes.iter().flatten() {
            let Some(e) = &v.empty_dir else { continue };
            // Disk-backed only: a `Memory` emptyDir is a tmpfs of that size.
            if !matches!(e.medium.as_deref(), None | Some("")) {
                continue;
            }
            if let Some(q) = e.size_limit.as_ref().and_then(|q| parse(&q.0)).filter(|q| q.0 > 0) {
                limits.empty_dirs.insert(v.name.clone(), q);
            }
        }
        let limit_of = |c: &k8s_openapi::api::core::v1::Container| {
            c.resources.as_ref()?.limits.as_ref()?.get(EPHEMERAL_STORAGE).and_then(|q| parse(&q.0))
        };
        for c in pod.containers() {
            if let Some(q) = limit_of(c).filter(|q| q.0 > 0) {
                limits.containers.insert(c.name.clone(), q);
            }
        }
        // PodLimits: sum the app containers (and sidecars, which run beside them), then take the
        // largest of that and each init container; the overhead is added to a limit that exists.
        let mut sum: Option<(u64, Format)> = None;
        let mut add = |q: (u64, String)| {
            let f = Format::of(&q.1);
            sum = Some(match sum {
                Some((s, first)) => (s.saturating_add(q.0), first),
                None => (q.0, f),
            });
        };
        for c in pod.containers().iter().chain(pod.init_containers().iter().filter(|c| is_sidecar(c))) {
            if let Some(q) = limit_of(c) {
                add(q);
            }
        }
        for c in pod.init_containers().iter().filter(|c| !is_sidecar(c)) {
            if let Some(q) = limit_of(c)
                && sum.is_none_or(|(s, _)| q.0 > s)
            {
                sum = Some((q.0, Format::of(&q.1)));
            }
        }
        if let (Some((s, f)), Some(o)) = (
            sum,
            pod.spec().overhead.as_ref().and_then(|o| o.get(EPHEMERAL_STORAGE)).and_then(|q| parse(&q.0)),
        ) {
            sum = Some((s.saturating_add(o.0), f));
        }
        limits.pod = sum.map(|(s, f)| (s, f.print(s)));
        limits
    }

    /// Whether the pod has no local storage limit at all (nothing to measure).
    pub fn is_empty(&self) -> bool {
        self.empty_dirs.is_empty() && self.containers.is_empty() && self.pod.is_none()
    }
}

/// Bytes of a quantity (rounded up) and the text as written.
fn parse(text: &str) -> Option<(u64, String)> {
    let q = Quantity::parse(text)?;
    if q.is_negative() {
        return None;
    }
    Some((u64::try_from(q.scaled_ceil(1)).unwrap_or(u64::MAX), text.to_owned()))
}

/// How a quantity prints (`resource.Quantity`'s format, from its suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    BinarySi,
    DecimalSi,
    DecimalExponent,
}

impl Format {
    fn of(text: &str) -> Format {
        if text.ends_with('i') {
            Format::BinarySi
        } else if text.contains(['e', 'E']) {
            Format::DecimalExponent
        } else {
            Format::DecimalSi
        }
    }

    /// `n` in canonical form, as `Quantity.String()` prints a whole number of this format: binary
    /// suffixes for a multiple of 1024 (at least 1024), else decimal (`k`, `M`, … or `e3`, `e6`, …).
    fn print(self, n: u64) -> String {
        if self == Format::BinarySi && n >= 1024 {
            for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
                let unit = 1_u64 << shift;
                if n.is_multiple_of(unit) {
                    return format!("{}{suffix}", n / unit);
                }
            }
        }
        let (mut m, mut exp) = (n, 0_usize);
        while m != 0 && m.is_multiple_of(1000) && exp < 6 {
            m /= 1000;
            exp += 1;
        }
        if self == Format::DecimalExponent {
            return if exp == 0 { m.to_string() } else { format!("{m}e{}", exp * 3) };
        }
        format!("{m}{}", ["", "k", "M", "G", "T", "P", "E"][exp])
    }
}

/// The canonical form of a quantity as written (`1024Ki` → `1Mi`, `1000000` → `1M`), as the kubelet
/// prints limits in its messages.
pub fn canonical(text: &str) -> String {
    parse(text).map_or_else(|| text.to_owned(), |(n, t)| Format::of(&t).print(n))
}

/// The first limit `pod` is over, in the kubelet's order (emptyDir, pod, container), given what it
/// uses.
pub fn check(pod: &DesiredPod, usage: &PodStorage, dedicated_image_fs: bool) -> Option<Exceeded> {
    let limits = StorageLimits::of(pod);
    for v in pod.spec().volumes.iter().flatten() {
        let (Some((size, text)), Some(used)) = (limits.empty_dirs.get(&v.name), usage.volumes.get(&v.name))
        else {
            continue;
        };
        if used > size {
            return Some(Exceeded {
                signal: LimitSignal::EmptyDirFs,
                message: format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    v.name,
                    canonical(text)
                ),
            });
        }
    }
    if let Some((limit, text)) = &limits.pod
        && usage.total() > *limit
    {
        return Some(Exceeded {
            signal: LimitSignal::EphemeralPodFs,
            message: format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {text}. "
            ),
        });
    }
    for (name, c) in &usage.containers {
        let Some((limit, text)) = limits.containers.get(name) else { continue };
        let mut used = c.logs.unwrap_or(0);
        if !dedicated_image_fs {
            used = used.saturating_add(c.rootfs.unwrap_or(0));
        }
        if used > *limit {
            return Some(Exceeded {
                signal: LimitSignal::EphemeralContainerFs,
                message: format!(
                    "Container {name} exceeded its local ephemeral storage limit {:?}. ",
                    canonical(text)
                ),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::PodSource;
    use k8s_openapi::api::core::v1::Pod;

    const MI: u64 = 1 << 20;

    fn pod(spec: serde_json::Value) -> DesiredPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        DesiredPod { pod, source: PodSource::Http }
    }

    fn container(name: &str, limit: Option<&str>) -> serde_json::Value {
        let mut c = serde_json::json!({"name": name, "image": "busybox"});
        if let Some(l) = limit {
            c["resources"] = serde_json::json!({"limits": {"ephemeral-storage": l}});
        }
        c
    }

    fn usage(volumes: &[(&str, u64)], containers: &[(&str, Option<u64>, Option<u64>)]) -> PodStorage {
        PodStorage {
            volumes: volumes.iter().map(|(n, b)| ((*n).to_owned(), *b)).collect(),
            containers: containers
                .iter()
                .map(|(n, rootfs, logs)| ((*n).to_owned(), ContainerStorage { rootfs: *rootfs, logs: *logs }))
                .collect(),
        }
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_evicts_with_the_kubelet_message() {
        let p = pod(serde_json::json!({
            "containers": [container("app", None)],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "1024Ki"}},
                {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "free", "emptyDir": {}},
            ],
        }));
        assert_eq!(
            check(&p, &usage(&[("scratch", MI), ("free", 100 * MI)], &[]), false),
            None,
            "equal is not over"
        );
        assert_eq!(
            check(&p, &usage(&[("scratch", MI + 1)], &[]), false),
            Some(Exceeded {
                signal: LimitSignal::EmptyDirFs,
                message: "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".into(),
            })
        );
        assert_eq!(
            check(&p, &usage(&[("ram", 2 * MI)], &[]), false),
            None,
            "a Memory emptyDir is tmpfs, sized"
        );
        assert_eq!(StorageLimits::of(&p).empty_dirs.len(), 1);
    }

    #[test]
    fn a_container_over_its_limit_counts_logs_and_its_writable_layer_unless_on_a_dedicated_image_fs() {
        let p = pod(serde_json::json!({
            "containers": [container("app", Some("2Mi")), container("other", None)],
        }));
        let u = usage(&[], &[("app", Some(MI + MI / 2), Some(MI)), ("other", Some(50 * MI), None)]);
        // The pod's limit is 2Mi too: app's 2.5Mi plus other's 50Mi are over it first.
        assert_eq!(check(&p, &u, false).map(|e| e.signal), Some(LimitSignal::EphemeralPodFs));
        let p = pod(serde_json::json!({
            "containers": [container("app", Some("2Mi")), container("big", Some("100Mi"))],
        }));
        let u = usage(&[], &[("app", Some(MI + MI / 2), Some(MI)), ("big", Some(10 * MI), None)]);
        assert_eq!(
            check(&p, &u, false),
            Some(Exceeded {
                signal: LimitSignal::EphemeralContainerFs,
                message: "Container app exceeded its local ephemeral storage limit \"2Mi\". ".into(),
            })
        );
        assert_eq!(check(&p, &u, true), None, "on a dedicated image filesystem only the 1Mi of logs count");
    }

    #[test]
    fn the_pod_total_counts_volumes_and_containers_against_the_sum_of_limits() {
        let p = pod(serde_json::json!({
            "containers": [container("a", Some("1Mi")), container("b", Some("2Mi")), container("c", None)],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        }));
        assert_eq!(StorageLimits::of(&p).pod, Some((3 * MI, "3Mi".into())));
        let within = usage(&[("scratch", 2 * MI)], &[("a", Some(MI / 2), None), ("c", None, Some(MI / 2))]);
        assert_eq!(check(&p, &within, false), None, "exactly 3Mi");
        let over = usage(&[("scratch", 2 * MI + 1)], &[("a", Some(MI / 2), None), ("c", None, Some(MI / 2))]);
        assert_eq!(
            check(&p, &over, false),
            Some(Exceeded {
                signal: LimitSignal::EphemeralPodFs,
                message: "Pod ephemeral local storage usage exceeds the total limit of containers 3Mi. "
                    .into(),
            })
        );
    }

    #[test]
    fn pod_limits_take_init_containers_sidecars_and_overhead_into_account() {
        let mut sidecar = container("sidecar", Some("1Mi"));
        sidecar["restartPolicy"] = serde_json::json!("Always");
        let p = pod(serde_json::json!({
            "initContainers": [container("init", Some("10Mi")), sidecar],
            "containers": [container("app", Some("2Mi"))],
        }));
        assert_eq!(
            StorageLimits::of(&p).pod,
            Some((10 * MI, "10Mi".into())),
            "the init container's is larger"
        );
        let p = pod(serde_json::json!({
            "containers": [container("app", Some("1G"))],
            "overhead": {"ephemeral-storage": "500M"},
        }));
        assert_eq!(StorageLimits::of(&p).pod, Some((1_500_000_000, "1500M".into())));
        let none = pod(serde_json::json!({"containers": [container("app", None)]}));
        assert!(StorageLimits::of(&none).is_empty());
        assert_eq!(check(&none, &usage(&[], &[("app", Some(u64::MAX), Some(u64::MAX))]), false), None);
    }

    #[test]
    fn the_empty_dir_is_checked_before_the_pod_and_the_pod_before_the_container() {
        let p = pod(serde_json::json!({
            "containers": [container("app", Some("1Mi"))],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Mi"}}],
        }));
        let all_over = usage(&[("v", 2 * MI)], &[("app", Some(2 * MI), Some(0))]);
        assert_eq!(check(&p, &all_over, false).map(|e| e.signal), Some(LimitSignal::EmptyDirFs));
        let pod_over = usage(&[("v", MI)], &[("app", Some(2 * MI), Some(0))]);
        assert_eq!(check(&p, &pod_over, false).map(|e| e.signal), Some(LimitSignal::EphemeralPodFs));
    }

    #[test]
    fn quantities_print_in_canonical_form() {
        assert_eq!(canonical("1Mi"), "1Mi");
        assert_eq!(canonical("1024Ki"), "1Mi");
        assert_eq!(canonical("1536Ki"), "1536Ki");
        assert_eq!(canonical("1.5Gi"), "1536Mi");
        assert_eq!(canonical("500"), "500");
        assert_eq!(canonical("1000000"), "1M");
        assert_eq!(canonical("1e6"), "1e6");
        assert_eq!(canonical("100Mi"), "100Mi");
    }
}
