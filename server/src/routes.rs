//! The routers of the three listeners and their handlers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::NodeView;
use super::auth::{Authenticator, ClientCert, UserInfo};
use super::logs::{self, LogError, LogOptions};
use super::status;
use super::streaming;
use super::webhook::{AccessReviewer, Decision, request_attributes};

/// Who may do what on the main port (`authorization.mode`).
#[derive(Debug)]
pub(crate) enum Authorizer {
    /// Every authenticated request (anonymous ones too, when enabled) is allowed.
    AlwaysAllow,
    /// A SubjectAccessReview decides (cluster mode).
    Webhook(Box<AccessReviewer>),
}

/// What every handler needs.
pub(crate) struct Shared<V> {
    pub(crate) view: Arc<V>,
    pub(crate) authenticator: Arc<Authenticator>,
    pub(crate) authorizer: Arc<Authorizer>,
    /// Cancelled when the servers stop: ends followed log streams.
    pub(crate) stopping: CancellationToken,
    pub(crate) log_poll_interval: Duration,
    /// The container runtime for the streaming endpoints.
    pub(crate) runtime: Option<nodelet_cri::CriClient>,
    /// Open streaming sessions, in all and per user (see [`streaming::Sessions`]).
    pub(crate) sessions: Arc<streaming::Sessions>,
    /// `streamingConnectionIdleTimeout`: a session with no traffic for this long is closed (`None`: never).
    pub(crate) idle_timeout: Option<Duration>,
    /// Dials pod ports in their network namespaces (nodelet's own WebSocket port-forward).
    pub(crate) dialer: nodelet_cri::NetnsDialer,
    /// The extensions' status tables (`/extensions/{name}`).
    pub(crate) extensions: crate::extensions::StatusTables,
    /// `--root-dir`: checkpoint archives go under `<root_dir>/checkpoints`.
    pub(crate) root_dir: std::path::PathBuf,
    /// The containers whose checkpoint is being written (one at a time per container).
    pub(crate) checkpoints: Arc<super::checkpoint::InProgress>,
}

/// Per-connection facts, put into every request's extensions by the connection's service.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub(crate) remote: SocketAddr,
    pub(crate) client_cert: ClientCert,
}

type St<V> = State<Arc<Shared<V>>>;

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The main port: everything, behind authentication.
pub(crate) fn main_router<V: NodeView>(shared: Arc<Shared<V>>) -> Router {
    Router::new()
        .route("/pods", get(pods::<V>))
        // Main port only, as the kubelet's (they need authorization).
        .route("/runningpods", get(running_pods::<V>))
        .route("/runningpods/", get(running_pods::<V>))
        .route("/configz", get(configz::<V>))
        .route("/healthz", get(healthz::<V>))
        .route("/metrics", get(metrics::<V>))
        .route("/metrics/resource", get(metrics_resource::<V>))
        .route("/metrics/cadvisor", get(metrics_cadvisor::<V>))
        .route("/metrics/probes", get(metrics_probes::<V>))
        .route("/stats/summary", get(stats_summary::<V>))
        .route("/api/v1/events", get(events::<V>))
        .route("/api/v1/persistentvolumes", get(persistent_volumes::<V>))
        .route("/api/v1/persistentvolumeclaims", get(persistent_volume_claims::<V>))
        .route("/apis/storage.k8s.io/v1/storageclasses", get(storage_classes::<V>))
        .route("/apis/storage.k8s.io/v1/csinodes", get(csi_nodes::<V>))
        .route("/api/v1/nodes", get(nodes::<V>))
        .route("/api/v1/nodes/{name}", get(node::<V>))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs::<V>))
        .route("/exec/{namespace}/{pod}/{container}", get(streaming::exec::<V>).post(streaming::exec::<V>))
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(streaming::exec::<V>).post(streaming::exec::<V>),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(streaming::attach::<V>).post(streaming::attach::<V>),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(streaming::attach::<V>).post(streaming::attach::<V>),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(streaming::port_forward::<V>).post(streaming::port_forward::<V>),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(streaming::port_forward::<V>).post(streaming::port_forward::<V>),
        )
        .route("/checkpoint/{namespace}/{pod}/{container}", post(super::checkpoint::checkpoint::<V>))
        .route("/debug/{namespace}/{pod}", post(debug_pod::<V>))
        .route("/extensions/{name}", get(extension_status::<V>))
        .route("/run/{namespace}/{pod}/{container}", post(streaming::run::<V>))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(streaming::run::<V>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(shared.clone(), authenticate::<V>))
        .with_state(shared)
}

/// The read-only port: the kubelet's unauthenticated set (`InstallAuthNotRequiredHandlers`) and no more:
/// `/pods`, `/healthz`, `/metrics`, `/metrics/resource`, `/metrics/cadvisor`, `/metrics/probes`,
/// `/stats/summary`. No logs, no streaming, and none of nodelet's own object lists (events, nodes, volumes,
/// storage classes, CSI nodes, extension tables): those are on the authenticated main port only.
pub(crate) fn read_only_router<V: NodeView>(shared: Arc<Shared<V>>) -> Router {
    Router::new()
        .route("/pods", get(pods::<V>))
        .route("/healthz", get(healthz::<V>))
        .route("/metrics", get(metrics::<V>))
        .route("/metrics/resource", get(metrics_resource::<V>))
        .route("/metrics/cadvisor", get(metrics_cadvisor::<V>))
        .route("/metrics/probes", get(metrics_probes::<V>))
        .route("/stats/summary", get(stats_summary::<V>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

/// The healthz port: `/healthz` only.
pub(crate) fn healthz_router<V: NodeView>(shared: Arc<Shared<V>>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::<V>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

/// Authenticates the request (see [`Authenticator::authenticate`]): 401 when it does not authenticate.
/// Then authorizes it: with [`Authorizer::Webhook`], a SubjectAccessReview for the request's verb and
/// subresource (see [`request_attributes`]); denied → 403 `Forbidden (user=…, verb=…, resource=nodes,
/// subresource(s)=[…])`, a failed review → 500 `Authorization error (…)` (the kubelet's answers).
async fn authenticate<V: NodeView>(State(shared): St<V>, mut request: Request, next: Next) -> Response {
    let none = ClientCert::None;
    let conn = request.extensions().get::<ConnInfo>();
    let remote = conn.map(|c| c.remote);
    let cert = conn.map_or(&none, |c| &c.client_cert);
    let user = match shared
        .authenticator
        .authenticate(cert, request.headers().get(header::AUTHORIZATION))
        .await
    {
        Ok(user) => user,
        Err(refused) => {
            info!(remote = ?remote, path = %request.uri().path(), reason = %refused.0, "refused an unauthenticated request");
            return status::failure(StatusCode::UNAUTHORIZED, refused.0);
        }
    };
    debug!(user = %user.name, remote = ?remote, method = %request.method(), path = %request.uri().path(), "authenticated request");
    if let Authorizer::Webhook(reviewer) = shared.authorizer.as_ref() {
        let attributes = request_attributes(request.method(), request.uri().path());
        let what = |first: &str, user: &UserInfo| {
            format!(
                "{first} (user={}, verb={}, resource=nodes, subresource(s)=[{}])",
                user.name, attributes.verb, attributes.subresource
            )
        };
        match reviewer.review(&user, attributes).await {
            Ok(Decision::Allowed) => {}
            Ok(Decision::Denied(reason)) => {
                info!(user = %user.name, verb = attributes.verb, subresource = attributes.subresource,
                      path = %request.uri().path(), reason = %reason, "refused an unauthorized request");
                return status::failure(StatusCode::FORBIDDEN, what("Forbidden", &user));
            }
            Err(e) => {
                error!(user = %user.name, verb = attributes.verb, subresource = attributes.subresource,
                       error = %e, "cannot authorize a request");
                return status::failure(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    what("Authorization error", &user),
                );
            }
        }
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// `POST /debug/{namespace}/{pod}` with a v1 `EphemeralContainer` (JSON): adds it to the static pod (what
/// `nodelet debug` does; API pods get theirs through the API server). 201 with the container as sent;
/// 400 for a body that is not an ephemeral container or one the pod cannot take, 403 when the pod with it
/// would break its source's Pod Security level (as the API server refuses `pods/ephemeralcontainers`), 404
/// for an unknown pod, 409 for an API pod, 500 when it cannot be kept.
async fn debug_pod<V: NodeView>(
    State(shared): St<V>,
    Path((namespace, pod)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    use crate::debug::DebugError;
    let container: k8s_openapi::api::core::v1::EphemeralContainer = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return status::failure(StatusCode::BAD_REQUEST, format!("not an EphemeralContainer: {e}")),
    };
    let echo = serde_json::to_vec(&container).unwrap_or_default();
    // Saving the container syncs a file: off the async workers.
    let view = shared.view.clone();
    let added =
        tokio::task::spawn_blocking(move || view.add_ephemeral_container(&namespace, &pod, container)).await;
    let added = match added {
        Ok(result) => result,
        Err(e) => {
            return status::failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("adding the container failed: {e}"),
            );
        }
    };
    match added {
        Ok(()) => {
            let response = (StatusCode::CREATED, echo).into_response();
            with_content_type(response, "application/json")
        }
        Err(e) => {
            let code = match &e {
                DebugError::PodNotFound { .. } => StatusCode::NOT_FOUND,
                DebugError::ApiPod(_) => StatusCode::CONFLICT,
                DebugError::Invalid(_) => StatusCode::BAD_REQUEST,
                DebugError::Forbidden(_) => StatusCode::FORBIDDEN,
                DebugError::NotSupported => StatusCode::NOT_IMPLEMENTED,
                DebugError::Save(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            status::failure(code, e.to_string())
        }
    }
}

/// `/extensions/{name}`: the extension's status as a `meta.k8s.io/v1` `Table`; 404 for an unknown name.
async fn extension_status<V: NodeView>(State(shared): St<V>, Path(name): Path<String>) -> Response {
    match shared.extensions.table(&name) {
        Some(table) => json_list(&table, "status table"),
        None => status::failure(StatusCode::NOT_FOUND, format!("no extension named {name:?}")),
    }
}

async fn pods<V: NodeView>(State(shared): St<V>) -> Response {
    match shared.view.pods_json() {
        Ok(body) => with_content_type(body.into_response(), "application/json"),
        Err(e) => {
            status::failure(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the pod list: {e}"))
        }
    }
}

/// `/runningpods/`: the pods the container runtime runs (see [`NodeView::running_pods`]).
async fn running_pods<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.running_pods(), "running pod")
}

/// `/configz`: the effective configuration (see [`NodeView::configz`]).
async fn configz<V: NodeView>(State(shared): St<V>) -> Response {
    match shared.view.configz() {
        Some(config) => json_list(&config, "configuration"),
        None => status::failure(StatusCode::NOT_FOUND, "the configuration is not available".to_owned()),
    }
}

async fn events<V: NodeView>(State(shared): St<V>) -> Response {
    match serde_json::to_vec(&shared.view.events()) {
        Ok(body) => with_content_type(body.into_response(), "application/json"),
        Err(e) => {
            status::failure(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the event list: {e}"))
        }
    }
}

fn json_list<T: serde::Serialize>(list: &T, what: &str) -> Response {
    match serde_json::to_vec(list) {
        Ok(body) => with_content_type(body.into_response(), "application/json"),
        Err(e) => {
            status::failure(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the {what} list: {e}"))
        }
    }
}

async fn persistent_volumes<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.persistent_volumes(), "persistent volume")
}

async fn persistent_volume_claims<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.persistent_volume_claims(), "persistent volume claim")
}

async fn storage_classes<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.storage_classes(), "storage class")
}

async fn csi_nodes<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.csi_nodes(), "CSI node")
}

async fn nodes<V: NodeView>(State(shared): St<V>) -> Response {
    json_list(&shared.view.nodes(), "node")
}

async fn node<V: NodeView>(State(shared): St<V>, Path(name): Path<String>) -> Response {
    match shared.view.nodes().items.into_iter().find(|n| n.metadata.name.as_deref() == Some(name.as_str())) {
        Some(node) => json_list(&node, "node"),
        None => status::failure(StatusCode::NOT_FOUND, format!("nodes {name:?} not found")),
    }
}

async fn healthz<V: NodeView>(State(shared): St<V>) -> Response {
    match shared.view.healthy() {
        Ok(()) => with_content_type("ok".into_response(), "text/plain; charset=utf-8"),
        Err(reason) => {
            warn!(%reason, "health check failed");
            let response = (StatusCode::INTERNAL_SERVER_ERROR, format!("healthz check failed: {reason}\n"));
            with_content_type(response.into_response(), "text/plain; charset=utf-8")
        }
    }
}

async fn metrics<V: NodeView>(State(shared): St<V>) -> Response {
    with_content_type(shared.view.metrics().into_response(), PROMETHEUS_TEXT)
}

/// `/stats/summary`; `?only_cpu_and_memory=true` leaves out filesystems, network and volumes.
async fn stats_summary<V: NodeView>(
    State(shared): St<V>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let only = query.iter().any(|(k, v)| k == "only_cpu_and_memory" && v == "true");
    match shared.view.stats_summary().await {
        Ok(summary) => {
            json_list(&if only { summary.only_cpu_and_memory() } else { summary }, "stats summary")
        }
        Err(e) => {
            status::failure(StatusCode::SERVICE_UNAVAILABLE, format!("cannot get the stats summary: {e}"))
        }
    }
}

/// `/metrics/resource`: the kubelet's resource metrics, from the summary.
async fn metrics_resource<V: NodeView>(State(shared): St<V>) -> Response {
    let summary = shared.view.stats_summary().await;
    let text = match &summary {
        Ok(s) => nodelet_stats::resource::encode(Ok(s)),
        Err(e) => nodelet_stats::resource::encode(Err(e)),
    };
    with_content_type(text.into_response(), PROMETHEUS_TEXT)
}

/// `/metrics/cadvisor`: cAdvisor's `container_*` and `machine_*` series, from the summary.
async fn metrics_cadvisor<V: NodeView>(State(shared): St<V>) -> Response {
    use nodelet_stats::cadvisor;
    let summary = shared.view.stats_summary().await;
    let now = nodelet_stats::summary::Time(
        time::OffsetDateTime::now_utc().unix_timestamp_nanos().try_into().unwrap_or(i64::MAX),
    );
    let machine = shared.view.machine();
    let families = match &summary {
        Ok(s) => cadvisor::families(Ok(s), &machine, now),
        Err(e) => cadvisor::families(Err(e), &machine, now),
    };
    with_content_type(cadvisor::encode(&families).into_response(), PROMETHEUS_TEXT)
}

/// `/metrics/probes`: the prober's metrics.
async fn metrics_probes<V: NodeView>(State(shared): St<V>) -> Response {
    with_content_type(shared.view.probe_metrics().into_response(), PROMETHEUS_TEXT)
}

/// An error of `/containerLogs` as the kubelet writes it: the message as plain text (go-restful's
/// `WriteError`), not a `Status`. The API server puts a kubelet's error body verbatim into the message of
/// its own error (`kubectl logs` then prints `Error from server (BadRequest): <message>`), so a JSON body
/// would be shown as JSON.
fn log_failure(code: StatusCode, message: String) -> Response {
    if code.is_server_error() {
        warn!(%code, %message, "container log request failed");
    }
    with_content_type((code, message).into_response(), "text/plain; charset=utf-8")
}

async fn container_logs<V: NodeView>(
    State(shared): St<V>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    for (what, value, valid) in [
        ("namespace", &namespace, is_dns_label(&namespace)),
        ("pod name", &pod, is_dns_subdomain(&pod)),
        ("container name", &container, is_dns_label(&container)),
    ] {
        if !valid {
            return log_failure(StatusCode::BAD_REQUEST, format!("invalid {what} {value:?}"));
        }
    }
    let options = match LogOptions::from_query(&query, k8s_openapi::jiff::Timestamp::now()) {
        Ok(options) => options,
        Err(message) => return log_failure(StatusCode::BAD_REQUEST, message.to_string()),
    };
    let view = shared.view.clone();
    let Some(path) = view.container_log(&namespace, &pod, &container) else {
        let pod_known = view.pods().items.iter().any(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && p.metadata.name.as_deref() == Some(pod.as_str())
        });
        let message = if pod_known {
            format!("container {container:?} in pod \"{namespace}/{pod}\" is not available")
        } else {
            format!("pod \"{namespace}/{pod}\" does not exist")
        };
        return log_failure(StatusCode::NOT_FOUND, message);
    };
    // The previous instance's log is the file of the restart before the newest
    // (`<container>/<restart>.log`).
    let path = if options.previous {
        let newest = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u32>().ok());
        let previous = newest.and_then(|n| n.checked_sub(1)).map(|n| path.with_file_name(format!("{n}.log")));
        match previous.filter(|p| std::fs::symlink_metadata(p).is_ok()) {
            Some(p) => p,
            None => {
                return log_failure(
                    StatusCode::BAD_REQUEST,
                    format!("previous terminated container {container:?} in pod {pod:?} not found"),
                );
            }
        }
    } else {
        path
    };
    let file = match logs::open(&path, &options).await {
        Ok(file) => file,
        Err(LogError::NotFound) => {
            return log_failure(
                StatusCode::NOT_FOUND,
                format!("container {container:?} in pod \"{namespace}/{pod}\" has no log yet"),
            );
        }
        Err(e @ (LogError::Symlink | LogError::NotRegular)) => {
            warn!(path = %path.display(), %namespace, %pod, %container, error = %e, "refusing to serve a log file");
            return log_failure(StatusCode::FORBIDDEN, format!("log of container {container:?}: {e}"));
        }
        Err(e @ LogError::Io(_)) => {
            warn!(path = %path.display(), error = %e, "cannot open a container log");
            return log_failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("log of container {container:?}: {e}"),
            );
        }
    };
    // A previous instance has stopped: its log is read to the end, never followed.
    let previous = options.previous;
    let running: Box<dyn Fn() -> bool + Send + Sync> =
        Box::new(move || !previous && view.container_running(&namespace, &pod, &container));
    let stream = file.into_stream(options, running, shared.stopping.clone(), shared.log_poll_interval);
    with_content_type(Body::from_stream(stream).into_response(), "text/plain; charset=utf-8")
}

async fn not_found(request: Request) -> Response {
    status::failure(StatusCode::NOT_FOUND, format!("the path {:?} is not served here", request.uri().path()))
}

async fn method_not_allowed(request: Request) -> Response {
    let path = request.uri().path();
    let allowed = if ["/exec/", "/attach/", "/portForward/"].iter().any(|p| path.starts_with(p)) {
        "GET, POST"
    } else if path.starts_with("/run/") {
        "POST"
    } else {
        "GET, HEAD"
    };
    let mut response = status::failure(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {} is not allowed on {path:?}; only {allowed} are", request.method()),
    );
    response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allowed));
    response
}

fn with_content_type(mut response: Response, content_type: &'static str) -> Response {
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub(crate) use nodelet_resources::common::names::{is_dns_label, is_dns_subdomain};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(is_dns_label("kube-system"));
        assert!(is_dns_subdomain("web-node1.example"));
        for bad in ["", "..", ".", "-a", "a-", "A", "a_b", "a/b", "a b", "%2e"] {
            assert!(!is_dns_label(bad) && !is_dns_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
