//! The sandbox pair (pod sandboxes and their network) as an [`Extension`]: [`Sandboxes`] starts the
//! [`SandboxPair`] (`nodelet_resources::sandbox::pair`, where its engine and relations are built) and
//! spawns its tasks, both critical: `sandbox-engine`, then `sandbox-populator`.
//!
//! It starts on its own, between the volume pair and the pod pair, rather than inside the pod pair: since
//! the stores are made before any pair starts (`super::super::topology`, "stores before engines"), the pair
//! is built there (its engine watches the pod actual store, which the pod engine's builder exposes, and
//! the pod pair reads its actual and operation status stores as side inputs), and the one thing the pod
//! pair holds of it, the observer its PLEG reports sandboxes through, is taken there too. So nothing ties
//! its start to the pod pair's. What it holds alone is the pair itself; the desired pods its populator
//! reads, the supervisor and the shutdown token come from the [`ExtensionContext`]. It has no status table.

use std::sync::Arc;

use nodelet_cri::CriPodRuntime;
use nodelet_resources::sandbox::pair::SandboxPair;

use super::log_report;
use crate::daemon::extension::{BoxError, Extension, ExtensionContext, StatusTable};
use crate::daemon::supervisor::{Policy, spawn_tasks};

/// The sandbox pair, built, not started.
pub(crate) struct Sandboxes {
    pair: SandboxPair<CriPodRuntime>,
}

impl Sandboxes {
    /// Starts `pair` as an extension.
    pub(crate) fn new(pair: SandboxPair<CriPodRuntime>) -> Self {
        Self { pair }
    }
}

impl Extension for Sandboxes {
    fn name(&self) -> &str {
        "sandboxes"
    }

    fn start(self: Box<Self>, ctx: &ExtensionContext) -> Result<Option<Arc<dyn StatusTable>>, BoxError> {
        let (engine, tasks) = self.pair.start(ctx.pods_desired(), ctx.shutdown().clone());
        ctx.supervisor().spawn("sandbox-engine", Policy::Critical, log_report("sandbox", engine));
        spawn_tasks(ctx.supervisor(), tasks);
        Ok(None)
    }
}
