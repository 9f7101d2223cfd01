//! The container runtime's parts of the node, which the assembly ([`super::topology`]) uses: the settings of
//! the embedded containerd and of the node's facts, waiting for the runtime and checking its health, and the
//! forwarding of the runtime's events to the PLEG.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nodelet_node::containerd::EmbeddedContainerdConfig;
use nodelet_node::node_facts;
use nodelet_resources::pod::metrics::PodMetrics;
use nodelet_resources::pod::pleg::PlegWaker;
use tokio_util::sync::CancellationToken;

use crate::{config, pressure};

/// What of the configuration the node's facts ([`node_facts::NodeFacts::detect`]) depend on.
pub(crate) fn facts_config(config: &config::Config) -> node_facts::FactsConfig {
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

/// How many calls a hollow node's CRI client queues for its connection (tonic's default is 1,024): more
/// callers wait for room. The fake runtime serves 16 calls at a time ([`crate::hollow`]) and answers at
/// once, so a deeper queue only holds more requests (and their channel blocks) at the start-up peak.
const HOLLOW_CRI_BUFFER: usize = 64;

/// The HTTP/2 flow-control windows of a hollow node's CRI connection (stream and connection): the
/// protocol's default, as the fake runtime's side announces; its answers are small. hyper's client would
/// announce 2 MiB per stream and 5 MiB per connection.
const HOLLOW_CRI_WINDOW: u32 = 65_535;

/// The CRI client of a hollow node (`nodelet hollow`): `nodelet run`'s client
/// ([`nodelet_cri::CriClient::connect_lazy`]) with a shorter request queue ([`HOLLOW_CRI_BUFFER`]) and
/// the protocol's default flow-control windows ([`HOLLOW_CRI_WINDOW`]) on its connection to the node's
/// fake runtime; connected on first use, as that one.
pub(crate) fn hollow_cri_client(
    config: nodelet_cri::CriConfig,
) -> Result<nodelet_cri::CriClient, nodelet_cri::CriError> {
    let path = config.socket_path()?;
    // The URI is required by tonic but ignored: the connector dials the unix socket.
    let endpoint = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(config.connect_timeout)
        .buffer_size(HOLLOW_CRI_BUFFER)
        .initial_stream_window_size(HOLLOW_CRI_WINDOW)
        .initial_connection_window_size(HOLLOW_CRI_WINDOW);
    let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    }));
    Ok(nodelet_cri::CriClient::from_channel(channel, config))
}

/// Runtime health for /healthz, every 5 s.
pub(crate) async fn runtime_health(
    cri: nodelet_cri::CriClient,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
) {
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
pub(crate) async fn wait_for_runtime(cri: &nodelet_cri::CriClient, ready: &AtomicBool) {
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

/// The node's allocatable memory in bytes (`None` when unknown): the largest tmpfs a memory-backed
/// volume gets.
pub(crate) fn allocatable_memory(facts: &node_facts::NodeFacts) -> Option<u64> {
    let q = facts.allocatable.get("memory")?;
    let q = nodelet_resources::quantity::Quantity::parse(&q.0).filter(|q| !q.is_negative())?;
    u64::try_from(q.scaled_ceil(1)).ok().filter(|b| *b > 0)
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
pub(crate) async fn forward_runtime_events(
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
