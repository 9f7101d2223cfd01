//! The HTTP stack of cluster mode's API clients: one connection per client, HTTP/2 when the API server
//! offers it (ALPN `h2`, as every kube-apiserver over TLS does), as client-go's.
//!
//! kube-client's own stack (`kube::client::ClientBuilder::try_from`) speaks HTTP/1 only, so each watch
//! holds a connection of its own (hyper's read and write buffers, its dispatch channel and a TLS session
//! each). [`client`] builds the same stack from kube's public pieces ([`kube::client::ConfigExt`]) over a
//! hyper client that also speaks HTTP/2: every request of the client (its watches, patches, events) is
//! a stream of one connection. Each layer kube-client adds is added here the same way: the
//! TLS configuration with the kubeconfig's identity and CA (and `tls-server-name`), the connect, read and
//! write timeouts of the connection ([`super::tune`]), the base URI, the retry of server errors, the
//! authentication (tokens, token files and exec plugins refreshed as kube-client does), the extra headers
//! (user agent, impersonation) and the `HTTP` tracing span of each request. A kubeconfig with a
//! `proxy-url` keeps kube-client's HTTP/1 stack. The Lease's client offers HTTP/1.1 alone
//! ([`Versions::Http1`]). Not set: the expiry kube-client records of a certificate an
//! exec plugin returns (`kube::Client::valid_until`, which nodelet does not read).
//!
//! A dead HTTP/2 connection is found by pings, as client-go's (`ReadIdleTimeout` 30 s, `PingTimeout`
//! 15 s): when nothing was read on the connection for [`PING_IDLE`], a ping is sent, and the connection
//! is closed when its answer does not come within [`PING_TIMEOUT`]; its streams then fail and are
//! retried on a new connection.

use std::time::Duration;

use http::{Request, Response, header::HeaderMap};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt as _};
use tower::{BoxError, ServiceBuilder};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;
use tracing::Span;

/// How long nothing may be read on an HTTP/2 connection before a ping is sent (client-go's
/// `ReadIdleTimeout`).
pub(crate) const PING_IDLE: Duration = Duration::from_secs(30);

/// How long a ping's answer may take before the connection is closed (client-go's `PingTimeout`).
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The TLS sessions a client keeps for resumption.
const TLS_SESSIONS: usize = 4;

/// The HTTP versions a client offers the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Versions {
    /// HTTP/2 when the server negotiates it, else HTTP/1 (a plain `http://` server): every request of the
    /// client is a stream of one connection.
    Any,
    /// HTTP/1.1 only: one request at a time on a connection, and a request given up before its answer
    /// closes its connection, so the next one never waits on a connection that stopped answering. For a
    /// client that sends one small request at a time (the Lease renewals): lighter than an HTTP/2
    /// connection (no header tables, no stream bookkeeping).
    Http1,
}

/// A client of `config` (no rate limit) whose requests share one connection, with the HTTP `versions`
/// it offers. A `proxy-url` in `config` gives kube-client's own (HTTP/1) client.
pub(crate) fn client(config: kube::Config, versions: Versions) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Ok(kube::client::ClientBuilder::try_from(config)?.build());
    }
    let default_ns = config.default_namespace.clone();
    let auth = config.auth_layer()?;

    let mut tls = config.rustls_client_config()?;
    // one connection to one server: a few resumable sessions are enough (rustls' default keeps room for
    // 256, allocated up front)
    tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Every stream of the client shares this connection: a small frame (a request's headers, a window
    // update, a ping) must not wait for the acknowledgement of the previous one (Nagle), as Go's net package
    // sets for client-go.
    http.set_nodelay(true);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    // ALPN offers h2 and http/1.1, or http/1.1 alone
    let https = match versions {
        Versions::Any => https.enable_all_versions().wrap_connector(http),
        Versions::Http1 => https.enable_http1().wrap_connector(http),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);

    let hyper_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_IDLE)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);

    // kube-client's layers, outermost first
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())),
        )
        .option_layer(auth)
        .layer(config.extra_headers_layer()?)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<Body>| {
                    tracing::debug_span!(
                        "HTTP",
                        http.method = %req.method(),
                        http.url = %req.uri(),
                        http.status_code = tracing::field::Empty,
                        otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
                        otel.kind = "client",
                        otel.status_code = tracing::field::Empty,
                    )
                })
                .on_request(|_req: &Request<Body>, _span: &Span| tracing::debug!("requesting"))
                .on_response(|res: &Response<Incoming>, _latency: Duration, span: &Span| {
                    let status = res.status();
                    span.record("http.status_code", status.as_u16());
                    if status.is_client_error() || status.is_server_error() {
                        span.record("otel.status_code", "ERROR");
                    }
                })
                .on_body_chunk(())
                .on_eos(|_: Option<&HeaderMap>, _duration: Duration, _span: &Span| {
                    tracing::debug!("stream closed");
                })
                .on_failure(|class: ServerErrorsFailureClass, _latency: Duration, span: &Span| {
                    span.record("otel.status_code", "ERROR");
                    match class {
                        ServerErrorsFailureClass::StatusCode(status) => {
                            span.record("http.status_code", status.as_u16());
                            tracing::error!("failed with status {}", status);
                        }
                        ServerErrorsFailureClass::Error(err) => tracing::error!("failed with error {}", err),
                    }
                }),
        )
        .map_err(BoxError::from)
        .service(hyper_client);
    Ok(kube::Client::new(service, default_ns))
}
