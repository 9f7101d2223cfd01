//! The cluster's RuntimeClass objects (`node.k8s.io/v1`, cluster-scoped, few), kept in memory by a
//! kube-runtime reflector over the API server (the Node authorizer lets a node list and watch them),
//! for the pod runtime (sandbox handlers) and admission (overhead, node selectors).

use futures::StreamExt as _;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// The RuntimeClasses the API server has; empty until the first list arrived. Cheap to clone.
#[derive(Clone)]
pub struct ApiRuntimeClasses {
    store: reflector::Store<RuntimeClass>,
}

/// Fills an [`ApiRuntimeClasses`]: run it with its `run`.
pub struct RuntimeClassFeed {
    writer: reflector::store::Writer<RuntimeClass>,
}

impl std::fmt::Debug for ApiRuntimeClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRuntimeClasses").field("classes", &self.store.state().len()).finish()
    }
}

impl std::fmt::Debug for RuntimeClassFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeClassFeed").finish_non_exhaustive()
    }
}

/// An empty set of classes and the feed that fills it.
pub fn runtime_classes() -> (ApiRuntimeClasses, RuntimeClassFeed) {
    let (store, writer) = reflector::store();
    (ApiRuntimeClasses { store }, RuntimeClassFeed { writer })
}

impl ApiRuntimeClasses {
    /// The class named `name`, if the API server has it.
    pub fn get(&self, name: &str) -> Option<RuntimeClass> {
        self.store.get(&reflector::ObjectRef::new(name)).map(|c| (*c).clone())
    }
}

impl RuntimeClassFeed {
    /// Lists and watches RuntimeClasses until `shutdown` (re-listing with back-off after errors).
    pub(crate) async fn run(self, client: Client, shutdown: CancellationToken) {
        let api: Api<RuntimeClass> = Api::all(client);
        let stream = reflector::reflector(self.writer, watcher::watcher(api, super::watch_config()))
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                item = stream.next() => match item {
                    None => return,
                    Some(Ok(class)) => tracing::debug!(class = ?class.metadata.name, handler = %class.handler, "RuntimeClass"),
                    Some(Err(e)) => tracing::warn!(error = %e, "watching RuntimeClasses failed; retrying"),
                },
            }
        }
    }
}
