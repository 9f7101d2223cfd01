//! Container log rotation: every `containerLogMonitorInterval`, the log of each running container
//! (from the pod actual store) is rotated by [`nodelet_cri::log_rotation`] when it reached
//! `containerLogMaxSize`, keeping `containerLogMaxFiles` files per container.

use std::path::Path;
use std::time::Duration;

use nodelet_cri::log_rotation::{LogRotationPolicy, rotate_if_needed};
use nodelet_resources::model::actual::{ContainerState, PodActual};
use nodelet_resources::model::pod::PodUid;
use reconcile_engine::Store;
use tokio_util::sync::CancellationToken;

/// Rotates the logs of `actual`'s running containers by `policy` every `interval` until `shutdown`.
pub async fn run(
    cri: nodelet_cri::CriClient,
    actual: Store<PodUid, PodActual>,
    policy: LogRotationPolicy,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut running = Vec::new();
        actual.for_each(|_, pod| {
            for c in
                pod.containers.iter().filter(|c| c.state == ContainerState::Running && !c.log_path.is_empty())
            {
                running.push((c.id.clone(), c.log_path.clone()));
            }
        });
        let now = crate::wall_clock().strftime("%Y%m%d-%H%M%S").to_string();
        for (id, path) in running {
            if let Err(e) = rotate_if_needed(&cri, &id, Path::new(&path), policy, &now).await {
                tracing::warn!(container = %id, error = %e, "rotating a container log failed");
            }
        }
    }
}
