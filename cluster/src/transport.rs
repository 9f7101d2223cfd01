//! The HTTP stack of cluster mode's API clients: one connection per client, HTTP/2 when the API server
//! offers it (ALPN `h2`, as every kube-apiserver over TLS does), as client-go's.
//!
//! kube-client's own stack (`kube::client::ClientBuilder::try_from`) speaks HTTP/1 only, so each watch
//! holds a connection of its own (hyper's read and write buffers, its dispatch channel and a TLS session
//! each). [`stack`] builds the same stack from kube's public pieces ([`kube::client::ConfigExt`]) over a
//! hyper client that also speaks HTTP/2: every request of the client (its watches, patches, events) is a
//! stream of one connection. A stack has no request queue of its own: cluster mode's clients (`certificates`)
//! send through an outer `kube::Client` whose queue is enough. Each layer kube-client adds is added here the
//! same way: the TLS configuration with the kubeconfig's identity and CA (and `tls-server-name`), the
//! connect, read and write timeouts of the connection ([`super::tune`]), the base URI, the retry of server
//! errors, the authentication (tokens, token files and exec plugins refreshed as kube-client does), the extra
//! headers (user agent, impersonation) and the `HTTP` tracing span of each request. A kubeconfig with a
//! `proxy-url` keeps kube-client's HTTP/1 stack. Not set: the expiry kube-client records of a certificate an
//! exec plugin returns (`kube::Client::valid_until`, which nodelet does not read).
//!
//! The Lease's stack ([`reconnecting`]) is such a stack that gives up its connection after a
//! request that failed without an answer or was given up before it came, and opens a new one for the
//! next request, as the kubelet closes its heartbeat connections after a failed heartbeat: an HTTP/2
//! connection that stopped answering would otherwise keep the next renewals until its ping times out
//! (45 s, past the Lease's 40 s).
//!
//! A dead HTTP/2 connection is found by pings, as client-go's (`ReadIdleTimeout` 30 s, `PingTimeout`
//! 15 s): when nothing was read on the connection for [`PING_IDLE`], a ping is sent, and the connection
//! is closed when its answer does not come within [`PING_TIMEOUT`]; its streams then fail and are
//! retried on a new connection. Until then the connection stays the client's, however long between two of
//! its requests: hyper's pool would otherwise set it aside 90 s after the last request it started, open
//! its streams (the watches) or not, and the next request would open a second connection.

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

/// The HTTP stack of a client, without kube-client's request queue: a clone sends on the stack's
/// connection. The inner clients of cluster mode are stacks: their requests come through an outer
/// `kube::Client` ([`super::certificates::SwapService`]), whose queue is enough (kube-client's queue is a
/// channel whose first 32 slots are allocated when it is made, about 10 KiB, and a task).
pub(crate) type Stack = tower::util::BoxCloneSyncService<Request<Body>, Response<StackBody>, BoxError>;

/// The response body of a [`Stack`].
pub(crate) type StackBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

/// A client of `config` (no rate limit) whose requests share one connection, HTTP/2 when the server offers
/// it ([`stack`] under kube-client's queue).
#[cfg(test)]
pub(crate) fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let default_ns = config.default_namespace.clone();
    Ok(kube::Client::new(stack(config)?, default_ns))
}

/// The stack of a client of `config` (no rate limit) whose requests share one connection, HTTP/2 when the
/// server offers it. A `proxy-url` in `config` gives kube-client's own (HTTP/1) client.
pub(crate) fn stack(config: kube::Config) -> Result<Stack, kube::Error> {
    if config.proxy_url.is_some() {
        let client = kube::client::ClientBuilder::try_from(config)?.build();
        return Ok(stack_of(tower::service_fn(move |req: Request<Body>| {
            let client = client.clone();
            async move { client.send(req).await }
        })));
    }
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
    // ALPN offers h2 and http/1.1
    let https = https.enable_all_versions().wrap_connector(http);
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
            // the pool's clock is tokio's (as the pings')
            .pool_timer(TokioTimer::new())
            // A connection stays the client's for as long as it is open. hyper's pool counts an HTTP/2
            // connection idle from the last request it started, whatever streams are still open on it: with
            // its default (90 s), a node whose watches are open but which sent no other request for 90 s
            // would open a new connection for its next request, while the first stays open for its watches.
            // A connection that closes (the server's GOAWAY, a ping unanswered) leaves the pool, and the next
            // request opens a new one.
            .pool_idle_timeout(None)
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
    Ok(stack_of(service))
}

/// `service` as a [`Stack`]: its answers' bodies boxed, its errors as they are.
pub(crate) fn stack_of<S, B>(service: S) -> Stack
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    Stack::new(
        service
            .map_response(|res: Response<B>| res.map(|b| b.map_err(Into::into).boxed_unsync()))
            .map_err(Into::into),
    )
}

/// [`reconnecting`] under kube-client's queue.
#[cfg(test)]
pub(crate) fn reconnecting_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let default_ns = config.default_namespace.clone();
    Ok(kube::Client::new(reconnecting(config)?, default_ns))
}

/// A stack of `config` as [`stack`], whose connection is replaced after a request that failed without an
/// answer (a transport error) or was dropped before its answer came (a timeout): the next request builds a
/// new [`stack`], and with it a new connection; the old connection closes once its last request is gone.
/// An answer of any status keeps the connection. The connection is made (and remade) on the runtime that
/// sends the request, which drives it.
pub(crate) fn reconnecting(config: kube::Config) -> Result<Stack, kube::Error> {
    let first = stack(config.clone())?;
    Ok(Stack::new(Reconnecting {
        config: std::sync::Arc::new(config),
        current: std::sync::Arc::new(std::sync::Mutex::new(Current { client: Some(first), generation: 0 })),
    }))
}

/// The stack in use and how many were built before it.
struct Current {
    client: Option<Stack>,
    generation: u64,
}

/// The service of [`reconnecting`].
#[derive(Clone)]
struct Reconnecting {
    config: std::sync::Arc<kube::Config>,
    current: std::sync::Arc<std::sync::Mutex<Current>>,
}

/// Drops the client of `generation` when dropped armed: the request it watches did not get its answer.
struct GiveUpOnDrop {
    current: std::sync::Arc<std::sync::Mutex<Current>>,
    generation: u64,
    armed: bool,
}

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // a later client (built after another failure) is left alone
        if current.generation == self.generation && current.client.take().is_some() {
            tracing::debug!(
                "a request got no answer: its connection is given up, the next request opens one"
            );
        }
    }
}

impl tower::Service<Request<Body>> for Reconnecting {
    type Response = Response<StackBody>;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<StackBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let picked = {
            let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match &current.client {
                Some(c) => Ok((c.clone(), current.generation)),
                None => stack((*self.config).clone()).map(|c| {
                    current.generation += 1;
                    current.client = Some(c.clone());
                    (c, current.generation)
                }),
            }
        };
        let shared = self.current.clone();
        Box::pin(async move {
            let (client, generation) = picked?;
            let mut guard = GiveUpOnDrop { current: shared, generation, armed: true };
            let answer = send(client, req).await;
            guard.armed = answer.is_err();
            answer
        })
    }
}

/// Sends `req` on `stack` (a clone: each request takes its own).
pub(crate) async fn send(mut stack: Stack, req: Request<Body>) -> Result<Response<StackBody>, BoxError> {
    use tower::{Service as _, ServiceExt as _};
    stack.ready().await?.call(req).await
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use http::{Request, Response};
    use hyper::body::{Bytes, Frame};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use kube::client::Body;

    use super::{client, reconnecting_client};

    /// A response body of the test server: empty, or one that never ends (a watch with no events).
    enum Answer {
        Done,
        Open,
    }

    impl hyper::body::Body for Answer {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match *self {
                Answer::Done => Poll::Ready(None),
                Answer::Open => Poll::Pending,
            }
        }
    }

    /// A loopback HTTPS server that speaks HTTP/2 alone (ALPN `h2`) with a CA of its own: `/watch` answers a
    /// body that never ends, `/hang` never answers, any other path an empty body. Returns a client configuration that trusts it and
    /// the count of the connections it accepted.
    async fn h2_server() -> (kube::Config, Arc<AtomicUsize>) {
        let ca_key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let mut ca_params = rcgen::CertificateParams::new(Vec::new()).unwrap_or_else(|e| panic!("CA: {e}"));
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap_or_else(|e| panic!("CA: {e}"));
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("server key: {e}"));
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .and_then(|p| p.signed_by(&key, &ca))
            .unwrap_or_else(|e| panic!("server certificate: {e}"));
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut tls =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .and_then(|b| b.with_no_client_auth().with_single_cert(vec![cert.der().clone()], key))
                .unwrap_or_else(|e| panic!("TLS config: {e}"));
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("listen: {e}"));
        let port = listener.local_addr().unwrap_or_else(|e| panic!("listener: {e}")).port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let answer =
                        hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                            if req.uri().path() == "/hang" {
                                std::future::pending::<()>().await;
                            }
                            let body = if req.uri().path() == "/watch" { Answer::Open } else { Answer::Done };
                            Ok::<_, Infallible>(Response::new(body))
                        });
                    let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), answer)
                        .await;
                    if let Err(e) = served {
                        tracing::debug!("test server: {e}");
                    }
                });
            }
        });
        let url = format!("https://127.0.0.1:{port}").parse().unwrap_or_else(|e| panic!("URL: {e}"));
        let mut config = kube::Config::new(url);
        config.root_cert = Some(vec![ca.der().to_vec()]);
        (config, accepted)
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap_or_else(|e| panic!("request: {e}"))
    }

    #[tokio::test]
    async fn a_connection_with_an_open_watch_serves_the_next_request_however_long_after_the_last() {
        let (config, accepted) = h2_server().await;
        let client = client(config).unwrap_or_else(|e| panic!("client: {e}"));
        // a watch: its answer's headers came, its body stays open
        let watch = client.send(get("/watch")).await.unwrap_or_else(|e| panic!("watch: {e}"));
        let patch = client.send(get("/status")).await.unwrap_or_else(|e| panic!("request: {e}"));
        assert!(patch.status().is_success(), "{}", patch.status());
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the watch and the request share one connection");
        // two minutes without a new request (more than hyper's default idle timeout of its pool, 90 s), while
        // the watch is open (the connection's pings are answered)
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(120)).await;
        tokio::time::resume();
        let patch = client.send(get("/status")).await.unwrap_or_else(|e| panic!("request after 2 min: {e}"));
        assert!(patch.status().is_success(), "{}", patch.status());
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the request two minutes after the last went on the watch's connection, not a new one"
        );
        drop(watch);
    }

    #[tokio::test]
    async fn the_reconnecting_client_opens_a_new_connection_after_a_request_given_up_and_only_then() {
        let (config, accepted) = h2_server().await;
        let client = reconnecting_client(config).unwrap_or_else(|e| panic!("client: {e}"));
        let ok = async |path: &str| {
            let answer = client.send(get(path)).await.unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(answer.status().is_success(), "{path}: {}", answer.status());
        };
        for _ in 0..3 {
            ok("/status").await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "answered requests share one connection");
        // a request given up before its answer (as a renewal past its timeout)
        let given_up = tokio::time::timeout(Duration::from_millis(300), client.send(get("/hang"))).await;
        assert!(given_up.is_err(), "/hang answered");
        ok("/status").await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "the next request went on a new connection");
        ok("/status").await;
        ok("/status").await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "and the new connection stays");
    }
}
