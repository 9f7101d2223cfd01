//! The `/pods` body written from borrowed pods: each pod's metadata and spec are serialised where
//! they are kept, with the status (and, for a static pod, the creation time) the node gives it, instead
//! of copying every pod into a `PodList` first. The JSON is that of `k8s_openapi::List<Pod>`.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};

/// One pod of the list: the pod as kept, and what the node adds to it.
#[derive(Debug)]
pub struct PodEntry<'a> {
    /// The pod as the node keeps it (its status, if any, is replaced by `status`).
    pub pod: &'a Pod,
    /// `metadata.creationTimestamp` to show when the pod has none.
    pub created: Option<Time>,
    /// The pod's status.
    pub status: PodStatus,
}

/// The metadata with a creation time filled in.
struct Metadata<'a> {
    meta: &'a ObjectMeta,
    created: Option<&'a Time>,
}

impl Serialize for Metadata<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.created.filter(|_| self.meta.creation_timestamp.is_none()) {
            None => self.meta.serialize(serializer),
            Some(created) => {
                #[derive(Serialize)]
                struct WithCreated<'a> {
                    #[serde(flatten)]
                    meta: &'a ObjectMeta,
                    #[serde(rename = "creationTimestamp")]
                    created: &'a Time,
                }
                WithCreated { meta: self.meta, created }.serialize(serializer)
            }
        }
    }
}

impl Serialize for PodEntry<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let spec = self.pod.spec.as_ref();
        let mut out = serializer.serialize_struct("Pod", 4 + usize::from(spec.is_some()))?;
        out.serialize_field("apiVersion", "v1")?;
        out.serialize_field("kind", "Pod")?;
        out.serialize_field(
            "metadata",
            &Metadata { meta: &self.pod.metadata, created: self.created.as_ref() },
        )?;
        if let Some(spec) = spec {
            out.serialize_field("spec", spec)?;
        }
        out.serialize_field("status", &self.status)?;
        out.end()
    }
}

/// Sorts `entries` as `/pods` lists them: by namespace, then name.
pub fn sort(entries: &mut [PodEntry<'_>]) {
    entries.sort_by(|a, b| {
        let (a, b) = (&a.pod.metadata, &b.pod.metadata);
        (a.namespace.as_deref(), a.name.as_deref()).cmp(&(b.namespace.as_deref(), b.name.as_deref()))
    });
}

/// The `/pods` body: a v1 `PodList` of `entries`, sorted by namespace and name.
pub fn encode(mut entries: Vec<PodEntry<'_>>) -> serde_json::Result<Vec<u8>> {
    sort(&mut entries);
    #[derive(Serialize)]
    struct ListMeta {}
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct PodList<'a> {
        api_version: &'static str,
        kind: &'static str,
        metadata: ListMeta,
        items: &'a [PodEntry<'a>],
    }
    serde_json::to_vec(&PodList {
        api_version: "v1",
        kind: "PodList",
        metadata: ListMeta {},
        items: &entries,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::List;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    fn pod(namespace: &str, name: &str, created: Option<Time>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: created,
                annotations: Some([("kubernetes.io/config.seen".to_owned(), "x".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus { phase: Some("Stale".into()), ..PodStatus::default() }),
        }
    }

    fn time(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("a valid time"))
    }

    #[test]
    fn the_body_is_the_pod_list_the_copies_would_make() {
        let kept = [pod("b", "web", None), pod("a", "db", Some(time(1_000))), pod("a", "cache", None)];
        let status =
            |name: &str| PodStatus { phase: Some(format!("Running-{name}")), ..PodStatus::default() };
        let entries: Vec<PodEntry<'_>> = kept
            .iter()
            .map(|p| PodEntry {
                pod: p,
                created: Some(time(2_000)),
                status: status(p.metadata.name.as_deref().unwrap_or_default()),
            })
            .collect();
        let body: serde_json::Value =
            serde_json::from_slice(&encode(entries).expect("encodes")).expect("JSON");

        // The same list built by copying each pod, as `NodeView::pods` does.
        let mut items: Vec<Pod> = kept
            .iter()
            .map(|p| {
                let mut copy = p.clone();
                if copy.metadata.creation_timestamp.is_none() {
                    copy.metadata.creation_timestamp = Some(time(2_000));
                }
                copy.status = Some(status(p.metadata.name.as_deref().unwrap_or_default()));
                copy
            })
            .collect();
        items.sort_by(|a, b| {
            (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
                .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
        });
        let expected = serde_json::to_value(List { items, ..List::default() }).expect("JSON");
        assert_eq!(body, expected);
        let names: Vec<&str> = body["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["cache", "db", "web"]);
        assert_eq!(
            body["items"][1]["metadata"]["creationTimestamp"], "1970-01-01T00:16:40Z",
            "a time it has stays"
        );
    }

    #[test]
    fn a_pod_without_a_spec_or_a_creation_time_to_add_is_written_as_is() {
        let mut bare = pod("a", "bare", None);
        bare.spec = None;
        let body = encode(vec![PodEntry { pod: &bare, created: None, status: PodStatus::default() }])
            .expect("encodes");
        let list: List<Pod> = serde_json::from_slice(&body).expect("a PodList");
        assert_eq!(list.items.len(), 1);
        assert_eq!(list.items[0].spec, None);
        assert_eq!(list.items[0].metadata.creation_timestamp, None);
        assert_eq!(list.items[0].metadata.uid.as_deref(), Some("uid-bare"));
    }
}
