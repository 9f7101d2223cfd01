//! nodelet: a node agent that runs Kubernetes pods by reconciling desired against actual state.

use clap::Parser;

mod atomic;
mod claims;
mod cli;
mod client;
mod cluster;
mod config;
mod containerd;
mod cri_log;
mod csinode;
#[cfg(test)]
mod fuzz_tests;
mod log_rotation;
mod logging;
mod node;
mod node_facts;
mod pressure;
mod server;
mod sources;
mod stats;
mod volumes;
mod yaml;

fn main() -> anyhow::Result<()> {
    let command = cli::Cli::parse().into_command();
    if let cli::Command::Run(args) = &command {
        // The daemon logs as its configuration says (`--logging-format`, `logging:`): read it first.
        let loaded = config::Config::load(args)?;
        logging::init(loaded.config.logging.format, loaded.config.logging.verbosity)?;
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        return rt.block_on(run(loaded));
    }
    cli::init_tracing(command.verbosity(), "warn")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        // client commands: a plain one-line error and exit code 1, like kubectl
        let client_result = match command {
            cli::Command::Get(args) => client::run_get(&args).await.map_err(|e| e.to_string()),
            cli::Command::Logs(args) => client::run_logs(&args).await.map_err(|e| e.to_string()),
            cli::Command::PortForward(args) => {
                client::run_port_forward(&args).await.map_err(|e| e.to_string())
            }
            // The command's exit code; exiting here also ends a blocked read of stdin.
            cli::Command::Exec(args) => exit_with(client::run_exec(&args).await),
            cli::Command::Attach(args) => exit_with(client::run_attach(&args).await),
            cli::Command::Debug(args) => exit_with(client::run_debug(&args).await),
            cli::Command::Cp(args) => client::run_cp(&args).await.map_err(|e| e.to_string()),
            cli::Command::Describe(args) => client::run_describe(&args).await.map_err(|e| e.to_string()),
            cli::Command::Completion(args) => cli::completion(&args.shell, &mut std::io::stdout().lock()),
            cli::Command::Man(args) => match &args.dir {
                Some(dir) => cli::man_pages_to(dir).map_err(|e| format!("cannot write the man pages: {e}")),
                None => cli::man_page(&mut std::io::stdout().lock()).map_err(|e| e.to_string()),
            },
            // The daemon returned above.
            cli::Command::Run(_) => Ok(()),
        };
        if let Err(e) = client_result {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        Ok(())
    })
}

/// Exits with the exit code of `nodelet exec` / `nodelet attach`, or 1 after printing the error.
fn exit_with(result: Result<i32, client::StreamError>) -> ! {
    let code = result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        1
    });
    std::process::exit(code)
}

/// The daemon: sources → desired store → pod engine → CRI runtime → actual store (and the PLEG) →
/// status on the HTTP servers.
async fn run(loaded: config::Loaded) -> anyhow::Result<()> {
    use anyhow::Context;

    for w in &loaded.warnings {
        tracing::warn!("config: {w}");
    }
    let config = loaded.config;
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
            let cfg = containerd::EmbeddedContainerdConfig::from_config(&config);
            let embedded = containerd::EmbeddedContainerd::start(cfg).await?;
            (embedded.endpoint().to_string(), Some(embedded))
        }
    };
    let result = run_with_runtime(&config, &endpoint).await;
    if let Some(embedded) = embedded {
        embedded.shutdown().await?;
    }
    result
}

async fn run_with_runtime(config: &config::Config, endpoint: &str) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use anyhow::Context;
    use nodelet_resources::pod::driver::PodDriver;
    use nodelet_resources::pod::metrics::PodMetrics;
    use nodelet_resources::pod::pleg::Pleg;
    use nodelet_resources::pod::reconciler::{CrashLoopBackOff, PodReconciler, system_clock};
    use nodelet_resources::volume::driver::VolumeDriver;
    use nodelet_resources::volume::metrics::VolumeMetrics;
    use nodelet_resources::volume::populator::Populator;
    use nodelet_resources::volume::reconciler::VolumeReconciler;
    use nodelet_resources::volume::status::VolumeGate;
    use reconcile_engine::{BackoffConfig, Engine, Metrics};
    use tokio_util::sync::CancellationToken;

    let cri = nodelet_cri::CriClient::connect_lazy(
        nodelet_cri::CriConfig::new(endpoint).with_runtime_request_timeout(config.runtime.request_timeout),
    )
    .with_context(|| format!("bad container runtime endpoint {endpoint}"))?;
    if let (Some(dir), true) = (&config.runtime.preload_images, config.runtime.endpoint.is_some()) {
        let socket = endpoint.trim_start_matches("unix://");
        let imported = containerd::import_images(std::path::Path::new("ctr"), socket.as_ref(), dir).await?;
        tracing::info!(images = imported.len(), dir = %dir.display(), "preloaded images");
    }

    // Wait for the runtime before planning anything: reconstruction needs it.
    let runtime_ready = Arc::new(AtomicBool::new(false));
    wait_for_runtime(&cri, &runtime_ready).await;

    // What the Node object shows of this machine: read once.
    let node_facts = Arc::new(node_facts::NodeFacts::detect(config, node_facts::runtime_version(&cri).await));

    let registry = prometheus::Registry::new();
    // `/metrics/probes`: the prober's metrics are served apart, as the kubelet does.
    let probe_registry = prometheus::Registry::new();
    let engine_metrics = Metrics::new(&registry)?;
    let pod_metrics = PodMetrics::new(&registry)?;
    // kubelet_runtime_operations_{total,errors_total,duration_seconds}, counted in every clone of `cri`.
    cri.set_metrics(nodelet_cri::CriMetrics::new(&registry)?);
    let shutdown = CancellationToken::new();

    // Sources → desired store.
    // Ephemeral containers `nodelet debug` added to static pods, kept across restarts.
    let debug_dir = config.root_dir.join("debug");
    let debug_state = sources::debug::DebugState::load(&debug_dir).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the ephemeral containers of static pods cannot be read; starting without them");
        sources::debug::DebugState::empty(&debug_dir)
    });
    let pod_config = sources::PodConfig::new(config.node_name.clone())
        .with_debug_state(debug_state)
        .with_security(config.security_policies());
    let mut tasks = tokio::task::JoinSet::new();
    let mut objects = tokio::sync::watch::channel(std::sync::Arc::new(sources::ManifestObjects::new())).1;
    if let Some(path) = &config.sources.static_pod_path {
        let mut cfg = sources::file::FileSourceConfig::new(path.clone());
        cfg.check_frequency = config.sources.file_check_frequency;
        let source = sources::file::FileSource::new(cfg, pod_config.add_source("file")?);
        objects = source.objects();
        tasks.spawn(source.run(shutdown.clone()));
    }
    if let Some(url) = &config.sources.static_pod_url {
        let mut cfg = sources::url::UrlSourceConfig::new(url.clone());
        cfg.headers = config.sources.static_pod_url_headers.clone();
        cfg.check_frequency = config.sources.http_check_frequency;
        let source = sources::url::UrlSource::new(cfg, pod_config.add_source("url")?)?;
        tasks.spawn(source.run(shutdown.clone()));
    }
    if let Some(addr) = config.sources.manifest_http_addr {
        let checkpoint_dir = config.root_dir.join("http-source");
        std::fs::create_dir_all(&checkpoint_dir)
            .with_context(|| format!("cannot create {}", checkpoint_dir.display()))?;
        let mut http_config = sources::http::HttpSourceConfig::new(addr);
        http_config.checkpoint = Some(checkpoint_dir.join("pods.json"));
        let source = sources::http::HttpSource::bind(http_config, pod_config.add_source("http")?).await?;
        tracing::info!(addr = %source.local_addr(), "accepting manifests over HTTP");
        tasks.spawn(source.run(shutdown.clone()));
    }
    // Cluster mode: the API server is one more source.
    let cluster = match &config.cluster {
        Some(c) => Some(
            cluster::Cluster::connect(&config.node_name, c, &pod_config, &registry, &shutdown, &mut tasks)
                .await?,
        ),
        None => None,
    };
    pod_config.seal();
    let desired = pod_config.store();
    // ConfigMaps, Secrets and tokens for volumes and environment variables.
    let node_objects = volumes::NodeObjects::new(objects.clone(), cluster.as_ref().map(|c| c.pod_data()))
        .with_api_runtime_classes(cluster.as_ref().map(cluster::Cluster::runtime_classes));
    let renderer = volumes::ManifestRenderer::new(node_objects.clone());
    let runtime = Arc::new(nodelet_cri::CriPodRuntime::new(
        cri.clone(),
        nodelet_cri::CriPodRuntimeConfig::default()
            .with_pod_log_root(&config.pods.pod_logs_dir)
            .with_cgroup_root(config.pods.cgroup_root.clone())
            .with_resolv_conf(config.pods.resolv_conf.clone())
            .with_cluster_dns(config.pods.cluster_dns.iter().map(ToString::to_string).collect())
            .with_cluster_domain(&config.pods.cluster_domain)
            .with_allow_privileged(config.pods.allow_privileged)
            .with_seccomp_default(config.pods.seccomp_default)
            // The embedded containerd runs with disable_apparmor: it could not apply a profile either.
            .with_apparmor_enabled(config.runtime.endpoint.is_some() && nodelet_cri::apparmor_enabled())
            .with_node_name(&config.node_name)
            .with_root_dir(&config.root_dir)
            .with_node_ips(node_facts.internal_ips())
            .with_objects(Arc::new(node_objects.clone()))
            .with_runtime_classes(Arc::new(node_objects.clone())),
    ));

    let volume_metrics = VolumeMetrics::new(&registry)?;
    // CSI node plugins register by socket in nodelet.storage.csi.pluginDir (<root-dir>/plugins_registry).
    let csi_registry = Arc::new(nodelet_csi::Registry::new(
        &config.storage.csi_plugin_dir,
        nodelet_csi::CsiClientConfig::default(),
    ));
    std::fs::create_dir_all(&config.storage.csi_plugin_dir).with_context(|| {
        format!("cannot create the CSI plugin directory {}", config.storage.csi_plugin_dir.display())
    })?;
    let _csi_watcher = csi_registry.spawn_watcher(std::time::Duration::from_secs(2), shutdown.clone());

    // The claim engine: PersistentVolumes, claims and classes from the manifests, provisioners.
    let claims = claims::start(
        config,
        objects.clone(),
        desired.clone(),
        &registry,
        &engine_metrics,
        volume_metrics.operation_duration.clone(),
        csi_registry.clone(),
        &shutdown,
        &mut tasks,
    )?;
    let mut claim_lookup: Arc<dyn nodelet_resources::volume::populator::ClaimLookup> =
        Arc::new(claims.view.clone());
    if let Some(c) = &cluster {
        // API pods' claims come from the API server, bound by the control plane.
        claim_lookup =
            Arc::new(cluster::podobjects::ClusterClaims { api: c.pod_data(), local: claim_lookup });
    }

    // The volume engine: populated from the pods, gating their containers.
    let (volume_desired, volume_writer) = reconcile_engine::store();
    let volume_builder = Engine::builder(
        "volumes",
        VolumeReconciler::new(&config.root_dir),
        Arc::new(VolumeDriver::new(
            Arc::new(volumes::NodeVolumes::new(&config.root_dir, csi_registry.clone())),
            volume_metrics.clone(),
        )),
        volume_desired.clone(),
    )
    .metrics(&engine_metrics);
    // Pod volumes and their CSI devices wait for each other.
    let own_actual = volume_builder.actual();
    let related =
        nodelet_resources::volume::reconciler::related_volumes(volume_desired.clone(), own_actual.clone());
    let mut volume_engine = volume_builder.watches("devices", own_actual, related).build();
    let volume_actual = volume_engine.actual();
    let volume_failures = volume_engine.op_status();
    tasks.spawn(volumes::watch_volumes(volume_actual.clone(), volume_engine.observer(), shutdown.clone()));
    let gate =
        VolumeGate::new(volume_desired.clone(), volume_actual.clone()).with_claims(claim_lookup.clone());

    // The pod engine and its PLEG.
    let crash_loop = CrashLoopBackOff {
        initial: config.backoff.container_restart.initial,
        max: config.backoff.container_restart.max,
        reset_after: config.backoff.container_restart.reset_after,
    };
    let clock = system_clock();
    // The prober: runs the probes of running containers; the pod reconciler and status read its results.
    let prober = nodelet_resources::probe::worker::Prober::new(
        Arc::new(runtime.prober().clone()),
        desired.clone(),
        nodelet_resources::probe::metrics::ProbeMetrics::new(&probe_registry)?,
        clock.clone(),
    );
    let probe_results = prober.results();
    // The node's verdicts on its pods (admitted, refused, evicted): written only by the verdict
    // populator that `pressure::start` runs; read by the pod reconciler, the volume populator, status.
    let (verdicts, verdict_writer) = reconcile_engine::store();
    let admission = pressure::admission(config, &node_facts, Arc::new(node_objects.clone()));
    let pod_failures: nodelet_resources::pod::reconciler::FailureSlot = Arc::default();
    // Container GC: dead containers and sandboxes pruned by the pod pair (kubelet's container GC).
    let (container_gc, container_surplus, container_reclaimer) =
        nodelet_resources::pod::gc::container_gc(config.container_gc, desired.clone(), clock.clone());
    let mut engine = Engine::builder(
        "pods",
        PodReconciler::new(crash_loop.clone(), clock.clone())
            .with_failures(pod_failures.clone())
            .with_volumes(gate.clone())
            .with_probes(probe_results.clone())
            .with_verdicts(verdicts.clone())
            .with_container_gc(container_gc),
        Arc::new(PodDriver::new(runtime.clone(), pod_metrics.clone())),
        desired.clone(),
    )
    .metrics(&engine_metrics)
    .backoff(
        BackoffConfig::default()
            .with_initial(config.backoff.image_pull.initial)
            .with_max(config.backoff.image_pull.max),
    )
    .resync_period(config.sync_frequency)
    // A pod's volumes changed: plan the pod again.
    .watches("volumes", volume_actual.clone(), nodelet_resources::volume::reconciler::pod_of_volume)
    .build();
    let actual = engine.actual();
    let failures = engine.op_status();
    let _ = pod_failures.set(failures.clone());
    let pod_waker = engine.waker();
    tasks.spawn(prober.run(actual.clone(), engine.waker(), shutdown.clone().cancelled_owned()));
    let populator = Populator::new(desired.clone(), actual.clone(), volume_writer, Arc::new(renderer));
    let populator = populator.with_claims(claim_lookup).with_verdicts(verdicts.clone());
    // Re-populate when the objects (ConfigMaps, Secrets) or the claims' bindings change.
    let (refresh_tx, refresh) = tokio::sync::watch::channel(());
    tasks.spawn(volumes::forward_changes(
        objects,
        claims.view.subscribe(),
        refresh_tx.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(populator.run(refresh, shutdown.clone()));
    tasks.spawn(volumes::claim_volume_stats(
        desired.clone(),
        volume_actual.clone(),
        csi_registry.clone(),
        claims.metrics.clone(),
        config.storage.volume_stats_agg_period,
        shutdown.clone(),
    ));
    let stop = shutdown.clone();
    let volume_task = tokio::spawn(async move { volume_engine.run(stop.cancelled_owned()).await });
    let pleg =
        Pleg::new(runtime.clone(), actual.clone(), engine.observer(), config.pleg_relist_period, pod_metrics);
    let waker = pleg.waker();
    tasks.spawn(container_surplus.populator(actual.clone(), engine.waker()).run(shutdown.clone()));
    tasks.spawn(log_rotation::run(cri.clone(), actual.clone(), config.container_logs, shutdown.clone()));
    let events = cri.events(nodelet_cri::EventsConfig::default());
    let stop = shutdown.clone();
    tasks.spawn(async move {
        use futures::StreamExt;
        let mut events = events;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => match event {
                    Some(event) => {
                        tracing::trace!(?event, "runtime event");
                        waker.notify_one();
                    }
                    None => return,
                },
            }
        }
    });
    let stop = shutdown.clone();
    tasks.spawn(async move { pleg.run(stop.cancelled_owned()).await });
    let stop = shutdown.clone();
    let engine_task = tokio::spawn(async move { engine.run(stop.cancelled_owned()).await });

    // Runtime health for /healthz.
    let ready = runtime_ready.clone();
    let stop = shutdown.clone();
    let health_cri = cri.clone();
    tasks.spawn(async move {
        loop {
            let ok = matches!(health_cri.status().await, Ok(s) if s.is_ready());
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
    });

    // Node, pod and container statistics (/stats/summary, /metrics/resource, eviction signals).
    let stats = stats::StatsProvider::new(
        runtime.clone(),
        stats::StatsConfig::new(&config.node_name, &config.root_dir, &config.pods.pod_logs_dir),
        clock.clone(),
    )
    .with_volumes(desired.clone(), volume_actual.clone())
    .with_housekeeping_interval(config.housekeeping_interval);
    tasks.spawn(stats.clone().housekeeping(shutdown.clone()));

    // Image garbage collection and the eviction manager.
    let pressure = pressure::start(
        pressure::Wiring {
            config,
            cri: cri.clone(),
            stats: stats.clone(),
            desired: desired.clone(),
            actual: actual.clone(),
            volumes: volume_actual.clone(),
            verdicts: verdicts.clone(),
            verdict_writer,
            admission,
            waker: pod_waker,
            container_gc: container_reclaimer,
            registry: &registry,
            engine_metrics: &engine_metrics,
            clock: clock.clone(),
        },
        &shutdown,
        &mut tasks,
    )?;

    // The HTTP servers.
    let (pod_desired, pod_actual) = (desired.clone(), actual.clone());
    let node = Arc::new(
        node::Node::new(
            desired,
            actual,
            failures,
            PodReconciler::new(crash_loop, clock.clone())
                .with_volumes(gate)
                .with_probes(probe_results.clone())
                .with_verdicts(verdicts),
            clock,
            registry,
            config.pods.pod_logs_dir.clone(),
            runtime_ready,
            pod_config.problems(),
            config.node_name.clone(),
        )?
        .with_volumes(node::VolumeView {
            desired: volume_desired,
            actual: volume_actual,
            failures: volume_failures,
            metrics: volume_metrics,
        })
        .with_claims(claims.view.clone(), claims.metrics.clone())
        .with_stats(stats.clone())
        .with_probe_registry(probe_registry)
        .with_pressure(pressure)
        .with_facts(node_facts)
        .with_csi(csi_registry.clone())
        .with_pod_config(pod_config.clone())
        .with_configz(config::configz::configz(config))
        .with_pulls(runtime.pull_records()),
    );
    let kube_client = cluster.as_ref().map(cluster::Cluster::client);
    let serving_cert = cluster.as_ref().and_then(cluster::Cluster::serving_cert);
    if let (Some(cluster), Some(c)) = (cluster, &config.cluster) {
        cluster.start(
            &config.node_name,
            c,
            node.clone(),
            pod_desired,
            pod_actual,
            probe_results,
            cri.clone(),
            csi_registry.clone(),
            refresh_tx,
            &shutdown,
            &mut tasks,
        );
    }
    let servers = if config.server.enabled {
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
        server_config.runtime = Some(cri.clone());
        let servers = server::Servers::bind(&server_config, node).await?;
        tracing::info!(
            main = %servers.main_addr(),
            read_only = ?servers.read_only_addr(),
            healthz = ?servers.healthz_addr(),
            "serving"
        );
        let stop = shutdown.clone();
        Some(tokio::spawn(servers.run(stop.cancelled_owned())))
    } else {
        None
    };

    wait_for_signal().await?;
    tracing::info!("shutting down; pods keep running");
    shutdown.cancel();
    if let Some(servers) = servers {
        let _ = servers.await;
    }
    if let Ok(report) = engine_task.await {
        tracing::info!(operations = report.operations, abandoned = report.abandoned, "pod engine stopped");
    }
    if let Ok(report) = claims.task.await {
        tracing::info!(operations = report.operations, abandoned = report.abandoned, "claim engine stopped");
    }
    if let Ok(report) = volume_task.await {
        tracing::info!(operations = report.operations, abandoned = report.abandoned, "volume engine stopped");
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Waits until the runtime answers `Status` with RuntimeReady (logging while it does not).
async fn wait_for_runtime(cri: &nodelet_cri::CriClient, ready: &std::sync::atomic::AtomicBool) {
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        match cri.status().await {
            Ok(status) if status.is_ready() => {
                ready.store(true, std::sync::atomic::Ordering::Relaxed);
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

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
