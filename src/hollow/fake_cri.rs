//! The fake container runtime of a hollow node: a CRI server (`runtime.v1` RuntimeService and
//! ImageService) that keeps sandboxes, containers and images in memory and runs nothing, as kubemark's
//! fake remote runtime does for the hollow kubelet.
//!
//! What it does:
//! - `RunPodSandbox` gives every sandbox (but host-network ones) a made-up IP from the node's own /24
//!   ([`FakeCri::new`]); `RemovePodSandbox` gives it back and removes the sandbox's containers.
//! - Containers go created → running (`StartContainer`) → exited with code 0 (`StopContainer`) and never
//!   exit on their own: a pod whose containers are meant to finish (or an init container) stays
//!   running, as with kubemark.
//! - `PullImage` records the image (1 MiB, a made-up `sha256:` id); `ImageFsInfo` reports the node's
//!   directory as the image filesystem.
//! - `ExecSync` succeeds with no output (exec probes pass); streaming `Exec`, `Attach`, `PortForward` and
//!   `CheckpointContainer` are not served (`UNIMPLEMENTED`).
//! - `GetContainerEvents` streams each container's and sandbox's creation, start, stop and removal (CRI
//!   `CONTAINER_*_EVENT`, the ID and the time only), as containerd 1.7 and 2.x do: the node's
//!   PLEG runs evented, as on a real node (a relist every `plegEventedRelistPeriod`, 60 s, instead of every
//!   second). A subscriber that falls more than [`EVENT_QUEUE`] events behind gets its stream ended with
//!   `ABORTED` (the node reconnects and relists); nothing is replayed.
//! - Stats calls answer with no entries.
//!
//! Every answer is built from what the node sent; nothing a request carries reaches a file, a mount or a
//! process.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_cri::v1;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tonic::{Request, Response, Status};

/// The size every fake image reports.
const IMAGE_SIZE: u64 = 1 << 20;

/// The most concurrent calls (HTTP/2 streams) the node's CRI client may have open on its connection; more
/// wait in the client. h2 keeps the slabs of its stream store and frame queues at their peak size on both
/// ends, so this bounds what a node's start-up burst leaves behind (the runtime answers at once, so the
/// calls hardly wait).
const MAX_CONCURRENT_STREAMS: u32 = 16;

/// The HTTP/2 flow-control windows of the connection and of each stream: the protocol's default, which
/// the runtime's small messages never fill (hyper's server would announce 1 MiB).
const WINDOW: u32 = 65_535;

/// How many container events a subscriber may fall behind before its stream is ended.
const EVENT_QUEUE: usize = 32;

/// Errors of serving the fake runtime.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FakeCriError {
    /// The socket cannot be made or bound.
    #[error("fake runtime socket {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("fake runtime on {path}: {source}")]
    Serve {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Labels or annotations as a record keeps them: the pairs sorted by key, each value without spare
/// capacity, each key shared with every record of the process that has it ([`interned`]; a decoded
/// `HashMap<String, String>` has room for more entries than it holds, and buckets of 48 bytes each).
/// Answers get a map built from them, as they would get a copy of a kept map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pairs(Box<[(Arc<str>, Box<str>)]>);

/// The one copy of label or annotation key `key` in the process. Every sandbox and container of every
/// hollow node has the same dozen keys or so (`io.kubernetes.pod.uid`, `io.kubernetes.container.hash`,
/// …), tens of bytes each, so the records share them. Keys are never forgotten: the set is as large as
/// the distinct keys the pods' sandboxes and containers have had.
fn interned(key: String) -> Arc<str> {
    static KEYS: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut keys = KEYS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(shared) = keys.get(key.as_str()) {
        return shared.clone();
    }
    let shared: Arc<str> = Arc::from(key);
    keys.insert(shared.clone());
    shared
}

impl Pairs {
    fn new(map: HashMap<String, String>) -> Self {
        let mut pairs: Vec<_> = map.into_iter().map(|(k, v)| (interned(k), v.into_boxed_str())).collect();
        pairs.sort_unstable();
        Self(pairs.into_boxed_slice())
    }

    fn get(&self, key: &str) -> Option<&str> {
        let found = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        self.0.get(found).map(|(_, v)| &**v)
    }

    fn to_map(&self) -> HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

/// A sandbox as the runtime keeps it: its status as `PodSandboxStatus` answers it, the labels and
/// annotations kept apart ([`Pairs`]).
#[derive(Debug, Clone)]
struct Sandbox {
    /// The status, without labels and annotations.
    status: v1::PodSandboxStatus,
    labels: Pairs,
    annotations: Pairs,
    /// The host part of its IP in the node's /24 (none for host-network sandboxes).
    ip_host: Option<u8>,
    log_directory: Box<str>,
}

impl Sandbox {
    /// The status as `PodSandboxStatus` answers it.
    fn status(&self) -> v1::PodSandboxStatus {
        v1::PodSandboxStatus {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.status.clone()
        }
    }
}

/// A container as the runtime keeps it: its status as `ContainerStatus` answers it, the labels and
/// annotations kept apart ([`Pairs`]).
#[derive(Debug, Clone)]
struct Container {
    sandbox: Box<str>,
    /// The status, without labels and annotations.
    status: v1::ContainerStatus,
    labels: Pairs,
    annotations: Pairs,
}

impl Container {
    /// The status as `ContainerStatus` answers it.
    fn status(&self) -> v1::ContainerStatus {
        v1::ContainerStatus {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.status.clone()
        }
    }
}

/// The records are boxed: a map keeps room for up to twice the entries it holds (30 containers take a
/// table of 64 buckets), and a `Container` or `Sandbox` is hundreds of bytes, so spare buckets hold a
/// pointer each instead of a record.
#[derive(Debug, Default)]
struct State {
    sandboxes: HashMap<String, Box<Sandbox>>,
    containers: HashMap<String, Box<Container>>,
    /// Image id → image.
    images: HashMap<String, v1::Image>,
    /// Host parts of the node's /24 in use.
    ips_in_use: BTreeSet<u8>,
}

/// One node's fake runtime (cheap to clone: the state is shared).
#[derive(Debug, Clone)]
pub(crate) struct FakeCri {
    state: Arc<Mutex<State>>,
    /// The node's pod network: `subnet.1` to `subnet.254`.
    subnet: [u8; 3],
    /// Reported as the image filesystem's mountpoint.
    image_fs: PathBuf,
    /// The container events (ID, CRI `ContainerEventType`, when in nanoseconds since the epoch) to
    /// `GetContainerEvents` subscribers.
    events: tokio::sync::broadcast::Sender<(Box<str>, v1::ContainerEventType, i64)>,
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn new_id() -> String {
    format!("{:032x}{:032x}", fastrand::u128(..), fastrand::u128(..))
}

fn not_found(what: &str, id: &str) -> Status {
    Status::not_found(format!("{what} {id:?} not found"))
}

/// Whether `labels` has every pair of `selector`.
fn selected(labels: &Pairs, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v.as_str()))
}

/// The made-up id of image `name` (the same name gives the same id).
fn image_id(name: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl FakeCri {
    /// The runtime of hollow node number `index`: its pods get IPs in `10.(64 + index / 256).(index % 256).0/24`
    /// (up to 16,384 nodes of 254 pods); `image_fs` is the directory reported as its image filesystem.
    pub(crate) fn new(index: u32, image_fs: impl Into<PathBuf>) -> Self {
        let [_, _, hi, lo] = (index % (1 << 14)).to_be_bytes();
        let (events, _) = tokio::sync::broadcast::channel(EVENT_QUEUE);
        Self { state: Arc::default(), subnet: [10, 64 + hi, lo], image_fs: image_fs.into(), events }
    }

    /// Tells the event subscribers, if any, that container `id` had event `kind`.
    fn emit(&self, id: &str, kind: v1::ContainerEventType) {
        // No subscriber: nobody to tell (events are not replayed).
        if self.events.receiver_count() > 0 {
            let _ = self.events.send((id.into(), kind, now_nanos()));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind: keep serving them.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many sandboxes and containers it holds.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.sandboxes.len(), state.containers.len())
    }

    /// The sizes of the values of its sandbox and container maps.
    #[cfg(test)]
    pub(crate) fn record_value_sizes() -> (usize, usize) {
        fn value_size<K, V>(_: &HashMap<K, V>) -> usize {
            std::mem::size_of::<V>()
        }
        let state = State::default();
        (value_size(&state.sandboxes), value_size(&state.containers))
    }

    /// Serves the runtime on the unix socket `path` until `stop` is cancelled (a stale socket file is
    /// replaced).
    pub(crate) async fn serve(
        self,
        path: &Path,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), FakeCriError> {
        let socket_err = |source| FakeCriError::Socket { path: path.to_owned(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(socket_err)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(socket_err(e)),
        }
        let listener = tokio::net::UnixListener::bind(path).map_err(socket_err)?;
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let conn = listener.accept().await.map(|(stream, _)| stream);
            Some((conn, listener))
        });
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .add_service(RuntimeServiceServer::new(self.clone()))
            .add_service(ImageServiceServer::new(self))
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await;
        let _ = std::fs::remove_file(path);
        served.map_err(|source| FakeCriError::Serve { path: path.to_owned(), source })
    }

    fn sandbox_state(s: &Sandbox) -> i32 {
        s.status.state
    }

    fn container_of(c: &Container) -> v1::Container {
        let s = &c.status;
        v1::Container {
            id: s.id.clone(),
            pod_sandbox_id: c.sandbox.to_string(),
            metadata: s.metadata.clone(),
            image: s.image.clone(),
            image_ref: s.image_ref.clone(),
            state: s.state,
            created_at: s.created_at,
            labels: c.labels.to_map(),
            annotations: c.annotations.to_map(),
            image_id: s.image_id.clone(),
        }
    }

    fn run_sandbox(&self, config: v1::PodSandboxConfig, runtime_handler: String) -> Result<String, Status> {
        let node = v1::NamespaceMode::Node as i32;
        let namespaces = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
        let host_network = namespaces.as_ref().is_some_and(|n| n.network == node);
        let mut state = self.lock();
        let ip_host = if host_network {
            None
        } else {
            let free = (1..=254u8).find(|h| !state.ips_in_use.contains(h)).ok_or_else(|| {
                Status::resource_exhausted("no free IP left in the hollow node's /24 (254 pods)")
            })?;
            state.ips_in_use.insert(free);
            Some(free)
        };
        let [a, b, c] = self.subnet;
        let ip = ip_host.map(|h| Ipv4Addr::new(a, b, c, h).to_string()).unwrap_or_default();
        let id = new_id();
        let status = v1::PodSandboxStatus {
            id: id.clone(),
            metadata: config.metadata,
            state: v1::PodSandboxState::SandboxReady as i32,
            created_at: now_nanos(),
            network: Some(v1::PodSandboxNetworkStatus { ip, additional_ips: Vec::new() }),
            linux: Some(v1::LinuxPodSandboxStatus {
                namespaces: Some(v1::Namespace { options: namespaces }),
            }),
            labels: HashMap::new(),
            annotations: HashMap::new(),
            runtime_handler,
        };
        let sandbox = Sandbox {
            status,
            labels: Pairs::new(config.labels),
            annotations: Pairs::new(config.annotations),
            ip_host,
            log_directory: config.log_directory.into_boxed_str(),
        };
        state.sandboxes.insert(id.clone(), Box::new(sandbox));
        Ok(id)
    }

    fn create(&self, sandbox_id: &str, config: v1::ContainerConfig) -> Result<String, Status> {
        let mut state = self.lock();
        let sandbox = state.sandboxes.get(sandbox_id).ok_or_else(|| not_found("sandbox", sandbox_id))?;
        if Self::sandbox_state(sandbox) != v1::PodSandboxState::SandboxReady as i32 {
            return Err(Status::failed_precondition(format!("sandbox {sandbox_id:?} is not ready")));
        }
        let log_path = if config.log_path.is_empty() || sandbox.log_directory.is_empty() {
            String::new()
        } else {
            Path::new(&*sandbox.log_directory).join(&config.log_path).to_string_lossy().into_owned()
        };
        let image_name = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        let image_ref = state
            .images
            .values()
            .find(|i| i.repo_tags.contains(&image_name) || i.id == image_name)
            .map_or_else(|| image_id(&image_name), |i| i.id.clone());
        let id = new_id();
        let status = v1::ContainerStatus {
            id: id.clone(),
            metadata: config.metadata,
            state: v1::ContainerState::ContainerCreated as i32,
            created_at: now_nanos(),
            image: config.image,
            image_ref: image_ref.clone(),
            image_id: image_ref,
            mounts: {
                let mut mounts = config.mounts;
                mounts.shrink_to_fit();
                mounts
            },
            log_path,
            ..Default::default()
        };
        let container = Container {
            sandbox: sandbox_id.into(),
            status,
            labels: Pairs::new(config.labels),
            annotations: Pairs::new(config.annotations),
        };
        state.containers.insert(id.clone(), Box::new(container));
        Ok(id)
    }

    /// Stops `container` if it is created or running; whether it did.
    fn stop_one(container: &mut Container) -> bool {
        let s = &mut container.status;
        let stops = s.state == v1::ContainerState::ContainerRunning as i32
            || s.state == v1::ContainerState::ContainerCreated as i32;
        if stops {
            s.state = v1::ContainerState::ContainerExited as i32;
            s.finished_at = now_nanos();
            s.exit_code = 0;
            s.reason = "Completed".into();
        }
        stops
    }
}

type RpcResult<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl RuntimeService for FakeCri {
    async fn version(&self, _: Request<v1::VersionRequest>) -> RpcResult<v1::VersionResponse> {
        Ok(Response::new(v1::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "nodelet-hollow".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<v1::RunPodSandboxRequest>,
    ) -> RpcResult<v1::RunPodSandboxResponse> {
        let r = request.into_inner();
        let config = r.config.ok_or_else(|| Status::invalid_argument("no sandbox config"))?;
        let pod_sandbox_id = self.run_sandbox(config, r.runtime_handler)?;
        self.emit(&pod_sandbox_id, v1::ContainerEventType::ContainerCreatedEvent);
        self.emit(&pod_sandbox_id, v1::ContainerEventType::ContainerStartedEvent);
        Ok(Response::new(v1::RunPodSandboxResponse { pod_sandbox_id }))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<v1::StopPodSandboxRequest>,
    ) -> RpcResult<v1::StopPodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        let mut state = self.lock();
        for c in state.containers.values_mut().filter(|c| *c.sandbox == *id) {
            if Self::stop_one(c) {
                self.emit(&c.status.id, v1::ContainerEventType::ContainerStoppedEvent);
            }
        }
        // CRI: stopping an unknown sandbox is not an error.
        if let Some(s) = state.sandboxes.get_mut(&id)
            && s.status.state == v1::PodSandboxState::SandboxReady as i32
        {
            s.status.state = v1::PodSandboxState::SandboxNotready as i32;
            self.emit(&id, v1::ContainerEventType::ContainerStoppedEvent);
        }
        Ok(Response::new(v1::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<v1::RemovePodSandboxRequest>,
    ) -> RpcResult<v1::RemovePodSandboxResponse> {
        let id = request.into_inner().pod_sandbox_id;
        let mut state = self.lock();
        state.containers.retain(|cid, c| {
            let keep = *c.sandbox != *id;
            if !keep {
                self.emit(cid, v1::ContainerEventType::ContainerDeletedEvent);
            }
            keep
        });
        if let Some(s) = state.sandboxes.remove(&id) {
            if let Some(h) = s.ip_host {
                state.ips_in_use.remove(&h);
            }
            self.emit(&id, v1::ContainerEventType::ContainerDeletedEvent);
        }
        Ok(Response::new(v1::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<v1::PodSandboxStatusRequest>,
    ) -> RpcResult<v1::PodSandboxStatusResponse> {
        let id = request.into_inner().pod_sandbox_id;
        let state = self.lock();
        let s = state.sandboxes.get(&id).ok_or_else(|| not_found("sandbox", &id))?;
        Ok(Response::new(v1::PodSandboxStatusResponse {
            status: Some(s.status()),
            timestamp: now_nanos(),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<v1::ListPodSandboxRequest>,
    ) -> RpcResult<v1::ListPodSandboxResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let state = self.lock();
        let items = state
            .sandboxes
            .values()
            .filter(|s| filter.id.is_empty() || s.status.id == filter.id)
            .filter(|s| filter.state.as_ref().is_none_or(|f| f.state == s.status.state))
            .filter(|s| selected(&s.labels, &filter.label_selector))
            .map(|s| v1::PodSandbox {
                id: s.status.id.clone(),
                metadata: s.status.metadata.clone(),
                state: s.status.state,
                created_at: s.status.created_at,
                labels: s.labels.to_map(),
                annotations: s.annotations.to_map(),
                runtime_handler: s.status.runtime_handler.clone(),
            })
            .collect();
        Ok(Response::new(v1::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        request: Request<v1::CreateContainerRequest>,
    ) -> RpcResult<v1::CreateContainerResponse> {
        let r = request.into_inner();
        let config = r.config.ok_or_else(|| Status::invalid_argument("no container config"))?;
        let container_id = self.create(&r.pod_sandbox_id, config)?;
        self.emit(&container_id, v1::ContainerEventType::ContainerCreatedEvent);
        Ok(Response::new(v1::CreateContainerResponse { container_id }))
    }

    async fn start_container(
        &self,
        request: Request<v1::StartContainerRequest>,
    ) -> RpcResult<v1::StartContainerResponse> {
        let id = request.into_inner().container_id;
        let mut state = self.lock();
        let c = state.containers.get_mut(&id).ok_or_else(|| not_found("container", &id))?;
        if c.status.state != v1::ContainerState::ContainerCreated as i32 {
            return Err(Status::failed_precondition(format!("container {id:?} is not in the created state")));
        }
        c.status.state = v1::ContainerState::ContainerRunning as i32;
        c.status.started_at = now_nanos();
        self.emit(&id, v1::ContainerEventType::ContainerStartedEvent);
        Ok(Response::new(v1::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        request: Request<v1::StopContainerRequest>,
    ) -> RpcResult<v1::StopContainerResponse> {
        let id = request.into_inner().container_id;
        let mut state = self.lock();
        let c = state.containers.get_mut(&id).ok_or_else(|| not_found("container", &id))?;
        if Self::stop_one(c) {
            self.emit(&id, v1::ContainerEventType::ContainerStoppedEvent);
        }
        Ok(Response::new(v1::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        request: Request<v1::RemoveContainerRequest>,
    ) -> RpcResult<v1::RemoveContainerResponse> {
        let id = request.into_inner().container_id;
        // CRI: removing a container that is not there is not an error.
        if self.lock().containers.remove(&id).is_some() {
            self.emit(&id, v1::ContainerEventType::ContainerDeletedEvent);
        }
        Ok(Response::new(v1::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        request: Request<v1::ListContainersRequest>,
    ) -> RpcResult<v1::ListContainersResponse> {
        let filter = request.into_inner().filter.unwrap_or_default();
        let state = self.lock();
        let containers = state
            .containers
            .values()
            .filter(|c| filter.id.is_empty() || c.status.id == filter.id)
            .filter(|c| filter.pod_sandbox_id.is_empty() || *c.sandbox == *filter.pod_sandbox_id)
            .filter(|c| filter.state.as_ref().is_none_or(|f| f.state == c.status.state))
            .filter(|c| selected(&c.labels, &filter.label_selector))
            .map(|c| Self::container_of(c))
            .collect();
        Ok(Response::new(v1::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        request: Request<v1::ContainerStatusRequest>,
    ) -> RpcResult<v1::ContainerStatusResponse> {
        let id = request.into_inner().container_id;
        let state = self.lock();
        let c = state.containers.get(&id).ok_or_else(|| not_found("container", &id))?;
        Ok(Response::new(v1::ContainerStatusResponse { status: Some(c.status()), info: HashMap::new() }))
    }

    async fn update_container_resources(
        &self,
        request: Request<v1::UpdateContainerResourcesRequest>,
    ) -> RpcResult<v1::UpdateContainerResourcesResponse> {
        let r = request.into_inner();
        let mut state = self.lock();
        let c = state
            .containers
            .get_mut(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        c.status.resources = Some(v1::ContainerResources { linux: r.linux, windows: r.windows });
        Ok(Response::new(v1::UpdateContainerResourcesResponse {}))
    }

    async fn reopen_container_log(
        &self,
        request: Request<v1::ReopenContainerLogRequest>,
    ) -> RpcResult<v1::ReopenContainerLogResponse> {
        let id = request.into_inner().container_id;
        if !self.lock().containers.contains_key(&id) {
            return Err(not_found("container", &id));
        }
        Ok(Response::new(v1::ReopenContainerLogResponse {}))
    }

    async fn exec_sync(&self, request: Request<v1::ExecSyncRequest>) -> RpcResult<v1::ExecSyncResponse> {
        let id = request.into_inner().container_id;
        let state = self.lock();
        let c = state.containers.get(&id).ok_or_else(|| not_found("container", &id))?;
        if c.status.state != v1::ContainerState::ContainerRunning as i32 {
            return Err(Status::failed_precondition(format!("container {id:?} is not running")));
        }
        Ok(Response::new(v1::ExecSyncResponse { stdout: Vec::new(), stderr: Vec::new(), exit_code: 0 }))
    }

    async fn exec(&self, _: Request<v1::ExecRequest>) -> RpcResult<v1::ExecResponse> {
        Err(Status::unimplemented("a hollow node runs no processes: exec is not served"))
    }

    async fn attach(&self, _: Request<v1::AttachRequest>) -> RpcResult<v1::AttachResponse> {
        Err(Status::unimplemented("a hollow node runs no processes: attach is not served"))
    }

    async fn port_forward(&self, _: Request<v1::PortForwardRequest>) -> RpcResult<v1::PortForwardResponse> {
        Err(Status::unimplemented("a hollow node has no pod network: port-forward is not served"))
    }

    async fn container_stats(
        &self,
        request: Request<v1::ContainerStatsRequest>,
    ) -> RpcResult<v1::ContainerStatsResponse> {
        let id = request.into_inner().container_id;
        if !self.lock().containers.contains_key(&id) {
            return Err(not_found("container", &id));
        }
        Ok(Response::new(v1::ContainerStatsResponse { stats: None }))
    }

    async fn list_container_stats(
        &self,
        _: Request<v1::ListContainerStatsRequest>,
    ) -> RpcResult<v1::ListContainerStatsResponse> {
        Ok(Response::new(v1::ListContainerStatsResponse { stats: Vec::new() }))
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<v1::PodSandboxStatsRequest>,
    ) -> RpcResult<v1::PodSandboxStatsResponse> {
        let id = request.into_inner().pod_sandbox_id;
        if !self.lock().sandboxes.contains_key(&id) {
            return Err(not_found("sandbox", &id));
        }
        Ok(Response::new(v1::PodSandboxStatsResponse { stats: None }))
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<v1::ListPodSandboxStatsRequest>,
    ) -> RpcResult<v1::ListPodSandboxStatsResponse> {
        Ok(Response::new(v1::ListPodSandboxStatsResponse { stats: Vec::new() }))
    }

    async fn update_runtime_config(
        &self,
        _: Request<v1::UpdateRuntimeConfigRequest>,
    ) -> RpcResult<v1::UpdateRuntimeConfigResponse> {
        Ok(Response::new(v1::UpdateRuntimeConfigResponse {}))
    }

    async fn status(&self, _: Request<v1::StatusRequest>) -> RpcResult<v1::StatusResponse> {
        let condition = |t: &str| v1::RuntimeCondition {
            r#type: t.to_owned(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        Ok(Response::new(v1::StatusResponse {
            status: Some(v1::RuntimeStatus {
                conditions: vec![
                    condition(nodelet_cri::RUNTIME_READY),
                    condition(nodelet_cri::NETWORK_READY),
                ],
            }),
            ..Default::default()
        }))
    }

    async fn checkpoint_container(
        &self,
        _: Request<v1::CheckpointContainerRequest>,
    ) -> RpcResult<v1::CheckpointContainerResponse> {
        Err(Status::unimplemented("a hollow node does not checkpoint containers"))
    }

    type GetContainerEventsStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::ContainerEventResponse, Status>> + Send>>;

    async fn get_container_events(
        &self,
        _: Request<v1::GetEventsRequest>,
    ) -> RpcResult<Self::GetContainerEventsStream> {
        use tokio::sync::broadcast::error::RecvError;
        // Subscribed before the answer: an event after it is not missed.
        let events = self.events.subscribe();
        let stream = futures::stream::unfold(Some(events), |events| async move {
            let mut events = events?;
            match events.recv().await {
                Ok((id, kind, at)) => {
                    let event = v1::ContainerEventResponse {
                        container_id: id.into(),
                        container_event_type: kind as i32,
                        created_at: at,
                        ..Default::default()
                    };
                    Some((Ok(event), Some(events)))
                }
                // Fell behind: end the stream with an error (the subscriber reconnects and relists).
                Err(RecvError::Lagged(n)) => Some((
                    Err(Status::aborted(format!("{n} container events were dropped: too slow a reader"))),
                    None,
                )),
                Err(RecvError::Closed) => None,
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<v1::ListMetricDescriptorsRequest>,
    ) -> RpcResult<v1::ListMetricDescriptorsResponse> {
        Ok(Response::new(v1::ListMetricDescriptorsResponse { descriptors: Vec::new() }))
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<v1::ListPodSandboxMetricsRequest>,
    ) -> RpcResult<v1::ListPodSandboxMetricsResponse> {
        Ok(Response::new(v1::ListPodSandboxMetricsResponse { pod_metrics: Vec::new() }))
    }

    async fn runtime_config(
        &self,
        _: Request<v1::RuntimeConfigRequest>,
    ) -> RpcResult<v1::RuntimeConfigResponse> {
        Ok(Response::new(v1::RuntimeConfigResponse {
            linux: Some(v1::LinuxRuntimeConfiguration { cgroup_driver: v1::CgroupDriver::Cgroupfs as i32 }),
        }))
    }
}

#[tonic::async_trait]
impl ImageService for FakeCri {
    async fn list_images(
        &self,
        request: Request<v1::ListImagesRequest>,
    ) -> RpcResult<v1::ListImagesResponse> {
        let wanted = request.into_inner().filter.and_then(|f| f.image).map(|i| i.image).unwrap_or_default();
        let state = self.lock();
        let images = state
            .images
            .values()
            .filter(|i| wanted.is_empty() || i.id == wanted || i.repo_tags.contains(&wanted))
            .cloned()
            .collect();
        Ok(Response::new(v1::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<v1::ImageStatusRequest>,
    ) -> RpcResult<v1::ImageStatusResponse> {
        let name = request.into_inner().image.map(|i| i.image).unwrap_or_default();
        let state = self.lock();
        let image = state.images.values().find(|i| i.id == name || i.repo_tags.contains(&name)).cloned();
        Ok(Response::new(v1::ImageStatusResponse { image, info: HashMap::new() }))
    }

    async fn pull_image(&self, request: Request<v1::PullImageRequest>) -> RpcResult<v1::PullImageResponse> {
        let spec = request.into_inner().image.ok_or_else(|| Status::invalid_argument("no image"))?;
        if spec.image.is_empty() {
            return Err(Status::invalid_argument("empty image name"));
        }
        let id = image_id(&spec.image);
        let mut state = self.lock();
        let image = state.images.entry(id.clone()).or_insert_with(|| v1::Image {
            id: id.clone(),
            size: IMAGE_SIZE,
            spec: Some(v1::ImageSpec { image: id.clone(), ..Default::default() }),
            ..Default::default()
        });
        if !image.repo_tags.contains(&spec.image) {
            image.repo_tags.push(spec.image);
        }
        Ok(Response::new(v1::PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        request: Request<v1::RemoveImageRequest>,
    ) -> RpcResult<v1::RemoveImageResponse> {
        let name = request.into_inner().image.map(|i| i.image).unwrap_or_default();
        let mut state = self.lock();
        state.images.retain(|id, i| *id != name && !i.repo_tags.contains(&name));
        Ok(Response::new(v1::RemoveImageResponse {}))
    }

    async fn image_fs_info(&self, _: Request<v1::ImageFsInfoRequest>) -> RpcResult<v1::ImageFsInfoResponse> {
        let used: u64 = self.lock().images.values().map(|i| i.size).sum();
        let usage = v1::FilesystemUsage {
            timestamp: now_nanos(),
            fs_id: Some(v1::FilesystemIdentifier {
                mountpoint: self.image_fs.to_string_lossy().into_owned(),
            }),
            used_bytes: Some(v1::UInt64Value { value: used }),
            inodes_used: Some(v1::UInt64Value { value: 0 }),
        };
        Ok(Response::new(v1::ImageFsInfoResponse {
            image_filesystems: vec![usage],
            container_filesystems: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_share_their_keys_and_keep_their_values() {
        let map = |uid: &str| {
            HashMap::from([
                ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
                ("io.kubernetes.pod.namespace".to_owned(), "default".to_owned()),
            ])
        };
        let (a, b) = (Pairs::new(map("a")), Pairs::new(map("b")));
        assert_eq!(a.get("io.kubernetes.pod.uid"), Some("a"));
        assert_eq!(b.get("io.kubernetes.pod.uid"), Some("b"));
        assert_eq!(a.to_map(), map("a"));
        for ((ka, _), (kb, _)) in a.0.iter().zip(b.0.iter()) {
            assert_eq!(ka, kb);
            assert!(Arc::ptr_eq(ka, kb), "one copy of {ka}");
        }
    }
}
