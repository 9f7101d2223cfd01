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

/// How often the node's events are looked at.
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
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(PERIOD) => {}
            }
            self.sync().await;
        }
    }

    async fn sync(&mut self) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut current = HashMap::new();
        let mut writes = 0;
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
            if unchanged || writes >= MAX_WRITES_PER_PASS {
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
                    continue;
                }
            }
            self.posted
                .insert(key, Posted { count: event.count.unwrap_or(1), message: event.message.clone() });
        }
        // Events that are no longer reported (their pod is gone) are forgotten.
        self.posted.retain(|k, _| current.contains_key(k));
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
