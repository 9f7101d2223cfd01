//! nodelet: a node agent that runs Kubernetes pods by reconciling desired against actual state.
//!
//! The library is the daemon: [`Node::builder`] assembles the standard pairs (pods, volumes, claims,
//! sources, stats, pressure, cluster, servers) from a [`NodeConfig`], [`NodeBuilder::with_extension`] adds
//! a crate's own reconcilers ([`Extension`]), and [`Node::run`] runs them all on a [`Supervisor`]. The
//! `nodelet` binary is [`Invocation::from_args`] plus that; `docs/extensions.md` shows how to write an
//! extension and build a binary with it.

mod claims;
mod cli;
mod client;
mod cluster;
mod config;
mod csinode;
pub mod daemon;
#[cfg(test)]
mod fuzz_tests;
mod hollow;
mod logging;
mod node;
mod pressure;
mod server;
mod sources;
mod stats;
mod volumes;
mod yaml;

pub use daemon::{
    ClientCommand, Error, Extension, ExtensionContext, Invocation, Node, NodeBuilder, NodeConfig,
    StatusTable, Supervisor,
};
