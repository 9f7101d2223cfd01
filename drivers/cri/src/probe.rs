//! [`CriProber`]: the real probe and lifecycle-hook handlers, as the kubelet runs them
//! (`pkg/probe/*`, `pkg/kubelet/lifecycle/handlers.go`):
//!
//! * `exec` through CRI `ExecSync` with the probe's timeout (success on exit code 0);
//! * `httpGet` over HTTP or HTTPS (certificates not verified, no proxy, no connection reuse), to the
//!   pod IP unless `host` is set, with the spec's headers, `User-Agent: kube-probe/<major.minor>`
//!   and `Accept: */*` (unless the spec sets them); success on 200–399; redirects followed only to
//!   the same host (a redirect elsewhere is answered as is, so it counts as success), at most 10;
//!   the body read only up to 10 KiB;
//! * `tcpSocket`: a TCP connect within the timeout;
//! * `grpc`: `grpc.health.v1.Health/Check` with the spec's `service` on the pod IP, plaintext;
//!   success on `SERVING`;
//! * lifecycle hooks: `exec`, `httpGet` (any answer counts as done, as in the kubelet) and `sleep`.
//!
//! Commands are passed to the runtime as argv, never through a shell built here.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerPort, LifecycleHandler};
use nodelet_resources::model::runtime::RuntimeError;
use nodelet_resources::probe::desired::{Action, HttpGet, MAX_BODY_BYTES, PROBE_USER_AGENT, hook_action};
use nodelet_resources::probe::handler::{ProbeHandler, ProbeOutcome, ProbeTarget};

use crate::client::CriClient;
use crate::filter::ContainerFilter;
use crate::{labels, proto};

/// Most redirects an HTTP probe follows (Go's `http.Client` default, which the kubelet keeps).
const MAX_REDIRECTS: usize = 10;
/// How much of a command's output a failure message keeps.
const MAX_OUTPUT_CHARS: usize = 1024;
/// What an `exec` probe waits beyond its timeout for the runtime to report the timeout.
const EXEC_MARGIN: Duration = Duration::from_secs(2);

/// Runs probes and lifecycle hooks against containers of a CRI runtime. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CriProber {
    client: CriClient,
    /// The HTTP client, or why it could not be built (then HTTP probes and hooks fail with that).
    http: Result<reqwest::Client, HttpClientError>,
}

/// Why the HTTP probe client could not be built (then every HTTP probe and hook fails with this).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot build the HTTP probe client: {0}")]
struct HttpClientError(std::sync::Arc<reqwest::Error>);

/// The HTTP client of every prober of the process, built by the first ([`CriProber::new`]): its settings
/// are the same for every prober, it keeps no connection between requests, and its TLS session cache is
/// allocated up front (about 15 KB), once per process instead of once per node of `nodelet hollow`.
fn shared_http() -> Result<reqwest::Client, HttpClientError> {
    static HTTP: std::sync::OnceLock<Result<reqwest::Client, HttpClientError>> = std::sync::OnceLock::new();
    HTTP.get_or_init(|| {
        #[cfg(test)]
        HTTP_BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .pool_max_idle_per_host(0)
            .user_agent(PROBE_USER_AGENT)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first().and_then(|u| u.host_str().map(str::to_owned));
                if attempt.previous().len() > MAX_REDIRECTS {
                    attempt.error(format!("stopped after {MAX_REDIRECTS} redirects"))
                } else if attempt.url().host_str().map(str::to_owned) == first {
                    attempt.follow()
                } else {
                    // A redirect to another host is not followed: its 3xx answer is the result.
                    attempt.stop()
                }
            }))
            .build()
            .map_err(|e| {
                tracing::error!(error = %e, "cannot build the HTTP probe client: HTTP probes and hooks will fail");
                HttpClientError(std::sync::Arc::new(e))
            })
    })
    .clone()
}

/// How many times [`shared_http`] built its client in this process.
#[cfg(test)]
static HTTP_BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Why a probe has no host to go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pod has no IP and the probe names no host")]
struct NoHost;

/// `host:port` for a URL (IPv6 literals bracketed).
fn authority(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

fn truncate(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= MAX_OUTPUT_CHARS {
        text.to_owned()
    } else {
        text.chars().take(MAX_OUTPUT_CHARS).collect::<String>() + "…"
    }
}

/// The host a probe goes to: the spec's, else the pod IP.
fn host_of<'a>(host: Option<&'a str>, pod_ip: Option<&'a str>) -> Result<&'a str, NoHost> {
    host.or(pod_ip).ok_or(NoHost)
}

/// Why a lifecycle hook failed ([`CriProber::run_hook`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// The `exec` command failed or could not run: the runtime's output or error.
    #[error("{0}")]
    Exec(String),
    /// The `httpGet` request got no answer.
    #[error("{0}")]
    Http(String),
    /// A `tcpSocket` or `grpc` hook, which the kubelet does not run either.
    #[error("only exec, httpGet and sleep hooks are supported")]
    Unsupported,
    /// The hook cannot be run as written (an unknown port name, no handler).
    #[error("{0}")]
    Unusable(String),
}

/// How an HTTP request ended.
enum HttpAnswer {
    /// A status and the start of the body.
    Status(u16, String),
    /// No answer.
    Error(String),
}

impl CriProber {
    /// A prober using `client` for `exec`, and the HTTP client every prober of the process shares.
    pub fn new(client: CriClient) -> Self {
        CriProber { client, http: shared_http() }
    }

    /// The CRI client.
    pub fn client(&self) -> &CriClient {
        &self.client
    }

    async fn exec(&self, container_id: &str, command: &[String], timeout: Duration) -> ProbeOutcome {
        if command.is_empty() {
            return ProbeOutcome::Error("empty command".to_owned());
        }
        let run = self.client.exec_sync(container_id, command.to_vec(), timeout);
        let limit = if timeout.is_zero() { None } else { Some(timeout + EXEC_MARGIN) };
        let result = match limit {
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(r) => r,
                Err(_) => {
                    return ProbeOutcome::Failure(format!("command {command:?} timed out after {timeout:?}"));
                }
            },
            None => run.await,
        };
        match result {
            Ok(out) if out.success() => ProbeOutcome::Success,
            Ok(out) => {
                let mut output = out.stdout_lossy();
                output.push_str(&out.stderr_lossy());
                ProbeOutcome::Failure(format!(
                    "command {command:?} exited with {}: {}",
                    out.exit_code,
                    truncate(&output)
                ))
            }
            Err(e) if e.is_timeout() => {
                ProbeOutcome::Failure(format!("command {command:?} timed out after {timeout:?}"))
            }
            Err(e) => ProbeOutcome::Error(format!("exec {command:?}: {e}")),
        }
    }

    async fn http_get(&self, get: &HttpGet, pod_ip: Option<&str>, timeout: Duration) -> HttpAnswer {
        let host = match host_of(get.host.as_deref(), pod_ip) {
            Ok(h) => h,
            Err(e) => return HttpAnswer::Error(e.to_string()),
        };
        let scheme = if get.https { "https" } else { "http" };
        let url = format!("{scheme}://{}{}", authority(host, get.port), get.path);
        let url = match reqwest::Url::parse(&url) {
            Ok(u) => u,
            Err(e) => return HttpAnswer::Error(format!("bad URL {url:?}: {e}")),
        };
        let http = match &self.http {
            Ok(c) => c,
            Err(e) => return HttpAnswer::Error(e.to_string()),
        };
        let mut request = http.get(url.clone());
        if !timeout.is_zero() {
            request = request.timeout(timeout);
        }
        let mut accept = false;
        for (name, value) in &get.headers {
            let name = match reqwest::header::HeaderName::from_bytes(name.as_bytes()) {
                Ok(n) => n,
                Err(e) => return HttpAnswer::Error(format!("bad header name {name:?}: {e}")),
            };
            let value = match reqwest::header::HeaderValue::from_str(value) {
                Ok(v) => v,
                Err(e) => return HttpAnswer::Error(format!("bad value of header {name}: {e}")),
            };
            accept |= name == reqwest::header::ACCEPT;
            request = request.header(name, value);
        }
        if !accept {
            request = request.header(reqwest::header::ACCEPT, "*/*");
        }
        let mut response = match request.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return HttpAnswer::Error(format!("Get {url}: context deadline exceeded ({timeout:?})"));
            }
            Err(e) => return HttpAnswer::Error(format!("Get {url}: {e}")),
        };
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while body.len() < MAX_BODY_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    body.extend_from_slice(&chunk[..chunk.len().min(MAX_BODY_BYTES - body.len())])
                }
                Ok(None) | Err(_) => break,
            }
        }
        HttpAnswer::Status(status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn tcp(host: Option<&str>, port: u16, pod_ip: Option<&str>, timeout: Duration) -> ProbeOutcome {
        let host = match host_of(host, pod_ip) {
            Ok(h) => h,
            Err(e) => return ProbeOutcome::Error(e.to_string()),
        };
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
            Ok(Ok(_stream)) => ProbeOutcome::Success,
            Ok(Err(e)) => ProbeOutcome::Failure(format!("dial tcp {}: {e}", authority(host, port))),
            Err(_) => ProbeOutcome::Failure(format!("dial tcp {}: i/o timeout", authority(host, port))),
        }
    }

    async fn grpc(port: u16, service: &str, pod_ip: Option<&str>, timeout: Duration) -> ProbeOutcome {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

        let host = match host_of(None, pod_ip) {
            Ok(h) => h,
            Err(e) => return ProbeOutcome::Error(e.to_string()),
        };
        let addr = authority(host, port);
        let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .and_then(|e| e.user_agent(PROBE_USER_AGENT))
        {
            Ok(e) => e.connect_timeout(timeout).timeout(timeout),
            Err(e) => return ProbeOutcome::Error(format!("bad gRPC address {addr}: {e}")),
        };
        let call = async {
            let channel = endpoint.connect().await.map_err(|e| {
                format!("timeout: failed to connect service {addr:?} within {timeout:?}: {e}")
            })?;
            HealthClient::new(channel)
                .check(HealthCheckRequest { service: service.to_owned() })
                .await
                .map(|r| r.into_inner().status)
                .map_err(|e| format!("health rpc did not complete within {timeout:?}: {}", e.message()))
        };
        match tokio::time::timeout(timeout + timeout, call).await {
            Ok(Ok(status)) if status == ServingStatus::Serving as i32 => ProbeOutcome::Success,
            Ok(Ok(status)) => {
                let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
                ProbeOutcome::Failure(format!("service unhealthy (responded with {name:?})"))
            }
            Ok(Err(e)) => ProbeOutcome::Failure(e),
            Err(_) => {
                ProbeOutcome::Failure(format!("timeout: health rpc did not complete within {timeout:?}"))
            }
        }
    }

    /// Runs a lifecycle hook in or against the container: `exec` (within `timeout`, none if zero),
    /// `httpGet` (any answer is success), `sleep`. Returns why it failed.
    pub async fn run_hook(
        &self,
        container_id: &str,
        pod_ip: Option<&str>,
        action: &Action,
        timeout: Duration,
    ) -> Result<(), HookError> {
        match action {
            Action::Exec { command } => match self.exec(container_id, command, timeout).await {
                ProbeOutcome::Success => Ok(()),
                ProbeOutcome::Failure(m) | ProbeOutcome::Error(m) => Err(HookError::Exec(m)),
            },
            Action::HttpGet(get) => match self.http_get(get, pod_ip, timeout).await {
                HttpAnswer::Status(..) => Ok(()),
                HttpAnswer::Error(e) => Err(HookError::Http(e)),
            },
            Action::Sleep(d) => {
                tokio::time::sleep(*d).await;
                Ok(())
            }
            Action::TcpSocket { .. } | Action::Grpc { .. } => Err(HookError::Unsupported),
            Action::Unusable(why) => Err(HookError::Unusable(why.clone())),
        }
    }
}

/// The kubelet's floor on what is left of the grace period for the stop after a preStop hook.
pub const MIN_GRACE_AFTER_PRE_STOP: Duration = Duration::from_secs(2);

/// Runs the container's `postStart` hook, if it has one, right after it started; returns the
/// `PostStartHookError` to fail the start with (the caller kills the container, as the kubelet does).
///
/// `exec` and `httpGet` hooks get at most the runtime request timeout
/// ([`CriConfig::runtime_request_timeout`](crate::CriConfig::runtime_request_timeout), 2 minutes by
/// default): the command's `ExecSync` deadline, the request's timeout. A `sleep` hook sleeps its
/// seconds. The caller also gives the hook up when the pod no longer wants the start.
pub(crate) async fn post_start(
    prober: &CriProber,
    container: &Container,
    container_id: &str,
    pod_ip: Option<&str>,
) -> Result<(), RuntimeError> {
    let Some(hook) = container.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else { return Ok(()) };
    let action = hook_action(hook, container.ports.as_deref().unwrap_or_default());
    tracing::debug!(container = %container.name, id = %container_id, ?action, "running postStart");
    // An exec hook keeps the runtime's "no timeout" (0), bounded by the client's deadline of the call.
    let timeout = match action {
        Action::Exec { .. } => Duration::ZERO,
        _ => prober.client.config().runtime_request_timeout,
    };
    prober.run_hook(container_id, pod_ip, &action, timeout).await.map_err(|e| {
        RuntimeError::new(
            "PostStartHookError",
            format!("container {:?}: postStart hook failed: {e}", container.name),
        )
    })
}

/// Runs the `preStop` hook recorded on a running container (annotation
/// [`labels::CONTAINER_PRE_STOP_HANDLER`]) within `grace`; returns the grace left for the stop (at
/// least [`MIN_GRACE_AFTER_PRE_STOP`] once a hook ran). Nothing runs for a zero grace period, an
/// exited or unknown container or one without the hook; a failed hook is logged and the stop goes on.
pub(crate) async fn pre_stop(prober: &CriProber, container_id: &str, grace: Duration) -> Duration {
    if grace.is_zero() {
        return grace;
    }
    let client = &prober.client;
    let found = match client.list_containers(&ContainerFilter::all().id(container_id)).await {
        Ok(list) => list.into_iter().find(|c| c.id == container_id),
        Err(e) => {
            tracing::debug!(id = %container_id, error = %e, "cannot read the container for its preStop hook");
            None
        }
    };
    let Some(found) = found.filter(|c| c.state == proto::ContainerState::ContainerRunning as i32) else {
        return grace;
    };
    let Some(hook) = found
        .annotations
        .get(labels::CONTAINER_PRE_STOP_HANDLER)
        .and_then(|json| serde_json::from_str::<LifecycleHandler>(json).ok())
    else {
        return grace;
    };
    let ports: Vec<ContainerPort> = found
        .annotations
        .get(labels::CONTAINER_PORTS)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    let pod_ip = match client.pod_sandbox_status(&found.pod_sandbox_id).await {
        Ok(status) => status.network.map(|n| n.ip).filter(|ip| !ip.is_empty()),
        Err(_) => None,
    };
    let action = hook_action(&hook, &ports);
    let name = found.metadata.map(|m| m.name).unwrap_or_default();
    let started = tokio::time::Instant::now();
    tracing::debug!(container = %name, id = %container_id, ?action, ?grace, "running preStop");
    match tokio::time::timeout(grace, prober.run_hook(container_id, pod_ip.as_deref(), &action, grace)).await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(container = %name, id = %container_id, error = %e, "preStop hook failed")
        }
        Err(_) => {
            tracing::warn!(container = %name, id = %container_id, ?grace, "preStop hook did not finish within the grace period")
        }
    }
    grace.saturating_sub(started.elapsed()).max(MIN_GRACE_AFTER_PRE_STOP)
}

impl ProbeHandler for CriProber {
    async fn probe(&self, target: &ProbeTarget, action: &Action, timeout: Duration) -> ProbeOutcome {
        let pod_ip = target.pod_ip.as_deref();
        match action {
            Action::Exec { command } => self.exec(&target.container_id, command, timeout).await,
            Action::HttpGet(get) => match self.http_get(get, pod_ip, timeout).await {
                HttpAnswer::Status(status, _) if (200..400).contains(&status) => ProbeOutcome::Success,
                HttpAnswer::Status(status, body) => ProbeOutcome::Failure(if body.trim().is_empty() {
                    format!("HTTP probe failed with statuscode: {status}")
                } else {
                    format!("HTTP probe failed with statuscode: {status}: {}", truncate(&body))
                }),
                HttpAnswer::Error(e) => ProbeOutcome::Failure(e),
            },
            Action::TcpSocket { host, port } => Self::tcp(host.as_deref(), *port, pod_ip, timeout).await,
            Action::Grpc { port, service } => Self::grpc(*port, service, pod_ip, timeout).await,
            Action::Sleep(_) => ProbeOutcome::Error("sleep is not a probe handler".to_owned()),
            Action::Unusable(why) => ProbeOutcome::Error(why.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn prober() -> CriProber {
        let client = match CriClient::connect_lazy(crate::CriConfig::new("unix:///nonexistent/cri.sock")) {
            Ok(c) => c,
            Err(e) => panic!("lazy client: {e}"),
        };
        CriProber::new(client)
    }

    #[tokio::test]
    async fn the_probers_of_a_process_share_one_http_client() {
        let (a, b) = (prober(), prober());
        assert!(a.http.is_ok() && b.http.is_ok());
        assert_eq!(HTTP_BUILDS.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    fn target() -> ProbeTarget {
        ProbeTarget {
            pod_uid: "u".into(),
            namespace: "default".into(),
            pod_name: "p".into(),
            container: "c".into(),
            container_id: "id".into(),
            pod_ip: Some("127.0.0.1".into()),
        }
    }

    /// A listener on a free loopback port, and the port.
    async fn loopback_listener() -> (TcpListener, u16) {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("bind: {e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        (listener, port)
    }

    /// A one-shot HTTP server on loopback answering each request with `status` (and a `Location`
    /// to `location` if set); returns its port and the requests it saw.
    async fn http_server(answers: Vec<(u16, Option<String>)>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let (listener, port) = loopback_listener().await;
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, location) in answers {
                let Ok((mut stream, _)) = listener.accept().await else { break };
                let mut buf = vec![0_u8; 8192];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let location = location.map(|l| format!("Location: {l}\r\n")).unwrap_or_default();
                let body = "x".repeat(20_000);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\n{location}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            }
            seen
        });
        (port, task)
    }

    fn get(port: u16, path: &str, headers: Vec<(String, String)>) -> Action {
        Action::HttpGet(HttpGet { https: false, host: None, port, path: path.into(), headers })
    }

    #[tokio::test]
    async fn http_probes_succeed_on_2xx_3xx_and_send_the_kubelets_headers() {
        let p = prober();
        let (port, seen) =
            http_server(vec![(200, None), (302, Some("http://198.18.255.254:1/x".into())), (500, None)])
                .await;
        let headers = vec![("X-Custom".to_owned(), "v1".to_owned())];
        assert_eq!(
            p.probe(&target(), &get(port, "/healthz?a=1", headers), Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        // A redirect to another host is not followed: the 302 itself passes.
        assert_eq!(
            p.probe(&target(), &get(port, "/", vec![]), Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        let failed = p.probe(&target(), &get(port, "/", vec![]), Duration::from_secs(2)).await;
        match failed {
            ProbeOutcome::Failure(m) => {
                assert!(m.starts_with("HTTP probe failed with statuscode: 500"), "{m}");
                assert!(m.len() < 2 * MAX_OUTPUT_CHARS + 100, "body capped: {} bytes", m.len());
            }
            other => panic!("expected a failure, got {other:?}"),
        }
        let seen = seen.await.unwrap_or_default();
        let first = seen.first().cloned().unwrap_or_default().to_ascii_lowercase();
        assert!(first.starts_with("get /healthz?a=1 http/1.1"), "{first}");
        assert!(first.contains(&format!("user-agent: {}", PROBE_USER_AGENT.to_ascii_lowercase())), "{first}");
        assert!(first.contains("accept: */*"), "{first}");
        assert!(first.contains("x-custom: v1"), "{first}");
    }

    /// A loopback HTTPS server with a fresh self-signed certificate (no client could verify it)
    /// answering each of `statuses` in turn; returns its port and the request lines it saw.
    async fn https_server(statuses: Vec<u16>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let cert = match rcgen::generate_simple_self_signed(vec!["probe-test.invalid".to_owned()]) {
            Ok(c) => c,
            Err(e) => panic!("certificate: {e}"),
        };
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(vec![cert.cert.der().clone()], key));
        let config = match config {
            Ok(c) => Arc::new(c),
            Err(e) => panic!("TLS config: {e}"),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (listener, port) = loopback_listener().await;
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            for status in statuses {
                let Ok((tcp, _)) = listener.accept().await else { break };
                let Ok(mut stream) = acceptor.accept(tcp).await else { break };
                let mut buf = vec![0_u8; 8192];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                seen.push(String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_owned());
                let reply =
                    format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
                let _ = stream.write_all(reply.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
            seen
        });
        (port, task)
    }

    #[tokio::test]
    async fn https_probes_talk_tls_and_skip_certificate_verification_as_the_kubelet_does() {
        let p = prober();
        let (port, seen) = https_server(vec![200, 503]).await;
        let https = |path: &str| {
            Action::HttpGet(HttpGet { https: true, host: None, port, path: path.into(), headers: vec![] })
        };
        assert_eq!(p.probe(&target(), &https("/ready"), Duration::from_secs(5)).await, ProbeOutcome::Success);
        let failed = p.probe(&target(), &https("/ready"), Duration::from_secs(5)).await;
        assert!(matches!(&failed, ProbeOutcome::Failure(m) if m.contains("503")), "{failed:?}");
        assert_eq!(seen.await.unwrap_or_default(), ["GET /ready HTTP/1.1", "GET /ready HTTP/1.1"]);
        // Plain HTTP to the TLS port is no success.
        let (port, _seen) = https_server(vec![200]).await;
        let plain = p.probe(&target(), &get(port, "/", vec![]), Duration::from_secs(2)).await;
        assert_ne!(plain, ProbeOutcome::Success);
    }

    #[tokio::test]
    async fn http_probes_follow_redirects_to_the_same_host() {
        let p = prober();
        let (port, seen) = http_server(vec![(301, Some("/moved".into())), (503, None)]).await;
        let out = p.probe(&target(), &get(port, "/", vec![]), Duration::from_secs(2)).await;
        assert!(matches!(&out, ProbeOutcome::Failure(m) if m.contains("503")), "{out:?}");
        let seen = seen.await.unwrap_or_default();
        assert!(seen.get(1).is_some_and(|r| r.starts_with("GET /moved ")), "{seen:?}");
    }

    #[tokio::test]
    async fn tcp_probes_connect_or_fail() {
        let (listener, port) = loopback_listener().await;
        let p = prober();
        let action = Action::TcpSocket { host: None, port };
        assert_eq!(p.probe(&target(), &action, Duration::from_secs(1)).await, ProbeOutcome::Success);
        drop(listener);
        let out = p.probe(&target(), &action, Duration::from_secs(1)).await;
        assert!(matches!(&out, ProbeOutcome::Failure(m) if m.contains("dial tcp")), "{out:?}");
    }

    #[tokio::test]
    async fn grpc_probes_fail_without_a_server_and_without_an_ip() {
        let (listener, port) = loopback_listener().await;
        drop(listener);
        let p = prober();
        let action = Action::Grpc { port, service: String::new() };
        let out = p.probe(&target(), &action, Duration::from_secs(1)).await;
        assert!(matches!(out, ProbeOutcome::Failure(_)), "{out:?}");
        let no_ip = ProbeTarget { pod_ip: None, ..target() };
        assert!(matches!(p.probe(&no_ip, &action, Duration::from_secs(1)).await, ProbeOutcome::Error(_)));
    }

    #[tokio::test]
    async fn hooks_sleep_and_reject_what_they_cannot_run() {
        let p = prober();
        assert_eq!(
            p.run_hook("id", None, &Action::Sleep(Duration::from_millis(10)), Duration::ZERO).await,
            Ok(())
        );
        assert!(p.run_hook("id", None, &Action::Unusable("no".into()), Duration::ZERO).await.is_err());
        assert!(
            p.run_hook("id", None, &Action::TcpSocket { host: None, port: 1 }, Duration::ZERO).await.is_err()
        );
    }

    #[tokio::test]
    async fn an_http_post_start_hook_that_never_answers_fails_after_the_runtime_request_timeout() {
        // Accepts, reads, and never answers.
        let (listener, port) = loopback_listener().await;
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let config = crate::CriConfig::new("unix:///nonexistent/cri.sock")
            .with_runtime_request_timeout(Duration::from_millis(300));
        let prober = match CriClient::connect_lazy(config) {
            Ok(c) => CriProber::new(c),
            Err(e) => panic!("lazy client: {e}"),
        };
        let container: Container = match serde_json::from_value(serde_json::json!({
            "name": "app",
            "lifecycle": {"postStart": {"httpGet": {"host": "127.0.0.1", "port": port, "path": "/hook"}}},
        })) {
            Ok(c) => c,
            Err(e) => panic!("container: {e}"),
        };
        let started = std::time::Instant::now();
        let result =
            tokio::time::timeout(Duration::from_secs(10), post_start(&prober, &container, "id", None)).await;
        silent.abort();
        match result {
            Ok(Err(e)) => {
                assert_eq!(e.reason, "PostStartHookError");
                assert!(e.message.contains("deadline"), "{}", e.message);
            }
            other => panic!("the hook did not fail on its own: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
