//! The client and registry against an in-process fake CSI driver on a real unix socket: deadlines give
//! uncertain errors, not-ready and non-CSI sockets are not registered, vanished sockets are dropped.
//! Needs no root.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nodelet_csi::{CsiClient, CsiClientConfig, Registry, proto as v1};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

/// Identity + Node only (no CONTROLLER_SERVICE). `Probe` answers after `probe_delay` with `ready`.
#[derive(Clone)]
struct Fake {
    name: &'static str,
    ready: Arc<AtomicBool>,
    probe_delay: Duration,
}

#[tonic::async_trait]
impl v1::identity_server::Identity for Fake {
    async fn get_plugin_info(
        &self,
        _: Request<v1::GetPluginInfoRequest>,
    ) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
        Ok(Response::new(v1::GetPluginInfoResponse {
            name: self.name.into(),
            vendor_version: "0.0.1".into(),
            manifest: Default::default(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<v1::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(v1::GetPluginCapabilitiesResponse { capabilities: vec![] }))
    }
    async fn probe(&self, _: Request<v1::ProbeRequest>) -> Result<Response<v1::ProbeResponse>, Status> {
        tokio::time::sleep(self.probe_delay).await;
        Ok(Response::new(v1::ProbeResponse { ready: Some(self.ready.load(Ordering::SeqCst)) }))
    }
}

#[tonic::async_trait]
impl v1::node_server::Node for Fake {
    async fn node_stage_volume(
        &self,
        _: Request<v1::NodeStageVolumeRequest>,
    ) -> Result<Response<v1::NodeStageVolumeResponse>, Status> {
        Err(Status::aborted("an operation for this volume is in progress"))
    }
    async fn node_unstage_volume(
        &self,
        _: Request<v1::NodeUnstageVolumeRequest>,
    ) -> Result<Response<v1::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn node_publish_volume(
        &self,
        _: Request<v1::NodePublishVolumeRequest>,
    ) -> Result<Response<v1::NodePublishVolumeResponse>, Status> {
        Err(Status::invalid_argument("bad request"))
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<v1::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v1::NodeUnpublishVolumeResponse>, Status> {
        Ok(Response::new(v1::NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<v1::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<v1::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn node_expand_volume(
        &self,
        _: Request<v1::NodeExpandVolumeRequest>,
    ) -> Result<Response<v1::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<v1::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v1::NodeGetCapabilitiesResponse>, Status> {
        use v1::node_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(v1::NodeGetCapabilitiesResponse {
            capabilities: vec![v1::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: rpc::Type::StageUnstageVolume as i32 })),
            }],
        }))
    }
    async fn node_get_info(
        &self,
        _: Request<v1::NodeGetInfoRequest>,
    ) -> Result<Response<v1::NodeGetInfoResponse>, Status> {
        Ok(Response::new(v1::NodeGetInfoResponse {
            node_id: "fake-node".into(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

/// Serves `fake` (Identity + Node) on a new socket at `path`.
fn serve(path: &Path, fake: Fake) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).expect("bind");
    let incoming =
        futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(v1::identity_server::IdentityServer::new(fake.clone()))
            .add_service(v1::node_server::NodeServer::new(fake))
            .serve_with_incoming(incoming)
            .await;
    })
}

/// Serves only Identity, as a plugin-registration socket of another protocol would not: every CSI call
/// answers UNIMPLEMENTED.
fn serve_other_protocol(path: &Path) -> JoinHandle<()> {
    let listener = UnixListener::bind(path).expect("bind");
    let incoming =
        futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
    tokio::spawn(async move {
        // A server with no services at all: tonic answers UNIMPLEMENTED for every path.
        let _ = tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(incoming)
            .await;
    })
}

fn fake(name: &'static str, ready: bool, probe_delay: Duration) -> Fake {
    Fake { name, ready: Arc::new(AtomicBool::new(ready)), probe_delay }
}

fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("plugins_registry");
    std::fs::create_dir(&dir).expect("mkdir");
    (tmp, dir)
}

#[tokio::test]
async fn a_deadline_gives_an_uncertain_timeout() {
    let (_tmp, dir) = tempdir();
    let socket = dir.join("slow.sock");
    let server = serve(&socket, fake("slow.example.com", true, Duration::from_secs(30)));
    let config = CsiClientConfig { call_timeout: Duration::from_millis(300), ..CsiClientConfig::default() };
    let client = CsiClient::connect(&socket, config).await.expect("connect");
    assert_eq!(client.plugin_info().await.expect("fast call").name, "slow.example.com");
    let started = std::time::Instant::now();
    let err = client.probe().await.expect_err("probe outlives the deadline");
    assert!(started.elapsed() < Duration::from_secs(5), "the deadline was enforced");
    assert!(matches!(err, nodelet_csi::CsiError::Timeout { call: "Probe", .. }), "{err:?}");
    assert!(err.is_uncertain());
    server.abort();
}

#[tokio::test]
async fn driver_statuses_are_classified() {
    let (_tmp, dir) = tempdir();
    let socket = dir.join("d.sock");
    let server = serve(&socket, fake("d.example.com", true, Duration::ZERO));
    let client = CsiClient::connect(&socket, CsiClientConfig::default()).await.expect("connect");
    // ABORTED (operation pending for the volume): uncertain.
    let err = client.node_stage(v1::NodeStageVolumeRequest::default()).await.expect_err("aborted");
    assert_eq!(err.code(), Some(tonic::Code::Aborted));
    assert!(err.is_uncertain());
    // INVALID_ARGUMENT: final.
    let err = client.node_publish(v1::NodePublishVolumeRequest::default()).await.expect_err("invalid");
    assert!(err.is_final());
    // A driver without the Controller service: UNIMPLEMENTED, final.
    let err = client.controller_capabilities().await.expect_err("no controller");
    assert!(err.is_unimplemented() && err.is_final());
    client.node_unpublish("v", Path::new("/x")).await.expect("unpublish");
    server.abort();
}

#[tokio::test]
async fn connecting_to_a_missing_socket_fails_uncertain() {
    let (_tmp, dir) = tempdir();
    let err = CsiClient::connect(dir.join("missing.sock"), CsiClientConfig::default())
        .await
        .expect_err("no socket");
    assert!(matches!(err, nodelet_csi::CsiError::Connect { .. }), "{err:?}");
    assert!(err.is_uncertain() && err.is_unavailable());
}

#[tokio::test]
async fn registry_registers_ready_csi_drivers_only() {
    let (_tmp, dir) = tempdir();
    let registry =
        Registry::new(&dir, CsiClientConfig::default()).with_discovery_timeout(Duration::from_secs(2));
    let mut changes = registry.subscribe();

    // Empty (and missing) directories are fine.
    assert!(!registry.has_scanned());
    assert!(!registry.scan().await.expect("scan").changed());
    assert!(registry.has_scanned() && !changes.has_changed().expect("sender alive"));
    registry.scanned().await;
    assert!(
        !Registry::new(dir.join("missing"), CsiClientConfig::default()).scan().await.expect("scan").changed()
    );

    let ready_flag = fake("later.example.com", false, Duration::ZERO);
    let ready = Arc::clone(&ready_flag.ready);
    let s1 = serve(&dir.join("later.sock"), ready_flag);
    let s2 = serve_other_protocol(&dir.join("other-reg.sock"));
    std::fs::create_dir(dir.join("sub")).expect("mkdir");
    let s3 = serve(&dir.join("sub").join("nested.sock"), fake("nested.example.com", true, Duration::ZERO));
    // Dot-files are ignored.
    let s4 = serve(&dir.join(".hidden.sock"), fake("hidden.example.com", true, Duration::ZERO));

    let report = registry.scan().await.expect("scan");
    assert_eq!(report.added, vec!["nested.example.com".to_owned()]);
    let failed: Vec<&str> =
        report.failed.iter().map(|(p, _)| p.file_name().and_then(|n| n.to_str()).unwrap_or("")).collect();
    assert_eq!(failed, ["later.sock", "other-reg.sock"], "{:?}", report.failed);
    assert!(report.failed[0].1.contains("not ready"), "{:?}", report.failed[0]);
    assert!(changes.has_changed().expect("sender alive"));
    changes.mark_unchanged();
    let nested = registry.get("nested.example.com").expect("registered");
    assert_eq!(nested.node.node_id, "fake-node");
    assert!(nested.requires_stage() && !nested.requires_controller_publish() && !nested.can_create_volumes());
    assert_eq!(nested.controller_capabilities, None);

    // Once ready, it is registered on the next scan; known drivers are not probed again.
    ready.store(true, Ordering::SeqCst);
    let report = registry.scan().await.expect("scan");
    assert_eq!(report.added, vec!["later.example.com".to_owned()]);
    assert_eq!(
        registry.drivers().iter().map(|d| d.name().to_owned()).collect::<Vec<_>>(),
        ["later.example.com", "nested.example.com"]
    );

    // A second socket claiming a registered name is refused.
    let s5 = serve(&dir.join("dup.sock"), fake("later.example.com", true, Duration::ZERO));
    let report = registry.scan().await.expect("scan");
    assert!(!report.changed());
    assert!(report.failed.iter().any(|(p, r)| p.ends_with("dup.sock") && r.contains("already registered")));

    // A vanished socket drops its driver.
    std::fs::remove_file(dir.join("sub").join("nested.sock")).expect("rm");
    let report = registry.scan().await.expect("scan");
    assert_eq!(report.removed, vec!["nested.example.com".to_owned()]);
    assert!(registry.get("nested.example.com").is_none());
    assert!(changes.has_changed().expect("sender alive"));
    for s in [s1, s2, s3, s4, s5] {
        s.abort();
    }
}
