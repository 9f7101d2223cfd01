//! Protobuf and gRPC bindings (prost + tonic) for protocols nodelet speaks that no published crate covers.
//!
//! * [`csi::v1`]: the Container Storage Interface v1 (specification v1.9.0), services `Identity`,
//!   `Controller` and `Node` with all their messages, compiled from `proto/csi/v1/csi.proto` at build time
//!   (needs `protoc`). Clients are in `csi::v1::{identity,controller,node}_client`, server traits and
//!   wrappers in `csi::v1::{identity,controller,node}_server`. The GroupController and SnapshotMetadata
//!   services are left out (see the comment at the top of the .proto).
//!
//! * [`pluginregistration::v1`]: the kubelet's plugin registration protocol (`pluginregistration.v1`:
//!   `Registration` with `GetInfo` and `NotifyRegistrationStatus`), which `node-driver-registrar` serves
//!   to register a CSI driver with the node agent.
//!
//! Fields the specification marks as secret (`secrets` maps, and `mount_flags`, which may hold credentials)
//! are plain fields here, and the generated `Debug` prints them: never log a whole CSI request.
//!
//! ```
//! use nodelet_proto::csi::v1;
//! use prost::Message;
//!
//! let req = v1::NodeUnpublishVolumeRequest {
//!     volume_id: "vol-1".into(),
//!     target_path: "/var/lib/nodelet/pods/uid/volumes/kubernetes.io~csi/data/mount".into(),
//! };
//! let bytes = req.encode_to_vec();
//! assert_eq!(v1::NodeUnpublishVolumeRequest::decode(bytes.as_slice()).unwrap(), req);
//! ```

/// Container Storage Interface.
pub mod csi {
    /// CSI v1 (protobuf package `csi.v1`): messages, clients and servers.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rustdoc::all
    )]
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// The kubelet's plugin registration protocol.
pub mod pluginregistration {
    /// Version 1 (protobuf package `pluginregistration`): messages, client and server.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all,
        clippy::pedantic,
        rustdoc::all
    )]
    pub mod v1 {
        tonic::include_proto!("pluginregistration");
    }
}
