//! The CRI v1 client.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::CriConfig;
use crate::error::{CriError, Result};
use crate::events::{EventsConfig, RuntimeEventFeed, RuntimeEventStream};
use crate::filter::{ContainerFilter, SandboxFilter};

/// The CRI API version string sent in `Version` requests (the kubelet sends the same).
pub(crate) const CRI_CLIENT_VERSION: &str = "0.1.0";

/// Name of the CRI condition that reports the runtime itself is ready.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// Name of the CRI condition that reports pod networking (CNI) is ready.
pub const NETWORK_READY: &str = "NetworkReady";

/// Async client for the CRI v1 runtime and image services of a container runtime on a unix socket.
///
/// One gRPC channel (one HTTP/2 connection, multiplexed) is shared by all clones, so clone freely: a clone
/// costs a few reference counts. The channel reconnects by itself after the runtime restarts; calls made while
/// the runtime is down fail with an [`is_unavailable`](CriError::is_unavailable) error.
///
/// Every call has a deadline (see [`CriConfig`]); when it expires the call is cancelled — the HTTP/2 stream is
/// reset, which cancels the request in the runtime too — and [`CriError::Timeout`] is returned. The client
/// never retries: retry policy belongs to the reconcilers.
#[derive(Debug, Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    channel: Channel,
    config: CriConfig,
    /// Shared by every clone, so metrics installed later count the calls of earlier clones too.
    metrics: Arc<OnceLock<CriMetrics>>,
    /// Whether the runtime may be asked for sandbox stats, once known; shared by every clone.
    sandbox_stats_safe: Arc<tokio::sync::OnceCell<bool>>,
}

/// The kubelet's metrics of runtime calls, labelled `operation_type` with the kubelet's names
/// (`run_podsandbox`, `list_containers`, `pull_image`…): `kubelet_runtime_operations_total`,
/// `kubelet_runtime_operations_errors_total` and the histogram `kubelet_runtime_operations_duration_seconds`
/// (buckets 0.005 s × 2.5ⁿ, 14 of them).
#[derive(Debug, Clone)]
pub struct CriMetrics {
    total: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
}

impl CriMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &prometheus::Registry) -> std::result::Result<Self, prometheus::Error> {
        let total = IntCounterVec::new(
            Opts::new(
                "kubelet_runtime_operations_total",
                "Cumulative number of runtime operations by operation type.",
            ),
            &["operation_type"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "kubelet_runtime_operations_errors_total",
                "Cumulative number of runtime operation errors by operation type.",
            ),
            &["operation_type"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations. Broken down by operation type.",
            )
            .buckets(prometheus::exponential_buckets(0.005, 2.5, 14)?),
            &["operation_type"],
        )?;
        registry.register(Box::new(total.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(Self { total, errors, duration })
    }

    fn record(&self, call: &'static str, elapsed: Duration, failed: bool) {
        let op = operation_type(call);
        self.total.with_label_values(&[&op]).inc();
        if failed {
            self.errors.with_label_values(&[&op]).inc();
        }
        self.duration.with_label_values(&[&op]).observe(elapsed.as_secs_f64());
    }
}

/// The kubelet's `operation_type` of a CRI call: `RunPodSandbox` → `run_podsandbox`,
/// `ListContainerStats` → `list_container_stats`.
fn operation_type(call: &str) -> String {
    let call = call.replace("PodSandbox", "Podsandbox");
    let mut out = String::with_capacity(call.len() + 4);
    for (i, ch) in call.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// Readiness of the runtime as reported by CRI `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeReadiness {
    /// The `RuntimeReady` condition is true.
    pub runtime_ready: bool,
    /// The `NetworkReady` condition is true (CNI configured and working).
    pub network_ready: bool,
    /// All conditions as reported, including ones this crate does not interpret.
    pub conditions: Vec<v1::RuntimeCondition>,
}

impl RuntimeReadiness {
    /// Both the runtime and the network are ready.
    pub fn is_ready(&self) -> bool {
        self.runtime_ready && self.network_ready
    }

    /// A human-readable explanation of the conditions that are not true (`None` when all are ready).
    pub fn not_ready_reason(&self) -> Option<String> {
        let mut reasons: Vec<String> = self
            .conditions
            .iter()
            .filter(|c| !c.status)
            .map(|c| format!("{}=false ({}: {})", c.r#type, c.reason, c.message))
            .collect();
        for (name, ready) in [(RUNTIME_READY, self.runtime_ready), (NETWORK_READY, self.network_ready)] {
            if !ready && !self.conditions.iter().any(|c| c.r#type == name) {
                reasons.push(format!("{name} not reported"));
            }
        }
        if reasons.is_empty() { None } else { Some(reasons.join("; ")) }
    }
}

/// Result of [`CriClient::exec_sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSyncOutput {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code.
    pub exit_code: i32,
}

impl ExecSyncOutput {
    /// The command exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// Standard output as text, invalid UTF-8 replaced.
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as text, invalid UTF-8 replaced.
    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Rounds a duration up to whole seconds (CRI timeouts are in seconds; rounding down would shorten a grace
/// period or a command timeout).
fn ceil_secs(d: Duration) -> i64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    i64::try_from(secs).unwrap_or(i64::MAX)
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

impl CriClient {
    /// Connects to the runtime socket, failing if it cannot be reached within
    /// [`CriConfig::connect_timeout`].
    pub async fn connect(config: CriConfig) -> Result<Self> {
        let path = config.socket_path()?;
        let endpoint = Self::grpc_endpoint(&config, &path)?;
        let dial = endpoint.connect_with_connector(unix_connector(path.clone()));
        let channel = match tokio::time::timeout(config.connect_timeout, dial).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                return Err(CriError::Connect {
                    endpoint: path.display().to_string(),
                    reason: error_chain(&e),
                });
            }
            Err(_) => {
                return Err(CriError::ConnectTimeout {
                    endpoint: path.display().to_string(),
                    after: config.connect_timeout,
                });
            }
        };
        tracing::debug!(socket = %path.display(), "connected to container runtime");
        Ok(Self::from_channel(channel, config))
    }

    /// Creates a client whose connection is established on first use (and re-established after failures),
    /// so the agent can start before the runtime. Must be called within a tokio runtime.
    pub fn connect_lazy(config: CriConfig) -> Result<Self> {
        let path = config.socket_path()?;
        let endpoint = Self::grpc_endpoint(&config, &path)?;
        let channel = endpoint.connect_with_connector_lazy(unix_connector(path));
        Ok(Self::from_channel(channel, config))
    }

    /// Wraps an existing channel (e.g. one shared with other gRPC clients of the same socket).
    pub fn from_channel(channel: Channel, config: CriConfig) -> Self {
        let max = config.max_message_size;
        let runtime = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let image = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        CriClient {
            runtime,
            image,
            channel,
            config,
            metrics: Arc::default(),
            sandbox_stats_safe: Arc::default(),
        }
    }

    fn grpc_endpoint(config: &CriConfig, path: &Path) -> Result<Endpoint> {
        // The URI is required by tonic but ignored: the connector dials the unix socket.
        let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|e| CriError::Connect {
            endpoint: path.display().to_string(),
            reason: error_chain(&e),
        })?;
        Ok(endpoint.connect_timeout(config.connect_timeout))
    }

    /// Counts and times every call of this client and of all its clones (made before or after) in
    /// `metrics`. Only the first metrics installed count; returns false when some were installed already.
    pub fn set_metrics(&self, metrics: CriMetrics) -> bool {
        self.metrics.set(metrics).is_ok()
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &CriConfig {
        &self.config
    }

    /// The shared gRPC channel, e.g. to build other containerd service clients on the same connection.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A subscription to the runtime's container events on the same connection: the stream, and its feed
    /// for the caller to spawn (or poll beside the stream). CRI `GetContainerEvents` where the runtime serves
    /// it, else containerd's native task events of [`CriConfig::containerd_namespace`] when the runtime is
    /// containerd, else none. See [`crate::events`] for the contract (relist on
    /// [`RuntimeEvent::Reconnected`](crate::RuntimeEvent::Reconnected)).
    pub fn events(&self, config: EventsConfig) -> (RuntimeEventStream, RuntimeEventFeed) {
        RuntimeEventStream::new(
            self.channel.clone(),
            self.runtime.clone(),
            &self.config.containerd_namespace,
            config,
        )
    }

    /// Runs one unary call with a deadline, mapping errors and logging the outcome.
    pub(crate) async fn unary<Req, Resp, F, Fut>(
        &self,
        call: &'static str,
        deadline: Option<Duration>,
        message: Req,
        f: F,
    ) -> Result<Resp>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        // No `grpc-timeout` header: tonic's channel would enforce it itself and race this deadline with a
        // CANCELLED status. Dropping the call on timeout resets the HTTP/2 stream, which cancels the request's
        // context in the runtime just the same.
        let request = tonic::Request::new(message);
        let started = tokio::time::Instant::now();
        let outcome = match deadline {
            Some(d) => match tokio::time::timeout(d, f(request)).await {
                Ok(r) => r.map_err(|s| CriError::from_status(call, s)),
                Err(_) => Err(CriError::Timeout { call, after: d }),
            },
            None => f(request).await.map_err(|s| CriError::from_status(call, s)),
        };
        let elapsed = started.elapsed();
        if let Some(metrics) = self.metrics.get() {
            metrics.record(call, elapsed, outcome.is_err());
        }
        let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
        match &outcome {
            Ok(_) => tracing::trace!(call, elapsed_ms, "CRI call ok"),
            Err(e) => tracing::debug!(call, elapsed_ms, error = %e, "CRI call failed"),
        }
        outcome.map(tonic::Response::into_inner)
    }

    /// Whether the runtime may be asked for sandbox stats (`ListPodSandboxStats`, `PodSandboxStats`)
    /// while other clients list sandboxes: not containerd before 1.6.22, which can crash then (see
    /// `sandbox_stats_hazard`). Learnt once from CRI `Version`; `false` until a `Version` call succeeds.
    pub async fn sandbox_stats_are_safe(&self) -> bool {
        if let Some(safe) = self.sandbox_stats_safe.get() {
            return *safe;
        }
        match self.version().await {
            Ok(v) => {
                let safe = !crate::sandbox_stats_hazard::affected(&v.runtime_name, &v.runtime_version);
                // Logged once, by the call that records the answer.
                if self.sandbox_stats_safe.set(safe).is_ok() && !safe {
                    tracing::info!(
                        runtime = %v.runtime_name,
                        version = %v.runtime_version,
                        "this runtime can crash when sandbox stats are read while sandboxes are listed \
                         (containerd before 1.6.22): pod stats come from the pod cgroups instead"
                    );
                }
                safe
            }
            Err(_) => false,
        }
    }

    pub(crate) fn default_deadline(&self) -> Option<Duration> {
        Some(self.config.runtime_request_timeout)
    }

    // ---------------------------------------------------------------- runtime service: runtime

    /// CRI `Version`: runtime name, version and CRI API version.
    pub async fn version(&self) -> Result<v1::VersionResponse> {
        let mut c = self.runtime.clone();
        let req = v1::VersionRequest { version: CRI_CLIENT_VERSION.to_owned() };
        self.unary("Version", self.default_deadline(), req, move |r| async move { c.version(r).await }).await
    }

    /// CRI `Status`: whether the runtime and its network are ready.
    pub async fn status(&self) -> Result<RuntimeReadiness> {
        let mut c = self.runtime.clone();
        let req = v1::StatusRequest { verbose: false };
        let resp = self
            .unary("Status", self.default_deadline(), req, move |r| async move { c.status(r).await })
            .await?;
        let conditions = resp
            .status
            .ok_or_else(|| CriError::InvalidResponse {
                call: "Status",
                reason: "no status in response".into(),
            })?
            .conditions;
        let is_true = |name: &str| conditions.iter().any(|c| c.r#type == name && c.status);
        Ok(RuntimeReadiness {
            runtime_ready: is_true(RUNTIME_READY),
            network_ready: is_true(NETWORK_READY),
            conditions,
        })
    }

    /// CRI `Status`'s `runtime_handlers`: each handler the runtime serves with the features it reports
    /// (`user_namespaces`, `recursive_read_only_mounts`). Empty when the runtime reports none (containerd
    /// 1.x, CRI before 1.30): such a runtime is taken to have none of the features.
    pub async fn runtime_handlers(&self) -> Result<Vec<v1::RuntimeHandler>> {
        let mut c = self.runtime.clone();
        let req = v1::StatusRequest { verbose: false };
        let resp = self
            .unary("Status", self.default_deadline(), req, move |r| async move { c.status(r).await })
            .await?;
        Ok(resp.runtime_handlers)
    }

    /// CRI `CheckpointContainer`: the runtime writes a checkpoint archive of the running container
    /// `container_id` to `location` (a path on the node). `timeout` (whole seconds, as the CRI takes it)
    /// is passed on and is also this call's deadline when it is longer than the runtime request timeout, as
    /// the kubelet's remote runtime does; a shorter or zero one is raised to that timeout.
    pub async fn checkpoint_container(
        &self,
        container_id: &str,
        location: &str,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = timeout.max(self.config.runtime_request_timeout);
        let req = v1::CheckpointContainerRequest {
            container_id: container_id.to_owned(),
            location: location.to_owned(),
            timeout: ceil_secs(deadline),
        };
        let mut c = self.runtime.clone();
        self.unary("CheckpointContainer", Some(deadline), req, move |r| async move {
            c.checkpoint_container(r).await
        })
        .await?;
        Ok(())
    }

    // ---------------------------------------------------------------- runtime service: sandboxes

    /// CRI `RunPodSandbox`: creates and starts a pod sandbox (pause container, network namespace via CNI).
    /// Returns the sandbox ID. `runtime_handler` selects a RuntimeClass handler; `""` is the default.
    ///
    /// The deadline is twice `runtime_request_timeout`, as in the kubelet, because the runtime may have to pull
    /// the sandbox image first.
    pub async fn run_pod_sandbox(
        &self,
        config: v1::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req =
            v1::RunPodSandboxRequest { config: Some(config), runtime_handler: runtime_handler.to_owned() };
        let deadline = self.config.runtime_request_timeout.saturating_mul(2);
        let resp = self
            .unary("RunPodSandbox", Some(deadline), req, move |r| async move { c.run_pod_sandbox(r).await })
            .await?;
        if resp.pod_sandbox_id.is_empty() {
            return Err(CriError::InvalidResponse {
                call: "RunPodSandbox",
                reason: "empty pod_sandbox_id".into(),
            });
        }
        Ok(resp.pod_sandbox_id)
    }

    /// CRI `StopPodSandbox`: stops all containers of the sandbox (with no grace period: stop containers first
    /// to honour grace periods), the sandbox itself, and tears down its network. Idempotent.
    pub async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::StopPodSandboxRequest { pod_sandbox_id: pod_sandbox_id.to_owned() };
        self.unary("StopPodSandbox", self.default_deadline(), req, move |r| async move {
            c.stop_pod_sandbox(r).await
        })
        .await
        .map(drop)
    }

    /// CRI `RemovePodSandbox`: removes the sandbox and all its containers (forcibly, if still running).
    /// Idempotent on containerd (removing a missing sandbox succeeds).
    pub async fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::RemovePodSandboxRequest { pod_sandbox_id: pod_sandbox_id.to_owned() };
        self.unary("RemovePodSandbox", self.default_deadline(), req, move |r| async move {
            c.remove_pod_sandbox(r).await
        })
        .await
        .map(drop)
    }

    /// CRI `PodSandboxStatus`: state, creation time, network status (pod IPs), labels and annotations.
    /// A missing sandbox is [`CriError::NotFound`].
    pub async fn pod_sandbox_status(&self, pod_sandbox_id: &str) -> Result<v1::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = v1::PodSandboxStatusRequest { pod_sandbox_id: pod_sandbox_id.to_owned(), verbose: false };
        let resp = self
            .unary("PodSandboxStatus", self.default_deadline(), req, move |r| async move {
                c.pod_sandbox_status(r).await
            })
            .await?;
        resp.status.ok_or_else(|| CriError::InvalidResponse {
            call: "PodSandboxStatus",
            reason: "no status in response".into(),
        })
    }

    /// Where the sandbox's network lives, for dialing its ports ([`crate::netns`]): CRI `PodSandboxStatus`
    /// with `verbose: true` (containerd's `info` JSON has the runtime spec and the sandbox's pid). `Ok(None)`
    /// when the runtime does not say.
    pub async fn sandbox_network(
        &self,
        pod_sandbox_id: &str,
    ) -> Result<Option<crate::netns::SandboxNetwork>> {
        let mut c = self.runtime.clone();
        let req = v1::PodSandboxStatusRequest { pod_sandbox_id: pod_sandbox_id.to_owned(), verbose: true };
        let resp = self
            .unary("PodSandboxStatus", self.default_deadline(), req, move |r| async move {
                c.pod_sandbox_status(r).await
            })
            .await?;
        let status = resp.status.ok_or_else(|| CriError::InvalidResponse {
            call: "PodSandboxStatus",
            reason: "no status in response".into(),
        })?;
        Ok(crate::netns::network_from_status(&status, &resp.info))
    }

    /// CRI `ListPodSandbox` with a filter.
    pub async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<v1::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = v1::ListPodSandboxRequest { filter: filter.to_proto() };
        let resp = self
            .unary("ListPodSandbox", self.default_deadline(), req, move |r| async move {
                c.list_pod_sandbox(r).await
            })
            .await?;
        Ok(resp.items)
    }

    // ---------------------------------------------------------------- runtime service: containers

    /// CRI `CreateContainer` in a sandbox. `sandbox_config` must be the config the sandbox was run with.
    /// Returns the container ID.
    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: v1::ContainerConfig,
        sandbox_config: v1::PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = v1::CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let resp = self
            .unary("CreateContainer", self.default_deadline(), req, move |r| async move {
                c.create_container(r).await
            })
            .await?;
        if resp.container_id.is_empty() {
            return Err(CriError::InvalidResponse {
                call: "CreateContainer",
                reason: "empty container_id".into(),
            });
        }
        Ok(resp.container_id)
    }

    /// CRI `StartContainer`.
    pub async fn start_container(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::StartContainerRequest { container_id: container_id.to_owned() };
        self.unary("StartContainer", self.default_deadline(), req, move |r| async move {
            c.start_container(r).await
        })
        .await
        .map(drop)
    }

    /// CRI `StopContainer`: sends the stop signal, waits up to `grace_period` (rounded up to whole seconds;
    /// zero kills at once), then kills. Idempotent.
    ///
    /// The deadline is `runtime_request_timeout + grace_period`, as in the kubelet.
    pub async fn stop_container(&self, container_id: &str, grace_period: Duration) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::StopContainerRequest {
            container_id: container_id.to_owned(),
            timeout: ceil_secs(grace_period),
        };
        let deadline = self.config.runtime_request_timeout.saturating_add(grace_period);
        self.unary("StopContainer", Some(deadline), req, move |r| async move { c.stop_container(r).await })
            .await
            .map(drop)
    }

    /// CRI `ReopenContainerLog`: the runtime closes the container's log file and opens its path
    /// again (after the file was renamed for rotation).
    pub async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::ReopenContainerLogRequest { container_id: container_id.to_owned() };
        self.unary("ReopenContainerLog", self.default_deadline(), req, move |r| async move {
            c.reopen_container_log(r).await
        })
        .await
        .map(drop)
    }

    /// CRI `RemoveContainer` (forcibly, if still running). Idempotent on containerd.
    pub async fn remove_container(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::RemoveContainerRequest { container_id: container_id.to_owned() };
        self.unary("RemoveContainer", self.default_deadline(), req, move |r| async move {
            c.remove_container(r).await
        })
        .await
        .map(drop)
    }

    /// CRI `ContainerStatus`: state, exit code, timestamps, image, log path. A missing container is
    /// [`CriError::NotFound`].
    ///
    /// On containerd, the status lags the native `/tasks/exit` event by tens of milliseconds: right after a
    /// [`RuntimeEvent::ContainerExited`](crate::RuntimeEvent::ContainerExited) it can still say RUNNING.
    pub async fn container_status(&self, container_id: &str) -> Result<v1::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = v1::ContainerStatusRequest { container_id: container_id.to_owned(), verbose: false };
        let resp = self
            .unary("ContainerStatus", self.default_deadline(), req, move |r| async move {
                c.container_status(r).await
            })
            .await?;
        resp.status.ok_or_else(|| CriError::InvalidResponse {
            call: "ContainerStatus",
            reason: "no status in response".into(),
        })
    }

    /// CRI `UpdateContainerResources`: changes a running container's Linux resources (CPU shares,
    /// quota and period, memory limit) in place.
    pub async fn update_container_resources(
        &self,
        container_id: &str,
        linux: v1::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = v1::UpdateContainerResourcesRequest {
            container_id: container_id.to_owned(),
            linux: Some(linux),
            ..Default::default()
        };
        self.unary("UpdateContainerResources", self.default_deadline(), req, move |r| async move {
            c.update_container_resources(r).await
        })
        .await?;
        Ok(())
    }

    /// CRI `ListContainers` with a filter.
    pub async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<v1::Container>> {
        let mut c = self.runtime.clone();
        let req = v1::ListContainersRequest { filter: filter.to_proto() };
        let resp = self
            .unary("ListContainers", self.default_deadline(), req, move |r| async move {
                c.list_containers(r).await
            })
            .await?;
        Ok(resp.containers)
    }

    /// CRI `ExecSync`: runs `cmd` in the container and captures its output.
    ///
    /// `timeout` is the command's timeout, enforced by the runtime (rounded up to whole seconds); a command
    /// that outlives it fails with an error for which [`CriError::is_timeout`] is true. This client's deadline
    /// is `timeout + exec_sync_margin`. A zero `timeout` means no runtime-side limit; the client deadline is
    /// then `runtime_request_timeout`.
    ///
    /// Dropping the returned future does not cancel the call: it runs on its own task until the runtime
    /// answers or the deadline expires, and its answer is dropped. A cancelled `ExecSync` kills the command
    /// in containerd, and one cancelled while its process starts holds the container in containerd 1.6 for
    /// 30 s (its shim waits that long for the command's output pipes, and a `StopContainer` waits for the
    /// shim). So a caller that stops waiting (a probe's own timeout, a pod that goes away) leaves the
    /// command to its end.
    pub async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecSyncOutput> {
        let req =
            v1::ExecSyncRequest { container_id: container_id.to_owned(), cmd, timeout: ceil_secs(timeout) };
        let deadline = if timeout.is_zero() {
            self.config.runtime_request_timeout
        } else {
            timeout.saturating_add(self.config.exec_sync_margin)
        };
        let client = self.clone();
        // A bare spawn: per request, its handle awaited here (it outlives a dropped caller, see above).
        let call = tokio::spawn(async move {
            let mut c = client.runtime.clone();
            client.unary("ExecSync", Some(deadline), req, move |r| async move { c.exec_sync(r).await }).await
        });
        let resp = call.await.map_err(|e| CriError::Status {
            call: "ExecSync",
            code: tonic::Code::Cancelled,
            message: format!("the call's task ended without an answer: {e}"),
        })??;
        Ok(ExecSyncOutput { stdout: resp.stdout, stderr: resp.stderr, exit_code: resp.exit_code })
    }

    /// CRI `Exec`: asks the runtime to prepare a streaming exec of `cmd` in the container and returns the URL
    /// of its streaming server where a client upgrades the connection (SPDY or WebSocket) to run it. The URL
    /// is single-use and expires if not used soon (containerd: 1 minute).
    pub async fn exec(&self, request: v1::ExecRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let resp = self
            .unary("Exec", self.default_deadline(), request, move |r| async move { c.exec(r).await })
            .await?;
        Ok(resp.url)
    }

    /// CRI `Attach`: like [`Self::exec`], for attaching to the container's main process.
    pub async fn attach(&self, request: v1::AttachRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let resp = self
            .unary("Attach", self.default_deadline(), request, move |r| async move { c.attach(r).await })
            .await?;
        Ok(resp.url)
    }

    /// CRI `PortForward`: like [`Self::exec`], for forwarding connections to ports of the pod sandbox's
    /// network namespace.
    pub async fn port_forward(&self, pod_sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = v1::PortForwardRequest { pod_sandbox_id: pod_sandbox_id.to_owned(), port: ports };
        let resp =
            self.unary("PortForward", self.default_deadline(), req, move |r| async move {
                c.port_forward(r).await
            })
            .await?;
        Ok(resp.url)
    }

    // ---------------------------------------------------------------- runtime service: stats

    /// CRI `ContainerStats` of one container (CPU, memory, writable layer).
    pub async fn container_stats(&self, container_id: &str) -> Result<v1::ContainerStats> {
        let mut c = self.runtime.clone();
        let req = v1::ContainerStatsRequest { container_id: container_id.to_owned() };
        let resp = self
            .unary("ContainerStats", self.default_deadline(), req, move |r| async move {
                c.container_stats(r).await
            })
            .await?;
        resp.stats.ok_or_else(|| CriError::InvalidResponse {
            call: "ContainerStats",
            reason: "no stats in response".into(),
        })
    }

    /// CRI `ListContainerStats`. The filter's `state` is ignored (the CRI stats filter has none).
    ///
    /// On containerd 1.6 this costs one shim round trip per container (≈ 3 ms each).
    pub async fn list_container_stats(&self, filter: &ContainerFilter) -> Result<Vec<v1::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = v1::ListContainerStatsRequest { filter: filter.to_stats_proto() };
        let resp = self
            .unary("ListContainerStats", self.default_deadline(), req, move |r| async move {
                c.list_container_stats(r).await
            })
            .await?;
        Ok(resp.stats)
    }

    /// CRI `ListPodSandboxStats`. The filter's `state` is ignored (the CRI stats filter has none).
    ///
    /// Expensive on containerd 1.6 (≈ 15 ms per sandbox: cgroup and network namespace statistics), and
    /// unsafe there before 1.6.22: check [`Self::sandbox_stats_are_safe`] first.
    pub async fn list_pod_sandbox_stats(&self, filter: &SandboxFilter) -> Result<Vec<v1::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = v1::ListPodSandboxStatsRequest { filter: filter.to_stats_proto() };
        let resp = self
            .unary("ListPodSandboxStats", self.default_deadline(), req, move |r| async move {
                c.list_pod_sandbox_stats(r).await
            })
            .await?;
        Ok(resp.stats)
    }

    // ---------------------------------------------------------------- image service

    /// CRI `PullImage`. Returns the image reference the runtime stored (usually a digest reference or the
    /// image ID), which is what `ContainerStatus.image_ref` reports.
    ///
    /// `sandbox_config` is the config of the pod the image is pulled for (runtimes may use it for
    /// per-pod pull settings); pass `None` when pulling outside a pod. The deadline is
    /// [`CriConfig::image_pull_timeout`].
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<v1::AuthConfig>,
        sandbox_config: Option<v1::PodSandboxConfig>,
    ) -> Result<String> {
        let mut c = self.image.clone();
        let req = v1::PullImageRequest { image: Some(image_spec(image)), auth, sandbox_config };
        let started = tokio::time::Instant::now();
        let resp =
            self.unary("PullImage", self.config.image_pull_timeout, req, move |r| async move {
                c.pull_image(r).await
            })
            .await?;
        if resp.image_ref.is_empty() {
            return Err(CriError::InvalidResponse {
                call: "PullImage",
                reason: format!("empty image_ref for {image}"),
            });
        }
        tracing::debug!(image, image_ref = %resp.image_ref, elapsed_ms = started.elapsed().as_millis(), "image pulled");
        Ok(resp.image_ref)
    }

    /// CRI `ImageStatus`: the image if present, `None` if the runtime does not have it.
    pub async fn image_status(&self, image: &str) -> Result<Option<v1::Image>> {
        let mut c = self.image.clone();
        let req = v1::ImageStatusRequest { image: Some(image_spec(image)), verbose: false };
        let resp =
            self.unary("ImageStatus", self.default_deadline(), req, move |r| async move {
                c.image_status(r).await
            })
            .await?;
        Ok(resp.image)
    }

    /// CRI `ListImages`, optionally only the images matching a reference.
    pub async fn list_images(&self, filter: Option<&str>) -> Result<Vec<v1::Image>> {
        let mut c = self.image.clone();
        let req =
            v1::ListImagesRequest { filter: filter.map(|f| v1::ImageFilter { image: Some(image_spec(f)) }) };
        let resp = self
            .unary("ListImages", self.default_deadline(), req, move |r| async move { c.list_images(r).await })
            .await?;
        Ok(resp.images)
    }

    /// CRI `RemoveImage`. Idempotent.
    ///
    /// On containerd this deletes the whole image: every tag and digest reference of the same image ID, not
    /// just the reference given.
    pub async fn remove_image(&self, image: &str) -> Result<()> {
        let mut c = self.image.clone();
        let req = v1::RemoveImageRequest { image: Some(image_spec(image)) };
        self.unary(
            "RemoveImage",
            self.default_deadline(),
            req,
            move |r| async move { c.remove_image(r).await },
        )
        .await
        .map(drop)
    }

    /// CRI `ImageFsInfo`: usage of the filesystems holding images (and, on newer runtimes, container layers).
    pub async fn image_fs_info(&self) -> Result<v1::ImageFsInfoResponse> {
        let mut c = self.image.clone();
        self.unary("ImageFsInfo", self.default_deadline(), v1::ImageFsInfoRequest {}, move |r| async move {
            c.image_fs_info(r).await
        })
        .await
    }
}

fn image_spec(image: &str) -> v1::ImageSpec {
    v1::ImageSpec { image: image.to_owned(), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(30)), 30);
        assert_eq!(ceil_secs(Duration::from_millis(30_001)), 31);
        assert_eq!(ceil_secs(Duration::MAX), i64::MAX);
    }

    #[test]
    fn operation_types_are_the_kubelets() {
        for (call, op) in [
            ("RunPodSandbox", "run_podsandbox"),
            ("ListPodSandbox", "list_podsandbox"),
            ("PodSandboxStatus", "podsandbox_status"),
            ("ListPodSandboxStats", "list_podsandbox_stats"),
            ("ListContainerStats", "list_container_stats"),
            ("ImageFsInfo", "image_fs_info"),
            ("ExecSync", "exec_sync"),
            ("Version", "version"),
        ] {
            assert_eq!(operation_type(call), op);
        }
    }

    #[tokio::test]
    async fn calls_are_counted_in_every_clone() {
        let dir = std::env::temp_dir().join(format!("nodelet-cri-metrics-{}", fastrand::u64(..)));
        let config = CriConfig::new(format!("unix://{}/nope.sock", dir.display()))
            .with_connect_timeout(Duration::from_secs(5));
        let client = CriClient::connect_lazy(config).expect("lazy client");
        let early_clone = client.clone();
        let registry = prometheus::Registry::new();
        assert!(client.set_metrics(CriMetrics::new(&registry).expect("metrics")));
        assert!(!client.set_metrics(CriMetrics::new(&prometheus::Registry::new()).expect("metrics")));
        assert!(early_clone.version().await.is_err());
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out)
            .expect("encode");
        let text = String::from_utf8(out).expect("utf-8");
        for line in [
            "kubelet_runtime_operations_total{operation_type=\"version\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"version\"} 1",
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"version\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn readiness_reason() {
        let cond = |t: &str, s: bool| v1::RuntimeCondition {
            r#type: t.into(),
            status: s,
            reason: "R".into(),
            message: "m".into(),
        };
        let r = RuntimeReadiness { runtime_ready: true, network_ready: true, conditions: vec![] };
        assert!(r.is_ready());
        assert!(r.not_ready_reason().is_none());
        let r = RuntimeReadiness {
            runtime_ready: true,
            network_ready: false,
            conditions: vec![cond(RUNTIME_READY, true), cond(NETWORK_READY, false)],
        };
        assert!(!r.is_ready());
        assert_eq!(r.not_ready_reason().as_deref(), Some("NetworkReady=false (R: m)"));
        let r = RuntimeReadiness { runtime_ready: false, network_ready: false, conditions: vec![] };
        assert_eq!(
            r.not_ready_reason().as_deref(),
            Some("RuntimeReady not reported; NetworkReady not reported")
        );
    }

    #[tokio::test]
    async fn connect_to_missing_socket_fails_cleanly() {
        let dir = std::env::temp_dir().join(format!("nodelet-cri-missing-{}", fastrand::u64(..)));
        let config = CriConfig::new(format!("unix://{}/nope.sock", dir.display()))
            .with_connect_timeout(Duration::from_secs(5));
        match CriClient::connect(config.clone()).await {
            Err(e @ CriError::Connect { .. }) => {
                assert!(e.is_unavailable());
                assert!(e.to_string().contains("nope.sock"), "{e}");
            }
            other => panic!("expected a Connect error, got {other:?}"),
        }
        // The lazy client only fails when used, with UNAVAILABLE.
        let lazy = CriClient::connect_lazy(config).expect("lazy client");
        let err = lazy.version().await.expect_err("no runtime there");
        assert!(err.is_unavailable(), "{err:?}");
        assert_eq!(err.call(), Some("Version"));
    }
}
