//! Lean listings: `ListPodSandbox` and `ListContainers` decoded into [`ListedSandbox`] and
//! [`ListedContainer`], which keep only the fields nodelet reads from a listing, with the label and
//! annotation maps as their entries in wire order ([`Entry`], looked up through
//! [`labels::Lookup`](crate::labels::Lookup)) instead of hash maps.
//!
//! A relist decodes every sandbox and container of the node. With the full CRI types that meant a
//! hash map per label and annotation map and a copy of every field nodelet never reads (the image
//! spec's own maps, `image_id`), and freeing it all again: at 250 pods about a millisecond of a 4–5 ms
//! listing on top of the runtime's answer (docs/benchmarks.md). The wire format is the same: a protobuf map is a
//! repeated message of `key = 1` and `value = 2`, and fields a message does not declare are skipped
//! by the decoder. Strings are still checked to be UTF-8 while decoding.

use std::future::Future;

use k8s_cri::v1;
use tonic::codegen::http::uri::PathAndQuery;

use crate::client::CriClient;
use crate::error::Result;
use crate::filter::{ContainerFilter, SandboxFilter};
use crate::labels::Lookup;

/// One entry of a label or annotation map, as a protobuf map puts it on the wire.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Entry {
    /// The label's or annotation's key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

impl Entry {
    /// The entries of a map (owned or borrowed), in its iteration order.
    pub fn list<K: Into<String>, V: Into<String>>(map: impl IntoIterator<Item = (K, V)>) -> Vec<Entry> {
        map.into_iter().map(|(key, value)| Entry { key: key.into(), value: value.into() }).collect()
    }
}

impl Lookup for [Entry] {
    /// The value of the last entry with `key`: a protobuf map keeps the last of repeated keys.
    fn value(&self, key: &str) -> Option<&str> {
        self.iter().rev().find(|e| e.key == key).map(|e| e.value.as_str())
    }
}

impl Lookup for Vec<Entry> {
    fn value(&self, key: &str) -> Option<&str> {
        self.as_slice().value(key)
    }
}

/// A sandbox as `ListPodSandbox` lists it (every field of the CRI's `PodSandbox`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedSandbox {
    /// The sandbox's ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The metadata it was created with.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<v1::PodSandboxMetadata>,
    /// Its state (`v1::PodSandboxState`).
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Its creation time, in nanoseconds since the epoch.
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    /// Its labels.
    #[prost(message, repeated, tag = "5")]
    pub labels: Vec<Entry>,
    /// Its annotations.
    #[prost(message, repeated, tag = "6")]
    pub annotations: Vec<Entry>,
    /// The runtime handler it runs with.
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
}

/// The image of a listed container: the CRI's `ImageSpec` without its annotations and handler.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListedImage {
    /// The image as the runtime names it (containerd: its ID).
    #[prost(string, tag = "1")]
    pub image: String,
}

/// A container as `ListContainers` lists it: the CRI's `Container` without `image_id` and the image
/// spec's annotations and handler.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedContainer {
    /// The container's ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The ID of its sandbox.
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    /// The metadata it was created with.
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<v1::ContainerMetadata>,
    /// Its image.
    #[prost(message, optional, tag = "4")]
    pub image: Option<ListedImage>,
    /// The image's reference (containerd: its ID).
    #[prost(string, tag = "5")]
    pub image_ref: String,
    /// Its state (`v1::ContainerState`).
    #[prost(int32, tag = "6")]
    pub state: i32,
    /// Its creation time, in nanoseconds since the epoch.
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    /// Its labels.
    #[prost(message, repeated, tag = "8")]
    pub labels: Vec<Entry>,
    /// Its annotations.
    #[prost(message, repeated, tag = "9")]
    pub annotations: Vec<Entry>,
}

impl ListedSandbox {
    /// A sandbox's status as its listing shows it.
    pub fn from_status(status: v1::PodSandboxStatus) -> Self {
        ListedSandbox {
            id: status.id,
            metadata: status.metadata,
            state: status.state,
            created_at: status.created_at,
            labels: Entry::list(status.labels),
            annotations: Entry::list(status.annotations),
            runtime_handler: status.runtime_handler,
        }
    }
}

impl ListedContainer {
    /// A container's status as its listing shows it; the status does not name the sandbox, so the
    /// caller does.
    pub fn from_status(status: &v1::ContainerStatus, pod_sandbox_id: String) -> Self {
        ListedContainer {
            id: status.id.clone(),
            pod_sandbox_id,
            metadata: status.metadata.clone(),
            image: status.image.as_ref().map(|i| ListedImage { image: i.image.clone() }),
            image_ref: status.image_ref.clone(),
            state: status.state,
            created_at: status.created_at,
            labels: Entry::list(&status.labels),
            annotations: Entry::list(&status.annotations),
        }
    }
}

/// `ListPodSandboxResponse` with [`ListedSandbox`] items.
#[derive(Clone, PartialEq, prost::Message)]
struct SandboxListing {
    #[prost(message, repeated, tag = "1")]
    items: Vec<ListedSandbox>,
}

/// `ListContainersResponse` with [`ListedContainer`] items.
#[derive(Clone, PartialEq, prost::Message)]
struct ContainerListing {
    #[prost(message, repeated, tag = "1")]
    containers: Vec<ListedContainer>,
}

impl CriClient {
    /// CRI `ListPodSandbox` with `filter`, decoded lean (see the [module docs](self)).
    pub async fn list_sandbox_items(&self, filter: &SandboxFilter) -> Result<Vec<ListedSandbox>> {
        let req = v1::ListPodSandboxRequest { filter: filter.to_proto() };
        let listing: SandboxListing =
            self.lean_unary("ListPodSandbox", "/runtime.v1.RuntimeService/ListPodSandbox", req).await?;
        Ok(listing.items)
    }

    /// CRI `ListContainers` with `filter`, decoded lean (see the [module docs](self)).
    pub async fn list_container_items(&self, filter: &ContainerFilter) -> Result<Vec<ListedContainer>> {
        let req = v1::ListContainersRequest { filter: filter.to_proto() };
        let listing: ContainerListing =
            self.lean_unary("ListContainers", "/runtime.v1.RuntimeService/ListContainers", req).await?;
        Ok(listing.containers)
    }

    /// A unary call of the runtime service at `path`, its answer decoded as `Resp`; counted, timed
    /// and bounded by the default deadline as every call of this client.
    fn lean_unary<Req, Resp>(
        &self,
        call: &'static str,
        path: &'static str,
        req: Req,
    ) -> impl Future<Output = Result<Resp>> + '_
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel())
            .max_decoding_message_size(self.config().max_message_size)
            .max_encoding_message_size(self.config().max_message_size);
        self.unary(call, self.default_deadline(), req, move |request| async move {
            grpc.ready().await.map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(request, PathAndQuery::from_static(path), codec).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost::Message;

    use super::*;
    use crate::labels::{self, PodIdentity};

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn entries(entries: &[Entry]) -> HashMap<String, String> {
        entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect()
    }

    fn container() -> v1::Container {
        v1::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: Some(v1::ContainerMetadata { name: "web".into(), attempt: 2 }),
            image: Some(v1::ImageSpec {
                image: "sha256:abc".into(),
                annotations: map(&[("image", "annotation")]),
                user_specified_image: "busybox".into(),
                runtime_handler: "runc".into(),
            }),
            image_ref: "sha256:abc".into(),
            state: v1::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_000_000_000,
            labels: map(&[
                (labels::POD_UID, "u1"),
                (labels::POD_NAME, "p"),
                (labels::POD_NAMESPACE, "ns"),
                (labels::CONTAINER_NAME, "web"),
            ]),
            annotations: map(&[(labels::CONTAINER_RESTART_COUNT, "2"), (labels::CONTAINER_HASH, "ff")]),
            image_id: "sha256:abc".into(),
        }
    }

    #[test]
    fn a_listing_decodes_leanly_into_the_same_fields() {
        let full = v1::ListContainersResponse { containers: vec![container(), container()] };
        let lean = ContainerListing::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(lean.containers.len(), 2);
        let (c, l) = (&full.containers[0], &lean.containers[0]);
        assert_eq!((&l.id, &l.pod_sandbox_id, &l.metadata), (&c.id, &c.pod_sandbox_id, &c.metadata));
        assert_eq!((&l.image_ref, l.state, l.created_at), (&c.image_ref, c.state, c.created_at));
        assert_eq!(l.image, Some(ListedImage { image: "sha256:abc".into() }));
        assert_eq!(entries(&l.labels), c.labels);
        assert_eq!(entries(&l.annotations), c.annotations);
        assert_eq!(labels::restart_count(&l.annotations), Some(2));
        assert_eq!(labels::spec_hash(&l.annotations), Some(0xff));
        assert_eq!(PodIdentity::from_labels(&l.labels), Some(PodIdentity::new("p", "ns", "u1")));

        let sandbox = v1::PodSandbox {
            id: "s1".into(),
            metadata: Some(v1::PodSandboxMetadata {
                name: "p".into(),
                uid: "u1".into(),
                namespace: "ns".into(),
                attempt: 1,
            }),
            state: v1::PodSandboxState::SandboxReady as i32,
            created_at: 5,
            labels: map(&[(labels::POD_UID, "u1")]),
            annotations: map(&[("a", "b")]),
            runtime_handler: "runc".into(),
        };
        let full = v1::ListPodSandboxResponse { items: vec![sandbox.clone()] };
        let lean = SandboxListing::decode(full.encode_to_vec().as_slice()).expect("decodes");
        let l = &lean.items[0];
        assert_eq!((&l.id, &l.metadata, l.state), (&sandbox.id, &sandbox.metadata, sandbox.state));
        assert_eq!((l.created_at, &l.runtime_handler), (sandbox.created_at, &sandbox.runtime_handler));
        assert_eq!(entries(&l.labels), sandbox.labels);
        assert_eq!(entries(&l.annotations), sandbox.annotations);
    }

    #[test]
    fn the_last_of_repeated_keys_wins_as_in_a_protobuf_map() {
        let entries = vec![
            Entry { key: "k".into(), value: "first".into() },
            Entry { key: "other".into(), value: "x".into() },
            Entry { key: "k".into(), value: "last".into() },
        ];
        assert_eq!(entries.value("k"), Some("last"));
        assert_eq!(entries.value("other"), Some("x"));
        assert_eq!(entries.value("missing"), None);
        // the same answer as the full types give for the same bytes
        let wire: Vec<u8> = entries
            .iter()
            .flat_map(|e| {
                let mut field = Vec::new();
                prost::encoding::message::encode(8, e, &mut field);
                field
            })
            .collect();
        let full = v1::Container::decode(wire.as_slice()).expect("decodes");
        assert_eq!(full.labels.get("k").map(String::as_str), Some("last"));
    }

    #[test]
    fn strings_that_are_not_utf8_fail_the_listing() {
        // ListContainersResponse { containers: [Container { id: "\xff" }] }
        let wire = [0x0a, 0x03, 0x0a, 0x01, 0xff];
        assert!(v1::ListContainersResponse::decode(&wire[..]).is_err());
        assert!(ContainerListing::decode(&wire[..]).is_err());
    }

    #[test]
    fn a_status_reads_as_its_listing_item() {
        let c = container();
        let status = v1::ContainerStatus {
            id: c.id.clone(),
            metadata: c.metadata.clone(),
            state: c.state,
            created_at: c.created_at,
            image: c.image.clone(),
            image_ref: c.image_ref.clone(),
            labels: c.labels.clone(),
            annotations: c.annotations.clone(),
            ..Default::default()
        };
        let listed = ListedContainer::from_status(&status, "s1".into());
        let lean = ContainerListing::decode(
            v1::ListContainersResponse { containers: vec![c] }.encode_to_vec().as_slice(),
        )
        .expect("decodes");
        let mut expected = lean.containers[0].clone();
        assert_eq!(entries(&listed.labels), entries(&expected.labels));
        assert_eq!(entries(&listed.annotations), entries(&expected.annotations));
        expected.labels = listed.labels.clone();
        expected.annotations = listed.annotations.clone();
        assert_eq!(listed, expected);

        let status = v1::PodSandboxStatus {
            id: "s1".into(),
            state: v1::PodSandboxState::SandboxNotready as i32,
            created_at: 7,
            labels: map(&[(labels::POD_UID, "u1")]),
            runtime_handler: "runc".into(),
            ..Default::default()
        };
        let listed = ListedSandbox::from_status(status);
        let not_ready = v1::PodSandboxState::SandboxNotready as i32;
        assert_eq!((listed.id.as_str(), listed.state, listed.created_at), ("s1", not_ready, 7));
        assert_eq!(listed.labels.value(labels::POD_UID), Some("u1"));
        assert_eq!(listed.runtime_handler, "runc");
    }
}
