//! The node, assembled in one place: which pairs exist, what each reads and watches, which tasks run, in
//! what order they start. [`run`] (a real node) and [`run_hollow`] (`nodelet hollow`) both go through
//! [`run_with_runtime`] → [`assemble`], which calls the steps below in order; each takes the [`Core`]
//! (configuration, shutdown, supervisor, registries, the node's clock, event log and reclaimers) and the
//! handles of the earlier ones, and returns the handles the later ones read. Helpers that build one pair's
//! parts live with the pair (`crate::claims`, `crate::volumes`, `crate::pressure`, `crate::cluster`,
//! `super::runtime`, `nodelet_resources::sandbox::pair`) and hand their tasks back as futures or
//! `NamedTask`s; the choices of stores and of the order are here, and every task of the node is spawned
//! here or by an [`Extension`] this module starts.
//!
//! **Every standard pair starts as an extension does.** Stores before engines: [`make_pairs`] first makes
//! every pair's stores and handles, spawning nothing: the desired stores and their writers
//! (`reconcile_engine::store`), each engine's builder, whose actual and operation status stores exist
//! before the engine is built (`EngineBuilder::actual`, `EngineBuilder::op_status`), the views status reads
//! of them, and each pair as a value of [`super::builtin`] given what only it may hold (writers, its engine
//! builder, its populator's inputs); then [`context`] makes the [`ExtensionContext`] from those stores; then
//! [`start_builtins`] starts each of nodelet's own pairs through [`Extension::start`] ([`start_extension`],
//! the one path of nodelet's own and the third parties' extensions) with that context, in order, its
//! failure failing its [`Stage`]. A pair declares its relations and gates on its engine's builder and
//! spawns its tasks on the context's supervisor in its `start`.
//!
//! | step | pairs and stores | tasks |
//! |---|---|---|
//! | [`run`] | the embedded containerd (when no CRI endpoint is set), on an outer supervisor | `containerd` |
//! | [`start_runtime`] | the CRI client, runtime readiness, the node's facts | `runtime-health` |
//! | [`start_sources`] | the desired pod store `Store<PodUid, DesiredPod>` (`PodConfig`, its only writer); cluster mode: the API client and pod source (`Cluster::connect`, which returns their tasks) | `source-file`, `source-url`, `source-http`; cluster mode: `client-certificate`, `source-api` |
//! | [`make_pairs`] → [`claim_stores`] ([`Stage::Claims`]) | the CRI pod runtime, the CSI registry (its directory created) and the store of its registered drivers `Store<String, CsiDriverInfo>`, the provisioners, the claim engine's builder and desired store, the claim view and lookup ([`Storage`]); the pair [`builtin::claims::ClaimPair`] | — |
//! | [`make_pairs`] → [`volume_stores`] | the volume engine's builder and desired store, the refresh channel ([`Volumes`]); the pair [`builtin::volumes::VolumePair`] | — |
//! | [`make_pairs`] → [`pod_stores`] ([`Stage::Pods`]) | the verdict store and admission ([`PressureInputs`], for the eviction pair); the pod engine's builder (the pod reconciler, a copy kept for status); the prober; the container GC surplus store, populator and reclaimer; the sandbox pair (`SandboxPair::new`, its engine `sandboxes` built: watches `pods`, `verdicts`, `volumes`, reads the desired volumes) and the observer the PLEG reports sandboxes through; the pod side inputs [`builtin::pods::PodSideInputs`] and their value, which the engine is built with and status reads ([`Pods`]); the pairs [`builtin::sandboxes::Sandboxes`], [`builtin::pods::PodPair`] | — |
//! | [`make_pairs`] → [`stats_provider`] | the stats provider | — |
//! | [`context`] | the [`ExtensionContext`]: the pod, sandbox, verdict and volume stores, the pressure conditions the eviction pair updates, the stats provider, the engine metrics, the metric families (the `/metrics` registry and what is made in it), the supervisor, the CRI client, the node's events, clock and reclaimers | — |
//! | [`start_builtins`] ([`StandardPairs::in_start_order`]) | the claim pair (`claims`: watches its related claims and `csi-drivers`; populated from the manifests' objects and the desired pods), [`Stage::Claims`] | `csi-plugin-watcher`, `csi-drivers`, `claim-populator`, `claim-engine` |
//! | | the volume pair (`volumes`: watches its own actual store as `devices`; the populator reads the desired and actual pods and the verdicts), [`Stage::Volumes`] | `volume-watch`, `volume-refresh`, `volume-populator`, `claim-volume-stats`, `volume-engine` |
//! | | the sandbox pair, [`Stage::Pods`] | `sandbox-engine`, `sandbox-populator` |
//! | | the pod pair (`pods`: relations, gate and side inputs of [`builtin::pods::PodSideInputs`]; adds the `container-gc` reclaimer, the first of [`Core::reclaimers`]), [`Stage::Pods`] | `prober`, `container-gc`, `log-rotation`, `runtime-events`, `pleg`, `pod-engine` |
//! | [`start_stats`] | the stats provider's tasks | `stats-housekeeping`, `volume-stats` |
//! | [`start_builtins`] ([`builtin_extensions`]), [`Stage::Pressure`] | the image pair (`images`, [`builtin::images::ImageGc`]: watches `pods-desired`, `pods-actual`; adds the `image-gc` reclaimer), then the eviction pair ([`builtin::eviction::EvictionPair`], through `pressure::start`: the verdict populator with the verdict store's writer and admission from [`pod_stores`], the eviction engine and sampler; it tries the context's reclaimers, `container-gc` first) | `image-populator`, `image-engine`, `local-storage-measure`, `verdict-populator`, `eviction-engine`, `eviction-sampler` |
//! | extensions | the third parties' [`Extension`]s, in the order added, each through [`start_extension`] with the same [`ExtensionContext`] | the extensions' own |
//! | status | [`node::Node`]: what the servers and cluster mode read ([`Handles`]: the pod reconciler copy and the side inputs' value, the failures stores, the probe results, the volume view, the claim view…) | — |
//! | [`start_cluster`] | cluster mode's writers (Node, Lease, pod status, mirror pods, events) | `pod-data-refresh`, `runtime-classes`, `services`, `pod-data`, `serving-certificate`, `csi-node`, `node-sync`, `pod-status`, `mirror-pods`, `events` |
//! | [`start_servers`] | the HTTP servers | `servers` |
//!
//! A step that fails stops the start with a [`StartError`] naming its [`Stage`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use nodelet_resources::claim::metrics::ClaimMetrics;
use nodelet_resources::claim::reconciler::ClaimReconciler;
use nodelet_resources::claim::status::ClaimView;
use nodelet_resources::common::clock::{Clock, system_clock};
use nodelet_resources::common::events::NodeEvents;
use nodelet_resources::eviction::status::PressureView;
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::model::pressure::Reclaimers;
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::model::volumes::ClaimLookup;
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodReconciler};
use nodelet_resources::probe::results::ProbeResults;
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use nodelet_resources::sandbox::status::{SandboxOpStatus, SandboxView};
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey};
use nodelet_resources::volume::driver::VolumeDriver;
use nodelet_resources::volume::metrics::VolumeMetrics;
use nodelet_resources::volume::reconciler::VolumeReconciler;
use reconcile_engine::{BackoffConfig, Engine, Metrics, Store};
use tokio_util::sync::CancellationToken;

use super::builtin;
use super::error::{Error, Stage, StartCause, StartError};
use super::extension::{self, BoxError, Extension, ExtensionContext, StatusTables};
use super::families::NodeFamilies;
use super::runtime;
use super::supervisor::{Policy, Supervisor, TaskRestarts, spawn_tasks};
use nodelet_node::node_facts;

use crate::{claims, cluster, config, node, pressure, server};
use crate::{sources, volumes};
use nodelet_stats as stats;

/// What the node's volumes are made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// This machine: memory-backed volumes are tmpfs mounts, local volumes and confined hostPaths binds.
    Real,
    /// A hollow node (`nodelet hollow`): memory-backed volumes are plain directories, as kubemark's fake
    /// mounter leaves them, and the eviction pair reads no signal of the machine (its memory and disks are
    /// not the hollow node's), as kubemark's fake cAdvisor; everything else is as on a real node.
    Hollow,
}

/// What every start function shares.
pub(crate) struct Core {
    pub(crate) config: Arc<config::Config>,
    /// Where the node's volumes are made.
    pub(crate) host: Host,
    pub(crate) shutdown: CancellationToken,
    pub(crate) supervisor: Supervisor,
    /// `/metrics` and `/metrics/probes`, with the metrics made in them (shared by the hollow nodes of a
    /// process, see [`MetricFamilies`](super::MetricFamilies)).
    pub(crate) metrics: NodeFamilies,
    /// The engine metrics every engine reports to, each under its own `reconciler` label.
    pub(crate) engine_metrics: Metrics,
    /// The node's wall clock (the pairs' timestamps; the engines' `View::wall`).
    pub(crate) clock: Clock,
    /// The node's event log: eviction and image GC events (shown with the pressure conditions).
    pub(crate) events: NodeEvents,
    /// The node-level reclaimers the eviction pair tries under disk pressure, in the order added:
    /// container GC (the built-in extension `pods`), image GC (the built-in extension `images`), the
    /// extensions'.
    pub(crate) reclaimers: Reclaimers,
    /// Where cluster mode renews the Lease ([`cluster::HeartbeatLane`]): given for hollow nodes (the
    /// process's one lane); a real node starts its own when it joins a cluster.
    pub(crate) heartbeat_lane: Option<cluster::HeartbeatLane>,
}

impl Core {
    /// A core with metric families of its own.
    pub(crate) fn new(config: Arc<config::Config>, host: Host) -> Result<Self, prometheus::Error> {
        Self::with_metrics(config, host, NodeFamilies::default())
    }

    /// A core recording into `metrics` (a hollow node: the process's families).
    pub(crate) fn with_metrics(
        config: Arc<config::Config>,
        host: Host,
        metrics: NodeFamilies,
    ) -> Result<Self, prometheus::Error> {
        let shutdown = CancellationToken::new();
        Ok(Core {
            supervisor: Supervisor::with_restarts(shutdown.clone(), metrics.main.get(TaskRestarts::new)?),
            engine_metrics: metrics.main.get(Metrics::new)?,
            metrics,
            shutdown,
            config,
            host,
            clock: system_clock(),
            events: NodeEvents::new(),
            reclaimers: Reclaimers::new(),
            heartbeat_lane: None,
        })
    }

    /// This core with cluster mode's Lease renewals on `lane`.
    pub(crate) fn with_heartbeat_lane(self, lane: cluster::HeartbeatLane) -> Self {
        Self { heartbeat_lane: Some(lane), ..self }
    }
}

/// The daemon on this machine: creates the root directory, starts the embedded containerd when no CRI
/// endpoint is configured, runs the node ([`run_with_runtime`]) until `stop` resolves or a task fails, then
/// stops containerd.
///
/// The embedded containerd's supervision runs on a second, outer [`Supervisor`] (task `containerd`): it starts
/// before the node's supervisor and stops after it, since containerd must outlive every task of the node. Its
/// failure stops the node as a failure of the node's own tasks does.
pub(crate) async fn run(
    config: Arc<config::Config>,
    extensions: Vec<Box<dyn Extension>>,
    stop: impl Future<Output = std::io::Result<()>>,
) -> Result<(), Error> {
    tracing::info!(node = %config.node_name, root = %config.root_dir.display(), "starting nodelet");
    std::fs::create_dir_all(&config.root_dir).map_err(|source| {
        let what = format!("the root directory {}", config.root_dir.display());
        StartError::new(Stage::Setup, StartCause::CreateDir { what, source })
    })?;
    let outer_shutdown = CancellationToken::new();
    // Its only task is `containerd` (Critical, never restarted): its `nodelet_task_restarts_total` stays
    // out of `/metrics`.
    let outer = Supervisor::new(outer_shutdown.clone(), &prometheus::Registry::new())
        .map_err(StartError::at(Stage::Setup))?;
    // Made before containerd starts: nothing returns early between its start and its shutdown below.
    let core = Core::new(config.clone(), Host::Real).map_err(StartError::at(Stage::Setup))?;
    // The container runtime: an external CRI endpoint, or nodelet's own containerd.
    let (endpoint, embedded) = match &config.runtime.endpoint {
        Some(endpoint) => {
            tracing::info!(%endpoint, "using the external container runtime");
            (endpoint.clone(), None)
        }
        None => {
            let cfg = runtime::embedded_containerd_config(&config);
            let (embedded, supervision) = nodelet_node::containerd::EmbeddedContainerd::start(cfg)
                .await
                .map_err(StartError::at(Stage::Runtime))?;
            outer.spawn("containerd", Policy::Critical, supervision);
            (embedded.endpoint().to_string(), Some(embedded))
        }
    };
    let stop = async {
        tokio::select! {
            r = stop => r.map_err(Error::from),
            failure = outer.failed() => Err(Error::TaskFailed(failure)),
        }
    };
    let result = run_with_runtime(core, &endpoint, extensions, stop).await;
    // The node's tasks have stopped: now containerd.
    outer_shutdown.cancel();
    let stopped = match embedded {
        Some(embedded) => embedded.shutdown().await.map_err(StartError::at(Stage::Runtime)),
        None => Ok(()),
    };
    outer.join().await;
    stopped?;
    result
}

/// One hollow node (`nodelet hollow`, see [`crate::hollow`]): the same pairs, sources and cluster tasks as
/// a real node, over the runtime at `endpoint` (the hollow node's fake runtime) and a host that mounts
/// nothing ([`Host::Hollow`]), recording into `metrics` and renewing its Lease on `lane` (the process's,
/// shared by its hollow nodes), until `stop` is cancelled or a task fails.
pub(crate) async fn run_hollow(
    config: Arc<config::Config>,
    endpoint: &str,
    metrics: NodeFamilies,
    lane: cluster::HeartbeatLane,
    stop: CancellationToken,
) -> Result<(), Error> {
    let core = Core::with_metrics(config, Host::Hollow, metrics)
        .map_err(StartError::at(Stage::Setup))?
        .with_heartbeat_lane(lane);
    let stop = async move {
        stop.cancelled().await;
        Ok(())
    };
    run_with_runtime(core, endpoint, Vec::new(), stop).await
}

/// Starts the node ([`assemble`]), waits for `stop` or a failed task, then stops every task.
async fn run_with_runtime(
    core: Core,
    endpoint: &str,
    extensions: Vec<Box<dyn Extension>>,
    stop: impl Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    let started = assemble(&core, endpoint, extensions).await;
    let outcome = match started {
        Ok(()) => tokio::select! {
            r = stop => r,
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

/// The node, in start order: the runtime and the sources; then, stores before engines, every standard
/// pair's stores and handles ([`make_pairs`]: nothing runs yet) and the [`ExtensionContext`] made of them;
/// then nodelet's own pairs, each started through [`Extension::start`] ([`start_builtins`]: the claim,
/// volume, sandbox and pod pairs, the stats' tasks, the image and eviction pairs), the third parties'
/// extensions (each given the same context), the node's status ([`node::Node`]), cluster mode and the
/// servers.
async fn assemble(core: &Core, endpoint: &str, extensions: Vec<Box<dyn Extension>>) -> Result<(), Error> {
    let config = &core.config;
    let runtime = start_runtime(core, endpoint).await.map_err(StartError::at(Stage::Runtime))?;
    let mut sources = start_sources(core).await.map_err(StartError::at(Stage::Sources))?;
    let Pairs { mut handles, stats, standard, pressure_inputs } = make_pairs(core, &runtime, &sources)?;
    let ctx = context(core, &runtime, &sources, &handles, &stats);
    let mut tables = StatusTables::default();
    start_builtins(&ctx, &mut tables, standard.in_start_order())?;
    start_stats(core, &stats);
    start_builtins(&ctx, &mut tables, builtin_extensions(config, pressure_inputs, core.host))?;
    let pressure = pressure::PressureState { view: ctx.pressure(), events: ctx.events().clone() };
    for ext in extensions {
        let name = ext.name().to_owned();
        tracing::info!(extension = %name, "starting extension");
        start_extension(ext, &ctx, &mut tables).map_err(|source| Error::ExtensionStart { name, source })?;
    }

    let Handles { storage, volumes, pods } = &mut handles;
    let node = Arc::new(
        node::Node::new(
            sources.desired.clone(),
            pods.actual.clone(),
            pods.failures.clone(),
            // The pod engine's reconciler and side inputs (status shows what it sees).
            pods.reconciler.clone(),
            std::mem::take(&mut pods.status_inputs),
            core.clock.clone(),
            &core.metrics.main,
            config.pods.pod_logs_dir.clone(),
            runtime.ready.clone(),
            sources.pod_config.problems(),
            config.node_name.clone(),
        )
        .map_err(StartError::at(Stage::Status))?
        .with_volumes(volumes.view())
        .with_claims(storage.claim_view.clone(), storage.claim_metrics.clone())
        .with_stats(stats.clone())
        .with_probe_registry(core.metrics.probes.registry().clone())
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
        start_cluster(core, cluster, node.clone(), &runtime, &sources, &handles);
    }
    if config.server.enabled {
        start_servers(core, node, kube_client, serving_cert, &runtime, tables)
            .await
            .map_err(StartError::at(Stage::Servers))?;
    }
    Ok(())
}

/// What every extension is given, nodelet's own first: the stores of the standard pairs, the stats, and
/// the [`Core`]'s shared parts. The pressure conditions are the eviction pair's, made here so that the
/// extensions started before it hold them too.
fn context(
    core: &Core,
    runtime: &Runtime,
    sources: &Sources,
    handles: &Handles,
    stats: &stats::StatsProvider,
) -> ExtensionContext {
    let Handles { volumes, pods, .. } = handles;
    ExtensionContext {
        node_name: core.config.node_name.clone(),
        root_dir: core.config.root_dir.clone(),
        pods_desired: sources.desired.clone(),
        pods_actual: pods.actual.clone(),
        sandboxes_actual: pods.sandboxes.actual().clone(),
        verdicts: pods.verdicts.clone(),
        volumes_desired: volumes.desired.clone(),
        volumes_actual: volumes.actual.clone(),
        pressure: PressureView::new((core.clock)()),
        stats: stats.clone(),
        engine_metrics: core.engine_metrics.clone(),
        metrics: core.metrics.main.clone(),
        supervisor: core.supervisor.clone(),
        cri: runtime.cri.clone(),
        events: core.events.clone(),
        clock: core.clock.clone(),
        reclaimers: core.reclaimers.clone(),
    }
}

/// One of nodelet's own pairs as the extension that starts it, and the [`Stage`] its failure fails.
pub(crate) struct Builtin {
    stage: Stage,
    extension: Box<dyn Extension>,
}

impl Builtin {
    fn new(stage: Stage, extension: impl Extension) -> Self {
        Builtin { stage, extension: Box::new(extension) }
    }
}

/// The claim, volume, sandbox and pod pairs, made ([`make_pairs`]) and not started: each holds what only it
/// may hold.
pub(crate) struct StandardPairs {
    claims: builtin::claims::ClaimPair,
    volumes: builtin::volumes::VolumePair,
    sandboxes: builtin::sandboxes::Sandboxes,
    pods: builtin::pods::PodPair,
}

impl StandardPairs {
    /// The pairs in start order, each with its stage: claims ([`Stage::Claims`]: the CSI registry's tasks
    /// and the claim engine, which the volume pair's claim lookup reads), volumes ([`Stage::Volumes`]),
    /// sandboxes and pods ([`Stage::Pods`]: the pod engine waits for the sandboxes' actual store).
    fn in_start_order(self) -> Vec<Builtin> {
        let StandardPairs { claims, volumes, sandboxes, pods } = self;
        vec![
            Builtin::new(Stage::Claims, claims),
            Builtin::new(Stage::Volumes, volumes),
            Builtin::new(Stage::Pods, sandboxes),
            Builtin::new(Stage::Pods, pods),
        ]
    }
}

/// nodelet's own pairs that start as extensions after the stats ([`builtin`]), in start order, at
/// [`Stage::Pressure`]: the image pair ([`builtin::images::ImageGc`]), then the eviction pair
/// ([`builtin::eviction::EvictionPair`], given the verdict store's writer and admission made with the pod
/// pair's stores), which tries the image pair's reclaimer. On a hollow `host` the eviction pair reads no
/// signal ([`pressure::SignalOrigin::Hollow`]).
fn builtin_extensions(config: &Arc<config::Config>, pressure: PressureInputs, host: Host) -> Vec<Builtin> {
    let signals = match host {
        Host::Hollow => pressure::SignalOrigin::Hollow,
        Host::Real => pressure::SignalOrigin::Host,
    };
    vec![
        Builtin::new(Stage::Pressure, builtin::images::ImageGc::new(config)),
        Builtin::new(
            Stage::Pressure,
            builtin::eviction::EvictionPair::new(
                config.clone(),
                pressure.verdict_writer,
                pressure.admission,
                signals,
            ),
        ),
    ]
}

/// Starts nodelet's own pairs that are extensions, in order, each as every extension starts
/// ([`start_extension`]); the failure of one fails its [`Stage`] with its message.
fn start_builtins(
    ctx: &ExtensionContext,
    tables: &mut StatusTables,
    builtins: Vec<Builtin>,
) -> Result<(), StartError> {
    for Builtin { stage, extension } in builtins {
        start_extension(extension, ctx, tables)
            .map_err(|e| StartError::new(stage, StartCause::Builtin(e)))?;
    }
    Ok(())
}

/// Starts `ext` through [`Extension::start`] with `ctx`, the one way every extension starts, nodelet's own
/// and a third party's; keeps the status table it returns, if any, in `tables` (served on
/// `/extensions/{name}`).
fn start_extension(
    ext: Box<dyn Extension>,
    ctx: &ExtensionContext,
    tables: &mut StatusTables,
) -> Result<(), BoxError> {
    let name = ext.name().to_owned();
    if let Some(table) = ext.start(ctx)? {
        tables.insert(name, table);
    }
    Ok(())
}

/// The container runtime, ready.
pub(crate) struct Runtime {
    pub(crate) cri: nodelet_cri::CriClient,
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) facts: Arc<node_facts::NodeFacts>,
}

/// Connects to the runtime at `endpoint`, preloads images, waits until it is ready, and keeps checking
/// its health for `/healthz` (task `runtime-health`, restartable).
pub(crate) async fn start_runtime(core: &Core, endpoint: &str) -> Result<Runtime, StartCause> {
    let config = &core.config;
    let cri_config =
        nodelet_cri::CriConfig::new(endpoint).with_runtime_request_timeout(config.runtime.request_timeout);
    let cri = if core.host == Host::Hollow {
        runtime::hollow_cri_client(cri_config)
    } else {
        nodelet_cri::CriClient::connect_lazy(cri_config)
    }
    .map_err(|source| StartCause::Endpoint { endpoint: endpoint.to_owned(), source })?;
    // Wait for the runtime before planning anything: reconstruction needs it.
    let ready = Arc::new(AtomicBool::new(false));
    runtime::wait_for_runtime(&cri, &ready).await;
    if let (Some(dir), true) = (&config.runtime.preload_images, config.runtime.endpoint.is_some()) {
        // `ctr images import` speaks containerd's own API: another runtime is refused with a clear error.
        let version = cri.version().await.map_err(StartCause::Version)?;
        if version.runtime_name != "containerd" {
            return Err(StartCause::NotContainerd {
                endpoint: endpoint.to_owned(),
                name: version.runtime_name,
                version: version.runtime_version,
            });
        }
        let socket = endpoint.trim_start_matches("unix://");
        let imported =
            nodelet_node::containerd::import_images(std::path::Path::new("ctr"), socket.as_ref(), dir)
                .await?;
        tracing::info!(images = imported.len(), dir = %dir.display(), "preloaded images");
    }
    // What the Node object shows of this machine: read once.
    let facts = Arc::new(node_facts::NodeFacts::detect(
        &runtime::facts_config(config),
        node_facts::runtime_version(&cri).await,
    ));
    // kubelet_runtime_operations_{total,errors_total,duration_seconds}, counted in every clone of `cri`.
    cri.set_metrics(core.metrics.main.get(nodelet_cri::CriMetrics::new)?);

    let (health_cri, health_ready, stop) = (cri.clone(), ready.clone(), core.shutdown.clone());
    core.supervisor.spawn_restartable("runtime-health", move || {
        runtime::runtime_health(health_cri.clone(), health_ready.clone(), stop.clone())
    });
    Ok(Runtime { cri, ready, facts })
}

/// The pod sources and the desired pod store.
pub(crate) struct Sources {
    pub(crate) pod_config: sources::PodConfig,
    pub(crate) desired: Store<PodUid, DesiredPod>,
    /// ConfigMaps, Secrets, PersistentVolumes… of the manifest directory.
    pub(crate) objects: tokio::sync::watch::Receiver<Arc<sources::ManifestObjects>>,
    pub(crate) cluster: Option<cluster::Cluster>,
}

/// Sources → desired store: the manifest directory (task `source-file`), URL (`source-url`), HTTP
/// endpoint (`source-http`) and, in cluster mode, the API server (`source-api`, `client-certificate`).
pub(crate) async fn start_sources(core: &Core) -> Result<Sources, StartCause> {
    let (config, sup, shutdown) = (&core.config, &core.supervisor, &core.shutdown);
    // Ephemeral containers `nodelet debug` added to static pods, kept across restarts.
    let debug_dir = config.root_dir.join("debug");
    let debug_state = sources::debug::DebugState::load(&debug_dir).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the ephemeral containers of static pods cannot be read; starting without them");
        sources::debug::DebugState::empty(&debug_dir)
    });
    let pod_config = sources::PodConfig::new(config.node_name.clone())
        .with_debug_state(debug_state)
        .with_security(crate::sources::SecurityPolicies::from_config(config))
        .with_grace_cap(config.pods.grace_cap());
    let mut objects = tokio::sync::watch::channel(Arc::new(sources::ManifestObjects::new())).1;
    if let Some(path) = &config.sources.static_pod_path {
        let mut cfg = sources::file::FileSourceConfig::new(path.clone());
        cfg.check_frequency = config.sources.file_check_frequency;
        let source = sources::file::FileSource::new(cfg, pod_config.add_source("file")?);
        objects = source.objects();
        sup.spawn("source-file", Policy::Critical, source.run(shutdown.clone()));
    }
    if let Some(url) = &config.sources.static_pod_url {
        let mut cfg = sources::url::UrlSourceConfig::new(url.clone());
        cfg.headers = config.sources.static_pod_url_headers.clone();
        cfg.check_frequency = config.sources.http_check_frequency;
        let source = sources::url::UrlSource::new(cfg, pod_config.add_source("url")?)?;
        sup.spawn("source-url", Policy::Critical, source.run(shutdown.clone()));
    }
    if let Some(addr) = config.sources.manifest_http_addr {
        let checkpoint_dir = config.root_dir.join("http-source");
        std::fs::create_dir_all(&checkpoint_dir)
            .map_err(|source| StartCause::CreateDir { what: checkpoint_dir.display().to_string(), source })?;
        let mut http_config = sources::http::HttpSourceConfig::new(addr);
        http_config.checkpoint = Some(checkpoint_dir.join("pods.json"));
        let token_file = checkpoint_dir.join("token");
        http_config.token_file = Some(token_file.clone());
        let source = sources::http::HttpSource::bind(http_config, pod_config.add_source("http")?).await?;
        tracing::info!(addr = %source.local_addr(), token_file = %token_file.display(), "accepting manifests over HTTP (bearer token required)");
        sup.spawn("source-http", Policy::Critical, source.run(shutdown.clone()));
    }
    // Cluster mode: the API server is one more source.
    let cluster = match &config.cluster {
        Some(c) => {
            let lane = match &core.heartbeat_lane {
                Some(lane) => lane.clone(),
                None => cluster::HeartbeatLane::start().map_err(StartCause::HeartbeatLane)?,
            };
            let (cluster, tasks) = cluster::Cluster::connect(
                &config.node_name,
                c,
                &pod_config,
                core.metrics.main.get(cluster::CertMetrics::new)?,
                lane,
                shutdown,
            )
            .await?;
            spawn_tasks(sup, tasks);
            Some(cluster)
        }
        None => None,
    };
    pod_config.seal();
    let desired = pod_config.store();
    Ok(Sources { pod_config, desired, objects, cluster })
}

/// Every standard pair made, stores before engines, none started: what the node reads of them
/// ([`Handles`]), the stats provider, the pairs themselves ([`StandardPairs`]) and what the eviction pair
/// is given of the pod pair's stores ([`PressureInputs`]).
pub(crate) struct Pairs {
    pub(crate) handles: Handles,
    pub(crate) stats: stats::StatsProvider,
    pub(crate) standard: StandardPairs,
    pub(crate) pressure_inputs: PressureInputs,
}

/// What status, cluster mode, the servers and the [`ExtensionContext`] read of the standard pairs.
pub(crate) struct Handles {
    pub(crate) storage: Storage,
    pub(crate) volumes: Volumes,
    pub(crate) pods: Pods,
}

/// Makes every standard pair's stores and handles, and each pair with what only it holds, in the order
/// they start ([`claim_stores`] at [`Stage::Claims`], [`volume_stores`], [`pod_stores`] at
/// [`Stage::Pods`]), and the stats provider over them; spawns nothing (the CSI plugin directory is
/// created).
pub(crate) fn make_pairs(core: &Core, runtime: &Runtime, sources: &Sources) -> Result<Pairs, StartError> {
    let (storage, claims) = claim_stores(core, runtime, sources).map_err(StartError::at(Stage::Claims))?;
    let (volumes, volume_pair) = volume_stores(core, runtime, sources, &storage);
    let (pods, sandboxes, pod_pair, pressure_inputs) =
        pod_stores(core, runtime, sources, &storage, &volumes).map_err(StartError::at(Stage::Pods))?;
    let stats = stats_provider(core, sources, &storage, &volumes);
    Ok(Pairs {
        handles: Handles { storage, volumes, pods },
        stats,
        standard: StandardPairs { claims, volumes: volume_pair, sandboxes, pods: pod_pair },
        pressure_inputs,
    })
}

/// What pods run on and read from: the CRI pod runtime, the objects of volumes, CSI plugins, claims.
pub(crate) struct Storage {
    pub(crate) node_objects: volumes::NodeObjects,
    pub(crate) pod_runtime: Arc<nodelet_cri::CriPodRuntime>,
    pub(crate) csi: Arc<nodelet_csi::Registry>,
    pub(crate) claim_view: ClaimView,
    pub(crate) claim_metrics: ClaimMetrics,
    pub(crate) claim_lookup: Arc<dyn ClaimLookup>,
    pub(crate) volume_metrics: VolumeMetrics,
}

/// The CRI pod runtime, the CSI plugin registry and its directory, the store of its drivers, and the claim
/// pair ([`builtin::claims::ClaimPair`]: it runs the registry's watcher, the drivers' store, the claim
/// engine and populator) with the claim view made from its engine builder's stores.
pub(crate) fn claim_stores(
    core: &Core,
    runtime: &Runtime,
    src: &Sources,
) -> Result<(Storage, builtin::claims::ClaimPair), StartCause> {
    let config = &core.config;
    // ConfigMaps, Secrets and tokens for volumes and environment variables.
    let node_objects =
        volumes::NodeObjects::new(src.objects.clone(), src.cluster.as_ref().map(|c| c.pod_data()))
            .with_api_runtime_classes(src.cluster.as_ref().map(cluster::Cluster::runtime_classes));
    let mut pod_runtime_config = nodelet_cri::CriPodRuntimeConfig::default();
    if let Some(c) = &src.cluster {
        // Service environment variables (none in standalone mode, as the kubelet without an API server).
        pod_runtime_config = pod_runtime_config.with_services(Arc::new(c.services()));
    }
    if let Some(api) = node_objects.api() {
        // API pods' variables read the API server's objects only (static pods': the manifests' only).
        pod_runtime_config = pod_runtime_config.with_api_objects(Arc::new(api));
    }
    let pod_runtime = Arc::new(nodelet_cri::CriPodRuntime::new(
        runtime.cri.clone(),
        pod_runtime_config
            .with_pod_log_root(&config.pods.pod_logs_dir)
            .with_cgroup_root(config.pods.cgroup_root.clone())
            .with_pod_pids_limit(config.pods.pod_pids_limit.and_then(|n| u64::try_from(n).ok()))
            .with_resolv_conf(config.pods.resolv_conf.clone())
            .with_cluster_dns(config.pods.cluster_dns.iter().map(ToString::to_string).collect())
            .with_cluster_domain(&config.pods.cluster_domain)
            .with_allow_privileged(config.pods.allow_privileged)
            .with_seccomp_default(config.pods.seccomp_default)
            // The embedded containerd runs with disable_apparmor: it could not apply a profile either.
            .with_apparmor_enabled(config.runtime.endpoint.is_some() && nodelet_cri::apparmor_enabled())
            .with_node_name(&config.node_name)
            .with_root_dir(&config.root_dir)
            .with_node_ips(runtime.facts.internal_ips())
            .with_allocatable(
                runtime
                    .facts
                    .allocatable
                    .iter()
                    .filter_map(|(k, q)| {
                        Some((k.clone(), nodelet_resources::quantity::Quantity::parse(&q.0)?))
                    })
                    .collect(),
            )
            .with_objects(Arc::new(node_objects.local()))
            .with_runtime_classes(Arc::new(node_objects.clone())),
    ));
    let volume_metrics = core.metrics.main.get(VolumeMetrics::new)?;
    // CSI node plugins register by socket in nodelet.storage.csi.pluginDir (<root-dir>/plugins_registry).
    let csi = Arc::new(nodelet_csi::Registry::new(
        &config.storage.csi_plugin_dir,
        nodelet_csi::CsiClientConfig::default(),
    ));
    std::fs::create_dir_all(&config.storage.csi_plugin_dir).map_err(|source| StartCause::CreateDir {
        what: format!("the CSI plugin directory {}", config.storage.csi_plugin_dir.display()),
        source,
    })?;
    // The registered CSI drivers as a store (written by `csi-drivers`, watched by the claim engine).
    let (csi_drivers, csi_drivers_writer) = reconcile_engine::store();

    // The claim pair: PersistentVolumes, claims and classes from the manifests, provisioners.
    let provisioners = claims::provisioners(config, &csi)?;
    let driver = claims::driver(config, provisioners.clone(), volume_metrics.operation_duration.clone());
    let provisioned = driver.provisioned();
    let reconciler = ClaimReconciler::new(claims::node_info(config, &csi_drivers), provisioners);
    let (claims_desired, claims_writer) = reconcile_engine::store();
    let builder = Engine::builder("claims", reconciler.clone(), Arc::new(driver), claims_desired.clone());
    let claim_view = ClaimView::new(claims_desired.clone(), builder.actual(), reconciler)
        .with_failures(builder.op_status());
    let claim_metrics = core.metrics.main.get(ClaimMetrics::new)?;
    let mut claim_lookup: Arc<dyn ClaimLookup> = Arc::new(claim_view.clone());
    if let Some(c) = &src.cluster {
        // API pods' claims come from the API server, bound by the control plane.
        claim_lookup =
            Arc::new(cluster::podobjects::ClusterClaims { api: c.pod_data(), local: claim_lookup });
    }
    let pair = builtin::claims::ClaimPair::new(
        csi.clone(),
        (csi_drivers, csi_drivers_writer),
        builder,
        (claims_desired, claims_writer),
        claims::objects(src.objects.clone()),
        provisioned,
    );
    let storage =
        Storage { node_objects, pod_runtime, csi, claim_view, claim_metrics, claim_lookup, volume_metrics };
    Ok((storage, pair))
}

/// The volume pair's stores and what the servers and cluster mode read of it.
pub(crate) struct Volumes {
    pub(crate) desired: Store<VolumeKey, DesiredVolume>,
    pub(crate) actual: Store<VolumeKey, VolumeActual>,
    failures: Store<
        VolumeKey,
        reconcile_engine::OpStatus<
            nodelet_resources::volume::ops::VolumeOp,
            nodelet_resources::volume::driver::VolumeError,
        >,
    >,
    metrics: VolumeMetrics,
    /// Populates the volumes again (cluster mode: the API objects changed).
    pub(crate) refresh: tokio::sync::watch::Sender<()>,
}

impl Volumes {
    /// What the servers show of the volumes.
    pub(crate) fn view(&self) -> node::VolumeView {
        node::VolumeView {
            desired: self.desired.clone(),
            actual: self.actual.clone(),
            failures: self.failures.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The volume pair's stores (the desired store, its engine builder's actual and operation status
/// stores) and the pair ([`builtin::volumes::VolumePair`]: it runs the volume engine, its observer
/// `volume-watch`, the populator and `claim-volume-stats`).
pub(crate) fn volume_stores(
    core: &Core,
    runtime: &Runtime,
    src: &Sources,
    storage: &Storage,
) -> (Volumes, builtin::volumes::VolumePair) {
    let config = &core.config;
    let (desired, writer) = reconcile_engine::store();
    let builder = Engine::builder(
        "volumes",
        VolumeReconciler::new(&config.root_dir),
        Arc::new(VolumeDriver::new(
            Arc::new(volumes::NodeVolumes::new(
                &config.root_dir,
                storage.csi.clone(),
                runtime::allocatable_memory(&runtime.facts),
                config.pods.allowed_host_paths.clone(),
                core.host == Host::Hollow,
            )),
            storage.volume_metrics.clone(),
        )),
        desired.clone(),
    );
    let (actual, failures) = (builder.actual(), builder.op_status());
    // Re-populate when the objects (ConfigMaps, Secrets) or the claims' bindings change.
    let (refresh_tx, refresh) = tokio::sync::watch::channel(());
    let pair = builtin::volumes::VolumePair::new(
        builder,
        (desired.clone(), writer),
        builtin::volumes::VolumeSources {
            renderer: volumes::ManifestRenderer::new(storage.node_objects.clone()),
            claim_lookup: storage.claim_lookup.clone(),
            claims: storage.claim_view.clone(),
            objects: src.objects.clone(),
            refresh: (refresh_tx.clone(), refresh),
            tokens_issued: src.cluster.as_ref().map(|c| c.pod_data().tokens_issued()),
        },
        builtin::volumes::ClaimVolumeStats {
            csi: storage.csi.clone(),
            metrics: storage.claim_metrics.clone(),
            period: config.storage.volume_stats_agg_period,
        },
    );
    let metrics = storage.volume_metrics.clone();
    (Volumes { desired, actual, failures, metrics, refresh: refresh_tx }, pair)
}

/// The pod and sandbox pairs' stores and what the servers and later pairs read of them.
pub(crate) struct Pods {
    pub(crate) actual: Store<PodUid, PodActual>,
    pub(crate) failures: Store<PodUid, nodelet_resources::pod::status::PodOpStatus>,
    pub(crate) probes: ProbeResults,
    /// The node's verdicts on its pods (admitted, refused, evicted).
    pub(crate) verdicts: Store<PodUid, Verdict>,
    /// What the servers read of the sandbox pair.
    pub(crate) sandboxes: SandboxView,
    /// The sandbox pair's operation status (a side input of the pod reconciler and of pod status).
    pub(crate) sandbox_failures: Store<PodUid, SandboxOpStatus>,
    /// The pod engine's reconciler (a copy, for status).
    pub(crate) reconciler: PodReconciler,
    /// The pod engine's side inputs ([`builtin::pods::PodPair::status_inputs`]), for status; taken once.
    pub(crate) status_inputs: nodelet_resources::pod::reconciler::PodInputs,
}

/// What the eviction pair ([`builtin::eviction::EvictionPair`]) is given, made with the pod pair's stores:
/// the verdict store's writer and admission (the verdict populator runs there).
pub(crate) struct PressureInputs {
    verdict_writer: reconcile_engine::Writer<PodUid, Verdict>,
    admission: nodelet_resources::eviction::verdict::Admission,
}

/// The pod pair's stores: the verdict store, the pod engine's builder (its actual and operation status
/// stores), the prober's results, container GC's surplus store; the sandbox pair, built over them
/// ([`SandboxPair::new`]: its engine watches the pod actual store), with the observer the PLEG reports
/// sandboxes through; the pod reconciler's side inputs ([`builtin::pods::PodSideInputs`]) and their value
/// for status. Returns the pairs ([`builtin::sandboxes::Sandboxes`], [`builtin::pods::PodPair`]) and what
/// the eviction pair is given.
pub(crate) fn pod_stores(
    core: &Core,
    runtime: &Runtime,
    src: &Sources,
    storage: &Storage,
    vols: &Volumes,
) -> Result<(Pods, builtin::sandboxes::Sandboxes, builtin::pods::PodPair, PressureInputs), StartCause> {
    let config = &core.config;
    let desired = &src.desired;
    let pod_metrics = core.metrics.main.get(PodMetrics::new)?;
    let crash_loop = CrashLoopBackOff {
        initial: config.backoff.container_restart.initial,
        max: config.backoff.container_restart.max,
        reset_after: config.backoff.container_restart.reset_after,
    };
    let clock = core.clock.clone();
    // The prober: runs the probes of running containers; the pod reconciler and status read its results.
    let prober = nodelet_resources::probe::worker::Prober::new(
        Arc::new(storage.pod_runtime.prober().clone()),
        desired.clone(),
        core.metrics.probes.get(nodelet_resources::probe::metrics::ProbeMetrics::new)?,
        clock.clone(),
    );
    let probes = prober.results();
    // The node's verdicts on its pods (admitted, refused, evicted): written only by the verdict
    // populator that the eviction pair runs; read by the pod and sandbox reconcilers, the volume
    // populator, status.
    let (verdicts, verdict_writer) = reconcile_engine::store();
    let admission = pressure::admission(config, &runtime.facts, Arc::new(storage.node_objects.clone()));
    let pod_backoff = BackoffConfig::default()
        .with_initial(config.backoff.image_pull.initial)
        .with_max(config.backoff.image_pull.max);
    // The pod engine's builder first: the sandbox pair and container GC read its actual store, and it
    // watches theirs.
    let reconciler =
        PodReconciler::new(crash_loop).with_probes(probes.clone()).with_container_gc(config.container_gc);
    let builder = Engine::builder(
        "pods",
        reconciler.clone(),
        Arc::new(
            PodDriver::new(storage.pod_runtime.clone(), pod_metrics.clone())
                .with_grace_cap(config.pods.grace_cap()),
        ),
        desired.clone(),
    );
    let actual = builder.actual();
    let failures = builder.op_status();
    // Container GC: dead containers pruned by the pod pair, dead sandboxes by the sandbox pair
    // (kubelet's container GC); the node-wide cap (maxContainers) decided over all pods by the
    // surplus populator (`container-gc`).
    let (surplus, surplus_populator, container_reclaimer) = nodelet_resources::pod::gc::container_gc(
        config.container_gc,
        desired.clone(),
        actual.clone(),
        clock.clone(),
    );
    // The sandbox pair (sandboxes and their network): it watches the pod actual store, the verdicts
    // and the pods' volumes.
    let mut sandbox_pair = SandboxPair::new(
        storage.pod_runtime.clone(),
        actual.clone(),
        core.metrics.main.get(SandboxMetrics::new)?,
        Some(&core.engine_metrics),
        SandboxPairConfig {
            backoff: pod_backoff.clone(),
            resync_period: Some(config.sync_frequency),
            creations_at_once: None,
            verdicts: Some(verdicts.clone()),
            volumes: Some((vols.desired.clone(), vols.actual.clone())),
        },
    );
    let sandboxes = sandbox_pair.view();
    let sandbox_failures = sandbox_pair.op_status();
    // The PLEG lists sandboxes too, and reports them to the sandbox pair's actual store.
    let sandbox_observer = sandbox_pair.observer();
    let side_inputs = builtin::pods::PodSideInputs {
        failures: failures.clone(),
        verdicts: verdicts.clone(),
        volumes_desired: vols.desired.clone(),
        volumes_actual: vols.actual.clone(),
        sandboxes: sandbox_pair.actual(),
        sandbox_failures: sandbox_failures.clone(),
        surplus,
        probes: probes.clone(),
    };
    let pod_pair = builtin::pods::PodPair::new(builtin::pods::PodPairParts {
        builder,
        side_inputs,
        prober,
        container_gc: builtin::pods::ContainerGc {
            populator: surplus_populator,
            reclaimer: container_reclaimer,
        },
        pod_runtime: storage.pod_runtime.clone(),
        pod_metrics,
        sandbox_observer,
        settings: builtin::pods::PodSettings {
            backoff: pod_backoff,
            resync_period: config.sync_frequency,
            relist_period: config.pleg_relist_period,
            evented_relist_period: config.pleg_evented_relist_period,
            container_logs: config.container_logs,
        },
    });
    let pods = Pods {
        actual,
        failures,
        probes,
        verdicts,
        sandboxes,
        sandbox_failures,
        reconciler,
        status_inputs: pod_pair.status_inputs(),
    };
    let pressure_inputs = PressureInputs { verdict_writer, admission };
    Ok((pods, builtin::sandboxes::Sandboxes::new(sandbox_pair), pod_pair, pressure_inputs))
}

/// Node, pod and container statistics (/stats/summary, /metrics/resource, eviction signals) over the CRI
/// pod runtime, the desired pods and the volume actual store; [`start_stats`] runs its tasks.
pub(crate) fn stats_provider(
    core: &Core,
    src: &Sources,
    storage: &Storage,
    vols: &Volumes,
) -> stats::StatsProvider {
    let config = &core.config;
    stats::StatsProvider::new(
        storage.pod_runtime.clone(),
        stats::StatsConfig::new(&config.node_name, &config.root_dir, &config.pods.pod_logs_dir),
        system_clock(),
    )
    .with_volumes(src.desired.clone(), vols.actual.clone())
    .with_housekeeping_interval(config.housekeeping_interval)
    // The containers' writable layers are disk usage, measured as often as the volumes'.
    .with_container_fs_interval(config.storage.volume_stats_agg_period)
}

/// The stats' tasks `stats-housekeeping` and `volume-stats` (the pods' volumes measured every
/// `volumeStatsAggPeriod`), both restartable.
pub(crate) fn start_stats(core: &Core, stats: &stats::StatsProvider) {
    let config = &core.config;
    let (provider, stop) = (stats.clone(), core.shutdown.clone());
    core.supervisor
        .spawn_restartable("stats-housekeeping", move || provider.clone().housekeeping(stop.clone()));
    let (provider, stop, period) =
        (stats.clone(), core.shutdown.clone(), config.storage.volume_stats_agg_period);
    core.supervisor.spawn_restartable("volume-stats", move || {
        provider.clone().measure_volumes_every(period, stop.clone())
    });
}

/// Cluster mode: the Node object, its Lease, pod status, mirror pods, events (tasks named in
/// [`cluster::Cluster::tasks`]).
fn start_cluster(
    core: &Core,
    cluster: cluster::Cluster,
    node: Arc<node::Node>,
    runtime: &Runtime,
    sources: &Sources,
    handles: &Handles,
) {
    let Some(c) = &core.config.cluster else { return };
    let Handles { storage, volumes, pods } = handles;
    let tasks = cluster.tasks(
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
        volumes.refresh.clone(),
        &core.shutdown,
    );
    spawn_tasks(&core.supervisor, tasks);
}

/// The HTTP servers: main, read-only and healthz ports (task `servers`).
async fn start_servers(
    core: &Core,
    node: Arc<node::Node>,
    kube_client: Option<kube::Client>,
    serving_cert: Option<server::ServingCertHandle>,
    runtime: &Runtime,
    extensions: extension::StatusTables,
) -> Result<(), StartCause> {
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
    let servers = server::Servers::bind(&server_config, node).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ThresholdValue;
    use nodelet_resources::model::pressure::{ReclaimError, Reclaimer, Signal};

    fn config(root_dir: &std::path::Path) -> config::Config {
        let mut config = config::Config::resolve(
            &crate::cli::RunArgs { hostname_override: Some("n".into()), ..Default::default() },
            None,
            &config::HostFacts::detect(),
        )
        .expect("defaults")
        .config;
        config.root_dir = root_dir.to_path_buf();
        config
    }

    /// The extension context over empty stores, a CRI client of a socket nobody serves (and stats read
    /// through it), and `core`'s supervisor, clock, events and reclaimers.
    fn context(core: &Core) -> ExtensionContext {
        let cri = nodelet_cri::CriClient::connect_lazy(nodelet_cri::CriConfig::new(format!(
            "unix://{}",
            core.config.root_dir.join("nobody.sock").display()
        )))
        .expect("client");
        let stats = stats::StatsProvider::new(
            Arc::new(nodelet_cri::CriPodRuntime::new(
                cri.clone(),
                nodelet_cri::CriPodRuntimeConfig::default(),
            )),
            stats::StatsConfig::new(
                &core.config.node_name,
                &core.config.root_dir,
                &core.config.pods.pod_logs_dir,
            ),
            system_clock(),
        );
        ExtensionContext {
            node_name: core.config.node_name.clone(),
            root_dir: core.config.root_dir.clone(),
            pods_desired: reconcile_engine::store().0,
            pods_actual: reconcile_engine::store().0,
            sandboxes_actual: reconcile_engine::store().0,
            verdicts: reconcile_engine::store().0,
            volumes_desired: reconcile_engine::store().0,
            volumes_actual: reconcile_engine::store().0,
            pressure: PressureView::new(0),
            stats,
            engine_metrics: core.engine_metrics.clone(),
            metrics: core.metrics.main.clone(),
            supervisor: core.supervisor.clone(),
            cri,
            events: core.events.clone(),
            clock: core.clock.clone(),
            reclaimers: core.reclaimers.clone(),
        }
    }

    #[tokio::test]
    async fn the_image_and_eviction_pairs_start_through_extension_start_with_their_tasks_and_no_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = Core::new(Arc::new(config(dir.path())), Host::Real).expect("core");
        let pressure = PressureInputs {
            verdict_writer: reconcile_engine::store().1,
            admission: nodelet_resources::eviction::verdict::Admission::new(),
        };
        let builtins = builtin_extensions(&core.config, pressure, core.host);
        let order: Vec<(&str, Stage)> = builtins.iter().map(|b| (b.extension.name(), b.stage)).collect();
        assert_eq!(order, [("images", Stage::Pressure), ("eviction", Stage::Pressure)]);
        let mut tables = StatusTables::default();
        start_builtins(&context(&core), &mut tables, builtins).expect("started");
        assert_eq!(
            core.supervisor.task_names(),
            [
                "image-populator",
                "image-engine",
                "local-storage-measure",
                "verdict-populator",
                "eviction-engine",
                "eviction-sampler"
            ]
        );
        assert_eq!(
            format!("{:?}", core.reclaimers),
            r#"["image-gc"]"#,
            "the eviction pair's image reclaimer"
        );
        assert!(tables.is_empty(), "no /extensions/images or /extensions/eviction: {tables:?}");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&core.metrics.main.registry().gather())
            .expect("text");
        assert!(text.contains("reconciler=\"images\""), "the engine reports as before: {text}");
        assert!(text.contains("reconciler=\"eviction\""), "the engine reports as before: {text}");
        core.shutdown.cancel();
        core.supervisor.join().await;
    }

    #[tokio::test]
    async fn a_hollow_nodes_eviction_pair_measures_no_local_storage_of_the_machine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = Core::new(Arc::new(config(dir.path())), Host::Hollow).expect("core");
        let pressure = PressureInputs {
            verdict_writer: reconcile_engine::store().1,
            admission: nodelet_resources::eviction::verdict::Admission::new(),
        };
        let builtins = builtin_extensions(&core.config, pressure, core.host);
        start_builtins(&context(&core), &mut StatusTables::default(), builtins).expect("started");
        assert_eq!(
            core.supervisor.task_names(),
            ["image-populator", "image-engine", "verdict-populator", "eviction-engine", "eviction-sampler"]
        );
        core.shutdown.cancel();
        core.supervisor.join().await;
    }

    #[tokio::test]
    async fn a_builtin_that_fails_to_start_fails_its_stage_with_its_message_and_stops_the_start() {
        struct Broken;
        impl Extension for Broken {
            fn name(&self) -> &str {
                "broken"
            }
            fn start(
                self: Box<Self>,
                _: &ExtensionContext,
            ) -> Result<Option<Arc<dyn extension::StatusTable>>, BoxError> {
                Err(Box::new(prometheus::Error::AlreadyReg))
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let core = Core::new(Arc::new(config(dir.path())), Host::Hollow).expect("core");
        for stage in [Stage::Claims, Stage::Volumes, Stage::Pods, Stage::Pressure] {
            let builtins = vec![
                Builtin::new(stage, Broken),
                Builtin::new(Stage::Pressure, builtin::images::ImageGc::new(&core.config)),
            ];
            let e =
                start_builtins(&context(&core), &mut StatusTables::default(), builtins).expect_err("broken");
            assert_eq!(e.stage(), stage);
            assert_eq!(
                e.to_string(),
                prometheus::Error::AlreadyReg.to_string(),
                "as the {stage} stage said it"
            );
        }
        assert!(core.supervisor.task_names().is_empty(), "nothing after the broken pair started");
    }

    /// A third party's extension: the tasks started before it, and a reclaimer that records the signals it
    /// is asked to reclaim for.
    struct Recorder {
        started_after: Arc<std::sync::Mutex<Vec<String>>>,
        calls: Arc<std::sync::Mutex<Vec<Signal>>>,
    }

    struct RecordingReclaimer(Arc<std::sync::Mutex<Vec<Signal>>>);

    impl Reclaimer for RecordingReclaimer {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn reclaim(
            &self,
            signal: Signal,
            _: u64,
        ) -> futures::future::BoxFuture<'_, Result<u64, ReclaimError>> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(signal);
            Box::pin(std::future::ready(Ok(0)))
        }
    }

    impl Extension for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }
        fn start(
            self: Box<Self>,
            ctx: &ExtensionContext,
        ) -> Result<Option<Arc<dyn extension::StatusTable>>, BoxError> {
            *self.started_after.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                ctx.supervisor().task_names();
            ctx.reclaimers().add(Arc::new(RecordingReclaimer(self.calls.clone())));
            Ok(None)
        }
    }

    /// The tasks of the runtime and the claim, volume, sandbox and pod pairs of a standalone hollow node (no
    /// sources, no runtime events), in start order: each pair's own in a row (the prober, the pod pair's,
    /// after the sandbox pair's, since the pairs start as extensions).
    const PAIR_TASKS: &[&str] = &[
        "runtime-health",
        "csi-plugin-watcher",
        "csi-drivers",
        "claim-populator",
        "claim-engine",
        "volume-watch",
        "volume-refresh",
        "volume-populator",
        "claim-volume-stats",
        "volume-engine",
        "sandbox-engine",
        "sandbox-populator",
        "prober",
        "container-gc",
        "log-rotation",
        "runtime-events",
        "pleg",
        "pod-engine",
    ];

    /// The tasks after [`PAIR_TASKS`] of a standalone node (no sources, no servers) on a real host, in
    /// start order: the stats', then the image pair's two before the eviction pair's, as when
    /// `pressure::start` built them.
    const PRESSURE_TASKS: &[&str] = &[
        "stats-housekeeping",
        "volume-stats",
        "image-populator",
        "image-engine",
        "local-storage-measure",
        "verdict-populator",
        "eviction-engine",
        "eviction-sampler",
    ];

    /// A standalone hollow node's configuration (no sources, no servers) under `dir`, over a fake runtime
    /// served there until the returned token is cancelled; and the runtime's endpoint.
    fn hollow_node(dir: &std::path::Path) -> (config::Config, String, CancellationToken) {
        let root = dir.join("root");
        let socket = dir.join("cri.sock");
        std::fs::create_dir_all(&root).expect("root");
        let fake = crate::hollow::fake_cri::FakeCri::new(0, &root);
        let runtime_stop = CancellationToken::new();
        let (stop, path) = (runtime_stop.clone(), socket.clone());
        tokio::spawn(async move { fake.serve(&path, stop).await.expect("serve") });
        let endpoint = format!("unix://{}", socket.display());
        let args = crate::cli::RunArgs {
            hostname_override: Some("n".into()),
            root_dir: Some(root.clone()),
            container_runtime_endpoint: Some(endpoint.clone()),
            ..Default::default()
        };
        let mut config =
            config::Config::resolve(&args, None, &config::HostFacts::detect()).expect("config").config;
        config.server.enabled = false;
        config.pods.cgroup_root = None;
        config.pods.pod_logs_dir = root.join("logs");
        (config, endpoint, runtime_stop)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_claim_volume_sandbox_and_pod_pairs_start_through_extension_start_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (config, endpoint, runtime_stop) = hollow_node(dir.path());
        let core = Core::new(Arc::new(config), Host::Hollow).expect("core");
        let runtime = start_runtime(&core, &endpoint).await.expect("runtime");
        let sources = start_sources(&core).await.expect("sources");
        let Pairs { handles, stats, standard, .. } = make_pairs(&core, &runtime, &sources).expect("made");
        assert_eq!(core.supervisor.task_names(), ["runtime-health"], "making the pairs runs nothing");
        let builtins = standard.in_start_order();
        let order: Vec<(&str, Stage)> = builtins.iter().map(|b| (b.extension.name(), b.stage)).collect();
        assert_eq!(
            order,
            [
                ("claims", Stage::Claims),
                ("volumes", Stage::Volumes),
                ("sandboxes", Stage::Pods),
                ("pods", Stage::Pods)
            ]
        );
        let ctx = super::context(&core, &runtime, &sources, &handles, &stats);
        let mut tables = StatusTables::default();
        start_builtins(&ctx, &mut tables, builtins).expect("started");
        assert_eq!(core.supervisor.task_names(), PAIR_TASKS, "each pair's tasks, in start order");
        assert_eq!(
            format!("{:?}", core.reclaimers),
            r#"["container-gc"]"#,
            "the pod pair's, through the context"
        );
        assert!(tables.is_empty(), "no /extensions/ table of a standard pair: {tables:?}");
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&core.metrics.main.registry().gather())
            .expect("text");
        for engine in ["claims", "volumes", "sandboxes", "pods"] {
            assert!(text.contains(&format!("reconciler=\"{engine}\"")), "{engine} reports as before: {text}");
        }
        core.shutdown.cancel();
        core.supervisor.join().await;
        runtime_stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_image_pair_starts_before_the_eviction_pair_which_tries_a_third_partys_reclaimer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut config, endpoint, runtime_stop) = hollow_node(dir.path());
        // Disk pressure at once: less than all of the root directory's filesystem is free.
        config.eviction.hard = vec![config::EvictionThreshold {
            signal: "nodefs.available".into(),
            value: ThresholdValue::Percentage(100.0),
        }];
        config.eviction.monitoring_period = std::time::Duration::from_millis(100);
        // A real host (over the fake runtime): a hollow one measures no signal.
        let core = Core::new(Arc::new(config), Host::Real).expect("core");
        let recorder = Recorder { started_after: Arc::default(), calls: Arc::default() };
        let (started_after, calls) = (recorder.started_after.clone(), recorder.calls.clone());
        assemble(&core, &endpoint, vec![Box::new(recorder)]).await.expect("started");

        let names = core.supervisor.task_names();
        let all: Vec<&str> = PAIR_TASKS.iter().chain(PRESSURE_TASKS).copied().collect();
        assert_eq!(names, all, "the node's tasks, in start order");
        let before: Vec<String> =
            started_after.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        assert_eq!(before, names, "the third party starts after every standard pair");
        assert_eq!(
            format!("{:?}", core.reclaimers),
            r#"["container-gc", "image-gc", "recorder"]"#,
            "container GC, the image pair's, then the third party's"
        );
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let seen = calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            if seen.contains(&Signal::NodeFsAvailable) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the third party's reclaimer was never tried");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let reasons: Vec<String> = core.events.list().into_iter().map(|e| e.reason).collect();
        assert!(reasons.iter().any(|r| r == "EvictionThresholdMet"), "the node's event log: {reasons:?}");
        core.shutdown.cancel();
        core.supervisor.join().await;
        runtime_stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hollow_nodes_of_one_process_start_on_one_set_of_metrics_and_record_into_it() {
        let metrics = NodeFamilies::default();
        let mut nodes = Vec::new();
        for i in 0..2 {
            let dir = tempfile::tempdir().expect("tempdir");
            let (config, endpoint, runtime_stop) = hollow_node(dir.path());
            let core = Core::with_metrics(Arc::new(config), Host::Hollow, metrics.clone()).expect("core");
            // A metric registered outside the families would fail the second node with AlreadyReg.
            assemble(&core, &endpoint, Vec::new()).await.unwrap_or_else(|e| panic!("node {i}: {e}"));
            nodes.push((dir, core, runtime_stop));
        }
        let text =
            prometheus::TextEncoder::new().encode_to_string(&metrics.main.registry().gather()).expect("text");
        for family in
            ["kubelet_runtime_operations_total", "kubelet_evictions_total", "nodelet_task_restarts_total"]
        {
            assert_eq!(text.matches(&format!("# TYPE {family} ")).count(), 1, "{family}: {text}");
        }
        assert!(text.contains("reconciler=\"pods\""), "{text}");
        // Each node's `runtime-health` asks its runtime for its status at once: both calls in one counter.
        let statuses = || {
            let text = prometheus::TextEncoder::new()
                .encode_to_string(&metrics.main.registry().gather())
                .expect("text");
            text.lines()
                .find_map(|l| l.strip_prefix("kubelet_runtime_operations_total{operation_type=\"status\"} "))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while statuses() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "status calls counted: {}", statuses());
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for (_dir, core, runtime_stop) in nodes {
            core.shutdown.cancel();
            core.supervisor.join().await;
            runtime_stop.cancel();
        }
    }

    #[tokio::test]
    async fn a_root_directory_that_cannot_be_made_fails_the_setup_stage_with_its_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").expect("file");
        let root = file.join("root");
        let outcome = run(Arc::new(config(&root)), Vec::new(), std::future::pending()).await;
        let Err(Error::Start(e)) = outcome else { panic!("started under a file: {outcome:?}") };
        assert_eq!(e.stage(), Stage::Setup);
        let message = e.to_string();
        assert!(
            message.starts_with(&format!("cannot create the root directory {}: ", root.display())),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_runtime_endpoint_that_is_not_a_unix_socket_fails_the_runtime_stage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(dir.path());
        config.runtime.endpoint = Some("tcp://127.0.0.1:1".into());
        let outcome = run(Arc::new(config), Vec::new(), std::future::pending()).await;
        let Err(Error::Start(e)) = outcome else { panic!("started on a TCP endpoint: {outcome:?}") };
        assert_eq!(e.stage(), Stage::Runtime);
        assert!(e.to_string().starts_with("bad container runtime endpoint tcp://127.0.0.1:1: "), "{e}");
    }
}
