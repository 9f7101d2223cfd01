//! The CSI v1 client over a unix socket.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use nodelet_proto::csi::v1;
use nodelet_proto::csi::v1::controller_client::ControllerClient;
use nodelet_proto::csi::v1::identity_client::IdentityClient;
use nodelet_proto::csi::v1::node_client::NodeClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{CsiError, Result};

/// The kubelet's `csiTimeout`: the deadline of every CSI call [K:pkg/volume/csi/csi_plugin.go].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long [`CsiClient::connect`] waits for the socket to accept a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a [`CsiClient`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiClientConfig {
    /// Deadline of every call (default [`DEFAULT_CALL_TIMEOUT`], 2 minutes as in the kubelet). When it
    /// expires the call is cancelled and [`CsiError::Timeout`] (uncertain) is returned.
    pub call_timeout: Duration,
    /// Deadline of establishing the connection (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
}

impl Default for CsiClientConfig {
    fn default() -> Self {
        CsiClientConfig { call_timeout: DEFAULT_CALL_TIMEOUT, connect_timeout: DEFAULT_CONNECT_TIMEOUT }
    }
}

/// What `GetPluginInfo` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The driver name, e.g. `hostpath.csi.nodelet.dev` (validated: see [`validate_driver_name`]).
    pub name: String,
    /// Opaque vendor version.
    pub vendor_version: String,
    /// Opaque manifest.
    pub manifest: BTreeMap<String, String>,
}

/// What `GetPluginCapabilities` returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCapabilities {
    /// `CONTROLLER_SERVICE`: the driver serves the Controller service.
    pub controller_service: bool,
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`: volumes are not equally accessible from every node.
    pub volume_accessibility_constraints: bool,
    /// `GROUP_CONTROLLER_SERVICE` (alpha).
    pub group_controller_service: bool,
    /// `VolumeExpansion ONLINE`.
    pub online_expansion: bool,
    /// `VolumeExpansion OFFLINE`.
    pub offline_expansion: bool,
}

/// What `NodeGetInfo` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node as the driver knows it (passed to `ControllerPublishVolume`).
    pub node_id: String,
    /// Maximum number of volumes the driver can publish on this node; `None` when unset (0).
    pub max_volumes_per_node: Option<u64>,
    /// Topology segments of this node (empty when the driver reports none).
    pub accessible_topology: BTreeMap<String, String>,
}

/// What `NodeGetCapabilities` returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: `NodeStageVolume` must precede `NodePublishVolume`.
    pub stage_unstage_volume: bool,
    /// `GET_VOLUME_STATS`: `NodeGetVolumeStats` is implemented.
    pub get_volume_stats: bool,
    /// `EXPAND_VOLUME`.
    pub expand_volume: bool,
    /// `VOLUME_CONDITION` (alpha).
    pub volume_condition: bool,
    /// `SINGLE_NODE_MULTI_WRITER` (alpha).
    pub single_node_multi_writer: bool,
    /// `VOLUME_MOUNT_GROUP`.
    pub volume_mount_group: bool,
}

/// What `ControllerGetCapabilities` returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerCapabilities {
    /// `CREATE_DELETE_VOLUME`: dynamic provisioning.
    pub create_delete_volume: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`: `ControllerPublishVolume` (attach) must precede the node calls.
    pub publish_unpublish_volume: bool,
    /// `LIST_VOLUMES`.
    pub list_volumes: bool,
    /// `GET_CAPACITY`.
    pub get_capacity: bool,
    /// `CREATE_DELETE_SNAPSHOT`.
    pub create_delete_snapshot: bool,
    /// `LIST_SNAPSHOTS`.
    pub list_snapshots: bool,
    /// `CLONE_VOLUME`.
    pub clone_volume: bool,
    /// `PUBLISH_READONLY`: `ControllerPublishVolume.readonly` is honoured.
    pub publish_readonly: bool,
    /// `EXPAND_VOLUME`.
    pub expand_volume: bool,
    /// `LIST_VOLUMES_PUBLISHED_NODES`.
    pub list_volumes_published_nodes: bool,
    /// `VOLUME_CONDITION` (alpha).
    pub volume_condition: bool,
    /// `GET_VOLUME` (alpha).
    pub get_volume: bool,
    /// `SINGLE_NODE_MULTI_WRITER` (alpha).
    pub single_node_multi_writer: bool,
    /// `MODIFY_VOLUME` (alpha).
    pub modify_volume: bool,
}

/// One unit of `NodeGetVolumeStats` usage (negative values from the driver are read as 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Total capacity.
    pub total: u64,
    /// Available capacity.
    pub available: u64,
    /// Used capacity.
    pub used: u64,
}

/// What `NodeGetVolumeStats` returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Usage in bytes, when reported.
    pub bytes: Option<Usage>,
    /// Usage in inodes, when reported.
    pub inodes: Option<Usage>,
    /// Volume condition `(abnormal, message)`, when reported.
    pub condition: Option<(bool, String)>,
}

/// Checks a CSI driver name as the specification defines it: at most 63 characters, beginning and ending
/// with an ASCII alphanumeric, with only alphanumerics, `-` and `.` between. Such a name is safe as a path
/// component (no `/`, never `.` or `..`), which the kubelet layout relies on.
pub fn validate_driver_name(name: &str) -> std::result::Result<(), &'static str> {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err("empty");
    };
    if bytes.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("must begin and end with an alphanumeric character");
    }
    if !bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.') {
        return Err("only alphanumerics, '-' and '.' are allowed");
    }
    Ok(())
}

/// Parses a CSI endpoint: `unix:///path/to.sock`, `unix:/path/to.sock` or an absolute path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let invalid =
        |reason: &str| CsiError::InvalidEndpoint { endpoint: endpoint.to_owned(), reason: reason.into() };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if endpoint.contains("://") {
        return Err(invalid("only unix sockets are supported"));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(invalid("empty socket path"));
    }
    if !path.starts_with('/') {
        return Err(invalid("socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

fn unix_connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<UnixStream>>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    })
}

/// A gRPC channel over the unix socket, connected within [`CsiClientConfig::connect_timeout`].
pub(crate) async fn unix_channel(socket: &Path, config: &CsiClientConfig) -> Result<Channel> {
    let endpoint = CsiClient::grpc_endpoint(socket, config)?;
    let dial = endpoint.connect_with_connector(unix_connector(socket.to_path_buf()));
    let connect_error = |reason: String| CsiError::Connect { socket: socket.display().to_string(), reason };
    match tokio::time::timeout(config.connect_timeout, dial).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(connect_error(error_chain(&e))),
        Err(_) => Err(connect_error(format!("timed out after {:?}", config.connect_timeout))),
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Async client for the Identity, Controller and Node services of one CSI driver on a unix socket.
///
/// One HTTP/2 connection is shared by all clones; it reconnects by itself after the driver restarts. Every
/// call has the deadline [`CsiClientConfig::call_timeout`]; the client never retries (retry policy belongs
/// to the reconcilers, which must look at [`CsiError::is_uncertain`]).
///
/// Requests are never logged: several carry secrets.
#[derive(Debug, Clone)]
pub struct CsiClient {
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    socket: PathBuf,
    config: CsiClientConfig,
}

impl CsiClient {
    /// Connects to the driver socket, failing if it cannot be reached within
    /// [`CsiClientConfig::connect_timeout`].
    pub async fn connect(socket: impl AsRef<Path>, config: CsiClientConfig) -> Result<Self> {
        let socket = socket.as_ref().to_path_buf();
        let channel = unix_channel(&socket, &config).await?;
        tracing::debug!(socket = %socket.display(), "connected to CSI driver");
        Ok(Self::from_channel(channel, socket, config))
    }

    /// Creates a client whose connection is made on first use (and re-made after failures). Must be called
    /// within a tokio runtime.
    pub fn connect_lazy(socket: impl AsRef<Path>, config: CsiClientConfig) -> Result<Self> {
        let socket = socket.as_ref().to_path_buf();
        let endpoint = Self::grpc_endpoint(&socket, &config)?;
        let channel = endpoint.connect_with_connector_lazy(unix_connector(socket.clone()));
        Ok(Self::from_channel(channel, socket, config))
    }

    fn from_channel(channel: Channel, socket: PathBuf, config: CsiClientConfig) -> Self {
        CsiClient {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
            socket,
            config,
        }
    }

    fn grpc_endpoint(socket: &Path, config: &CsiClientConfig) -> Result<Endpoint> {
        // The URI is required by tonic but ignored: the connector dials the unix socket.
        let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|e| CsiError::Connect {
            socket: socket.display().to_string(),
            reason: error_chain(&e),
        })?;
        Ok(endpoint.connect_timeout(config.connect_timeout))
    }

    /// The socket this client dials.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &CsiClientConfig {
        &self.config
    }

    /// Runs one unary call with the deadline, mapping errors and logging the outcome (never the request).
    async fn unary<Req, Resp, F, Fut>(&self, call: &'static str, message: Req, f: F) -> Result<Resp>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        // No `grpc-timeout` header: tonic would enforce it itself and race this deadline with CANCELLED.
        // Dropping the call on timeout resets the HTTP/2 stream, which cancels the driver's context too.
        let deadline = self.config.call_timeout;
        let started = tokio::time::Instant::now();
        let outcome = match tokio::time::timeout(deadline, f(tonic::Request::new(message))).await {
            Ok(r) => r.map(tonic::Response::into_inner).map_err(|s| CsiError::from_status(call, s)),
            Err(_) => Err(CsiError::Timeout { call, after: deadline }),
        };
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        match &outcome {
            Ok(_) => tracing::debug!(call, socket = %self.socket.display(), elapsed_ms, "CSI call ok"),
            Err(e) => tracing::debug!(
                call,
                socket = %self.socket.display(),
                elapsed_ms,
                uncertain = e.is_uncertain(),
                error = %e,
                "CSI call failed"
            ),
        }
        outcome
    }

    // ---------------------------------------------------------------- Identity

    /// `GetPluginInfo`. Fails with [`CsiError::InvalidResponse`] if the name is not a valid CSI driver name.
    pub async fn plugin_info(&self) -> Result<PluginInfo> {
        let mut c = self.identity.clone();
        let resp = self
            .unary("GetPluginInfo", v1::GetPluginInfoRequest {}, move |r| async move {
                c.get_plugin_info(r).await
            })
            .await?;
        validate_driver_name(&resp.name).map_err(|reason| CsiError::InvalidResponse {
            call: "GetPluginInfo",
            reason: format!("driver name {:?}: {reason}", resp.name),
        })?;
        Ok(PluginInfo {
            name: resp.name,
            vendor_version: resp.vendor_version,
            manifest: resp.manifest.into_iter().collect(),
        })
    }

    /// `GetPluginCapabilities`.
    pub async fn plugin_capabilities(&self) -> Result<PluginCapabilities> {
        use v1::plugin_capability::Type;
        use v1::plugin_capability::service::Type as Service;
        use v1::plugin_capability::volume_expansion::Type as Expansion;
        let mut c = self.identity.clone();
        let resp = self
            .unary("GetPluginCapabilities", v1::GetPluginCapabilitiesRequest {}, move |r| async move {
                c.get_plugin_capabilities(r).await
            })
            .await?;
        let mut caps = PluginCapabilities::default();
        for cap in resp.capabilities {
            match cap.r#type {
                Some(Type::Service(s)) => match Service::try_from(s.r#type) {
                    Ok(Service::ControllerService) => caps.controller_service = true,
                    Ok(Service::VolumeAccessibilityConstraints) => {
                        caps.volume_accessibility_constraints = true
                    }
                    Ok(Service::GroupControllerService) => caps.group_controller_service = true,
                    Ok(Service::Unknown) | Err(_) => {}
                },
                Some(Type::VolumeExpansion(e)) => match Expansion::try_from(e.r#type) {
                    Ok(Expansion::Online) => caps.online_expansion = true,
                    Ok(Expansion::Offline) => caps.offline_expansion = true,
                    Ok(Expansion::Unknown) | Err(_) => {}
                },
                None => {}
            }
        }
        Ok(caps)
    }

    /// `Probe`: whether the driver is ready (an unset `ready` means ready, per the specification).
    pub async fn probe(&self) -> Result<bool> {
        let mut c = self.identity.clone();
        let resp = self.unary("Probe", v1::ProbeRequest {}, move |r| async move { c.probe(r).await }).await?;
        Ok(resp.ready.unwrap_or(true))
    }

    // ---------------------------------------------------------------- Node

    /// `NodeGetInfo`. Fails with [`CsiError::InvalidResponse`] if the node ID is empty.
    pub async fn node_info(&self) -> Result<NodeInfo> {
        let mut c = self.node.clone();
        let resp = self
            .unary("NodeGetInfo", v1::NodeGetInfoRequest {}, move |r| async move { c.node_get_info(r).await })
            .await?;
        if resp.node_id.is_empty() {
            return Err(CsiError::InvalidResponse { call: "NodeGetInfo", reason: "empty node_id".into() });
        }
        Ok(NodeInfo {
            node_id: resp.node_id,
            max_volumes_per_node: u64::try_from(resp.max_volumes_per_node).ok().filter(|n| *n > 0),
            accessible_topology: resp
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
        })
    }

    /// `NodeGetCapabilities`.
    pub async fn node_capabilities(&self) -> Result<NodeCapabilities> {
        use v1::node_service_capability::Type;
        use v1::node_service_capability::rpc::Type as Rpc;
        let mut c = self.node.clone();
        let resp = self
            .unary("NodeGetCapabilities", v1::NodeGetCapabilitiesRequest {}, move |r| async move {
                c.node_get_capabilities(r).await
            })
            .await?;
        let mut caps = NodeCapabilities::default();
        for cap in resp.capabilities {
            let Some(Type::Rpc(rpc)) = cap.r#type else { continue };
            match Rpc::try_from(rpc.r#type) {
                Ok(Rpc::StageUnstageVolume) => caps.stage_unstage_volume = true,
                Ok(Rpc::GetVolumeStats) => caps.get_volume_stats = true,
                Ok(Rpc::ExpandVolume) => caps.expand_volume = true,
                Ok(Rpc::VolumeCondition) => caps.volume_condition = true,
                Ok(Rpc::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                Ok(Rpc::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(Rpc::Unknown) | Err(_) => {}
            }
        }
        Ok(caps)
    }

    /// `NodeStageVolume`: mounts the volume at its global (staging) path. After an
    /// [uncertain](CsiError::is_uncertain) error the volume may be staged.
    pub async fn node_stage(&self, request: v1::NodeStageVolumeRequest) -> Result<()> {
        let mut c = self.node.clone();
        self.unary("NodeStageVolume", request, move |r| async move { c.node_stage_volume(r).await })
            .await
            .map(drop)
    }

    /// `NodeUnstageVolume`: undoes [`node_stage`](Self::node_stage).
    pub async fn node_unstage(&self, volume_id: &str, staging_target_path: &Path) -> Result<()> {
        let mut c = self.node.clone();
        let req = v1::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: path_string(staging_target_path),
        };
        self.unary("NodeUnstageVolume", req, move |r| async move { c.node_unstage_volume(r).await })
            .await
            .map(drop)
    }

    /// `NodePublishVolume`: mounts the volume at the pod's target path. After an
    /// [uncertain](CsiError::is_uncertain) error the volume may be mounted there.
    pub async fn node_publish(&self, request: v1::NodePublishVolumeRequest) -> Result<()> {
        let mut c = self.node.clone();
        self.unary("NodePublishVolume", request, move |r| async move { c.node_publish_volume(r).await })
            .await
            .map(drop)
    }

    /// `NodeUnpublishVolume`: undoes [`node_publish`](Self::node_publish); the driver removes the target.
    pub async fn node_unpublish(&self, volume_id: &str, target_path: &Path) -> Result<()> {
        let mut c = self.node.clone();
        let req = v1::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: path_string(target_path),
        };
        self.unary("NodeUnpublishVolume", req, move |r| async move { c.node_unpublish_volume(r).await })
            .await
            .map(drop)
    }

    /// `NodeGetVolumeStats` for a volume published (or staged) at `volume_path`.
    pub async fn node_get_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &Path,
        staging_target_path: Option<&Path>,
    ) -> Result<VolumeStats> {
        use v1::volume_usage::Unit;
        let mut c = self.node.clone();
        let req = v1::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_owned(),
            volume_path: path_string(volume_path),
            staging_target_path: staging_target_path.map(path_string).unwrap_or_default(),
        };
        let resp = self
            .unary("NodeGetVolumeStats", req, move |r| async move { c.node_get_volume_stats(r).await })
            .await?;
        let mut stats = VolumeStats {
            condition: resp.volume_condition.map(|c| (c.abnormal, c.message)),
            ..VolumeStats::default()
        };
        for u in resp.usage {
            let usage = Usage {
                total: u64::try_from(u.total).unwrap_or(0),
                available: u64::try_from(u.available).unwrap_or(0),
                used: u64::try_from(u.used).unwrap_or(0),
            };
            match Unit::try_from(u.unit) {
                Ok(Unit::Bytes) => stats.bytes = Some(usage),
                Ok(Unit::Inodes) => stats.inodes = Some(usage),
                Ok(Unit::Unknown) | Err(_) => {}
            }
        }
        Ok(stats)
    }

    // ---------------------------------------------------------------- Controller

    /// `ControllerGetCapabilities`.
    pub async fn controller_capabilities(&self) -> Result<ControllerCapabilities> {
        use v1::controller_service_capability::Type;
        use v1::controller_service_capability::rpc::Type as Rpc;
        let mut c = self.controller.clone();
        let resp = self
            .unary(
                "ControllerGetCapabilities",
                v1::ControllerGetCapabilitiesRequest {},
                move |r| async move { c.controller_get_capabilities(r).await },
            )
            .await?;
        let mut caps = ControllerCapabilities::default();
        for cap in resp.capabilities {
            let Some(Type::Rpc(rpc)) = cap.r#type else { continue };
            match Rpc::try_from(rpc.r#type) {
                Ok(Rpc::CreateDeleteVolume) => caps.create_delete_volume = true,
                Ok(Rpc::PublishUnpublishVolume) => caps.publish_unpublish_volume = true,
                Ok(Rpc::ListVolumes) => caps.list_volumes = true,
                Ok(Rpc::GetCapacity) => caps.get_capacity = true,
                Ok(Rpc::CreateDeleteSnapshot) => caps.create_delete_snapshot = true,
                Ok(Rpc::ListSnapshots) => caps.list_snapshots = true,
                Ok(Rpc::CloneVolume) => caps.clone_volume = true,
                Ok(Rpc::PublishReadonly) => caps.publish_readonly = true,
                Ok(Rpc::ExpandVolume) => caps.expand_volume = true,
                Ok(Rpc::ListVolumesPublishedNodes) => caps.list_volumes_published_nodes = true,
                Ok(Rpc::VolumeCondition) => caps.volume_condition = true,
                Ok(Rpc::GetVolume) => caps.get_volume = true,
                Ok(Rpc::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                Ok(Rpc::ModifyVolume) => caps.modify_volume = true,
                Ok(Rpc::Unknown) | Err(_) => {}
            }
        }
        Ok(caps)
    }

    /// `CreateVolume`: provisions (or, for a name seen before, returns) a volume. Fails with
    /// [`CsiError::InvalidResponse`] if the response has no volume or an empty volume ID.
    pub async fn create_volume(&self, request: v1::CreateVolumeRequest) -> Result<v1::Volume> {
        let mut c = self.controller.clone();
        let resp =
            self.unary("CreateVolume", request, move |r| async move { c.create_volume(r).await }).await?;
        match resp.volume {
            Some(v) if !v.volume_id.is_empty() => Ok(v),
            Some(_) => {
                Err(CsiError::InvalidResponse { call: "CreateVolume", reason: "empty volume_id".into() })
            }
            None => Err(CsiError::InvalidResponse { call: "CreateVolume", reason: "no volume".into() }),
        }
    }

    /// `DeleteVolume`. Succeeds for a volume that does not exist (the specification requires it).
    pub async fn delete_volume(&self, volume_id: &str, secrets: HashMap<String, String>) -> Result<()> {
        let mut c = self.controller.clone();
        let req = v1::DeleteVolumeRequest { volume_id: volume_id.to_owned(), secrets };
        self.unary("DeleteVolume", req, move |r| async move { c.delete_volume(r).await }).await.map(drop)
    }

    /// `ControllerPublishVolume` (attach): returns the publish context to pass to the node calls.
    pub async fn controller_publish(
        &self,
        request: v1::ControllerPublishVolumeRequest,
    ) -> Result<HashMap<String, String>> {
        let mut c = self.controller.clone();
        let resp = self
            .unary("ControllerPublishVolume", request, move |r| async move {
                c.controller_publish_volume(r).await
            })
            .await?;
        Ok(resp.publish_context)
    }

    /// `ControllerUnpublishVolume` (detach) from `node_id` (from every node when `None`).
    pub async fn controller_unpublish(
        &self,
        volume_id: &str,
        node_id: Option<&str>,
        secrets: HashMap<String, String>,
    ) -> Result<()> {
        let mut c = self.controller.clone();
        let req = v1::ControllerUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            node_id: node_id.unwrap_or_default().to_owned(),
            secrets,
        };
        self.unary("ControllerUnpublishVolume", req, move |r| async move {
            c.controller_unpublish_volume(r).await
        })
        .await
        .map(drop)
    }
}

/// A path as the string CSI carries (non-UTF-8 bytes replaced; nodelet's own paths are UTF-8).
fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        for ok in ["hostpath.csi.nodelet.dev", "a", "ebs.csi.aws.com", "A-1.b"] {
            assert_eq!(validate_driver_name(ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in ["", ".", "..", "a/b", "-a", "a-", "a_b", "a b", long.as_str(), "ä"] {
            assert!(validate_driver_name(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(socket_path("unix:///run/csi.sock").unwrap(), PathBuf::from("/run/csi.sock"));
        assert_eq!(socket_path("unix:/run/csi.sock").unwrap(), PathBuf::from("/run/csi.sock"));
        assert_eq!(socket_path("/run/csi.sock").unwrap(), PathBuf::from("/run/csi.sock"));
        for bad in ["tcp://127.0.0.1:1", "unix://", "relative.sock", "unix://relative.sock", ""] {
            assert!(socket_path(bad).is_err(), "{bad:?} must be rejected");
        }
    }
}
