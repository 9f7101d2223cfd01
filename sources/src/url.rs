//! The URL source (`--manifest-url`, `staticPodURL`): static pods fetched from a URL every
//! `httpCheckFrequency` (20 s), with the headers of `--manifest-url-header`.
//!
//! - The body is a manifest like a file's: one Pod, a PodList, or several YAML/JSON documents.
//!   An empty body means no pods. A body identical to the last one is not parsed again.
//! - Pods get `kubernetes.io/config.source: http` and a UID hashed from the URL, the node and the
//!   pod.
//! - **Failures** (connection refused, timeout, a status other than 2xx, a body over 8 MiB) are
//!   reported as problems and change nothing: the pods of the last good body keep running, and
//!   until a first successful fetch the source does not count as reported, so nothing is torn
//!   down for want of it (as in the kubelet). Invalid documents keep their last good pods, as in
//!   the file source.
//! - `https` URLs are verified against the system's CA bundle (the first of
//!   `/etc/ssl/certs/ca-certificates.crt`, `/etc/pki/tls/certs/ca-bundle.crt`,
//!   `/etc/ssl/ca-bundle.pem`, `/etc/ssl/cert.pem`), or `UrlSourceConfig::ca_file`. Proxies
//!   from the environment (`HTTPS_PROXY`, ...) are used except for loopback URLs.
//! - **Redirects** are followed (at most 10) by the source itself: never from `https` to anything
//!   unencrypted, and the `--manifest-url-header` headers only go to the configured URL's origin
//!   (scheme, host and port), never to another host a redirect leads to.
//! - **The URL may hold a credential** (user information, a token in the query string): wherever it is
//!   shown (problems, and so events and `nodelet get`; logs; `/configz`; errors) it is shown redacted
//!   ([`redact_url`]): `https://<redacted>@host/path?<redacted>`. This holds for redirect targets too.

use std::path::PathBuf;
use std::time::Duration;

use futures::FutureExt;
use nodelet_resources::model::pod::PodSource;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;

use super::manifest::{self, MAX_MANIFEST_BYTES, ParsedPod};
use super::{Problem, SourceHandle};

/// The kubelet's default `httpCheckFrequency`.
pub(crate) const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// How long one fetch may take.
pub(crate) const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the system CA bundle usually is.
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// `url` as it may be shown: the configuration's (`nodelet_config::configz::redact_url`).
pub(crate) use nodelet_config::configz::redact_url;

/// Errors of the URL source's configuration.
#[derive(Debug, thiserror::Error)]
pub enum UrlSourceError {
    /// The URL does not parse or is not `http`/`https`.
    #[error("invalid manifest URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, redacted ([`redact_url`]).
        url: String,
        /// Why.
        reason: String,
    },
    /// A `--manifest-url-header` entry is not `name:value` with a valid name and value.
    #[error("invalid manifest URL header {0:?}: expected name:value")]
    InvalidHeader(String),
    /// The CA file cannot be read or holds no certificate.
    #[error("cannot use the CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The HTTP client cannot be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Settings of the [`UrlSource`].
#[derive(Debug, Clone)]
pub struct UrlSourceConfig {
    /// The URL (`http` or `https`).
    pub url: String,
    /// Headers sent with every request, in order (a name may repeat).
    pub headers: Vec<(String, String)>,
    /// Poll period (`httpCheckFrequency`, default 20 s).
    pub check_frequency: Duration,
    /// Timeout of one fetch (default 10 s).
    pub timeout: Duration,
    /// A PEM CA bundle to verify `https` servers with, instead of the system's.
    pub(crate) ca_file: Option<PathBuf>,
}

impl UrlSourceConfig {
    /// The defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: Vec::new(),
            check_frequency: DEFAULT_HTTP_CHECK_FREQUENCY,
            timeout: DEFAULT_FETCH_TIMEOUT,
            ca_file: None,
        }
    }
}

/// Polls the manifest URL; see the [module docs](self).
#[derive(Debug)]
pub struct UrlSource {
    config: UrlSourceConfig,
    /// The URL as it is shown ([`redact_url`]): the problems' location.
    shown: String,
    handle: SourceHandle,
    client: reqwest::Client,
    headers: HeaderMap,
    /// The last body fetched successfully.
    last_body: Option<Vec<u8>>,
    /// What the URL contributes: its valid pods, plus the last good version of broken ones.
    pods: Vec<ParsedPod>,
    /// Problems of the last body.
    body_problems: Vec<Problem>,
    /// Test hook: the next poll panics.
    #[cfg(test)]
    panic_next_poll: bool,
}

impl UrlSource {
    /// A URL source reporting through `handle`. Checks the URL and headers and builds the client;
    /// nothing is fetched before [`run`](Self::run).
    pub fn new(config: UrlSourceConfig, handle: SourceHandle) -> Result<Self, UrlSourceError> {
        let invalid = |reason: String| UrlSourceError::InvalidUrl { url: redact_url(&config.url), reason };
        let url = reqwest::Url::parse(&config.url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https".into()));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let entry = || UrlSourceError::InvalidHeader(format!("{name}:{value}"));
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| entry())?;
            let value = HeaderValue::from_str(value).map_err(|_| entry())?;
            headers.append(name, value);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            // `fetch` follows redirects itself, deciding which headers go where.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("nodelet/", env!("CARGO_PKG_VERSION")));
        if is_loopback(&url) {
            builder = builder.no_proxy();
        }
        if url.scheme() == "https" {
            for certificate in ca_certificates(config.ca_file.as_deref())? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let client = builder.build().map_err(UrlSourceError::Client)?;
        Ok(Self {
            shown: redact_url(&config.url),
            config,
            handle,
            client,
            headers,
            last_body: None,
            pods: Vec::new(),
            body_problems: Vec::new(),
            #[cfg(test)]
            panic_next_poll: false,
        })
    }

    /// Fetches the URL now and every `check_frequency`, until `shutdown` fires.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.config.check_frequency);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            // A panic while fetching or reading the URL (past the per-document boundary of `manifest::parse`) is
            // a problem of the URL: the pods of the last good response keep running, the next poll tries again,
            // and the panic never reaches the supervisor.
            let polled = tokio::select! {
                () = shutdown.cancelled() => return,
                polled = std::panic::AssertUnwindSafe(self.poll_once()).catch_unwind() => polled,
            };
            if let Err(payload) = polled {
                let message = nodelet_shared::panic_message(payload.as_ref());
                tracing::error!(url = %self.shown, panic = %message, "reading the manifest URL panicked");
                // read the next response afresh, whatever it is
                self.last_body = None;
                self.report_failure(format!(
                    "the manifest URL could not be read (nodelet panicked on it: {message})"
                ));
            }
        }
    }

    /// One fetch, parse and report.
    pub(crate) async fn poll_once(&mut self) {
        #[cfg(test)]
        if std::mem::take(&mut self.panic_next_poll) {
            panic!("test hook: panicking on this poll");
        }
        match self.fetch().await {
            Ok(body) => {
                if self.last_body.as_ref() != Some(&body) {
                    let source = PodSource::Url(self.config.url.clone());
                    let security = self.handle.security();
                    let parsed = manifest::parse(
                        &body,
                        &source,
                        self.handle.node_name(),
                        &security.for_remote(&source),
                    );
                    let (pods, kept) = manifest::keep_last_good(&parsed, &self.pods);
                    self.body_problems = super::file::problems_of(&self.shown, &parsed, &pods, kept);
                    self.pods = pods;
                    self.last_body = Some(body);
                    tracing::debug!(url = %self.shown, pods = self.pods.len(), "manifest URL read");
                }
                let pods = self.pods.iter().map(|p| p.pod.clone()).collect();
                self.handle.report_shared(pods, self.body_problems.clone());
            }
            Err(error) => self.report_failure(error.to_string()),
        }
    }

    /// Reports a failed poll as the URL's one problem, saying how many pods of the last good response keep running.
    fn report_failure(&self, message: String) {
        let kept = if self.pods.is_empty() {
            String::new()
        } else {
            format!(" (the pods of the last good response keep running: {})", self.pods.len())
        };
        let problem =
            Problem { location: self.shown.clone(), object: None, message: format!("{message}{kept}") };
        self.handle.set_problems(vec![problem]);
    }

    async fn fetch(&self) -> Result<Vec<u8>, FetchError> {
        let first = reqwest::Url::parse(&self.config.url).map_err(FetchError::BadUrl)?;
        let origin = first.origin();
        let mut url = first;
        let mut hops = 0;
        let mut response = loop {
            let mut request = self.client.get(url.clone());
            if url.origin() == origin {
                request = request.headers(self.headers.clone());
            }
            let response = request
                .send()
                .await
                // (without the URL: reqwest's text names it, credentials and all)
                .map_err(|e| FetchError::Send(error_chain(&e.without_url())))?;
            if !response.status().is_redirection() {
                break response;
            }
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(FetchError::TooManyRedirects);
            }
            let next = redirect_target(&url, response.headers())?;
            tracing::debug!(from = %redact_url(url.as_str()), to = %redact_url(next.as_str()), "manifest URL redirected");
            url = next;
        };
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status(status));
        }
        let mut body = Vec::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|e| FetchError::ReadBody(error_chain(&e.without_url())))?
        {
            if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
                return Err(FetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// The error of parsing a URL (the `url` crate's, through reqwest).
type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// Why one poll of the manifest URL failed (the URL's one problem until a poll succeeds). URLs in the
/// messages are redacted; reqwest's errors are shown without their URL.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// The configured URL does not parse.
    #[error("bad manifest URL: {0}")]
    BadUrl(#[source] UrlParseError),
    /// The request failed (the error's chain, without the URL).
    #[error("cannot fetch the manifest URL: {0}")]
    Send(String),
    /// Too many redirects.
    #[error("the manifest URL redirected more than {MAX_REDIRECTS} times")]
    TooManyRedirects,
    /// A redirect the source does not follow.
    #[error(transparent)]
    Redirect(#[from] RedirectError),
    /// The final answer is not a success.
    #[error("fetching the manifest URL failed: HTTP {0}")]
    Status(reqwest::StatusCode),
    /// Reading the body failed (the error's chain, without the URL).
    #[error("cannot read the manifest URL's body: {0}")]
    ReadBody(String),
    /// The body is larger than a manifest may be.
    #[error("the manifest URL's body is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
}

/// Why a redirect is not followed (`from` and `to` are redacted URLs).
#[derive(Debug, thiserror::Error)]
enum RedirectError {
    /// No `Location` header.
    #[error("the manifest URL {from} redirected without a Location")]
    NoLocation {
        /// Where the redirect came from.
        from: String,
    },
    /// A `Location` that is not text.
    #[error("the manifest URL {from} redirected to a Location that is not text")]
    LocationNotText {
        /// Where the redirect came from.
        from: String,
    },
    /// A `Location` that does not parse relative to `from`.
    #[error("the manifest URL {from} redirected to {location}: {source}")]
    BadLocation {
        /// Where the redirect came from.
        from: String,
        /// The `Location`, redacted.
        location: String,
        /// Why it does not parse.
        source: UrlParseError,
    },
    /// From `https` to `http`.
    #[error("refusing the redirect from {from} to {to}: from https to unencrypted http")]
    Downgrade {
        /// Where the redirect came from.
        from: String,
        /// Where it leads.
        to: String,
    },
    /// To a scheme other than `http` and `https`.
    #[error("refusing the redirect from {from} to {to}: scheme {scheme:?} is not http or https")]
    Scheme {
        /// Where the redirect came from.
        from: String,
        /// Where it leads.
        to: String,
        /// Its scheme.
        scheme: String,
    },
}

/// Redirects the URL source follows at most (as Go's HTTP client and reqwest's default).
const MAX_REDIRECTS: usize = 10;

/// Where a redirect from `from` leads, if the source may follow it: a `Location` that parses relative to
/// `from`, `http` or `https`, and never from `https` to `http`.
fn redirect_target(from_url: &reqwest::Url, headers: &HeaderMap) -> Result<reqwest::Url, RedirectError> {
    let from = redact_url(from_url.as_str());
    let location = headers
        .get(reqwest::header::LOCATION)
        .ok_or_else(|| RedirectError::NoLocation { from: from.clone() })?;
    let location = location.to_str().map_err(|_| RedirectError::LocationNotText { from: from.clone() })?;
    let to_url = from_url.join(location).map_err(|source| RedirectError::BadLocation {
        from: from.clone(),
        location: redact_url(location),
        source,
    })?;
    let to = redact_url(to_url.as_str());
    match (from_url.scheme(), to_url.scheme()) {
        ("https", "https") | ("http", "http" | "https") => Ok(to_url),
        ("https", "http") => Err(RedirectError::Downgrade { from, to }),
        (_, other) => Err(RedirectError::Scheme { from, to, scheme: other.to_owned() }),
    }
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The certificates of `ca_file`, or of the first system CA bundle found (none if there is none:
/// then `https` fails verification, with a clear error at fetch time).
fn ca_certificates(ca_file: Option<&std::path::Path>) -> Result<Vec<reqwest::Certificate>, UrlSourceError> {
    let read = |path: &std::path::Path| -> Result<Vec<reqwest::Certificate>, UrlSourceError> {
        let fail = |reason: String| UrlSourceError::CaFile { path: path.to_path_buf(), reason };
        let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| fail(e.to_string()))?;
        if certificates.is_empty() {
            return Err(fail("no certificate in the file".into()));
        }
        Ok(certificates)
    };
    if let Some(path) = ca_file {
        return read(path);
    }
    for path in CA_BUNDLES {
        let path = std::path::Path::new(path);
        if path.is_file() {
            return read(path);
        }
    }
    tracing::warn!("no system CA bundle found; https manifest URLs will fail verification");
    Ok(Vec::new())
}

/// An error and its sources, `: `-joined (reqwest's top-level message alone says little).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap as AxumHeaders, StatusCode};
    use axum::routing::get;

    use super::super::PodConfig;
    use super::super::testutil::{NODE, by_name, eventually, names, pod_yaml};
    use super::*;

    /// What the test server answers, and what it saw.
    #[derive(Debug, Default)]
    struct Served {
        status: u16,
        body: String,
        hits: usize,
        last_headers: Vec<(String, String)>,
    }

    type Shared = Arc<Mutex<Served>>;

    /// Serves `GET /pods` on a free loopback port until the test ends.
    async fn serve(status: u16, body: &str) -> (SocketAddr, Shared) {
        serve_on("127.0.0.1", status, body).await
    }

    /// [`serve`] on the loopback address `ip`.
    async fn serve_on(ip: &str, status: u16, body: &str) -> (SocketAddr, Shared) {
        serve_with(ip, status, body, Router::new()).await
    }

    /// [`serve_on`] with `extra` routes beside `/pods`.
    async fn serve_with(ip: &str, status: u16, body: &str, extra: Router) -> (SocketAddr, Shared) {
        let shared = Arc::new(Mutex::new(Served { status, body: body.into(), ..Served::default() }));
        async fn pods(State(shared): State<Shared>, headers: AxumHeaders) -> (StatusCode, String) {
            let mut served = shared.lock().expect("test lock");
            served.hits += 1;
            served.last_headers = headers
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
                .collect();
            (StatusCode::from_u16(served.status).expect("valid status"), served.body.clone())
        }
        let router = Router::new().route("/pods", get(pods)).with_state(shared.clone()).merge(extra);
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await });
        (addr, shared)
    }

    fn set(shared: &Shared, status: u16, body: &str) {
        let mut served = shared.lock().expect("test lock");
        served.status = status;
        served.body = body.into();
    }

    fn source_for(url: &str, headers: Vec<(String, String)>) -> (PodConfig, UrlSource) {
        let config = PodConfig::new(NODE);
        let handle = config.add_source("url").expect("url source");
        config.seal();
        let source =
            UrlSource::new(UrlSourceConfig { headers, ..UrlSourceConfig::new(url) }, handle).expect("valid");
        (config, source)
    }

    #[tokio::test]
    async fn pods_are_fetched_with_the_configured_headers() {
        let body = format!("{}---\n{}", pod_yaml("a", "nginx"), pod_yaml("b", "nginx"));
        let (addr, shared) = serve(200, &body).await;
        let url = format!("http://{addr}/pods");
        let headers: Vec<(String, String)> = [("X-Token", "secret"), ("X-Multi", "one"), ("X-Multi", "two")]
            .map(|(k, v)| (k.into(), v.into()))
            .into();
        let (config, mut source) = source_for(&url, headers);
        source.poll_once().await;
        let store = config.store();
        assert_eq!(names(&store), ["a-node-a", "b-node-a"]);
        assert!(store.is_synced());
        let pod = by_name(&store, "a-node-a").expect("a");
        assert_eq!(pod.source, PodSource::Url(url.clone()));
        let annotations = pod.pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get("kubernetes.io/config.source").map(String::as_str), Some("http"));
        let seen = shared.lock().expect("lock").last_headers.clone();
        assert!(seen.contains(&("x-token".into(), "secret".into())), "{seen:?}");
        let multi: Vec<_> = seen.iter().filter(|(k, _)| k == "x-multi").map(|(_, v)| v.as_str()).collect();
        assert_eq!(multi, ["one", "two"]);
    }

    #[tokio::test]
    async fn redirects_are_followed_and_the_headers_never_leave_the_configured_origin() {
        use axum::response::Redirect;
        let body = pod_yaml("a", "nginx");
        // Other origins: another host (127.0.0.2 is loopback too) and another port.
        let (other_host, other_host_seen) = serve_on("127.0.0.2", 200, &body).await;
        let (other_port, other_port_seen) = serve(200, &body).await;
        let to_host = format!("http://{other_host}/pods");
        let to_port = format!("http://{other_port}/pods");
        let redirects = Router::new()
            .route("/to-host", get(move || async move { Redirect::to(&to_host) }))
            .route("/to-port", get(move || async move { Redirect::temporary(&to_port) }))
            .route("/to-self", get(|| async { Redirect::permanent("/pods") }))
            .route("/loop", get(|| async { Redirect::to("/loop") }));
        let (home, home_seen) = serve_with("127.0.0.1", 200, &body, redirects).await;
        let headers = vec![("X-Token".to_owned(), "secret".to_owned())];
        let has_token = |shared: &Shared| {
            shared.lock().expect("lock").last_headers.iter().any(|(k, v)| k == "x-token" && v == "secret")
        };

        // Within the origin: followed, with the header.
        let (config, mut source) = source_for(&format!("http://{home}/to-self"), headers.clone());
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["a-node-a"], "the redirect was followed");
        assert!(has_token(&home_seen), "the configured origin gets the header after a redirect");

        // To another host or port: followed, without the header.
        for (path, seen) in [("to-host", &other_host_seen), ("to-port", &other_port_seen)] {
            let (config, mut source) = source_for(&format!("http://{home}/{path}"), headers.clone());
            source.poll_once().await;
            assert_eq!(names(&config.store()), ["a-node-a"], "{path}: the redirect was followed");
            assert_eq!(seen.lock().expect("lock").hits, 1, "{path}");
            assert!(!has_token(seen), "{path}: the header went to another origin");
        }

        // A loop ends with a clear problem after 10 redirects.
        let (config, mut source) = source_for(&format!("http://{home}/loop"), headers);
        source.poll_once().await;
        let problems = config.problems().list();
        assert!(problems.iter().any(|p| p.message.contains("redirected more than 10 times")), "{problems:?}");
    }

    #[test]
    fn redirects_from_https_to_http_are_refused() {
        let mut location = HeaderMap::new();
        let from = reqwest::Url::parse("https://example.invalid/pods").expect("url");
        location.insert(reqwest::header::LOCATION, HeaderValue::from_static("http://example.invalid/pods"));
        let error = redirect_target(&from, &location).expect_err("downgrade").to_string();
        assert_eq!(
            error,
            "refusing the redirect from https://example.invalid/pods to http://example.invalid/pods: from https \
             to unencrypted http"
        );
        location.insert(reqwest::header::LOCATION, HeaderValue::from_static("file:///etc/passwd"));
        assert!(
            redirect_target(&from, &location).expect_err("file").to_string().contains("is not http or https")
        );
        location.insert(reqwest::header::LOCATION, HeaderValue::from_static("/other"));
        assert_eq!(
            redirect_target(&from, &location).expect("relative").as_str(),
            "https://example.invalid/other"
        );
        let plain = reqwest::Url::parse("http://example.invalid/pods").expect("url");
        location.insert(reqwest::header::LOCATION, HeaderValue::from_static("https://example.invalid/x"));
        assert!(redirect_target(&plain, &location).is_ok(), "http to https is an upgrade");
        assert!(
            redirect_target(&plain, &HeaderMap::new())
                .expect_err("none")
                .to_string()
                .contains("without a Location")
        );
    }

    #[tokio::test]
    async fn a_pod_list_a_single_pod_and_an_empty_body_are_understood() {
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"x"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}]}"#;
        let (addr, shared) = serve(200, list).await;
        let (config, mut source) = source_for(&format!("http://{addr}/pods"), Vec::new());
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["x-node-a"]);
        set(&shared, 200, &pod_yaml("y", "nginx"));
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["y-node-a"]);
        set(&shared, 200, "");
        source.poll_once().await;
        assert!(config.store().is_empty(), "an empty body means no pods");
    }

    #[tokio::test]
    async fn failures_keep_the_last_good_pods_and_are_reported() {
        let (addr, shared) = serve(200, &pod_yaml("a", "nginx")).await;
        let url = format!("http://{addr}/pods");
        let (config, mut source) = source_for(&url, Vec::new());
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["a-node-a"]);

        set(&shared, 500, "boom");
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["a-node-a"], "a failed fetch changes nothing");
        let problems = config.problems().list();
        assert_eq!(problems[0].location, url);
        assert!(problems[0].message.contains("HTTP 500"), "{problems:?}");

        set(&shared, 200, &format!("{}---\n{}", pod_yaml("a", "''"), pod_yaml("b", "nginx")));
        source.poll_once().await;
        assert_eq!(
            names(&config.store()),
            ["a-node-a", "b-node-a"],
            "a broken pod keeps its last good version"
        );
        let problems = config.problems().list();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].object.as_deref(), Some("default/a"));
        assert!(problems[0].message.contains("spec.containers[0].image: Required value"), "{problems:?}");

        set(&shared, 200, &pod_yaml("b", "nginx"));
        source.poll_once().await;
        assert_eq!(names(&config.store()), ["b-node-a"]);
        assert!(config.problems().is_empty());
    }

    #[tokio::test]
    async fn the_source_is_not_synced_before_a_first_successful_fetch() {
        // A port nothing listens on: bind one, then drop it.
        let addr =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
        let (config, mut source) = source_for(&format!("http://{addr}/pods"), Vec::new());
        source.poll_once().await;
        assert!(!config.store().is_synced(), "nothing may be torn down for want of the URL");
        let problems = config.problems().list();
        assert!(problems[0].message.starts_with("cannot fetch the manifest URL"), "{problems:?}");
    }

    #[tokio::test]
    async fn run_polls_every_check_frequency() {
        let (addr, shared) = serve(200, &pod_yaml("a", "nginx")).await;
        let config = PodConfig::new(NODE);
        let handle = config.add_source("url").expect("url");
        let settings = UrlSourceConfig {
            check_frequency: Duration::from_millis(100),
            ..UrlSourceConfig::new(format!("http://{addr}/pods"))
        };
        let source = UrlSource::new(settings, handle).expect("valid");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(source.run(shutdown.clone()));
        let store = config.store();
        eventually("the first fetch", Duration::from_secs(2), || by_name(&store, "a-node-a")).await;
        set(&shared, 200, &pod_yaml("b", "nginx"));
        eventually("a later poll", Duration::from_secs(2), || by_name(&store, "b-node-a")).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").expect("no panic");
        assert!(shared.lock().expect("lock").hits >= 2);
    }

    #[tokio::test]
    async fn a_panic_while_polling_is_a_problem_of_the_url_and_the_next_poll_reads_it_again() {
        let (addr, _shared) = serve(200, &pod_yaml("a", "nginx")).await;
        let config = PodConfig::new(NODE);
        let handle = config.add_source("url").expect("url");
        let settings = UrlSourceConfig {
            // long enough for the problem to be seen before the next poll clears it
            check_frequency: Duration::from_millis(400),
            ..UrlSourceConfig::new(format!("http://{addr}/pods?token=secret"))
        };
        let mut source = UrlSource::new(settings, handle).expect("valid");
        source.panic_next_poll = true;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(source.run(shutdown.clone()));
        let problems = config.problems();
        eventually("the panic reported as a problem", Duration::from_secs(2), || {
            problems
                .list()
                .iter()
                .any(|p| p.message.contains("nodelet panicked on it: test hook"))
                .then_some(())
        })
        .await;
        let listed = problems.list();
        assert!(listed.iter().all(|p| !p.location.contains("secret")), "{listed:?}");
        let store = config.store();
        eventually("the next poll", Duration::from_secs(2), || by_name(&store, "a-node-a")).await;
        assert!(!task.is_finished(), "the source keeps running");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").expect("no panic");
    }

    #[test]
    fn urls_are_shown_without_user_information_or_query() {
        assert_eq!(
            redact_url("https://u:pw@example.invalid:8443/m?token=x#frag"),
            "https://<redacted>@example.invalid:8443/m?<redacted>"
        );
        assert_eq!(redact_url("https://token@example.invalid/"), "https://<redacted>@example.invalid/");
        assert_eq!(redact_url("https://example.invalid/a@b"), "https://example.invalid/a@b");
        assert_eq!(redact_url("http://[::1]:80/p"), "http://[::1]/p", "the scheme's own port is implied");
        assert_eq!(redact_url("http://127.0.0.1:9/p?"), "http://127.0.0.1:9/p?<redacted>");
        assert_eq!(redact_url("not a url?token=x"), "<redacted> (not a URL)");
        let debugged = format!("{:?}", PodSource::Url("https://u:pw@example.invalid/m?token=x".into()));
        assert_eq!(debugged, "Url(<redacted>)", "a pod's Debug (in any log line) leaves the URL out");
    }

    /// Everything logged (every level) while the guard lives, on this thread.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
        }
    }

    #[tokio::test]
    async fn the_urls_credentials_are_in_no_problem_and_no_log_line() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let secrets = ["s3cretpw", "t0ps3cret", "n3xts3cret"];
        let redirect = Router::new()
            .route("/hop", get(|| async { axum::response::Redirect::to("/pods?token=n3xts3cret") }));
        let (addr, shared) = serve_with("127.0.0.1", 500, "boom", redirect).await;
        let with_secrets = |path: &str| format!("http://user:s3cretpw@{addr}/{path}?token=t0ps3cret");

        // A failing fetch, after a redirect whose target holds a token too.
        let (config, mut source) = source_for(&with_secrets("hop"), Vec::new());
        source.poll_once().await;
        let mut problems = config.problems().list().to_vec();
        assert!(problems.iter().any(|p| p.message.contains("HTTP 500")), "{problems:?}");
        // A body with a broken pod.
        set(&shared, 200, &pod_yaml("a", "''"));
        source.poll_once().await;
        problems.extend(config.problems().list().iter().cloned());
        assert!(problems.iter().any(|p| p.message.contains("Required value")), "{problems:?}");
        // Nothing listens: the client's error names the URL.
        let closed =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
        let (config, mut source) =
            source_for(&format!("http://user:s3cretpw@{closed}/pods?token=t0ps3cret"), Vec::new());
        source.poll_once().await;
        problems.extend(config.problems().list().iter().cloned());
        assert!(problems.iter().any(|p| p.message.starts_with("cannot fetch")), "{problems:?}");
        // A redirect the source refuses names both ends.
        let from = reqwest::Url::parse(&with_secrets("x")).expect("url");
        let mut location = HeaderMap::new();
        location.insert(reqwest::header::LOCATION, HeaderValue::from_static("ftp://h/?token=n3xts3cret"));
        let refused = redirect_target(&from, &location).expect_err("ftp").to_string();

        let logs = captured.text();
        assert!(logs.contains("manifest URL redirected"), "debug lines are captured: {logs}");
        for secret in secrets {
            for p in &problems {
                assert!(!p.to_string().contains(secret), "{secret} in the problem {p}");
            }
            assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
            assert!(!refused.contains(secret), "{secret} in {refused}");
        }
        assert!(
            problems.iter().all(|p| p.location == format!("http://<redacted>@{addr}/hop?<redacted>")
                || p.location == format!("http://<redacted>@{closed}/pods?<redacted>")),
            "{problems:?}"
        );
        let invalid = UrlSource::new(
            UrlSourceConfig::new("ftp://user:s3cretpw@h/?token=t0ps3cret"),
            PodConfig::new(NODE).add_source("url").expect("source"),
        )
        .expect_err("ftp");
        assert!(
            !invalid.to_string().contains("s3cretpw") && !invalid.to_string().contains("t0ps3cret"),
            "{invalid}"
        );
    }

    #[test]
    fn bad_urls_and_headers_are_refused() {
        let config = PodConfig::new(NODE);
        for (i, url) in ["not a url", "ftp://127.0.0.1/pods", "file:///etc/passwd"].into_iter().enumerate() {
            let handle = config.add_source(format!("url{i}")).expect("source");
            assert!(
                matches!(
                    UrlSource::new(UrlSourceConfig::new(url), handle),
                    Err(UrlSourceError::InvalidUrl { .. })
                ),
                "{url}"
            );
        }
    }
}
