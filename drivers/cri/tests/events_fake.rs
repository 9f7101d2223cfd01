//! The choice of event source and the CRI event stream's connection states, against a fake CRI runtime
//! service (tonic, on a unix socket in a temporary directory): `GetContainerEvents` answered UNIMPLEMENTED
//! (containerd 1.6, or a runtime without events), and a stream that breaks mid-way.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use nodelet_cri::proto::{
    ContainerEventResponse, ContainerEventType, ContainerState, ContainerStatus, GetEventsRequest,
    VersionRequest, VersionResponse,
};
use nodelet_cri::{CriClient, CriConfig, EventSource, EventsConfig, RuntimeEvent, RuntimeEventStream};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};
use tonic::codegen::http;
use tonic::{Request, Response, Status};

type EventItem = Result<ContainerEventResponse, Status>;
type BoxStream = Pin<Box<dyn Stream<Item = EventItem> + Send>>;

/// What the fake runtime answers and what it was asked.
#[derive(Default)]
struct State {
    /// `runtime_name` of `Version`.
    runtime_name: String,
    /// One per `GetContainerEvents` call, in order: the stream to answer with. When none is left, the call is
    /// answered UNIMPLEMENTED.
    streams: VecDeque<mpsc::Receiver<EventItem>>,
    /// The gRPC paths called, in order.
    calls: Vec<String>,
    /// How long an UNIMPLEMENTED answer to `GetContainerEvents` waits (containerd 1.6 answers it on another
    /// goroutine than `Version`'s, sometimes after `Version`).
    unimplemented_delay: Duration,
}

#[derive(Clone)]
struct Fake(Arc<Mutex<State>>);

impl Fake {
    fn new(runtime_name: &str) -> Self {
        Fake(Arc::new(Mutex::new(State { runtime_name: runtime_name.into(), ..State::default() })))
    }

    /// Queues the stream of the next `GetContainerEvents` call; the test sends its events.
    fn next_stream(&self) -> mpsc::Sender<EventItem> {
        let (tx, rx) = mpsc::channel(16);
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).streams.push_back(rx);
        tx
    }

    fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).calls.clone()
    }

    fn count(&self, method: &str) -> usize {
        self.calls().iter().filter(|c| c.ends_with(method)).count()
    }
}

impl tonic::server::NamedService for Fake {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl tower::Service<http::Request<tonic::body::Body>> for Fake {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let state = self.0.clone();
        state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).calls.push(path.clone());
        Box::pin(async move {
            match path.rsplit('/').next().unwrap_or_default() {
                "Version" => {
                    let name =
                        state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).runtime_name.clone();
                    let svc = tower::service_fn(move |_: Request<VersionRequest>| {
                        let runtime_name = name.clone();
                        async move {
                            Ok::<_, Status>(Response::new(VersionResponse {
                                runtime_name,
                                runtime_version: "0.0.1".into(),
                                ..VersionResponse::default()
                            }))
                        }
                    });
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                        VersionResponse,
                        VersionRequest,
                    >::default());
                    Ok(grpc.unary(svc, req).await)
                }
                "GetContainerEvents" => {
                    let next =
                        state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).streams.pop_front();
                    let Some(rx) = next else {
                        let delay = state
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .unimplemented_delay;
                        sleep(delay).await;
                        return Ok(Status::unimplemented("unknown method GetContainerEvents").into_http());
                    };
                    let rx = Arc::new(Mutex::new(Some(rx)));
                    let svc = tower::service_fn(move |_: Request<GetEventsRequest>| {
                        let rx = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                        async move {
                            let rx = rx.ok_or_else(|| Status::internal("stream already taken"))?;
                            let stream: BoxStream =
                                Box::pin(futures::stream::unfold(rx, |mut rx| async move {
                                    rx.recv().await.map(|item| (item, rx))
                                }));
                            Ok::<_, Status>(Response::new(stream))
                        }
                    });
                    let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                        ContainerEventResponse,
                        GetEventsRequest,
                    >::default());
                    Ok(grpc.server_streaming(svc, req).await)
                }
                _ => Ok(Status::unimplemented(format!("unknown method {path}")).into_http()),
            }
        })
    }
}

/// The fake under containerd's event service name, so its calls are recorded too (and answered UNIMPLEMENTED).
#[derive(Clone)]
struct FakeEvents(Fake);

impl tonic::server::NamedService for FakeEvents {
    const NAME: &'static str = "containerd.services.events.v1.Events";
}

impl tower::Service<http::Request<tonic::body::Body>> for FakeEvents {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.0.call(req)
    }
}

/// Serves `fake` on a new socket in `dir`; returns its path.
fn serve(dir: &Path, fake: Fake) -> PathBuf {
    let path = dir.join("cri.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let incoming =
        futures::stream::unfold(listener, |l| async move { Some((l.accept().await.map(|(s, _)| s), l)) });
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(FakeEvents(fake.clone()))
            .add_service(fake)
            .serve_with_incoming(incoming)
            .await;
    });
    path
}

async fn client(path: &Path) -> CriClient {
    CriClient::connect(CriConfig::new(format!("unix://{}", path.display())))
        .await
        .expect("connect to the fake")
}

fn quick() -> EventsConfig {
    let mut config = EventsConfig::default();
    config.initial_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(100);
    config.reprobe_interval = Duration::from_millis(300);
    config.confirm_grace = Duration::from_millis(200);
    config
}

/// The next event within `within`, or `None`.
async fn next(events: &mut RuntimeEventStream, within: Duration) -> Option<RuntimeEvent> {
    timeout(within, events.recv()).await.ok().flatten()
}

fn stopped(id: &str, exit_code: i32) -> ContainerEventResponse {
    ContainerEventResponse {
        container_id: id.into(),
        container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
        created_at: 1,
        pod_sandbox_status: None,
        containers_statuses: vec![ContainerStatus {
            id: id.into(),
            state: ContainerState::ContainerExited as i32,
            exit_code,
            finished_at: 1_700_000_000_000_000_000,
            ..ContainerStatus::default()
        }],
    }
}

fn started(id: &str) -> ContainerEventResponse {
    ContainerEventResponse {
        container_id: id.into(),
        container_event_type: ContainerEventType::ContainerStartedEvent as i32,
        ..ContainerEventResponse::default()
    }
}

/// A runtime that is not containerd and has no `GetContainerEvents`: no stream, no containerd subscription,
/// and `GetContainerEvents` asked again every reprobe interval.
#[tokio::test]
async fn unimplemented_on_another_runtime_means_relisting_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Fake::new("cri-o");
    let cri = client(&serve(dir.path(), fake.clone())).await;
    let (mut events, feed) = cri.events(quick());
    tokio::spawn(feed);
    assert_eq!(next(&mut events, Duration::from_millis(1000)).await, None, "no event stream to report");
    let calls = fake.calls();
    assert!(fake.count("/GetContainerEvents") >= 2, "asked again after the reprobe interval: {calls:?}");
    assert!(fake.count("/Version") >= 1, "asked which runtime it is: {calls:?}");
    assert!(
        !calls.iter().any(|c| c.contains("containerd")),
        "no containerd call to a non-containerd runtime: {calls:?}"
    );
}

/// A runtime whose UNIMPLEMENTED comes after its answer to the `Version` call behind it (as containerd 1.6's
/// did once): the stream is not taken for active in between.
#[tokio::test]
async fn a_late_unimplemented_is_not_taken_for_an_active_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Fake::new("cri-o");
    fake.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unimplemented_delay =
        Duration::from_millis(150);
    let cri = client(&serve(dir.path(), fake.clone())).await;
    let mut config = quick();
    config.confirm_grace = Duration::from_millis(600);
    let (mut events, feed) = cri.events(config);
    tokio::spawn(feed);
    assert_eq!(next(&mut events, Duration::from_millis(1000)).await, None, "{:?}", fake.calls());
    assert!(fake.count("/Version") >= 1, "{:?}", fake.calls());
}

/// containerd without CRI events (1.6): its own event service is subscribed to instead.
#[tokio::test]
async fn unimplemented_on_containerd_falls_back_to_its_event_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Fake::new("containerd");
    let cri = client(&serve(dir.path(), fake.clone())).await;
    let (mut events, feed) = cri.events(quick());
    tokio::spawn(feed);
    // The fake serves no containerd event service: the subscription keeps failing before it is active, so
    // nothing is yielded, but it was asked for.
    assert_eq!(next(&mut events, Duration::from_millis(500)).await, None);
    let calls = fake.calls();
    let first_events = calls.iter().position(|c| c.ends_with("/GetContainerEvents"));
    let first_subscribe = calls.iter().position(|c| c == "/containerd.services.events.v1.Events/Subscribe");
    assert!(first_events.is_some() && first_subscribe.is_some(), "{calls:?}");
    assert!(first_events < first_subscribe, "CRI events asked for first: {calls:?}");
}

/// A CRI stream that breaks mid-way: the events before the break, `Disconnected`, and `Reconnected` again on a
/// new stream that has sent nothing yet (confirmed by the `Version` call behind it), then its events.
#[tokio::test]
async fn a_broken_cri_stream_is_reported_and_resumed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = Fake::new("containerd");
    let first = fake.next_stream();
    let second = fake.next_stream();
    let cri = client(&serve(dir.path(), fake.clone())).await;
    let (mut events, feed) = cri.events(quick());
    tokio::spawn(feed);

    let wait = Duration::from_secs(5);
    // Active before any event: the Version call queued behind the stream's request was answered.
    assert_eq!(next(&mut events, wait).await, Some(RuntimeEvent::Reconnected { source: EventSource::Cri }));
    first.send(Ok(started("c1"))).await.expect("send");
    first.send(Ok(stopped("c1", 3))).await.expect("send");
    assert_eq!(
        next(&mut events, wait).await,
        Some(RuntimeEvent::ContainerStarted { id: "c1".into(), pid: None })
    );
    match next(&mut events, wait).await {
        Some(RuntimeEvent::ContainerExited { id, exit_status: Some(3), exited_at: Some(_), .. })
            if id == "c1" => {}
        other => panic!("expected c1's exit with status 3, got {other:?}"),
    }

    // The runtime breaks the stream.
    first.send(Err(Status::unavailable("runtime restarting"))).await.expect("send");
    match next(&mut events, wait).await {
        Some(RuntimeEvent::Disconnected { reason }) => {
            assert!(reason.contains("runtime restarting"), "{reason}")
        }
        other => panic!("expected Disconnected, got {other:?}"),
    }
    let reconnecting = Instant::now();
    assert_eq!(next(&mut events, wait).await, Some(RuntimeEvent::Reconnected { source: EventSource::Cri }));
    assert!(reconnecting.elapsed() < Duration::from_secs(3), "resumed after {:?}", reconnecting.elapsed());
    second.send(Ok(stopped("c2", 0))).await.expect("send");
    match next(&mut events, wait).await {
        Some(RuntimeEvent::ContainerExited { id, exit_status: Some(0), .. }) if id == "c2" => {}
        other => panic!("expected c2's exit, got {other:?}"),
    }
    assert_eq!(fake.count("/GetContainerEvents"), 2, "{:?}", fake.calls());

    // A stream that ends (the runtime's handler returned) is a break too; the third call is UNIMPLEMENTED
    // (say, a downgrade): the fallback to containerd's events is asked for, never yielding Reconnected.
    drop(second);
    assert!(matches!(next(&mut events, wait).await, Some(RuntimeEvent::Disconnected { .. })));
    let deadline = Instant::now() + wait;
    while fake.count("/containerd.services.events.v1.Events/Subscribe") == 0 {
        assert!(Instant::now() < deadline, "no fallback to containerd's events: {:?}", fake.calls());
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(next(&mut events, Duration::from_millis(300)).await, None);
}
