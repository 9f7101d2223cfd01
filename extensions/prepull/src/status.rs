//! The extension's status table (`nodelet get prepull`): one row per image the manifests name and one per
//! invalid manifest file.
//!
//! | column | image rows | manifest rows |
//! |---|---|---|
//! | NAME | the normalized reference | the file's path |
//! | KIND | `image` | `manifest` |
//! | STATUS | `Present`, `Pulling` or `PullFailed` | `Invalid` |
//! | DETAIL | the image ID, or the last pull error and its count | why the file is invalid |
//! | MANIFESTS | the manifests naming it | |
//! | PODS | how many pods of the node use it | |

use nodelet::StatusTable;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use reconcile_engine::{OpStatus, Store};

use crate::populator::Problems;
use crate::reconciler::{ImagePresent, PrepullOp, WantedImage};

/// The stores the table reads.
pub struct PrepullStatus<E: Send + Sync + 'static> {
    pub(crate) desired: Store<String, WantedImage>,
    pub(crate) actual: Store<String, ImagePresent>,
    pub(crate) failures: Store<String, OpStatus<PrepullOp, E>>,
    pub(crate) problems: Problems,
    pub(crate) pods: Store<PodUid, DesiredPod>,
}

impl<E: Send + Sync + 'static> std::fmt::Debug for PrepullStatus<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepullStatus").field("images", &self.desired.len()).finish_non_exhaustive()
    }
}

/// The normalized images of a pod's containers (init, regular and ephemeral).
pub(crate) fn pod_images(pod: &DesiredPod) -> Vec<String> {
    let Some(spec) = &pod.pod.spec else { return Vec::new() };
    let init = spec.init_containers.iter().flatten().filter_map(|c| c.image.as_deref());
    let main = spec.containers.iter().filter_map(|c| c.image.as_deref());
    let ephemeral = spec.ephemeral_containers.iter().flatten().filter_map(|c| c.image.as_deref());
    init.chain(main).chain(ephemeral).filter_map(|i| crate::manifest::normalize(i).ok()).collect()
}

impl<E: std::error::Error + Send + Sync + 'static> StatusTable for PrepullStatus<E> {
    fn columns(&self) -> Vec<String> {
        ["Name", "Kind", "Status", "Detail", "Manifests", "Pods"].map(str::to_owned).to_vec()
    }

    fn rows(&self) -> Vec<Vec<String>> {
        let mut used: std::collections::BTreeMap<String, usize> = Default::default();
        self.pods.for_each(|_, pod| {
            let mut images = pod_images(pod);
            images.dedup();
            for image in images {
                *used.entry(image).or_default() += 1;
            }
        });
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut wanted = self.desired.entries();
        wanted.sort_by(|a, b| a.0.cmp(&b.0));
        for (image, want) in wanted {
            let (status, detail) = match (self.actual.get(&image), self.failures.get(&image)) {
                (Some(present), _) => ("Present".to_owned(), present.id.clone()),
                (None, Some(failed)) => {
                    ("PullFailed".to_owned(), format!("{} (failures: {})", failed.error, failed.failures))
                }
                (None, None) => ("Pulling".to_owned(), String::new()),
            };
            let manifests = want.manifests.iter().cloned().collect::<Vec<_>>().join(",");
            let pods = used.get(&image).copied().unwrap_or(0).to_string();
            rows.push(vec![image, "image".into(), status, detail, manifests, pods]);
        }
        let problems = self.problems.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (path, why) in problems.iter() {
            let name = path.display().to_string();
            rows.push(vec![
                name,
                "manifest".into(),
                "Invalid".into(),
                why.clone(),
                String::new(),
                String::new(),
            ]);
        }
        rows
    }
}
