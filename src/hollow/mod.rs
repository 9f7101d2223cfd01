//! Hollow nodes: `nodelet hollow --nodes N --kubeconfig-dir DIR` runs N nodelet nodes in one process
//! against one API server, each with its own identity (`DIR/NAME.kubeconfig`), API client, pod source, pod,
//! sandbox and volume pairs, status manager, Node, Lease and events: the real node code of
//! [`crate::daemon`] ([`crate::daemon::run_hollow`]), over an in-process fake container runtime
//! ([`fake_cri`], served on `ROOT/NAME/cri.sock`) and a host that mounts nothing
//! ([`nodelet_host::driver::HostVolumes::without_mounts`]). No node listens on a port. Pods scheduled to
//! a hollow node go through the whole pod path and report Running with made-up IPs, as the pods of
//! kubemark's hollow kubelets do. It is a tool for measuring what nodes cost the control plane
//! (`scripts/hollow-bench.sh`, `docs/scale.md`).
//!
//! Each node keeps its files in `ROOT/NAME` (certificates, pod directories with the volumes' files,
//! container log directories): no cgroups, no mounts, no network. Stop with SIGTERM or SIGINT. Every
//! minute the process gives its allocator's free pages back ([`trim_periodically`]), so that what the nodes
//! hold in steady state is their live memory, not the start-up's peak; a trim that took long puts the next
//! one off ([`next_trim_after`]).

pub(crate) mod fake_cri;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cli::{HollowArgs, RunArgs};
use crate::config::{self, Config, ConfigFile, HostFacts};

/// Why hollow nodes cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HollowError {
    /// `--nodes` is 0, or the names overflow.
    #[error("{0}")]
    Args(String),
    /// A node's kubeconfig is not there.
    #[error("hollow node {node}: no kubeconfig at {path}")]
    NoKubeconfig {
        /// The node.
        node: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A node's configuration is invalid.
    #[error("hollow node {node}: {source}")]
    Config {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: config::ConfigError,
    },
    /// A node's directory cannot be made.
    #[error("hollow node directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The thread that renews the nodes' Leases cannot be started.
    #[error("cannot start the thread that renews the nodes' Leases: {0}")]
    HeartbeatLane(#[source] std::io::Error),
    /// A signal handler cannot be installed.
    #[error("signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// The name of hollow node `index`.
pub(crate) fn node_name(prefix: &str, index: u32) -> String {
    format!("{prefix}{index}")
}

/// The configuration of hollow node `name` (its files under `root`, its runtime on `socket`): what
/// `nodelet run` would resolve from `--hostname-override NAME --kubeconfig DIR/NAME.kubeconfig --root-dir
/// ROOT/NAME --container-runtime-endpoint unix://SOCKET [--config FILE]`, then without servers, static
/// pod sources, pod cgroups or image preloading, and with the pod logs under its own directory.
pub(crate) fn node_config(
    args: &HollowArgs,
    name: &str,
    root: &Path,
    socket: &Path,
    host: &HostFacts,
) -> Result<config::Loaded, HollowError> {
    let kubeconfig = args.kubeconfig_dir.join(format!("{name}.kubeconfig"));
    if !kubeconfig.is_file() {
        return Err(HollowError::NoKubeconfig { node: name.to_owned(), path: kubeconfig });
    }
    let config_err = |source| HollowError::Config { node: name.to_owned(), source };
    let run = RunArgs {
        hostname_override: Some(name.to_owned()),
        kubeconfig: Some(kubeconfig),
        root_dir: Some(root.to_owned()),
        container_runtime_endpoint: Some(format!("unix://{}", socket.display())),
        config: args.config.clone(),
        ..Default::default()
    };
    let file = run.config.as_deref().map(ConfigFile::read).transpose().map_err(config_err)?;
    let mut loaded = Config::resolve(&run, file, host).map_err(config_err)?;
    let c = &mut loaded.config;
    c.server.enabled = false;
    c.sources.static_pod_path = None;
    c.sources.static_pod_url = None;
    c.sources.manifest_http_addr = None;
    c.runtime.preload_images = None;
    c.pods.cgroup_root = None;
    c.pods.pod_logs_dir = root.join("logs");
    Ok(loaded)
}

/// Runs the hollow nodes `args` asks for until SIGTERM or SIGINT. A node whose task fails is logged and
/// stays down; the others go on.
pub(crate) async fn run(args: &HollowArgs) -> Result<(), HollowError> {
    if args.nodes == 0 {
        return Err(HollowError::Args("--nodes must be at least 1".into()));
    }
    let last = args
        .first_index
        .checked_add(args.nodes - 1)
        .ok_or_else(|| HollowError::Args("--first-index + --nodes overflows".into()))?;
    let host = HostFacts::detect();
    // The runtime endpoints are unix:// URLs of absolute paths.
    let root_dir = std::path::absolute(&args.root_dir)
        .map_err(|source| HollowError::Dir { path: args.root_dir.clone(), source })?;
    // Every configuration first: a missing kubeconfig or a bad file stops before any node starts.
    let mut nodes = Vec::new();
    for index in args.first_index..=last {
        let name = node_name(&args.name_prefix, index);
        let root = root_dir.join(&name);
        let socket = root.join("cri.sock");
        let loaded = node_config(args, &name, &root, &socket, &host)?;
        if index == args.first_index {
            for w in &loaded.warnings {
                tracing::warn!("config: {w}");
            }
        }
        nodes.push((index, name, root, socket, Arc::new(loaded.config)));
    }
    for (_, _, root, _, _) in &nodes {
        std::fs::create_dir_all(root).map_err(|source| HollowError::Dir { path: root.clone(), source })?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(HollowError::Signal)?;
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tracing::info!(nodes = nodes.len(), root = %root_dir.display(), "starting hollow nodes");
    // One set of metrics for every node of the process: none serves `/metrics`.
    let metrics = crate::daemon::NodeFamilies::default();
    // One thread renews every node's Lease, each over its own connection (see `HeartbeatLane`).
    let lane = crate::cluster::HeartbeatLane::start().map_err(HollowError::HeartbeatLane)?;
    for (index, name, root, socket, config) in nodes {
        let runtime = fake_cri::FakeCri::new(index, root.clone());
        let (runtime_stop, node_stop) = (stop.clone(), stop.clone());
        let sock = socket.clone();
        let runtime_name = name.clone();
        tasks.spawn(async move {
            if let Err(e) = runtime.serve(&sock, runtime_stop).await {
                tracing::error!(node = %runtime_name, error = %e, "hollow node's runtime stopped");
            }
        });
        let endpoint = format!("unix://{}", socket.display());
        let (metrics, lane) = (metrics.clone(), lane.clone());
        tasks.spawn(async move {
            match crate::daemon::run_hollow(config, &endpoint, metrics, lane, node_stop).await {
                Ok(()) => tracing::info!(node = %name, "hollow node stopped"),
                Err(e) => tracing::error!(node = %name, error = %e, "hollow node failed"),
            }
        });
    }
    tasks.spawn(trim_periodically(TRIM_PERIOD, nodelet_node::allocator::trim, stop.clone()));
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.map_err(HollowError::Signal)?,
        _ = term.recv() => {}
    }
    tracing::info!("stopping hollow nodes");
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// A trim that takes this long is logged as a warning (with how long it took).
const SLOW_TRIM: Duration = Duration::from_secs(1);

/// How often `nodelet hollow` gives its allocator's free pages back.
pub(crate) const TRIM_PERIOD: Duration = Duration::from_secs(60);

/// After a trim, the next waits at least this many times as long as the trim took.
const TRIM_SPACING: u32 = 60;

/// How long after a trim that took `took` the next one comes: `period`, or [`TRIM_SPACING`] times `took`
/// if that is longer. A trim holds each arena's lock while it gives the arena's free pages back, so every
/// thread that allocates from that arena waits for it; while 1,000 nodes started their pods the trims took
/// 1 to 9 s (`docs/scale.md`). So trims hold the allocator at most 1/60 of the time.
pub(crate) fn next_trim_after(period: Duration, took: Duration) -> Duration {
    period.max(took.saturating_mul(TRIM_SPACING))
}

/// Calls `trim` (on a blocking thread) `period` after the start and then [`next_trim_after`] each trim,
/// until `stop`. Starting many nodes at once, and each node's start of its pods, is a peak of memory made and
/// freed: glibc keeps the freed pages ([`nodelet_node::allocator`]), so without this the process would stay
/// at its high-water mark. Only `nodelet hollow` does this; `nodelet run` leaves its allocator alone.
pub(crate) async fn trim_periodically(period: Duration, trim: fn() -> bool, stop: CancellationToken) {
    let mut wait = period;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let started = tokio::time::Instant::now();
        let result = tokio::task::spawn_blocking(trim).await;
        let took = started.elapsed();
        wait = next_trim_after(period, took);
        match result {
            // A trim holds each arena's lock while it walks it: a long one stalls every thread that allocates.
            Ok(released) if took >= SLOW_TRIM => {
                tracing::warn!(released, ?took, next_in = ?wait, "trimming the allocator took long");
            }
            Ok(released) => tracing::debug!(released, ?took, "allocator trimmed"),
            Err(e) => tracing::warn!(error = %e, "trimming the allocator failed"),
        }
    }
}

#[cfg(test)]
mod tests;
