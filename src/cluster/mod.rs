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
//! Every API call goes through one [`kube::Client`] with the kubelet's client-side rate limit
//! (`kubeAPIQPS`, `kubeAPIBurst`; see [`ratelimit`]). None of these tasks ever stops or restarts a
//! pod because the API server is unreachable: each retries with back-off and catches up when the API
//! server is back, and the pod source keeps its last complete list meanwhile.

pub(crate) mod events;
pub(crate) mod mirror;
pub(crate) mod node;
pub(crate) mod podobjects;
pub(crate) mod pods;
pub(crate) mod ratelimit;
pub(crate) mod status;

use std::time::Duration;

use kube::Client;

/// Errors of cluster mode's set-up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    /// The kubeconfig file could not be read or understood.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from the kubeconfig.
    #[error("API client from {path}: {source}")]
    Client {
        /// The kubeconfig file.
        path: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The API pod source could not be added to the pod config.
    #[error(transparent)]
    Source(#[from] crate::sources::PodConfigError),
}

/// The user agent nodelet sends to the API server.
pub(crate) fn user_agent(node: &str) -> String {
    format!("nodelet/v{} ({node})", env!("CARGO_PKG_VERSION"))
}

/// A client for the API server of `kubeconfig`, rate limited to `qps` requests per second with
/// bursts of `burst`.
pub(crate) async fn connect(
    kubeconfig: &std::path::Path,
    node: &str,
    qps: f64,
    burst: u32,
) -> Result<Client, ClusterError> {
    let path = kubeconfig.display().to_string();
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|source| ClusterError::Kubeconfig { path: path.clone(), source })?;
    let mut config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|source| ClusterError::Kubeconfig { path: path.clone(), source })?;
    // Calls that hang are cut off; watches have their own server-side timeout.
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(330));
    config.write_timeout = Some(Duration::from_secs(30));
    config.headers.push((
        http_header_name("user-agent"),
        user_agent(node).parse().unwrap_or_else(|_| "nodelet".parse().expect("static header value")),
    ));
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|source| ClusterError::Client { path: path.clone(), source })?;
    Ok(builder.with_layer(&ratelimit::RateLimitLayer::new(qps, burst)).build())
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

/// Cluster mode's first half, set up with the pod sources: the client and the API pod source.
pub(crate) struct Cluster {
    client: Client,
    pod_data: podobjects::PodData,
    snapshot: tokio::sync::watch::Receiver<std::sync::Arc<pods::ApiPodSnapshot>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

impl Cluster {
    /// The API client (rate limited), for the main port's TokenReviews and SubjectAccessReviews.
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// Connects to the API server of `cluster` and adds the API pod source ("api") to
    /// `pod_config`; the source's task goes into `tasks`.
    pub(crate) async fn connect(
        node_name: &str,
        cluster: &crate::config::ClusterConfig,
        pod_config: &crate::sources::PodConfig,
        shutdown: &tokio_util::sync::CancellationToken,
        tasks: &mut tokio::task::JoinSet<()>,
    ) -> Result<Self, ClusterError> {
        let client =
            connect(&cluster.kubeconfig, node_name, cluster.kube_api_qps, cluster.kube_api_burst).await?;
        tracing::info!(kubeconfig = %cluster.kubeconfig.display(), "cluster mode: pods come from the API server too");
        let source = pods::ApiPods::new(client.clone(), pod_config.add_source("api")?);
        let snapshot = source.snapshot();
        tasks.spawn(source.run(shutdown.clone()));
        Ok(Self { client, snapshot, pod_data: podobjects::PodData::new() })
    }

    /// The ConfigMaps, Secrets and tokens of API pods (filled once [`start`](Self::start)ed).
    pub(crate) fn pod_data(&self) -> podobjects::PodData {
        self.pod_data.clone()
    }

    /// Starts the writers (the Node and its Lease, pod statuses, mirror pods and events, all read
    /// from `view` and the pod stores) and the pod data watches, which poke `refresh` when the
    /// volumes must be rendered again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start<V: crate::server::NodeView + Send + Sync + 'static>(
        self,
        node_name: &str,
        cluster: &crate::config::ClusterConfig,
        view: std::sync::Arc<V>,
        desired: reconcile_engine::Store<
            nodelet_resources::pod::desired::PodUid,
            nodelet_resources::pod::desired::DesiredPod,
        >,
        actual: reconcile_engine::Store<
            nodelet_resources::pod::desired::PodUid,
            nodelet_resources::pod::actual::PodActual,
        >,
        probes: nodelet_resources::probe::results::ProbeResults,
        cri: nodelet_cri::CriClient,
        refresh: tokio::sync::watch::Sender<()>,
        shutdown: &tokio_util::sync::CancellationToken,
        tasks: &mut tokio::task::JoinSet<()>,
    ) {
        let mut changes = self.pod_data.subscribe();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = changes.changed() => if r.is_err() { return },
                }
                refresh.send_replace(());
            }
        });
        tasks.spawn(self.pod_data.clone().run(self.client.clone(), desired.clone(), shutdown.clone()));
        let host_ips: Vec<String> = view
            .nodes()
            .items
            .first()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().filter(|a| a.type_ == "InternalIP").map(|a| a.address.clone()).collect())
            .unwrap_or_default();
        let node_sync = node::NodeSync::new(
            self.client.clone(),
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
        tasks.spawn(node_sync.run(shutdown.clone()));
        let status = status::StatusManager::new(
            self.client.clone(),
            view.clone(),
            desired.clone(),
            actual,
            probes,
            self.snapshot.clone(),
            host_ips,
        );
        tasks.spawn(status.run(shutdown.clone()));
        let mirrors = mirror::MirrorPods::new(self.client.clone(), desired, self.snapshot, registered);
        tasks.spawn(mirrors.run(shutdown.clone()));
        let events = events::EventSink::new(self.client, view, node_name.to_owned());
        tasks.spawn(events.run(shutdown.clone()));
    }
}
