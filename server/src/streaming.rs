//! `/exec`, `/attach`, `/portForward` and `/run` on the main port.
//!
//! A `/portForward` WebSocket with the binary channel protocol is served by nodelet itself, dialling the
//! ports inside the pod's network namespace (`port_forward`); when that namespace cannot be found or
//! entered, and for every other request, the runtime streams as described here.
//!
//! `/exec/{namespace}/{pod}[/{uid}]/{container}`, `/attach/…` (same shapes) and
//! `/portForward/{namespace}/{pod}[/{uid}]` work as the kubelet's default (non-redirecting) streaming: the
//! handler checks the request, asks the runtime with CRI `Exec` / `Attach` / `PortForward` for a one-time URL
//! of its streaming server (containerd's runs on 127.0.0.1), forwards the client's upgrade request (its
//! method, path of the runtime's URL, and only the streaming headers `Connection`, `Upgrade`,
//! `X-Stream-Protocol-Version`, `Sec-WebSocket-*`: never the client's credentials) to that URL, relays the
//! runtime's `101 Switching Protocols` with its headers, and then copies bytes both ways between the two
//! upgraded connections. The protocols (SPDY/3.1 with `v4.channel.k8s.io` or `portforward.k8s.io`, WebSocket
//! with `v4.channel.k8s.io`, `channel.k8s.io`, `base64.channel.k8s.io`) are spoken by the runtime; nodelet
//! does not parse them. A runtime answer other than 101 is passed on with its status and (at most 64 KiB of)
//! its body.
//!
//! Query parameters: `command` (repeated) for exec; `input`, `output`, `error`, `tty` (the kubelet's names,
//! which the API server sends) or `stdin`, `stdout`, `stderr` (the `PodExecOptions` names), each `1`/`true`;
//! with `tty`, stderr is dropped (the terminal merges it), and at least one of the three streams must be
//! asked for. `port` (repeated, or comma-separated; each 1-65535) for portForward is passed to CRI
//! `PortForward`; a WebSocket client must name at least one (the kubelet's rule), the SPDY client names its
//! ports in stream headers instead, which the runtime reads itself.
//!
//! `POST /run/{namespace}/{pod}[/{uid}]/{container}?cmd=…` runs `cmd` (split at spaces, as the kubelet
//! does) with CRI `ExecSync` and returns stdout followed by stderr as text; a non-zero exit is a 500 whose
//! message has the exit code and the output.
//!
//! Bounds (`Sessions`): at most [`MAX_SESSIONS`] streaming sessions at once, and at most
//! `nodelet.maxStreamingSessionsPerUser` (default [`DEFAULT_MAX_SESSIONS_PER_USER`]) of one authenticated
//! user, so that one user cannot take every slot (further requests get 429, naming the limit); at most
//! `MAX_PORTS` ports in one port-forward request (400). A session ends, closing both connections (which
//! ends the runtime's session), when either side closes (also with a clean close: the first direction to end
//! ends both, as in the kubelet's upgrade proxy) or fails, when no byte has gone either way for
//! `streamingConnectionIdleTimeout` (default 4 h, as the kubelet's), when the client does not take up its
//! upgraded connection within `UPGRADE_WAIT`, or when the servers stop. The runtime's URL must be plain
//! HTTP on a loopback address; anything else is refused.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use nodelet_cri::proto;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::port_forward;
use super::routes::{Shared, is_dns_label, is_dns_subdomain};
use super::{NodeView, StreamTargetError, status};

/// Streaming sessions one user may have open at once (`nodelet.maxStreamingSessionsPerUser`): half of
/// [`MAX_SESSIONS`] (the configuration's default).
pub(crate) use nodelet_config::DEFAULT_MAX_STREAMING_SESSIONS_PER_USER as DEFAULT_MAX_SESSIONS_PER_USER;
/// `streamingConnectionIdleTimeout`: the kubelet's 4 h (the configuration's default).
pub(crate) use nodelet_config::DEFAULT_STREAMING_IDLE_TIMEOUT as DEFAULT_IDLE_TIMEOUT;
/// Streaming sessions (exec, attach, port-forward) open at once; more get 429.
pub(crate) use nodelet_config::MAX_STREAMING_SESSIONS as MAX_SESSIONS;
/// Ports in one port-forward request: the binary channel protocol has 256 channels, two per port.
pub(crate) const MAX_PORTS: usize = 128;
/// How long the client may take to take up the upgraded connection after the 101.
pub(crate) const UPGRADE_WAIT: Duration = Duration::from_secs(30);
/// How long connecting to the runtime's streaming server and getting its answer may take.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a runtime's non-101 answer body that is passed on.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Buffer of each direction of a session's relay (tokio's `copy_bidirectional` uses 8 KiB; larger pieces
/// mean fewer reads, writes and TLS records per byte on bulk port-forward transfers).
const COPY_BUFFER: usize = 64 * 1024;

/// Why a streaming request failed; each maps to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// Bad parameters or a request that is not an upgrade.
    #[error("{0}")]
    BadRequest(String),
    /// The pod or container does not exist here.
    #[error("{0}")]
    NotFound(String),
    /// The container exists but does not run.
    #[error("{0}")]
    NotRunning(String),
    /// Too many sessions.
    #[error("too many streaming sessions (at most {MAX_SESSIONS}); try again later")]
    TooMany,
    /// Too many sessions of one user.
    #[error(
        "too many streaming sessions of user {user:?} (at most {max} per user, \
         nodelet.maxStreamingSessionsPerUser); close one first"
    )]
    TooManyForUser {
        /// The authenticated user.
        user: String,
        /// The per-user limit.
        max: usize,
    },
    /// No CRI client (servers started without a runtime).
    #[error("container runtime streaming is not available")]
    NoRuntime,
    /// A CRI call failed.
    #[error("{call} in the container runtime failed: {source}")]
    Cri {
        /// The call.
        call: &'static str,
        /// Why.
        #[source]
        source: nodelet_cri::CriError,
    },
    /// The runtime's streaming server could not be used.
    #[error("runtime streaming server: {0}")]
    Upstream(String),
}

impl StreamError {
    fn code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::NotRunning(_) => StatusCode::BAD_REQUEST,
            Self::TooMany | Self::TooManyForUser { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::NoRuntime => StatusCode::SERVICE_UNAVAILABLE,
            Self::Cri { source, .. } if source.is_not_found() => StatusCode::NOT_FOUND,
            Self::Cri { .. } | Self::Upstream(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for StreamError {
    fn into_response(self) -> Response {
        let code = self.code();
        if code.is_server_error() {
            warn!(error = %self, "streaming request failed");
        }
        status::failure(code, self.to_string())
    }
}

/// The path of a streaming request: `{namespace}/{pod}[/{uid}][/{container}]`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamPath {
    namespace: String,
    pod: String,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    container: Option<String>,
}

impl StreamPath {
    fn validate(&self) -> Result<(), StreamError> {
        let mut checks = vec![
            ("namespace", &self.namespace, is_dns_label(&self.namespace)),
            ("pod name", &self.pod, is_dns_subdomain(&self.pod)),
        ];
        if let Some(c) = &self.container {
            checks.push(("container name", c, is_dns_label(c)));
        }
        if let Some(u) = &self.uid {
            let ok =
                !u.is_empty() && u.len() <= 128 && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            checks.push(("pod UID", u, ok));
        }
        match checks.into_iter().find(|(_, _, ok)| !ok) {
            Some((what, value, _)) => Err(StreamError::BadRequest(format!("invalid {what} {value:?}"))),
            None => Ok(()),
        }
    }
}

/// The stdio flags of exec and attach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stdio {
    pub(crate) stdin: bool,
    pub(crate) stdout: bool,
    pub(crate) stderr: bool,
    pub(crate) tty: bool,
}

/// Go's `strconv.ParseBool` truth values (the kubelet's clients send `1`).
fn truthy(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// Why the query of a streaming request is refused (the message of its 400 response).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// None of stdin, stdout and stderr is asked for.
    #[error("you must specify at least 1 of stdin, stdout, stderr")]
    NoStream,
    /// A port that is not 1-65535.
    #[error("invalid port {0:?}: must be 1-65535")]
    InvalidPort(String),
    /// A WebSocket port-forward without ports.
    #[error("query parameter \"port\" is required (the pod ports to forward to)")]
    PortRequired,
    /// More ports than the channel protocol can carry.
    #[error(
        "{0} ports in one port-forward request; at most {MAX_PORTS} (the channel protocol has two of its 256 \
         channels per port)"
    )]
    TooManyPorts(usize),
}

/// Why a port-forward cannot be served in the pod's network namespace (then the runtime forwards).
#[derive(Debug, thiserror::Error)]
enum NativeForwardError {
    /// The runtime does not tell where the sandbox's network is.
    #[error("the runtime does not say where the sandbox's network is")]
    NoNetwork,
    /// `PodSandboxStatus` failed.
    #[error("PodSandboxStatus: {0}")]
    Status(#[source] nodelet_cri::CriError),
    /// The network namespace cannot be used.
    #[error(transparent)]
    Namespace(#[from] nodelet_cri::netns::NetnsError),
}

/// Parses `command` (repeated) and the stdio flags; the error is a 400's message.
pub(crate) fn parse_stdio(query: &[(String, String)]) -> Result<(Vec<String>, Stdio), QueryError> {
    let mut command = Vec::new();
    let mut s = Stdio::default();
    for (key, value) in query {
        match key.as_str() {
            "command" => command.push(value.clone()),
            "stdin" | "input" => s.stdin = truthy(value),
            "stdout" | "output" => s.stdout = truthy(value),
            "stderr" | "error" => s.stderr = truthy(value),
            "tty" => s.tty = truthy(value),
            _ => {}
        }
    }
    if s.tty && s.stderr {
        // The kubelet does the same: a terminal has one output stream.
        s.stderr = false;
    }
    if !s.stdin && !s.stdout && !s.stderr {
        return Err(QueryError::NoStream);
    }
    Ok((command, s))
}

/// Parses the repeated `port` parameter (each may also be a comma-separated list); every entry must be
/// 1-65535 (an empty one too is refused), and there may be at most `MAX_PORTS`. A WebSocket client names
/// its ports only here, so for it at least one is required (the kubelet's rule); a SPDY client names them
/// in stream headers instead (read by the runtime's streaming server, not here).
pub fn parse_ports(query: &[(String, String)], websocket: bool) -> Result<Vec<i32>, QueryError> {
    let mut ports = Vec::new();
    for (key, value) in query {
        if key != "port" {
            continue;
        }
        for p in value.split(',') {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => ports.push(i32::from(n)),
                _ => return Err(QueryError::InvalidPort(p.to_owned())),
            }
        }
    }
    if websocket && ports.is_empty() {
        return Err(QueryError::PortRequired);
    }
    if ports.len() > MAX_PORTS {
        return Err(QueryError::TooManyPorts(ports.len()));
    }
    Ok(ports)
}

/// Whether the request asks for a WebSocket (rather than SPDY).
fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether the request asks for a connection upgrade.
fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

type St<V> = State<Arc<Shared<V>>>;

/// The open streaming sessions: at most `max` in all and `per_user` of one user.
#[derive(Debug)]
pub(crate) struct Sessions {
    all: Arc<Semaphore>,
    per_user: usize,
    users: Mutex<HashMap<String, usize>>,
}

/// A session's slot, given back when dropped (when the session ends).
#[derive(Debug)]
pub(crate) struct SessionPermit {
    _all: OwnedSemaphorePermit,
    sessions: Arc<Sessions>,
    user: String,
}

impl Sessions {
    /// At most `max` sessions, `per_user` of one user (at least one each).
    pub(crate) fn new(max: usize, per_user: usize) -> Arc<Self> {
        Arc::new(Self {
            all: Arc::new(Semaphore::new(max.max(1))),
            per_user: per_user.max(1),
            users: Mutex::new(HashMap::new()),
        })
    }

    fn users(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        // Every update is complete before the lock is released: a poisoned map is consistent.
        self.users.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for one more session of `user`: refused when the user has `per_user` open, or when every slot
    /// is taken.
    pub(crate) fn acquire(self: &Arc<Self>, user: &str) -> Result<SessionPermit, StreamError> {
        let mut users = self.users();
        let open = users.get(user).copied().unwrap_or(0);
        if open >= self.per_user {
            return Err(StreamError::TooManyForUser { user: user.to_owned(), max: self.per_user });
        }
        let all = self.all.clone().try_acquire_owned().map_err(|_| StreamError::TooMany)?;
        users.insert(user.to_owned(), open + 1);
        Ok(SessionPermit { _all: all, sessions: self.clone(), user: user.to_owned() })
    }
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        let mut users = self.sessions.users();
        if let Some(open) = users.get_mut(&self.user) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                users.remove(&self.user);
            }
        }
    }
}

/// When a session last carried a byte, for `streamingConnectionIdleTimeout`.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    /// Active now.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self { start: Instant::now(), last: AtomicU64::new(0) })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has been carried for `timeout`.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed)) + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A connection whose reads and writes count as the session's activity.
#[derive(Debug)]
pub(crate) struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Tracked<T> {
    /// `inner`, reporting to `activity`.
    pub(crate) fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Ends when `activity` has been idle for `timeout`; never when `timeout` is `None`.
pub(crate) async fn idle(activity: &Activity, timeout: Option<Duration>) {
    match timeout {
        Some(t) => activity.idle_for(t).await,
        None => std::future::pending().await,
    }
}

/// Common start of exec, attach and port-forward: names, upgrade, a session slot of the request's user
/// (see [`Sessions`]), the runtime and the resolved pod or container.
fn begin<V: NodeView>(
    shared: &Shared<V>,
    path: &StreamPath,
    request: &Request,
) -> Result<(SessionPermit, nodelet_cri::CriClient, super::StreamTarget), StreamError> {
    path.validate()?;
    if !is_upgrade(request.headers()) {
        return Err(StreamError::BadRequest(
            "Upgrade request required (Connection: Upgrade with SPDY/3.1 or websocket)".to_owned(),
        ));
    }
    let runtime = shared.runtime.clone().ok_or(StreamError::NoRuntime)?;
    // The main port's authentication puts the user in; without one (not on the main port) all share a slot
    // set.
    let user = request.extensions().get::<super::auth::UserInfo>().map_or("", |u| u.name.as_str());
    let permit = shared.sessions.acquire(user)?;
    Ok((permit, runtime, resolve(shared, path)?))
}

fn target_error(path: &StreamPath, e: StreamTargetError) -> StreamError {
    let container = path.container.as_deref().unwrap_or_default();
    match e {
        StreamTargetError::PodNotFound => StreamError::NotFound(format!(
            "pod does not exist: pod \"{}/{}\" is not on this node",
            path.namespace, path.pod
        )),
        StreamTargetError::UidMismatch => StreamError::NotFound(format!(
            "pod not found: pod \"{}/{}\" has another UID",
            path.namespace, path.pod
        )),
        StreamTargetError::ContainerNotFound => StreamError::NotFound(format!(
            "container not found ({container:?}) in pod \"{}/{}\"",
            path.namespace, path.pod
        )),
        StreamTargetError::NotRunning => StreamError::NotRunning(format!(
            "container {container:?} in pod \"{}/{}\" is not running: cannot exec in a stopped state",
            path.namespace, path.pod
        )),
        StreamTargetError::NoSandbox => {
            StreamError::NotRunning(format!("pod \"{}/{}\" has no running sandbox", path.namespace, path.pod))
        }
    }
}

/// `GET|POST /exec/{namespace}/{pod}[/{uid}]/{container}`.
pub(crate) async fn exec<V: NodeView>(
    State(shared): St<V>,
    Path(path): Path<StreamPath>,
    Query(query): Query<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let (command, stdio) = match parse_stdio(&query) {
        Ok(parsed) => parsed,
        Err(message) => return StreamError::BadRequest(message.to_string()).into_response(),
    };
    if command.is_empty() {
        return StreamError::BadRequest("you must specify a command (the command parameter)".to_owned())
            .into_response();
    }
    let (permit, runtime, target) = match begin(&shared, &path, &request) {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let req = proto::ExecRequest {
        container_id: target.container_id.unwrap_or_default(),
        cmd: command,
        tty: stdio.tty,
        stdin: stdio.stdin,
        stdout: stdio.stdout,
        stderr: stdio.stderr,
    };
    let url = match runtime.exec(req).await {
        Ok(url) => url,
        Err(source) => return StreamError::Cri { call: "Exec", source }.into_response(),
    };
    let what = format!("exec {}/{}/{}", path.namespace, path.pod, path.container.unwrap_or_default());
    proxy(request, &url, permit, shared.stopping.clone(), shared.idle_timeout, what).await
}

/// `GET|POST /attach/{namespace}/{pod}[/{uid}]/{container}`.
pub(crate) async fn attach<V: NodeView>(
    State(shared): St<V>,
    Path(path): Path<StreamPath>,
    Query(query): Query<Vec<(String, String)>>,
    request: Request,
) -> Response {
    let (_, stdio) = match parse_stdio(&query) {
        Ok(parsed) => parsed,
        Err(message) => return StreamError::BadRequest(message.to_string()).into_response(),
    };
    let (permit, runtime, target) = match begin(&shared, &path, &request) {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let req = proto::AttachRequest {
        container_id: target.container_id.unwrap_or_default(),
        stdin: stdio.stdin,
        tty: stdio.tty,
        stdout: stdio.stdout,
        stderr: stdio.stderr,
    };
    let url = match runtime.attach(req).await {
        Ok(url) => url,
        Err(source) => return StreamError::Cri { call: "Attach", source }.into_response(),
    };
    let what = format!("attach {}/{}/{}", path.namespace, path.pod, path.container.unwrap_or_default());
    proxy(request, &url, permit, shared.stopping.clone(), shared.idle_timeout, what).await
}

/// `GET|POST /portForward/{namespace}/{pod}[/{uid}]`.
pub(crate) async fn port_forward<V: NodeView>(
    State(shared): St<V>,
    Path(path): Path<StreamPath>,
    Query(query): Query<Vec<(String, String)>>,
    mut request: Request,
) -> Response {
    let ports = match parse_ports(&query, is_websocket(request.headers())) {
        Ok(p) => p,
        Err(message) => return StreamError::BadRequest(message.to_string()).into_response(),
    };
    let (permit, runtime, target) = match begin(&shared, &path, &request) {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let what = format!("port-forward {}/{}", path.namespace, path.pod);
    let native = port_forward::negotiate(request.headers());
    if let (Some(protocol), Some(key)) = (native, request.headers().get(header::SEC_WEBSOCKET_KEY).cloned()) {
        let tcp_ports: Vec<u16> = ports.iter().filter_map(|&p| u16::try_from(p).ok()).collect();
        match forward_natively(&shared, &runtime, &target.sandbox_id, &tcp_ports).await {
            Ok(dialed) => {
                debug!(%what, ?protocol, "forwarding in the pod's network namespace");
                let client = hyper::upgrade::on(&mut request);
                // A bare spawn: per connection, owned by the server (the upgraded port-forward stream).
                tokio::spawn(port_forward::serve(
                    client,
                    dialed,
                    permit,
                    shared.stopping.clone(),
                    shared.idle_timeout,
                    what,
                ));
                return port_forward::switching_protocols(&key, protocol);
            }
            Err(reason) => {
                debug!(%what, %reason, "cannot forward in the pod's network; using CRI PortForward")
            }
        }
    }
    let url = match runtime.port_forward(&target.sandbox_id, ports).await {
        Ok(url) => url,
        Err(source) => return StreamError::Cri { call: "PortForward", source }.into_response(),
    };
    proxy(request, &url, permit, shared.stopping.clone(), shared.idle_timeout, what).await
}

/// Finds the sandbox's network and dials `ports` there; the reason when the runtime must forward instead.
async fn forward_natively<V: NodeView>(
    shared: &Shared<V>,
    runtime: &nodelet_cri::CriClient,
    sandbox_id: &str,
    ports: &[u16],
) -> Result<Vec<port_forward::Dialed>, NativeForwardError> {
    let network = match runtime.sandbox_network(sandbox_id).await {
        Ok(Some(network)) => network,
        Ok(None) => return Err(NativeForwardError::NoNetwork),
        Err(e) => return Err(NativeForwardError::Status(e)),
    };
    Ok(port_forward::dial_all(&shared.dialer, &network, sandbox_id, ports).await?)
}

/// `POST /run/{namespace}/{pod}[/{uid}]/{container}?cmd=…`.
pub(crate) async fn run<V: NodeView>(
    State(shared): St<V>,
    Path(path): Path<StreamPath>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    if let Err(e) = path.validate() {
        return e.into_response();
    }
    let cmd: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "cmd")
        .flat_map(|(_, v)| v.split(' ').filter(|w| !w.is_empty()).map(str::to_owned))
        .collect();
    if cmd.is_empty() {
        return StreamError::BadRequest("you must specify a command (the cmd parameter)".to_owned())
            .into_response();
    }
    let Some(runtime) = shared.runtime.clone() else { return StreamError::NoRuntime.into_response() };
    let target = match resolve(&shared, &path) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let container_id = target.container_id.unwrap_or_default();
    match runtime.exec_sync(&container_id, cmd.clone(), Duration::ZERO).await {
        Ok(out) => {
            let mut body = out.stdout;
            body.extend_from_slice(&out.stderr);
            if out.exit_code == 0 {
                let mut response = body.into_response();
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                response
            } else {
                status::failure(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "command '{}' exited with {}: {}",
                        cmd.join(" "),
                        out.exit_code,
                        String::from_utf8_lossy(&body)
                    ),
                )
            }
        }
        Err(source) => StreamError::Cri { call: "ExecSync", source }.into_response(),
    }
}

fn resolve<V: NodeView>(shared: &Shared<V>, path: &StreamPath) -> Result<super::StreamTarget, StreamError> {
    shared
        .view
        .stream_target(&path.namespace, &path.pod, path.uid.as_deref(), path.container.as_deref())
        .map_err(|e| target_error(path, e))
}

/// The request headers passed on to the runtime's streaming server.
fn is_streaming_header(name: &HeaderName) -> bool {
    let n = name.as_str();
    n == "connection" || n == "upgrade" || n == "x-stream-protocol-version" || n.starts_with("sec-websocket-")
}

/// The loopback address of the runtime's streaming URL (plain HTTP only).
fn upstream_addr(uri: &Uri) -> Result<SocketAddr, StreamError> {
    if uri.scheme_str() != Some("http") {
        return Err(StreamError::Upstream(format!("unsupported streaming URL {uri}: only http on loopback")));
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if host == "localhost" {
        IpAddr::from([127, 0, 0, 1])
    } else {
        host.parse().map_err(|_| StreamError::Upstream(format!("streaming URL {uri} has no IP address")))?
    };
    if !ip.is_loopback() {
        return Err(StreamError::Upstream(format!(
            "streaming URL {uri} is not on loopback; refusing to proxy to it"
        )));
    }
    Ok(SocketAddr::new(ip, uri.port_u16().unwrap_or(80)))
}

/// Forwards the upgrade request to `url`, relays the runtime's answer and, on 101, copies bytes between the
/// two upgraded connections in a task that holds `permit` until the session ends.
async fn proxy(
    mut request: Request,
    url: &str,
    permit: SessionPermit,
    stopping: CancellationToken,
    idle_timeout: Option<Duration>,
    what: String,
) -> Response {
    let mut forwarded = HeaderMap::new();
    for (name, value) in request.headers() {
        if is_streaming_header(name) {
            forwarded.append(name.clone(), value.clone());
        }
    }
    debug!(%what, method = %request.method(), headers = ?forwarded, "forwarding the upgrade to the runtime");
    match open_upstream(request.method().clone(), forwarded, url).await {
        Ok(Upstream::Switched { headers, upgrade }) => {
            debug!(%what, ?headers, "the runtime switched protocols");
            let client = hyper::upgrade::on(&mut request);
            // A bare spawn: per connection, owned by the server (the relayed upgrade).
            tokio::spawn(relay(client, upgrade, permit, stopping, idle_timeout, what));
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            *response.headers_mut() = headers;
            response
        }
        Ok(Upstream::Refused(response)) => response,
        Err(e) => e.into_response(),
    }
}

enum Upstream {
    Switched { headers: HeaderMap, upgrade: hyper::upgrade::OnUpgrade },
    Refused(Response),
}

async fn open_upstream(method: Method, forwarded: HeaderMap, url: &str) -> Result<Upstream, StreamError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| StreamError::Upstream(format!("the runtime returned a bad URL {url:?}: {e}")))?;
    let addr = upstream_addr(&uri)?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let fail = |what: &str, e: &dyn std::fmt::Display| StreamError::Upstream(format!("{what} {addr}: {e}"));
    let exchange = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| fail("cannot connect to", &e))?;
        // Interactive sessions send small frames (keystrokes, prompts): no Nagle delay on them.
        if let Err(error) = tcp.set_nodelay(true) {
            debug!(%error, "cannot set TCP_NODELAY on the runtime streaming connection");
        }
        let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(tcp))
            .await
            .map_err(|e| fail("HTTP handshake with", &e))?;
        // Drives the connection until the upgrade hands its socket over (or it fails).
        // A bare spawn: per connection, owned by the server (the upstream connection of one upgrade).
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                debug!(%error, "runtime streaming connection ended with an error");
            }
        });
        let mut forward = hyper::Request::builder().method(method).uri(path.as_str());
        if let Some(headers) = forward.headers_mut() {
            *headers = forwarded;
            if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
                headers.insert(header::HOST, host);
            }
        }
        let forward = forward.body(Body::empty()).map_err(|e| fail("cannot build the request to", &e))?;
        sender.send_request(forward).await.map_err(|e| fail("no answer from", &e))
    };
    let mut response = tokio::time::timeout(RUNTIME_TIMEOUT, exchange)
        .await
        .map_err(|_| StreamError::Upstream(format!("{addr} did not answer within {RUNTIME_TIMEOUT:?}")))??;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upgrade = hyper::upgrade::on(&mut response);
        return Ok(Upstream::Switched { headers: response.headers().clone(), upgrade });
    }
    // Pass the runtime's refusal on (e.g. 400 for an unsupported protocol version).
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let body = tokio::time::timeout(
        RUNTIME_TIMEOUT,
        axum::body::to_bytes(Body::new(response.into_body()), MAX_ERROR_BODY),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default();
    debug!(%status, body = %String::from_utf8_lossy(&body), "the runtime refused a streaming upgrade");
    let mut out = (status, body).into_response();
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(Upstream::Refused(out))
}

/// Copies between the client's and the runtime's upgraded connections until one side closes, nothing has
/// gone either way for `idle_timeout`, the client does not take up its connection in time, or the servers
/// stop.
async fn relay(
    client: hyper::upgrade::OnUpgrade,
    runtime: hyper::upgrade::OnUpgrade,
    permit: SessionPermit,
    stopping: CancellationToken,
    idle_timeout: Option<Duration>,
    what: String,
) {
    let _permit = permit;
    let activity = Activity::new();
    let session = async {
        let runtime = runtime.await.map_err(|e| format!("runtime side: {e}"))?;
        debug!(%what, "runtime side upgraded");
        let client = tokio::time::timeout(UPGRADE_WAIT, client)
            .await
            .map_err(|_| format!("the client did not take up the connection within {UPGRADE_WAIT:?}"))?
            .map_err(|e| format!("client side: {e}"))?;
        debug!(%what, "client side upgraded; relaying");
        let (client_read, client_write) =
            tokio::io::split(Tracked::new(TokioIo::new(client), activity.clone()));
        let (runtime_read, runtime_write) = tokio::io::split(TokioIo::new(runtime));
        // The first direction to end ends the session (as the kubelet's upgrade proxy does): a client that
        // goes away, even with a clean close, must not keep the runtime's session (and this slot) open
        // until the command happens to end; the runtime's close after its last frame ends it too.
        tokio::select! {
            sent = pump(client_read, runtime_write) => {
                sent.map(|n| format!("the client closed after sending {n} bytes"))
                    .map_err(|e| format!("client to runtime: {e}"))
            }
            received = pump(runtime_read, client_write) => {
                received.map(|n| format!("the runtime closed after sending {n} bytes"))
                    .map_err(|e| format!("runtime to client: {e}"))
            }
        }
    };
    tokio::select! {
        result = session => match result {
            Ok(how) => debug!(%what, %how, "streaming session ended"),
            Err(error) => debug!(%what, %error, "streaming session ended"),
        },
        () = idle(&activity, idle_timeout) => {
            info!(%what, ?idle_timeout, "streaming session closed: idle (streamingConnectionIdleTimeout)")
        }
        () = stopping.cancelled() => info!(%what, "streaming session closed: the servers are stopping"),
    }
}

/// Copies `from` to `to` in [`COPY_BUFFER`] pieces until `from` ends, then shuts `to` down (which flushes
/// it, and sends a TLS close_notify to a TLS client); the bytes copied.
async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) -> std::io::Result<u64> {
    let mut buf = vec![0_u8; COPY_BUFFER];
    let mut total = 0_u64;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.shutdown().await?;
            return Ok(total);
        }
        to.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn stdio_flags_follow_the_kubelet() {
        let (cmd, s) = parse_stdio(&q(&[
            ("command", "sh"),
            ("command", "-c"),
            ("stdout", "1"),
            ("tty", "true"),
            ("stderr", "1"),
        ]))
        .expect("valid");
        assert_eq!(cmd, ["sh", "-c"]);
        assert_eq!(s, Stdio { stdin: false, stdout: true, stderr: false, tty: true });
        // the names the API server sends (the kubelet's `input`, `output`, `error`)
        let (_, s) =
            parse_stdio(&q(&[("input", "1"), ("output", "1"), ("error", "1")])).expect("kubelet names");
        assert!(s.stdin && s.stdout && s.stderr);
        assert!(parse_stdio(&q(&[("command", "ls"), ("stdout", "0")])).is_err());
        assert!(parse_stdio(&q(&[("tty", "1"), ("stderr", "1")])).is_err());
    }

    #[test]
    fn ports_are_validated() {
        let ws = true;
        assert_eq!(parse_ports(&q(&[("port", "80"), ("port", "8080,9090")]), ws), Ok(vec![80, 8080, 9090]));
        for bad in ["0", "70000", "65536", "x", "", "80,", ",80", "-1", "8080 "] {
            assert!(parse_ports(&q(&[("port", bad)]), ws).is_err(), "{bad:?}");
            assert!(parse_ports(&q(&[("port", bad)]), !ws).is_err(), "{bad:?}");
        }
        // WebSocket clients must name a port; SPDY clients name them in stream headers
        assert!(
            parse_ports(&q(&[("other", "1")]), ws)
                .is_err_and(|e| e.to_string().contains("\"port\" is required"))
        );
        assert_eq!(parse_ports(&q(&[]), !ws), Ok(vec![]));
        // At most 128 ports: the channel protocol has two of its 256 channels per port.
        let list = |n: u16| (1..=n).map(|p| p.to_string()).collect::<Vec<_>>().join(",");
        assert_eq!(parse_ports(&q(&[("port", &list(128))]), ws).map(|p| p.len()), Ok(128));
        let e = parse_ports(&q(&[("port", &list(129))]), ws).expect_err("129 ports").to_string();
        assert_eq!(
            e,
            "129 ports in one port-forward request; at most 128 (the channel protocol has two of its 256 channels \
             per port)"
        );
        assert_eq!(
            parse_ports(&q(&[("port", "0")]), ws).map_err(|e| e.to_string()),
            Err(r#"invalid port "0": must be 1-65535"#.to_owned())
        );
        assert_eq!(
            parse_stdio(&q(&[("command", "ls"), ("stdout", "0")])).map_err(|e| e.to_string()),
            Err("you must specify at least 1 of stdin, stdout, stderr".to_owned())
        );
        let repeated: Vec<(String, String)> = (1..=129).map(|p| ("port".to_owned(), p.to_string())).collect();
        assert!(parse_ports(&repeated, !ws).is_err(), "repeated parameters count too");
    }

    #[test]
    fn sessions_are_capped_per_user_and_in_all_and_given_back_on_drop() {
        let sessions = Sessions::new(3, 2);
        let a1 = sessions.acquire("alice").expect("first of alice");
        let _a2 = sessions.acquire("alice").expect("second of alice");
        let e = sessions.acquire("alice").expect_err("third of alice");
        assert!(matches!(&e, StreamError::TooManyForUser { user, max: 2 } if user == "alice"), "{e}");
        assert_eq!(e.code(), StatusCode::TOO_MANY_REQUESTS);
        let _b1 = sessions.acquire("bob").expect("bob still gets in");
        let e = sessions.acquire("carol").expect_err("every slot taken");
        assert!(matches!(e, StreamError::TooMany), "{e}");
        drop(a1);
        let _c1 = sessions.acquire("carol").expect("a slot came back");
        assert!(sessions.acquire("alice").is_err(), "no slot left in all");
        assert_eq!(sessions.users().get("alice"), Some(&1));
    }

    #[tokio::test(start_paused = true)]
    async fn activity_ends_the_idle_wait_only_after_a_quiet_timeout() {
        let activity = Activity::new();
        let timeout = Duration::from_secs(10);
        let idle = idle(&activity, Some(timeout));
        tokio::pin!(idle);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(6)).await;
            activity.touch();
            assert!(futures::poll!(idle.as_mut()).is_pending(), "traffic every 6 s keeps it open");
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(futures::poll!(idle.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(futures::poll!(idle.as_mut()).is_ready(), "10 s without traffic");
        let never = super::idle(&activity, None);
        tokio::pin!(never);
        tokio::time::advance(Duration::from_secs(100_000)).await;
        assert!(futures::poll!(never.as_mut()).is_pending());
    }

    #[tokio::test]
    async fn tracked_connections_count_reads_and_writes_as_activity() {
        let (a, mut b) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut tracked = Tracked::new(a, activity.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(activity.last.load(Ordering::Relaxed), 0);
        tracked.write_all(b"x").await.expect("write");
        let after_write = activity.last.load(Ordering::Relaxed);
        assert!(after_write >= 20, "{after_write}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.write_all(b"y").await.expect("write");
        let mut one = [0_u8; 1];
        tracked.read_exact(&mut one).await.expect("read");
        assert!(activity.last.load(Ordering::Relaxed) >= after_write + 20);
    }

    #[test]
    fn only_loopback_http_is_proxied() {
        let addr = |u: &str| upstream_addr(&u.parse().expect("uri"));
        assert_eq!(
            addr("http://127.0.0.1:4567/exec/abc").ok(),
            Some(SocketAddr::from(([127, 0, 0, 1], 4567)))
        );
        assert!(addr("http://[::1]:4567/exec/abc").is_ok());
        assert!(addr("http://10.0.0.1:4567/exec/abc").is_err());
        assert!(addr("https://127.0.0.1:4567/exec/abc").is_err());
        assert!(addr("http://example.com/exec/abc").is_err());
    }

    #[test]
    fn only_streaming_headers_are_forwarded() {
        for name in [
            "connection",
            "upgrade",
            "x-stream-protocol-version",
            "sec-websocket-key",
            "sec-websocket-protocol",
        ] {
            assert!(is_streaming_header(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["authorization", "cookie", "x-remote-user", "impersonate-user"] {
            assert!(!is_streaming_header(&HeaderName::from_static(name)), "{name}");
        }
    }
}
