//! `nodelet get pods`: fetches `/pods` from the local nodelet and prints it like `kubectl get pods`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use tracing::debug;

use super::pods::{pod_row, pods_table};
use crate::args::{GetArgs, OutputFormat};

/// The read-only port tried first when no server is given (only answers if nodelet serves it).
pub(crate) const DEFAULT_READ_ONLY_URL: &str = "http://127.0.0.1:10255";
/// The main port tried next.
pub(crate) const DEFAULT_MAIN_URL: &str = "https://127.0.0.1:10250";
/// The self-signed certificate the daemon keeps under its default root directory.
pub(crate) const DEFAULT_SERVER_CA: &str = "/var/lib/nodelet/pki/nodelet.crt";

/// Why `get` failed.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// A local file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    ReadFile {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA file is not a PEM certificate.
    #[error("{path} is not a PEM certificate: {message}")]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The server URL cannot be used.
    #[error("invalid server URL {url:?}: must start with http:// or https://")]
    BadUrl {
        /// The URL.
        url: String,
    },
    /// A bearer token and a plain-HTTP server: refused before anything is sent.
    #[error(
        "refusing to send the bearer token (--token, --token-file or NODELET_TOKEN) over plain HTTP to {url} \
         (--server): use the main port, e.g. --server https://127.0.0.1:10250, or drop the token to read the \
         read-only port"
    )]
    TokenOverHttp {
        /// The `--server` URL.
        url: String,
    },
    /// A path only the main port serves, asked of a plain-HTTP (read-only port) server.
    #[error(
        "{path} is served on nodelet's main port only, not on the read-only port {url} (--server): pass \
         --server https://127.0.0.1:10250 with --token-file FILE (or NODELET_TOKEN)"
    )]
    MainPortOnly {
        /// The `--server` URL.
        url: String,
        /// The path asked for.
        path: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot set up the HTTP client: {0}")]
    Client(String),
    /// No server answered.
    #[error(
        "cannot reach nodelet at {tried}: {message}\n(is nodelet running? pass --server, or enable its \
             read-only port with --read-only-port 10255)"
    )]
    Unreachable {
        /// The URLs tried.
        tried: String,
        /// The last error.
        message: String,
    },
    /// The server refused the credentials.
    #[error(
        "{url} answered {status}: {body}\n(pass --token-file FILE or set NODELET_TOKEN; /pods is also on the \
             read-only port, when nodelet serves one)"
    )]
    Unauthorized {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The response body (truncated).
        body: String,
    },
    /// Another HTTP error.
    #[error("{url} answered {status}: {body}")]
    Http {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The response body (truncated).
        body: String,
    },
    /// The response is not a pod list.
    #[error("{url} did not return a pod list: {message}")]
    Decode {
        /// The URL.
        url: String,
        /// The decoding error.
        message: String,
    },
    /// Some requested pods do not exist (the others were printed).
    #[error("{}", .0.iter().map(|n| format!("Error from server (NotFound): pods {n:?} not found")).collect::<Vec<_>>().join("\n"))]
    NotFound(Vec<String>),
    /// Some requested objects of another kind do not exist (the others were printed).
    #[error("{}", .names.iter().map(|n| format!("Error from server (NotFound): {kind} {n:?} not found")).collect::<Vec<_>>().join("\n"))]
    Missing {
        /// The kind (`persistentvolumeclaim`).
        kind: &'static str,
        /// The names.
        names: Vec<String>,
    },
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
    /// The flags do not go together (kubectl's words).
    #[error("{0}")]
    Usage(String),
    /// A label or field selector is malformed.
    #[error(transparent)]
    Selector(#[from] super::selector::SelectorError),
    /// A JSONPath template is malformed or failed.
    #[error(transparent)]
    JsonPath(#[from] super::jsonpath::JsonPathError),
}

#[derive(Deserialize)]
struct ListBody<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

/// A server to ask: its URL and whether a connection failure means "try the next one".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Base URL without a trailing slash.
    pub(crate) url: String,
    /// Skip to the next target when nothing listens here.
    pub(crate) optional: bool,
}

/// Whether nodelet's read-only port serves `path` (the kubelet's unauthenticated set); everything else is
/// on the main port only.
fn on_read_only_port(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    matches!(path, "/pods" | "/healthz" | "/stats/summary" | "/metrics") || path.starts_with("/metrics/")
}

/// The servers to ask for `path`, in order. `--server` alone when given; a bearer token is never sent over
/// plain HTTP (refused before anything is sent). Without `--server`: with a token, or for a path only the
/// main port serves, the main port (HTTPS) only; else the read-only port, then the main port. With a token
/// the read-only port on 127.0.0.1 is never asked: any local user could have bound it before nodelet.
pub(crate) fn targets(server: Option<&str>, token: bool, path: &str) -> Result<Vec<Target>, GetError> {
    match server {
        Some(s) => {
            let lower = s.to_ascii_lowercase();
            if !(lower.starts_with("http://") || lower.starts_with("https://")) {
                return Err(GetError::BadUrl { url: s.to_owned() });
            }
            if token && lower.starts_with("http://") {
                return Err(GetError::TokenOverHttp { url: s.to_owned() });
            }
            if lower.starts_with("http://") && !on_read_only_port(path) {
                return Err(GetError::MainPortOnly { url: s.to_owned(), path: path.to_owned() });
            }
            Ok(vec![Target { url: s.trim_end_matches('/').to_owned(), optional: false }])
        }
        None if token || !on_read_only_port(path) => {
            Ok(vec![Target { url: DEFAULT_MAIN_URL.into(), optional: false }])
        }
        None => Ok(vec![
            Target { url: DEFAULT_READ_ONLY_URL.into(), optional: true },
            Target { url: DEFAULT_MAIN_URL.into(), optional: false },
        ]),
    }
}

/// The bearer token: `--token` (or `NODELET_TOKEN`), else the first line of `--token-file`.
pub(crate) fn read_token(token: Option<&str>, token_file: Option<&Path>) -> Result<Option<String>, GetError> {
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(path).map_err(|source| GetError::ReadFile {
            what: "token file",
            path: path.to_owned(),
            source,
        })?;
        return Ok(text.lines().next().map(|l| l.trim().to_owned()).filter(|t| !t.is_empty()));
    }
    Ok(token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()))
}

fn build_client(args: &GetArgs) -> Result<reqwest::Client, GetError> {
    let mut builder = reqwest::Client::builder()
        .timeout(args.conn.request_timeout.0.max(Duration::from_millis(100)))
        .connect_timeout(Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if args.conn.insecure_skip_tls_verify {
        builder = builder.danger_accept_invalid_certs(true);
    } else {
        let ca = match &args.conn.certificate_authority {
            Some(p) => Some(p.clone()),
            None => Some(PathBuf::from(DEFAULT_SERVER_CA)).filter(|p| p.is_file()),
        };
        if let Some(path) = ca {
            let pem = std::fs::read(&path).map_err(|source| GetError::ReadFile {
                what: "CA certificate",
                path: path.clone(),
                source,
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| GetError::BadCa { path: path.clone(), message: e.to_string() })?;
            if certs.is_empty() {
                return Err(GetError::BadCa { path, message: "no certificate in the file".into() });
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
    }
    builder.build().map_err(|e| GetError::Client(e.to_string()))
}

/// Error chain of a reqwest error as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Fetches the pods from the first target that answers.
pub(crate) async fn fetch_pods(args: &GetArgs) -> Result<Vec<Pod>, GetError> {
    fetch_list(args, "/pods").await
}

/// Fetches a v1 list from `path` of the first target that answers.
pub(super) async fn fetch_list<T: serde::de::DeserializeOwned>(
    args: &GetArgs,
    path: &str,
) -> Result<Vec<T>, GetError> {
    let (url, body) = fetch_body(args, path).await?;
    let list: ListBody<T> =
        serde_json::from_str(&body).map_err(|e| GetError::Decode { url, message: e.to_string() })?;
    Ok(list.items)
}

/// Fetches `path` from the first target that answers: its URL and the body of a 2xx answer.
pub(super) async fn fetch_body(args: &GetArgs, path: &str) -> Result<(String, String), GetError> {
    let token = read_token(args.conn.token.as_deref(), args.conn.token_file.as_deref())?;
    let targets = targets(args.conn.server.as_deref(), token.is_some(), path)?;
    let client = build_client(args)?;
    let mut tried = Vec::new();
    let mut last = String::new();
    for target in &targets {
        let url = format!("{}{path}", target.url);
        tried.push(url.clone());
        let mut req = client.get(&url).header("Accept", "application/json");
        if let Some(t) = &token {
            // `targets` gives only https:// URLs when there is a token.
            req = req.bearer_auth(t);
        }
        debug!(%url, "fetching pods");
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if target.optional && e.is_connect() => {
                debug!(%url, error = %chain(&e), "not answering; trying the next server");
                last = chain(&e);
                continue;
            }
            Err(e) => {
                let mut message = chain(&e);
                if message.contains("certificate") || message.contains("UnknownIssuer") {
                    message.push_str(" (pass --certificate-authority FILE, or --insecure-skip-tls-verify)");
                }
                return Err(GetError::Unreachable { tried: tried.join(", "), message });
            }
        };
        let status = resp.status();
        let body =
            resp.text().await.map_err(|e| GetError::Decode { url: url.clone(), message: chain(&e) })?;
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(GetError::Unauthorized { url, status: status.as_u16(), body: truncate(&body) });
        }
        if !status.is_success() {
            return Err(GetError::Http { url, status: status.as_u16(), body: truncate(&body) });
        }
        return Ok((url, body));
    }
    Err(GetError::Unreachable { tried: tried.join(", "), message: last })
}

/// Sends one request to the main port (`args.conn.server`, which must be set) with the bearer token: `POST`
/// with a JSON `body`, else `GET`; returns the response body of a 2xx answer.
pub(super) async fn main_port_request(
    args: &GetArgs,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<String, GetError> {
    let token = read_token(args.conn.token.as_deref(), args.conn.token_file.as_deref())?;
    let base = targets(args.conn.server.as_deref(), token.is_some(), path)?
        .pop()
        .map(|t| t.url)
        .unwrap_or_else(|| DEFAULT_MAIN_URL.into());
    let client = build_client(args)?;
    let url = format!("{base}{path}");
    let mut req = match body {
        Some(body) => client.post(&url).header("Content-Type", "application/json").body(body),
        None => client.get(&url),
    };
    if let Some(t) = &token {
        req = req.bearer_auth(t);
    }
    let resp =
        req.send().await.map_err(|e| GetError::Unreachable { tried: url.clone(), message: chain(&e) })?;
    let status = resp.status();
    let body = resp.text().await.map_err(|e| GetError::Decode { url: url.clone(), message: chain(&e) })?;
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return Err(GetError::Unauthorized { url, status: status.as_u16(), body: truncate(&body) });
    }
    if !status.is_success() {
        return Err(GetError::Http { url, status: status.as_u16(), body: truncate(&body) });
    }
    Ok(body)
}

fn truncate(s: &str) -> String {
    let t = s.trim();
    match t.char_indices().nth(500) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

/// Filters, sorts and prints `pods` as `args` asks. Returns `NotFound` (after printing the others) when a
/// requested name is missing; prints "No resources found" to `err` when nothing matches.
pub(crate) fn print_pods(
    args: &GetArgs,
    pods: Vec<Pod>,
    now: Timestamp,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), GetError> {
    let mut pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| {
            args.all_namespaces || p.metadata.namespace.as_deref().unwrap_or("default") == args.namespace
        })
        .collect();
    pods = super::output::select(args, pods, |p| &p.metadata, super::selector::POD_FIELDS)?;
    pods.sort_by(|a, b| {
        (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
            .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
    });
    let mut missing = Vec::new();
    if !args.names.is_empty() {
        let mut selected = Vec::new();
        for name in &args.names {
            let found: Vec<&Pod> =
                pods.iter().filter(|p| p.metadata.name.as_deref() == Some(name.as_str())).collect();
            if found.is_empty() {
                missing.push(name.clone());
            }
            selected.extend(found.into_iter().cloned());
        }
        pods = selected;
    }
    if pods.is_empty() && missing.is_empty() {
        let msg = if args.all_namespaces {
            "No resources found\n".to_owned()
        } else {
            format!("No resources found in {} namespace.\n", args.namespace)
        };
        err.write_all(msg.as_bytes()).map_err(GetError::Output)?;
        return Ok(());
    }
    let text = match &args.output {
        None | Some(OutputFormat::Wide) => {
            if pods.is_empty() {
                String::new()
            } else {
                pods_text(args, &pods, now)
            }
        }
        Some(format) => {
            super::output::render(args, format, ("v1", "Pod", "pod"), super::output::values(&pods)?)?
        }
    };
    out.write_all(text.as_bytes()).map_err(GetError::Output)?;
    out.flush().map_err(GetError::Output)?;
    if missing.is_empty() { Ok(()) } else { Err(GetError::NotFound(missing)) }
}

/// The pods table (`-o wide`: its wide form), honouring `--no-headers`.
pub(super) fn pods_text(args: &GetArgs, pods: &[Pod], now: Timestamp) -> String {
    let rows: Vec<_> = pods.iter().map(|p| pod_row(p, now)).collect();
    let text = pods_table(&rows, args.output == Some(OutputFormat::Wide), args.all_namespaces);
    if args.no_headers { text.split_once('\n').map(|(_, r)| r.to_owned()).unwrap_or_default() } else { text }
}

/// The wall-clock time (jiff's `Timestamp::now` needs its `std` feature, which k8s-openapi does not enable).
pub(crate) fn now() -> Timestamp {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let nanos = i128::try_from(since.as_nanos()).unwrap_or(0);
    Timestamp::from_nanosecond(nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `nodelet get pods`.
pub(crate) async fn run(args: &GetArgs) -> Result<(), GetError> {
    if !nodelet_shared::GET_TYPES.contains(&args.resource.as_str()) {
        return super::extensions::run(args).await;
    }
    if super::nodes::is_nodes(&args.resource) {
        return super::nodes::run(args, now()).await;
    }
    if args.watch {
        return watch(args).await;
    }
    if super::events::is_events(&args.resource) {
        return super::events::run(args, now()).await;
    }
    if let Some(kind) = super::storage::kind_of(&args.resource) {
        return super::storage::run(args, kind, now()).await;
    }
    let pods = fetch_pods(args).await?;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let printed = print_pods(args, pods, now(), &mut stdout.lock(), &mut stderr.lock());
    // Broken manifests and failing pods, as warnings after the table (best effort: an older
    // server without events is not an error).
    if matches!(args.output, None | Some(OutputFormat::Wide)) {
        match fetch_list::<Event>(args, "/api/v1/events").await {
            Ok(events) => print_warnings(&events, &mut stderr.lock()),
            Err(e) => debug!(error = %e, "no events"),
        }
    }
    printed
}

/// How often `-w` polls.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// A printer of one kind's objects: (args, objects, now, stdout, stderr).
type Printer<T> = fn(&GetArgs, Vec<T>, Timestamp, &mut dyn Write, &mut dyn Write) -> Result<(), GetError>;

/// `get -w`: pods, nodes or events. The read-only endpoints have no watch stream, so this polls every
/// second: the first answer prints as usual, then each object that appeared or changed (or
/// disappeared: its last state) prints again, without the header, as `kubectl get -w` does.
async fn watch(args: &GetArgs) -> Result<(), GetError> {
    use super::selector::{EVENT_FIELDS, META_FIELDS, POD_FIELDS};
    if super::nodes::is_nodes(&args.resource) {
        watch_kind(
            args,
            "/api/v1/nodes",
            |n: &k8s_openapi::api::core::v1::Node| &n.metadata,
            META_FIELDS,
            false,
            super::nodes::print_nodes,
        )
        .await
    } else if super::events::is_events(&args.resource) {
        watch_kind(
            args,
            "/api/v1/events",
            |e: &Event| &e.metadata,
            EVENT_FIELDS,
            true,
            |a, items, now, out, err| {
                let items = super::events::select(a, items)?;
                super::events::print_events(a, &items, now, out, err)
            },
        )
        .await
    } else if super::storage::kind_of(&args.resource).is_some() {
        Err(GetError::Usage(format!(
            "watch is not supported for {}: only pods, nodes and events",
            args.resource
        )))
    } else {
        watch_kind(args, "/pods", |p: &Pod| &p.metadata, POD_FIELDS, true, print_pods).await
    }
}

async fn watch_kind<T>(
    args: &GetArgs,
    path: &str,
    meta: fn(&T) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    fields: &[&str],
    namespaced: bool,
    print: Printer<T>,
) -> Result<(), GetError>
where
    T: serde::de::DeserializeOwned + serde::Serialize + Clone,
{
    let mut known: std::collections::BTreeMap<(String, String), (String, T)> = Default::default();
    let mut later = args.clone();
    later.names.clear();
    later.no_headers = true;
    let mut first = true;
    loop {
        let items: Vec<T> = fetch_list(args, path).await?;
        let items: Vec<T> = items
            .into_iter()
            .filter(|i| {
                !namespaced
                    || args.all_namespaces
                    || meta(i).namespace.as_deref().unwrap_or("default") == args.namespace
            })
            .filter(|i| {
                args.names.is_empty() || meta(i).name.as_ref().is_some_and(|n| args.names.contains(n))
            })
            .collect();
        let items = super::output::select(&later_selector(args), items, meta, fields)?;
        let mut current = std::collections::BTreeMap::new();
        for item in items {
            let key = (
                meta(&item).namespace.clone().unwrap_or_default(),
                meta(&item).name.clone().unwrap_or_default(),
            );
            let json =
                serde_json::to_string(&item).map_err(|e| GetError::Output(std::io::Error::other(e)))?;
            current.insert(key, (json, item));
        }
        let mut changed: Vec<T> = Vec::new();
        for (key, (json, item)) in &current {
            if known.get(key).is_none_or(|(old, _)| old != json) {
                changed.push(item.clone());
            }
        }
        for (key, (_, item)) in &known {
            if !current.contains_key(key) {
                changed.push(item.clone());
            }
        }
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        let (out, err) = (&mut stdout.lock(), &mut stderr.lock());
        let shown: Vec<T> = if first { current.values().map(|(_, i)| i.clone()).collect() } else { changed };
        if matches!(args.output, Some(OutputFormat::Json | OutputFormat::Yaml)) {
            // Each object on its own, as kubectl get -w -o json|yaml prints them.
            for item in shown {
                let mut one = later.clone();
                // Already selected: the name alone picks it (a selector and names do not go together).
                (one.selector, one.field_selector) = (None, None);
                one.names = vec![meta(&item).name.clone().unwrap_or_default()];
                print(&one, vec![item], now(), out, err)?;
            }
        } else if first {
            print(args, shown, now(), out, err)?;
        } else if !shown.is_empty() {
            print(&later, shown, now(), out, err)?;
        }
        first = false;
        known = current;
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// `args` without names (a selector and names do not go together, and names were applied already).
fn later_selector(args: &GetArgs) -> GetArgs {
    let mut a = args.clone();
    a.names.clear();
    a
}

/// Prints warning events, one line each, like kubectl prints warnings.
pub(super) fn print_warnings(events: &[Event], err: &mut dyn Write) {
    for e in events.iter().filter(|e| e.type_.as_deref() == Some("Warning")) {
        let object = e.involved_object.name.as_deref().unwrap_or_default();
        let reason = e.reason.as_deref().unwrap_or_default();
        let message = e.message.as_deref().unwrap_or_default();
        let _ = writeln!(err, "Warning: {reason} {object}: {message}");
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::args::{Cli, Command};

    fn get_args(flags: &[&str]) -> GetArgs {
        let mut v = vec!["nodelet", "get", "pods"];
        v.extend_from_slice(flags);
        match Cli::try_parse_from(v).expect("parse").into_command() {
            Command::Get(g) => g,
            other => panic!("{other:?}"),
        }
    }

    fn pod_list() -> String {
        serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
            {"metadata": {"name": "web-node1", "namespace": "default", "creationTimestamp": "2024-05-01T11:00:00Z"},
             "spec": {"nodeName": "node1", "containers": [{"name": "httpd"}]},
             "status": {"phase": "Running", "podIPs": [{"ip": "198.18.0.7"}],
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "containerStatuses": [{"name": "httpd", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                                               "state": {"running": {}}}]}},
            {"metadata": {"name": "crashloop-node1", "namespace": "default", "creationTimestamp": "2024-05-01T11:58:00Z"},
             "spec": {"containers": [{"name": "app"}]},
             "status": {"phase": "Running", "containerStatuses": [{"name": "app", "ready": false, "restartCount": 2,
                        "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
            {"metadata": {"name": "dns-node1", "namespace": "kube-system"},
             "spec": {"containers": [{"name": "dns"}]}, "status": {"phase": "Pending"}}
        ]})
        .to_string()
    }

    /// A one-shot HTTP server on loopback answering every request with `status` and `body`; returns its URL
    /// and the requests it saw.
    async fn serve(status: &'static str, body: String) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            if let Ok(Ok((mut conn, _))) =
                tokio::time::timeout(Duration::from_secs(10), listener.accept()).await
            {
                let mut buf = vec![0u8; 8192];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
            seen
        });
        (url, task)
    }

    fn now() -> Timestamp {
        "2024-05-01T12:00:00Z".parse().expect("ts")
    }

    fn print(flags: &[&str], pods: Vec<Pod>) -> (String, String, Result<(), GetError>) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let r = print_pods(&get_args(flags), pods, now(), &mut out, &mut err);
        (String::from_utf8(out).expect("utf8"), String::from_utf8(err).expect("utf8"), r)
    }

    fn pods() -> Vec<Pod> {
        serde_json::from_str::<ListBody<Pod>>(&pod_list()).expect("list").items
    }

    #[tokio::test]
    async fn get_pods_fetches_and_prints_a_kubectl_like_table() {
        let (url, server) = serve("200 OK", pod_list()).await;
        let args = get_args(&["--server", &url]);
        let pods = fetch_pods(&args).await.expect("fetch");
        let requests = server.await.expect("server");
        assert!(requests[0].starts_with("GET /pods HTTP/1.1"), "{requests:?}");
        let (out, _, r) = print(&[], pods);
        r.expect("printed");
        assert_eq!(
            out,
            "NAME              READY   STATUS             RESTARTS   AGE\n\
             crashloop-node1   0/1     CrashLoopBackOff   2          2m\n\
             web-node1         1/1     Running            0          60m\n"
        );
    }

    #[test]
    fn namespaces_names_and_formats() {
        let (out, _, _) = print(&["-A", "-o", "wide"], pods());
        assert!(out.starts_with("NAMESPACE     NAME"), "{out}");
        assert!(out.contains("kube-system   dns-node1"), "{out}");
        assert!(out.contains("198.18.0.7"), "{out}");
        let (out, _, _) = print(&["-o", "name"], pods());
        assert_eq!(out, "pod/crashloop-node1\npod/web-node1\n");
        let (out, _, _) = print(&["web-node1", "-o", "json"], pods());
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["kind"], "Pod", "one named pod prints the object");
        assert_eq!(v["metadata"]["name"], "web-node1");
        let (out, _, _) = print(&["-o", "yaml"], pods());
        let v: serde_json::Value = nodelet_shared::yaml::from_str(&out).expect("yaml");
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(2));
        let (out, err, r) = print(&["-n", "empty"], pods());
        assert!(out.is_empty() && r.is_ok());
        assert_eq!(err, "No resources found in empty namespace.\n");
        let (out, _, r) = print(&["web-node1", "nope"], pods());
        assert!(out.contains("web-node1"), "found pods are printed");
        let e = r.expect_err("missing name");
        assert_eq!(e.to_string(), "Error from server (NotFound): pods \"nope\" not found");
    }

    #[tokio::test]
    async fn unauthorized_answers_explain_how_to_pass_a_token() {
        let (url, _server) =
            serve("401 Unauthorized", "{\"kind\":\"Status\",\"message\":\"Unauthorized\"}".into()).await;
        let e = fetch_pods(&get_args(&["--server", &url])).await.expect_err("401");
        assert!(matches!(e, GetError::Unauthorized { status: 401, .. }), "{e}");
        assert!(e.to_string().contains("--token-file"), "{e}");
    }

    #[tokio::test]
    async fn a_server_that_does_not_listen_is_reported_with_a_hint() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let e = fetch_pods(&get_args(&["--server", &url])).await.expect_err("refused");
        assert!(e.to_string().contains("is nodelet running?"), "{e}");
    }

    #[tokio::test]
    async fn garbage_is_a_decode_error() {
        let (url, _server) = serve("200 OK", "<html>".into()).await;
        let e = fetch_pods(&get_args(&["--server", &url])).await.expect_err("not json");
        assert!(matches!(e, GetError::Decode { .. }), "{e}");
    }

    #[test]
    fn default_targets_try_the_read_only_port_then_the_main_port() {
        let t = targets(None, false, "/pods").expect("targets");
        assert_eq!(t[0], Target { url: "http://127.0.0.1:10255".into(), optional: true });
        assert_eq!(t[1], Target { url: "https://127.0.0.1:10250".into(), optional: false });
        assert!(targets(Some("127.0.0.1:10250"), false, "/pods").is_err());
        assert_eq!(targets(Some("https://h:1/"), true, "/pods").expect("ok")[0].url, "https://h:1");
        let main_only = vec![Target { url: "https://127.0.0.1:10250".into(), optional: false }];
        for (token, path) in [(true, "/pods"), (false, "/api/v1/events"), (false, "/extensions/prepull")] {
            assert_eq!(targets(None, token, path).expect("targets"), main_only, "{token} {path}");
        }
        assert!(matches!(
            targets(Some("http://127.0.0.1:10255"), true, "/pods"),
            Err(GetError::TokenOverHttp { .. })
        ));
        let e = targets(Some("http://127.0.0.1:10255"), false, "/api/v1/events").expect_err("main port only");
        assert!(
            matches!(e, GetError::MainPortOnly { .. }) && e.to_string().contains("--server https://"),
            "{e}"
        );
        for path in ["/pods", "/stats/summary", "/metrics/probes", "/healthz"] {
            assert!(targets(Some("http://127.0.0.1:10255"), false, path).is_ok(), "{path}");
        }
    }

    /// Whether anything connected to `listener` within a short while (the request was sent there).
    async fn was_asked(listener: &TcpListener) -> bool {
        tokio::time::timeout(Duration::from_millis(300), listener.accept()).await.is_ok()
    }

    /// Issue 37: a bearer token never goes over plain HTTP: the request is refused before it is sent, with an
    /// error naming the URL and the flag.
    #[tokio::test]
    async fn a_bearer_token_is_never_sent_over_plain_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let args = get_args(&["--server", &url, "--token", "secret-token"]);
        let e = fetch_pods(&args).await.expect_err("a token with an http:// server is refused");
        let message = e.to_string();
        assert!(
            message.contains(&url) && message.contains("--server") && message.contains("plain HTTP"),
            "{message}"
        );
        assert!(!message.contains("secret-token"), "{message}");
        let e = main_port_request(&args, "/debug/default/web", Some(b"{}".to_vec()))
            .await
            .expect_err("a token with an http:// server is refused");
        assert!(e.to_string().contains("plain HTTP"), "{e}");
        assert!(!was_asked(&listener).await, "nothing was sent to {url}");
    }

    /// Issue 37: holding a token, the CLI talks only HTTPS to the main port: it never asks
    /// http://127.0.0.1:10255, which any local user may have bound before nodelet (to serve made-up pods or
    /// to collect what is sent). Without a token the read-only port is asked first for `/pods` (the
    /// kubelet's set), never for what only the main port serves.
    #[tokio::test]
    async fn the_read_only_port_a_local_user_may_have_bound_is_not_asked_with_a_token() {
        let squatter = match TcpListener::bind("127.0.0.1:10255").await {
            Ok(l) => l,
            Err(e) => panic!("this test plays the local user who binds 127.0.0.1:10255 first: {e}"),
        };
        let r = fetch_pods(&get_args(&["--token", "secret-token"])).await;
        assert!(!was_asked(&squatter).await, "the read-only port was asked while holding a token: {r:?}");
        let r = fetch_list::<Event>(&get_args(&[]), "/api/v1/events").await;
        assert!(!was_asked(&squatter).await, "events are not on the read-only port: {r:?}");
        // No token: `/pods` may come from the read-only port.
        let asked = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(5), squatter.accept()).await.is_ok()
        });
        let _ = fetch_pods(&get_args(&["--request-timeout", "1s"])).await;
        assert!(asked.await.expect("task"), "without a token /pods is asked of the read-only port first");
    }

    #[test]
    fn tokens_come_from_the_flag_env_or_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("token");
        std::fs::write(&f, "abc123\n").expect("write");
        assert_eq!(read_token(Some("x"), Some(&f)).expect("file").as_deref(), Some("abc123"));
        assert_eq!(read_token(Some(" y "), None).expect("flag").as_deref(), Some("y"));
        assert_eq!(read_token(None, None).expect("none"), None);
        assert!(read_token(None, Some(&dir.path().join("missing"))).is_err());
    }
}
