//! nodelet's own pairs assembled as [`Extension`](super::Extension)s: `super::topology` starts each through
//! [`Extension::start`](super::Extension::start) with the same [`ExtensionContext`](super::ExtensionContext)
//! a third-party extension is given, at the pair's place in the start order, so the node itself proves the
//! extension API. One module per pair, in start order: [`claims`] (the claim pair, with the CSI plugin
//! registry's watcher), [`volumes`] (the volume pair and its populator), [`sandboxes`] (the sandbox pair),
//! [`pods`] (the pod pair, with the prober, PLEG, container GC and log rotation), [`images`] (image garbage
//! collection) and [`eviction`] (the eviction pair and the verdict populator).
//!
//! Stores before engines: `super::topology` makes every pair's stores and handles first (an engine's
//! actual and operation status stores come from its builder, [`reconcile_engine::EngineBuilder::actual`]),
//! builds the context from them, then starts the pairs. Each is given when built what only it may hold
//! (writers, its engine builder, its populator's inputs that no other pair reads) and reads what it shares
//! with the rest of the node from the context.

use std::future::Future;

pub(crate) mod claims;
pub(crate) mod eviction;
pub(crate) mod images;
pub(crate) mod pods;
pub(crate) mod sandboxes;
pub(crate) mod volumes;

/// Runs an engine (`run`) and logs its report when it stops.
///
/// `run` is awaited where it is, pinned in the returned future: an `async fn` that awaits its argument
/// holds it twice (the argument and the awaited value are laid out apart), and an engine's future is
/// kilobytes.
fn log_report(
    what: &'static str,
    run: impl Future<Output = reconcile_engine::RunReport>,
) -> impl Future<Output = ()> {
    use futures::FutureExt;
    run.map(move |report| {
        tracing::info!(operations = report.operations, abandoned = report.abandoned, "{what} engine stopped");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_engine_run_under_log_report_takes_its_size_once_and_ends_with_it() {
        let big = [1u8; 8 * 1024];
        let run = async move {
            tokio::task::yield_now().await;
            reconcile_engine::RunReport { operations: u64::from(big[0]), ..Default::default() }
        };
        let run_size = std::mem::size_of_val(&run);
        let logged = log_report("test", run);
        assert!(
            std::mem::size_of_val(&logged) < run_size + 64,
            "{} against {run_size}",
            std::mem::size_of_val(&logged)
        );
        logged.await;
    }
}
