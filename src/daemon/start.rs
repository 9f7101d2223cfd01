//! The start functions of the standard pairs and concerns, in the order the daemon calls them. Each takes
//! the [`Core`] (configuration, shutdown, supervisor, registries) and the handles of the earlier ones, starts
//! its tasks on the supervisor, and returns the handles the later ones need.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use nodelet_resources::common::clock::{Clock, system_clock};
use nodelet_resources::common::task::{Lifetime, NamedTask};
use nodelet_resources::model::actual::PodActual;
use nodelet_resources::model::pod::{DesiredPod, PodUid};
use nodelet_resources::model::verdict::Verdict;
use nodelet_resources::model::volumes::ClaimLookup;
use nodelet_resources::pod::driver::PodDriver;
use nodelet_resources::pod::gc::Surplus;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::pleg::{Pleg, PlegWaker};
use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodReconciler};
use nodelet_resources::probe::results::ProbeResults;
use nodelet_resources::sandbox::metrics::SandboxMetrics;
use nodelet_resources::sandbox::pair::{SandboxPair, SandboxPairConfig};
use nodelet_resources::sandbox::status::{SandboxOpStatus, SandboxView, pod_of_sandboxes};
use nodelet_resources::volume::actual::VolumeActual;
use nodelet_resources::volume::desired::{DesiredVolume, VolumeKey};
use nodelet_resources::volume::driver::VolumeDriver;
use nodelet_resources::volume::metrics::VolumeMetrics;
use nodelet_resources::volume::populator::Populator;
use nodelet_resources::volume::reconciler::VolumeReconciler;
use reconcile_engine::{BackoffConfig, Engine, Metrics, Store};
use tokio_util::sync::CancellationToken;

use super::supervisor::{Policy, Supervisor};
use nodelet_node::containerd::EmbeddedContainerdConfig;
use nodelet_node::{log_rotation, node_facts};

use crate::{claims, cluster, config, node, pressure};
use crate::{sources, stats, volumes};

/// What the node's volumes are made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// This machine: memory-backed volumes are tmpfs mounts, local volumes and confined hostPaths binds.
    Real,
    /// A hollow node (`nodelet hollow`): memory-backed volumes are plain directories, as kubemark's fake
    /// mounter leaves them; everything else is as on a real node.
    Hollow,
}

/// What every start function shares.
pub(crate) struct Core {
    pub(crate) config: Arc<config::Config>,
    /// Where the node's volumes are made.
    pub(crate) host: Host,
    pub(crate) shutdown: CancellationToken,
    pub(crate) supervisor: Supervisor,
    /// `/metrics`.
    pub(crate) registry: prometheus::Registry,
    /// `/metrics/probes`: the prober's metrics are served apart, as the kubelet does.
    pub(crate) probe_registry: prometheus::Registry,
    /// The engine metrics every engine reports to, each under its own `reconciler` label.
    pub(crate) engine_metrics: Metrics,
}

impl Core {
    pub(crate) fn new(config: Arc<config::Config>, host: Host) -> anyhow::Result<Self> {
        let registry = prometheus::Registry::new();
        let shutdown = CancellationToken::new();
        Ok(Core {
            supervisor: Supervisor::new(shutdown.clone(), &registry)?,
            engine_metrics: Metrics::new(&registry)?,
            probe_registry: prometheus::Registry::new(),
            registry,
            shutdown,
            config,
            host,
        })
    }
}

/// The container runtime, ready.
pub(crate) struct Runtime {
    pub(crate) cri: nodelet_cri::CriClient,
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) facts: Arc<node_facts::NodeFacts>,
}

/// Connects to the runtime at `endpoint`, preloads images, waits until it is ready, and keeps checking
/// its health for `/healthz` (task `runtime-health`, restartable).
pub(crate) async fn start_runtime(core: &Core, endpoint: &str) -> anyhow::Result<Runtime> {
    let config = &core.config;
    let cri = nodelet_cri::CriClient::connect_lazy(
        nodelet_cri::CriConfig::new(endpoint).with_runtime_request_timeout(config.runtime.request_timeout),
    )
    .with_context(|| format!("bad container runtime endpoint {endpoint}"))?;
    // Wait for the runtime before planning anything: reconstruction needs it.
    let ready = Arc::new(AtomicBool::new(false));
    wait_for_runtime(&cri, &ready).await;
    if let (Some(dir), true) = (&config.runtime.preload_images, config.runtime.endpoint.is_some()) {
        // `ctr images import` speaks containerd's own API: another runtime is refused with a clear error.
        let version = cri.version().await.context("CRI Version (to preload images)")?;
        if version.runtime_name != "containerd" {
            anyhow::bail!(
                "--preload-images imports with containerd's `ctr images import`, but the runtime at {endpoint} \
                 is {} {}: load the images with that runtime's own tools instead",
                version.runtime_name,
                version.runtime_version
            );
        }
        let socket = endpoint.trim_start_matches("unix://");
        let imported =
            nodelet_node::containerd::import_images(std::path::Path::new("ctr"), socket.as_ref(), dir)
                .await?;
        tracing::info!(images = imported.len(), dir = %dir.display(), "preloaded images");
    }
    // What the Node object shows of this machine: read once.
    let facts = Arc::new(node_facts::NodeFacts::detect(
        &facts_config(config),
        node_facts::runtime_version(&cri).await,
    ));
    // kubelet_runtime_operations_{total,errors_total,duration_seconds}, counted in every clone of `cri`.
    cri.set_metrics(nodelet_cri::CriMetrics::new(&core.registry)?);

    let (health_cri, health_ready, stop) = (cri.clone(), ready.clone(), core.shutdown.clone());
    core.supervisor.spawn_restartable("runtime-health", move || {
        runtime_health(health_cri.clone(), health_ready.clone(), stop.clone())
    });
    Ok(Runtime { cri, ready, facts })
}

/// What of the configuration the node's facts ([`node_facts::NodeFacts::detect`]) depend on.
fn facts_config(config: &config::Config) -> node_facts::FactsConfig {
    node_facts::FactsConfig {
        root_dir: config.root_dir.clone(),
        node_name: config.node_name.clone(),
        max_pods: config.pods.max_pods,
        hard_eviction: config
            .eviction
            .hard
            .iter()
            .map(|t| node_facts::EvictionThreshold {
                signal: t.signal.clone(),
                value: pressure::amount(&t.value),
            })
            .collect(),
        address: config.server.address,
        node_ips: config.cluster.as_ref().map(|c| c.node_ips.clone()).unwrap_or_default(),
        kubelet_port: config.server.port,
        local_storage_capacity_isolation: config.eviction.local_storage_capacity_isolation,
    }
}

/// The embedded containerd's settings the configuration asks for.
pub(crate) fn embedded_containerd_config(config: &config::Config) -> EmbeddedContainerdConfig {
    let mut c = EmbeddedContainerdConfig::new(&config.root_dir, &config.runtime.pod_infra_container_image);
    let e = &config.runtime.embedded;
    c.containerd_path = e.containerd_path.clone();
    c.config_extra = e.config_extra.clone();
    if let Some(net) = c.cni_network.as_mut() {
        net.bridge = e.cni_bridge.clone();
        net.subnet = e.pod_cidr;
    }
    c.preload_images = config.runtime.preload_images.clone();
    c
}

/// Runtime health for /healthz, every 5 s.
async fn runtime_health(cri: nodelet_cri::CriClient, ready: Arc<AtomicBool>, stop: CancellationToken) {
    loop {
        let ok = matches!(cri.status().await, Ok(s) if s.is_ready());
        if ready.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                tracing::info!("container runtime is ready");
            } else {
                tracing::warn!("container runtime is not ready");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
        }
    }
}

/// Waits until the runtime answers `Status` with RuntimeReady (logging while it does not).
async fn wait_for_runtime(cri: &nodelet_cri::CriClient, ready: &AtomicBool) {
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        match cri.status().await {
            Ok(status) if status.is_ready() => {
                ready.store(true, Ordering::Relaxed);
                return;
            }
            Ok(status) => {
                tracing::warn!(reason = ?status.not_ready_reason(), "container runtime not ready yet")
            }
            Err(e) => tracing::warn!(error = %e, "container runtime not reachable yet"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(5));
    }
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
pub(crate) async fn start_sources(core: &Core) -> anyhow::Result<Sources> {
    let (config, sup, shutdown) = (&core.config, &core.supervisor, &core.shutdown);
    // Ephemeral containers `nodelet debug` added to static pods, kept across restarts.
    let debug_dir = config.root_dir.join("debug");
    let debug_state = sources::debug::DebugState::load(&debug_dir).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the ephemeral containers of static pods cannot be read; starting without them");
        sources::debug::DebugState::empty(&debug_dir)
    });
    let pod_config = sources::PodConfig::new(config.node_name.clone())
        .with_debug_state(debug_state)
        .with_security(config.security_policies())
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
            .with_context(|| format!("cannot create {}", checkpoint_dir.display()))?;
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
            Some(cluster::Cluster::connect(&config.node_name, c, &pod_config, &core.registry, sup).await?)
        }
        None => None,
    };
    pod_config.seal();
    let desired = pod_config.store();
    Ok(Sources { pod_config, desired, objects, cluster })
}

/// What pods run on and read from: the CRI pod runtime, the objects of volumes, CSI plugins, claims.
pub(crate) struct Storage {
    pub(crate) node_objects: volumes::NodeObjects,
    pub(crate) pod_runtime: Arc<nodelet_cri::CriPodRuntime>,
    pub(crate) csi: Arc<nodelet_csi::Registry>,
    pub(crate) claim_view: nodelet_resources::claim::status::ClaimView,
    pub(crate) claim_metrics: nodelet_resources::claim::metrics::ClaimMetrics,
    pub(crate) claim_lookup: Arc<dyn ClaimLookup>,
    pub(crate) volume_metrics: VolumeMetrics,
}

/// The CRI pod runtime, the CSI plugin registry (task `csi-plugin-watcher`) and the claim engine (tasks
/// `claim-engine`, `claim-populator`, `claim-csi-drivers`).
pub(crate) fn start_claims(core: &Core, runtime: &Runtime, src: &Sources) -> anyhow::Result<Storage> {
    let (config, sup, shutdown) = (&core.config, &core.supervisor, &core.shutdown);
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
    let volume_metrics = VolumeMetrics::new(&core.registry)?;
    // CSI node plugins register by socket in nodelet.storage.csi.pluginDir (<root-dir>/plugins_registry).
    let csi = Arc::new(nodelet_csi::Registry::new(
        &config.storage.csi_plugin_dir,
        nodelet_csi::CsiClientConfig::default(),
    ));
    std::fs::create_dir_all(&config.storage.csi_plugin_dir).with_context(|| {
        format!("cannot create the CSI plugin directory {}", config.storage.csi_plugin_dir.display())
    })?;
    sup.spawn(
        "csi-plugin-watcher",
        Policy::Critical,
        csi.watcher(std::time::Duration::from_secs(2), shutdown.clone()),
    );

    // The claim engine: PersistentVolumes, claims and classes from the manifests, provisioners.
    let claims::Claims { view: claim_view, metrics: claim_metrics } = claims::start(
        config,
        src.objects.clone(),
        src.desired.clone(),
        &core.registry,
        &core.engine_metrics,
        volume_metrics.operation_duration.clone(),
        csi.clone(),
        sup,
    )?;
    let mut claim_lookup: Arc<dyn ClaimLookup> = Arc::new(claim_view.clone());
    if let Some(c) = &src.cluster {
        // API pods' claims come from the API server, bound by the control plane.
        claim_lookup =
            Arc::new(cluster::podobjects::ClusterClaims { api: c.pod_data(), local: claim_lookup });
    }
    Ok(Storage { node_objects, pod_runtime, csi, claim_view, claim_metrics, claim_lookup, volume_metrics })
}

/// Runs an engine (`run`) and logs its report when it stops.
pub(crate) async fn log_report(what: &'static str, run: impl Future<Output = reconcile_engine::RunReport>) {
    let report = run.await;
    tracing::info!(operations = report.operations, abandoned = report.abandoned, "{what} engine stopped");
}

/// Spawns a pair's tasks ([`NamedTask`]s) on `sup`.
fn spawn_tasks(sup: &Supervisor, tasks: Vec<NamedTask>) {
    for task in tasks {
        let policy = match task.lifetime {
            Lifetime::UntilShutdown => Policy::Critical,
            Lifetime::Bounded => Policy::MayFinish,
        };
        sup.spawn(task.name, policy, task.future);
    }
}

/// The volume pair's stores and what pods read of it.
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
    /// The engine, started by [`start_pods`] (its populator is the pod pair's).
    engine: Option<VolumeEngine>,
    writer: Option<reconcile_engine::Writer<VolumeKey, DesiredVolume>>,
}

type VolumeEngine = Engine<DesiredVolume, VolumeActual, VolumeReconciler, VolumeDriver<volumes::NodeVolumes>>;

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

/// The volume engine (task `volume-engine`) and its observer (`volume-watch`).
pub(crate) fn start_volumes(core: &Core, runtime: &Runtime, storage: &Storage) -> Volumes {
    let config = &core.config;
    let (desired, writer) = reconcile_engine::store();
    let builder = Engine::builder(
        "volumes",
        VolumeReconciler::new(&config.root_dir),
        Arc::new(VolumeDriver::new(
            Arc::new(volumes::NodeVolumes::new(
                &config.root_dir,
                storage.csi.clone(),
                allocatable_memory(&runtime.facts),
                config.pods.allowed_host_paths.clone(),
                core.host == Host::Hollow,
            )),
            storage.volume_metrics.clone(),
        )),
        desired.clone(),
    )
    .metrics(&core.engine_metrics);
    // Pod volumes and their CSI devices wait for each other.
    let own_actual = builder.actual();
    let related = nodelet_resources::volume::reconciler::related_volumes(desired.clone(), own_actual.clone());
    let mut engine = builder.watches("devices", own_actual, related).build();
    let actual = engine.actual();
    let failures = engine.op_status();
    core.supervisor.spawn(
        "volume-watch",
        Policy::Critical,
        volumes::watch_volumes(actual.clone(), engine.observer(), core.shutdown.clone()),
    );
    let metrics = storage.volume_metrics.clone();
    Volumes { desired, actual, failures, metrics, engine: Some(engine), writer: Some(writer) }
}

/// The node's allocatable memory in bytes (`None` when unknown): the largest tmpfs a memory-backed
/// volume gets.
fn allocatable_memory(facts: &node_facts::NodeFacts) -> Option<u64> {
    let q = facts.allocatable.get("memory")?;
    let q = nodelet_resources::quantity::Quantity::parse(&q.0).filter(|q| !q.is_negative())?;
    u64::try_from(q.scaled_ceil(1)).ok().filter(|b| *b > 0)
}

/// The pod pair's stores and what the servers and later pairs read of it.
pub(crate) struct Pods {
    pub(crate) actual: Store<PodUid, PodActual>,
    pub(crate) failures: Store<PodUid, nodelet_resources::pod::status::PodOpStatus>,
    pub(crate) probes: ProbeResults,
    /// The node's verdicts on its pods (admitted, refused, evicted).
    pub(crate) verdicts: Store<PodUid, nodelet_resources::model::verdict::Verdict>,
    /// What the servers read of the sandbox pair.
    pub(crate) sandboxes: SandboxView,
    /// The sandbox pair's operation status (a side input of the pod reconciler and of pod status).
    pub(crate) sandbox_failures: Store<PodUid, SandboxOpStatus>,
    /// What [`start_pressure`] takes: the verdict store's writer, admission and the container GC
    /// reclaimer (the verdict populator and the eviction manager run there).
    pressure_inputs: Option<PressureInputs>,
    /// The pod engine's reconciler (a copy, for status).
    pub(crate) reconciler: PodReconciler,
    /// The pod engine's side inputs ([`PodSideInputs::inputs`]), for status; taken once.
    pub(crate) status_inputs: nodelet_resources::pod::reconciler::PodInputs,
    pub(crate) clock: Clock,
    /// Re-populates the volumes (objects or claims changed).
    pub(crate) refresh: tokio::sync::watch::Sender<()>,
}

/// The pod reconciler's side inputs, defined once: their relations declared on the pod engine
/// ([`register`](Self::register): what plans a pod again when one changes, and the store it waits for) and
/// the [`PodInputs`](nodelet_resources::pod::reconciler::PodInputs) value ([`inputs`](Self::inputs)) that
/// the engine is built with and status reads, so status reads what the engine reads.
struct PodSideInputs {
    /// The engine's own failures: an ephemeral container whose start keeps failing never delays the pod's
    /// other containers, and no prune replaces a failure on record.
    failures: Store<PodUid, nodelet_resources::pod::status::PodOpStatus>,
    /// The node's verdicts on its pods.
    verdicts: Store<PodUid, Verdict>,
    /// The volume pair's desired store.
    volumes_desired: Store<VolumeKey, DesiredVolume>,
    /// The volume pair's actual store: a pod's containers wait for its volumes.
    volumes_actual: Store<VolumeKey, VolumeActual>,
    /// The sandbox pair's actual store: a pod's containers wait for a ready sandbox.
    sandboxes: Store<PodUid, nodelet_resources::model::actual::PodSandboxes>,
    /// The sandbox pair's operation status.
    sandbox_failures: Store<PodUid, SandboxOpStatus>,
    /// The node-wide container GC decision per pod.
    surplus: Store<PodUid, Surplus>,
}

impl PodSideInputs {
    /// Declares on the pod engine's builder the relations that plan a pod again when a side input changes,
    /// and the gate on the sandbox pair's actual store (nothing is planned before it was reconstructed: a
    /// pod would look as if its sandbox were gone).
    fn register<Dr>(
        &self,
        builder: reconcile_engine::EngineBuilder<DesiredPod, PodActual, PodReconciler, Dr>,
    ) -> reconcile_engine::EngineBuilder<DesiredPod, PodActual, PodReconciler, Dr>
    where
        Dr: reconcile_engine::Driver<PodUid, nodelet_resources::pod::ops::PodOp, PodActual>,
    {
        let PodSideInputs { verdicts, volumes_actual, sandboxes, surplus, .. } = self;
        builder
            // A pod's verdict came or changed: plan the pod again.
            .watches("verdicts", verdicts.clone(), |uid: &PodUid, _: Option<&Verdict>| Some(uid.clone()))
            // A pod's volumes changed: plan the pod again (its containers wait for them).
            .watches("volumes", volumes_actual.clone(), nodelet_resources::volume::reconciler::pod_of_volume)
            // A pod's sandboxes changed: plan the pod again (its containers wait for a ready sandbox).
            .watches("sandboxes", sandboxes.clone(), pod_of_sandboxes)
            // Nothing is planned before the sandbox pair has read the runtime, then every pod.
            .waits_for("sandboxes", sandboxes.clone())
            // The node-wide container GC decision for a pod changed: plan the pod again.
            .watches("container-gc", surplus.clone(), |uid: &PodUid, _: Option<&Surplus>| Some(uid.clone()))
    }

    /// The pod reconciler's side inputs: the engine is built with them, status reads them.
    fn inputs(&self) -> nodelet_resources::pod::reconciler::PodInputs {
        let PodSideInputs {
            failures,
            verdicts,
            volumes_desired,
            volumes_actual,
            sandboxes,
            sandbox_failures,
            surplus,
        } = self;
        nodelet_resources::pod::reconciler::PodInputs {
            failures: Some(failures.clone()),
            verdicts: Some(verdicts.clone()),
            volumes: Some(nodelet_resources::volume::status::VolumeGate::new(
                volumes_desired.clone(),
                volumes_actual.clone(),
            )),
            sandboxes: Some(SandboxView::new(sandboxes.clone(), Some(sandbox_failures.clone()))),
            surplus: Some(surplus.clone()),
        }
    }
}

struct PressureInputs {
    verdict_writer: reconcile_engine::Writer<PodUid, nodelet_resources::model::verdict::Verdict>,
    admission: nodelet_resources::eviction::verdict::Admission,
    container_gc: nodelet_resources::pod::gc::ContainerGcReclaimer,
}

/// The pod engine (task `pod-engine`) with its prober (`prober`), PLEG (`pleg`, `runtime-events`), volume
/// populator (`volume-populator`, `volume-refresh`), container GC (`container-gc`), log rotation
/// (`log-rotation`) and the claims' volume stats (`claim-volume-stats`); also starts the
/// volume engine and the sandbox pair (`sandbox-engine`, `sandbox-populator`: sandboxes and their network,
/// see [`nodelet_resources::sandbox`]).
pub(crate) fn start_pods(
    core: &Core,
    runtime: &Runtime,
    src: &Sources,
    storage: &Storage,
    vols: &mut Volumes,
) -> anyhow::Result<Pods> {
    let (config, sup, shutdown) = (&core.config, &core.supervisor, &core.shutdown);
    let desired = &src.desired;
    let pod_metrics = PodMetrics::new(&core.registry)?;
    let crash_loop = CrashLoopBackOff {
        initial: config.backoff.container_restart.initial,
        max: config.backoff.container_restart.max,
        reset_after: config.backoff.container_restart.reset_after,
    };
    let clock = system_clock();
    // The prober: runs the probes of running containers; the pod reconciler and status read its results.
    let prober = nodelet_resources::probe::worker::Prober::new(
        Arc::new(storage.pod_runtime.prober().clone()),
        desired.clone(),
        nodelet_resources::probe::metrics::ProbeMetrics::new(&core.probe_registry)?,
        clock.clone(),
    );
    let probes = prober.results();
    // The node's verdicts on its pods (admitted, refused, evicted): written only by the verdict
    // populator that `pressure::start` runs; read by the pod and sandbox reconcilers, the volume
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
    )
    .wall_clock(nodelet_resources::common::clock::wall_clock(&clock));
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
        SandboxMetrics::new(&core.registry)?,
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
    let side_inputs = PodSideInputs {
        failures: failures.clone(),
        verdicts: verdicts.clone(),
        volumes_desired: vols.desired.clone(),
        volumes_actual: vols.actual.clone(),
        sandboxes: sandbox_pair.actual(),
        sandbox_failures: sandbox_failures.clone(),
        surplus,
    };
    let status_inputs = side_inputs.inputs();
    let mut engine = side_inputs
        .register(builder)
        .metrics(&core.engine_metrics)
        .backoff(pod_backoff)
        .max_concurrent(nodelet_resources::pod::ops::MAX_CONCURRENT_OPS)
        .resync_period(config.sync_frequency)
        .build_with(status_inputs.clone());
    sup.spawn(
        "prober",
        Policy::Critical,
        prober.run(actual.clone(), engine.waker(), shutdown.clone().cancelled_owned()),
    );
    let writer = vols.writer.take().context("the volume populator is started once")?;
    let renderer = volumes::ManifestRenderer::new(storage.node_objects.clone());
    let populator = Populator::new(desired.clone(), actual.clone(), writer, Arc::new(renderer))
        .with_claims(storage.claim_lookup.clone())
        .with_verdicts(verdicts.clone());
    // Re-populate when the objects (ConfigMaps, Secrets) or the claims' bindings change.
    let (refresh_tx, refresh) = tokio::sync::watch::channel(());
    sup.spawn(
        "volume-refresh",
        Policy::Critical,
        volumes::forward_changes(
            src.objects.clone(),
            storage.claim_view.subscribe(),
            refresh_tx.clone(),
            shutdown.clone(),
        ),
    );
    sup.spawn("volume-populator", Policy::Critical, populator.run(refresh, shutdown.clone()));
    let (pods, vol_actual, csi, claim_metrics, period, stop) = (
        desired.clone(),
        vols.actual.clone(),
        storage.csi.clone(),
        storage.claim_metrics.clone(),
        config.storage.volume_stats_agg_period,
        shutdown.clone(),
    );
    sup.spawn_restartable("claim-volume-stats", move || {
        volumes::claim_volume_stats(
            pods.clone(),
            vol_actual.clone(),
            csi.clone(),
            claim_metrics.clone(),
            period,
            stop.clone(),
        )
    });
    let volume_engine = vols.engine.take().context("the volume engine is started once")?;
    sup.spawn(
        "volume-engine",
        Policy::Critical,
        log_report("volume", volume_engine.run(shutdown.clone().cancelled_owned())),
    );

    let pleg = Pleg::new(
        storage.pod_runtime.clone(),
        actual.clone(),
        engine.observer(),
        config.pleg_relist_period,
        pod_metrics.clone(),
    )
    .with_evented_period(config.pleg_evented_relist_period)
    .with_sandboxes(sandbox_pair.actual(), sandbox_pair.observer());
    let relist = pleg.waker();
    // The sandbox pair's populator and engine (`sandbox-engine`).
    let (sandbox_engine, sandbox_tasks) = sandbox_pair.start(desired.clone(), shutdown.clone());
    sup.spawn("sandbox-engine", Policy::Critical, log_report("sandbox", sandbox_engine));
    spawn_tasks(sup, sandbox_tasks);
    // The node-wide cap on dead containers (maxContainers), decided over all pods.
    sup.spawn("container-gc", Policy::Critical, surplus_populator.run(shutdown.clone()));
    let (cri, logs_actual, logs_config, stop) =
        (runtime.cri.clone(), actual.clone(), config.container_logs, shutdown.clone());
    sup.spawn_restartable("log-rotation", move || {
        let policy = nodelet_cri::log_rotation::LogRotationPolicy {
            max_size: logs_config.max_size,
            max_files: logs_config.max_files,
        };
        log_rotation::run(
            cri.clone(),
            logs_actual.clone(),
            policy,
            logs_config.monitor_interval,
            stop.clone(),
        )
    });
    // A hollow node's fake runtime sends no events: its PLEG relists every period, as the kubelet's
    // generic PLEG does in kubemark's hollow nodes.
    if core.host == Host::Real {
        let (cri, own, stop) = (runtime.cri.clone(), storage.pod_runtime.own_changes(), shutdown.clone());
        sup.spawn_restartable("runtime-events", move || {
            forward_runtime_events(
                cri.clone(),
                relist.clone(),
                own.clone(),
                pod_metrics.clone(),
                stop.clone(),
            )
        });
    }
    let stop = shutdown.clone();
    sup.spawn("pleg", Policy::Critical, async move { pleg.run(stop.cancelled_owned()).await });
    sup.spawn(
        "pod-engine",
        Policy::Critical,
        log_report("pod", engine.run(shutdown.clone().cancelled_owned())),
    );
    let pressure_inputs =
        Some(PressureInputs { verdict_writer, admission, container_gc: container_reclaimer });
    Ok(Pods {
        actual,
        failures,
        probes,
        verdicts,
        sandboxes,
        sandbox_failures,
        pressure_inputs,
        reconciler,
        status_inputs,
        clock,
        refresh: refresh_tx,
    })
}

/// Tells the PLEG what a runtime event means for it: what nodelet cannot know otherwise (a container
/// or sandbox exited, was killed for memory or was removed, or events were missed) and whether
/// events come at all. Containers created and started are nodelet's own operations, whose outcome
/// the operation already reports; waking the PLEG for them made a start of a hundred pods relist
/// back to back. So are the exits and removals of containers nodelet stops and removes (`own`):
/// those operations read the pod's state when they end.
fn tell_the_pleg(
    event: &nodelet_cri::RuntimeEvent,
    pleg: &PlegWaker,
    own: &nodelet_cri::OwnChanges,
    metrics: &PodMetrics,
) {
    use nodelet_cri::RuntimeEvent as E;
    match event {
        E::Reconnected { source } => {
            metrics.evented_pleg_connections.with_label_values(&["success"]).inc();
            metrics.set_event_source(source.as_str());
            pleg.set_evented(true);
            pleg.relist();
        }
        E::Disconnected { .. } => {
            metrics.evented_pleg_connections.with_label_values(&["error"]).inc();
            metrics.set_event_source(nodelet_resources::pod::metrics::EVENT_SOURCE_NONE);
            pleg.set_evented(false);
        }
        E::ContainerExited { id, .. } | E::ContainerRemoved { id } if own.caused(id) => {
            tracing::trace!(container = %id, "nodelet's own change: left to its operation");
        }
        E::ContainerExited { id, .. } | E::ContainerOom { id } => pleg.changed(id),
        E::ContainerRemoved { id } => pleg.removed(id),
        _ => {}
    }
}

/// Forwards the runtime's events to the PLEG (see [`tell_the_pleg`]); while none come (before the
/// first subscription and after it broke), the PLEG relists every period.
async fn forward_runtime_events(
    cri: nodelet_cri::CriClient,
    pleg: PlegWaker,
    own: nodelet_cri::OwnChanges,
    metrics: PodMetrics,
    stop: CancellationToken,
) {
    use futures::StreamExt;
    // The feed runs on this task: its panic is this task's (restarted as `runtime-events`).
    let (mut events, feed) = cri.events(nodelet_cri::EventsConfig::default());
    tokio::pin!(feed);
    let _disconnected = DisconnectOnDrop(pleg.clone(), metrics.clone());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = &mut feed => return,
            event = events.next() => match event {
                Some(event) => {
                    tracing::trace!(?event, "runtime event");
                    tell_the_pleg(&event, &pleg, &own, &metrics);
                }
                None => return,
            },
        }
    }
}

/// Puts the PLEG back on its short period (and `nodelet_evented_pleg_source` on `none`) when the event
/// forwarder ends (or is restarted).
struct DisconnectOnDrop(PlegWaker, PodMetrics);

impl Drop for DisconnectOnDrop {
    fn drop(&mut self) {
        self.0.set_evented(false);
        self.1.set_event_source(nodelet_resources::pod::metrics::EVENT_SOURCE_NONE);
    }
}

/// Node, pod and container statistics (/stats/summary, /metrics/resource, eviction signals): tasks
/// `stats-housekeeping` and `volume-stats` (the pods' volumes measured every `volumeStatsAggPeriod`),
/// both restartable.
pub(crate) fn start_stats(
    core: &Core,
    src: &Sources,
    storage: &Storage,
    vols: &Volumes,
) -> stats::StatsProvider {
    let config = &core.config;
    let stats = stats::StatsProvider::new(
        storage.pod_runtime.clone(),
        stats::StatsConfig::new(&config.node_name, &config.root_dir, &config.pods.pod_logs_dir),
        system_clock(),
    )
    .with_volumes(src.desired.clone(), vols.actual.clone())
    .with_housekeeping_interval(config.housekeeping_interval)
    // The containers' writable layers are disk usage, measured as often as the volumes'.
    .with_container_fs_interval(config.storage.volume_stats_agg_period);
    let (provider, stop) = (stats.clone(), core.shutdown.clone());
    core.supervisor
        .spawn_restartable("stats-housekeeping", move || provider.clone().housekeeping(stop.clone()));
    let (provider, stop, period) =
        (stats.clone(), core.shutdown.clone(), config.storage.volume_stats_agg_period);
    core.supervisor.spawn_restartable("volume-stats", move || {
        provider.clone().measure_volumes_every(period, stop.clone())
    });
    stats
}

/// Image garbage collection, the verdict populator and the eviction manager (tasks `image-engine`,
/// `image-populator`, `verdict-populator`, `eviction-manager`).
pub(crate) fn start_pressure(
    core: &Core,
    runtime: &Runtime,
    src: &Sources,
    vols: &Volumes,
    pods: &mut Pods,
    stats: &stats::StatsProvider,
) -> anyhow::Result<pressure::PressureState> {
    let config = &core.config;
    let inputs = pods.pressure_inputs.take().context("pressure is started once")?;
    let state = pressure::start(
        pressure::Wiring {
            config,
            cri: runtime.cri.clone(),
            stats: stats.clone(),
            desired: src.desired.clone(),
            actual: pods.actual.clone(),
            volumes: vols.actual.clone(),
            verdicts: pods.verdicts.clone(),
            verdict_writer: inputs.verdict_writer,
            admission: inputs.admission,
            container_gc: inputs.container_gc,
            registry: &core.registry,
            engine_metrics: &core.engine_metrics,
            clock: pods.clock.clone(),
        },
        &core.supervisor,
    )?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_embedded_containerd_gets_the_daemons_settings() {
        let mut config = crate::config::Config::resolve(
            &crate::cli::RunArgs { hostname_override: Some("n".into()), ..Default::default() },
            None,
            &crate::config::HostFacts::detect(),
        )
        .expect("defaults")
        .config;
        config.root_dir = PathBuf::from("/srv/nodelet");
        config.runtime.pod_infra_container_image = "registry.k8s.io/pause:3.9".into();
        config.runtime.embedded.pod_cidr = "198.18.32.0/20".parse().expect("cidr");
        let c = embedded_containerd_config(&config);
        assert_eq!(c.dir, PathBuf::from("/srv/nodelet/containerd"));
        assert_eq!(c.sandbox_image, "registry.k8s.io/pause:3.9");
        assert_eq!(c.cni_conf_dir, PathBuf::from("/srv/nodelet/cni/net.d"));
        let net = c.cni_network.expect("network");
        assert_eq!(net.subnet.first_host(), Ipv4Addr::new(198, 18, 32, 1));
        assert_eq!(net.bridge, "nodelet0");
    }

    #[test]
    fn the_node_facts_get_the_daemons_settings() {
        let config = crate::config::Config::resolve(
            &crate::cli::RunArgs { hostname_override: Some("n".into()), ..Default::default() },
            None,
            &crate::config::HostFacts::detect(),
        )
        .expect("defaults")
        .config;
        let facts = facts_config(&config);
        assert_eq!(facts.node_name, "n");
        assert_eq!(facts.max_pods, 110);
        assert_eq!(facts.kubelet_port, 10250);
        let signals: Vec<&str> = facts.hard_eviction.iter().map(|t| t.signal.as_str()).collect();
        assert!(
            signals.contains(&"memory.available") && signals.contains(&"nodefs.available"),
            "{signals:?}"
        );
    }
}
