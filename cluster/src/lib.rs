//! Cluster mode: nodelet as a node of a Kubernetes cluster (`--kubeconfig`).
//!
//! ```text
//!                     ┌─▶ pods::ApiPods ──▶ PodConfig source "api" ─▶ desired store ─▶ pod engine
//! API server ─watch──▶│   (pods with spec.nodeName = this node; mirror pods filtered out)
//!                     └─▶ snapshot of this node's API pods ─┬─▶ mirror::MirrorPods (create, recreate, delete)
//!                                                           └─▶ status::StatusManager (patch pods/status,
//!                                                               final delete of terminated pods)
//! node view (stores) ──▶ node::NodeSync (register the Node, patch its status, renew the Lease)
//!                    ──▶ events::EventSink (post the node's events, aggregated and rate limited)
//! ```
//!
//! Every API call but the heartbeats goes through one [`kube::Client`] with the kubelet's client-side rate
//! limit (`kubeAPIQPS`, `kubeAPIBurst`; see `ratelimit`), which forwards each request to the client of the
//! current client certificate (`certificates`: TLS bootstrap, rotation, the serving certificate), whose
//! requests share one HTTP/2 connection (`transport`). The Node status patches go over that connection
//! without the rate limit; the Lease renewals, also unthrottled, have a connection of their own and run on
//! the heartbeat lane, a thread of their own ([`lane`]). With TLS bootstrap the tasks below start once the
//! certificate is issued. None of these tasks ever stops or restarts a
//! pod because the API server is unreachable: each retries with back-off and catches up when the API
//! server is back, and the pod source keeps its last complete list meanwhile.
//!
//! This crate (`nodelet-cluster`) imports the servers (`nodelet-server`: the node view it reads, the serving
//! certificate it renews), the pod sources (`nodelet-sources`: the API pods are one more source of the
//! `PodConfig`), the configuration, the drivers and the pairs' model; never the daemon, which starts its tasks.

pub(crate) mod certificates;
pub mod csinode;
pub(crate) mod events;
pub mod lane;
pub(crate) mod mirror;
pub(crate) mod node;
pub mod podobjects;
pub(crate) mod pods;
pub(crate) mod ratelimit;
pub mod runtimeclasses;
pub mod services;
pub(crate) mod status;
pub(crate) mod transport;

#[cfg(test)]
mod test_support {
    /// An API server's answer with status `code` and the JSON `body`, for the fake API servers of the
    /// unit tests (`tower::service_fn` under a `kube::Client`).
    pub(crate) fn json_response(
        code: u16,
        body: &str,
    ) -> Result<http::Response<kube::client::Body>, std::convert::Infallible> {
        let response = http::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body.as_bytes().to_vec()))
            .expect("response");
        Ok(response)
    }
}

use std::time::Duration;

use kube::Client;

pub use certificates::{CertError, CertMetrics};
pub use lane::HeartbeatLane;
use nodelet_resources::common::task::Lifetime::Bounded;
use nodelet_resources::common::task::NamedTask;
pub use pods::fingerprint;
// The crates below this one, by the names the modules use (`crate::server`, …).
use nodelet_config as config;
use nodelet_server as server;
use nodelet_shared::yaml;
use nodelet_sources as sources;

/// Errors of cluster mode's set-up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The client certificate could not be set up.
    #[error(transparent)]
    Certificates(#[from] certificates::CertError),
    /// The API pod source could not be added to the pod config.
    #[error(transparent)]
    Source(#[from] crate::sources::PodConfigError),
}

/// The user agent nodelet sends to the API server.
pub(crate) fn user_agent(node: &str) -> String {
    format!("nodelet/v{} ({node})", env!("CARGO_PKG_VERSION"))
}

/// The shortest server-side timeout a watch asks for: client-go's reflectors' `minWatchTimeout`.
pub(crate) const WATCH_TIMEOUT_MIN_SECS: u32 = 300;

/// The configuration of a watch: its server-side timeout (`timeoutSeconds`) is random in [5 min, 10 min),
/// as client-go's reflectors ask for, so that a node's watches, and those of nodes started together, end
/// and are re-opened at different times instead of all at once every 290 s (kube-rs' fixed default).
/// kube-rs' watcher keeps the timeout a watch was made with for its re-opens, so each watch has its own
/// period in that range rather than a fresh draw per re-open.
pub(crate) fn watch_config() -> kube::runtime::watcher::Config {
    watch_config_with(fastrand::f64())
}

/// [`watch_config`] with the random draw `r` in [0, 1) given.
pub(crate) fn watch_config_with(r: f64) -> kube::runtime::watcher::Config {
    let min = f64::from(WATCH_TIMEOUT_MIN_SECS);
    // r < 1 keeps it below 2 × min; the `min` guards the float edge.
    let secs = (min * (1.0 + r.clamp(0.0, 1.0))).floor().min(2.0 * min - 1.0);
    // In range by the clamps above (300 ..= 599): the cast neither truncates nor saturates.
    kube::runtime::watcher::Config::default().timeout(secs as u32)
}

/// The timeouts and user agent of every client of cluster mode.
pub(crate) fn tune(config: &mut kube::Config, node: &str) {
    // A connection nothing is read from is cut off (over HTTP/2 its pings are read every 30 s, see
    // `transport`, so only a dead peer); a watch ends by its own server-side timeout (at most 2 ×
    // WATCH_TIMEOUT_MIN_SECS), well before its connection's read timeout.
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(u64::from(2 * WATCH_TIMEOUT_MIN_SECS) + 40));
    config.write_timeout = Some(Duration::from_secs(30));
    config.headers.push((
        http_header_name("user-agent"),
        user_agent(node).parse().unwrap_or_else(|_| "nodelet".parse().expect("static header value")),
    ));
}

fn http_header_name(name: &'static str) -> http::HeaderName {
    http::HeaderName::from_static(name)
}

/// Exponential back-off for the API tasks: 200 ms doubling to 30 s, with jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Backoff::INITIAL }
    }
}

impl Backoff {
    const INITIAL: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(30);

    /// The delay before the next attempt (and doubles the one after).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(Backoff::MAX);
        let jitter = base.mul_f64(fastrand::f64() * 0.2);
        base + jitter
    }

    /// Back to the initial delay after a success.
    pub(crate) fn reset(&mut self) {
        self.next = Backoff::INITIAL;
    }
}

/// Whether `e` is the API server's answer with this HTTP status code.
pub(crate) fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Cluster mode's first half, set up with the pod sources: the client, its certificate manager and the
/// API pod source.
pub struct Cluster {
    client: Client,
    /// The unthrottled client of the Node status (see `certificates::ClientCerts`).
    heartbeat: Client,
    /// The Lease's client, over a connection of its own on `lane`.
    lease: Client,
    /// Where the Lease renewals run.
    lane: HeartbeatLane,
    pod_data: podobjects::PodData,
    /// The current inner client; the tasks start once it is there (after TLS bootstrap).
    current: certificates::CurrentClient,
    snapshot: tokio::sync::watch::Receiver<std::sync::Arc<pods::ApiPodSnapshot>>,
    serving: Option<certificates::ServingCerts>,
    runtime_classes: runtimeclasses::ApiRuntimeClasses,
    runtime_class_feed: runtimeclasses::RuntimeClassFeed,
    services: services::ApiServices,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

/// Runs `task` once the node has client credentials (at once, or after TLS bootstrap); never on shutdown.
///
/// `task` is boxed first: a future an `async` block captures and then awaits takes its size twice in
/// that block's state (the captured value and the awaited one are laid out apart).
fn when_ready(
    mut current: certificates::CurrentClient,
    shutdown: tokio_util::sync::CancellationToken,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let task = Box::pin(task);
    async move {
        let ready = tokio::select! {
            () = shutdown.cancelled() => false,
            ready = current.wait_for(Option::is_some) => ready.is_ok(),
        };
        if ready {
            task.await;
        }
    }
}

impl Cluster {
    /// The API client (rate limited), for the main port's TokenReviews and SubjectAccessReviews.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Sets up the client of `cluster` (TLS bootstrap in the background when needed, certificate
    /// rotation; see `certificates`) and adds the API pod source ("api") to `pod_config`; returns it with
    /// its tasks for the daemon to spawn, in order: `client-certificate` and `source-api` (each may end, both
    /// end at `shutdown`). The certificate manager records into `metrics`; the Lease renewals and their
    /// connection run on `lane`.
    pub async fn connect(
        node_name: &str,
        cluster: &crate::config::ClusterConfig,
        pod_config: &crate::sources::PodConfig,
        metrics: CertMetrics,
        lane: HeartbeatLane,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<(Self, Vec<NamedTask>), ClusterError> {
        let layer = ratelimit::RateLimitLayer::new(cluster.kube_api_qps, cluster.kube_api_burst);
        let (certs, cert_task) = certificates::start_client(
            node_name,
            &certificates::ClientCertConfig {
                kubeconfig: cluster.kubeconfig.clone(),
                bootstrap_kubeconfig: cluster.bootstrap_kubeconfig.clone(),
                rotate: cluster.rotate_certificates,
                cert_dir: cluster.cert_dir.clone(),
            },
            &layer,
            &metrics,
            &lane,
            shutdown,
        )
        .await?;
        tracing::info!(kubeconfig = %cluster.kubeconfig.display(), "cluster mode: pods come from the API server too");
        let source = pods::ApiPods::new(certs.client.clone(), pod_config.add_source("api")?);
        let snapshot = source.snapshot();
        let tasks = vec![
            cert_task,
            NamedTask::new(
                "source-api",
                Bounded,
                when_ready(certs.current.clone(), shutdown.clone(), source.run(shutdown.clone())),
            ),
        ];
        let serving = cluster
            .server_tls_bootstrap
            .then(|| certificates::ServingCerts::new(&cluster.cert_dir, &metrics));
        let (runtime_classes, runtime_class_feed) = runtimeclasses::runtime_classes();
        Ok((
            Self {
                runtime_classes,
                runtime_class_feed,
                services: services::ApiServices::default(),
                client: certs.client,
                heartbeat: certs.heartbeat,
                lease: certs.lease,
                lane,
                current: certs.current,
                snapshot,
                serving,
                pod_data: podobjects::PodData::new(),
            },
            tasks,
        ))
    }

    /// The ConfigMaps, Secrets, claims and tokens of API pods (filled once its [`tasks`](Self::tasks) run).
    pub fn pod_data(&self) -> podobjects::PodData {
        self.pod_data.clone()
    }

    /// The API server's Services, for service environment variables (filled once
    /// its [`tasks`](Self::tasks) run).
    pub fn services(&self) -> services::ApiServices {
        self.services.clone()
    }

    /// The API server's RuntimeClasses (filled once its [`tasks`](Self::tasks) run).
    pub fn runtime_classes(&self) -> runtimeclasses::ApiRuntimeClasses {
        self.runtime_classes.clone()
    }

    /// With `serverTLSBootstrap`: the main port's certificate from the cluster (the server reads it at
    /// each handshake).
    pub fn serving_cert(&self) -> Option<crate::server::ServingCertHandle> {
        self.serving.as_ref().map(certificates::ServingCerts::handle)
    }

    /// The writers (the Node and its Lease, pod statuses, mirror pods and events, all read from `view` and
    /// the pod stores), the pod data watches, which poke `refresh` when the volumes must be rendered again,
    /// and the serving certificate's manager, as named tasks for the daemon to spawn (`pod-data-refresh`,
    /// `runtime-classes`, `services`, `pod-data`, `serving-certificate`, `csi-node`, `node-sync`,
    /// `pod-status`, `mirror-pods`, `events`; each may end, a panic is a failure), all ending at `shutdown`.
    /// All wait for the node's credentials.
    #[allow(clippy::too_many_arguments)]
    pub fn tasks<V: crate::server::NodeView + Send + Sync + 'static>(
        self,
        node_name: &str,
        cluster: &crate::config::ClusterConfig,
        view: std::sync::Arc<V>,
        desired: reconcile_engine::Store<
            nodelet_resources::model::pod::PodUid,
            nodelet_resources::model::pod::DesiredPod,
        >,
        actual: reconcile_engine::Store<
            nodelet_resources::model::pod::PodUid,
            nodelet_resources::model::actual::PodActual,
        >,
        sandboxes: reconcile_engine::Store<
            nodelet_resources::model::pod::PodUid,
            nodelet_resources::model::actual::PodSandboxes,
        >,
        probes: nodelet_resources::probe::results::ProbeResults,
        related: Vec<reconcile_engine::Subscription<nodelet_resources::model::pod::PodUid>>,
        cri: nodelet_cri::CriClient,
        csi: std::sync::Arc<nodelet_csi::Registry>,
        refresh: tokio::sync::watch::Sender<()>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Vec<NamedTask> {
        let mut tasks = Vec::new();
        let mut changes = self.pod_data.subscribe();
        let stop = shutdown.clone();
        tasks.push(NamedTask::new("pod-data-refresh", Bounded, async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = changes.changed() => if r.is_err() { return },
                }
                refresh.send_replace(());
            }
        }));
        let classes = self.runtime_class_feed.run(self.client.clone(), shutdown.clone());
        tasks.push(NamedTask::new(
            "runtime-classes",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), classes),
        ));
        let services = self.services.clone().run(self.client.clone(), shutdown.clone());
        tasks.push(NamedTask::new(
            "services",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), services),
        ));
        let pod_data = self.pod_data.clone().run(self.client.clone(), desired.clone(), shutdown.clone());
        tasks.push(NamedTask::new(
            "pod-data",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), pod_data),
        ));
        let host_ips: Vec<String> = view
            .nodes()
            .items
            .first()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect())
            .unwrap_or_default();
        if let Some(serving) = self.serving {
            let run =
                serving.run(self.client.clone(), node_name.to_owned(), host_ips.clone(), shutdown.clone());
            tasks.push(NamedTask::new(
                "serving-certificate",
                Bounded,
                when_ready(self.current.clone(), shutdown.clone(), run),
            ));
        }
        let node_sync = node::NodeSync::new(
            self.client.clone(),
            node::Heartbeats {
                status: self.heartbeat.clone(),
                lease: self.lease.clone(),
                lane: self.lane.clone(),
            },
            node_name.to_owned(),
            node::NodeSyncConfig {
                register: cluster.register_node,
                labels: cluster.node_labels.clone(),
                taints: cluster.register_with_taints.clone(),
                update_frequency: cluster.node_status_update_frequency,
                report_frequency: cluster.node_status_report_frequency,
                lease_duration: cluster.node_lease_duration,
            },
            view.clone(),
            cri,
        );
        let registered = node_sync.registered();
        // The labels nodelet sets itself stay when a CSI driver reporting them as topology goes.
        let own_labels = view
            .nodes()
            .items
            .first()
            .and_then(|n| n.metadata.labels.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .chain(cluster.node_labels.keys().cloned())
            .collect();
        let csi_node =
            csinode::CsiNodeSync::new(self.client.clone(), csi, node_sync.registered(), own_labels);
        let run = csi_node.run(shutdown.clone());
        tasks.push(NamedTask::new(
            "csi-node",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), run),
        ));
        let run = node_sync.run(shutdown.clone());
        tasks.push(NamedTask::new(
            "node-sync",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), run),
        ));
        let status = status::StatusManager::new(
            self.client.clone(),
            view.clone(),
            status::PodStores { desired: desired.clone(), actual, sandboxes, related },
            probes,
            self.snapshot.clone(),
            host_ips,
        );
        let run = status.run(shutdown.clone());
        tasks.push(NamedTask::new(
            "pod-status",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), run),
        ));
        let mirrors = mirror::MirrorPods::new(self.client.clone(), desired, self.snapshot, registered);
        let run = mirrors.run(shutdown.clone());
        tasks.push(NamedTask::new(
            "mirror-pods",
            Bounded,
            when_ready(self.current.clone(), shutdown.clone(), run),
        ));
        let events = events::EventSink::new(self.client, view, node_name.to_owned());
        let run = events.run(shutdown.clone());
        tasks.push(NamedTask::new("events", Bounded, when_ready(self.current, shutdown.clone(), run)));
        tasks
    }
}

#[cfg(test)]
mod when_ready_tests {
    use super::*;

    #[tokio::test]
    async fn a_task_waiting_for_credentials_takes_its_size_once_and_runs_once_they_are_there() {
        let (tx, current) = tokio::sync::watch::channel(None);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let big = [7u8; 16 * 1024];
        let task = async move {
            tokio::task::yield_now().await;
            flag.store(big.iter().all(|b| *b == 7), std::sync::atomic::Ordering::SeqCst);
        };
        let task_size = std::mem::size_of_val(&task);
        let waiting = when_ready(current, shutdown, task);
        assert!(task_size > 16 * 1024);
        assert!(std::mem::size_of_val(&waiting) < 1024, "{} bytes", std::mem::size_of_val(&waiting));
        let run = tokio::spawn(waiting);
        tokio::task::yield_now().await;
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "not before the credentials");
        let answering = || {
            transport::stack_of(tower::service_fn(|_req: http::Request<kube::client::Body>| async {
                crate::test_support::json_response(200, "{}")
            }))
        };
        tx.send_replace(Some(certificates::NodeClients { api: answering(), lease: answering() }));
        run.await.expect("ran");
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}

#[cfg(test)]
mod watch_timeout_tests {
    use super::*;

    #[test]
    fn watch_timeouts_are_random_in_five_to_ten_minutes_as_client_gos() {
        assert_eq!(watch_config_with(0.0).timeout, Some(300));
        assert_eq!(watch_config_with(0.5).timeout, Some(450));
        assert_eq!(watch_config_with(0.999_999).timeout, Some(599));
        assert_eq!(watch_config_with(1.0).timeout, Some(599));
        assert_eq!(watch_config_with(-3.0).timeout, Some(300));
        let drawn: std::collections::BTreeSet<Option<u32>> =
            (0..50).map(|_| watch_config().timeout).collect();
        assert!(drawn.len() > 1, "{drawn:?}");
        assert!(drawn.iter().all(|t| matches!(t, Some(300..=599))), "{drawn:?}");
    }

    #[test]
    fn the_read_timeout_outlasts_the_longest_watch() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().expect("url"));
        tune(&mut config, "n");
        let longest = Duration::from_secs(u64::from(2 * WATCH_TIMEOUT_MIN_SECS));
        assert!(config.read_timeout.is_some_and(|t| t > longest));
    }
}
