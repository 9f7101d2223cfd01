//! Accepting and serving HTTP connections under limits, for every listener nodelet opens (the main,
//! read-only and healthz ports, and the HTTP manifest source).
//!
//! A node agent's ports face clients that may be slow, idle or hostile. Each listener therefore:
//! - admits at most [`Limits::total`] connections, and at most [`Limits::per_client`] from one client
//!   address;
//! - when a limit is reached, closes the **oldest idle** connection to make room (idle: no request in
//!   flight — still in the TLS handshake, still sending its request headers, or a keep-alive connection
//!   waiting for its next request). A connection that is being served (a request received, its response
//!   still streaming, e.g. a log follow) is never closed for room; when every connection is busy, the new one
//!   is closed instead. So thousands of idle or slowloris connections cannot keep a real client out: each new
//!   connection pushes out the oldest idle one, and a real client turns busy as soon as its headers arrive;
//! - gives a client [`Limits::tls_handshake`] to finish the TLS handshake and [`Limits::header_read`] to send
//!   a request's headers, which is also how long a keep-alive connection may sit idle between requests;
//! - gives a request [`Limits::body_read`] to send its whole body;
//! - closes a connection whose client stops reading: a write that makes no progress for
//!   [`Limits::write_stall`].
//!
//! Upgraded connections (exec, attach, port-forward) leave these limits when hyper hands the socket to the
//! streaming code, which has its own session limit; the write-stall limit stays on their socket.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

use super::auth::{self, ClientCert};
use super::routes::ConnInfo;

/// The limits one listener applies to its connections; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections in total.
    pub total: usize,
    /// Open connections from one client address.
    pub per_client: usize,
    /// Time to finish the TLS handshake.
    pub tls_handshake: Duration,
    /// Time to send a request's headers; also the idle keep-alive limit.
    pub header_read: Duration,
    /// Time to send a request's whole body.
    pub body_read: Duration,
    /// Time a write may make no progress before the connection is closed.
    pub write_stall: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            total: 1024,
            // The API server proxies every `kubectl logs -f`/`exec` from one address: room for many.
            per_client: 256,
            tls_handshake: Duration::from_secs(10),
            // Longer than the idle time HTTP clients keep pooled connections (Go's and reqwest's 90 s): a
            // shorter one closes connections clients are about to reuse, and their requests fail. Idle and
            // slow connections are kept in check by the limits above, not by this time.
            header_read: Duration::from_secs(120),
            body_read: Duration::from_secs(30),
            write_stall: Duration::from_secs(60),
        }
    }
}

/// How often at most a listener logs at warn level that it refused or closed connections.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// One bound listener with what it serves.
pub struct Endpoint {
    /// The listener's name in logs, e.g. `main HTTPS port (--port)`.
    pub name: &'static str,
    /// The bound socket.
    pub listener: TcpListener,
    /// Its local address (port 0 resolved).
    pub addr: SocketAddr,
    /// What it serves.
    pub router: Router,
    /// TLS, for the main port.
    pub tls: Option<TlsAcceptor>,
    /// Its limits.
    pub limits: Limits,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds `addr`.
    pub async fn bind(
        name: &'static str,
        addr: SocketAddr,
        router: Router,
        tls: Option<TlsAcceptor>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        Ok(Self { name, listener, addr, router, tls, limits: Limits::default() })
    }

    /// Serves until `stopping` is cancelled, then waits up to `grace` for open requests and drops the rest.
    /// For a listener served on its own (the HTTP manifest source); the node's ports share one shutdown in
    /// `Servers::run`.
    pub async fn serve_until(self, stopping: CancellationToken, grace: Duration) {
        let graceful = GracefulShutdown::new();
        let force = CancellationToken::new();
        info!(listener = self.name, addr = %self.addr, tls = self.tls.is_some(), "serving");
        self.accept_loop(&stopping, &graceful, &force).await;
        if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
            warn!(?grace, "connections still open after the shutdown grace period; dropping them");
        }
        force.cancel();
    }

    /// Accepts connections until `stopping` is cancelled. Each is served in its own task, registered with
    /// `graceful`, and dropped when `force` is cancelled.
    pub(crate) async fn accept_loop(
        self,
        stopping: &CancellationToken,
        graceful: &GracefulShutdown,
        force: &CancellationToken,
    ) {
        let tracker = Arc::new(Tracker::new(self.name, self.limits));
        loop {
            let accepted = tokio::select! {
                () = stopping.cancelled() => return,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, remote)) => {
                    let Some(admitted) = tracker.admit(remote.ip()) else {
                        continue;
                    };
                    let conn = Connection {
                        listener: self.name,
                        stream,
                        remote,
                        router: self.router.clone(),
                        tls: self.tls.clone(),
                        limits: self.limits,
                        watcher: graceful.watcher(),
                        busy: admitted.busy.clone(),
                    };
                    let force = force.clone();
                    // A bare spawn: per connection, owned by this server.
                    tokio::spawn(async move {
                        tokio::select! {
                            () = conn.serve() => {}
                            () = force.cancelled() => {}
                            () = admitted.evict.cancelled() => {
                                debug!(remote = %admitted.ip, "closed an idle connection to make room");
                            }
                        }
                        drop(admitted);
                    });
                }
                Err(error) => {
                    warn!(listener = self.name, %error, "accept failed");
                    tokio::select! {
                        () = stopping.cancelled() => return,
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                    }
                }
            }
        }
    }
}

/// The open connections of one listener, oldest first, with what each is doing.
struct Tracker {
    name: &'static str,
    limits: Limits,
    state: Mutex<TrackerState>,
}

#[derive(Default)]
struct TrackerState {
    next_id: u64,
    /// By admission order: the first idle entry is the oldest idle connection.
    open: BTreeMap<u64, Slot>,
    per_client: HashMap<IpAddr, usize>,
    /// Connections closed for room or refused since the last warning, and when that was.
    unwarned: u64,
    last_warn: Option<Instant>,
}

struct Slot {
    ip: IpAddr,
    /// Requests in flight on the connection (a response whose body still streams counts).
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

/// An admitted connection; leaves the tracker when dropped.
struct Admitted {
    tracker: Arc<Tracker>,
    id: u64,
    ip: IpAddr,
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

impl Tracker {
    fn new(name: &'static str, limits: Limits) -> Self {
        Self { name, limits, state: Mutex::new(TrackerState::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a connection from `ip`, closing the oldest idle connection (of that client when its own limit
    /// is reached) to make room; `None` when every connection in the way is busy.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let mut state = self.lock();
        let mut made_room = false;
        if state.per_client.get(&ip).copied().unwrap_or(0) >= self.limits.per_client {
            if !state.evict_oldest_idle(Some(ip)) {
                self.warn_refused(&mut state, ip, "its client has too many open connections, all busy");
                return None;
            }
            made_room = true;
        }
        if state.open.len() >= self.limits.total {
            if !state.evict_oldest_idle(None) {
                self.warn_refused(&mut state, ip, "too many open connections, all busy");
                return None;
            }
            made_room = true;
        }
        if made_room {
            self.note_closed(&mut state);
        }
        let id = state.next_id;
        state.next_id += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        state.open.insert(id, Slot { ip, busy: busy.clone(), evict: evict.clone() });
        *state.per_client.entry(ip).or_insert(0) += 1;
        Some(Admitted { tracker: self.clone(), id, ip, busy, evict })
    }

    fn warn_refused(&self, state: &mut TrackerState, ip: IpAddr, why: &str) {
        state.unwarned += 1;
        if state.last_warn.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            warn!(listener = self.name, remote = %ip, closed_or_refused = state.unwarned, "refused a connection: {why}");
            state.unwarned = 0;
            state.last_warn = Some(Instant::now());
        }
    }

    fn note_closed(&self, state: &mut TrackerState) {
        state.unwarned += 1;
        if state.last_warn.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            warn!(
                listener = self.name,
                closed_or_refused = state.unwarned,
                "connection limit reached: closing the oldest idle connections to serve new ones"
            );
            state.unwarned = 0;
            state.last_warn = Some(Instant::now());
        }
    }

    fn leave(&self, id: u64, ip: IpAddr) {
        let mut state = self.lock();
        if state.open.remove(&id).is_some() {
            state.release(ip);
        }
    }
}

impl TrackerState {
    /// Closes the oldest idle connection (of `ip`, if given). False when there is none.
    fn evict_oldest_idle(&mut self, ip: Option<IpAddr>) -> bool {
        let victim = self
            .open
            .iter()
            .find(|(_, slot)| ip.is_none_or(|ip| slot.ip == ip) && slot.busy.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id);
        let Some(slot) = victim.and_then(|id| self.open.remove(&id)) else {
            return false;
        };
        slot.evict.cancel();
        self.release(slot.ip);
        true
    }

    fn release(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_client.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(&ip);
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.tracker.leave(self.id, self.ip);
    }
}

/// One accepted connection.
struct Connection {
    listener: &'static str,
    stream: TcpStream,
    remote: SocketAddr,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    watcher: Watcher,
    busy: Arc<AtomicUsize>,
}

impl Connection {
    async fn serve(self) {
        let Self { listener, stream, remote, router, tls, limits, watcher, busy } = self;
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.write_stall));
        let stream = Box::pin(stream);
        let served = Served { router, limits, watcher, busy, listener, remote };
        match tls {
            None => served.serve(stream, ClientCert::None).await,
            Some(acceptor) => {
                let stream = match tokio::time::timeout(limits.tls_handshake, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        debug!(listener, %remote, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(listener, %remote, "TLS handshake timed out");
                        return;
                    }
                };
                let client_cert = match stream.get_ref().1.peer_certificates().and_then(|c| c.first()) {
                    None => ClientCert::None,
                    Some(leaf) => auth::user_from_certificate(leaf.as_ref()),
                };
                served.serve(stream, client_cert).await;
            }
        }
    }
}

/// What serving HTTP on an accepted (and, for TLS, handshaken) connection needs.
struct Served {
    router: Router,
    limits: Limits,
    watcher: Watcher,
    busy: Arc<AtomicUsize>,
    listener: &'static str,
    remote: SocketAddr,
}

impl Served {
    async fn serve<S>(self, stream: S, client_cert: ClientCert)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Self { router, limits, watcher, busy, listener, remote } = self;
        let info = ConnInfo { remote, client_cert };
        let busy_on_request = busy.clone();
        let service = guard_panics(router, listener, remote)
            .map_request(move |request: hyper::Request<Incoming>| {
                busy_on_request.fetch_add(1, Ordering::AcqRel);
                let (mut parts, body) = request.into_parts();
                parts.extensions.insert(info.clone());
                let body = if body.is_end_stream() {
                    Body::new(body)
                } else {
                    Body::new(DeadlineBody {
                        inner: body,
                        deadline: Box::pin(tokio::time::sleep(limits.body_read)),
                    })
                };
                hyper::Request::from_parts(parts, body)
            })
            .map_response(move |response: axum::response::Response| {
                // The connection is busy until the response body is done (or dropped).
                let guard = BusyGuard(busy.clone());
                response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _busy = &guard;
                        frame
                    }))
                })
            });
        // The auto builder, HTTP/1 only, because its upgradeable connection works with graceful shutdown;
        // upgrades (exec, attach, port-forward) hand the socket over to `streaming`.
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http1_only();
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read);
        let conn =
            builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
        if let Err(error) = watcher.watch(conn).await {
            debug!(listener, %remote, %error, "connection ended with an error");
        }
    }
}

/// `router` with a panic boundary per request: a handler that panics (a bug a request reached) answers
/// `500 Internal Server Error` and the panic is logged with the listener and the client; the connection, the
/// listener and the node keep running. (Without it the connection's task would end, dropping the connection.)
fn guard_panics(
    router: Router,
    listener: &'static str,
    remote: SocketAddr,
) -> impl tower::Service<
    hyper::Request<Body>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |request: hyper::Request<Body>| {
        use futures::FutureExt as _;
        let router = router.clone();
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        async move {
            match std::panic::AssertUnwindSafe(router.oneshot(request)).catch_unwind().await {
                Ok(response) => response,
                Err(payload) => {
                    let panic = nodelet_shared::panic_message(payload.as_ref());
                    tracing::error!(listener, %remote, %method, %path, %panic, "a request handler panicked");
                    let mut response = axum::response::Response::new(Body::from("Internal Server Error\n"));
                    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    Ok(response)
                }
            }
        }
    })
}

/// Marks a connection busy while a response is alive.
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request body that must arrive in full before a deadline.
struct DeadlineBody<B = Incoming> {
    inner: B,
    deadline: Pin<Box<Sleep>>,
}

/// The error a request body that came too slowly ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received in time")]
struct BodyTimedOut;

impl<B> hyper::body::Body for DeadlineBody<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn tracker(total: usize, per_client: usize) -> Arc<Tracker> {
        Arc::new(Tracker::new("test", Limits { total, per_client, ..Limits::default() }))
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
        let t = tracker(3, 10);
        let a = t.admit(ip(1)).expect("room");
        let b = t.admit(ip(1)).expect("room");
        let c = t.admit(ip(2)).expect("room");
        a.busy.fetch_add(1, Ordering::AcqRel);
        // Full: the oldest idle one is b (a is busy).
        let d = t.admit(ip(3)).expect("room made");
        assert!(!a.evict.is_cancelled());
        assert!(b.evict.is_cancelled());
        assert!(!c.evict.is_cancelled());
        assert_eq!(t.lock().open.len(), 3);
        // Dropping an evicted connection does not free a second place.
        drop(b);
        assert_eq!(t.lock().open.len(), 3);
        c.busy.fetch_add(1, Ordering::AcqRel);
        d.busy.fetch_add(1, Ordering::AcqRel);
        assert!(t.admit(ip(4)).is_none(), "all busy: the new connection is refused");
        drop(d);
        assert!(t.admit(ip(4)).is_some(), "a connection that ended frees its place");
    }

    #[test]
    fn one_client_at_its_limit_pushes_out_its_own_idle_connections_only() {
        let t = tracker(100, 2);
        let other = t.admit(ip(9)).expect("room");
        let a = t.admit(ip(1)).expect("room");
        let b = t.admit(ip(1)).expect("room");
        let c = t.admit(ip(1)).expect("room made");
        assert!(a.evict.is_cancelled(), "the client's oldest idle connection goes");
        assert!(!other.evict.is_cancelled(), "another client's connection stays");
        assert!(!b.evict.is_cancelled() && !c.evict.is_cancelled());
        assert_eq!(t.lock().per_client.get(&ip(1)), Some(&2));
        b.busy.fetch_add(1, Ordering::AcqRel);
        c.busy.fetch_add(1, Ordering::AcqRel);
        assert!(t.admit(ip(1)).is_none());
        assert!(t.admit(ip(2)).is_some(), "other clients are still admitted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_ends_with_an_error() {
        let (mut tx, rx) =
            futures::channel::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
        let body = DeadlineBody {
            inner: http_body_util::StreamBody::new(rx),
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(30))),
        };
        let reader = tokio::spawn(body.collect());
        tx.try_send(Ok(Frame::data(Bytes::from_static(b"part")))).expect("room");
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(!reader.is_finished(), "still within the deadline");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let error = reader.await.expect("task").expect_err("past the deadline");
        assert_eq!(error.to_string(), "the request body was not received in time");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_is_passed_through() {
        let (mut tx, rx) =
            futures::channel::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(4);
        let body = DeadlineBody {
            inner: http_body_util::StreamBody::new(rx),
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(30))),
        };
        tx.try_send(Ok(Frame::data(Bytes::from_static(b"whole")))).expect("room");
        drop(tx);
        let collected = body.collect().await.expect("in time").to_bytes();
        assert_eq!(&collected[..], b"whole");
    }

    async fn panics() -> &'static str {
        panic!("a handler bug")
    }

    /// A handler that panics answers 500; the same connection and the listener keep serving.
    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_connection_keeps_serving() {
        let router = Router::new()
            .route("/panic", axum::routing::get(panics))
            .route("/ok", axum::routing::get(|| async { "ok" }));
        let endpoint = Endpoint::bind("test", SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), router, None)
            .await
            .expect("bind");
        let addr = endpoint.addr;
        let stopping = CancellationToken::new();
        let server = tokio::spawn(endpoint.serve_until(stopping.clone(), Duration::from_secs(1)));
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(connection);
        for (path, status, body) in [("/panic", 500, "Internal Server Error\n"), ("/ok", 200, "ok")] {
            let request = hyper::Request::get(path)
                .header("host", "localhost")
                .body(http_body_util::Empty::<Bytes>::new())
                .expect("request");
            let response = sender.send_request(request).await.expect("an answer on the same connection");
            assert_eq!(response.status().as_u16(), status, "{path}");
            let bytes = response.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&bytes[..], body.as_bytes(), "{path}");
        }
        stopping.cancel();
        server.await.expect("the listener ended without a panic");
    }

    #[test]
    fn counts_return_to_zero() {
        let t = tracker(2, 2);
        let all: Vec<_> = (0..10).filter_map(|_| t.admit(ip(1))).collect();
        assert_eq!(all.len(), 10, "idle connections keep making room");
        drop(all);
        let state = t.lock();
        assert!(state.open.is_empty());
        assert!(state.per_client.is_empty());
    }
}
