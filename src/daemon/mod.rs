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
//! The node is assembled in one module, `topology` (see its table): runtime → sources → every standard
//! pair's stores → claims → volumes (with the volume populator) → sandboxes → pods (prober, PLEG, container
//! GC, log rotation) → stats → image GC → pressure (admission, eviction) → extensions → cluster (Node,
//! Lease, status) → servers. The six pairs are built-in [`Extension`]s, each started as a third party's is.
//! Every task runs on the [`Supervisor`].

#[cfg(test)]
mod bare_spawns;
mod builtin;
mod command;
mod error;
pub(crate) mod extension;
mod families;
#[cfg(test)]
mod preload_tests;
mod runtime;
mod supervisor;
pub(crate) mod topology;

use std::sync::Arc;

pub use command::{BuiltinCommand, Invocation, NodeConfig};
pub use error::{Error, Stage, StartError};
pub use extension::{BoxError, Extension, ExtensionContext, NameError, StatusTable};
pub use families::MetricFamilies;
pub(crate) use families::NodeFamilies;
pub use supervisor::{Policy, Supervisor, TaskFailure, TaskRestarts, panic_message};
pub(crate) use topology::run_hollow;

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
                return Err(Error::Extension(extension::NameError::Duplicate(e.name().to_owned())));
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
        topology::run(Arc::new(loaded.config), self.extensions, stop).await
    }
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
