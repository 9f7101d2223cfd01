//! The cluster's RuntimeClass objects (`node.k8s.io/v1`, cluster-scoped, few), kept in memory by a
//! kube-runtime reflector over the API server (the Node authorizer lets a node list and watch them),
//! for the pod runtime (sandbox handlers) and admission (overhead, node selectors).
//!
//! The list and watch start only when a lookup first names a class (a pod with a `runtimeClassName`),
//! not at start-up as the kubelet's informer does: most nodes never run such a pod, and a watch held by
//! every node is one of the few things each node costs the API server. Until the first list arrived,
//! lookups find nothing and [`ApiRuntimeClasses::wait_listed`] is pending (the node's lookup waits on
//! it before a sandbox names a class); once started, the watch stays.

use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The RuntimeClasses the API server has; empty until the first list arrived, which is asked for at the
/// first lookup. Cheap to clone.
#[derive(Clone)]
pub struct ApiRuntimeClasses {
    store: reflector::Store<RuntimeClass>,
    /// Set at the first lookup: the feed starts then.
    wanted: Arc<watch::Sender<bool>>,
    /// Set by the feed once the first list arrived.
    listed: watch::Receiver<bool>,
}

/// Fills an [`ApiRuntimeClasses`]: run it with its `run`.
pub struct RuntimeClassFeed {
    writer: reflector::store::Writer<RuntimeClass>,
    wanted: watch::Receiver<bool>,
    listed: watch::Sender<bool>,
}

impl std::fmt::Debug for ApiRuntimeClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRuntimeClasses")
            .field("wanted", &*self.wanted.borrow())
            .field("listed", &*self.listed.borrow())
            .field("classes", &self.store.state().len())
            .finish()
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
    let (wanted_tx, wanted_rx) = watch::channel(false);
    let (listed_tx, listed_rx) = watch::channel(false);
    (
        ApiRuntimeClasses { store, wanted: Arc::new(wanted_tx), listed: listed_rx },
        RuntimeClassFeed { writer, wanted: wanted_rx, listed: listed_tx },
    )
}

impl ApiRuntimeClasses {
    /// The class named `name`, if the API server has it (as far as the list and watch have told);
    /// starts the feed if this is the first lookup.
    pub fn get(&self, name: &str) -> Option<RuntimeClass> {
        self.want();
        self.store.get(&reflector::ObjectRef::new(name)).map(|c| (*c).clone())
    }

    /// Waits until the first list arrived (starting the feed if needed); `false` when the feed is gone.
    pub async fn wait_listed(&self) -> bool {
        self.want();
        self.listed.clone().wait_for(|listed| *listed).await.is_ok()
    }

    fn want(&self) {
        self.wanted.send_if_modified(|wanted| !std::mem::replace(wanted, true));
    }
}

impl RuntimeClassFeed {
    /// Waits for the first lookup, then lists and watches RuntimeClasses until `shutdown` (re-listing with
    /// back-off after errors).
    pub(crate) async fn run(self, client: Client, shutdown: CancellationToken) {
        let Self { writer, mut wanted, listed } = self;
        tokio::select! {
            () = shutdown.cancelled() => return,
            asked = wanted.wait_for(|wanted| *wanted) => if asked.is_err() { return },
        }
        tracing::info!("a pod names a RuntimeClass: listing and watching RuntimeClasses");
        let api: Api<RuntimeClass> = Api::all(client);
        let stream =
            reflector::reflector(writer, watcher::watcher(api, super::watch_config())).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                item = stream.next() => match item {
                    None => return,
                    Some(Ok(Event::InitDone)) => {
                        if !listed.send_replace(true) {
                            tracing::debug!("RuntimeClasses listed");
                        }
                    }
                    Some(Ok(Event::Apply(class) | Event::InitApply(class))) => {
                        tracing::debug!(class = ?class.metadata.name, handler = %class.handler, "RuntimeClass");
                    }
                    Some(Ok(Event::Delete(_) | Event::Init)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "watching RuntimeClasses failed; retrying"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An API server with one RuntimeClass `fast` (handler `runc`): answers the list, and holds a watch
    /// open without events. Returns the requests' paths and queries.
    fn class_server() -> (Client, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let requests = seen.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let requests = requests.clone();
            async move {
                let uri = req.uri().to_string();
                requests.lock().expect("lock").push(uri.clone());
                assert!(uri.starts_with("/apis/node.k8s.io/v1/runtimeclasses?"), "{uri}");
                if uri.contains("watch=true") {
                    std::future::pending::<()>().await;
                }
                let body = r#"{"apiVersion":"node.k8s.io/v1","kind":"RuntimeClassList",
                    "metadata":{"resourceVersion":"5"},
                    "items":[{"metadata":{"name":"fast","resourceVersion":"4"},"handler":"runc"}]}"#;
                crate::test_support::json_response(200, body)
            }
        });
        (Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn the_classes_are_listed_and_watched_only_once_a_lookup_names_one() {
        let (client, requests) = class_server();
        let (classes, feed) = runtime_classes();
        let shutdown = CancellationToken::new();
        let feed = tokio::spawn(feed.run(client, shutdown.clone()));
        // no lookup: the API server hears nothing
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(requests.lock().expect("lock").is_empty(), "{:?}", requests.lock().expect("lock"));
        assert!(!*classes.listed.borrow());

        // the first lookup misses (nothing listed yet) and starts the feed; the wait ends with the list
        assert!(classes.get("fast").is_none());
        let listed = tokio::time::timeout(std::time::Duration::from_secs(10), classes.wait_listed()).await;
        assert_eq!(listed.ok(), Some(true));
        assert_eq!(classes.get("fast").map(|c| c.handler).as_deref(), Some("runc"));
        assert!(classes.get("slow").is_none());
        // one list, then one watch from its resourceVersion, and nothing more
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        let requests = requests.lock().expect("lock").clone();
        assert_eq!(requests.len(), 2, "{requests:?}");
        assert!(!requests[0].contains("watch=true") && requests[1].contains("watch=true"), "{requests:?}");
        assert!(requests[1].contains("resourceVersion=5"), "{requests:?}");
        shutdown.cancel();
        feed.await.expect("feed");
    }

    #[tokio::test]
    async fn a_feed_that_is_gone_ends_the_wait_with_false() {
        let (classes, feed) = runtime_classes();
        drop(feed);
        assert!(!classes.wait_listed().await);
    }
}
