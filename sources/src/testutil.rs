//! Helpers for the sources' tests.

use std::time::Duration;

use nodelet_resources::model::pod::{DesiredPod, PodSource, PodUid};
use nodelet_resources::pod::validation;
use reconcile_engine::Store;

/// The node the tests run pods for.
pub(crate) const NODE: &str = "Node-A";

/// A minimal pod manifest in YAML.
pub(crate) fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    )
}

/// A prepared pod named `name` from `source`.
pub(crate) fn desired(name: &str, image: &str, source: PodSource) -> DesiredPod {
    let value: serde_json::Value =
        nodelet_shared::yaml::from_str(&pod_yaml(name, image)).expect("test manifest parses");
    validation::prepare_value(value, source, NODE).expect("test manifest is valid")
}

/// The sorted names of the pods in `store`.
pub(crate) fn names(store: &Store<PodUid, DesiredPod>) -> Vec<String> {
    let mut names: Vec<String> = store.entries().iter().map(|(_, pod)| pod.name().to_owned()).collect();
    names.sort();
    names
}

/// The pod named `name` in `store`, if any.
pub(crate) fn by_name(store: &Store<PodUid, DesiredPod>, name: &str) -> Option<DesiredPod> {
    store.entries().into_iter().find(|(_, pod)| pod.name() == name).map(|(_, pod)| (*pod).clone())
}

/// Polls `check` every 10 ms until it returns `Some`, for at most `within`; panics naming `what`
/// otherwise. Returns the value and how long it took.
pub(crate) async fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(value) = check() {
            return (value, start.elapsed());
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
