//! The runtime's container events: the fast path of an evented PLEG.
//!
//! Two sources, chosen by what the runtime serves:
//!
//! * **CRI `GetContainerEvents`** (the kubelet's EventedPLEG source; containerd 1.7 and 2.x, CRI-O), a
//!   server-streaming call of the CRI runtime service: see [`cri`]. Tried first, at every (re)connection.
//! * **containerd's own event service** (`containerd.services.events.v1.Events/Subscribe`), when the runtime
//!   answers `GetContainerEvents` with `UNIMPLEMENTED` and its CRI `Version` says it is containerd (1.6 has
//!   no CRI events): subscribed on the same socket and connection as the CRI client, with the filter
//!   `namespace==k8s.io,topic~="^/tasks/"` or `topic=="/containers/delete"`.
//!
//! A runtime that serves neither (not containerd, no `GetContainerEvents`) gets no event stream: the stream
//! stays silent, and the consumer relists every period; `GetContainerEvents` is asked again every
//! [`EventsConfig::reprobe_interval`] (a runtime can be upgraded under a running node).
//!
//! # Contract for consumers
//!
//! * **Events are not replayed.** Whatever happens while no subscription is active is lost. Each time the
//!   subscription becomes active — the first time and after every reconnect — the stream yields
//!   [`RuntimeEvent::Reconnected`] naming the [`EventSource`]; the consumer must then relist
//!   (ListPodSandbox + ListContainers) to catch up. `Reconnected` is only yielded once the subscription is
//!   known to be registered in the runtime (see below), so a relist started after receiving it cannot miss an
//!   event.
//! * When the subscription breaks, [`RuntimeEvent::Disconnected`] is yielded and the stream reconnects with
//!   exponential backoff (with jitter) until the stream is dropped. A consumer should fall back to
//!   periodic relisting while disconnected, and also before the first `Reconnected` (if the runtime is
//!   unreachable at start, no `Disconnected` is yielded: the stream simply stays silent while it retries).
//! * Events carry IDs from the CRI's point of view: a container's task has the CRI container ID and a
//!   sandbox's pause task has the pod sandbox ID. Events of exec processes (`ExecSync`, probes) are dropped.
//! * With containerd's own events, containerd processes the same exit asynchronously for CRI: right after
//!   [`RuntimeEvent::ContainerExited`], `ContainerStatus` may still say RUNNING for tens of milliseconds. Use
//!   the event's `exit_status`/`exited_at`, or re-query until the status is EXITED. CRI events are sent
//!   after the runtime's CRI status is updated.
//! * The stream never ends on its own while its feed runs; the feed ends when the stream is dropped.
//! * The feed reads the runtime's stream as fast as the consumer takes events (up to
//!   [`EventsConfig::buffer`] queued). A consumer that stops reading stalls the runtime's sender: containerd
//!   2.x's CRI event queue blocks its container operations behind a full subscriber, so read promptly.
//!
//! # Knowing when the subscription is active
//!
//! Neither source sends the response headers of its streaming call before the first event (containerd's
//! `Subscribe` and containerd 2.x's `GetContainerEvents` handler only `Send` events), so the call itself does
//! not complete until something happens.
//!
//! * containerd's events: the feed publishes a small marker event on topic [`SYNC_TOPIC`] (which
//!   its own filter also matches) until it receives one back; any received event proves the same. The
//!   marker is visible to other unfiltered subscribers of the namespace (e.g. `ctr events`); the CRI plugin
//!   ignores it.
//! * CRI events cannot be published by a client. The stream counts as active at its first event, or once a
//!   CRI `Version` call sent on the same HTTP/2 connection after the `GetContainerEvents` request has been
//!   answered and the stream has stayed unanswered for [`EventsConfig::confirm_grace`] (1 s) after that: a
//!   runtime without the method (containerd 1.6) answers `UNIMPLEMENTED` on another goroutine than
//!   `Version`'s, and that answer was seen to come after `Version`'s. The runtime (gRPC-Go) reads a
//!   connection's requests in order and hands each to its own goroutine before it reads the next, so the
//!   stream's handler, which subscribes first thing, was started before `Version`'s. The window left (that
//!   goroutine not yet at its subscription by then) matters only with another subscriber connected:
//!   containerd 2.x keeps the events of a moment without any subscriber for five minutes and gives them to
//!   the next one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

pub mod cri;

/// Why a CRI `Version` call (asked to tell the runtime's name, or to confirm an event stream) failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VersionError {
    /// The runtime answered with an error.
    #[error("Version: {0}")]
    Status(#[from] tonic::Status),
    /// The runtime did not answer within the deadline.
    #[error("Version: no answer within {0:?}")]
    Timeout(Duration),
}

use containerd_client::events as cd_events;
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::{PublishRequest, SubscribeRequest};
use containerd_client::types::Envelope;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prost::{Message, Name};
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// Topic of the marker event used to detect that a subscription is registered.
pub const SYNC_TOPIC: &str = "/nodelet/events/sync";

/// The gRPC metadata key that selects the containerd namespace of a request.
const NAMESPACE_HEADER: &str = "containerd-namespace";

/// Settings of a [`RuntimeEventStream`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventsConfig {
    /// First reconnect delay after the subscription fails.
    pub initial_backoff: Duration,
    /// Upper bound of the reconnect delay (it doubles after each consecutive failure).
    pub max_backoff: Duration,
    /// Delay before the marker event is re-published while the subscription is not yet confirmed (the first
    /// marker goes out at once, and may overtake the subscription); it doubles after each marker, up to
    /// one second.
    pub sync_interval: Duration,
    /// Capacity of the queue between the background task and the consumer. When it is full the task waits
    /// (the runtime buffers meanwhile), so no event is dropped by this crate.
    pub buffer: usize,
    /// How often a runtime that serves no event stream (neither CRI `GetContainerEvents` nor containerd's
    /// event service) is asked for `GetContainerEvents` again.
    pub reprobe_interval: Duration,
    /// How long a CRI event stream that has sent nothing must stay unanswered after the `Version` call
    /// behind it was answered before it counts as active (see the [module docs](self)): a runtime without
    /// `GetContainerEvents` answers `UNIMPLEMENTED` on another goroutine than `Version`'s, sometimes later.
    pub confirm_grace: Duration,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            sync_interval: Duration::from_millis(20),
            buffer: 1024,
            reprobe_interval: Duration::from_secs(300),
            confirm_grace: Duration::from_secs(1),
        }
    }
}

/// Where a [`RuntimeEventStream`]'s events come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventSource {
    /// CRI `GetContainerEvents` ([`cri`]).
    Cri,
    /// containerd's own event service (containerd without CRI events, e.g. 1.6).
    Containerd,
}

impl EventSource {
    /// The source's name in logs and metric labels: `cri` or `containerd`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventSource::Cri => "cri",
            EventSource::Containerd => "containerd",
        }
    }
}

impl std::fmt::Display for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A runtime event, decoded from CRI `ContainerEventResponse`s or containerd's `/tasks/*` events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeEvent {
    /// The subscription is (again) active. Events may have been missed before this point: relist now.
    Reconnected {
        /// Which event stream is active.
        source: EventSource,
    },
    /// The subscription broke; the stream is reconnecting. Relist periodically until
    /// [`RuntimeEvent::Reconnected`].
    Disconnected {
        /// Why the subscription ended.
        reason: String,
    },
    /// A container or sandbox was created (`/tasks/create`: its process exists but has not been started;
    /// CRI `CONTAINER_CREATED_EVENT`).
    ContainerCreated {
        /// CRI container ID (or pod sandbox ID for the sandbox's pause task).
        id: String,
        /// PID of the init process (containerd's events; CRI events do not say).
        pid: Option<u32>,
    },
    /// The container's init process was started (`/tasks/start`, CRI `CONTAINER_STARTED_EVENT`).
    ContainerStarted {
        /// CRI container ID (or pod sandbox ID).
        id: String,
        /// PID of the init process (containerd's events; CRI events do not say).
        pid: Option<u32>,
    },
    /// The container's init process exited (`/tasks/exit`, CRI `CONTAINER_STOPPED_EVENT`).
    ContainerExited {
        /// CRI container ID (or pod sandbox ID).
        id: String,
        /// PID the process had (containerd's events; CRI events do not say).
        pid: Option<u32>,
        /// Exit status: the exit code, or 128 + signal number if killed by a signal (137 = SIGKILL). CRI
        /// events give it for containers (their status's `exit_code`), not for sandboxes.
        exit_status: Option<u32>,
        /// When the process exited, as recorded by the shim (CRI: the container status's `finished_at`).
        exited_at: Option<SystemTime>,
    },
    /// The container's task was deleted (`/tasks/delete`): its resources were released after exit.
    ContainerDeleted {
        /// CRI container ID (or pod sandbox ID).
        id: String,
        /// Exit status of the init process.
        exit_status: u32,
        /// When the process exited.
        exited_at: Option<SystemTime>,
    },
    /// The kernel OOM killer acted in the container's cgroup (`/tasks/oom`; from CRI events: a stopped
    /// container whose status's reason is `OOMKilled`, just before its [`RuntimeEvent::ContainerExited`]).
    /// An exit usually follows.
    ContainerOom {
        /// CRI container ID (or pod sandbox ID).
        id: String,
    },
    /// The container (or sandbox) itself was removed from the runtime (`/containers/delete`, CRI
    /// `CONTAINER_DELETED_EVENT`):
    /// `RemoveContainer`, `RemovePodSandbox`, or anyone else's removal (`crictl rm`).
    ContainerRemoved {
        /// CRI container ID (or pod sandbox ID).
        id: String,
    },
}

impl RuntimeEvent {
    /// The container (or sandbox) ID the event is about; `None` for connection-state events.
    pub fn id(&self) -> Option<&str> {
        match self {
            RuntimeEvent::Reconnected { .. } | RuntimeEvent::Disconnected { .. } => None,
            RuntimeEvent::ContainerCreated { id, .. }
            | RuntimeEvent::ContainerStarted { id, .. }
            | RuntimeEvent::ContainerExited { id, .. }
            | RuntimeEvent::ContainerDeleted { id, .. }
            | RuntimeEvent::ContainerOom { id }
            | RuntimeEvent::ContainerRemoved { id } => Some(id),
        }
    }
}

/// Decodes the payload of an envelope as `T`, checking the type URL's message name.
fn payload<T: Message + Name + Default>(env: &Envelope) -> Option<T> {
    let any = env.event.as_ref()?;
    // containerd sends type URLs without the leading '/' that prost expects ("containerd.events.TaskExit"),
    // so compare the part after the last '/' instead of using Any::to_msg.
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    if name != T::full_name() {
        tracing::warn!(topic = %env.topic, type_url = %any.type_url, expected = %T::full_name(), "unexpected event payload type");
        return None;
    }
    match T::decode(any.value.as_slice()) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(topic = %env.topic, error = %e, "undecodable event payload");
            None
        }
    }
}

fn timestamp(ts: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    ts.and_then(|t| SystemTime::try_from(t).ok())
}

/// True if an exec ID in a task event names the init process (empty, or equal to the container ID).
fn is_init(container_id: &str, exec_id: &str) -> bool {
    exec_id.is_empty() || exec_id == container_id
}

/// Turns one containerd envelope into a [`RuntimeEvent`]; `None` for topics and processes that do not matter
/// to a PLEG (exec processes, pause/resume, checkpoints, the sync marker).
pub fn decode_envelope(env: &Envelope) -> Option<RuntimeEvent> {
    match env.topic.as_str() {
        "/tasks/create" => payload::<cd_events::TaskCreate>(env)
            .map(|e| RuntimeEvent::ContainerCreated { id: e.container_id, pid: Some(e.pid) }),
        "/tasks/start" => payload::<cd_events::TaskStart>(env)
            .map(|e| RuntimeEvent::ContainerStarted { id: e.container_id, pid: Some(e.pid) }),
        "/tasks/exit" => {
            payload::<cd_events::TaskExit>(env).filter(|e| is_init(&e.container_id, &e.id)).map(|e| {
                RuntimeEvent::ContainerExited {
                    id: e.container_id,
                    pid: Some(e.pid),
                    exit_status: Some(e.exit_status),
                    exited_at: timestamp(e.exited_at),
                }
            })
        }
        "/tasks/delete" => payload::<cd_events::TaskDelete>(env)
            .filter(|e| is_init(&e.container_id, &e.id))
            .map(|e| RuntimeEvent::ContainerDeleted {
                id: e.container_id,
                exit_status: e.exit_status,
                exited_at: timestamp(e.exited_at),
            }),
        "/tasks/oom" => {
            payload::<cd_events::TaskOom>(env).map(|e| RuntimeEvent::ContainerOom { id: e.container_id })
        }
        "/containers/delete" => {
            payload::<cd_events::ContainerDelete>(env).map(|e| RuntimeEvent::ContainerRemoved { id: e.id })
        }
        _ => None,
    }
}

/// A stream of [`RuntimeEvent`]s fed by its [`RuntimeEventFeed`], the task that keeps an event subscription
/// (CRI or containerd) alive.
///
/// Create both with [`CriClient::events`](crate::CriClient::events) and spawn the feed. Read the stream with
/// [`recv`](Self::recv) or as a [`futures::Stream`]. Dropping it ends the feed. See the [module docs](self) for
/// the contract.
#[derive(Debug)]
pub struct RuntimeEventStream {
    rx: mpsc::Receiver<RuntimeEvent>,
}

/// The task that feeds a [`RuntimeEventStream`]: it subscribes, reconnects and forwards events until the
/// stream is dropped, then ends. For the caller to spawn (the daemon runs it on its supervisor, on the task
/// that reads the stream); the stream stays silent while the feed does not run.
pub struct RuntimeEventFeed(Pin<Box<dyn Future<Output = ()> + Send + 'static>>);

impl std::fmt::Debug for RuntimeEventFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeEventFeed").finish_non_exhaustive()
    }
}

impl Future for RuntimeEventFeed {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl RuntimeEventStream {
    /// The stream and its feed on `channel` (`runtime`: the CRI runtime service client on it).
    pub(crate) fn new(
        channel: Channel,
        runtime: RuntimeServiceClient<Channel>,
        namespace: &str,
        config: EventsConfig,
    ) -> (Self, RuntimeEventFeed) {
        let (tx, rx) = mpsc::channel(config.buffer.max(1));
        let worker = Worker { channel, runtime, namespace: namespace.to_owned(), config, tx };
        (RuntimeEventStream { rx }, RuntimeEventFeed(Box::pin(worker.run())))
    }

    /// The next event. Returns `None` only once the feed has ended (dropped, or panicked).
    pub async fn recv(&mut self) -> Option<RuntimeEvent> {
        self.rx.recv().await
    }
}

impl futures::Stream for RuntimeEventStream {
    type Item = RuntimeEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RuntimeEvent>> {
        self.rx.poll_recv(cx)
    }
}

/// The Subscribe filters: the namespace's task events, its containers' removals, and the sync marker. Filters in the list are ORed;
/// the comma-separated conditions of one filter are ANDed.
fn subscription_filters(namespace: &str) -> Vec<String> {
    vec![
        format!(r#"namespace=={namespace},topic~="^/tasks/""#),
        format!(r#"namespace=={namespace},topic=="/containers/delete""#),
        format!(r#"namespace=={namespace},topic=="{SYNC_TOPIC}""#),
    ]
}

/// When to publish the next sync marker: at once, then after a delay that doubles up to one second.
struct MarkerSchedule {
    next: tokio::time::Instant,
    delay: Duration,
}

impl MarkerSchedule {
    const MAX_DELAY: Duration = Duration::from_secs(1);

    fn new(initial_delay: Duration) -> Self {
        MarkerSchedule { next: tokio::time::Instant::now(), delay: initial_delay.min(Self::MAX_DELAY) }
    }

    /// Waits until the next marker is due and schedules the one after it.
    async fn wait(&mut self) {
        tokio::time::sleep_until(self.next).await;
        self.next = tokio::time::Instant::now() + self.delay;
        self.delay = self.delay.saturating_mul(2).min(Self::MAX_DELAY);
    }
}

/// Why one subscription attempt ended.
enum Ended {
    /// The consumer dropped the stream: stop.
    Closed,
    /// The subscription failed or ended; `confirmed` tells whether it had become active.
    Failed { reason: String, confirmed: bool },
    /// The runtime does not implement CRI `GetContainerEvents`; `confirmed` tells whether the stream had
    /// been taken for active before the answer came.
    Unimplemented { confirmed: bool },
}

/// Which stream the worker asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// CRI `GetContainerEvents`.
    Cri,
    /// containerd's event service.
    Containerd,
    /// Neither: ask for CRI events again after [`EventsConfig::reprobe_interval`].
    None,
}

struct Worker {
    channel: Channel,
    runtime: RuntimeServiceClient<Channel>,
    namespace: String,
    config: EventsConfig,
    tx: mpsc::Sender<RuntimeEvent>,
}

impl Worker {
    async fn run(self) {
        let mut backoff = self.config.initial_backoff;
        let mut failures: u32 = 0;
        let mut mode = Mode::Cri;
        // The fallback last chosen, logged when it changes.
        let mut fallback_logged: Option<Mode> = None;
        loop {
            let ended = match mode {
                Mode::Cri => self.cri_once().await,
                Mode::Containerd => self.subscribe_once().await,
                Mode::None => {
                    tokio::select! {
                        _ = self.tx.closed() => return,
                        _ = tokio::time::sleep(self.config.reprobe_interval) => {}
                    }
                    mode = Mode::Cri;
                    continue;
                }
            };
            // After containerd's events fail, CRI events are asked for first again: the runtime may have been
            // upgraded while it was down.
            let attempted = mode;
            if attempted == Mode::Containerd {
                mode = Mode::Cri;
            }
            match ended {
                Ended::Closed => return,
                Ended::Unimplemented { confirmed } => {
                    if confirmed {
                        let reason = "GetContainerEvents: unimplemented".to_owned();
                        if self.tx.send(RuntimeEvent::Disconnected { reason }).await.is_err() {
                            return;
                        }
                    }
                    match self.runtime_is_containerd().await {
                        Ok(true) => mode = Mode::Containerd,
                        Ok(false) => mode = Mode::None,
                        Err(reason) => {
                            // The runtime went away between the two calls: start over.
                            tracing::debug!(%reason, "CRI Version failed after GetContainerEvents was unimplemented");
                        }
                    }
                    if mode != Mode::Cri {
                        if fallback_logged != Some(mode) {
                            fallback_logged = Some(mode);
                            if mode == Mode::Containerd {
                                tracing::info!(
                                    "the runtime does not implement CRI GetContainerEvents: using containerd's event service"
                                );
                            } else {
                                tracing::warn!(
                                    every = ?self.config.reprobe_interval,
                                    "the runtime implements neither CRI GetContainerEvents nor containerd's event \
                                     service: the PLEG relists every period; asking again periodically"
                                );
                            }
                        }
                        continue;
                    }
                }
                Ended::Failed { reason, confirmed } => {
                    if confirmed {
                        // The subscription had been active: start the backoff sequence afresh and tell the
                        // consumer it is blind until the next Reconnected.
                        backoff = self.config.initial_backoff;
                        failures = 0;
                    }
                    failures = failures.saturating_add(1);
                    let source = if attempted == Mode::Containerd { "containerd" } else { "CRI" };
                    if failures == 1 {
                        tracing::warn!(%reason, "{source} event subscription failed; reconnecting");
                    } else {
                        tracing::debug!(%reason, failures, "{source} event subscription still failing");
                    }
                    if confirmed && self.tx.send(RuntimeEvent::Disconnected { reason }).await.is_err() {
                        return;
                    }
                }
            }
            // Jitter in [backoff/2, backoff] spreads reconnects of many subscribers after a runtime restart.
            let half = backoff / 2;
            let delay = half + half.mul_f64(fastrand::f64());
            tokio::select! {
                _ = self.tx.closed() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            backoff = backoff.saturating_mul(2).min(self.config.max_backoff);
        }
    }

    /// Whether the runtime is containerd (CRI `Version`'s `runtime_name`), whose own event service can stand
    /// in for CRI events.
    async fn runtime_is_containerd(&self) -> Result<bool, VersionError> {
        let mut client = self.runtime.clone();
        let request = k8s_cri::v1::VersionRequest { version: crate::client::CRI_CLIENT_VERSION.to_owned() };
        match tokio::time::timeout(Duration::from_secs(10), client.version(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner().runtime_name == "containerd"),
            Ok(Err(status)) => Err(VersionError::Status(status)),
            Err(_) => Err(VersionError::Timeout(Duration::from_secs(10))),
        }
    }

    /// One subscription attempt: subscribe, confirm with marker events, forward events until failure.
    async fn subscribe_once(&self) -> Ended {
        let mut client = EventsClient::new(self.channel.clone());
        let request = SubscribeRequest { filters: subscription_filters(&self.namespace) };
        let subscribe = client.subscribe(request);
        tokio::pin!(subscribe);

        let mut probe = MarkerSchedule::new(self.config.sync_interval);
        let mut probing = true;

        // Phase 1: wait for the response headers, which containerd sends with the first event.
        let mut stream = loop {
            tokio::select! {
                _ = self.tx.closed() => return Ended::Closed,
                result = &mut subscribe => match result {
                    Ok(response) => break response.into_inner(),
                    Err(status) => {
                        return Ended::Failed { reason: format!("Subscribe: {status}"), confirmed: false };
                    }
                },
                _ = probe.wait(), if probing => probing = self.publish_marker().await,
            }
        };

        // Phase 2: the first received event (marker or real) confirms the subscription.
        let mut confirmed = false;
        loop {
            tokio::select! {
                _ = self.tx.closed() => return Ended::Closed,
                _ = probe.wait(), if probing && !confirmed => probing = self.publish_marker().await,
                message = stream.message() => match message {
                    Ok(Some(envelope)) => {
                        if !confirmed {
                            confirmed = true;
                            tracing::info!(namespace = %self.namespace, "containerd event subscription active");
                            let active = RuntimeEvent::Reconnected { source: EventSource::Containerd };
                            if self.tx.send(active).await.is_err() {
                                return Ended::Closed;
                            }
                        }
                        if envelope.topic == SYNC_TOPIC {
                            continue;
                        }
                        match decode_envelope(&envelope) {
                            Some(event) => {
                                tracing::trace!(?event, "runtime event");
                                if self.tx.send(event).await.is_err() {
                                    return Ended::Closed;
                                }
                            }
                            None => tracing::trace!(topic = %envelope.topic, "ignored containerd event"),
                        }
                    }
                    Ok(None) => return Ended::Failed { reason: "event stream ended".into(), confirmed },
                    Err(status) => return Ended::Failed { reason: format!("event stream: {status}"), confirmed },
                },
            }
        }
    }

    /// Publishes the marker event. Returns whether to keep probing (false after a non-transient error, in which
    /// case the subscription is confirmed by the first real event instead).
    async fn publish_marker(&self) -> bool {
        let mut client = EventsClient::new(self.channel.clone());
        let event = prost_types::Any {
            type_url: "types.googleapis.com/google.protobuf.Empty".into(),
            value: Vec::new(),
        };
        let mut request =
            tonic::Request::new(PublishRequest { topic: SYNC_TOPIC.into(), event: Some(event) });
        let namespace = match MetadataValue::try_from(self.namespace.as_str()) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(namespace = %self.namespace, error = %e, "namespace not usable as gRPC metadata; not probing");
                return false;
            }
        };
        request.metadata_mut().insert(NAMESPACE_HEADER, namespace);
        match tokio::time::timeout(Duration::from_secs(1), client.publish(request)).await {
            Ok(Ok(_)) => true,
            Ok(Err(status))
                if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) =>
            {
                true
            }
            Ok(Err(status)) => {
                tracing::warn!(%status, "cannot publish the events sync marker; waiting for a real event instead");
                false
            }
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope<T: Message + Name>(topic: &str, msg: &T) -> Envelope {
        Envelope {
            timestamp: None,
            namespace: "k8s.io".into(),
            topic: topic.into(),
            event: Some(prost_types::Any { type_url: T::full_name(), value: msg.encode_to_vec() }),
        }
    }

    #[test]
    fn decodes_task_events() {
        let exited_at = prost_types::Timestamp { seconds: 1_700_000_000, nanos: 5 };
        let exit = cd_events::TaskExit {
            container_id: "c1".into(),
            id: "c1".into(),
            pid: 42,
            exit_status: 137,
            exited_at: Some(exited_at),
        };
        let expected_time = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(
            decode_envelope(&envelope("/tasks/exit", &exit)),
            Some(RuntimeEvent::ContainerExited {
                id: "c1".into(),
                pid: Some(42),
                exit_status: Some(137),
                exited_at: Some(expected_time)
            })
        );
        // Exec process exits are not container exits.
        let exec_exit = cd_events::TaskExit { id: "exec-1".into(), ..exit.clone() };
        assert_eq!(decode_envelope(&envelope("/tasks/exit", &exec_exit)), None);

        let start = cd_events::TaskStart { container_id: "c2".into(), pid: 7 };
        assert_eq!(
            decode_envelope(&envelope("/tasks/start", &start)),
            Some(RuntimeEvent::ContainerStarted { id: "c2".into(), pid: Some(7) })
        );
        let create = cd_events::TaskCreate { container_id: "c3".into(), pid: 8, ..Default::default() };
        assert_eq!(
            decode_envelope(&envelope("/tasks/create", &create)),
            Some(RuntimeEvent::ContainerCreated { id: "c3".into(), pid: Some(8) })
        );
        let delete =
            cd_events::TaskDelete { container_id: "c4".into(), exit_status: 3, ..Default::default() };
        let decoded = decode_envelope(&envelope("/tasks/delete", &delete));
        assert_eq!(
            decoded,
            Some(RuntimeEvent::ContainerDeleted { id: "c4".into(), exit_status: 3, exited_at: None })
        );
        assert_eq!(decoded.as_ref().and_then(RuntimeEvent::id), Some("c4"));
        let oom = cd_events::TaskOom { container_id: "c5".into() };
        assert_eq!(
            decode_envelope(&envelope("/tasks/oom", &oom)),
            Some(RuntimeEvent::ContainerOom { id: "c5".into() })
        );
        let removed = cd_events::ContainerDelete { id: "c6".into() };
        let decoded = decode_envelope(&envelope("/containers/delete", &removed));
        assert_eq!(decoded, Some(RuntimeEvent::ContainerRemoved { id: "c6".into() }));
        assert_eq!(decoded.as_ref().and_then(RuntimeEvent::id), Some("c6"));
        let created = cd_events::ContainerCreate { id: "c7".into(), ..Default::default() };
        assert_eq!(decode_envelope(&envelope("/containers/create", &created)), None);
    }

    #[test]
    fn ignores_other_topics_and_garbage() {
        let paused = cd_events::TaskPaused { container_id: "c".into() };
        assert_eq!(decode_envelope(&envelope("/tasks/paused", &paused)), None);
        // Wrong payload type for the topic.
        assert_eq!(decode_envelope(&envelope("/tasks/exit", &paused)), None);
        // Undecodable bytes.
        let mut env = envelope("/tasks/start", &cd_events::TaskStart::default());
        if let Some(any) = env.event.as_mut() {
            any.value = vec![0xff, 0xff, 0xff];
        }
        assert_eq!(decode_envelope(&env), None);
        // No payload at all.
        env.event = None;
        assert_eq!(decode_envelope(&env), None);
        // A leading-slash type URL (prost style) is accepted too.
        let mut env = envelope("/tasks/oom", &cd_events::TaskOom { container_id: "x".into() });
        if let Some(any) = env.event.as_mut() {
            any.type_url = "/containerd.events.TaskOOM".into();
        }
        assert_eq!(decode_envelope(&env), Some(RuntimeEvent::ContainerOom { id: "x".into() }));
    }

    #[tokio::test(start_paused = true)]
    async fn marker_schedule_backs_off() {
        let start = tokio::time::Instant::now();
        let mut schedule = MarkerSchedule::new(Duration::from_millis(20));
        let mut at = Vec::new();
        for _ in 0..9 {
            schedule.wait().await;
            at.push(start.elapsed().as_millis());
        }
        assert_eq!(at, vec![0, 20, 60, 140, 300, 620, 1260, 2260, 3260]);
    }

    #[test]
    fn filters_match_the_namespace() {
        assert_eq!(
            subscription_filters("k8s.io"),
            vec![
                r#"namespace==k8s.io,topic~="^/tasks/""#.to_owned(),
                r#"namespace==k8s.io,topic=="/containers/delete""#.to_owned(),
                r#"namespace==k8s.io,topic=="/nodelet/events/sync""#.to_owned()
            ]
        );
    }
}
