//! Lean listings: `ListPodSandbox` and `ListContainers` decoded into [`ListedSandbox`] and
//! [`ListedContainer`], which keep only the fields nodelet reads from a listing, with the label and
//! annotation maps as their entries in wire order ([`Entry`], looked up through
//! [`labels::Lookup`](crate::labels::Lookup)) instead of hash maps, and every string a [`Text`]: a
//! slice of the runtime's answer, checked to be UTF-8, not a copy of it.
//!
//! A relist decodes every sandbox and container of the node. With the full CRI types that meant a
//! hash map per label and annotation map, an allocation per string (about thirty per container),
//! a copy of every field nodelet never reads (the image spec's own maps, `image_id`), and freeing it
//! all again: at 250 pods about a millisecond of a 4–5 ms listing on top of the runtime's answer
//! (docs/benchmarks.md). The wire format is the same: a protobuf map is a repeated message of
//! `key = 1` and `value = 2`, a string is length-delimited bytes, and fields a message does not
//! declare are skipped by the decoder. The answer is decoded as bytes that share its buffer
//! (`prost`'s `bytes::Bytes` fields) and each string is then checked to be UTF-8: an answer with
//! one that is not fails the call, as it failed with the full types.
//!
//! A [`Text`] keeps the whole answer's buffer alive: copy what outlives the listing into a `String`.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::str::Utf8Error;

use k8s_cri::v1;
use prost::bytes::Bytes;
use tonic::codegen::http::uri::PathAndQuery;

use crate::client::CriClient;
use crate::error::{CriError, Result};
use crate::filter::{ContainerFilter, SandboxFilter};
use crate::labels::Lookup;

/// A string of a listing: a slice of the runtime's answer, checked to be UTF-8 when decoded.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Text(Bytes);

impl Text {
    /// `bytes` as a text, if they are UTF-8.
    fn new(bytes: Bytes) -> std::result::Result<Self, Utf8Error> {
        std::str::from_utf8(&bytes)?;
        Ok(Self(bytes))
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Checked when made (`new`, or from a `str`); checked again here because `unsafe` is not
        // used in this workspace, which costs a pass over the bytes and never fails.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Whether the text is `s` (a byte comparison, without the UTF-8 pass of [`Text::as_str`]).
    pub fn is(&self, s: &str) -> bool {
        self.0 == s.as_bytes()
    }
}

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<String> for Text {
    /// Without copying the string.
    fn from(s: String) -> Self {
        Self(Bytes::from(s))
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Self {
        Self(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.is(other)
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.is(other)
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        self.is(other)
    }
}

/// One entry of a label or annotation map, as a protobuf map puts it on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The label's or annotation's key.
    pub key: Text,
    /// Its value.
    pub value: Text,
}

impl Entry {
    /// The entries of a map (owned or borrowed), in its iteration order.
    pub fn list<K: Into<Text>, V: Into<Text>>(map: impl IntoIterator<Item = (K, V)>) -> Vec<Entry> {
        map.into_iter().map(|(key, value)| Entry { key: key.into(), value: value.into() }).collect()
    }
}

impl Lookup for [Entry] {
    /// The value of the last entry with `key`: a protobuf map keeps the last of repeated keys.
    fn value(&self, key: &str) -> Option<&str> {
        self.iter().rev().find(|e| e.key.is(key)).map(|e| e.value.as_str())
    }
}

impl Lookup for Vec<Entry> {
    fn value(&self, key: &str) -> Option<&str> {
        self.as_slice().value(key)
    }
}

/// The metadata of a listed sandbox (the CRI's `PodSandboxMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedSandboxMetadata {
    /// The pod's name.
    pub name: Text,
    /// The pod's UID.
    pub uid: Text,
    /// The pod's namespace.
    pub namespace: Text,
    /// The sandbox's attempt number.
    pub attempt: u32,
}

/// A sandbox as `ListPodSandbox` lists it (every field of the CRI's `PodSandbox`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedSandbox {
    /// The sandbox's ID.
    pub id: Text,
    /// The metadata it was created with.
    pub metadata: Option<ListedSandboxMetadata>,
    /// Its state (`v1::PodSandboxState`).
    pub state: i32,
    /// Its creation time, in nanoseconds since the epoch.
    pub created_at: i64,
    /// Its labels.
    pub labels: Vec<Entry>,
    /// Its annotations.
    pub annotations: Vec<Entry>,
    /// The runtime handler it runs with.
    pub runtime_handler: Text,
}

/// The metadata of a listed container (the CRI's `ContainerMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedContainerMetadata {
    /// The container's name.
    pub name: Text,
    /// Its attempt number (restart count).
    pub attempt: u32,
}

/// The image of a listed container: the CRI's `ImageSpec` without its annotations and handler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedImage {
    /// The image as the runtime names it (containerd: its ID).
    pub image: Text,
}

/// A container as `ListContainers` lists it: the CRI's `Container` without `image_id` and the image
/// spec's annotations and handler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedContainer {
    /// The container's ID.
    pub id: Text,
    /// The ID of its sandbox.
    pub pod_sandbox_id: Text,
    /// The metadata it was created with.
    pub metadata: Option<ListedContainerMetadata>,
    /// Its image.
    pub image: Option<ListedImage>,
    /// The image's reference (containerd: its ID).
    pub image_ref: Text,
    /// Its state (`v1::ContainerState`).
    pub state: i32,
    /// Its creation time, in nanoseconds since the epoch.
    pub created_at: i64,
    /// Its labels.
    pub labels: Vec<Entry>,
    /// Its annotations.
    pub annotations: Vec<Entry>,
}

impl ListedSandbox {
    /// A sandbox's status as its listing shows it.
    pub fn from_status(status: v1::PodSandboxStatus) -> Self {
        ListedSandbox {
            id: status.id.into(),
            metadata: status.metadata.map(|m| ListedSandboxMetadata {
                name: m.name.into(),
                uid: m.uid.into(),
                namespace: m.namespace.into(),
                attempt: m.attempt,
            }),
            state: status.state,
            created_at: status.created_at,
            labels: Entry::list(status.labels),
            annotations: Entry::list(status.annotations),
            runtime_handler: status.runtime_handler.into(),
        }
    }
}

impl ListedContainer {
    /// A container's status as its listing shows it; the status does not name the sandbox, so the
    /// caller does.
    pub fn from_status(status: &v1::ContainerStatus, pod_sandbox_id: String) -> Self {
        ListedContainer {
            id: (&status.id).into(),
            pod_sandbox_id: pod_sandbox_id.into(),
            metadata: status
                .metadata
                .as_ref()
                .map(|m| ListedContainerMetadata { name: (&m.name).into(), attempt: m.attempt }),
            image: status.image.as_ref().map(|i| ListedImage { image: (&i.image).into() }),
            image_ref: (&status.image_ref).into(),
            state: status.state,
            created_at: status.created_at,
            labels: Entry::list(&status.labels),
            annotations: Entry::list(&status.annotations),
        }
    }
}

/// The answers as decoded: the same fields, every string as bytes that share the answer's buffer.
mod wire {
    use prost::bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Entry {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) key: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub(super) value: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct SandboxMetadata {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) name: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub(super) uid: Bytes,
        #[prost(bytes = "bytes", tag = "3")]
        pub(super) namespace: Bytes,
        #[prost(uint32, tag = "4")]
        pub(super) attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Sandbox {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) id: Bytes,
        #[prost(message, optional, tag = "2")]
        pub(super) metadata: Option<SandboxMetadata>,
        #[prost(int32, tag = "3")]
        pub(super) state: i32,
        #[prost(int64, tag = "4")]
        pub(super) created_at: i64,
        #[prost(message, repeated, tag = "5")]
        pub(super) labels: Vec<Entry>,
        #[prost(message, repeated, tag = "6")]
        pub(super) annotations: Vec<Entry>,
        #[prost(bytes = "bytes", tag = "7")]
        pub(super) runtime_handler: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ContainerMetadata {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) name: Bytes,
        #[prost(uint32, tag = "2")]
        pub(super) attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Image {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) image: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Container {
        #[prost(bytes = "bytes", tag = "1")]
        pub(super) id: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub(super) pod_sandbox_id: Bytes,
        #[prost(message, optional, tag = "3")]
        pub(super) metadata: Option<ContainerMetadata>,
        #[prost(message, optional, tag = "4")]
        pub(super) image: Option<Image>,
        #[prost(bytes = "bytes", tag = "5")]
        pub(super) image_ref: Bytes,
        #[prost(int32, tag = "6")]
        pub(super) state: i32,
        #[prost(int64, tag = "7")]
        pub(super) created_at: i64,
        #[prost(message, repeated, tag = "8")]
        pub(super) labels: Vec<Entry>,
        #[prost(message, repeated, tag = "9")]
        pub(super) annotations: Vec<Entry>,
    }

    /// `ListPodSandboxResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct SandboxListing {
        #[prost(message, repeated, tag = "1")]
        pub(super) items: Vec<Sandbox>,
    }

    /// `ListContainersResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ContainerListing {
        #[prost(message, repeated, tag = "1")]
        pub(super) containers: Vec<Container>,
    }
}

/// The entries as texts (in place: an entry of bytes and one of texts are the same size).
fn entries(entries: Vec<wire::Entry>) -> std::result::Result<Vec<Entry>, Utf8Error> {
    entries.into_iter().map(|e| Ok(Entry { key: Text::new(e.key)?, value: Text::new(e.value)? })).collect()
}

impl TryFrom<wire::Sandbox> for ListedSandbox {
    type Error = Utf8Error;

    fn try_from(s: wire::Sandbox) -> std::result::Result<Self, Utf8Error> {
        Ok(ListedSandbox {
            id: Text::new(s.id)?,
            metadata: match s.metadata {
                Some(m) => Some(ListedSandboxMetadata {
                    name: Text::new(m.name)?,
                    uid: Text::new(m.uid)?,
                    namespace: Text::new(m.namespace)?,
                    attempt: m.attempt,
                }),
                None => None,
            },
            state: s.state,
            created_at: s.created_at,
            labels: entries(s.labels)?,
            annotations: entries(s.annotations)?,
            runtime_handler: Text::new(s.runtime_handler)?,
        })
    }
}

impl TryFrom<wire::Container> for ListedContainer {
    type Error = Utf8Error;

    fn try_from(c: wire::Container) -> std::result::Result<Self, Utf8Error> {
        Ok(ListedContainer {
            id: Text::new(c.id)?,
            pod_sandbox_id: Text::new(c.pod_sandbox_id)?,
            metadata: match c.metadata {
                Some(m) => Some(ListedContainerMetadata { name: Text::new(m.name)?, attempt: m.attempt }),
                None => None,
            },
            image: match c.image {
                Some(i) => Some(ListedImage { image: Text::new(i.image)? }),
                None => None,
            },
            image_ref: Text::new(c.image_ref)?,
            state: c.state,
            created_at: c.created_at,
            labels: entries(c.labels)?,
            annotations: entries(c.annotations)?,
        })
    }
}

/// The items of an answer as listing items; `call` names the call in the error when a string is
/// not UTF-8.
fn items<W, T: TryFrom<W, Error = Utf8Error>>(call: &'static str, items: Vec<W>) -> Result<Vec<T>> {
    items
        .into_iter()
        .map(T::try_from)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| CriError::InvalidResponse { call, reason: format!("a string that is not UTF-8: {e}") })
}

impl CriClient {
    /// CRI `ListPodSandbox` with `filter`, decoded lean (see the [module docs](self)).
    pub async fn list_sandbox_items(&self, filter: &SandboxFilter) -> Result<Vec<ListedSandbox>> {
        const CALL: &str = "ListPodSandbox";
        let req = v1::ListPodSandboxRequest { filter: filter.to_proto() };
        let listing: wire::SandboxListing =
            self.lean_unary(CALL, "/runtime.v1.RuntimeService/ListPodSandbox", req).await?;
        items(CALL, listing.items)
    }

    /// CRI `ListContainers` with `filter`, decoded lean (see the [module docs](self)).
    pub async fn list_container_items(&self, filter: &ContainerFilter) -> Result<Vec<ListedContainer>> {
        const CALL: &str = "ListContainers";
        let req = v1::ListContainersRequest { filter: filter.to_proto() };
        let listing: wire::ContainerListing =
            self.lean_unary(CALL, "/runtime.v1.RuntimeService/ListContainers", req).await?;
        items(CALL, listing.containers)
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
    use prost::bytes::BytesMut;

    use super::*;
    use crate::labels::{self, PodIdentity};

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn entries(entries: &[Entry]) -> HashMap<String, String> {
        entries.iter().map(|e| (e.key.to_string(), e.value.to_string())).collect()
    }

    /// A `ListContainersResponse` decoded as the client does (from the buffer of the answer).
    fn lean_containers(answer: &[u8]) -> Result<Vec<ListedContainer>> {
        let listing = wire::ContainerListing::decode(BytesMut::from(answer)).expect("decodes");
        items("ListContainers", listing.containers)
    }

    /// A `ListPodSandboxResponse` decoded as the client does.
    fn lean_sandboxes(answer: &[u8]) -> Result<Vec<ListedSandbox>> {
        let listing = wire::SandboxListing::decode(BytesMut::from(answer)).expect("decodes");
        items("ListPodSandbox", listing.items)
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
        let lean = lean_containers(&full.encode_to_vec()).expect("UTF-8");
        assert_eq!(lean.len(), 2);
        let (c, l) = (&full.containers[0], &lean[0]);
        assert_eq!((l.id.as_str(), l.pod_sandbox_id.as_str()), (c.id.as_str(), c.pod_sandbox_id.as_str()));
        assert_eq!(l.metadata, Some(ListedContainerMetadata { name: "web".into(), attempt: 2 }));
        assert_eq!(
            (l.image_ref.as_str(), l.state, l.created_at),
            (c.image_ref.as_str(), c.state, c.created_at)
        );
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
        let lean = lean_sandboxes(&full.encode_to_vec()).expect("UTF-8");
        let l = &lean[0];
        let metadata =
            ListedSandboxMetadata { name: "p".into(), uid: "u1".into(), namespace: "ns".into(), attempt: 1 };
        assert_eq!((&l.id, &l.metadata, l.state), (&Text::from("s1"), &Some(metadata), sandbox.state));
        assert_eq!((l.created_at, l.runtime_handler.as_str()), (sandbox.created_at, "runc"));
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
                let entry = wire::Entry {
                    key: Bytes::copy_from_slice(e.key.as_bytes()),
                    value: Bytes::copy_from_slice(e.value.as_bytes()),
                };
                let mut field = Vec::new();
                prost::encoding::message::encode(8, &entry, &mut field);
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
        let e = lean_containers(&wire).expect_err("not UTF-8");
        assert!(matches!(e, CriError::InvalidResponse { call: "ListContainers", .. }), "{e}");
        // in a label's value too
        let mut c = container();
        c.labels.insert("k".into(), "~~~~".into());
        let mut answer = v1::ListContainersResponse { containers: vec![c] }.encode_to_vec();
        let at = answer.windows(4).position(|w| w == b"~~~~").expect("the value's bytes");
        answer[at] = 0xff;
        assert!(lean_containers(&answer).is_err());
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
        let lean = lean_containers(&v1::ListContainersResponse { containers: vec![c] }.encode_to_vec())
            .expect("UTF-8");
        let mut expected = lean[0].clone();
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

    #[test]
    fn the_strings_of_a_listing_are_slices_of_its_answer() {
        let answer = BytesMut::from(
            v1::ListContainersResponse { containers: vec![container()] }.encode_to_vec().as_slice(),
        );
        let range = answer.as_ptr_range();
        let listing = wire::ContainerListing::decode(answer).expect("decodes");
        let lean: Vec<ListedContainer> = items("ListContainers", listing.containers).expect("UTF-8");
        let c = &lean[0];
        let texts = [&c.id, &c.pod_sandbox_id, &c.image_ref, &c.labels[0].key, &c.annotations[0].value];
        for text in texts {
            assert!(range.contains(&text.as_bytes().as_ptr()), "{text} is not a copy");
        }
        assert!(c.id.is("c1") && c.id == "c1" && c.id != "c2" && *c.id == *"c1");
        assert_eq!(format!("{:?} {}", c.id, c.id), r#""c1" c1"#);
    }
}
