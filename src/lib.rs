//! nodelet: a node agent that runs Kubernetes pods by reconciling desired against actual state.
//!
//! The library is the daemon: [`Node::builder`] assembles the standard pairs (pods, volumes, claims,
//! sources, stats, pressure, cluster, servers) from a [`NodeConfig`], [`NodeBuilder::with_extension`] adds
//! a crate's own reconcilers ([`Extension`]), and [`Node::run`] runs them all on a [`Supervisor`]. The
//! `nodelet` binary is [`Invocation::from_args_with_client`] (the command line, with the client commands of
//! the `nodelet-cli` crate, which the library does not depend on) plus that; `docs/extensions.md` shows how
//! to write an extension and build a binary with it, with or without the client commands.
//!
//! The configuration (the daemon's flags and its KubeletConfiguration file, validated into one `Config`) is
//! the `nodelet-config` crate, re-exported here as [`config`] and [`cli`]; it depends on nothing of the
//! daemon. The parts the daemon assembles are crates of their own, below it: `nodelet-stats` (node, pod
//! and container statistics), `nodelet-server` (the node's HTTP servers), `nodelet-sources` (the static
//! pod sources and the pod config that merges them) and `nodelet-cluster` (cluster mode: the API pod
//! source, the Node and its Lease, status, events, certificates); `docs/architecture.md` draws how they
//! depend on each other.

mod claims;
pub mod daemon;
#[cfg(test)]
mod fuzz_tests;
mod hollow;
mod logging;
mod node;
mod pressure;
mod volumes;

pub use cli::NoClient;
pub use daemon::{
    BuiltinCommand, Error, Extension, ExtensionContext, Invocation, Node, NodeBuilder, NodeConfig, Stage,
    StartError, StatusTable, Supervisor,
};
/// The configuration (crate `nodelet-config`): the flags and the KubeletConfiguration file, validated.
pub use nodelet_config as config;
/// The daemon's command line (`nodelet_config::cli`).
pub use nodelet_config::cli;
// Cluster mode (`crate::cluster`): crate `nodelet-cluster`.
use nodelet_cluster as cluster;
// The HTTP servers (`crate::server`): crate `nodelet-server`.
use nodelet_server as server;
// The static pod sources (`crate::sources`): crate `nodelet-sources`.
use nodelet_sources as sources;
// YAML (`crate::yaml`, the fuzz tests' limits): shared with the client.
#[cfg(test)]
use nodelet_shared::yaml;
