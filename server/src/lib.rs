//! nodelet's HTTP servers: the main HTTPS port, the optional read-only port and the healthz port.
//!
//! | Listener | Default | Transport | Authentication | Endpoints |
//! |---|---|---|---|---|
//! | main (`--address`:`--port`) | 0.0.0.0:10250 | HTTPS | client certificate, bearer token (token file, TokenReview), anonymous only if enabled | `/pods`, `/runningpods/`, `/configz`, `/healthz`, `/metrics`, `/metrics/resource`, `/metrics/cadvisor`, `/metrics/probes`, `/stats/summary`, `/containerLogs/{ns}/{pod}/{container}`, `/exec`, `/attach`, `/portForward`, `/run` (see `streaming.rs`), `POST /checkpoint/{ns}/{pod}/{container}` (see `checkpoint.rs`), `POST /debug/{ns}/{pod}` (ephemeral containers of static pods); nodelet's own lists for its CLI: `/api/v1/events`, `/api/v1/nodes[/{name}]`, `/api/v1/persistentvolumes`, `/api/v1/persistentvolumeclaims`, `/apis/storage.k8s.io/v1/storageclasses`, `/apis/storage.k8s.io/v1/csinodes`, `/extensions/{name}` |
//! | read-only (`--read-only-port`) | disabled (kubelet: 10255 when enabled) | HTTP | none | the kubelet's set only: `/pods`, `/healthz`, `/metrics`, `/metrics/resource`, `/metrics/cadvisor`, `/metrics/probes`, `/stats/summary` |
//! | healthz (`--healthz-bind-address`:`--healthz-port`) | 127.0.0.1:10248 | HTTP | none | `/healthz` |
//!
//! **Authentication on the main port** works like the kubelet's union authenticator: a client certificate
//! verified against `clientCAFile` (user = subject CN, groups = subject O) wins; otherwise an
//! `Authorization: Bearer` token is looked up in the static token file, and, when
//! `authentication.webhook.enabled` (cluster mode), a token not in the file is sent in a `TokenReview` to the
//! API server (answers cached by the token's SHA-256 for `cacheTTL`; see `webhook.rs`). A request that
//! presents credentials which do not authenticate is refused with 401, even when anonymous access is
//! enabled; so is one whose TokenReview failed (logged, not cached), as the kubelet does. A request without
//! credentials is served as `system:anonymous` (group `system:unauthenticated`) only when `anonymous_auth` is
//! true; nodelet's default is false (the kubelet's command-line default is true).
//!
//! **Authorization**: with `authorization.mode: AlwaysAllow` (the default standalone) every authenticated
//! user (and the anonymous user, when enabled) may use every endpoint. With `Webhook` (the default in
//! cluster mode) each request is checked with a `SubjectAccessReview` for resource `nodes`, the node's name,
//! the verb of the method (`create` on `/exec`, `/attach`, `/portForward` and `/run` whatever the method:
//! stricter than the kubelet, which authorizes a WebSocket exec as `get`) and the subresource of the path
//! (`stats`, `metrics`, `log`, `checkpoint`, else `proxy`), the kubelet's mapping; a denial is a 403
//! `Forbidden (user=…, verb=…, resource=nodes, subresource(s)=[…])`, a failed review a 500. Answers are cached (`cacheAuthorizedTTL`, `cacheUnauthorizedTTL`). `GET` and `HEAD` are
//! served; the streaming paths also take `POST` (SPDY clients), `/run` only `POST`; other methods get 405
//! (after authorization).
//!
//! Connections are HTTP/1.1 with upgrades enabled, accepted under the limits of [`conn`]: per listener at
//! most 1024 connections and 256 per client address, the oldest idle connection closed to make room for a
//! new one, 10 s for the TLS handshake, 120 s for a request's headers (also the keep-alive idle limit), 30 s for
//! a request body, 60 s for a stalled write. An upgraded exec/attach/port-forward connection leaves the
//! connection limit and graceful shutdown (it is counted by the streaming session limit instead and closed
//! when the servers stop).
//!
//! Errors are JSON `Status` objects (`kind: Status`, `code`, `reason`, `message`) like the API server's,
//! except `/healthz`, which answers plain text.
//!
//! The daemon provides the data through [`NodeView`], binds with [`Servers::bind`] and stops
//! the servers by completing the `shutdown` future.
//!
//! This crate (`nodelet-server`) imports the configuration (`nodelet-config`), the statistics
//! (`nodelet-stats`), the drivers it streams and reads through (`nodelet-cri`, `nodelet-node`), the pairs'
//! model (`nodelet-resources`) and `nodelet-shared`; never the daemon, the pod sources or the cluster client.
//! What they give the servers comes through [`NodeView`]; what the servers declare for them is here: the
//! extensions' [`StatusTable`]s, the [`DebugError`] of `POST /debug`, the connection limits of
//! [`conn`] (the HTTP pod source listens under them too), the serving certificate's handle.

mod auth;
pub mod checkpoint;
pub mod conn;
pub mod debug;
pub mod extensions;
pub mod logs;
pub mod pod_list;
mod port_forward;
mod routes;
mod status;
pub mod streaming;
mod tls;
mod webhook;

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::server::graceful::GracefulShutdown;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::Pod;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use auth::AuthError;
pub use debug::DebugError;
pub use extensions::{StatusTable, StatusTables};
pub use tls::{ServingCertHandle, TlsError};

use auth::{Authenticator, TokenAuthenticator};
use conn::Endpoint;
use routes::{Authorizer, Shared};
use webhook::{AccessReviewer, TokenReviewer};

pub use nodelet_config::{AuthorizationMode, TokenWebhookConfig};

/// What the servers show about the node. The daemon implements it over its live state.
///
/// The methods are synchronous and are called on the async runtime for every request: they must return
/// quickly (copy a snapshot under a short lock, never wait on the runtime or the network).
pub trait NodeView: Send + Sync + 'static {
    /// The pods on this node with their live status, served as a v1 `PodList` on `/pods`.
    fn pods(&self) -> List<Pod>;

    /// The pod with UID `uid`, as [`Self::pods`] shows it; `None` when there is none. The daemon
    /// overrides it to build that one pod instead of every pod.
    fn pod(&self, uid: &str) -> Option<Pod> {
        self.pods().items.into_iter().find(|p| p.metadata.uid.as_deref() == Some(uid))
    }

    /// The body of `/pods`: [`Self::pods`] as JSON. The daemon overrides it to write the pods where
    /// they are kept ([`pod_list::encode`]) instead of copying each one per request.
    fn pods_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&self.pods())
    }

    /// The metrics in the Prometheus text exposition format (version 0.0.4), already encoded, served on
    /// `/metrics`.
    fn metrics(&self) -> String;

    /// `Ok(())` when the node agent is healthy, else the reason, which `/healthz` returns with a 500.
    fn healthy(&self) -> Result<(), Unhealthy>;

    /// The newest CRI log file of a container (`<podLogsDir>/<ns>_<pod>_<uid>/<container>/<restart>.log`),
    /// or `None` when the pod or the container is unknown. The file is opened without following a final
    /// symbolic link and must be a regular file.
    fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf>;

    /// The runtime IDs behind `/exec`, `/attach` (a `container`) and `/portForward` (no container): the
    /// pod's newest sandbox and, when a container is named, its newest attempt, which must be running. `uid`,
    /// when given, must be the pod's UID. Default: no pods.
    fn stream_target(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        container: Option<&str>,
    ) -> Result<StreamTarget, StreamTargetError> {
        let _ = (namespace, pod, uid, container);
        Err(StreamTargetError::PodNotFound)
    }

    /// The running container behind `POST /checkpoint/{namespace}/{pod}/{container}`: the pod must be on
    /// this node, have a container (app, init or ephemeral) of that name in its spec, and that container
    /// a running instance. Default: no pods.
    fn checkpoint_target(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<checkpoint::CheckpointTarget, checkpoint::CheckpointTargetError> {
        let _ = (namespace, pod, container);
        Err(checkpoint::CheckpointTargetError::PodNotFound)
    }

    /// Adds the ephemeral container `container` to the static pod `namespace/pod` (`POST
    /// /debug/{namespace}/{pod}`, what `nodelet debug` sends). Default: not supported.
    fn add_ephemeral_container(
        &self,
        namespace: &str,
        pod: &str,
        container: k8s_openapi::api::core::v1::EphemeralContainer,
    ) -> Result<(), crate::debug::DebugError> {
        let _ = (namespace, pod, container);
        Err(crate::debug::DebugError::NotSupported)
    }

    /// The pods running in the container runtime (a ready sandbox or a running container), as the
    /// runtime shows them: served as a v1 `PodList` on `/runningpods/` with, like the kubelet's, only
    /// `metadata` (name, namespace, uid) and `spec.containers` (name, image of the running containers).
    /// Default: none.
    fn running_pods(&self) -> List<Pod> {
        List::default()
    }

    /// The effective configuration served on `/configz` (`{"kubeletconfig": {...}}`, see
    /// [`nodelet_config::configz`]); `None`: not available (404).
    fn configz(&self) -> Option<serde_json::Value> {
        None
    }

    /// Warning events (broken manifests, failing pod operations), served as a v1 `EventList` on
    /// `/api/v1/events`. Default: none.
    fn events(&self) -> k8s_openapi::List<k8s_openapi::api::core::v1::Event> {
        k8s_openapi::List::default()
    }

    /// A number that stays the same while nothing [`Self::events`] is made from changes: taken
    /// before a call of `events`, the same number later says that a new call would return no new
    /// event and no changed count or message (what depends on the time alone may differ: a
    /// timestamp of "now", an event that aged out), so the cluster's event sink need not call it.
    /// It must be cheap (a few atomic loads). `None`, the default: unknown, the events may change
    /// at any time (the sink calls `events` on every pass).
    fn events_generation(&self) -> Option<u64> {
        None
    }

    /// The PersistentVolumes with their status, served as a v1 `PersistentVolumeList` on
    /// `/api/v1/persistentvolumes`. Default: none.
    fn persistent_volumes(&self) -> k8s_openapi::List<k8s_openapi::api::core::v1::PersistentVolume> {
        k8s_openapi::List::default()
    }

    /// The PersistentVolumeClaims with their status, served as a v1 `PersistentVolumeClaimList` on
    /// `/api/v1/persistentvolumeclaims`. Default: none.
    fn persistent_volume_claims(
        &self,
    ) -> k8s_openapi::List<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
        k8s_openapi::List::default()
    }

    /// The StorageClasses, served as a storage.k8s.io/v1 `StorageClassList` on
    /// `/apis/storage.k8s.io/v1/storageclasses`. Default: none.
    fn storage_classes(&self) -> k8s_openapi::List<k8s_openapi::api::storage::v1::StorageClass> {
        k8s_openapi::List::default()
    }

    /// This node's CSINode (the registered CSI drivers), served as a storage.k8s.io/v1 `CSINodeList`
    /// on `/apis/storage.k8s.io/v1/csinodes`. Default: none.
    fn csi_nodes(&self) -> k8s_openapi::List<k8s_openapi::api::storage::v1::CSINode> {
        k8s_openapi::List::default()
    }

    /// This node as a v1 `Node` (conditions `MemoryPressure`, `DiskPressure`, `PIDPressure`, `Ready`),
    /// served as a `NodeList` on `/api/v1/nodes` and alone on `/api/v1/nodes/{name}`. Default: none.
    fn nodes(&self) -> k8s_openapi::List<k8s_openapi::api::core::v1::Node> {
        k8s_openapi::List::default()
    }

    /// The Summary API document served on `/stats/summary` (and turned into `/metrics/resource`): the one
    /// gathered last in the background (every housekeeping interval), or gathered now when there is none
    /// recent. Default: unavailable.
    fn stats_summary(
        &self,
    ) -> impl Future<Output = Result<nodelet_stats::summary::Summary, nodelet_stats::StatsError>> + Send {
        std::future::ready(Err(nodelet_stats::StatsError::Task("stats are not available".to_owned())))
    }

    /// The prober's metrics (`prober_probe_total`, `prober_probe_duration_seconds`) in the Prometheus text
    /// format, served on `/metrics/probes` (the kubelet keeps them off `/metrics`). Default: none.
    fn probe_metrics(&self) -> String {
        String::new()
    }

    /// The machine's `machine_*` facts for `/metrics/cadvisor`. Default: unknown (left out).
    fn machine(&self) -> nodelet_stats::cadvisor::Machine {
        nodelet_stats::cadvisor::Machine::default()
    }

    /// Whether the container is running; `/containerLogs?follow=true` stops once the container is no longer
    /// running and its log has been read to the end. The default looks the container up in [`Self::pods`]
    /// (`status.containerStatuses[].state.running`, init and ephemeral containers included); override it
    /// when a cheaper answer is at hand.
    fn container_running(&self, namespace: &str, pod: &str, container: &str) -> bool {
        self.pods().items.iter().any(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(pod)
                && p.status.as_ref().is_some_and(|s| {
                    [&s.container_statuses, &s.init_container_statuses, &s.ephemeral_container_statuses]
                        .into_iter()
                        .flatten()
                        .flatten()
                        .any(|c| {
                            c.name == container && c.state.as_ref().is_some_and(|st| st.running.is_some())
                        })
                })
        })
    }
}

/// What [`NodeView::stream_target`] resolves a streaming request to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTarget {
    /// The pod's newest sandbox (for CRI `PortForward`).
    pub sandbox_id: String,
    /// The running container (for CRI `Exec` / `Attach` / `ExecSync`), when one was named.
    pub container_id: Option<String>,
}

/// Why [`NodeView::healthy`] says the node agent is not healthy (the text `/healthz` returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The container runtime has not answered `Status` as ready.
    #[error("container runtime is not ready")]
    RuntimeNotReady,
}

/// Why [`NodeView::stream_target`] found nothing to stream to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StreamTargetError {
    /// No such pod on this node.
    #[error("pod does not exist")]
    PodNotFound,
    /// The pod exists with another UID.
    #[error("pod not found (another UID)")]
    UidMismatch,
    /// The pod has no container of that name in the runtime.
    #[error("container not found")]
    ContainerNotFound,
    /// The container exists but is not running.
    #[error("container not running")]
    NotRunning,
    /// The pod has no sandbox (port-forward).
    #[error("pod has no sandbox")]
    NoSandbox,
}

/// Where and how the servers listen. Field names follow the kubelet's flags and
/// `KubeletConfiguration` fields; [`ServerConfig::new`] fills in the defaults listed on each field.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--address` / `address`: the main port's bind address. Default `0.0.0.0` (as the kubelet).
    pub address: IpAddr,
    /// `--port` / `port`: the main HTTPS port. Default 10250 (as the kubelet). 0 picks a free port (tests);
    /// the kubelet rejects 0.
    pub port: u16,
    /// `--read-only-port` / `readOnlyPort`: the unauthenticated plain-HTTP port, bound to `address`.
    /// Default `None` = disabled (the kubelet's config-file default; its command-line legacy default is
    /// 10255). `Some(0)` picks a free port; map the flag value 0 to `None`.
    pub read_only_port: Option<u16>,
    /// `--healthz-bind-address` / `healthzBindAddress`. Default `127.0.0.1` (as the kubelet).
    pub healthz_bind_address: IpAddr,
    /// `--healthz-port` / `healthzPort`. Default `Some(10248)` (as the kubelet); `None` disables it (the
    /// kubelet's value 0); `Some(0)` picks a free port.
    pub healthz_port: Option<u16>,
    /// `--tls-cert-file` / `tlsCertFile`: PEM certificate chain for the main port. When it and
    /// `tls_private_key_file` are unset, a self-signed certificate is generated once and kept under
    /// `<root_dir>/pki/nodelet.crt` and `nodelet.key` (the kubelet keeps `kubelet.crt|key` under `--cert-dir`).
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-private-key-file` / `tlsPrivateKeyFile`: PEM private key (PKCS#8, PKCS#1 or SEC1) matching
    /// `tls_cert_file`. Both or neither must be set.
    pub tls_private_key_file: Option<PathBuf>,
    /// `--client-ca-file` / `authentication.x509.clientCAFile`: PEM bundle of CAs whose client certificates
    /// authenticate (user = CN, groups = O). Default unset: client certificates are not requested.
    pub client_ca_file: Option<PathBuf>,
    /// `--token-auth-file`: static bearer tokens, CSV `token,user,uid[,"group1,group2"]` in the API
    /// server's format. nodelet-specific (the kubelet authenticates tokens through a TokenReview webhook).
    pub token_auth_file: Option<PathBuf>,
    /// `--anonymous-auth` / `authentication.anonymous.enabled`: serve requests without credentials as
    /// `system:anonymous`. Default false (the kubelet's command-line default is true).
    pub anonymous_auth: bool,
    /// `--authentication-token-webhook` / `authentication.webhook`: bearer tokens not in the token file
    /// are checked with a TokenReview through [`Self::kube_client`]. Default `None` (off).
    pub token_webhook: Option<TokenWebhookConfig>,
    /// `--authorization-mode` / `authorization`: `Webhook` checks every request with a
    /// SubjectAccessReview through [`Self::kube_client`]. Default here `AlwaysAllow`; the daemon's
    /// configuration makes it `Webhook` in cluster mode ([`nodelet_config`]).
    pub authorization: AuthorizationMode,
    /// The cluster's API client (cluster mode), which both webhooks need.
    pub kube_client: Option<ApiClient>,
    /// The container runtime, for `/exec`, `/attach`, `/portForward`, `/run` and `/checkpoint`. Default
    /// `None`: those answer 503.
    pub runtime: Option<nodelet_cri::CriClient>,
    /// `--root-dir`. Default `/var/lib/nodelet` (the kubelet: `/var/lib/kubelet`). Checkpoint archives go
    /// under `<root_dir>/checkpoints`.
    pub root_dir: PathBuf,
    /// With `serverTLSBootstrap`: the certificate from the cluster, served instead of the self-signed one
    /// once it is there (read at each handshake, so rotation needs no restart). Default `None`.
    pub serving_cert: Option<ServingCertHandle>,
    /// The node's host name, put with `localhost`, 127.0.0.1 and ::1 into the self-signed certificate.
    pub hostname: String,
    /// How long open connections (log streams included) may take to finish after shutdown is asked
    /// before they are dropped. Default 5 s (nodelet-specific).
    pub shutdown_grace: Duration,
    /// The extensions' status tables, served on `/extensions/{name}` (see [`StatusTable`]).
    pub extensions: crate::extensions::StatusTables,
    /// `--streaming-connection-idle-timeout` / `streamingConnectionIdleTimeout`: an exec, attach or
    /// port-forward session with no traffic either way for this long is closed. Default 4 h (as the
    /// kubelet); zero: never.
    pub streaming_idle_timeout: Duration,
    /// `nodelet.maxStreamingSessionsPerUser`: streaming sessions one authenticated user may have open at
    /// once (nodelet-only). Default [`streaming::DEFAULT_MAX_SESSIONS_PER_USER`].
    pub max_streaming_sessions_per_user: usize,
}

impl ServerConfig {
    /// The defaults documented on each field, for a node called `hostname`.
    pub fn new(hostname: impl Into<String>) -> Self {
        Self {
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 10250,
            read_only_port: None,
            healthz_bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            healthz_port: Some(10248),
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            token_auth_file: None,
            anonymous_auth: false,
            token_webhook: None,
            authorization: AuthorizationMode::AlwaysAllow,
            kube_client: None,
            runtime: None,
            root_dir: PathBuf::from("/var/lib/nodelet"),
            serving_cert: None,
            hostname: hostname.into(),
            shutdown_grace: Duration::from_secs(5),
            extensions: Default::default(),
            streaming_idle_timeout: streaming::DEFAULT_IDLE_TIMEOUT,
            max_streaming_sessions_per_user: streaming::DEFAULT_MAX_SESSIONS_PER_USER,
        }
    }
}

/// The cluster's API client, as [`ServerConfig::kube_client`] holds it.
#[derive(Clone)]
pub struct ApiClient(pub kube::Client);

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiClient")
    }
}

/// Why the servers could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not bind its address.
    #[error("cannot listen on {addr} for the {listener}: {source}")]
    Bind {
        /// Which listener, with the flag that sets its port (e.g. "main HTTPS port (--port)").
        listener: &'static str,
        /// The address and port it tried.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The serving certificate, its key or the client CA bundle could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The token file could not be read or parsed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A webhook is configured but there is no API client (not in cluster mode).
    #[error("{0} needs the cluster's API client (cluster mode, --kubeconfig)")]
    NoApiClient(&'static str),
}

/// The bound listeners, ready to serve. Binding first lets the caller report the addresses (with port 0
/// resolved) before serving.
pub struct Servers {
    main: Endpoint,
    read_only: Option<Endpoint>,
    healthz: Option<Endpoint>,
    /// Cancelled when shutdown starts: ends log streams.
    stopping: CancellationToken,
    grace: Duration,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("main", &self.main.addr)
            .field("read_only", &self.read_only.as_ref().map(|l| l.addr))
            .field("healthz", &self.healthz.as_ref().map(|l| l.addr))
            .finish_non_exhaustive()
    }
}

impl Servers {
    /// Loads or generates the TLS material, reads the token file and binds every enabled listener.
    /// Fails with the listener, address and OS error when a port cannot be bound.
    pub async fn bind<V: NodeView>(config: &ServerConfig, view: Arc<V>) -> Result<Self, ServerError> {
        let tokens = match &config.token_auth_file {
            Some(path) => {
                let tokens = TokenAuthenticator::from_file(path)?;
                info!(path = %path.display(), tokens = tokens.len(), "loaded static bearer tokens");
                Some(tokens)
            }
            None => None,
        };
        let webhook = match (&config.token_webhook, &config.kube_client) {
            (None, _) => None,
            (Some(w), Some(client)) => {
                info!(cache_ttl = ?w.cache_ttl, "bearer tokens are checked with TokenReviews");
                Some(TokenReviewer::new(client.0.clone(), w.cache_ttl))
            }
            (Some(_), None) => return Err(ServerError::NoApiClient("TokenReview authentication")),
        };
        let authenticator = Arc::new(Authenticator::new(tokens, webhook, config.anonymous_auth));
        let authorizer = Arc::new(match (config.authorization, &config.kube_client) {
            (AuthorizationMode::AlwaysAllow, _) => Authorizer::AlwaysAllow,
            (AuthorizationMode::Webhook { cache_authorized_ttl, cache_unauthorized_ttl }, Some(client)) => {
                info!(
                    ?cache_authorized_ttl,
                    ?cache_unauthorized_ttl,
                    "requests are authorized with SubjectAccessReviews"
                );
                Authorizer::Webhook(Box::new(AccessReviewer::new(
                    client.0.clone(),
                    config.hostname.clone(),
                    cache_authorized_ttl,
                    cache_unauthorized_ttl,
                )))
            }
            (AuthorizationMode::Webhook { .. }, None) => {
                return Err(ServerError::NoApiClient("Webhook authorization"));
            }
        });
        let tls_config = tls::server_config(config)?;
        let stopping = CancellationToken::new();
        let shared = Arc::new(Shared {
            view,
            authenticator,
            authorizer,
            stopping: stopping.clone(),
            log_poll_interval: logs::DEFAULT_POLL_INTERVAL,
            runtime: config.runtime.clone(),
            sessions: streaming::Sessions::new(
                streaming::MAX_SESSIONS,
                config.max_streaming_sessions_per_user,
            ),
            idle_timeout: Some(config.streaming_idle_timeout).filter(|t| !t.is_zero()),
            dialer: nodelet_cri::NetnsDialer::default(),
            extensions: config.extensions.clone(),
            root_dir: config.root_dir.clone(),
            checkpoints: Arc::default(),
        });

        let main = bind_listener(
            "main HTTPS port (--port)",
            SocketAddr::new(config.address, config.port),
            routes::main_router(shared.clone()),
            Some(TlsAcceptor::from(tls_config)),
        )
        .await?;
        let read_only = match config.read_only_port {
            Some(port) => Some(
                bind_listener(
                    "read-only HTTP port (--read-only-port)",
                    SocketAddr::new(config.address, port),
                    routes::read_only_router(shared.clone()),
                    None,
                )
                .await?,
            ),
            None => None,
        };
        let healthz = match config.healthz_port {
            Some(port) => Some(
                bind_listener(
                    "healthz port (--healthz-port)",
                    SocketAddr::new(config.healthz_bind_address, port),
                    routes::healthz_router(shared.clone()),
                    None,
                )
                .await?,
            ),
            None => None,
        };
        Ok(Self { main, read_only, healthz, stopping, grace: config.shutdown_grace })
    }

    /// The main HTTPS port's bound address.
    pub fn main_addr(&self) -> SocketAddr {
        self.main.addr
    }

    /// The read-only port's bound address, when enabled.
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.read_only.as_ref().map(|l| l.addr)
    }

    /// The healthz port's bound address, when enabled.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().map(|l| l.addr)
    }

    /// Serves until `shutdown` completes, then stops accepting, ends log streams, lets open requests finish
    /// for up to the configured grace period and drops what is left.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let Self { main, read_only, healthz, stopping, grace } = self;
        let graceful = GracefulShutdown::new();
        let force = CancellationToken::new();
        for l in [Some(&main), read_only.as_ref(), healthz.as_ref()].into_iter().flatten() {
            info!(listener = l.name, addr = %l.addr, tls = l.tls.is_some(), "serving");
        }
        {
            let accepting = async {
                tokio::join!(
                    main.accept_loop(&stopping, &graceful, &force),
                    accept_optional(read_only, &stopping, &graceful, &force),
                    accept_optional(healthz, &stopping, &graceful, &force),
                );
            };
            tokio::select! {
                () = accepting => {}
                () = shutdown => stopping.cancel(),
            }
        }
        // Every accept loop has returned (and dropped its listener) once `stopping` is cancelled.
        stopping.cancel();
        info!(open_connections = graceful.count(), "servers stopping");
        if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
            warn!(grace = ?grace, "connections still open after the shutdown grace period; dropping them");
        }
        force.cancel();
        info!("servers stopped");
    }
}

#[cfg(test)]
/// Binds every enabled listener (see [`Servers::bind`]) and serves until `shutdown` completes.
pub async fn serve<V: NodeView>(
    config: &ServerConfig,
    view: Arc<V>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    Servers::bind(config, view).await?.run(shutdown).await;
    Ok(())
}

async fn bind_listener(
    name: &'static str,
    addr: SocketAddr,
    router: Router,
    tls: Option<TlsAcceptor>,
) -> Result<Endpoint, ServerError> {
    Endpoint::bind(name, addr, router, tls).await.map_err(|source| ServerError::Bind {
        listener: name,
        addr,
        source,
    })
}

async fn accept_optional(
    endpoint: Option<Endpoint>,
    stopping: &CancellationToken,
    graceful: &GracefulShutdown,
    force: &CancellationToken,
) {
    if let Some(endpoint) = endpoint {
        endpoint.accept_loop(stopping, graceful, force).await;
    }
}
