//! The daemon as a library: [`Node::builder`] assembles the standard pairs from the configuration, adds
//! the [`Extension`]s, and [`Node::run`] runs them until SIGTERM/SIGINT or until a supervised task fails.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! match nodelet::Invocation::from_args()? {
//!     nodelet::Invocation::Daemon(config) => nodelet::Node::builder(config).build()?.run()?,
//!     nodelet::Invocation::Builtin(command) => command.run(),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The start order, one function per pair or concern in `start`: runtime → sources → claims → volumes →
//! pods (prober, PLEG, volume populator, container GC, log rotation) → stats → pressure (image GC,
//! eviction) → extensions → cluster (Node, Lease, status) → servers. Every task runs on the [`Supervisor`].

#[cfg(test)]
mod bare_spawns;
mod command;
pub(crate) mod extension;
#[cfg(test)]
mod preload_tests;
pub(crate) mod start;
mod supervisor;

use std::sync::Arc;

use anyhow::Context as _;

pub use command::{BuiltinCommand, Invocation, NodeConfig};
pub use extension::{BoxError, Extension, ExtensionContext, StatusTable};
pub use supervisor::{Policy, Supervisor, TaskFailure, panic_message};

use crate::{cluster, config, node, server};

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line or the configuration is invalid, or logging cannot be set up.
    #[error(transparent)]
    Config(BoxError),
    /// Two extensions have the same name, or a name is not allowed.
    #[error("{0}")]
    Extension(String),
    /// An extension failed to start.
    #[error("extension {name:?} failed to start: {source}")]
    ExtensionStart {
        /// The extension.
        name: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A standard pair or concern failed to start (the message names what).
    #[error("{0:#}")]
    Start(anyhow::Error),
    /// A supervised task ended or panicked before shutdown.
    #[error(transparent)]
    TaskFailed(#[from] TaskFailure),
    /// The tokio runtime cannot be built, or a signal handler cannot be installed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Error::Start(e)
    }
}

/// Assembles a node: [`Node::builder`], [`with_extension`](Self::with_extension), [`build`](Self::build).
pub struct NodeBuilder {
    config: NodeConfig,
    extensions: Vec<Box<dyn Extension>>,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("node_name", &self.config.loaded.config.node_name)
            .field("extensions", &self.extensions.iter().map(|e| e.name().to_owned()).collect::<Vec<_>>())
            .finish()
    }
}

impl NodeBuilder {
    /// Adds an extension, started after the standard pairs (in the order added).
    #[must_use]
    pub fn with_extension(mut self, extension: impl Extension) -> Self {
        self.extensions.push(Box::new(extension));
        self
    }

    /// Checks the extensions' names; the node starts in [`Node::run`].
    pub fn build(self) -> Result<Node, Error> {
        let mut seen = std::collections::BTreeSet::new();
        for e in &self.extensions {
            extension::check_name(e.name()).map_err(Error::Extension)?;
            if !seen.insert(e.name().to_owned()) {
                return Err(Error::Extension(format!("two extensions are named {:?}", e.name())));
            }
        }
        Ok(Node { config: self.config, extensions: self.extensions })
    }
}

/// A node agent ready to run: the standard pairs and the extensions.
pub struct Node {
    config: NodeConfig,
    extensions: Vec<Box<dyn Extension>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_name", &self.config.loaded.config.node_name)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A builder of the node `config` describes.
    pub fn builder(config: NodeConfig) -> NodeBuilder {
        NodeBuilder { config, extensions: Vec::new() }
    }

    /// Runs the daemon on a new multi-threaded tokio runtime until SIGTERM/SIGINT (then `Ok`: pods keep
    /// running) or until a supervised task fails ([`Error::TaskFailed`]).
    pub fn run(self) -> Result<(), Error> {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        rt.block_on(self.serve(wait_for_signal()))
    }

    /// [`run`](Self::run) on the current tokio runtime, until `stop` resolves.
    pub async fn serve(self, stop: impl Future<Output = std::io::Result<()>>) -> Result<(), Error> {
        let loaded = *self.config.loaded;
        for w in &loaded.warnings {
            tracing::warn!("config: {w}");
        }
        let config = Arc::new(loaded.config);
        tracing::info!(node = %config.node_name, root = %config.root_dir.display(), "starting nodelet");
        std::fs::create_dir_all(&config.root_dir)
            .with_context(|| format!("cannot create the root directory {}", config.root_dir.display()))?;
        // The container runtime: an external CRI endpoint, or nodelet's own containerd.
        let (endpoint, embedded) = match &config.runtime.endpoint {
            Some(endpoint) => {
                tracing::info!(%endpoint, "using the external container runtime");
                (endpoint.clone(), None)
            }
            None => {
                let cfg = start::embedded_containerd_config(&config);
                let embedded = nodelet_node::containerd::EmbeddedContainerd::start(cfg)
                    .await
                    .map_err(anyhow::Error::from)?;
                (embedded.endpoint().to_string(), Some(embedded))
            }
        };
        let result = run_with_runtime(config, &endpoint, start::Host::Real, self.extensions, stop).await;
        if let Some(embedded) = embedded {
            embedded.shutdown().await.map_err(anyhow::Error::from)?;
        }
        result
    }
}

/// One hollow node (`nodelet hollow`, see [`crate::hollow`]): the same pairs, sources and cluster tasks as
/// a real node, over the runtime at `endpoint` (the hollow node's fake runtime) and a host that mounts
/// nothing ([`start::Host::Hollow`]), until `stop` is cancelled or a task fails.
pub(crate) async fn run_hollow(
    config: Arc<config::Config>,
    endpoint: &str,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), Error> {
    let stop = async move {
        stop.cancelled().await;
        Ok(())
    };
    run_with_runtime(config, endpoint, start::Host::Hollow, Vec::new(), stop).await
}

/// Starts every pair, waits for `stop` or a failed task, then stops everything.
async fn run_with_runtime(
    config: Arc<config::Config>,
    endpoint: &str,
    host: start::Host,
    extensions: Vec<Box<dyn Extension>>,
    stop: impl Future<Output = std::io::Result<()>>,
) -> Result<(), Error> {
    let core = start::Core::new(config.clone(), host)?;
    let started = start_all(&core, endpoint, extensions).await;
    let outcome = match started {
        Ok(()) => tokio::select! {
            r = stop => r.map_err(Error::from),
            failure = core.supervisor.failed() => Err(Error::TaskFailed(failure)),
        },
        Err(e) => Err(e),
    };
    match &outcome {
        Ok(()) => tracing::info!("shutting down; pods keep running"),
        Err(e) => tracing::error!(error = %e, "stopping nodelet"),
    }
    core.shutdown.cancel();
    core.supervisor.join().await;
    outcome
}

/// The standard pairs, the extensions, the cluster and the servers, in order.
async fn start_all(
    core: &start::Core,
    endpoint: &str,
    extensions: Vec<Box<dyn Extension>>,
) -> Result<(), Error> {
    let config = &core.config;
    let runtime = start::start_runtime(core, endpoint).await?;
    let mut sources = start::start_sources(core).await?;
    let storage = start::start_claims(core, &runtime, &sources)?;
    let mut volumes = start::start_volumes(core, &runtime, &storage);
    let mut pods = start::start_pods(core, &runtime, &sources, &storage, &mut volumes)?;
    let stats = start::start_stats(core, &sources, &storage, &volumes);
    let pressure = start::start_pressure(core, &runtime, &sources, &volumes, &mut pods, &stats)?;

    let ctx = ExtensionContext {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pods_desired: sources.desired.clone(),
        pods_actual: pods.actual.clone(),
        volumes_desired: volumes.desired.clone(),
        volumes_actual: volumes.actual.clone(),
        pressure: pressure.view.clone(),
        engine_metrics: core.engine_metrics.clone(),
        registry: core.registry.clone(),
        supervisor: core.supervisor.clone(),
        cri: runtime.cri.clone(),
    };
    let mut tables = extension::StatusTables::default();
    for ext in extensions {
        let name = ext.name().to_owned();
        tracing::info!(extension = %name, "starting extension");
        let table = ext.start(&ctx).map_err(|source| Error::ExtensionStart { name: name.clone(), source })?;
        if let Some(table) = table {
            tables.0.insert(name, table);
        }
    }

    let node = Arc::new(
        node::Node::new(
            sources.desired.clone(),
            pods.actual.clone(),
            pods.failures.clone(),
            // The pod engine's reconciler and side inputs (status shows what it sees).
            pods.reconciler.clone(),
            std::mem::take(&mut pods.status_inputs),
            pods.clock.clone(),
            core.registry.clone(),
            config.pods.pod_logs_dir.clone(),
            runtime.ready.clone(),
            sources.pod_config.problems(),
            config.node_name.clone(),
        )
        .map_err(anyhow::Error::from)?
        .with_volumes(volumes.view())
        .with_claims(storage.claim_view.clone(), storage.claim_metrics.clone())
        .with_stats(stats.clone())
        .with_probe_registry(core.probe_registry.clone())
        .with_pressure(pressure)
        .with_facts(runtime.facts.clone())
        .with_csi(storage.csi.clone())
        .with_pod_config(sources.pod_config.clone())
        .with_configz(config::configz::configz(config))
        .with_pulls(storage.pod_runtime.pull_records()),
    );
    let cluster = sources.cluster.take();
    let kube_client = cluster.as_ref().map(cluster::Cluster::client);
    let serving_cert = cluster.as_ref().and_then(cluster::Cluster::serving_cert);
    if let Some(cluster) = cluster {
        start_cluster(core, cluster, node.clone(), &runtime, &sources, &storage, &pods);
    }
    if config.server.enabled {
        start_servers(core, node, kube_client, serving_cert, &runtime, tables).await?;
    }
    Ok(())
}

/// Cluster mode: the Node object, its Lease, pod status, mirror pods, events (tasks named in
/// [`cluster::Cluster::start`]).
fn start_cluster(
    core: &start::Core,
    cluster: cluster::Cluster,
    node: Arc<node::Node>,
    runtime: &start::Runtime,
    sources: &start::Sources,
    storage: &start::Storage,
    pods: &start::Pods,
) {
    let Some(c) = &core.config.cluster else { return };
    cluster.start(
        &core.config.node_name,
        c,
        node,
        sources.desired.clone(),
        pods.actual.clone(),
        pods.sandboxes.actual().clone(),
        pods.probes.clone(),
        vec![pods.failures.subscribe(), pods.sandbox_failures.subscribe(), pods.verdicts.subscribe()],
        runtime.cri.clone(),
        storage.csi.clone(),
        pods.refresh.clone(),
        &core.supervisor,
    );
}

/// The HTTP servers: main, read-only and healthz ports (task `servers`).
async fn start_servers(
    core: &start::Core,
    node: Arc<node::Node>,
    kube_client: Option<kube::Client>,
    serving_cert: Option<server::ServingCertHandle>,
    runtime: &start::Runtime,
    extensions: extension::StatusTables,
) -> Result<(), Error> {
    let config = &core.config;
    let mut server_config = server::ServerConfig::new(config.node_name.clone());
    server_config.address = config.server.address;
    server_config.port = config.server.port;
    server_config.read_only_port = config.server.read_only_port;
    server_config.healthz_port = config.server.healthz.map(|a| a.port());
    if let Some(h) = config.server.healthz {
        server_config.healthz_bind_address = h.ip();
    }
    server_config.tls_cert_file = config.server.tls.as_ref().map(|t| t.cert_file.clone());
    server_config.tls_private_key_file = config.server.tls.as_ref().map(|t| t.key_file.clone());
    server_config.client_ca_file = config.server.auth.client_ca_file.clone();
    server_config.token_auth_file = config.server.auth.token_auth_file.clone();
    server_config.anonymous_auth = config.server.auth.anonymous;
    server_config.token_webhook = config.server.auth.token_webhook;
    server_config.authorization = config.server.auth.authorization;
    server_config.kube_client = kube_client.map(server::ApiClient);
    server_config.root_dir = config.root_dir.clone();
    server_config.serving_cert = serving_cert;
    server_config.runtime = Some(runtime.cri.clone());
    server_config.extensions = extensions;
    server_config.streaming_idle_timeout = config.server.streaming_connection_idle_timeout;
    server_config.max_streaming_sessions_per_user = config.server.max_streaming_sessions_per_user;
    let servers = server::Servers::bind(&server_config, node).await.map_err(|e| Error::Start(e.into()))?;
    tracing::info!(
        main = %servers.main_addr(),
        read_only = ?servers.read_only_addr(),
        healthz = ?servers.healthz_addr(),
        "serving"
    );
    let stop = core.shutdown.clone();
    core.supervisor.spawn("servers", Policy::Critical, async move {
        servers.run(stop.cancelled_owned()).await;
    });
    Ok(())
}

/// SIGTERM or SIGINT.
async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
