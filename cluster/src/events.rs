//! Events to the API server: what the node view reports (`/api/v1/events` locally) posted as
//! `v1` Events, with the kubelet's reasons.
//!
//! The node's events are already aggregated: one entry per (object, reason, container) with a
//! count, so a crash loop is one `BackOff` event whose count grows, not a flood. The sink keeps what
//! it posted: a new entry is created, a changed count or message is patched (count, message,
//! `lastTimestamp`), an unchanged one costs nothing. Writes are bounded to 100 per 2-second pass
//! (50 per second, the kubelet's default `eventRecordQPS`), on top of the client's own rate limit;
//! what does not fit waits for the next pass. An event the
//! API refuses for good (its namespace is gone, forbidden) is dropped with one log line.
//!
//! The sink looks every 2 seconds, but reads the events only when they may have changed: it keeps
//! the view's [`events_generation`](NodeView::events_generation) from before its last reading and
//! passes again when that number moved, or when the last pass left work undone (writes over the
//! bound, a write that failed and is tried again). While nothing changes, a look is a few atomic
//! loads: no event is built, hashed or compared. A view without a generation (`None`) is read on
//! every look.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use super::is_status;
use crate::server::NodeView;

/// How often the sink looks whether the node's events may have changed (at most one pass each).
const PERIOD: Duration = Duration::from_secs(2);
/// The most writes per pass (the rest waits for the next one): 50 per second.
const MAX_WRITES_PER_PASS: usize = 100;

/// What was posted for one event.
#[derive(Debug, Clone)]
struct Posted {
    count: i32,
    message: Option<String>,
}

/// Posts the node's events; see the [module docs](self).
pub(crate) struct EventSink<V> {
    client: kube::Client,
    view: Arc<V>,
    node: String,
    posted: HashMap<(String, String), Posted>,
}

impl<V> std::fmt::Debug for EventSink<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").field("posted", &self.posted.len()).finish_non_exhaustive()
    }
}

impl<V: NodeView> EventSink<V> {
    /// Posts `view`'s events as node `node`.
    pub(crate) fn new(client: kube::Client, view: Arc<V>, node: String) -> Self {
        Self { client, view, node, posted: HashMap::new() }
    }

    /// Posts until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        // The generation taken before the last reading of the events; `None` before the first.
        let mut read: Option<u64> = None;
        let mut undone = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(PERIOD) => {}
            }
            // Taken before the events are read: a change that lands while the pass runs moves it
            // again, and the next look sees that.
            let generation = self.view.events_generation();
            if !undone && generation.is_some() && generation == read {
                continue;
            }
            read = generation;
            // Boxed: a pass's state (the events' requests) is held only while it runs.
            undone = Box::pin(self.sync()).await;
        }
    }

    /// One pass over the view's events; returns whether it left work undone (an event over the
    /// pass's write bound, or one whose write failed and is to be tried again).
    async fn sync(&mut self) -> bool {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut current = HashMap::new();
        let mut writes = 0;
        let mut undone = false;
        for event in self.view.events().items {
            let (key, event) = self.prepare(event, &now);
            // Two entries for the same object, reason and container (e.g. `Killing` after a failed
            // probe and for a deletion): the first one stands for both.
            if current.insert(key.clone(), ()).is_some() {
                continue;
            }
            let posted = self.posted.get(&key).cloned();
            let unchanged = posted
                .as_ref()
                .is_some_and(|p| p.count >= event.count.unwrap_or(1) && p.message == event.message);
            if unchanged {
                continue;
            }
            if writes >= MAX_WRITES_PER_PASS {
                undone = true;
                continue;
            }
            writes += 1;
            let result = match posted {
                None => self.create(&key, &event).await,
                Some(_) => self.update(&key, &event).await,
            };
            match result {
                Ok(()) => {}
                // Refused for good: remember it as posted so it is not tried again.
                Err(e) if is_status(&e, 403) || is_status(&e, 404) || is_status(&e, 422) => {
                    tracing::debug!(event = %key.1, error = %e, "the API server refused an event");
                }
                Err(e) => {
                    tracing::debug!(event = %key.1, error = %e, "posting an event failed; trying again later");
                    undone = true;
                    continue;
                }
            }
            self.posted
                .insert(key, Posted { count: event.count.unwrap_or(1), message: event.message.clone() });
        }
        // Events that are no longer reported (their pod is gone) are forgotten.
        self.posted.retain(|k, _| current.contains_key(k));
        tracing::trace!(events = current.len(), writes, undone, "read the node's events");
        undone
    }

    /// The event as posted, and its key (namespace, name): the name is the object's plus a hash
    /// of what identifies the event (object UID, reason, field path).
    fn prepare(&self, mut event: Event, now: &Time) -> ((String, String), Event) {
        let object = &event.involved_object;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&object.kind, &object.uid, &object.name, &object.field_path, &event.reason).hash(&mut hasher);
        let namespace = event.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let name = format!("{}.{:016x}", object.name.as_deref().unwrap_or("node"), hasher.finish());
        event.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        };
        if event.involved_object.kind.as_deref() == Some("Node") {
            event.involved_object.uid = Some(self.node.clone());
        }
        event.first_timestamp = event.first_timestamp.or_else(|| Some(now.clone()));
        event.last_timestamp = event.last_timestamp.or_else(|| Some(now.clone()));
        ((namespace, name), event)
    }

    async fn create(&self, key: &(String, String), event: &Event) -> Result<(), kube::Error> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.0);
        match api.create(&PostParams::default(), event).await {
            Ok(_) => Ok(()),
            // Posted before (by an earlier run of nodelet): update it instead.
            Err(e) if is_status(&e, 409) => self.update(key, event).await,
            Err(e) => Err(e),
        }
    }

    async fn update(&self, key: &(String, String), event: &Event) -> Result<(), kube::Error> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.0);
        let patch = serde_json::json!({
            "count": event.count,
            "message": event.message,
            "lastTimestamp": event.last_timestamp,
        });
        api.patch(&key.1, &PatchParams::default(), &Patch::Merge(patch)).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::{ObjectReference, Pod};

    use super::*;

    /// A view whose events are set by the test, with a generation the test moves; counts the
    /// readings of its events.
    #[derive(Default)]
    struct View {
        events: Mutex<Vec<Event>>,
        generation: AtomicU64,
        reads: AtomicUsize,
    }

    impl View {
        /// Sets the events and moves the generation, as a change of the node's state does.
        fn set(&self, events: Vec<Event>) {
            *self.events.lock().expect("lock") = events;
            self.generation.fetch_add(1, Ordering::Release);
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    impl NodeView for View {
        fn pods(&self) -> k8s_openapi::List<Pod> {
            k8s_openapi::List::default()
        }
        fn metrics(&self) -> String {
            String::new()
        }
        fn healthy(&self) -> Result<(), crate::server::Unhealthy> {
            Ok(())
        }
        fn container_log(&self, _: &str, _: &str, _: &str) -> Option<PathBuf> {
            None
        }
        fn events(&self) -> k8s_openapi::List<Event> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            k8s_openapi::List { items: self.events.lock().expect("lock").clone(), ..Default::default() }
        }
        fn events_generation(&self) -> Option<u64> {
            Some(self.generation.load(Ordering::Acquire))
        }
    }

    /// A `BackOff` event of pod `pod` with `count`.
    fn event(pod: &str, count: i32) -> Event {
        Event {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some("default".to_owned()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".to_owned()),
                name: Some(pod.to_owned()),
                uid: Some(format!("uid-{pod}")),
                ..Default::default()
            },
            reason: Some("BackOff".to_owned()),
            message: Some(format!("Back-off restarting failed container in pod {pod}")),
            count: Some(count),
            ..Default::default()
        }
    }

    /// An API server that fails the first `failures` requests (500) and accepts the others;
    /// returns its client and the methods of the requests it got, in order.
    fn api(failures: usize) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let n = {
                let mut seen = seen.lock().expect("lock");
                seen.push(req.method().to_string());
                seen.len()
            };
            async move {
                let (code, body) = if n <= failures {
                    (
                        500,
                        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                            "message":"etcd is down","reason":"InternalError","code":500}"#,
                    )
                } else {
                    (201, r#"{"kind":"Event","apiVersion":"v1","metadata":{"name":"e"},"involvedObject":{}}"#)
                };
                crate::test_support::json_response(code, body)
            }
        });
        (kube::Client::new(service, "default"), requests)
    }

    fn methods(requests: &Mutex<Vec<String>>) -> Vec<String> {
        requests.lock().expect("lock").clone()
    }

    /// Sleeps past the sink's next look (paused time: the sink's pass runs to its end meanwhile).
    async fn look() {
        tokio::time::sleep(PERIOD).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_events_are_read_only_after_a_change_or_while_a_write_is_to_be_retried() {
        let view = Arc::new(View::default());
        view.set(vec![event("web", 1)]);
        let (client, requests) = api(1);
        let shutdown = CancellationToken::new();
        let sink = EventSink::new(client, view.clone(), "node".to_owned());
        let task = tokio::spawn(sink.run(shutdown.clone()));
        // Half a period off the sink's looks, so that each `look` sees exactly one.
        tokio::time::sleep(PERIOD / 2).await;

        look().await;
        assert_eq!(view.reads(), 1, "the first look reads the events");
        assert_eq!(methods(&requests), ["POST"], "and posts the new one, which fails");
        look().await;
        assert_eq!(view.reads(), 2, "the failed write is tried again with nothing changed");
        assert_eq!(methods(&requests), ["POST", "POST"]);

        for _ in 0..10 {
            look().await;
        }
        assert_eq!(view.reads(), 2, "nothing changed, nothing undone: the events are not read");
        assert_eq!(methods(&requests).len(), 2);

        // The crash loop goes on: its count grows, and the change is patched at the next look.
        view.set(vec![event("web", 2)]);
        look().await;
        assert_eq!(view.reads(), 3, "one pass after a change");
        assert_eq!(methods(&requests), ["POST", "POST", "PATCH"]);
        for _ in 0..5 {
            look().await;
        }
        assert_eq!(view.reads(), 3, "and none after it");
        assert_eq!(methods(&requests).len(), 3);

        // A burst of changes within one period is one pass.
        view.set(vec![event("web", 3)]);
        view.set(vec![event("web", 4)]);
        look().await;
        assert_eq!(view.reads(), 4);
        assert_eq!(methods(&requests), ["POST", "POST", "PATCH", "PATCH"]);

        shutdown.cancel();
        task.await.expect("the sink ends");
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_pass_could_not_write_is_written_by_the_next_one() {
        let view = Arc::new(View::default());
        let events: Vec<Event> = (0..=MAX_WRITES_PER_PASS).map(|i| event(&format!("pod{i}"), 1)).collect();
        view.set(events);
        let (client, requests) = api(0);
        let shutdown = CancellationToken::new();
        let task =
            tokio::spawn(EventSink::new(client, view.clone(), "node".to_owned()).run(shutdown.clone()));
        tokio::time::sleep(PERIOD / 2).await;

        look().await;
        assert_eq!(methods(&requests).len(), MAX_WRITES_PER_PASS, "the first pass writes up to the bound");
        look().await;
        assert_eq!(view.reads(), 2, "the rest is written at the next look, with nothing changed");
        assert_eq!(methods(&requests).len(), MAX_WRITES_PER_PASS + 1);
        for _ in 0..5 {
            look().await;
        }
        assert_eq!(view.reads(), 2, "then nothing is left to do");
        assert_eq!(methods(&requests).len(), MAX_WRITES_PER_PASS + 1);

        shutdown.cancel();
        task.await.expect("the sink ends");
    }

    /// A view without a generation keeps the sink reading on every look.
    #[tokio::test(start_paused = true)]
    async fn a_view_without_a_generation_is_read_on_every_look() {
        struct Unknown(View);
        impl NodeView for Unknown {
            fn pods(&self) -> k8s_openapi::List<Pod> {
                self.0.pods()
            }
            fn metrics(&self) -> String {
                String::new()
            }
            fn healthy(&self) -> Result<(), crate::server::Unhealthy> {
                Ok(())
            }
            fn container_log(&self, _: &str, _: &str, _: &str) -> Option<PathBuf> {
                None
            }
            fn events(&self) -> k8s_openapi::List<Event> {
                self.0.events()
            }
        }
        let view = Arc::new(Unknown(View::default()));
        view.0.set(vec![event("web", 1)]);
        let (client, requests) = api(0);
        let shutdown = CancellationToken::new();
        let task =
            tokio::spawn(EventSink::new(client, view.clone(), "node".to_owned()).run(shutdown.clone()));
        tokio::time::sleep(PERIOD / 2).await;
        for _ in 0..5 {
            look().await;
        }
        assert_eq!(view.0.reads(), 5);
        assert_eq!(methods(&requests), ["POST"], "an unchanged event is not written again");
        shutdown.cancel();
        task.await.expect("the sink ends");
    }
}
