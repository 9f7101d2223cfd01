//! RuntimeClass (`node.k8s.io/v1`): which CRI runtime handler runs a pod's sandbox
//! (`spec.runtimeClassName` → the class's `handler`), what the class adds to the pod's resource
//! accounting (`overhead.podFixed`, unless the pod already carries `spec.overhead` from the API
//! server's RuntimeClass admission) and where such pods may run (`scheduling.nodeSelector`).
//!
//! The classes come from wherever the daemon finds them (manifest directory, API server) through
//! [`RuntimeClasses`]; the pod runtime asks at sandbox creation ([`handler_when_listed`], which first
//! waits a little for a source read in the background to have its first list) and admission asks when a
//! pod arrives, so a class created after its pods takes effect at their next sandbox attempt.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::model::pod::DesiredPod;

/// Looks RuntimeClass objects up by name.
pub trait RuntimeClasses: Send + Sync + 'static {
    /// The class named `name`, if it exists.
    fn runtime_class(&self, name: &str) -> Option<RuntimeClass>;

    /// Resolves to `true` once [`runtime_class`](Self::runtime_class) answers from a complete list of the
    /// classes (a source read in the background may start reading only when first asked, and misses
    /// classes until its first list arrived), or to `false` when that can no longer happen. The default is
    /// for sources that are always complete: `true` at once.
    fn listed(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(std::future::ready(true))
    }
}

/// Why a pod's runtime class cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeClassError {
    /// No class of that name exists (the kubelet's words).
    #[error("runtimeclass.node.k8s.io {0:?} not found")]
    NotFound(String),
    /// The pod names a class but the node was given no place to look classes up.
    #[error("runtimeclass.node.k8s.io {0:?}: RuntimeClasses are not available on this node")]
    Unavailable(String),
    /// The classes have not been listed yet (the API server did not answer in time).
    #[error("runtimeclass.node.k8s.io {0:?}: the RuntimeClasses have not been listed yet")]
    NotListed(String),
}

/// The pod's `runtimeClassName`, when set and not empty.
pub fn class_name(pod: &DesiredPod) -> Option<&str> {
    pod.spec().runtime_class_name.as_deref().filter(|n| !n.is_empty())
}

/// The CRI runtime handler for `pod`'s sandbox: `None` for the runtime's default (no class), the
/// class's handler otherwise.
pub fn handler(
    pod: &DesiredPod,
    classes: Option<&dyn RuntimeClasses>,
) -> Result<Option<String>, RuntimeClassError> {
    let Some(name) = class_name(pod) else { return Ok(None) };
    let classes = classes.ok_or_else(|| RuntimeClassError::Unavailable(name.to_owned()))?;
    let class = classes.runtime_class(name).ok_or_else(|| RuntimeClassError::NotFound(name.to_owned()))?;
    Ok(Some(class.handler))
}

/// As [`handler`], after waiting up to `wait` for `classes` to be [listed](RuntimeClasses::listed), so that
/// the first pod naming a class does not fail for a list still on its way; [`RuntimeClassError::NotListed`]
/// when it is not by then. Pods that name no class never wait.
pub async fn handler_when_listed(
    pod: &DesiredPod,
    classes: Option<&dyn RuntimeClasses>,
    wait: Duration,
) -> Result<Option<String>, RuntimeClassError> {
    let (Some(name), Some(lookup)) = (class_name(pod), classes) else { return handler(pod, classes) };
    if !tokio::time::timeout(wait, lookup.listed()).await.unwrap_or(false) {
        return Err(RuntimeClassError::NotListed(name.to_owned()));
    }
    handler(pod, classes)
}

/// What a pod costs beyond its containers: `spec.overhead` when set (the API server put it there),
/// else its class's `overhead.podFixed` (pods from manifests never went through the API server).
pub fn overhead(pod: &DesiredPod, classes: Option<&dyn RuntimeClasses>) -> BTreeMap<String, Quantity> {
    if let Some(overhead) = &pod.spec().overhead {
        return overhead.clone();
    }
    class_name(pod)
        .and_then(|name| classes?.runtime_class(name))
        .and_then(|c| c.overhead)
        .and_then(|o| o.pod_fixed)
        .unwrap_or_default()
}

/// The node labels a pod requires: its `nodeSelector` plus its class's `scheduling.nodeSelector`
/// (as the API server's RuntimeClass admission merges them).
pub fn node_selector(pod: &DesiredPod, classes: Option<&dyn RuntimeClasses>) -> BTreeMap<String, String> {
    let mut selector = pod.spec().node_selector.clone().unwrap_or_default();
    let from_class = class_name(pod)
        .and_then(|name| classes?.runtime_class(name))
        .and_then(|c| c.scheduling)
        .and_then(|s| s.node_selector)
        .unwrap_or_default();
    for (key, value) in from_class {
        selector.entry(key).or_insert(value);
    }
    selector
}

/// The tolerations a pod has: its own plus its class's `scheduling.tolerations` (as the API
/// server's RuntimeClass admission merges them).
pub fn tolerations(
    pod: &DesiredPod,
    classes: Option<&dyn RuntimeClasses>,
) -> Vec<k8s_openapi::api::core::v1::Toleration> {
    let mut all = pod.spec().tolerations.clone().unwrap_or_default();
    let from_class = class_name(pod)
        .and_then(|name| classes?.runtime_class(name))
        .and_then(|c| c.scheduling)
        .and_then(|s| s.tolerations)
        .unwrap_or_default();
    all.extend(from_class);
    all
}

/// Whether `toleration` tolerates `taint` (the API's `ToleratesTaint`).
pub fn tolerates(
    toleration: &k8s_openapi::api::core::v1::Toleration,
    taint: &k8s_openapi::api::core::v1::Taint,
) -> bool {
    if toleration.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref() {
        Some("Exists") => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pod::PodSource;
    use std::collections::HashMap;

    struct Classes(HashMap<String, RuntimeClass>);

    impl RuntimeClasses for Classes {
        fn runtime_class(&self, name: &str) -> Option<RuntimeClass> {
            self.0.get(name).cloned()
        }
    }

    fn pod(spec: serde_json::Value) -> DesiredPod {
        let pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("test pod");
        DesiredPod { pod, source: PodSource::Http }
    }

    fn classes() -> Classes {
        let class: RuntimeClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sandboxed"}, "handler": "runsc",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "64Mi"}},
            "scheduling": {"nodeSelector": {"sandbox": "yes", "zone": "class"}}}))
        .expect("test class");
        Classes(HashMap::from([("sandboxed".to_owned(), class)]))
    }

    #[test]
    fn handlers_come_from_the_class() {
        let c = classes();
        let plain = pod(serde_json::json!({"containers": []}));
        assert_eq!(handler(&plain, None), Ok(None));
        let named = pod(serde_json::json!({"runtimeClassName": "sandboxed", "containers": []}));
        assert_eq!(handler(&named, Some(&c)), Ok(Some("runsc".to_owned())));
        let unknown = pod(serde_json::json!({"runtimeClassName": "nope", "containers": []}));
        let err = handler(&unknown, Some(&c)).expect_err("unknown class");
        assert_eq!(err.to_string(), "runtimeclass.node.k8s.io \"nope\" not found");
        assert!(matches!(handler(&named, None), Err(RuntimeClassError::Unavailable(_))));
    }

    /// Classes that are listed only once `release` is sent `true` (or never, when it is dropped).
    struct Late(Classes, tokio::sync::watch::Receiver<bool>);

    impl RuntimeClasses for Late {
        fn runtime_class(&self, name: &str) -> Option<RuntimeClass> {
            self.0.runtime_class(name)
        }

        fn listed(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
            let mut listed = self.1.clone();
            Box::pin(async move { listed.wait_for(|l| *l).await.is_ok() })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_sandbox_handler_waits_for_the_first_list_and_only_for_pods_naming_a_class() {
        let wait = Duration::from_secs(5);
        let (release, listed) = tokio::sync::watch::channel(false);
        let late = Late(classes(), listed);
        let named = pod(serde_json::json!({"runtimeClassName": "sandboxed", "containers": []}));
        let plain = pod(serde_json::json!({"containers": []}));

        // no class named: no wait, whatever the lookup's state
        let start = tokio::time::Instant::now();
        assert_eq!(handler_when_listed(&plain, Some(&late), wait).await, Ok(None));
        assert_eq!(start.elapsed(), Duration::ZERO);

        // the list arrives 2 s in: the handler then
        let answer = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            release.send_replace(true);
        };
        let (handler, ()) = tokio::join!(handler_when_listed(&named, Some(&late), wait), answer);
        assert_eq!(handler, Ok(Some("runsc".to_owned())));
        assert_eq!(start.elapsed(), Duration::from_secs(2));

        // never listed: NotListed after the wait, not NotFound
        let (release, listed) = tokio::sync::watch::channel(false);
        let never = Late(classes(), listed);
        let start = tokio::time::Instant::now();
        let err = handler_when_listed(&named, Some(&never), wait).await.expect_err("not listed");
        assert_eq!(err, RuntimeClassError::NotListed("sandboxed".to_owned()));
        assert_eq!(start.elapsed(), wait);
        drop(release);
        // a source that can no longer list says so at once
        let err = handler_when_listed(&named, Some(&never), wait).await.expect_err("not listed");
        assert!(err.to_string().contains("have not been listed yet"), "{err}");
        assert_eq!(start.elapsed(), wait);

        // always-complete sources (the default) answer at once, found or not
        let unknown = pod(serde_json::json!({"runtimeClassName": "nope", "containers": []}));
        let c = classes();
        assert_eq!(handler_when_listed(&named, Some(&c), wait).await, Ok(Some("runsc".to_owned())));
        let err = handler_when_listed(&unknown, Some(&c), wait).await.expect_err("unknown");
        assert_eq!(err, RuntimeClassError::NotFound("nope".to_owned()));
        assert_eq!(start.elapsed(), wait);
    }

    #[test]
    fn overhead_and_selector_merge_as_the_api_server_does() {
        let c = classes();
        let named = pod(
            serde_json::json!({"runtimeClassName": "sandboxed", "nodeSelector": {"zone": "pod"}, "containers": []}),
        );
        assert_eq!(overhead(&named, Some(&c)).get("cpu").map(|q| q.0.as_str()), Some("250m"));
        let selector = node_selector(&named, Some(&c));
        assert_eq!(selector.get("zone").map(String::as_str), Some("pod"), "the pod's own value stays");
        assert_eq!(selector.get("sandbox").map(String::as_str), Some("yes"));
        let api = pod(
            serde_json::json!({"runtimeClassName": "sandboxed", "overhead": {"cpu": "1"}, "containers": []}),
        );
        assert_eq!(
            overhead(&api, Some(&c)).get("cpu").map(|q| q.0.as_str()),
            Some("1"),
            "spec.overhead wins"
        );
        assert!(!overhead(&api, Some(&c)).contains_key("memory"));
    }
}
