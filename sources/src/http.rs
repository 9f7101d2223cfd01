//! The HTTP source (`--manifest-http-addr`, off by default): an endpoint to submit pod manifests.
//!
//! | Request | Answer |
//! |---|---|
//! | `POST /pods` with a manifest (YAML or JSON: one Pod, a PodList, or several documents; `Content-Type` a JSON or YAML type) | `201` with `{"pods": [{"namespace", "name", "uid"}]}`; `422` with a `Status` listing the field errors, and nothing applied; `400` for unparseable text; `409` when a pod collides with one from another source; `415` for another content type |
//! | `GET /pods` | `200` with a `PodList` of the submitted pods |
//! | `DELETE /pods/{namespace}/{name}` (the name as submitted or with the node suffix) | `200` with the removed pod's `{"namespace", "name", "uid"}`; `404` if there is none |
//! | any request without `Authorization: Bearer <token>` (see **Security**) | `401` |
//!
//! Submitted pods are static pods (`kubernetes.io/config.source: http`; name suffixed with the
//! node name; UID hashed from the content, so submitting the same manifest again changes nothing
//! and a changed one replaces the pod of the same name). They are checkpointed durably (each pod's
//! document as submitted, in `<root-dir>/http-source/pods.json`) before the request is answered, and
//! restored, with the same UIDs, when nodelet starts again.
//!
//! **Security.** Whoever may submit pods here decides what runs on the node (within the source's Pod
//! Security level, `baseline` by default, and its namespaces and labels, see [`super::admission`]), so
//! every request must carry the endpoint's bearer token (`Authorization: Bearer <token>`): a random
//! 256-bit token in [`HttpSourceConfig::token_file`] (`<root-dir>/http-source/token`, mode 0600, owned by
//! nodelet's user, created at the first start and kept across restarts), so only who can read that file
//! (root) can use the endpoint; another local user's connection gets `401 Unauthorized`. The endpoint binds
//! only to loopback addresses unless `HttpSourceConfig::allow_remote` is set. Against web pages in a
//! local browser it also refuses requests whose `Host` is not a loopback name (DNS rebinding) and
//! submissions whose `Content-Type` is not JSON or YAML (so a cross-site form or `text/plain` request
//! cannot reach it without a CORS preflight, which it never grants).
//!
//! It is served under the same connection limits as the node's ports ([`nodelet_server::conn`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use nodelet_resources::model::pod::{DesiredPod, PodSource};
use nodelet_resources::pod::validation::{FieldError, FieldErrorKind};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::SourceHandle;
use super::admission::SourcePolicy;
use super::manifest::{self, MAX_MANIFEST_BYTES};
use nodelet_server::conn::{Endpoint, Limits};

/// The problems' location of submitted pods.
pub(crate) const LOCATION: &str = "http endpoint";
#[cfg(test)]
/// The address suggested for `--manifest-http-addr` (loopback; a port the kubelet does not use).
pub(crate) const DEFAULT_ADDR: &str = "127.0.0.1:10260";
/// The default limit on submitted pods.
pub(crate) const DEFAULT_MAX_PODS: usize = 256;

/// Errors of the HTTP source.
#[derive(Debug, thiserror::Error)]
pub enum HttpSourceError {
    /// The address is not a loopback address and `allow_remote` is not set.
    #[error(
        "refusing to serve the manifest endpoint on {0}: it is for local use; bind it to a loopback address, or \
         set allow_remote if you really mean to let whoever has its token run pods from the network"
    )]
    NotLoopback(SocketAddr),
    /// The token cannot be made or kept.
    #[error("cannot keep the manifest endpoint's token: {0}")]
    Token(String),
    /// The address cannot be bound.
    #[error("cannot bind the manifest endpoint to {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// How long open requests may finish when the source stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Settings of the [`HttpSource`].
#[derive(Debug, Clone)]
pub struct HttpSourceConfig {
    /// The address to listen on (port 0 picks a free port).
    pub addr: SocketAddr,
    /// Serve on a non-loopback address too. **Dangerous**: see the [module docs](self).
    pub(crate) allow_remote: bool,
    /// The most pods that may be submitted at once (default 256).
    pub max_pods: usize,
    /// Where the submitted pods are checkpointed (`<root-dir>/http-source/pods.json` in the daemon), so
    /// that they survive a restart; `None` keeps them in memory only.
    pub checkpoint: Option<PathBuf>,
    /// The file of the bearer token every request must carry (`<root-dir>/http-source/token` in the
    /// daemon): read if it holds a token only nodelet's user can read, else written with a new one (mode
    /// 0600). `None`: a new token in memory only (`HttpSource::token`).
    pub token_file: Option<PathBuf>,
}

impl HttpSourceConfig {
    /// The defaults for `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, allow_remote: false, max_pods: DEFAULT_MAX_PODS, checkpoint: None, token_file: None }
    }
}

/// The length of a token in hex digits (256 bits).
const TOKEN_HEX_LEN: usize = 64;

/// A new random token (256 bits, hex).
fn new_token() -> Result<String, HttpSourceError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; TOKEN_HEX_LEN / 2];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| HttpSourceError::Token("the system's random generator failed".to_owned()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token kept in `path`: the one there if only nodelet's user owns and can read the file and it holds a
/// token, else a new one written there (mode 0600).
fn load_or_create_token(path: &std::path::Path) -> Result<String, HttpSourceError> {
    use std::os::unix::fs::MetadataExt;
    let fail = |e: String| HttpSourceError::Token(format!("{}: {e}", path.display()));
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.is_file()
        && meta.uid() == rustix::process::geteuid().as_raw()
        && meta.mode() & 0o077 == 0
        && let Ok(text) = std::fs::read_to_string(path)
    {
        let token = text.trim();
        if token.len() == TOKEN_HEX_LEN && token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(token.to_owned());
        }
    }
    let token = new_token()?;
    nodelet_node::atomic::write_atomically(path, format!("{token}\n").as_bytes(), 0o600)
        .map_err(|e| fail(e.to_string()))?;
    Ok(token)
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The manifest submission endpoint; see the [module docs](self).
#[derive(Debug)]
pub struct HttpSource {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Arc<EndpointState>,
}

struct EndpointState {
    handle: SourceHandle,
    /// The bearer token every request must carry.
    token: String,
    /// Where it is kept, for the refusal's message.
    token_file: Option<PathBuf>,
    allow_remote: bool,
    max_pods: usize,
    /// Submitted pods by `namespace/name` as submitted.
    submitted: Mutex<BTreeMap<String, DesiredPod>>,
    /// The checkpoint file and, by the same keys, each pod's document as submitted (locked after
    /// `submitted`).
    checkpoint: Option<(PathBuf, Mutex<BTreeMap<String, serde_json::Value>>)>,
}

impl std::fmt::Debug for EndpointState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointState").field("token_file", &self.token_file).finish_non_exhaustive()
    }
}

impl HttpSource {
    /// Binds the endpoint and reports the (empty) set of submitted pods, so that this source
    /// counts as reported at once.
    pub async fn bind(config: HttpSourceConfig, handle: SourceHandle) -> Result<Self, HttpSourceError> {
        let addr = config.addr;
        if !addr.ip().to_canonical().is_loopback() {
            if !config.allow_remote {
                return Err(HttpSourceError::NotLoopback(addr));
            }
            tracing::warn!(%addr, "the manifest endpoint listens beyond loopback: whoever has its token can run pods");
        }
        let token = match &config.token_file {
            Some(path) => load_or_create_token(path)?,
            None => new_token()?,
        };
        let listener =
            TcpListener::bind(addr).await.map_err(|source| HttpSourceError::Bind { addr, source })?;
        let local_addr = listener.local_addr().map_err(|source| HttpSourceError::Bind { addr, source })?;
        let (submitted, documents) = match &config.checkpoint {
            Some(path) => restore(path, handle.node_name(), &handle.security().for_remote(&PodSource::Http)),
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        handle.report(submitted.values().cloned().collect(), Vec::new());
        if !submitted.is_empty() {
            tracing::info!(pods = submitted.len(), "submitted pods restored from the checkpoint");
        }
        let state = Arc::new(EndpointState {
            handle,
            token,
            token_file: config.token_file,
            allow_remote: config.allow_remote,
            max_pods: config.max_pods,
            submitted: Mutex::new(submitted),
            checkpoint: config.checkpoint.map(|path| (path, Mutex::new(documents))),
        });
        Ok(Self { listener, local_addr, state })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    #[cfg(test)]
    /// The bearer token requests must carry.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// Serves until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) {
        let router = Router::new()
            .route("/pods", get(list).post(submit))
            .route("/pods/{namespace}/{name}", delete(remove))
            .layer(DefaultBodyLimit::max(MAX_MANIFEST_BYTES))
            .with_state(self.state);
        let endpoint = Endpoint {
            name: "manifest endpoint (HTTP source)",
            listener: self.listener,
            addr: self.local_addr,
            router,
            tls: None,
            limits: Limits::default(),
        };
        endpoint.serve_until(shutdown, SHUTDOWN_GRACE).await;
    }
}

impl EndpointState {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, DesiredPod>> {
        self.submitted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The refusal of a request without the endpoint's bearer token, or whose `Host` is not a loopback
    /// name (unless remote access is allowed).
    fn refuse(&self, headers: &HeaderMap) -> Option<Response> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !presented.is_some_and(|t| same_secret(t.as_bytes(), self.token.as_bytes())) {
            let whence = self
                .token_file
                .as_ref()
                .map_or_else(String::new, |path| format!(" (the token is in {})", path.display()));
            let what = if presented.is_some() {
                "the bearer token is not the endpoint's"
            } else {
                "no bearer token"
            };
            tracing::info!(reason = what, "manifest endpoint: refused an unauthenticated request");
            return Some(status(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                format!("{what}: send Authorization: Bearer <token>{whence}"),
                Vec::new(),
            ));
        }
        self.refuse_host(headers)
    }

    /// The refusal of a request whose `Host` is not a loopback name, unless remote access is
    /// allowed.
    fn refuse_host(&self, headers: &HeaderMap) -> Option<Response> {
        if self.allow_remote {
            return None;
        }
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        (!is_loopback_host(host)).then(|| {
            status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("host {host:?} is not a loopback name"),
                Vec::new(),
            )
        })
    }
}

/// Why the checkpoint of the submitted pods could not be updated (the request fails with a 500).
#[derive(Debug, thiserror::Error)]
enum CheckpointError {
    /// The submission is not UTF-8.
    #[error("cannot checkpoint the submission: {0}")]
    NotText(#[source] std::str::Utf8Error),
    /// A pod of the submission was not found among its documents.
    #[error("cannot checkpoint pod {0:?}: its document was not found")]
    NoDocument(String),
    /// The checkpoint cannot be encoded.
    #[error("cannot encode the checkpoint: {0}")]
    Encode(#[source] serde_json::Error),
    /// The checkpoint cannot be written.
    #[error("cannot checkpoint the submitted pods: {0}")]
    Write(#[source] nodelet_node::atomic::AtomicWriteError),
}

impl EndpointState {
    /// Adds the pods `keys` of a submission (`body`, already parsed successfully) to the checkpoint and
    /// writes it durably; the submission is refused when that fails, so nothing is accepted that a restart
    /// would lose.
    fn checkpoint_submission<'a>(
        &self,
        body: &[u8],
        keys: impl Iterator<Item = &'a str>,
    ) -> Result<(), CheckpointError> {
        let Some((path, documents)) = &self.checkpoint else { return Ok(()) };
        let text = std::str::from_utf8(body).map_err(CheckpointError::NotText)?;
        let by_key = pod_documents(text);
        let mut documents = documents.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = documents.clone();
        for key in keys {
            let document = by_key.get(key).ok_or_else(|| CheckpointError::NoDocument(key.to_owned()))?;
            next.insert(key.to_owned(), document.clone());
        }
        write_checkpoint(path, &next)?;
        *documents = next;
        Ok(())
    }

    /// Drops `key` from the checkpoint.
    fn checkpoint_removal(&self, key: &str) -> Result<(), CheckpointError> {
        let Some((path, documents)) = &self.checkpoint else { return Ok(()) };
        let mut documents = documents.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = documents.clone();
        next.remove(key);
        write_checkpoint(path, &next)?;
        *documents = next;
        Ok(())
    }
}

fn write_checkpoint(
    path: &std::path::Path,
    documents: &BTreeMap<String, serde_json::Value>,
) -> Result<(), CheckpointError> {
    let bytes = serde_json::to_vec(documents).map_err(CheckpointError::Encode)?;
    nodelet_node::atomic::write_atomically(path, &bytes, 0o600).map_err(CheckpointError::Write)
}

/// The pod documents of a manifest (Pods, and the items of PodLists and Lists) by `namespace/name` as
/// written, the key [`manifest::parse`] gives them.
fn pod_documents(text: &str) -> BTreeMap<String, serde_json::Value> {
    let documents = match nodelet_shared::yaml::documents(text) {
        Ok(d) => d,
        Err((d, _)) => d,
    };
    let mut out = BTreeMap::new();
    let mut add = |pod: &serde_json::Value| {
        let name = pod.pointer("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or_default();
        let namespace =
            pod.pointer("/metadata/namespace").and_then(serde_json::Value::as_str).unwrap_or("default");
        out.insert(format!("{namespace}/{name}"), pod.clone());
    };
    for document in &documents {
        match document.get("kind").and_then(serde_json::Value::as_str) {
            Some("PodList" | "List") => {
                for item in document.get("items").and_then(serde_json::Value::as_array).into_iter().flatten()
                {
                    // A list's items may leave out their kind: stored as a Pod document of its own.
                    let mut item = item.clone();
                    if let Some(fields) = item.as_object_mut() {
                        fields.entry("apiVersion").or_insert_with(|| "v1".into());
                        fields.entry("kind").or_insert_with(|| "Pod".into());
                    }
                    add(&item);
                }
            }
            _ => add(document),
        }
    }
    out
}

/// The submitted pods of the checkpoint at `path`, parsed again as at submission (same UIDs). A
/// checkpoint that does not parse is moved aside and reported; a pod that is no longer valid is dropped
/// with a warning.
fn restore(
    path: &std::path::Path,
    node_name: &str,
    security: &SourcePolicy,
) -> (BTreeMap<String, DesiredPod>, BTreeMap<String, serde_json::Value>) {
    let mut pods = BTreeMap::new();
    let mut documents = BTreeMap::new();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (pods, documents),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the submitted pods' checkpoint");
            return (pods, documents);
        }
    };
    let stored: BTreeMap<String, serde_json::Value> = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(error) => {
            match nodelet_durable::quarantine(path) {
                Ok(aside) => {
                    tracing::error!(path = %path.display(), moved_to = %aside.display(), %error, "the submitted pods' checkpoint does not parse; it was moved aside")
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), %error, "the submitted pods' checkpoint does not parse and cannot be moved aside: {e}")
                }
            }
            return (pods, documents);
        }
    };
    for (key, document) in stored {
        let parsed = serde_json::to_vec(&document)
            .map(|bytes| manifest::parse(&bytes, &PodSource::Http, node_name, security))
            .ok();
        match parsed {
            Some(parsed) if parsed.problems.is_empty() && parsed.pods.len() == 1 => {
                if let Some(pod) = parsed.pods.into_iter().next() {
                    pods.insert(key.clone(), Arc::unwrap_or_clone(pod.pod));
                    documents.insert(key, document);
                }
            }
            other => {
                let why = other
                    .map(|p| p.problems.iter().map(|p| p.message.clone()).collect::<Vec<_>>().join("; "));
                tracing::warn!(pod = %key, problems = why.as_deref().unwrap_or("cannot encode"), "a checkpointed submitted pod is no longer valid; dropped");
            }
        }
    }
    (pods, documents)
}

/// `localhost`, `127.0.0.1`, `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':')
            .map_or(host, |(name, port)| if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host })
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback())
}

fn json_response(code: StatusCode, body: &serde_json::Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// An API-server-like `Status` answer.
fn status(code: StatusCode, reason: &str, message: String, causes: Vec<serde_json::Value>) -> Response {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if !causes.is_empty() {
        body["details"] = json!({ "causes": causes });
    }
    json_response(code, &body)
}

fn cause_reason(kind: FieldErrorKind) -> &'static str {
    match kind {
        FieldErrorKind::NotFound => "FieldValueNotFound",
        FieldErrorKind::Required => "FieldValueRequired",
        FieldErrorKind::Duplicate => "FieldValueDuplicate",
        FieldErrorKind::Invalid => "FieldValueInvalid",
        FieldErrorKind::NotSupported => "FieldValueNotSupported",
        FieldErrorKind::Forbidden => "FieldValueForbidden",
        FieldErrorKind::TooLong => "FieldValueTooLong",
        FieldErrorKind::TooMany => "FieldValueTooMany",
        FieldErrorKind::Internal => "InternalError",
    }
}

fn cause(object: Option<&str>, error: &FieldError) -> serde_json::Value {
    let message = match object {
        Some(object) => format!("pod \"{object}\": {error}"),
        None => error.to_string(),
    };
    json!({ "reason": cause_reason(error.kind), "message": message, "field": error.path })
}

fn pod_ref(pod: &DesiredPod) -> serde_json::Value {
    json!({ "namespace": pod.namespace(), "name": pod.name(), "uid": pod.uid() })
}

fn is_manifest_type(headers: &HeaderMap) -> bool {
    let Some(content_type) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence.ends_with("/json")
        || essence.ends_with("+json")
        || essence.ends_with("/yaml")
        || essence.ends_with("/x-yaml")
        || essence.ends_with("+yaml")
}

async fn submit(State(state): State<Arc<EndpointState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = state.refuse(&headers) {
        return refusal;
    }
    if !is_manifest_type(&headers) {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "the Content-Type must be a JSON or YAML type (application/json, application/yaml)".into(),
            Vec::new(),
        );
    }
    let security = state.handle.security();
    let parsed = manifest::parse(
        &body,
        &PodSource::Http,
        state.handle.node_name(),
        &security.for_remote(&PodSource::Http),
    );
    if let Some(syntax) = parsed.problems.iter().find(|p| p.object.is_none() && p.field_errors.is_empty()) {
        return status(StatusCode::BAD_REQUEST, "BadRequest", syntax.message.clone(), Vec::new());
    }
    if !parsed.problems.is_empty() && parsed.problems.iter().all(|p| p.forbidden) {
        // As the API server words a Pod Security admission refusal.
        let message = parsed
            .problems
            .iter()
            .map(|p| {
                format!("pods \"{}\" is forbidden: {}", p.object.as_deref().unwrap_or_default(), p.message)
            })
            .collect::<Vec<_>>()
            .join("; ");
        return status(StatusCode::FORBIDDEN, "Forbidden", message, Vec::new());
    }
    if !parsed.problems.is_empty() {
        let causes = parsed
            .problems
            .iter()
            .flat_map(|p| p.field_errors.iter().map(|e| cause(p.object.as_deref(), e)))
            .collect();
        let message = parsed
            .problems
            .iter()
            .map(|p| match &p.object {
                Some(object) => format!("pod \"{object}\": {}", p.message),
                None => p.message.clone(),
            })
            .collect::<Vec<_>>()
            .join("; ");
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message, causes);
    }
    if let Some(kind) = parsed.others.keys().next() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("kind: Unsupported value: {kind:?}: only Pod, PodList and List of pods may be submitted"),
            Vec::new(),
        );
    }
    if parsed.pods.is_empty() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "the request holds no pod".into(),
            Vec::new(),
        );
    }

    let mut submitted = state.lock();
    let mut next = submitted.clone();
    for pod in &parsed.pods {
        next.insert(pod.key.clone(), DesiredPod::clone(&pod.pod));
    }
    if next.len() > state.max_pods {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("at most {} pods may be submitted", state.max_pods),
            Vec::new(),
        );
    }
    let new_pods: Vec<DesiredPod> = parsed.pods.iter().map(|p| DesiredPod::clone(&p.pod)).collect();
    let mut conflicts = state.handle.conflicts(&new_pods);
    // Two documents of one request with the same name: the API server would refuse the second.
    let mut keys = std::collections::HashSet::new();
    for pod in &parsed.pods {
        if !keys.insert(pod.key.as_str()) {
            conflicts.push(format!("pod \"{}\" appears twice in the request", pod.key));
        }
    }
    if !conflicts.is_empty() {
        return status(StatusCode::CONFLICT, "AlreadyExists", conflicts.join("; "), Vec::new());
    }
    if let Err(e) = state.checkpoint_submission(&body, parsed.pods.iter().map(|p| p.key.as_str())) {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string(), Vec::new());
    }
    *submitted = next;
    state.handle.report(submitted.values().cloned().collect(), Vec::new());
    drop(submitted);
    for pod in &new_pods {
        tracing::info!(pod = %format!("{}/{}", pod.namespace(), pod.name()), uid = pod.uid(), "pod submitted");
    }
    json_response(StatusCode::CREATED, &json!({ "pods": new_pods.iter().map(pod_ref).collect::<Vec<_>>() }))
}

async fn list(State(state): State<Arc<EndpointState>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = state.refuse(&headers) {
        return refusal;
    }
    let items: Vec<serde_json::Value> =
        state.lock().values().filter_map(|pod| serde_json::to_value(&pod.pod).ok()).collect();
    json_response(
        StatusCode::OK,
        &json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items }),
    )
}

async fn remove(
    State(state): State<Arc<EndpointState>>,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    if let Some(refusal) = state.refuse(&headers) {
        return refusal;
    }
    let mut submitted = state.lock();
    let key = submitted
        .iter()
        .find(|(key, pod)| {
            **key == format!("{namespace}/{name}") || (pod.namespace() == namespace && pod.name() == name)
        })
        .map(|(key, _)| key.clone());
    let Some(key) = key else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no submitted pod \"{namespace}/{name}\""),
            Vec::new(),
        );
    };
    if let Err(e) = state.checkpoint_removal(&key) {
        return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string(), Vec::new());
    }
    let Some(pod) = submitted.remove(&key) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("no submitted pod \"{key}\""), Vec::new());
    };
    state.handle.report(submitted.values().cloned().collect(), Vec::new());
    drop(submitted);
    tracing::info!(pod = %format!("{}/{}", pod.namespace(), pod.name()), uid = pod.uid(), "submitted pod removed");
    json_response(StatusCode::OK, &pod_ref(&pod))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nodelet_resources::model::pod::PodUid;
    use reconcile_engine::Store;

    use super::super::testutil::{NODE, by_name, desired, names, pod_yaml};
    use super::super::{PodConfig, SourceHandle};
    use super::*;

    struct Endpoint {
        base: String,
        token: String,
        store: Store<PodUid, DesiredPod>,
        client: reqwest::Client,
        shutdown: CancellationToken,
        files: SourceHandle,
    }

    async fn start() -> Endpoint {
        start_with(None).await
    }

    async fn start_with(checkpoint: Option<std::path::PathBuf>) -> Endpoint {
        start_configured(|c| c.checkpoint = checkpoint).await
    }

    /// An endpoint with settings changed by `change`, and a client that sends its token.
    async fn start_configured(change: impl FnOnce(&mut HttpSourceConfig)) -> Endpoint {
        let config = PodConfig::new(NODE);
        let files = config.add_source("file").expect("file");
        let handle = config.add_source("http").expect("http");
        let mut http_config = HttpSourceConfig::new("127.0.0.1:0".parse().expect("addr"));
        change(&mut http_config);
        let source = HttpSource::bind(http_config, handle).await.expect("binds on loopback");
        let base = format!("http://{}", source.local_addr());
        let token = source.token().to_owned();
        let shutdown = CancellationToken::new();
        tokio::spawn(source.run(shutdown.clone()));
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .default_headers(headers)
            .build()
            .expect("client");
        Endpoint { base, token, store: config.store(), client, shutdown, files }
    }

    impl Endpoint {
        async fn post(&self, content_type: &str, body: String) -> (u16, serde_json::Value) {
            let response = self
                .client
                .post(format!("{}/pods", self.base))
                .header("content-type", content_type)
                .body(body)
                .send()
                .await
                .expect("request");
            let status = response.status().as_u16();
            let text = response.text().await.expect("body");
            (status, serde_json::from_str(&text).expect("JSON answer"))
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            self.shutdown.cancel();
        }
    }

    #[tokio::test]
    async fn submitted_pods_survive_a_restart_with_their_uids_and_removals() {
        let dir = tempfile::tempdir().expect("tempdir");
        let checkpoint = dir.path().join("pods.json");
        let uids = |endpoint: &Endpoint| {
            let mut uids: Vec<(String, String)> = endpoint
                .store
                .entries()
                .iter()
                .map(|(uid, pod)| (pod.name().to_owned(), uid.to_string()))
                .collect();
            uids.sort();
            uids
        };
        let first = start_with(Some(checkpoint.clone())).await;
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"listed"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}]}"#;
        let (code, _) = first
            .post(
                "application/yaml",
                format!("{}---\n{}", pod_yaml("web", "nginx"), pod_yaml("api", "nginx")),
            )
            .await;
        assert_eq!(code, 201);
        let (code, _) = first.post("application/json", list.to_owned()).await;
        assert_eq!(code, 201);
        let before = uids(&first);
        assert_eq!(before.len(), 3, "{before:?}");
        drop(first);

        let second = start_with(Some(checkpoint.clone())).await;
        assert_eq!(uids(&second), before, "the same pods, with the same UIDs, after a restart");
        let deleted =
            second.client.delete(format!("{}/pods/default/api", second.base)).send().await.expect("delete");
        assert_eq!(deleted.status().as_u16(), 200);
        drop(second);

        let third = start_with(Some(checkpoint.clone())).await;
        let names: Vec<String> = uids(&third).into_iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["listed-node-a", "web-node-a"], "a removal survives a restart too");
        drop(third);

        // A checkpoint cut short is moved aside and reported, and the source starts empty.
        std::fs::write(&checkpoint, b"{\"default/web\": {\"metad").expect("write");
        let fourth = start_with(Some(checkpoint.clone())).await;
        assert!(uids(&fourth).is_empty());
        let aside = std::fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("pods.json.corrupt-"))
            .count();
        assert_eq!(aside, 1, "the broken checkpoint is kept aside");
    }

    #[tokio::test]
    async fn a_submitted_manifest_runs_is_listed_and_can_be_deleted() {
        let endpoint = start().await;
        let body = format!("{}---\n{}", pod_yaml("web", "nginx"), pod_yaml("api", "nginx"));
        let (status, answer) = endpoint.post("application/yaml", body).await;
        assert_eq!(status, 201, "{answer}");
        let pods = answer["pods"].as_array().expect("pods");
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0]["name"], "web-node-a");
        assert_eq!(pods[0]["namespace"], "default");
        let uid = pods[0]["uid"].as_str().expect("uid").to_owned();
        assert_eq!(by_name(&endpoint.store, "web-node-a").map(|p| p.uid().to_owned()), Some(uid.clone()));
        assert_eq!(by_name(&endpoint.store, "web-node-a").map(|p| p.source), Some(PodSource::Http));

        // Submitting the same manifest again is idempotent.
        let (status, again) = endpoint.post("application/yaml", pod_yaml("web", "nginx")).await;
        assert_eq!((status, again["pods"][0]["uid"].as_str()), (201, Some(uid.as_str())));
        assert_eq!(endpoint.store.len(), 2);

        let list = endpoint.client.get(format!("{}/pods", endpoint.base)).send().await.expect("list");
        let list: serde_json::Value = serde_json::from_str(&list.text().await.expect("body")).expect("JSON");
        assert_eq!(list["kind"], "PodList");
        let listed: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        assert_eq!(listed, ["api-node-a", "web-node-a"]);

        let deleted = endpoint
            .client
            .delete(format!("{}/pods/default/web", endpoint.base))
            .send()
            .await
            .expect("delete");
        assert_eq!(deleted.status().as_u16(), 200);
        assert_eq!(names(&endpoint.store), ["api-node-a"]);
        let deleted = endpoint
            .client
            .delete(format!("{}/pods/default/api-node-a", endpoint.base))
            .send()
            .await
            .expect("delete");
        assert_eq!(deleted.status().as_u16(), 200, "the suffixed name works too");
        assert!(endpoint.store.is_empty());
        let missing = endpoint
            .client
            .delete(format!("{}/pods/default/web", endpoint.base))
            .send()
            .await
            .expect("delete");
        assert_eq!(missing.status().as_u16(), 404);
    }

    #[tokio::test]
    async fn json_is_accepted_and_a_changed_manifest_replaces_the_pod() {
        let endpoint = start().await;
        let pod = |image: &str| {
            format!(
                r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"web"}},"spec":{{"containers":[{{"name":"app","image":"{image}"}}]}}}}"#
            )
        };
        let (status, first) = endpoint.post("application/json; charset=utf-8", pod("nginx:1")).await;
        assert_eq!(status, 201, "{first}");
        let (status, second) = endpoint.post("application/json", pod("nginx:2")).await;
        assert_eq!(status, 201, "{second}");
        assert_ne!(first["pods"][0]["uid"], second["pods"][0]["uid"]);
        assert_eq!(endpoint.store.len(), 1);
        let web = by_name(&endpoint.store, "web-node-a").expect("web");
        assert_eq!(web.containers()[0].image.as_deref(), Some("nginx:2"));
    }

    #[tokio::test]
    async fn invalid_pods_get_422_with_the_field_errors_and_change_nothing() {
        let endpoint = start().await;
        let body = format!("{}---\n{}", pod_yaml("good", "nginx"), pod_yaml("bad", "''"));
        let (status, answer) = endpoint.post("application/yaml", body).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["kind"], "Status");
        assert_eq!(answer["reason"], "Invalid");
        let cause = &answer["details"]["causes"][0];
        assert_eq!(cause["field"], "spec.containers[0].image");
        assert_eq!(cause["reason"], "FieldValueRequired");
        assert_eq!(cause["message"], "pod \"default/bad\": spec.containers[0].image: Required value");
        assert!(endpoint.store.is_empty(), "nothing of a refused request is applied");

        let (status, answer) = endpoint.post("application/yaml", "kind: [".into()).await;
        assert_eq!(status, 400, "{answer}");
        let (status, answer) =
            endpoint.post("application/yaml", "kind: ConfigMap\nmetadata: {name: c}\n".into()).await;
        assert_eq!(status, 422, "{answer}");
        let (status, _) = endpoint.post("application/yaml", String::new()).await;
        assert_eq!(status, 422);
    }

    #[tokio::test]
    async fn bodies_past_the_yaml_limits_get_400_and_change_nothing() {
        let endpoint = start().await;
        // A "billion laughs" (9 levels of 9 aliases) after a valid pod: refused whole, quickly.
        let mut bomb = format!(
            "{}---\nkind: Pod\nmetadata:\n  name: bomb\n  labels:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
            pod_yaml("ok", "nginx")
        );
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for pair in names.windows(2) {
            let refs = vec![format!("*{}", pair[0]); 9].join(", ");
            bomb.push_str(&format!("    {}: &{} [{refs}]\n", pair[1], pair[1]));
        }
        let started = std::time::Instant::now();
        let (status, answer) = endpoint.post("application/yaml", bomb).await;
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        assert_eq!(status, 400, "{answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("invalid YAML: the ") && message.contains("aliases expand"), "{message}");
        assert!(endpoint.store.is_empty(), "nothing of a refused request is applied");

        let (status, answer) = endpoint.post("application/yaml", "---\n".repeat(10_000)).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["message"], "invalid YAML: more than 1000 YAML documents at line 1001, column 1");
        let (status, answer) =
            endpoint.post("application/yaml", format!("kind: {}", "[".repeat(10_000))).await;
        assert_eq!(status, 400, "{answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("invalid YAML: nested more than 64 levels deep"), "{message}");
        assert!(endpoint.store.is_empty());
    }

    #[tokio::test]
    async fn collisions_with_other_sources_get_409() {
        let endpoint = start().await;
        endpoint
            .files
            .report(vec![desired("web", "nginx", PodSource::File("/m/web.yaml".into()))], Vec::new());
        let (status, answer) = endpoint.post("application/yaml", pod_yaml("web", "other")).await;
        assert_eq!(status, 409, "{answer}");
        assert!(answer["message"].as_str().unwrap_or_default().contains("/m/web.yaml"), "{answer}");
        assert_eq!(
            by_name(&endpoint.store, "web-node-a").map(|p| p.source),
            Some(PodSource::File("/m/web.yaml".into()))
        );
    }

    #[tokio::test]
    async fn browser_style_requests_are_refused() {
        let endpoint = start().await;
        let (status, _) = endpoint.post("text/plain", pod_yaml("web", "nginx")).await;
        assert_eq!(status, 415, "a simple cross-site request cannot submit pods");
        let (status, _) = endpoint.post("application/x-www-form-urlencoded", pod_yaml("web", "nginx")).await;
        assert_eq!(status, 415);
        let rebound = endpoint
            .client
            .post(format!("{}/pods", endpoint.base))
            .header("host", "attacker.example:10260")
            .header("content-type", "application/yaml")
            .body(pod_yaml("web", "nginx"))
            .send()
            .await
            .expect("request");
        assert_eq!(rebound.status().as_u16(), 403, "DNS rebinding is refused");
        assert!(endpoint.store.is_empty());
    }

    #[tokio::test]
    async fn a_request_without_the_token_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token_file = dir.path().join("token");
        let endpoint = start_configured(|c| c.token_file = Some(token_file.clone())).await;
        // Another local user: no token, or a guess.
        let stranger = reqwest::Client::builder().no_proxy().build().expect("client");
        let submit = |client: &reqwest::Client, token: Option<&str>| {
            let mut request = client
                .post(format!("{}/pods", endpoint.base))
                .header("content-type", "application/yaml")
                .body(pod_yaml("web", "nginx"));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            request.send()
        };
        for token in [None, Some("0".repeat(64).as_str()), Some(&endpoint.token[..63])] {
            let response = submit(&stranger, token).await.expect("request");
            assert_eq!(response.status().as_u16(), 401, "{token:?}");
            let body = response.text().await.expect("body");
            assert!(
                body.contains("Authorization: Bearer") && body.contains(&token_file.display().to_string()),
                "{body}"
            );
        }
        for request in [
            stranger.get(format!("{}/pods", endpoint.base)),
            stranger.delete(format!("{}/pods/default/web", endpoint.base)),
        ] {
            assert_eq!(request.send().await.expect("request").status().as_u16(), 401);
        }
        assert!(endpoint.store.is_empty(), "nothing was submitted");
        // The token's holder may.
        let (status, answer) = endpoint.post("application/yaml", pod_yaml("web", "nginx")).await;
        assert_eq!(status, 201, "{answer}");

        // The token is kept in a file only nodelet's user can read, and the same after a restart.
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&token_file).expect("token file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&token_file).expect("read").trim(), endpoint.token);
        let again = start_configured(|c| c.token_file = Some(token_file.clone())).await;
        assert_eq!(again.token, endpoint.token, "kept across restarts");
        // A token file others may read is not trusted: a new token replaces it.
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let third = start_configured(|c| c.token_file = Some(token_file.clone())).await;
        assert_ne!(third.token, endpoint.token);
        let meta = std::fs::metadata(&token_file).expect("token file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[tokio::test]
    async fn pods_outside_the_allowed_namespaces_or_with_labels_are_refused_naming_the_field() {
        use crate::admission::{Placement, SecurityPolicies};
        let config = PodConfig::new(NODE).with_security(SecurityPolicies {
            placement: Placement {
                namespaces: Some(["default".to_owned()].into()),
                label_keys: Some(["app".to_owned()].into()),
            },
            ..SecurityPolicies::default()
        });
        let handle = config.add_source("http").expect("http");
        let source = HttpSource::bind(HttpSourceConfig::new("127.0.0.1:0".parse().expect("addr")), handle)
            .await
            .expect("binds");
        let base = format!("http://{}", source.local_addr());
        let token = source.token().to_owned();
        let shutdown = CancellationToken::new();
        tokio::spawn(source.run(shutdown.clone()));
        let client = reqwest::Client::builder().no_proxy().build().expect("client");
        let post = |body: String| {
            client
                .post(format!("{base}/pods"))
                .bearer_auth(&token)
                .header("content-type", "application/yaml")
                .body(body)
                .send()
        };
        let dns = pod_yaml("dns", "nginx")
            .replace("  namespace: default\n", "  namespace: default\n  labels:\n    k8s-app: kube-dns\n");
        let response = post(dns).await.expect("request");
        assert_eq!(response.status().as_u16(), 403);
        let body = response.text().await.expect("body");
        assert!(
            body.contains("pods \\\"default/dns\\\" is forbidden: metadata.labels[k8s-app]: Forbidden"),
            "{body}"
        );
        let system = pod_yaml("sys", "nginx").replace("namespace: default", "namespace: kube-system");
        let response = post(system).await.expect("request");
        assert_eq!(response.status().as_u16(), 403);
        let body = response.text().await.expect("body");
        assert!(body.contains("metadata.namespace: Forbidden: \\\"kube-system\\\""), "{body}");
        let labelled = pod_yaml("ok", "nginx")
            .replace("  namespace: default\n", "  namespace: default\n  labels:\n    app: web\n");
        assert_eq!(post(labelled).await.expect("request").status().as_u16(), 201, "an allowed label");
        assert_eq!(names(&config.store()), ["ok-node-a"]);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn only_loopback_addresses_are_served_unless_allowed() {
        let config = PodConfig::new(NODE);
        let handle = config.add_source("http").expect("http");
        let refused =
            HttpSource::bind(HttpSourceConfig::new("0.0.0.0:0".parse().expect("addr")), handle).await;
        assert!(matches!(refused, Err(HttpSourceError::NotLoopback(_))), "{refused:?}");
        assert!(!config.store().is_synced(), "a refused endpoint reports nothing");
        let suggested: SocketAddr = DEFAULT_ADDR.parse().expect("the suggested address parses");
        assert!(suggested.ip().is_loopback());
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for host in
            ["localhost", "localhost:10260", "127.0.0.1", "127.0.0.1:80", "[::1]:10260", "[::1]", "LOCALHOST"]
        {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["", "example.com", "10.0.0.1:10260", "127.0.0.1.nip.io", "[::2]:1", "localhost.evil"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
