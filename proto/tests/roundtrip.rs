//! The generated CSI messages round-trip and use the specification's field numbers on the wire.

use std::collections::HashMap;

use nodelet_proto::csi::v1;
use prost::Message;

fn mount_capability() -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_type: Some(v1::volume_capability::AccessType::Mount(v1::volume_capability::MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(v1::volume_capability::AccessMode {
            mode: v1::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

#[test]
fn create_volume_request_round_trips() {
    let req = v1::CreateVolumeRequest {
        name: "pvc-0123".into(),
        capacity_range: Some(v1::CapacityRange { required_bytes: 1 << 30, limit_bytes: 2 << 30 }),
        volume_capabilities: vec![mount_capability()],
        parameters: HashMap::from([("type".into(), "fast".into())]),
        secrets: HashMap::from([("password".into(), "hunter2".into())]),
        volume_content_source: Some(v1::VolumeContentSource {
            r#type: Some(v1::volume_content_source::Type::Snapshot(
                v1::volume_content_source::SnapshotSource { snapshot_id: "snap-1".into() },
            )),
        }),
        accessibility_requirements: None,
        mutable_parameters: HashMap::from([("iops".into(), "3000".into())]),
    };
    let bytes = req.encode_to_vec();
    let back = v1::CreateVolumeRequest::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(back, req);
}

#[test]
fn wrapper_types_map_to_options() {
    // google.protobuf.BoolValue ready = 1: unset means "ready" to a CO, so None must survive the wire.
    let unset = v1::ProbeResponse { ready: None };
    assert!(unset.encode_to_vec().is_empty());
    let not_ready = v1::ProbeResponse { ready: Some(false) };
    let back = v1::ProbeResponse::decode(not_ready.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(back.ready, Some(false));
}

#[test]
fn field_numbers_match_the_specification() {
    // NodePublishVolumeRequest.readonly = 6 (varint): tag (6 << 3) | 0.
    let req = v1::NodePublishVolumeRequest { readonly: true, ..Default::default() };
    assert_eq!(req.encode_to_vec(), vec![6 << 3, 1]);

    // NodeGetInfoResponse.max_volumes_per_node = 2 (varint).
    let resp = v1::NodeGetInfoResponse { max_volumes_per_node: 5, ..Default::default() };
    assert_eq!(resp.encode_to_vec(), vec![2 << 3, 5]);

    // NodeStageVolumeRequest.staging_target_path = 3 (length-delimited).
    let req = v1::NodeStageVolumeRequest { staging_target_path: "/s".into(), ..Default::default() };
    assert_eq!(req.encode_to_vec(), vec![(3 << 3) | 2, 2, b'/', b's']);

    // ControllerServiceCapability.RPC.Type: PUBLISH_UNPUBLISH_VOLUME = 2, MODIFY_VOLUME = 14.
    use v1::controller_service_capability::rpc::Type as CtrlType;
    assert_eq!(CtrlType::PublishUnpublishVolume as i32, 2);
    assert_eq!(CtrlType::ModifyVolume as i32, 14);
    // NodeServiceCapability.RPC.Type: STAGE_UNSTAGE_VOLUME = 1, GET_VOLUME_STATS = 2, VOLUME_MOUNT_GROUP = 6.
    use v1::node_service_capability::rpc::Type as NodeType;
    assert_eq!(NodeType::StageUnstageVolume as i32, 1);
    assert_eq!(NodeType::GetVolumeStats as i32, 2);
    assert_eq!(NodeType::VolumeMountGroup as i32, 6);
    // The gRPC service names are the specification's (method paths are /<service>/<Rpc>).
    assert_eq!(v1::identity_server::SERVICE_NAME, "csi.v1.Identity");
    assert_eq!(v1::controller_server::SERVICE_NAME, "csi.v1.Controller");
    assert_eq!(v1::node_server::SERVICE_NAME, "csi.v1.Node");
}
